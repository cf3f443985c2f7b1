/*
 * repack_avx2.c: AVX2 tile kernels for the X4 layout (repack.h). Compiled
 * with -mavx2 -mfma -mf16c; called only when cpu_features() has them.
 *
 * Q4_K: two rows of a group at a time against up to four Q8_K activation
 * rows. Per super-block, each row's scales and mins are unpacked once
 * (vector shuffles, not a loop per value) and its 128 bytes of nibbles
 * split once, then used for every token; each token's activation block is
 * loaded once per row pair. Integer sub-block sums (maddubs, madd by the
 * 6-bit scale) are exact; the min term is sum_j m_j (bsums[2j] +
 * bsums[2j+1]) by one madd, kept as a vector and folded into the float
 * accumulator, so nothing is summed horizontally before the end.
 */
#include <immintrin.h>

#include "kernels/cpu/repack.h"
#include "kernels/cpu/repack_x86.h"

#define AVX2_NT 4

static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* Shuffle picking 16-bit lane j of each 128-bit half into every lane. */
static inline __m256i lane16(int j)
{
	return _mm256_set1_epi16((short)((2 * j) | (2 * j + 1) << 8));
}

static inline __attribute__((always_inline)) void q4k_pair(int64_t nb, const BlockQ4_K *g, int r0,
							    const char *act, size_t a_stride, float *y, size_t y_stride,
							    const int NT)
{
	const __m256i m4 = _mm256_set1_epi8(0xF);
	__m256 accf[2][AVX2_NT];
	for (int i = 0; i < 2; i++)
		for (int t = 0; t < NT; t++)
			accf[i][t] = _mm256_setzero_ps();

	for (int64_t b = 0; b < nb; b++) {
		const BlockQ4_K *w[2] = { &g[b * REPACK_GROUP + r0], &g[b * REPACK_GROUP + r0 + 1] };
		const BlockQ8_K *a[AVX2_NT];
		for (int t = 0; t < NT; t++)
			a[t] = (const BlockQ8_K *)(act + (size_t)t * a_stride) + b;
		__builtin_prefetch((const char *)(w[0] + REPACK_GROUP * 2), 0, 0);
		__builtin_prefetch((const char *)(w[0] + REPACK_GROUP * 2) + 64, 0, 0);
		__builtin_prefetch((const char *)(w[0] + REPACK_GROUP * 2) + 128, 0, 0);
		__builtin_prefetch((const char *)(w[0] + REPACK_GROUP * 2) + 192, 0, 0);
		__builtin_prefetch((const char *)(w[0] + REPACK_GROUP * 2) + 256, 0, 0);

		__m256i sc[2], mn[2];
		for (int i = 0; i < 2; i++) {
			__m128i sm = q4k_scales_mins(w[i]->scales);
			sc[i] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
			/* m0 m0 m1 m1 ... m7 m7 as int16, against the 16 bsums */
			__m128i m8 = _mm_unpackhi_epi64(sm, sm);
			mn[i] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
		}

		__m256i acc[2][AVX2_NT];
		for (int i = 0; i < 2; i++)
			for (int t = 0; t < NT; t++)
				acc[i][t] = _mm256_setzero_si256();
		for (int nn = 0; nn < 4; nn++) {
			for (int i = 0; i < 2; i++) {
				__m256i q = _mm256_loadu_si256((const __m256i *)(w[i]->qs + 32 * nn));
				__m256i lo = _mm256_and_si256(q, m4);
				__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
				__m256i slo = _mm256_shuffle_epi8(sc[i], lane16(2 * nn));
				__m256i shi = _mm256_shuffle_epi8(sc[i], lane16(2 * nn + 1));
				for (int t = 0; t < NT; t++) {
					__m256i plo = _mm256_maddubs_epi16(
						lo, _mm256_loadu_si256((const __m256i *)(a[t]->qs + 64 * nn)));
					__m256i phi = _mm256_maddubs_epi16(
						hi, _mm256_loadu_si256((const __m256i *)(a[t]->qs + 64 * nn + 32)));
					acc[i][t] = _mm256_add_epi32(acc[i][t], _mm256_add_epi32(_mm256_madd_epi16(plo, slo),
												 _mm256_madd_epi16(phi, shi)));
				}
			}
		}
		for (int i = 0; i < 2; i++) {
			float d = _cvtsh_ss(w[i]->d), dmin = _cvtsh_ss(w[i]->dmin);
			for (int t = 0; t < NT; t++) {
				__m256i bs = _mm256_loadu_si256((const __m256i *)a[t]->bsums);
				__m256 msum = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mn[i]));
				accf[i][t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[t]->d), _mm256_cvtepi32_ps(acc[i][t]),
							     accf[i][t]);
				accf[i][t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * a[t]->d), msum, accf[i][t]);
			}
		}
	}
	for (int t = 0; t < NT; t++)
		for (int i = 0; i < 2; i++)
			y[(size_t)t * y_stride + (size_t)(r0 + i)] = hsum8(accf[i][t]);
}

void repack_tile_q4_K_avx2(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			   size_t y_stride)
{
	const BlockQ4_K *g = group;
	int64_t nb = n / QK_K;
	/* four tokens at a time: 2 rows x 4 tokens of accumulators fill the 16 ymm registers */
	for (int t0 = 0; t0 < nt; t0 += AVX2_NT) {
		const char *a = (const char *)act + (size_t)t0 * a_stride;
		float *yt = y + (size_t)t0 * y_stride;
		int k = nt - t0 < AVX2_NT ? nt - t0 : AVX2_NT;
		for (int r0 = 0; r0 < REPACK_GROUP; r0 += 2) {
			switch (k) {
			case 1: q4k_pair(nb, g, r0, a, a_stride, yt, y_stride, 1); break;
			case 2: q4k_pair(nb, g, r0, a, a_stride, yt, y_stride, 2); break;
			case 3: q4k_pair(nb, g, r0, a, a_stride, yt, y_stride, 3); break;
			default: q4k_pair(nb, g, r0, a, a_stride, yt, y_stride, 4); break;
			}
		}
	}
}

RepackTileFn repack_tile_avx2_get(uint32_t t)
{
	return t == WTYPE_Q4_K ? repack_tile_q4_K_avx2 : NULL;
}
