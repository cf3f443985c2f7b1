/*
 * repack_q32_avx2.c: AVX2 tile kernels for the X4 layout of the 32-value
 * block types Q4_0, Q4_1, Q5_0 and Q8_0 (repack.h). Compiled with -mavx2 -mfma
 * -mf16c; called only when cpu_features() has them. Not the Q4_K tiles
 * (repack_avx2.c).
 *
 * The layout puts 8 quant bytes of each of a group's 4 rows in one
 * register (row i in 64-bit lane i), so a token's 8 activation bytes are
 * one broadcast load and one vpmaddubsw multiplies them with all 4 rows:
 * the products land lane-aligned per row, and nothing is summed
 * horizontally before the end. Per group-block the weights are decoded
 * once (nibbles split, scales converted and spread to the 8 lanes, two
 * per row) for up to TILE_NT tokens; per token and group-block the 4 rows
 * cost 4 vpmaddubsw, one vpmaddwd into int32 and one float multiply-add.
 *
 * Exactness: every integer block sum equals the reference's. vpmaddubsw
 * takes unsigned bytes times signed ones, pairs summed to int16 with
 * saturation, so: Q4_1 nibbles (0..15) go in as they are, and the 4
 * chunks' int16 sums add up in int16 (4 * 2 * 15 * 128 < 2^15); Q4_0's
 * q - 8, Q5_0's q - 16 and Q8_0's int8 quants go in as |w| against
 * sign(a, w), Q4_0's and Q5_0's chunks added in int16 (4 * 2 * 16 * 128 =
 * 2^14 at most), Q8_0's widened to int32
 * chunk by chunk (2 * 128 * 127 fits, two of them might not). Floats: the
 * reference adds block after block into one sum; here each lane keeps its
 * own and the two lanes of a row are added at the end, so the results
 * agree to float rounding (exactly when all scales are powers of two and
 * the sums stay within 24 bits, which the tests use).
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/repack.h"

/* Tokens per pass over a group's weights: one float accumulator each, with
 * the 4 (Q4_0: 8) decoded weight registers and the scales beside them. */
#define TILE_NT 4
/* How far ahead in the weight stream to prefetch, as the row kernels do
 * (vec_dot_avx2.c): the hardware prefetchers stop at 4 KiB pages. */
#define PREFETCH_BYTES 4096

static_assert(offsetof(BlockQ8_1, d) == 0 && offsetof(BlockQ8_1, s) == 2 && offsetof(BlockQ8_1, qs) == 4,
	      "Q8_1: (d, s) is one 32-bit word before qs");
static_assert(offsetof(BlockQ8_0, d) == 0 && offsetof(BlockQ8_0, qs) == 2, "Q8_0: d before qs");

/* 8 activation bytes into every 64-bit lane: one vpbroadcastq load. */
static inline __m256i bcast8(const int8_t *p)
{
	long long v;
	memcpy(&v, p, sizeof(v));
	return _mm256_set1_epi64x(v);
}

/* The 4 halves at p (rows 0..3) as floats, each in its row's two lanes. */
static inline __m256 halves_dup(const uint8_t *p)
{
	__m128i h = _mm_loadl_epi64((const __m128i *)p);
	return _mm256_cvtph_ps(_mm_unpacklo_epi16(h, h));
}

/* One half at p in all 8 lanes. */
static inline __m256 half_bcast(const void *p)
{
	short h;
	memcpy(&h, p, sizeof(h));
	return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

/* acc lanes 2i, 2i + 1 summed into y[i], i < 4. */
static inline void store_rows(float *y, __m256 acc)
{
	__m256 h = _mm256_hadd_ps(acc, acc); /* r0 r1 r0 r1 | r2 r3 r2 r3 */
	__m128 lo = _mm256_castps256_ps128(h), hi = _mm256_extractf128_ps(h, 1);
	_mm_storeu_ps(y, _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)));
}

static inline __attribute__((always_inline)) void prefetch_group_block(const uint8_t *gb, size_t bytes)
{
	for (size_t o = 0; o < bytes; o += 64)
		_mm_prefetch((const char *)gb + PREFETCH_BYTES + o, _MM_HINT_T0);
}

