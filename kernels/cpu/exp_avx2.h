/*
 * exp_avx2.h: e^x of 8 non-positive floats at once, for the AVX2 kernels
 * that need it (the attention softmax, the FFN gates' sigmoid).
 *
 * 2^n e^r with n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts),
 * e^r by its degree-6 Taylor polynomial on |r| <= ln 2 / 2 (relative error
 * about 1e-7); x below -87 is taken as -87, so the result never needs a
 * denormal scale (it is then ~1.6e-38 instead of smaller). Include only
 * from sources compiled with AVX2 and FMA.
 */
#pragma once

#include <immintrin.h>

static inline __attribute__((always_inline, target("avx2,fma"))) __m256 exp_nonpos_avx2(__m256 x)
{
	x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
	__m256 p = _mm256_set1_ps(1.0f / 720.0f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
