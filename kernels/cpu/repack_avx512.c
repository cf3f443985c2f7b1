/*
 * repack_avx512.c: AVX-512 VNNI tile kernels for the X4 layout (repack.h).
 * Compiled with -mavx512f/dq/bw/vl -mavx512vnni (and AVX2/FMA/F16C); called
 * only when cpu_features() has avx512 and avx512vnni.
 *
 * Q4_K: the group's 4 rows at once against up to Q4K_NT Q8_K activation
 * rows. A zmm lane (r, g), r = row 0..3, g = 0..3, holds 4 consecutive
 * columns of row r: per super-block and nibble pair nn, 16 bytes of each
 * row's qs (offset 32 nn + 16 h, h = 0, 1) go to 128-bit lane r and are
 * split into low nibbles (sub-block 2 nn) and high (2 nn + 1), columns
 * 16 h + 4 g + 0..3 of the sub-block in lane (r, g). The matching 16
 * activation bytes are broadcast to all four 128-bit lanes (a load, no
 * shuffle), so each activation byte is read once for all 4 rows. Per
 * token and sub-block j:
 *
 *   S   = vpdpbusd(vpdpbusd(0, nib_h0, act_h0), nib_h1, act_h1)
 *                     8 products per lane, |S| <= 8 * 15 * 128 < 2^15
 *   acc = vpdpwssd(acc, S, SC_j)   SC_j lane (r, g) = words (sc_rj, 0):
 *                     S's low word times the 6-bit scale, exactly
 *
 * and the min term M lane (r, g) = m_rg (bsums[2g] + bsums[2g+1]) +
 * m_r(g+4) (bsums[2g+8] + bsums[2g+9]) by two vpdpwssd against the
 * broadcast bsums. Per super-block, in float: y_rt += d_t (d_r acc -
 * dmin_r M), summed over the lanes g at the end. The reference is the row
 * kernel (repack_tile_q4_K_ref), equal to float rounding (test-matmul).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/repack.h"
#include "kernels/cpu/repack_x86.h"

#define Q4K_NT 8

/* Word index, in the four rows' 8 scales as 32 words (row r at 8 r), of
 * each lane (r, g)'s scale word: 8 r (+ j); odd words are zeroed. */
static const short SC_BASE[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0, 16, 0, 16, 0, 16, 0, 16, 0, 24, 0, 24, 0, 24, 0, 24, 0,
};
/* Lane (r, g) <- row r's float. */
static const int ROW_IDX[16] = { 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3 };

/* Bytes off of the 4 rows' qs, one row per 128-bit lane. */
static inline __m512i rows16(const BlockQ4_K *w, int off)
{
	__m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(w[0].qs + off)));
	x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(w[1].qs + off)), 1);
	x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(w[2].qs + off)), 2);
	return _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(w[3].qs + off)), 3);
}

static inline __m512i bcast16(const void *p)
{
	return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
}