/* Q4_1 . Q8_1: sum_b dw da isum + mw sa; the min term rides in even lanes. */
static inline __attribute__((always_inline)) void q4_1_pass(int64_t nb, const uint8_t *g, const char *act,
							     size_t a_stride, float *y, size_t y_stride, bool pf,
							     const int NT)
{
	const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
	const size_t gbb = REPACK_GROUP * sizeof(BlockQ4_1);
	__m256 acc[TILE_NT];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *gb = g + (size_t)b * gbb;
		if (pf)
			prefetch_group_block(gb, gbb);
		__m256 dw = halves_dup(gb);
		__m256 mw = _mm256_blend_ps(_mm256_setzero_ps(), halves_dup(gb + 8), 0x55);
		__m256i q0 = _mm256_loadu_si256((const __m256i *)(gb + 16));
		__m256i q1 = _mm256_loadu_si256((const __m256i *)(gb + 48));
		__m256i w0 = _mm256_and_si256(q0, m4);                       /* values 0..7 */
		__m256i w2 = _mm256_and_si256(_mm256_srli_epi16(q0, 4), m4); /* 16..23 */
		__m256i w1 = _mm256_and_si256(q1, m4);                       /* 8..15 */
		__m256i w3 = _mm256_and_si256(_mm256_srli_epi16(q1, 4), m4); /* 24..31 */
		for (int t = 0; t < NT; t++) {
			const BlockQ8_1 *a = (const BlockQ8_1 *)(act + (size_t)t * a_stride) + b;
			__m256i p = _mm256_maddubs_epi16(w0, bcast8(a->qs));
			p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w1, bcast8(a->qs + 8)));
			p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w2, bcast8(a->qs + 16)));
			p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w3, bcast8(a->qs + 24)));
			int ds32;
			memcpy(&ds32, a, sizeof(ds32));
			__m256 ds = _mm256_cvtph_ps(_mm_set1_epi32(ds32)); /* da sa da sa ... */
			__m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
			acc[t] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, _mm256_moveldup_ps(ds)), acc[t]);
			acc[t] = _mm256_fmadd_ps(mw, _mm256_movehdup_ps(ds), acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		store_rows(y + (size_t)t * y_stride, acc[t]);
}

/* Q4_0's 4 chunks of group-block gb as int8 q - 8. */
static inline __attribute__((always_inline)) void q4_0_decode(const uint8_t *gb, __m256i w[4])
{
	const __m256i m4 = _mm256_set1_epi8(0xF), eight = _mm256_set1_epi8(8);
	__m256i q0 = _mm256_loadu_si256((const __m256i *)(gb + 8));
	__m256i q1 = _mm256_loadu_si256((const __m256i *)(gb + 40));
	w[0] = _mm256_sub_epi8(_mm256_and_si256(q0, m4), eight);                       /* values 0..7 */
	w[1] = _mm256_sub_epi8(_mm256_and_si256(q1, m4), eight);                       /* 8..15 */
	w[2] = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4), eight); /* 16..23 */
	w[3] = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4), eight); /* 24..31 */
}

/*
 * Q5_0's fifth bits for one chunk: byte k of row i's lane is bit k of qh
 * byte j of row i, as 0xFF or 0. qh4 holds the group-block's 16 qh bytes
 * in both 128-bit halves (rows 0, 1 low, rows 2, 3 high: bytes 2i, 2i + 1
 * are row i's qh bytes 0, 1, bytes 8 + 2i, 9 + 2i its bytes 2, 3).
 */
static inline __m256i q5_bits(__m256i qh4, int j)
{
	int lo = j < 2 ? j : 8 + j - 2; /* row 0's byte j within the 16 */
	__m256i idx = _mm256_setr_epi64x(0x0101010101010101LL * lo, 0x0101010101010101LL * (lo + 2),
					 0x0101010101010101LL * (lo + 4), 0x0101010101010101LL * (lo + 6));
	const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
	return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh4, idx), bit), bit);
}

/* Q5_0's 4 chunks as int8 q - 16: the nibble where the fifth bit is set,
 * else the nibble with 0xF0 or-ed in (nibble - 16). */
static inline __attribute__((always_inline)) void q5_0_decode(const uint8_t *gb, __m256i w[4])
{
	const __m256i m4 = _mm256_set1_epi8(0xF), f0 = _mm256_set1_epi8((char)0xF0);
	__m256i qh4 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(gb + 8)));
	__m256i q0 = _mm256_loadu_si256((const __m256i *)(gb + 24));
	__m256i q1 = _mm256_loadu_si256((const __m256i *)(gb + 56));
	__m256i nib[4] = {
		_mm256_and_si256(q0, m4),                       /* values 0..7: qh byte 0 */
		_mm256_and_si256(q1, m4),                       /* 8..15: byte 1 */
		_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4), /* 16..23: byte 2 */
		_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4), /* 24..31: byte 3 */
	};
	for (int c = 0; c < 4; c++)
		w[c] = _mm256_or_si256(nib[c], _mm256_andnot_si256(q5_bits(qh4, c), f0));
}

/* Q4_0 and Q5_0 . Q8_0: small signed quants (|w| <= 16) as |w| against
 * sign(a, w), the 4 chunks' products added in int16. */
static inline __attribute__((always_inline)) void small_pass(int64_t nb, size_t gbb,
							      void (*decode)(const uint8_t *, __m256i *),
							      const uint8_t *g, const char *act, size_t a_stride,
							      float *y, size_t y_stride, bool pf, const int NT)
{
	const __m256i ones = _mm256_set1_epi16(1);
	__m256 acc[TILE_NT];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *gb = g + (size_t)b * gbb;
		if (pf)
			prefetch_group_block(gb, gbb);
		__m256 dw = halves_dup(gb);
		__m256i w[4], aw[4];
		decode(gb, w);
		for (int c = 0; c < 4; c++)
			aw[c] = _mm256_abs_epi8(w[c]);
		for (int t = 0; t < NT; t++) {
			const BlockQ8_0 *a = (const BlockQ8_0 *)(act + (size_t)t * a_stride) + b;
			__m256i p = _mm256_maddubs_epi16(aw[0], _mm256_sign_epi8(bcast8(a->qs), w[0]));
			for (int c = 1; c < 4; c++)
				p = _mm256_add_epi16(p, _mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(
										      bcast8(a->qs + 8 * c), w[c])));
			__m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
			acc[t] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, half_bcast(&a->d)), acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		store_rows(y + (size_t)t * y_stride, acc[t]);
}

