/* vec_f32_avx2.c: AVX2/FMA f32 primitives (compiled with -mavx2 -mfma). */
#include <immintrin.h>

#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/vec_f32.h"

static inline float hsum256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

float vec_f32_dot_avx2(int64_t n, const float *a, const float *b)
{
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
	}
	for (; i + 8 <= n; i += 8)
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
	float s = hsum256(_mm256_add_ps(acc0, acc1));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

void vec_f32_axpy_avx2(int64_t n, float alpha, const float *x, float *y)
{
	__m256 va = _mm256_set1_ps(alpha);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] += alpha * x[i];
}

/* 1 / (1 + e^-z) from e^-|z| <= 1 only: 1 / (1 + t) for z >= 0, t / (1 + t) below. */
static inline __m256 sigmoid_ps(__m256 z)
{
	__m256 t = exp_nonpos_avx2(_mm256_or_ps(z, _mm256_set1_ps(-0.0f))); /* e^-|z| */
	__m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
	return _mm256_blendv_ps(inv, _mm256_mul_ps(t, inv), z);
}

void vec_f32_geglu_avx2(int64_t n, float *gate, const float *up)
{
	const __m256 c2 = _mm256_set1_ps(2.0f * 0.7978845608028654f), a = _mm256_set1_ps(0.044715f);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 g = _mm256_loadu_ps(gate + i);
		__m256 u2 = _mm256_mul_ps(_mm256_mul_ps(c2, g), _mm256_fmadd_ps(_mm256_mul_ps(a, g), g, _mm256_set1_ps(1.0f)));
		_mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid_ps(u2)), _mm256_loadu_ps(up + i)));
	}
	if (i < n)
		vec_f32_geglu_ref(n - i, gate + i, up + i);
}
