/*
 * cuda_runtime_emul.c: a host emulation of exactly the CUDA runtime and
 * cuBLAS calls that engine/backend/backend_cuda.c makes, for tests only.
 * backend_cuda.c is compiled against the real headers (cuda_runtime_api.h,
 * cublas_v2.h) and linked with this file instead of cudart and cuBLAS, so
 * its host logic runs on machines without a GPU (tests/unit/meson.build:
 * backend-cuda-emulated, model-cuda-emulated). It proves nothing about
 * the real libraries' performance or asynchrony: everything runs at once,
 * on the calling thread.
 *
 * Runtime: one device (0). cudaMalloc() is devmem_emul.c's device memory,
 * the same as kv_cuda.h's cuda_alloc(). cudaMemcpy() checks both sides
 * against the kind: the device side must lie inside one live allocation,
 * the host side outside device memory, or the process aborts with a
 * message. A failed call is kept for cudaGetLastError(). cudaFree() of
 * anything but a live allocation or NULL aborts (the runtime would return
 * an error that backend_cuda.c ignores).
 *
 * cuBLAS: cublasGemmEx() computes the documented column-major product
 * C = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n, C m x n, with
 * leading dimensions lda, ldb, ldc, written from the cuBLAS reference
 * rather than from backend_cuda.c, so that it checks the transposes and
 * leading dimensions the backend passes. Only what the backend uses is
 * implemented: CUBLAS_OP_N / CUBLAS_OP_T, f16 A and B, f32 C, f32
 * compute, alpha and beta on the host; anything else is
 * CUBLAS_STATUS_NOT_SUPPORTED. Accumulation is in float.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "tests/unit/devmem_emul.h"

/* ---- runtime ---- */

static cudaError_t last_error; /* of the last failed call, until cudaGetLastError() */

static cudaError_t failed(cudaError_t e)
{
	last_error = e;
	return e;
}

cudaError_t cudaGetDeviceCount(int *count)
{
	*count = 1;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
	return device == 0 ? cudaSuccess : failed(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceSynchronize(void)
{
	return cudaSuccess; /* every call ran to completion when it returned */
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	default: return "unrecognized error code";
	}
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
	devmem_check_host(ptr, sizeof(*ptr), "cudaMalloc's result pointer");
	if (!size) {
		*ptr = NULL;
		return cudaSuccess;
	}
	void *p = devmem_alloc(size);
	if (!p)
		return failed(cudaErrorMemoryAllocation);
	*ptr = p;
	return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
	devmem_free(ptr, "cudaFree"); /* NULL: nothing (it only makes the context) */
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	if (kind == cudaMemcpyDefault) /* unified addressing: by where the pointers lie */
		kind = devmem_in_range(dst) ? (devmem_in_range(src) ? cudaMemcpyDeviceToDevice
								    : cudaMemcpyHostToDevice)
					    : (devmem_in_range(src) ? cudaMemcpyDeviceToHost
								    : cudaMemcpyHostToHost);
	switch (kind) {
	case cudaMemcpyHostToDevice:
		devmem_check(dst, count, "cudaMemcpy HostToDevice destination");
		devmem_check_host(src, count, "cudaMemcpy HostToDevice source");
		break;
	case cudaMemcpyDeviceToHost:
		devmem_check(src, count, "cudaMemcpy DeviceToHost source");
		devmem_check_host(dst, count, "cudaMemcpy DeviceToHost destination");
		break;
	case cudaMemcpyDeviceToDevice:
		devmem_check(dst, count, "cudaMemcpy DeviceToDevice destination");
		devmem_check(src, count, "cudaMemcpy DeviceToDevice source");
		break;
	case cudaMemcpyHostToHost:
		devmem_check_host(dst, count, "cudaMemcpy HostToHost destination");
		devmem_check_host(src, count, "cudaMemcpy HostToHost source");
		break;
	default:
		return failed(cudaErrorInvalidValue);
	}
	if (count) {
		devmem_open();
		memcpy(dst, src, count);
		devmem_close();
	}
	return cudaSuccess;
}

/* ---- cuBLAS ---- */

#define HANDLE_MAGIC 0x6375626cu /* "cubl" */

struct cublasContext {
	uint32_t magic;
};

/* cublas_v2.h names these cublasCreate_v2 and cublasDestroy_v2, as the library exports them. */
cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
	struct cublasContext *h = malloc(sizeof(*h));
	if (!h)
		return CUBLAS_STATUS_ALLOC_FAILED;
	h->magic = HANDLE_MAGIC;
	*handle = h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
	if (!handle || handle->magic != HANDLE_MAGIC)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->magic = 0;
	free(handle);
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
	default: return "<unknown>";
	}
}

