/* vec_f32.c: scalar references and run-time dispatch of the f32 primitives
 * (AVX2 on x86, NEON on aarch64). */
#include <math.h>

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

void vec_f32_geglu_ref(int64_t n, float *gate, const float *up)
{
	const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
	for (int64_t i = 0; i < n; i++) {
		float g = gate[i];
		gate[i] = 0.5f * g * (1.0f + tanhf(c * g * (1.0f + 0.044715f * g * g))) * up[i];
	}
}

#if defined(CPU_KERNELS_X86)
static bool use_simd(void)
{
	const CpuFeatures *f = cpu_features();
	return f->avx2 && f->fma;
}
#define F32_SIMD(name) vec_f32_##name##_avx2
#elif defined(CPU_KERNELS_NEON)
static bool use_simd(void)
{
	return cpu_features()->neon;
}
#define F32_SIMD(name) vec_f32_##name##_neon
#else
static bool use_simd(void)
{
	return false;
}
#define F32_SIMD(name) vec_f32_##name##_ref
#endif

float vec_f32_dot(int64_t n, const float *a, const float *b)
{
	return use_simd() ? F32_SIMD(dot)(n, a, b) : vec_f32_dot_ref(n, a, b);
}

void vec_f32_axpy(int64_t n, float alpha, const float *x, float *y)
{
	if (use_simd())
		F32_SIMD(axpy)(n, alpha, x, y);
	else
		vec_f32_axpy_ref(n, alpha, x, y);
}

/* The GELU gate has no NEON version yet: aarch64 runs the reference. */
void vec_f32_geglu(int64_t n, float *gate, const float *up)
{
#if defined(CPU_KERNELS_X86)
	if (use_simd()) {
		vec_f32_geglu_avx2(n, gate, up);
		return;
	}
#endif
	vec_f32_geglu_ref(n, gate, up);
}
