/*
 * repack_avx512.c: AVX-512 VNNI tile kernels for the X4 layout (repack.h).
 * Compiled with -mavx512f/dq/bw/vl -mavx512vnni (and AVX2/FMA/F16C); called
 * only when cpu_features() has avx512 and avx512vnni.
 *
 * Q4_K: one row of the group at a time against up to Q4K_NT Q8_K activation
 * rows, the K dimension in passes of Q4K_SB_CHUNK super-blocks (the
 * tokens' activations, 8 x 16 x 292 bytes, stay in L1/L2 while the group's
 * 4 rows go past). Per (row, super-block) the nibbles are split once into
 * four zmm of 64 unsigned bytes (sub-blocks 2nn and 2nn+1 side by side,
 * lined up with activation bytes 64nn..64nn+63), then per token:
 *
 *   p_nn = vpdpbusd(0, nibbles_nn, act_nn)     16 x int32, each 4 products,
 *                                              |p| <= 4 * 15 * 128 < 2^15
 *   s    = vpdpwssd(vpdpwssd(0, packs(p0, p1), sc01), packs(p2, p3), sc23)
 *
 * packs is exact (|p| < 2^15) and the scale words sc01/sc23 follow packs'
 * per-128-bit-lane order (SC_IDX), so s holds the 6-bit-scaled sub-block
 * sums exactly. The min term sum_j m_j (bsums[2j] + bsums[2j+1]) is taken
 * in float: per pass each token's d * bsums[k] (16 floats per super-block)
 * is made once, each row's dmin * m_{k/2} once per super-block, and one
 * fnmadd per (row, token, super-block) folds it into the accumulator. One
 * horizontal sum per output and pass at the end; the reference is the row
 * kernel (repack_tile_q4_K_ref), equal to float rounding (test-matmul).
 */
#include <immintrin.h>

#include "kernels/cpu/repack.h"
#include "kernels/cpu/repack_x86.h"

#define Q4K_NT 8
#define Q4K_SB_CHUNK 16

/*
 * The scale word of each int16 lane of packs(p_a, p_b) (nn = a, b): packs
 * puts, in 128-bit lane k, p_a's int32 4k..4k+3 (words 8k..8k+3) then p_b's
 * (words 8k+4..8k+7); int32 lane l of p_nn covers nibble bytes 4l..4l+3,
 * i.e. sub-block 2nn for l < 8 and 2nn+1 above.
 */
static const short SC_IDX[2][32] = {
	{ 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3 },
	{ 4, 4, 4, 4, 6, 6, 6, 6, 4, 4, 4, 4, 6, 6, 6, 6, 5, 5, 5, 5, 7, 7, 7, 7, 5, 5, 5, 5, 7, 7, 7, 7 },
};

