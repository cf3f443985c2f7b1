/*
 * vec_dot_avx2.c: AVX2/FMA/F16C dot products (compiled with -mavx2 -mfma
 * -mf16c; callers check cpu_features() first).
 *
 * Integer parts follow ggml's scheme: weight quants as unsigned bytes
 * (or sign-folded into them) times int8 activations with vpmaddubsw,
 * widened to int32 with vpmaddwd, scaled in float once per block. Every
 * integer block sum is exact and equal to vec_dot_ref.c's; only the
 * order of the float accumulation differs. Zero-offset quants (Q4_1,
 * Q5_1, Q4_K's minimums, Q6_K's -32, Q3_K's -4) are handled through the
 * activation block sums instead of per-value subtraction.
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/vec_dot.h"

/* ---- small vocabulary ---------------------------------------------- */

/*
 * Weights stream from memory once per token, but the hardware
 * prefetchers stop at 4 KiB page boundaries and the kernel's work per
 * cache line is too short for out-of-order execution to run far ahead:
 * prefetch this far ahead in the weight stream (next rows included;
 * prefetches past the end are harmless). 4 KiB measured best for Q4_1
 * and Q8_0 decode, against 1-8 KiB.
 */
#define PREFETCH_BYTES 4096

/* Prefetch the lines of [p, p + bytes) PREFETCH_BYTES ahead; bytes is a
 * compile-time constant (a block or two), so this unrolls. Must inline:
 * an out-of-line copy has no visible effect and GCC deletes the call. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *p, size_t bytes)
{
	for (size_t o = 0; o < bytes; o += 64)
		_mm_prefetch((const char *)p + PREFETCH_BYTES + o, _MM_HINT_T0);
}

static inline float hsum_ps(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm_cvtsi128_si32(s);
}

static inline float h2f(tkv_half h)
{
	return _cvtsh_ss(h);
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (values 0..15)
 * in the low lane, high nibbles (values 16..31) in the high lane. The
 * broadcast load and per-lane shift keep this off the shuffle port. */