static inline __attribute__((always_inline)) void q4_0_pass(int64_t nb, const uint8_t *g, const char *act,
							     size_t a_stride, float *y, size_t y_stride, bool pf,
							     const int NT)
{
	small_pass(nb, REPACK_GROUP * sizeof(BlockQ4_0), q4_0_decode, g, act, a_stride, y, y_stride, pf, NT);
}

static inline __attribute__((always_inline)) void q5_0_pass(int64_t nb, const uint8_t *g, const char *act,
							     size_t a_stride, float *y, size_t y_stride, bool pf,
							     const int NT)
{
	small_pass(nb, REPACK_GROUP * sizeof(BlockQ5_0), q5_0_decode, g, act, a_stride, y, y_stride, pf, NT);
}

/* Q8_0 . Q8_0: |w| against sign(a, w), each chunk widened to int32. */
static inline __attribute__((always_inline)) void q8_0_pass(int64_t nb, const uint8_t *g, const char *act,
							     size_t a_stride, float *y, size_t y_stride, bool pf,
							     const int NT)
{
	const __m256i ones = _mm256_set1_epi16(1);
	const size_t gbb = REPACK_GROUP * sizeof(BlockQ8_0);
	__m256 acc[TILE_NT];
	for (int t = 0; t < NT; t++)
		acc[t] = _mm256_setzero_ps();

	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *gb = g + (size_t)b * gbb;
		if (pf)
			prefetch_group_block(gb, gbb);
		__m256 dw = halves_dup(gb);
		__m256i w[4], aw[4];
		for (int c = 0; c < 4; c++) {
			w[c] = _mm256_loadu_si256((const __m256i *)(gb + 8 + 32 * c));
			aw[c] = _mm256_abs_epi8(w[c]);
		}
		for (int t = 0; t < NT; t++) {
			const BlockQ8_0 *a = (const BlockQ8_0 *)(act + (size_t)t * a_stride) + b;
			__m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[0], _mm256_sign_epi8(bcast8(a->qs), w[0])),
						      ones);
			for (int c = 1; c < 4; c++)
				s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(
										   bcast8(a->qs + 8 * c), w[c])),
									  ones));
			acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, half_bcast(&a->d)), acc[t]);
		}
	}
	for (int t = 0; t < NT; t++)
		store_rows(y + (size_t)t * y_stride, acc[t]);
}

/* The tile: passes of TILE_NT tokens over the group; the first pass
 * prefetches the weight stream (later ones find it in cache). */
#define DEFINE_TILE(name, pass, QK)                                                                          \
	void name(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,          \
		  size_t y_stride)                                                                           \
	{                                                                                                    \
		int64_t nb = n / (QK);                                                                       \
		for (int t0 = 0; t0 < nt; t0 += TILE_NT) {                                                   \
			const char *a = (const char *)act + (size_t)t0 * a_stride;                           \
			float *yt = y + (size_t)t0 * y_stride;                                               \
			bool pf = t0 == 0;                                                                   \
			switch (nt - t0 < TILE_NT ? nt - t0 : TILE_NT) {                                     \
			case 1: pass(nb, group, a, a_stride, yt, y_stride, pf, 1); break;                    \
			case 2: pass(nb, group, a, a_stride, yt, y_stride, pf, 2); break;                    \
			case 3: pass(nb, group, a, a_stride, yt, y_stride, pf, 3); break;                    \
			default: pass(nb, group, a, a_stride, yt, y_stride, pf, 4); break;                   \
			}                                                                                    \
		}                                                                                            \
	}

static_assert(TILE_NT == 4, "DEFINE_TILE's cases");

DEFINE_TILE(repack_tile_q4_0_avx2, q4_0_pass, QK4_0)
DEFINE_TILE(repack_tile_q4_1_avx2, q4_1_pass, QK4_1)
DEFINE_TILE(repack_tile_q5_0_avx2, q5_0_pass, QK5_0)
DEFINE_TILE(repack_tile_q8_0_avx2, q8_0_pass, QK8_0)

RepackTileFn repack_tile_q32_avx2_get(uint32_t t)
{
	switch (t) {
	case WTYPE_Q4_0: return repack_tile_q4_0_avx2;
	case WTYPE_Q4_1: return repack_tile_q4_1_avx2;
	case WTYPE_Q5_0: return repack_tile_q5_0_avx2;
	case WTYPE_Q8_0: return repack_tile_q8_0_avx2;
	default: return NULL;
	}
}
