/* vec_f32_avx2.c: AVX2/FMA f32 primitives (compiled with -mavx2 -mfma). */
#include <immintrin.h>

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