/*
 * Elements spanned by a column-major matrix stored as rows x cols with
 * leading dimension ld (ld >= rows): (cols - 1) * ld + rows, 0 if empty.
 */
static size_t stored_elems(int rows, int cols, int ld)
{
	return rows && cols ? (size_t)(cols - 1) * (size_t)ld + (size_t)rows : 0;
}

/* Element (i, j) of op(X), X f16 column-major with leading dimension ld. */
static float op_elem(const tkv_half *x, cublasOperation_t op, int ld, int i, int j)
{
	return half_to_f32(op == CUBLAS_OP_N ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j]);
}

/* A float dot product of n values in eight interleaved partial sums (a GPU's order is its own too). */
static float dot(const float *a, const float *b, int n)
{
	float s[8] = { 0 };
	int i = 0;
	for (; i + 8 <= n; i += 8)
		for (int l = 0; l < 8; l++)
			s[l] += a[i + l] * b[i + l];
	for (; i < n; i++)
		s[i % 8] += a[i] * b[i];
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
			    int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
			    int lda, const void *B, cudaDataType Btype, int ldb, const void *beta, void *C,
			    cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
			    cublasGemmAlgo_t algo)
{
	if (!handle || handle->magic != HANDLE_MAGIC)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
	    (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || Atype != CUDA_R_16F ||
	    Btype != CUDA_R_16F || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F ||
	    algo != CUBLAS_GEMM_DEFAULT)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	/* the reference's argument checks: op(A) m x k is A m x k (N) or k x m (T), and so on */
	const int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
	const int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
	if (m < 0 || n < 0 || k < 0 || lda < (a_rows > 1 ? a_rows : 1) ||
	    ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!m || !n)
		return CUBLAS_STATUS_SUCCESS;

	devmem_check_host(alpha, sizeof(float), "cublasGemmEx alpha (host pointer mode)");
	devmem_check_host(beta, sizeof(float), "cublasGemmEx beta (host pointer mode)");
	devmem_check(A, stored_elems(a_rows, a_cols, lda) * sizeof(tkv_half), "cublasGemmEx A");
	devmem_check(B, stored_elems(b_rows, b_cols, ldb) * sizeof(tkv_half), "cublasGemmEx B");
	devmem_check(C, stored_elems(m, n, ldc) * sizeof(float), "cublasGemmEx C");
	const float al = *(const float *)alpha, be = *(const float *)beta;

	float *opa = malloc(((size_t)k + 1) * sizeof(float));               /* (k,) row i of op(A) */
	float *opb = malloc(((size_t)n * (size_t)k + 1) * sizeof(float));   /* (n, k) columns of op(B) */
	if (!opa || !opb) {
		free(opa);
		free(opb);
		return CUBLAS_STATUS_ALLOC_FAILED;
	}
	devmem_open();
	for (int j = 0; j < n; j++)
		for (int l = 0; l < k; l++)
			opb[(size_t)j * k + l] = op_elem(B, transb, ldb, l, j);
	float *c = C;
	for (int i = 0; i < m; i++) {
		for (int l = 0; l < k; l++)
			opa[l] = op_elem(A, transa, lda, i, l);
		for (int j = 0; j < n; j++) {
			float *cij = &c[(size_t)j * ldc + i];
			float s = al * dot(opa, opb + (size_t)j * k, k);
			*cij = be == 0.0f ? s : s + be * *cij; /* beta 0: C is not read (it may hold NaN) */
		}
	}
	devmem_close();
	free(opa);
	free(opb);
	return CUBLAS_STATUS_SUCCESS;
}
