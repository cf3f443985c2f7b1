/*
 * backend_nocuda.c: backend_cuda_new() of a build without CUDA (no nvcc
 * at configure time), so --device cuda says why instead of failing to link.
 */
#include <errno.h>

#include "engine/backend/backend.h"

int backend_cuda_new(Backend **ret, Error *err)
{
	return error_set(err, -EOPNOTSUPP,
			 "this build has no CUDA backend (nvcc was not found when it was configured)");
}