static inline __m256i nibbles_32(const uint8_t *qs)
{
	__m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
	b = _mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
	return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* The two halves at p (a block's d and m, or d and s) as floats in
 * lanes 0 and 1, zeros in lanes 2 and 3: one load, one conversion. For
 * blocks without m, lane 1 is garbage (the first quants) and unused. */
static inline __m128 half2_at(const void *p)
{
	int32_t u;
	memcpy(&u, p, sizeof(u));
	return _mm_cvtph_ps(_mm_cvtsi32_si128(u));
}

/* 32 bits -> 32 bytes: byte j is 0xFF where bit j is set. */
static inline __m256i bits_to_bytes(const uint8_t *p)
{
	uint32_t x;
	memcpy(&x, p, sizeof(x));
	const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
						2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
	const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
	__m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
	return _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
}

/* u (unsigned bytes, < 128 where paired with large |s|) . s (int8)
 * -> 8 int32 partial sums. */
static inline __m256i dot_u8_i8(__m256i u, __m256i s)
{
	return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* x . y for two int8 vectors: fold x's sign into y. */
static inline __m256i dot_i8_i8(__m256i x, __m256i y)
{
	return dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline __m256i load256(const void *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

/* ---- float weights --------------------------------------------------- */

void vec_dot_f32_avx2(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_f32_avx2(int64_t n, float *s, const void *vw, const void *va)
{
	const float *w = vw, *a = va;
	__m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
	int64_t i = 0;
	for (; i + 32 <= n; i += 32) {
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);
		acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(a + i + 16), acc2);
		acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(a + i + 24), acc3);
	}
	for (; i + 8 <= n; i += 8)
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc0);
	float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
	for (; i < n; i++)
		sum += w[i] * a[i];
	*s = sum;
}

static inline __m256 load_f16x8(const tkv_half *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load_bf16x8(const tkv_bf16 *p)
{
	__m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

#define DEFINE_DOT_HALF(name, T, load, to_f32)                                                          \
	void name(int64_t n, float *s, const void *vw, const void *va);                                 \
	void name(int64_t n, float *s, const void *vw, const void *va)                                  \
	{                                                                                               \
		const T *w = vw;                                                                        \
		const float *a = va;                                                                    \
		__m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;               \
		int64_t i = 0;                                                                          \
		for (; i + 32 <= n; i += 32) {                                                          \
			acc0 = _mm256_fmadd_ps(load(w + i), _mm256_loadu_ps(a + i), acc0);              \
			acc1 = _mm256_fmadd_ps(load(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);      \
			acc2 = _mm256_fmadd_ps(load(w + i + 16), _mm256_loadu_ps(a + i + 16), acc2);    \
			acc3 = _mm256_fmadd_ps(load(w + i + 24), _mm256_loadu_ps(a + i + 24), acc3);    \
		}                                                                                       \
		for (; i + 8 <= n; i += 8)                                                              \
			acc0 = _mm256_fmadd_ps(load(w + i), _mm256_loadu_ps(a + i), acc0);              \
		float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))); \
		for (; i < n; i++)                                                                      \
			sum += to_f32(w[i]) * a[i];                                                     \
		*s = sum;                                                                               \
	}

DEFINE_DOT_HALF(vec_dot_f16_avx2, tkv_half, load_f16x8, half_to_f32)
DEFINE_DOT_HALF(vec_dot_bf16_avx2, tkv_bf16, load_bf16x8, bf16_to_f32)

/* ---- 32-value blocks ------------------------------------------------- */

/*
 * The per-block integer dot products, as 8 int32 lanes, and the block's
 * weight scale. Each kernel below is one loop over blocks around these.
 */
static inline __m256i q4_0_block(const BlockQ4_0 *w, __m256i a)
{
	__m256i q = _mm256_sub_epi8(nibbles_32(w->qs), _mm256_set1_epi8(8));
	return dot_i8_i8(q, a);
}

static inline __m256i q4_1_block(const BlockQ4_1 *w, __m256i a)
{
	return dot_u8_i8(nibbles_32(w->qs), a);
}

/* Q5_0: q - 16 as int8 is the nibble where the fifth bit is set, else
 * the nibble with 0xF0 or-ed in (nibble - 16 in two's complement). */
static inline __m256i q5_0_block(const BlockQ5_0 *w, __m256i a)
{
	__m256i hi = _mm256_andnot_si256(bits_to_bytes(w->qh), _mm256_set1_epi8((char)0xF0));
	return dot_i8_i8(_mm256_or_si256(nibbles_32(w->qs), hi), a);
}

static inline __m256i q5_1_block(const BlockQ5_1 *w, __m256i a)
{
	__m256i hi = _mm256_and_si256(bits_to_bytes(w->qh), _mm256_set1_epi8(0x10));
	return dot_u8_i8(_mm256_or_si256(nibbles_32(w->qs), hi), a);
}

static inline __m256i q8_0_block(const BlockQ8_0 *w, __m256i a)
{
	return dot_i8_i8(load256(w->qs), a);
}

/*
 * Symmetric formats (no min term): sum over blocks of d_w * d_a * isum,
 * two blocks per iteration into two accumulators. Scales are converted
 * two halves at a time (half2_at); only lane 0 of the product is used.
 */
#define DEFINE_DOT_SYM(name, WT, QK, block_fn)                                                          \
	void name(int64_t n, float *s, const void *vw, const void *va);                                 \
	void name(int64_t n, float *s, const void *vw, const void *va)                                  \
	{                                                                                               \
		const WT *w = vw;                                                                       \
		const BlockQ8_0 *a = va;                                                                \
		int64_t nb = n / QK, b = 0;                                                             \
		__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                          \
		for (; b + 2 <= nb; b += 2) {                                                           \
			prefetch_ahead(&w[b], 2 * sizeof(w[b]));                                        \
			__m128 d0 = _mm_mul_ps(half2_at(&w[b]), half2_at(&a[b]));                       \
			__m128 d1 = _mm_mul_ps(half2_at(&w[b + 1]), half2_at(&a[b + 1]));               \
			__m256i p0 = block_fn(&w[b], load256(a[b].qs));                                 \
			__m256i p1 = block_fn(&w[b + 1], load256(a[b + 1].qs));                         \
			acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(d0), _mm256_cvtepi32_ps(p0), acc0); \
			acc1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(d1), _mm256_cvtepi32_ps(p1), acc1); \
		}                                                                                       \
		for (; b < nb; b++) {                                                                   \
			__m128 d0 = _mm_mul_ps(half2_at(&w[b]), half2_at(&a[b]));                       \
			__m256i p0 = block_fn(&w[b], load256(a[b].qs));                                 \
			acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(d0), _mm256_cvtepi32_ps(p0), acc0); \
		}                                                                                       \
		*s = hsum_ps(_mm256_add_ps(acc0, acc1));                                                \
	}

