/*
 * backend.c: choosing a backend by name (--device) and releasing it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/backend/backend.h"

static const char *const device_names[] = {
	[DEVICE_AUTO] = "auto",
	[DEVICE_CPU] = "cpu",
	[DEVICE_CUDA] = "cuda",
};

int device_choice_from_name(const char *name, DeviceChoice *ret)
{
	for (size_t i = 0; i < ARRAY_SIZE(device_names); i++)
		if (strcmp(name, device_names[i]) == 0) {
			*ret = (DeviceChoice)i;
			return 0;
		}
	return -EINVAL;
}

const char *device_choice_name(DeviceChoice d)
{
	return (size_t)d < ARRAY_SIZE(device_names) ? device_names[d] : "?";
}

int backend_open(DeviceChoice choice, Backend **ret, char *ret_fallback, size_t fallback_size, Error *err)
{
	if (ret_fallback && fallback_size)
		ret_fallback[0] = '\0';
	if (choice == DEVICE_CPU) {
		*ret = backend_cpu();
		return 0;
	}
	Error cuda_err = { 0 };
	int r = backend_cuda_new(ret, &cuda_err);
	if (r == 0)
		return 0;
	if (choice == DEVICE_CUDA)
		return error_set(err, r, "%s", cuda_err.msg);
	if (ret_fallback && fallback_size)
		snprintf(ret_fallback, fallback_size, "%s", cuda_err.msg);
	*ret = backend_cpu();
	return 0;
}

Backend *backend_free(Backend *b)
{
	if (b && b != backend_cpu())
		b->ops->free(b);
	return NULL;
}
