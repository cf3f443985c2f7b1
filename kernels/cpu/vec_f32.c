/* vec_f32.c: scalar references and run-time dispatch of the f32 primitives. */
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/vec_f32.h"

float vec_f32_dot_ref(int64_t n, const float *a, const float *b)
{
	float s = 0.0f;
	for (int64_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

void vec_f32_axpy_ref(int64_t n, float alpha, const float *x, float *y)
{
	for (int64_t i = 0; i < n; i++)
		y[i] += alpha * x[i];
}

static bool use_avx2(void)
{
	const CpuFeatures *f = cpu_features();
	return f->avx2 && f->fma;
}

float vec_f32_dot(int64_t n, const float *a, const float *b)
{
	return use_avx2() ? vec_f32_dot_avx2(n, a, b) : vec_f32_dot_ref(n, a, b);
}

void vec_f32_axpy(int64_t n, float alpha, const float *x, float *y)
{
	if (use_avx2())
		vec_f32_axpy_avx2(n, alpha, x, y);
	else
		vec_f32_axpy_ref(n, alpha, x, y);
}