/*
 * Formats with a min: plus m_w * s_a per block (s_a = d_a * sum(q_a)).
 * Weight (d, m) and activation (d, s) are adjacent halves, so one
 * product gives (d_w * d_a, m_w * s_a); lane 1 accumulates the min term.
 */
#define DEFINE_DOT_MIN(name, WT, QK, block_fn)                                                          \
	void name(int64_t n, float *s, const void *vw, const void *va);                                 \
	void name(int64_t n, float *s, const void *vw, const void *va)                                  \
	{                                                                                               \
		const WT *w = vw;                                                                       \
		const BlockQ8_1 *a = va;                                                                \
		int64_t nb = n / QK, b = 0;                                                             \
		__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                          \
		__m128 macc = _mm_setzero_ps();                                                         \
		for (; b + 2 <= nb; b += 2) {                                                           \
			prefetch_ahead(&w[b], 2 * sizeof(w[b]));                                        \
			__m128 d0 = _mm_mul_ps(half2_at(&w[b]), half2_at(&a[b]));                       \
			__m128 d1 = _mm_mul_ps(half2_at(&w[b + 1]), half2_at(&a[b + 1]));               \
			macc = _mm_add_ps(macc, _mm_add_ps(d0, d1));                                    \
			__m256i p0 = block_fn(&w[b], load256(a[b].qs));                                 \
			__m256i p1 = block_fn(&w[b + 1], load256(a[b + 1].qs));                         \
			acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(d0), _mm256_cvtepi32_ps(p0), acc0); \
			acc1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(d1), _mm256_cvtepi32_ps(p1), acc1); \
		}                                                                                       \
		for (; b < nb; b++) {                                                                   \
			__m128 d0 = _mm_mul_ps(half2_at(&w[b]), half2_at(&a[b]));                       \
			macc = _mm_add_ps(macc, d0);                                                    \
			__m256i p0 = block_fn(&w[b], load256(a[b].qs));                                 \
			acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(d0), _mm256_cvtepi32_ps(p0), acc0); \
		}                                                                                       \
		*s = hsum_ps(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_movehdup_ps(macc));         \
	}

DEFINE_DOT_SYM(vec_dot_q4_0_avx2, BlockQ4_0, QK4_0, q4_0_block)
DEFINE_DOT_SYM(vec_dot_q5_0_avx2, BlockQ5_0, QK5_0, q5_0_block)
DEFINE_DOT_SYM(vec_dot_q8_0_avx2, BlockQ8_0, QK8_0, q8_0_block)
DEFINE_DOT_MIN(vec_dot_q4_1_avx2, BlockQ4_1, QK4_1, q4_1_block)
DEFINE_DOT_MIN(vec_dot_q5_1_avx2, BlockQ5_1, QK5_1, q5_1_block)