static inline __attribute__((always_inline)) void q4k_tile(int64_t nb, const BlockQ4_K *g, const char *act,
							    size_t a_stride, float *y, size_t y_stride,
							    const int NT)
{
	const __m512i m4 = _mm512_set1_epi8(0xF);
	const __m512i zero = _mm512_setzero_si512();
	const __m512i sc_base = _mm512_loadu_si512(SC_BASE);
	const __m512i row_idx = _mm512_loadu_si512(ROW_IDX);
	__m512 facc[Q4K_NT];

	for (int t = 0; t < NT; t++)
		facc[t] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const BlockQ4_K *w = &g[b * REPACK_GROUP];
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP), _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 64, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 128, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 192, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 256, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 320, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 384, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 448, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + 2 * REPACK_GROUP) + 512, _MM_HINT_T0);

		/* scales and mins of the 4 rows, row r at bytes 8 r */
		__m128i sm0 = q4k_scales_mins(w[0].scales), sm1 = q4k_scales_mins(w[1].scales);
		__m128i sm2 = q4k_scales_mins(w[2].scales), sm3 = q4k_scales_mins(w[3].scales);
		__m512i scw = _mm512_cvtepu8_epi16(
			_mm256_set_m128i(_mm_unpacklo_epi64(sm2, sm3), _mm_unpacklo_epi64(sm0, sm1)));
		__m128 ma = _mm_castsi128_ps(_mm_unpackhi_epi64(sm0, sm1));
		__m128 mb = _mm_castsi128_ps(_mm_unpackhi_epi64(sm2, sm3));
		/* lane (r, g): words (m_rg, m_rg) and (m_r(g+4), m_r(g+4)) */
		__m512i mlo = _mm512_cvtepu8_epi32(_mm_castps_si128(_mm_shuffle_ps(ma, mb, _MM_SHUFFLE(2, 0, 2, 0))));
		__m512i mhi = _mm512_cvtepu8_epi32(_mm_castps_si128(_mm_shuffle_ps(ma, mb, _MM_SHUFFLE(3, 1, 3, 1))));
		mlo = _mm512_or_si512(mlo, _mm512_slli_epi32(mlo, 16));
		mhi = _mm512_or_si512(mhi, _mm512_slli_epi32(mhi, 16));
		float dd[4] = { _cvtsh_ss(w[0].d), _cvtsh_ss(w[1].d), _cvtsh_ss(w[2].d), _cvtsh_ss(w[3].d) };
		float dm[4] = { _cvtsh_ss(w[0].dmin), _cvtsh_ss(w[1].dmin), _cvtsh_ss(w[2].dmin), _cvtsh_ss(w[3].dmin) };
		__m512 vd = _mm512_permutexvar_ps(row_idx, _mm512_castps128_ps512(_mm_loadu_ps(dd)));
		__m512 vdm = _mm512_permutexvar_ps(row_idx, _mm512_castps128_ps512(_mm_loadu_ps(dm)));

		__m512i acc[Q4K_NT];
		for (int t = 0; t < NT; t++)
			acc[t] = _mm512_setzero_si512();
		for (int nn = 0; nn < 4; nn++) {
			__m512i x0 = rows16(w, 32 * nn), x1 = rows16(w, 32 * nn + 16);
			__m512i lo0 = _mm512_and_si512(x0, m4), lo1 = _mm512_and_si512(x1, m4);
			__m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(x0, 4), m4);
			__m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(x1, 4), m4);
			__m512i sclo = _mm512_maskz_permutexvar_epi16(0x55555555, _mm512_add_epi16(sc_base, _mm512_set1_epi16((short)(2 * nn))), scw);
			__m512i schi = _mm512_maskz_permutexvar_epi16(0x55555555, _mm512_add_epi16(sc_base, _mm512_set1_epi16((short)(2 * nn + 1))), scw);
			for (int t = 0; t < NT; t++) {
				const int8_t *q = ((const BlockQ8_K *)(act + (size_t)t * a_stride) + b)->qs + 64 * nn;
				__m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo0, bcast16(q)), lo1, bcast16(q + 16));
				acc[t] = _mm512_dpwssd_epi32(acc[t], s, sclo);
				s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, hi0, bcast16(q + 32)), hi1, bcast16(q + 48));
				acc[t] = _mm512_dpwssd_epi32(acc[t], s, schi);
			}
		}
		for (int t = 0; t < NT; t++) {
			const BlockQ8_K *a = (const BlockQ8_K *)(act + (size_t)t * a_stride) + b;
			__m512i m = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(zero, bcast16(a->bsums), mlo), bcast16(a->bsums + 8),
							mhi);
			__m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(acc[t]), vd,
						   _mm512_mul_ps(_mm512_cvtepi32_ps(m), vdm));
			facc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(a->d), facc[t]);
		}
	}
	for (int t = 0; t < NT; t++) {
		_Alignas(64) float v[16];
		_mm512_store_ps(v, facc[t]);
		for (int r = 0; r < REPACK_GROUP; r++)
			y[(size_t)t * y_stride + (size_t)r] = (v[4 * r] + v[4 * r + 1]) + (v[4 * r + 2] + v[4 * r + 3]);
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

/*
 * Two groups (8 rows) at once: dword lane i holds row (i / 2) % 2 * 4 +
 * i / 4 (128-bit lane r: group 0's row r in the low 64 bits, group 1's
 * row r in the high), columns 4 (i % 2) .. +3 of an 8-column slice. Each
 * sub-block is 4 slices, so four vpdpbusd (16 products per lane, |S| <=
 * 16 * 15 * 128 < 2^15) share one vpdpwssd by the scale, and the floats
 * are formed once per (token, super-block) for 8 rows. Activations:
 * 8 bytes broadcast to every 64-bit lane (a load).
 */
#define Q4K8_NT 16

static inline int lane_row8(int i)
{
	return (i >> 1 & 1) * 4 + (i >> 2);
}

static inline __attribute__((always_inline)) void q4k_tile8(int64_t nb, const BlockQ4_K *g0, const char *act,
							     size_t a_stride, float *y, size_t y_stride,
							     const int NT)
{
	const BlockQ4_K *g1 = g0 + REPACK_GROUP * nb;
	const __m512i m4 = _mm512_set1_epi8(0xF);
	const __m512i zero = _mm512_setzero_si512();
	_Alignas(64) short sc_idx[8][32], mw_idx[4][32];
	_Alignas(64) int row_idx[16];
	_Alignas(64) float facc[Q4K8_NT][16];

	for (int i = 0; i < 16; i++) {
		row_idx[i] = lane_row8(i);
		for (int j = 0; j < 8; j++)
			sc_idx[j][2 * i] = sc_idx[j][2 * i + 1] = (short)(8 * lane_row8(i) + j);
		for (int k = 0; k < 4; k++)
			mw_idx[k][2 * i] = mw_idx[k][2 * i + 1] = (short)(8 * lane_row8(i) + 2 * k + (i & 1));
	}
	const __m512i vrow = _mm512_load_si512(row_idx);
	for (int t = 0; t < NT; t++)
		_mm512_store_ps(facc[t], _mm512_setzero_ps());

	for (int64_t b = 0; b < nb; b++) {
		const BlockQ4_K *w0 = &g0[b * REPACK_GROUP], *w1 = &g1[b * REPACK_GROUP];
		for (int l = 0; l < 9; l++) {
			_mm_prefetch((const char *)(w0 + 2 * REPACK_GROUP) + 64 * l, _MM_HINT_T0);
			_mm_prefetch((const char *)(w1 + 2 * REPACK_GROUP) + 64 * l, _MM_HINT_T0);
		}
		/* scales and mins as words, row k (group k / 4, row k % 4) at 8 k */
		__m128i sm[8];
		for (int r = 0; r < 4; r++) {
			sm[r] = q4k_scales_mins(w0[r].scales);
			sm[4 + r] = q4k_scales_mins(w1[r].scales);
		}
		__m512i sc_lo = _mm512_cvtepu8_epi16(
			_mm256_set_m128i(_mm_unpacklo_epi64(sm[2], sm[3]), _mm_unpacklo_epi64(sm[0], sm[1])));
		__m512i sc_hi = _mm512_cvtepu8_epi16(
			_mm256_set_m128i(_mm_unpacklo_epi64(sm[6], sm[7]), _mm_unpacklo_epi64(sm[4], sm[5])));
		__m512i mn_lo = _mm512_cvtepu8_epi16(
			_mm256_set_m128i(_mm_unpackhi_epi64(sm[2], sm[3]), _mm_unpackhi_epi64(sm[0], sm[1])));
		__m512i mn_hi = _mm512_cvtepu8_epi16(
			_mm256_set_m128i(_mm_unpackhi_epi64(sm[6], sm[7]), _mm_unpackhi_epi64(sm[4], sm[5])));
		__m512i mw[4];
		for (int k = 0; k < 4; k++)
			mw[k] = _mm512_permutex2var_epi16(mn_lo, _mm512_load_si512(mw_idx[k]), mn_hi);
		float dd[8], dm[8];
		for (int r = 0; r < 4; r++) {
			dd[r] = _cvtsh_ss(w0[r].d);
			dd[4 + r] = _cvtsh_ss(w1[r].d);
			dm[r] = _cvtsh_ss(w0[r].dmin);
			dm[4 + r] = _cvtsh_ss(w1[r].dmin);
		}
		__m512 vd = _mm512_permutexvar_ps(vrow, _mm512_castps256_ps512(_mm256_loadu_ps(dd)));
		__m512 vdm = _mm512_permutexvar_ps(vrow, _mm512_castps256_ps512(_mm256_loadu_ps(dm)));

		__m512i acc[Q4K8_NT];
		for (int t = 0; t < NT; t++)
			acc[t] = _mm512_setzero_si512();
		for (int nn = 0; nn < 4; nn++) {
			/* slices u = 2 h + half: columns 8 u .. 8 u + 7 of qs[32 nn ..] */
			__m512i pk[4];
			for (int h = 0; h < 2; h++) {
				__m512i x = rows16(w0, 32 * nn + 16 * h), z = rows16(w1, 32 * nn + 16 * h);
				pk[2 * h] = _mm512_unpacklo_epi64(x, z);
				pk[2 * h + 1] = _mm512_unpackhi_epi64(x, z);
			}
			for (int half = 0; half < 2; half++) {
				int j = 2 * nn + half;
				__m512i nib[4];
				for (int u = 0; u < 4; u++)
					nib[u] = _mm512_and_si512(half ? _mm512_srli_epi16(pk[u], 4) : pk[u], m4);
				__m512i scj = _mm512_maskz_permutex2var_epi16(0x55555555, sc_lo, _mm512_load_si512(sc_idx[j]),
									      sc_hi);
				for (int t = 0; t < NT; t++) {
					const int8_t *q = ((const BlockQ8_K *)(act + (size_t)t * a_stride) + b)->qs + 32 * j;
					__m512i s = zero;
					for (int u = 0; u < 4; u++) {
						int64_t a8;
						memcpy(&a8, q + 8 * u, 8);
						s = _mm512_dpbusd_epi32(s, nib[u], _mm512_set1_epi64(a8));
					}
					acc[t] = _mm512_dpwssd_epi32(acc[t], s, scj);
				}
			}
		}
		for (int t = 0; t < NT; t++) {
			const BlockQ8_K *a = (const BlockQ8_K *)(act + (size_t)t * a_stride) + b;
			__m512i m = zero;
			for (int k = 0; k < 4; k++) {
				int64_t b4;
				memcpy(&b4, a->bsums + 4 * k, 8);
				m = _mm512_dpwssd_epi32(m, _mm512_set1_epi64(b4), mw[k]);
			}
			__m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(acc[t]), vd, _mm512_mul_ps(_mm512_cvtepi32_ps(m), vdm));
			_mm512_store_ps(facc[t], _mm512_fmadd_ps(v, _mm512_set1_ps(a->d), _mm512_load_ps(facc[t])));
		}
	}
	for (int t = 0; t < NT; t++)
		for (int r = 0; r < 4; r++)
			for (int grp = 0; grp < 2; grp++)
				y[(size_t)t * y_stride + (size_t)(4 * grp + r)] =
					facc[t][4 * r + 2 * grp] + facc[t][4 * r + 2 * grp + 1];
}

void repack_tile8_q4_K_avx512vnni(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
				  size_t y_stride)
{
	const BlockQ4_K *g = group;
	int64_t nb = n / QK_K;
	for (int t0 = 0; t0 < nt; t0 += Q4K8_NT) {
		const char *a = (const char *)act + (size_t)t0 * a_stride;
		float *yt = y + (size_t)t0 * y_stride;
		switch (nt - t0 < Q4K8_NT ? nt - t0 : Q4K8_NT) {
#define CASE(k) \
	case k: q4k_tile8(nb, g, a, a_stride, yt, y_stride, k); break;
		CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
		CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15)
#undef CASE
		default: q4k_tile8(nb, g, a, a_stride, yt, y_stride, 16); break;
		}
	}
}

RepackTileFn repack_tile8_avx512_get(uint32_t t)
{
	return t == WTYPE_Q4_K ? repack_tile8_q4_K_avx512vnni : NULL;
}

RepackTileFn repack_tile_avx512_get(uint32_t t)
{
	return t == WTYPE_Q4_K ? repack_tile_q4_K_avx512vnni : NULL;
}
