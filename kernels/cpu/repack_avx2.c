/*
 * repack_avx2.c: AVX2 tile kernels for the X4 layout (repack.h). Compiled
 * with -mavx2 -mfma -mf16c; called only when cpu_features() has them.
 *
 * Q4_K: the whole group (4 rows) against up to 16 Q8_K activation rows.
 * Per super-block the 4 rows' nibbles are transposed once into a stack
 * copy (Q4kUnpacked) in which one register holds 8 consecutive values of
 * one sub-block for all 4 rows (one row per 64-bit lane, lane order
 * 0, 2, 1, 3: what unpack_epi64 + permute2x128 give); each token's 8
 * matching activation bytes are broadcast to all 4 lanes, so one maddubs
 * is 4 rows x 8 values of one token. A sub-block (32 values) is 4 maddubs
 * summed in int16 (at most 4 x 2 x 15 x 128 = 15360, no overflow) and one
 * madd by the rows' 6-bit scales, against one maddubs + one madd per 32
 * values when each register holds one row: the multiply ports were the
 * limit. The min term sum_j m_j (bsums[2j] + bsums[2j+1]) is two madds per
 * token and super-block in the same lane order. Integer sub-block sums are
 * exact; d, dmin and the activation scale are applied in float per
 * super-block, and the two int32 lanes of each row are added at the end.
 * Decode (1-2 tokens) keeps the earlier two-rows-per-pass kernel, q4k_pair.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/repack.h"
#include "kernels/cpu/repack_x86.h"

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

/*
 * Decode (1-2 tokens): two rows at a time, one row per register, each
 * row's scales, mins and nibbles unpacked once per super-block; the min
 * term by one madd over the bsums. 4-10% faster than q4k_direct at 1 and 2
 * tokens in the kernel harness (docs/benchmarks.md), the 4-row transpose
 * not paying for itself without tokens to share it.
 */
#define AVX2_PAIR_NT 2

static inline __attribute__((always_inline)) void q4k_pair(int64_t nb, const BlockQ4_K *g, int r0,
							    const char *act, size_t a_stride, float *y, size_t y_stride,
							    const int NT)
{
	const __m256i m4 = _mm256_set1_epi8(0xF);
	__m256 accf[2][AVX2_PAIR_NT];
	for (int i = 0; i < 2; i++)
		for (int t = 0; t < NT; t++)
			accf[i][t] = _mm256_setzero_ps();

	for (int64_t b = 0; b < nb; b++) {
		const BlockQ4_K *w[2] = { &g[b * REPACK_GROUP + r0], &g[b * REPACK_GROUP + r0 + 1] };
		const BlockQ8_K *a[AVX2_PAIR_NT];
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

		__m256i acc[2][AVX2_PAIR_NT];
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

/* Tokens per pass over one unpacked super-block: NT int32 accumulators,
 * 4 weight registers, the scales and two temporaries fill the 16 ymm. */
#define AVX2_NT 8

/* One super-block of a group, unpacked for every token of the call. Lanes:
 * 64-bit lane 0 row 0, 1 row 2, 2 row 1, 3 row 3 (int16 lanes 4 per row,
 * float lanes 2 per row). */
typedef struct Q4kUnpacked {
	__m256i q[8][4]; /* sub-block j's values 8k..8k+7, 8 bytes (0..15) per row */
	__m256i sc[8];   /* sub-block j's scale, int16, 4 lanes per row */
	__m256i mlo;     /* mins m0..m3 of each row, int16 */
	__m256i mhi;     /* mins m4..m7 */
	__m256 d;        /* d of each row, 2 lanes per row */
	__m256 dmin;
} Q4kUnpacked;

/* Tokens up to which q4k_direct (no stack copy) is used (from
 * AVX2_PAIR_NT + 1): faster than q4k_pair at 3, and than the stack copy. */
#define AVX2_DIRECT_NT 3
/* A sub-block's 4 maddubs summed in int16: |4 x 2 x 15 x (-128)| fits. */
static_assert(4 * 2 * 15 * 128 <= INT16_MAX, "q4k_sub16 overflows int16");
/* madd by the 6-bit scales over 8 sub-blocks, two lanes each, fits int32
 * (and is exact in float: below 2^24). */
static_assert(8 * 2 * (4 * 2 * 15 * 128) * 63 < (1 << 24), "a super-block's int32 sum is not exact in float");
static_assert(sizeof(Q4kUnpacked) == 44 * sizeof(__m256i), "Q4kUnpacked is 44 registers");

/* The group's super-block two ahead (4 x 144 bytes). */
static inline void q4k_prefetch(const BlockQ4_K *blk)
{
	for (int i = 0; i < 9; i++)
		__builtin_prefetch((const char *)(blk + 2 * REPACK_GROUP) + 64 * i, 0, 0);
}

static inline __m256i bcast64(const int8_t *p)
{
	int64_t v;
	memcpy(&v, p, sizeof(v));
	return _mm256_set1_epi64x(v);
}

/* The transposed nibbles of values 64 nn .. 64 nn + 63 of the group's
 * super-block blk (4 consecutive BlockQ4_K, rows 0..3): lo[k] (sub-block
 * 2 nn) and hi[k] (2 nn + 1) hold values 8k..8k+7 of each row. */
static inline __attribute__((always_inline)) void q4k_nibbles(const BlockQ4_K *blk, int nn, __m256i *lo,
							       __m256i *hi)
{
	const __m256i m4 = _mm256_set1_epi8(0xF);
	__m256i r0 = _mm256_loadu_si256((const __m256i *)(blk[0].qs + 32 * nn));
	__m256i r1 = _mm256_loadu_si256((const __m256i *)(blk[1].qs + 32 * nn));
	__m256i r2 = _mm256_loadu_si256((const __m256i *)(blk[2].qs + 32 * nn));
	__m256i r3 = _mm256_loadu_si256((const __m256i *)(blk[3].qs + 32 * nn));
	/* [r0 k0, r2 k0 | r0 k2, r2 k2] etc., k the 8-byte chunk */
	__m256i lo02 = _mm256_unpacklo_epi64(r0, r2), hi02 = _mm256_unpackhi_epi64(r0, r2);
	__m256i lo13 = _mm256_unpacklo_epi64(r1, r3), hi13 = _mm256_unpackhi_epi64(r1, r3);
	__m256i v[4] = {
		_mm256_permute2x128_si256(lo02, lo13, 0x20),
		_mm256_permute2x128_si256(hi02, hi13, 0x20),
		_mm256_permute2x128_si256(lo02, lo13, 0x31),
		_mm256_permute2x128_si256(hi02, hi13, 0x31),
	};
	for (int k = 0; k < 4; k++) {
		lo[k] = _mm256_and_si256(v[k], m4);
		hi[k] = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), m4);
	}
}