/*
 * Multi-row versions: one weight block decoded once, multiplied with the
 * same block of NY activation rows, with the activation scales already
 * floats (af: (d, s) per block, s = d * sum(q)). Two blocks per step:
 * the weights' (d, m) halves of both convert in one vcvtph2ps to (dw0,
 * mw0, dw1, mw1), one multiply by (da0, sa0, da1, sa1) gives both
 * blocks' scale products and min terms. Zero-point types (Q4_0: q - 8,
 * Q5_0: q - 16) multiply unsigned quants and take zp * dw * s off, like
 * a min of -zp * dw, which saves the sign folding of signed bytes. NY is
 * a compile-time constant in each instantiation so the accumulators live
 * in registers.
 */
static inline __m128 half4_pair(const void *p0, const void *p1)
{
	int32_t u0, u1;
	memcpy(&u0, p0, sizeof(u0));
	memcpy(&u1, p1, sizeof(u1));
	return _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(u0), u1, 1));
}

#define DEFINE_DOT_MULTI(name, WT, QK, block_fn, has_min, zp)                                           \
	static inline __attribute__((always_inline)) void name##_ny(                                    \
		int64_t n, float *s, size_t s_stride, const void *vw, const void *va,                   \
		size_t a_stride, const float *af, size_t af_stride, const int NY)                       \
	{                                                                                               \
		const WT *w = vw;                                                                       \
		const BlockQ8_0 *a[VEC_DOT_MAX_NY]; /* only qs is read: same offset in Q8_1 */          \
		const float *f[VEC_DOT_MAX_NY];                                                         \
		__m256 acc0[VEC_DOT_MAX_NY], acc1[VEC_DOT_MAX_NY];                                      \
		__m128 macc[VEC_DOT_MAX_NY];                                                            \
		const size_t qs_off = has_min ? offsetof(BlockQ8_1, qs) : offsetof(BlockQ8_0, qs);      \
		const size_t a_bytes = has_min ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);                 \
		const __m256i lane2 = _mm256_set1_epi32(2);                                             \
		int64_t nb = n / QK, b = 0;                                                             \
		for (int j = 0; j < NY; j++) {                                                          \
			a[j] = (const void *)((const char *)va + (size_t)j * a_stride + qs_off);        \
			f[j] = af + (size_t)j * af_stride;                                              \
			acc0[j] = acc1[j] = _mm256_setzero_ps();                                        \
			macc[j] = _mm_setzero_ps();                                                     \
		}                                                                                       \
		for (; b + 2 <= nb; b += 2) {                                                           \
			prefetch_ahead(&w[b], 2 * sizeof(w[b]));                                        \
			__m128 wdm = half4_pair(&w[b], &w[b + 1]);                                      \
			if (zp)                                                                         \
				wdm = _mm_moveldup_ps(wdm); /* (dw0, dw0, dw1, dw1) */                  \
			for (int j = 0; j < NY; j++) {                                                  \
				const int8_t *q = (const int8_t *)a[j] + (size_t)b * a_bytes;           \
				__m128 sc = _mm_mul_ps(wdm, _mm_loadu_ps(f[j] + 2 * b));                \
				__m256 d0 = _mm256_broadcastss_ps(sc);                                  \
				__m256 d1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(sc), lane2); \
				if (has_min || zp)                                                      \
					macc[j] = _mm_add_ps(macc[j], sc);                              \
				__m256i p0 = block_fn(&w[b], load256(q));                               \
				__m256i p1 = block_fn(&w[b + 1], load256(q + a_bytes));                 \
				acc0[j] = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0[j]);         \
				acc1[j] = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(p1), acc1[j]);         \
			}                                                                               \
		}                                                                                       \
		if (b < nb) {                                                                           \
			__m128 wdm = half2_at(&w[b]);                                                   \
			if (zp)                                                                         \
				wdm = _mm_moveldup_ps(wdm);                                             \
			for (int j = 0; j < NY; j++) {                                                  \
				const int8_t *q = (const int8_t *)a[j] + (size_t)b * a_bytes;           \
				__m128 sc = _mm_mul_ps(wdm, _mm_castsi128_ps(_mm_loadl_epi64(           \
					(const __m128i *)(f[j] + 2 * b))));                             \
				if (has_min || zp)                                                      \
					macc[j] = _mm_add_ps(macc[j], sc);                              \
				__m256i p0 = block_fn(&w[b], load256(q));                               \
				acc0[j] = _mm256_fmadd_ps(_mm256_broadcastss_ps(sc), _mm256_cvtepi32_ps(p0), acc0[j]); \
			}                                                                               \
		}                                                                                       \
		for (int j = 0; j < NY; j++) {                                                          \
			float m = 0.0f;                                                                 \
			if (has_min || zp) {                                                            \
				__m128 t = _mm_add_ps(macc[j], _mm_movehl_ps(macc[j], macc[j]));        \
				m = _mm_cvtss_f32(_mm_movehdup_ps(t));                                  \
				if (zp)                                                                 \
					m *= -(float)(zp);                                              \
			}                                                                               \
			s[(size_t)j * s_stride] = hsum_ps(_mm256_add_ps(acc0[j], acc1[j])) + m;         \
		}                                                                                       \
	}                                                                                               \
	static void name(int64_t n, float *s, size_t s_stride, const void *vw, const void *va,          \
			 size_t a_stride, const float *af, size_t af_stride, int ny)                    \
	{                                                                                               \
		switch (ny) {                                                                           \
		case 1: name##_ny(n, s, s_stride, vw, va, a_stride, af, af_stride, 1); break;           \
		case 2: name##_ny(n, s, s_stride, vw, va, a_stride, af, af_stride, 2); break;           \
		case 3: name##_ny(n, s, s_stride, vw, va, a_stride, af, af_stride, 3); break;           \
		default: name##_ny(n, s, s_stride, vw, va, a_stride, af, af_stride, 4); break;          \
		}                                                                                       \
	}