static inline __attribute__((always_inline)) void q4k_tile(int64_t nb, const BlockQ4_K *g, const char *act,
							    size_t a_stride, float *y, size_t y_stride,
							    const int NT)
{
	_Alignas(64) float af[Q4K_SB_CHUNK][Q4K_NT][16];
	const __m512i m4 = _mm512_set1_epi8(0xF);
	/* word shifts: 0 for the low 256 bits (low nibbles), 4 for the high */
	const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
	const __m512i idx01 = _mm512_loadu_si512(SC_IDX[0]), idx23 = _mm512_loadu_si512(SC_IDX[1]);
	const __m512i zero = _mm512_setzero_si512();

	for (int64_t b0 = 0; b0 < nb; b0 += Q4K_SB_CHUNK) {
		int kb = nb - b0 < Q4K_SB_CHUNK ? (int)(nb - b0) : Q4K_SB_CHUNK;
		for (int b = 0; b < kb; b++)
			for (int t = 0; t < NT; t++) {
				const BlockQ8_K *a = (const BlockQ8_K *)(act + (size_t)t * a_stride) + b0 + b;
				__m512 bs = _mm512_cvtepi32_ps(
					_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)a->bsums)));
				_mm512_store_ps(af[b][t], _mm512_mul_ps(bs, _mm512_set1_ps(a->d)));
			}

		for (int i = 0; i < REPACK_GROUP; i++) {
			__m512 accf[Q4K_NT];
			for (int t = 0; t < NT; t++)
				accf[t] = _mm512_setzero_ps();
			for (int b = 0; b < kb; b++) {
				const BlockQ4_K *w = &g[(b0 + b) * REPACK_GROUP + i];
				if (b0 + b + Q4K_SB_CHUNK < nb) {
					const char *pf = (const char *)(w + Q4K_SB_CHUNK * REPACK_GROUP);
					_mm_prefetch(pf, _MM_HINT_T0);
					_mm_prefetch(pf + 64, _MM_HINT_T0);
					_mm_prefetch(pf + 128, _MM_HINT_T0);
				}
				__m128i sm = q4k_scales_mins(w->scales);
				__m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
				__m512i sc01 = _mm512_permutexvar_epi16(idx01, sc);
				__m512i sc23 = _mm512_permutexvar_epi16(idx23, sc);
				/* m0 m0 m1 m1 ... m7 m7, against the 16 bsums */
				__m128i m8 = _mm_unpackhi_epi64(sm, sm);
				__m512 mf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(m8, m8))),
							  _mm512_set1_ps(_cvtsh_ss(w->dmin)));
				__m512 df = _mm512_set1_ps(_cvtsh_ss(w->d));
				__m512i q[4];
				for (int nn = 0; nn < 4; nn++) {
					__m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w->qs + 32 * nn)));
					q[nn] = _mm512_and_si512(_mm512_srlv_epi16(x, shift), m4);
				}
				for (int t = 0; t < NT; t++) {
					const BlockQ8_K *a = (const BlockQ8_K *)(act + (size_t)t * a_stride) + b0 + b;
					__m512i p0 = _mm512_dpbusd_epi32(zero, q[0], _mm512_loadu_si512(a->qs));
					__m512i p1 = _mm512_dpbusd_epi32(zero, q[1], _mm512_loadu_si512(a->qs + 64));
					__m512i p2 = _mm512_dpbusd_epi32(zero, q[2], _mm512_loadu_si512(a->qs + 128));
					__m512i p3 = _mm512_dpbusd_epi32(zero, q[3], _mm512_loadu_si512(a->qs + 192));
					__m512i s = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(p0, p1), sc01);
					s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(p2, p3), sc23);
					__m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), df);
					accf[t] = _mm512_fmadd_ps(f, _mm512_set1_ps(a->d), accf[t]);
					accf[t] = _mm512_fnmadd_ps(mf, _mm512_load_ps(af[b][t]), accf[t]);
				}
			}
			for (int t = 0; t < NT; t++) {
				float v = _mm512_reduce_add_ps(accf[t]);
				float *out = &y[(size_t)t * y_stride + (size_t)i];
				*out = b0 ? *out + v : v;
			}
		}
	}
}

void repack_tile_q4_K_avx512vnni(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
				 size_t y_stride)
{
	const BlockQ4_K *g = group;
	int64_t nb = n / QK_K;
	for (int t0 = 0; t0 < nt; t0 += Q4K_NT) {
		const char *a = (const char *)act + (size_t)t0 * a_stride;
		float *yt = y + (size_t)t0 * y_stride;
		switch (nt - t0 < Q4K_NT ? nt - t0 : Q4K_NT) {
		case 1: q4k_tile(nb, g, a, a_stride, yt, y_stride, 1); break;
		case 2: q4k_tile(nb, g, a, a_stride, yt, y_stride, 2); break;
		case 3: q4k_tile(nb, g, a, a_stride, yt, y_stride, 3); break;
		case 4: q4k_tile(nb, g, a, a_stride, yt, y_stride, 4); break;
		case 5: q4k_tile(nb, g, a, a_stride, yt, y_stride, 5); break;
		case 6: q4k_tile(nb, g, a, a_stride, yt, y_stride, 6); break;
		case 7: q4k_tile(nb, g, a, a_stride, yt, y_stride, 7); break;
		default: q4k_tile(nb, g, a, a_stride, yt, y_stride, 8); break;
		}
	}
}

RepackTileFn repack_tile_avx512_get(uint32_t t)
{
	return t == WTYPE_Q4_K ? repack_tile_q4_K_avx512vnni : NULL;
}