/* Sub-block j's scale of each row, from q4k_scales8()'s bytes. */
static inline __m256i q4k_scale16(__m256i sc8, int j)
{
	const char z = (char)0x80, a = (char)j, b = (char)(8 + j);
	return _mm256_shuffle_epi8(sc8, _mm256_setr_epi8(a, z, a, z, a, z, a, z, b, z, b, z, b, z, b, z, a, z, a, z, a,
							 z, a, z, b, z, b, z, b, z, b, z));
}

/* The 4 rows' 6-bit scales (*sc8) and mins (*mn8) as bytes, lanes
 * [row 0 | row 2 || row 1 | row 3]; d and dmin 2 float lanes per row. */
static inline __attribute__((always_inline)) void q4k_scales8(const BlockQ4_K *blk, __m256i *sc8, __m256i *mn8,
							       __m256 *d, __m256 *dmin)
{
	__m128i sm0 = q4k_scales_mins(blk[0].scales), sm1 = q4k_scales_mins(blk[1].scales);
	__m128i sm2 = q4k_scales_mins(blk[2].scales), sm3 = q4k_scales_mins(blk[3].scales);
	*sc8 = _mm256_set_m128i(_mm_unpacklo_epi64(sm1, sm3), _mm_unpacklo_epi64(sm0, sm2));
	*mn8 = _mm256_set_m128i(_mm_unpackhi_epi64(sm1, sm3), _mm_unpackhi_epi64(sm0, sm2));
	float d0 = _cvtsh_ss(blk[0].d), d1 = _cvtsh_ss(blk[1].d), d2 = _cvtsh_ss(blk[2].d), d3 = _cvtsh_ss(blk[3].d);
	float m0 = _cvtsh_ss(blk[0].dmin), m1 = _cvtsh_ss(blk[1].dmin), m2 = _cvtsh_ss(blk[2].dmin),
	      m3 = _cvtsh_ss(blk[3].dmin);
	*d = _mm256_setr_ps(d0, d0, d2, d2, d1, d1, d3, d3);
	*dmin = _mm256_setr_ps(m0, m0, m2, m2, m1, m1, m3, m3);
}