/* Unsigned quants of the zero-point formats: the nibble, or nibble |
 * fifth bit << 4 (0..31). */
static inline __m256i q4_0u_block(const BlockQ4_0 *w, __m256i a)
{
	return dot_u8_i8(nibbles_32(w->qs), a);
}

static inline __m256i q5_0u_block(const BlockQ5_0 *w, __m256i a)
{
	__m256i hi = _mm256_and_si256(bits_to_bytes(w->qh), _mm256_set1_epi8(0x10));
	return dot_u8_i8(_mm256_or_si256(nibbles_32(w->qs), hi), a);
}

DEFINE_DOT_MULTI(vec_dot_q4_0_multi_avx2, BlockQ4_0, QK4_0, q4_0u_block, 0, 8)
DEFINE_DOT_MULTI(vec_dot_q4_1_multi_avx2, BlockQ4_1, QK4_1, q4_1_block, 1, 0)
DEFINE_DOT_MULTI(vec_dot_q5_0_multi_avx2, BlockQ5_0, QK5_0, q5_0u_block, 0, 16)
DEFINE_DOT_MULTI(vec_dot_q5_1_multi_avx2, BlockQ5_1, QK5_1, q5_1_block, 1, 0)
DEFINE_DOT_MULTI(vec_dot_q8_0_multi_avx2, BlockQ8_0, QK8_0, q8_0_block, 0, 0)

/* ---- K-quants (256-value super-blocks, Q8_K activations) -------------- */

/*
 * Scale vectors for 16-value sub-blocks: sc16 holds 16 int16 scales; the
 * result has scale 2i in the low lane and 2i + 1 in the high lane, the
 * shape of vpmaddubsw's output over 32 values starting at 32i.
 */
static inline __m256i scale_pair(__m256i sc16, int i)
{
	const __m256i lo_hi = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
					       2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
	__m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(i));
	return _mm256_shuffle_epi8(pair, lo_hi);
}

