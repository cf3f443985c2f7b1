/*
 * quant_act_avx2.c: AVX2 activation quantizers, byte-identical to the
 * references in quant_act.c (same scale arithmetic, same rounding: Q8_0
 * and Q8_1 round half away from zero like roundf, Q8_K rounds half to
 * even like ggml's nearest_int). Compiled with -mavx2 -mfma -mf16c.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/quant_act.h"

static inline __m256 abs_ps(__m256 v)
{
	return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

static inline float hmax_ps(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

static inline int hsum_epi32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm_cvtsi128_si32(s);
}

/* roundf() on 8 lanes: truncate, then step away from zero if the
 * dropped fraction (exact for |v| < 2^23) is at least one half. */
static inline __m256i round_away_epi32(__m256 v)
{
	__m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
	__m256 frac = abs_ps(_mm256_sub_ps(v, t));
	__m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
	__m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
	return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}

/* Four vectors of 8 int32 (values 0..31 in order) -> 32 int8 in order. */
static inline __m256i pack_32_epi8(__m256i a, __m256i b, __m256i c, __m256i d)
{
	__m256i ab = _mm256_packs_epi32(a, b); /* a0-3 b0-3 | a4-7 b4-7 */
	__m256i cd = _mm256_packs_epi32(c, d);
	__m256i all = _mm256_packs_epi16(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 ... */
	return _mm256_permutevar8x32_epi32(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Scale of one 32-value block: d = amax / 127 and its inverse, as the ref. */
static inline float block_scale(const float *x, float *ret_id)
{
	__m256 m = abs_ps(_mm256_loadu_ps(x));
	m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8)));
	m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 16)));
	m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 24)));
	float d = hmax_ps(m) / 127.0f;
	*ret_id = d != 0.0f ? 1.0f / d : 0.0f;
	return d;
}

static inline void block_round(const float *x, float id, __m256i q[4])
{
	__m256 mul = _mm256_set1_ps(id);
	for (int k = 0; k < 4; k++)
		q[k] = round_away_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), mul));
}

void quant_act_q8_0_avx2(const float *x, BlockQ8_0 *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
		float id, d = block_scale(x, &id);
		__m256i q[4];
		block_round(x, id, q);
		y[i].d = f32_to_half(d);
		_mm256_storeu_si256((__m256i *)y[i].qs, pack_32_epi8(q[0], q[1], q[2], q[3]));
	}
}

void quant_act_q8_1_avx2(const float *x, BlockQ8_1 *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
		float id, d = block_scale(x, &id);
		__m256i q[4];
		block_round(x, id, q);
		int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
						      _mm256_add_epi32(q[2], q[3])));
		y[i].d = f32_to_half(d);
		y[i].s = f32_to_half((float)sum * d);
		_mm256_storeu_si256((__m256i *)y[i].qs, pack_32_epi8(q[0], q[1], q[2], q[3]));
	}
}

void quant_act_q8_K_avx2(const float *x, BlockQ8_K *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		__m256 m = _mm256_setzero_ps();
		for (int j = 0; j < QK_K; j += 8)
			m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + j)));
		float amax = hmax_ps(m);
		if (amax == 0.0f) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		/* The reference keeps the first value of largest magnitude. */
		float max = 0.0f;
		__m256 vamax = _mm256_set1_ps(amax);
		for (int j = 0; j < QK_K; j += 8) {
			int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + j)), vamax, _CMP_EQ_OQ));
			if (hit) {
				max = x[j + __builtin_ctz((unsigned)hit)];
				break;
			}
		}

		float iscale = -127.0f / max;
		__m256 mul = _mm256_set1_ps(iscale);
		__m256i lim = _mm256_set1_epi32(127);
		for (int j = 0; j < QK_K; j += 32) {
			__m256i q[4];
			for (int k = 0; k < 4; k++) {
				/* cvtps rounds half to even under the default MXCSR mode. */
				__m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), mul));
				q[k] = _mm256_min_epi32(v, lim);
			}
			_mm256_storeu_si256((__m256i *)(y[i].qs + j), pack_32_epi8(q[0], q[1], q[2], q[3]));
		}
		for (int g = 0; g < QK_K / 16; g++) {
			__m128i b = _mm_loadu_si128((const __m128i *)(y[i].qs + 16 * g));
			__m256i w = _mm256_cvtepi8_epi16(b);
			__m256i s = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
			y[i].bsums[g] = (int16_t)hsum_epi32(s);
		}
		y[i].d = 1.0f / iscale;
	}
}