/* Mins m0..m3 (hi: m4..m7) of each row as int16, 4 lanes per row. */
static inline __m256i q4k_mins16(__m256i mn8, bool hi)
{
	const char z = (char)0x80, o = hi ? 4 : 0;
	return _mm256_shuffle_epi8(mn8, _mm256_setr_epi8(o, z, o + 1, z, o + 2, z, o + 3, z, o + 8, z, o + 9, z, o + 10,
							 z, o + 11, z, o, z, o + 1, z, o + 2, z, o + 3, z, o + 8, z,
							 o + 9, z, o + 10, z, o + 11, z));
}

/* One token's sub-block (32 activations at p) against 4 weight registers
 * w[0..3] (values 8k..8k+7 of each row): int16 pair sums, 4 lanes per row. */
static inline __attribute__((always_inline)) __m256i q4k_sub16(const __m256i *w, const int8_t *p)
{
	__m256i s = _mm256_maddubs_epi16(w[0], bcast64(p));
	s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[1], bcast64(p + 8)));
	s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[2], bcast64(p + 16)));
	return _mm256_add_epi16(s, _mm256_maddubs_epi16(w[3], bcast64(p + 24)));
}

/* accf += the super-block's float partial sums of one token: integer dot
 * products acc, the min term from the token's bsums. */
static inline __attribute__((always_inline)) __m256 q4k_finish(__m256 accf, __m256i acc, const BlockQ8_K *a,
								__m256i mlo, __m256i mhi, __m256 d, __m256 dmin)
{
	/* S_j = sum of sub-block j's 32 activations, j = 0..7 */
	__m128i s = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)a->bsums),
				   _mm_loadu_si128((const __m128i *)(a->bsums + 8)));
	__m256i slo = _mm256_broadcastq_epi64(s);
	__m256i shi = _mm256_permute4x64_epi64(_mm256_castsi128_si256(s), 0x55);
	__m256i mm = _mm256_add_epi32(_mm256_madd_epi16(slo, mlo), _mm256_madd_epi16(shi, mhi));
	__m256 f = _mm256_fmsub_ps(_mm256_cvtepi32_ps(acc), d, _mm256_mul_ps(_mm256_cvtepi32_ps(mm), dmin));
	return _mm256_fmadd_ps(f, _mm256_broadcast_ss(&a->d), accf);
}

/* Group super-block blk into *u. */
static inline __attribute__((always_inline)) void q4k_unpack(const BlockQ4_K *blk, Q4kUnpacked *u)
{
	__m256i sc8, mn8;
	for (int nn = 0; nn < 4; nn++)
		q4k_nibbles(blk, nn, u->q[2 * nn], u->q[2 * nn + 1]);
	q4k_scales8(blk, &sc8, &mn8, &u->d, &u->dmin);
	for (int j = 0; j < 8; j++)
		u->sc[j] = q4k_scale16(sc8, j);
	u->mlo = q4k_mins16(mn8, false);
	u->mhi = q4k_mins16(mn8, true);
}

/* NT tokens' super-block (a[t], Q8_K) against the unpacked group: accf[t]
 * += the 4 rows' partial dot products (2 float lanes per row). */
static inline __attribute__((always_inline)) void q4k_tokens(const Q4kUnpacked *u, const BlockQ8_K *const *a,
							      __m256 *accf, const int NT)
{
	__m256i acc[AVX2_NT];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_si256();
	for (int j = 0; j < 8; j++) {
		const __m256i w[4] = { u->q[j][0], u->q[j][1], u->q[j][2], u->q[j][3] }, sc = u->sc[j];
		for (int t = 0; t < NT; t++) {
			__m256i m = _mm256_madd_epi16(q4k_sub16(w, a[t]->qs + 64 * (j / 2) + 32 * (j % 2)), sc);
			acc[t] = _mm256_add_epi32(acc[t], m);
		}
	}
	for (int t = 0; t < NT; t++)
		accf[t] = q4k_finish(accf[t], acc[t], a[t], u->mlo, u->mhi, u->d, u->dmin);
}

/* Few tokens (decode): no stack copy, each nibble register used as it is
 * made. Same sums as q4k_tokens. */