/* sum_j sc16[j] * bsums[j] over the 16 groups of a Q8_K block. */
static inline int scaled_bsums(__m256i sc16, const BlockQ8_K *a)
{
	return hsum_epi32(_mm256_madd_epi16(sc16, load256(a->bsums)));
}

void vec_dot_q2_K_avx2(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q2_K_avx2(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ2_K *w = vw;
	const BlockQ8_K *a = va;
	const __m256i m3 = _mm256_set1_epi8(3);
	__m256 acc = _mm256_setzero_ps();
	float summ = 0.0f;

	for (int64_t b = 0; b < n / QK_K; b++) {
		prefetch_ahead(&w[b], sizeof(w[b]));
		__m128i raw = _mm_loadu_si128((const __m128i *)w[b].scales);
		__m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0xF)));
		__m256i mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xF)));
		summ += a[b].d * h2f(w[b].dmin) * (float)scaled_bsums(mn, &a[b]);

		__m256i sumi = _mm256_setzero_si256();
		for (int nn = 0; nn < 2; nn++) {
			__m256i q = load256(w[b].qs + 32 * nn);
			const int8_t *y = a[b].qs + 128 * nn;
			for (int k = 0; k < 4; k++) {
				__m256i qk = _mm256_and_si256(q, m3);
				__m256i p = _mm256_maddubs_epi16(qk, load256(y + 32 * k));
				sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc, 4 * nn + k)));
				q = _mm256_srli_epi16(q, 2);
			}
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(a[b].d * h2f(w[b].d)), _mm256_cvtepi32_ps(sumi), acc);
	}
	*s = hsum_ps(acc) - summ;
}

/* Q3_K as q' = q + 4 in 0..7 (low two bits | high bit << 2), then
 * subtract 4 * sum(scale * bsum). */
void vec_dot_q3_K_avx2(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q3_K_avx2(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ3_K *w = vw;
	const BlockQ8_K *a = va;
	const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
	__m256 acc = _mm256_setzero_ps();
	float summ = 0.0f;

	for (int64_t b = 0; b < n / QK_K; b++) {
		prefetch_ahead(&w[b], sizeof(w[b]));
		int8_t sc8[16];
		vec_dot_k3_scales(w[b].scales, sc8);
		__m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc8));
		int offset = 4 * scaled_bsums(sc, &a[b]);

		__m256i hm = load256(w[b].hmask);
		__m256i sumi = _mm256_setzero_si256();
		for (int nn = 0; nn < 2; nn++) {
			__m256i q = load256(w[b].qs + 32 * nn);
			const int8_t *y = a[b].qs + 128 * nn;
			for (int k = 0; k < 4; k++) {
				__m256i hb = _mm256_slli_epi16(_mm256_and_si256(hm, m1), 2);
				__m256i qk = _mm256_or_si256(_mm256_and_si256(q, m3), hb);
				__m256i p = _mm256_maddubs_epi16(qk, load256(y + 32 * k));
				sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc, 4 * nn + k)));
				q = _mm256_srli_epi16(q, 2);
				hm = _mm256_srli_epi16(hm, 1);
			}
		}
		float d = a[b].d * h2f(w[b].d);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
		summ += d * (float)offset;
	}
	*s = hsum_ps(acc) - summ;
}

/* Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins. qh may be
 * NULL (Q4_K). Returns the scaled sum of one super-block; *ret_msum gets
 * sum(min * bsums) for the dmin term. */