static inline __attribute__((always_inline)) void q4k_direct(int64_t nb, const BlockQ4_K *g, const char *act,
							      size_t a_stride, __m256 *accf, const int NT)
{
	for (int64_t b = 0; b < nb; b++) {
		const BlockQ4_K *blk = g + b * REPACK_GROUP;
		const BlockQ8_K *a[AVX2_NT];
		__m256i sc8, mn8, acc[AVX2_NT];
		__m256 d, dmin;
		for (int t = 0; t < NT; t++) {
			a[t] = (const BlockQ8_K *)(act + (size_t)t * a_stride) + b;
			acc[t] = _mm256_setzero_si256();
		}
		q4k_prefetch(blk);
		q4k_scales8(blk, &sc8, &mn8, &d, &dmin);
		for (int nn = 0; nn < 4; nn++) {
			__m256i lo[4], hi[4];
			q4k_nibbles(blk, nn, lo, hi);
			__m256i slo = q4k_scale16(sc8, 2 * nn), shi = q4k_scale16(sc8, 2 * nn + 1);
			for (int t = 0; t < NT; t++) {
				__m256i m = _mm256_add_epi32(_mm256_madd_epi16(q4k_sub16(lo, a[t]->qs + 64 * nn), slo),
							     _mm256_madd_epi16(q4k_sub16(hi, a[t]->qs + 64 * nn + 32), shi));
				acc[t] = _mm256_add_epi32(acc[t], m);
			}
		}
		for (int t = 0; t < NT; t++)
			accf[t] = q4k_finish(accf[t], acc[t], a[t], q4k_mins16(mn8, false), q4k_mins16(mn8, true), d, dmin);
	}
}

static void q4k_tokens_n(const Q4kUnpacked *u, const BlockQ8_K *const *a, __m256 *accf, int nt)
{
	switch (nt) {
	case 1: q4k_tokens(u, a, accf, 1); break;
	case 2: q4k_tokens(u, a, accf, 2); break;
	case 3: q4k_tokens(u, a, accf, 3); break;
	case 4: q4k_tokens(u, a, accf, 4); break;
	case 5: q4k_tokens(u, a, accf, 5); break;
	case 6: q4k_tokens(u, a, accf, 6); break;
	case 7: q4k_tokens(u, a, accf, 7); break;
	default: q4k_tokens(u, a, accf, 8); break;
	}
}

void repack_tile_q4_K_avx2(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			   size_t y_stride)
{
	const BlockQ4_K *g = group;
	int64_t nb = n / QK_K;
	__m256 accf[REPACK_MAX_NT];

	for (int t = 0; t < nt; t++)
		accf[t] = _mm256_setzero_ps();
	if (nt <= AVX2_PAIR_NT) {
		for (int r0 = 0; r0 < REPACK_GROUP; r0 += 2) {
			if (nt == 1)
				q4k_pair(nb, g, r0, act, a_stride, y, y_stride, 1);
			else
				q4k_pair(nb, g, r0, act, a_stride, y, y_stride, 2);
		}
		return;
	}
	if (nt <= AVX2_DIRECT_NT) {
		q4k_direct(nb, g, act, a_stride, accf, 3);
	} else {
		Q4kUnpacked u;
		const BlockQ8_K *a[REPACK_MAX_NT];
		for (int64_t b = 0; b < nb; b++) {
			const BlockQ4_K *blk = g + b * REPACK_GROUP;
			q4k_prefetch(blk);
			q4k_unpack(blk, &u);
			for (int t = 0; t < nt; t++)
				a[t] = (const BlockQ8_K *)((const char *)act + (size_t)t * a_stride) + b;
			for (int t0 = 0; t0 < nt; t0 += AVX2_NT)
				q4k_tokens_n(&u, a + t0, accf + t0, nt - t0 < AVX2_NT ? nt - t0 : AVX2_NT);
		}
	}
	for (int t = 0; t < nt; t++) {
		/* lanes (0,1) row 0, (2,3) row 2, (4,5) row 1, (6,7) row 3 */
		__m128 h = _mm_hadd_ps(_mm256_castps256_ps128(accf[t]), _mm256_extractf128_ps(accf[t], 1));
		_mm_storeu_ps(y + (size_t)t * y_stride, _mm_shuffle_ps(h, h, _MM_SHUFFLE(3, 1, 2, 0)));
	}
}

RepackTileFn repack_tile_avx2_get(uint32_t t)
{
	return t == WTYPE_Q4_K ? repack_tile_q4_K_avx2 : NULL;
}