static inline __m256i k45_block_isum(const uint8_t *qs, const uint8_t *qh, const uint8_t *scales,
				     const BlockQ8_K *a, int *ret_msum)
{
	const __m256i m4 = _mm256_set1_epi8(0xF), m1 = _mm256_set1_epi8(1);
	uint8_t sc[8], mn[8];
	int msum = 0;
	for (int j = 0; j < 8; j++) {
		wtype_q4k_scale_min(scales, j, &sc[j], &mn[j]);
		msum += mn[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
	}
	*ret_msum = msum;

	__m256i hb = qh ? load256(qh) : _mm256_setzero_si256();
	__m256i sumi = _mm256_setzero_si256();
	for (int nn = 0; nn < 4; nn++) {
		__m256i q = load256(qs + 32 * nn);
		__m256i lo = _mm256_and_si256(q, m4);
		__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
		if (qh) {
			lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hb, m1), 4));
			hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), m1), 4));
			hb = _mm256_srli_epi16(hb, 2);
		}
		__m256i plo = _mm256_maddubs_epi16(lo, load256(a->qs + 64 * nn));
		__m256i phi = _mm256_maddubs_epi16(hi, load256(a->qs + 64 * nn + 32));
		plo = _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * nn]));
		phi = _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * nn + 1]));
		sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
	}
	return sumi;
}

void vec_dot_q4_K_avx2(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q4_K_avx2(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ4_K *w = vw;
	const BlockQ8_K *a = va;
	__m256 acc = _mm256_setzero_ps();
	float summ = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		prefetch_ahead(&w[b], sizeof(w[b]));
		int msum;
		__m256i sumi = k45_block_isum(w[b].qs, NULL, w[b].scales, &a[b], &msum);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(a[b].d * h2f(w[b].d)), _mm256_cvtepi32_ps(sumi), acc);
		summ += a[b].d * h2f(w[b].dmin) * (float)msum;
	}
	*s = hsum_ps(acc) - summ;
}

void vec_dot_q5_K_avx2(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q5_K_avx2(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ5_K *w = vw;
	const BlockQ8_K *a = va;
	__m256 acc = _mm256_setzero_ps();
	float summ = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		prefetch_ahead(&w[b], sizeof(w[b]));
		int msum;
		__m256i sumi = k45_block_isum(w[b].qs, w[b].qh, w[b].scales, &a[b], &msum);
		acc = _mm256_fmadd_ps(_mm256_set1_ps(a[b].d * h2f(w[b].d)), _mm256_cvtepi32_ps(sumi), acc);
		summ += a[b].d * h2f(w[b].dmin) * (float)msum;
	}
	*s = hsum_ps(acc) - summ;
}

/*
 * Q6_K against up to VEC_DOT_MAX_NY Q8_K rows (prefill of the Q4_K_M
 * mix's output head, attn_v and ffn_down), as q' = q + 32 in 0..63, then
 * 32 * sum(scale * bsum) subtracted: each 32-value chunk of a super-block
 * is unpacked, and its scale pair built, once for all the tokens; each
 * token's operations and their order do not depend on NY, so the one-token
 * dot below (NY = 1) and every multi call agree bit for bit (test-matmul).
 */
static inline __attribute__((always_inline)) void q6k_multi_avx2(int64_t n, float *s, size_t s_stride,
								  const void *vw, const void *va, size_t a_stride,
								  const int NY)
{
	const BlockQ6_K *w = vw;
	const BlockQ8_K *a[VEC_DOT_MAX_NY];
	const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
	__m256 acc[VEC_DOT_MAX_NY];
	float summ[VEC_DOT_MAX_NY];

	for (int t = 0; t < NY; t++) {
		a[t] = (const BlockQ8_K *)((const char *)va + (size_t)t * a_stride);
		acc[t] = _mm256_setzero_ps();
		summ[t] = 0.0f;
	}
	for (int64_t b = 0; b < n / QK_K; b++) {
		prefetch_ahead(&w[b], sizeof(w[b]));
		__m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
		float wd = h2f(w[b].d);
		__m256i sumi[VEC_DOT_MAX_NY];
		for (int t = 0; t < NY; t++)
			sumi[t] = _mm256_setzero_si256();
		for (int nn = 0; nn < 2; nn++) {
			__m256i qh = load256(w[b].qh + 32 * nn);
			__m256i ql0 = load256(w[b].ql + 64 * nn);
			__m256i ql1 = load256(w[b].ql + 64 * nn + 32);
			__m256i q[4];
			q[0] = _mm256_and_si256(ql0, m4);
			q[1] = _mm256_and_si256(ql1, m4);
			q[2] = _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4);
			q[3] = _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4);
			for (int k = 0; k < 4; k++) {
				__m256i qk = _mm256_or_si256(q[k], _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
				__m256i pair = scale_pair(sc, 4 * nn + k);
				for (int t = 0; t < NY; t++) {
					__m256i p = _mm256_maddubs_epi16(qk, load256(a[t][b].qs + 128 * nn + 32 * k));
					sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, pair));
				}
				qh = _mm256_srli_epi16(qh, 2);
			}
		}
		for (int t = 0; t < NY; t++) {
			float d = a[t][b].d * wd;
			summ[t] += d * (float)(32 * scaled_bsums(sc, &a[t][b]));
			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
		}
	}
	for (int t = 0; t < NY; t++)
		s[(size_t)t * s_stride] = hsum_ps(acc[t]) - summ[t];
}

void vec_dot_q6_K_avx2(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q6_K_avx2(int64_t n, float *s, const void *vw, const void *va)
{
	q6k_multi_avx2(n, s, 1, vw, va, 0, 1);
}

/* af is not used: Q8_K rows carry float scales already. */
static void vec_dot_q6_K_multi_avx2(int64_t n, float *s, size_t s_stride, const void *vw, const void *va,
				    size_t a_stride, const float *af, size_t af_stride, int ny)
{
	(void)af;
	(void)af_stride;
	switch (ny) {
	case 1: q6k_multi_avx2(n, s, s_stride, vw, va, a_stride, 1); break;
	case 2: q6k_multi_avx2(n, s, s_stride, vw, va, a_stride, 2); break;
	case 3: q6k_multi_avx2(n, s, s_stride, vw, va, a_stride, 3); break;
	default: q6k_multi_avx2(n, s, s_stride, vw, va, a_stride, 4); break;
	}
}

VecDotFn vec_dot_avx2_get(uint32_t t)
{
	switch (t) {
	case WTYPE_F32: return vec_dot_f32_avx2;
	case WTYPE_F16: return vec_dot_f16_avx2;
	case WTYPE_BF16: return vec_dot_bf16_avx2;
	case WTYPE_Q4_0: return vec_dot_q4_0_avx2;
	case WTYPE_Q4_1: return vec_dot_q4_1_avx2;
	case WTYPE_Q5_0: return vec_dot_q5_0_avx2;
	case WTYPE_Q5_1: return vec_dot_q5_1_avx2;
	case WTYPE_Q8_0: return vec_dot_q8_0_avx2;
	case WTYPE_Q2_K: return vec_dot_q2_K_avx2;
	case WTYPE_Q3_K: return vec_dot_q3_K_avx2;
	case WTYPE_Q4_K: return vec_dot_q4_K_avx2;
	case WTYPE_Q5_K: return vec_dot_q5_K_avx2;
	case WTYPE_Q6_K: return vec_dot_q6_K_avx2;
	default: return NULL;
	}
}

VecDotMultiFn vec_dot_avx2_multi_get(uint32_t t)
{
	switch (t) {
	case WTYPE_Q4_0: return vec_dot_q4_0_multi_avx2;
	case WTYPE_Q4_1: return vec_dot_q4_1_multi_avx2;
	case WTYPE_Q5_0: return vec_dot_q5_0_multi_avx2;
	case WTYPE_Q5_1: return vec_dot_q5_1_multi_avx2;
	case WTYPE_Q8_0: return vec_dot_q8_0_multi_avx2;
	case WTYPE_Q6_K: return vec_dot_q6_K_multi_avx2;
	default: return NULL;
	}
}
