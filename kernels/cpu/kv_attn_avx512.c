/*
 * kv_attn_avx512.c: AVX-512 (F, DQ, BW, VL) versions of the score, value
 * and softmax kernels of kv_attn.h. Called only when kv_attn_have_avx512();
 * keys with a QJL residual go to the AVX2 kernel (QJL is not a default
 * and lost on fidelity, docs/benchmarks.md issue 5).
 *
 * Why a second x86 path: a TQ codebook of up to 16 floats fits one zmm
 * register, so a centroid lookup of 16 codes is one vpermps
 * (_mm512_permutexvar_ps), and 32 centroids (5-bit codes) one vpermi2ps;
 * AVX2 needs byte-plane shuffles and unpacks (12 instructions per 32
 * floats) for the same. f16 rows widen 16 at a time (vcvtph2ps zmm), so
 * the f16 cache the TQ types are compared with gets the same width.
 *
 * Shapes are those of the AVX2 kernels: codes are unpacked 32 at a time
 * (full 4-bit chunks straight from their 16 bytes, book_get32_deint;
 * other widths to bytes first, kv_attn_x86.h), widened to 16 dword
 * indices and looked up; scores keep one 16-lane partial per (head, key),
 * reduced 16 keys at once (hsum16); values keep the G x 32 accumulators
 * of one coordinate chunk in registers while the block's keys stream past.
 * Tails (dims or streams that are not multiples of 32) use masked loads
 * and stores, so nothing outside a row, a query or an accumulator row is
 * read or written.
 *
 * Last, the int16 TQ value kernel of kv_attn.h (VBMI and VNNI on top):
 * a row's codes unpacked to bytes by one vpermb and one vpmultishiftqb,
 * two rows' codes interleaved, their int16 centroids looked up by byte
 * plane (vpermb), and per head one vpdpwssd per 16 coordinates of two rows.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/kv_attn_x86.h"
#include "kernels/wtype.h"

#define K5_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c,bmi2")))
#define K5_INLINE static inline __attribute__((always_inline)) K5_TARGET
#define KV_HEADS 4 /* query heads per pass */

/* The first n lanes (n clamped to 0..16). */
K5_INLINE __mmask16 lanes(int n)
{
	return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* ---- decoding 32 values ---- */

/* A TQ codebook for 16-lane lookups: <= 32 centroids in registers, else a gather base. */
typedef struct Book {
	__m512 t0, t1; /* centroids 0..15 and 16..31 */
	const float *c;
	int bits;
} Book;

K5_INLINE void book_init(Book *b, const KvAttnRows *r, int s)
{
	b->c = r->cb[s];
	b->bits = s ? r->tq.bits_lo : r->tq.bits_hi;
	b->t0 = _mm512_loadu_ps(r->cb32[s]);
	b->t1 = _mm512_loadu_ps(r->cb32[s] + 16);
}

/* Centroids of 16 codes, one per dword of idx. */
K5_INLINE __m512 book_get16(const Book *b, __m512i idx)
{
	if (b->bits <= 4)
		return _mm512_permutexvar_ps(idx, b->t0);
	if (b->bits == 5)
		return _mm512_permutex2var_ps(b->t0, idx, b->t1);
	return _mm512_i32gather_ps(idx, b->c, 4);
}

/*
 * Centroids of codes i .. i+31 of a full chunk of a 4-bit stream, as
 * [codes i, i+2, .., i+30 | codes i+1, i+3, .., i+31]: each byte widened
 * to a dword holds two codes, and vpermps reads only the low 4 bits of
 * an index, so the even codes need no mask and the odd ones one shift.
 * Four instructions instead of the twelve of the natural order below;
 * the query comes in this order (KvAttnQuery.qd), the value accumulators
 * are put in it and back once per chunk and call.
 */
K5_INLINE void book_get32_deint(const Book *b, const uint8_t *codes, int i, __m512 x[2])
{
	__m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i / 2)));
	x[0] = _mm512_permutexvar_ps(w, b->t0);
	x[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), b->t0);
}

/* The de-interleaving of 32 floats lo | hi into evens | odds, and back. */
K5_INLINE void deint32(__m512 lo, __m512 hi, __m512 *even, __m512 *odd)
{
	const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
	*even = _mm512_permutex2var_ps(lo, ie, hi);
	*odd = _mm512_permutex2var_ps(lo, _mm512_add_epi32(ie, _mm512_set1_epi32(1)), hi);
}

K5_INLINE void interleave32(__m512 even, __m512 odd, __m512 *lo, __m512 *hi)
{
	const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
	*lo = _mm512_permutex2var_ps(even, il, odd);
	*hi = _mm512_permutex2var_ps(even, _mm512_add_epi32(il, _mm512_set1_epi32(8)), odd);
}

/* Centroids of codes i .. i+31 of a stream of n codes (codes past n read as code 0). */
K5_INLINE void book_get32(const Book *b, const uint8_t *codes, int n, int i, __m512 x[2])
{
	__m256i c = codes32_nat(codes, b->bits, n, i);
	x[0] = book_get16(b, _mm512_cvtepu8_epi32(_mm256_castsi256_si128(c)));
	x[1] = book_get16(b, _mm512_cvtepu8_epi32(_mm256_extracti128_si256(c, 1)));
}

/* 16 signed bytes times a block scale. */
K5_INLINE __m512 i8x16_scaled(__m128i q, __m512 d)
{
	return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
}

/*
 * Values i .. i+31 (i a multiple of 32) of a non-TQ row of dim d; lanes
 * at d and beyond are 0 (F32 / F16 tails; Q8_0 / Q4_0 dims are
 * multiples of 32, one ggml block per 32 values).
 */
K5_INLINE void plain_get32(KvFormat f, const uint8_t *row, int d, int i, __m512 x[2])
{
	switch (f) {
	case KV_FORMAT_F32: {
		const float *r = (const float *)row + i;
		x[0] = _mm512_maskz_loadu_ps(lanes(d - i), r);
		x[1] = _mm512_maskz_loadu_ps(lanes(d - i - 16), r + 16);
		return;
	}
	case KV_FORMAT_F16: {
		const uint8_t *r = row + 2 * (size_t)i;
		x[0] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes(d - i), r));
		x[1] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes(d - i - 16), r + 32));
		return;
	}
	case KV_FORMAT_Q8_0: {
		const uint8_t *b = row + (size_t)(i / QK8_0) * sizeof(BlockQ8_0);
		__m512 s = _mm512_set1_ps(load_f16(b));
		x[0] = i8x16_scaled(_mm_loadu_si128((const __m128i *)(b + 2)), s);
		x[1] = i8x16_scaled(_mm_loadu_si128((const __m128i *)(b + 18)), s);
		return;
	}
	case KV_FORMAT_Q4_0: {
		/* ggml: value j is the low nibble of qs[j], value j + 16 the high one, minus 8 */
		const uint8_t *b = row + (size_t)(i / QK4_0) * sizeof(BlockQ4_0);
		__m512 s = _mm512_set1_ps(load_f16(b));
		__m128i qs = _mm_loadu_si128((const __m128i *)(b + 2)), m = _mm_set1_epi8(0x0f);
		__m128i eight = _mm_set1_epi8(8);
		x[0] = i8x16_scaled(_mm_sub_epi8(_mm_and_si128(qs, m), eight), s);
		x[1] = i8x16_scaled(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), m), eight), s);
		return;
	}
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK: /* read by kv_attn_pk_scores_*() only */
	case KV_FORMAT_PQ: /* read by kv_attn_pq_*() only */
		break;
	}
	x[0] = x[1] = _mm512_setzero_ps();
}

/* One side of a row as the loops below walk it: the plain row, or one TQ code stream. */
typedef struct Stream {
	int n, off;       /* coordinates [off, off + n) */
	uint32_t codes;   /* TQ: offset of the codes in the row */
	uint32_t scale;   /* TQ: offset of the f16 stream scale */
	const Book *book; /* NULL: plain row */
	int n_deint;      /* coordinates [off, off + n_deint) decode de-interleaved (4-bit full chunks) */
} Stream;

/* The streams of rows r (1 for plain rows, 1..2 for TQ). */
K5_INLINE int streams_of(const KvAttnRows *r, const Book *bk, Stream st[2])
{
	if (r->format != KV_FORMAT_TQ) {
		st[0] = (Stream){ .n = r->dim };
		return 1;
	}
	const TqLayout *L = &r->tq;
	int k = 0;
	for (int s = 0; s < 2; s++) {
		int n = s ? L->dim - L->n_hi : L->n_hi;
		if (n > 0)
			st[k++] = (Stream){ .n = n,
					    .off = s ? L->n_hi : 0,
					    .codes = s ? L->off_lo : L->off_hi,
					    .scale = L->off_scale[s ? L->n_scales - 1 : 0],
					    .book = &bk[s],
					    .n_deint = bk[s].bits == 4 ? n / 32 * 32 : 0 };
	}
	return k;
}

/* Values i .. i+31 of stream st of row (TQ: unscaled centroids; de-interleaved below n_deint). */
K5_INLINE void stream_get32(const KvAttnRows *r, const Stream *st, const uint8_t *row, int i, __m512 x[2])
{
	if (i < st->n_deint)
		book_get32_deint(st->book, row + st->codes, i, x);
	else if (st->book)
		book_get32(st->book, row + st->codes, st->n, i, x);
	else
		plain_get32(r->format, row, r->dim, i, x);
}

/* ---- scores ---- */

/*
 * a[g] += <q~_g, stream of row> (TQ: times the stream scale), as 16
 * lanes.
 */
K5_INLINE void key_stream(const KvAttnRows *r, const Stream *st, const KvAttnQuery *q, const int G,
			  const uint8_t *row, __m512 *a)
{
	__m512 as[KV_HEADS];
#pragma GCC unroll 4
	for (int g = 0; g < G; g++)
		as[g] = _mm512_setzero_ps();
	int i = 0;
	for (; i + 32 <= st->n; i += 32) {
		__m512 x[2];
		stream_get32(r, st, row, i, x);
#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			const float *qg = q[g].qd + st->off + i;
			as[g] = _mm512_fmadd_ps(_mm512_loadu_ps(qg), x[0], as[g]);
			as[g] = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16), x[1], as[g]);
		}
	}
	if (i < st->n) {
		__m512 x[2];
		__mmask16 m0 = lanes(st->n - i), m1 = lanes(st->n - i - 16);
		stream_get32(r, st, row, i, x);
#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			const float *qg = q[g].qd + st->off + i;
			as[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, qg), x[0], as[g]);
			as[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, qg + 16), x[1], as[g]);
		}
	}
	if (!st->book) {
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
			a[g] = _mm512_add_ps(a[g], as[g]);
		return;
	}
	__m512 vs = _mm512_set1_ps(load_f16(row + st->scale));
#pragma GCC unroll 4
	for (int g = 0; g < G; g++)
		a[g] = _mm512_fmadd_ps(as[g], vs, a[g]);
}

/*
 * The 16 horizontal sums of v[0..15], in order: a tree that halves the
 * lanes per key and doubles the keys per register at each level (128-bit
 * quarters, then 4-lane halves, then pairs), 3 instructions per merge.
 */
K5_INLINE __m512 hsum16(__m512 *v)
{
	for (int k = 0; k < 8; k++) /* per key 8 lanes: [v2k | v2k+1] */
		v[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
				     _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xee));
	for (int k = 0; k < 4; k++) /* 4 lanes: quarters are keys 4k .. 4k+3 */
		v[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x88),
				     _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xdd));
	for (int k = 0; k < 2; k++) /* 2 lanes: quarter q holds keys 8k + q, 8k + q + 4 */
		v[k] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * k], v[2 * k + 1], 0x44),
				     _mm512_shuffle_ps(v[2 * k], v[2 * k + 1], 0xee));
	/* 1 lane: lane 4q + r holds key q + 4r */
	__m512 z = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xdd));
	return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

K5_INLINE void scores_heads(const KvAttnRows *r, const Stream *st, int ns, const KvAttnQuery *q, const int G,
			    const uint8_t *k, int n, float scale, float *scores, int ld)
{
	__m512 part[KV_HEADS][16];
	__m512 vscale = _mm512_set1_ps(scale);
	for (int j0 = 0; j0 < n; j0 += 16) {
		int nj = n - j0 < 16 ? n - j0 : 16;
		for (int jj = 0; jj < 16; jj++) {
			__m512 a[KV_HEADS];
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				a[g] = _mm512_setzero_ps();
			if (jj < nj) {
				const uint8_t *row = k + (size_t)(j0 + jj) * r->row_bytes;
				for (int s = 0; s < ns; s++)
					key_stream(r, &st[s], q, G, row, a);
			}
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				part[g][jj] = a[g];
		}
		for (int g = 0; g < G; g++)
			_mm512_mask_storeu_ps(scores + (size_t)g * ld + j0, lanes(nj),
					      _mm512_mul_ps(hsum16(part[g]), vscale));
	}
}

K5_TARGET void kv_attn_scores_avx512(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
				     int n, float scale, float *scores, int ld)
{
	if (keys->format == KV_FORMAT_TQ && keys->tq.qjl_m > 0) {
		kv_attn_scores_avx2(keys, q, G, k, n, scale, scores, ld);
		return;
	}
	Book bk[2];
	if (keys->format == KV_FORMAT_TQ) {
		book_init(&bk[0], keys, 0);
		book_init(&bk[1], keys, 1);
	}
	Stream st[2];
	int ns = streams_of(keys, bk, st);
	for (int g0 = 0; g0 < G; g0 += KV_HEADS) {
		const KvAttnQuery *qg = q + g0;
		float *sg = scores + (size_t)g0 * ld;
		switch (G - g0 < KV_HEADS ? G - g0 : KV_HEADS) {
		case 1: scores_heads(keys, st, ns, qg, 1, k, n, scale, sg, ld); break;
		case 2: scores_heads(keys, st, ns, qg, 2, k, n, scale, sg, ld); break;
		case 3: scores_heads(keys, st, ns, qg, 3, k, n, scale, sg, ld); break;
		default: scores_heads(keys, st, ns, qg, 4, k, n, scale, sg, ld); break;
		}
	}
}

/* ---- values ---- */

/*
 * acc (G, acc_ld) += sum_j w[g][j] * (stream st of value j), 32
 * coordinates at a time with the keys inside, so the G x 2 accumulator
 * registers are loaded and stored once per chunk and block.
 */
K5_INLINE void values_stream(const KvAttnRows *r, const Stream *st, float w[][KV_BLOCK_TOKENS], const int G,
			     const uint8_t *v, int n, float *acc, int acc_ld)
{
	for (int i = 0; i < st->n; i += 32) {
		__mmask16 m0 = lanes(st->n - i), m1 = lanes(st->n - i - 16);
		__m512 a[KV_HEADS][2];
#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			float *ag = acc + (size_t)g * acc_ld + st->off + i;
			a[g][0] = _mm512_maskz_loadu_ps(m0, ag);
			a[g][1] = _mm512_maskz_loadu_ps(m1, ag + 16);
			if (i < st->n_deint)
				deint32(a[g][0], a[g][1], &a[g][0], &a[g][1]);
		}
		for (int j = 0; j < n; j++) {
			__m512 x[2];
			stream_get32(r, st, v + (size_t)j * r->row_bytes, i, x);
#pragma GCC unroll 4
			for (int g = 0; g < G; g++) {
				__m512 wv = _mm512_set1_ps(w[g][j]);
				a[g][0] = _mm512_fmadd_ps(wv, x[0], a[g][0]);
				a[g][1] = _mm512_fmadd_ps(wv, x[1], a[g][1]);
			}
		}
#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			float *ag = acc + (size_t)g * acc_ld + st->off + i;
			if (i < st->n_deint)
				interleave32(a[g][0], a[g][1], &a[g][0], &a[g][1]);
			_mm512_mask_storeu_ps(ag, m0, a[g][0]);
			_mm512_mask_storeu_ps(ag + 16, m1, a[g][1]);
		}
	}
}

K5_INLINE void values_heads(const KvAttnRows *r, const Stream *st, int ns, const float *p, int ld, const int G,
			    const uint8_t *v, int n, float *acc, int acc_ld)
{
	float w[KV_HEADS][KV_BLOCK_TOKENS]; /* p_gj, times the stream scale s_j for TQ */
	for (int s = 0; s < ns; s++) {
		for (int j = 0; j < n; j++) {
			float sc = st[s].book ? load_f16(v + (size_t)j * r->row_bytes + st[s].scale) : 1.0f;
			for (int g = 0; g < G; g++)
				w[g][j] = st[s].book ? p[g * ld + j] * sc : p[g * ld + j];
		}
		values_stream(r, &st[s], w, G, v, n, acc, acc_ld);
	}
}

K5_TARGET void kv_attn_values_avx512(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
				     int n, float *acc, int acc_ld)
{
	Book bk[2];
	if (vals->format == KV_FORMAT_TQ) {
		book_init(&bk[0], vals, 0);
		book_init(&bk[1], vals, 1);
	}
	Stream st[2];
	int ns = streams_of(vals, bk, st);
	for (int g0 = 0; g0 < G; g0 += KV_HEADS) {
		const float *pg = p + (size_t)g0 * ld;
		float *ag = acc + (size_t)g0 * acc_ld;
		switch (G - g0 < KV_HEADS ? G - g0 : KV_HEADS) {
		case 1: values_heads(vals, st, ns, pg, ld, 1, v, n, ag, acc_ld); break;
		case 2: values_heads(vals, st, ns, pg, ld, 2, v, n, ag, acc_ld); break;
		case 3: values_heads(vals, st, ns, pg, ld, 3, v, n, ag, acc_ld); break;
		default: values_heads(vals, st, ns, pg, ld, 4, v, n, ag, acc_ld); break;
		}
	}
}

/* ---- softmax ---- */

/* exp(x) as exp_avx2.h's exp_nonpos_avx2, 16 lanes: the same operations, so the same values. */
K5_INLINE __m512 exp_ps16(__m512 x)
{
	x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
	__m512 p = _mm512_set1_ps(1.0f / 720.0f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	__m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
	return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

K5_TARGET void kv_attn_softmax_avx512(float *s, int ld, int G, int n, float *m, float *l, float *ret_corr)
{
	for (int g = 0; g < G; g++) {
		float *sg = s + (size_t)g * ld;
		__m512 vmax = _mm512_set1_ps(m[g]);
		for (int j = 0; j < n; j += 16)
			vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, lanes(n - j), sg + j));
		float mx = _mm512_reduce_max_ps(vmax);
		__m512 vm = _mm512_set1_ps(mx), sum = _mm512_setzero_ps();
		for (int j = 0; j < n; j += 16) {
			__mmask16 mk = lanes(n - j);
			__m512 e = exp_ps16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sg + j), vm));
			_mm512_mask_storeu_ps(sg + j, mk, e);
			sum = _mm512_mask_add_ps(sum, mk, sum, e);
		}
		ret_corr[g] = m[g] == mx ? 1.0f : expf(m[g] - mx);
		l[g] = l[g] * ret_corr[g] + _mm512_reduce_add_ps(sum);
		m[g] = mx;
	}
}

/* ---- TQ values with int16 weights and centroids (kv_attn.h) ---- */

#define Q16V_TARGET \
	__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c,bmi2")))
#define Q16V_INLINE static inline __attribute__((always_inline)) Q16V_TARGET

/* Row's d (<= 64) codes, one byte each, lo codes past the hi codebook: the table index. */
Q16V_INLINE __m512i q16v_codes(const KvAttnRows *r, const uint8_t *row, __mmask64 load, __m512i perm,
			       __m512i shift, __m512i mask, __m512i add)
{
	__m512i raw = _mm512_maskz_loadu_epi8(load, row + r->q16v_base);
	__m512i c = _mm512_multishift_epi64_epi8(shift, _mm512_permutexvar_epi8(perm, raw));
	return _mm512_add_epi8(_mm512_and_si512(c, mask), add);
}

/*
 * Dword lanes: y[r] lane 4k + m is coordinate 16k + 4r + m (in-lane
 * unpacks); put back in order by a 4 x 4 transpose of 128-bit quarters.
 */
Q16V_INLINE void q16v_heads(const KvAttnRows *r, const float *p, int ld, const int G, const uint8_t *v,
			    int n, float *acc, int acc_ld)
{
	enum { BT = KV_BLOCK_TOKENS };
	const int d = r->dim;
	const __mmask64 load = (__mmask64)(~0ull >> (64 - r->q16v_bytes));
	const __m512i perm = _mm512_loadu_si512((const void *)r->q16v_perm);
	const __m512i shift = _mm512_loadu_si512((const void *)r->q16v_shift);
	const __m512i mask = _mm512_loadu_si512((const void *)r->q16v_mask);
	const __m512i add = _mm512_loadu_si512((const void *)r->q16v_add);
	const __m512i plo = _mm512_loadu_si512((const void *)r->q16v_planes[0]);
	const __m512i phi = _mm512_loadu_si512((const void *)r->q16v_planes[1]);
	float sc[BT] __attribute__((aligned(64)));
	for (int j = 0; j < BT; j++)
		sc[j] = j < n ? load_f16(v + (size_t)j * r->row_bytes + r->tq.off_scale[0]) : 0.0f;
	int16_t w16[KVPK_MAX_GROUP][BT] __attribute__((aligned(64)));
	float f[KVPK_MAX_GROUP];
	bool live[KVPK_MAX_GROUP];
	const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
	const __mmask16 m1 = (__mmask16)(n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1);
	for (int g = 0; g < G; g++) {
		const float *pg = p + (size_t)g * ld;
		__m512 w0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, pg), _mm512_load_ps(sc));
		__m512 w1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, pg + 16), _mm512_load_ps(sc + 16));
		float wm = _mm512_reduce_max_ps(_mm512_max_ps(w0, w1));
		live[g] = wm > 0.0f;
		if (!live[g])
			continue;
		__m512 vi = _mm512_set1_ps((float)KVATTN_Q16V_WMAX / wm);
		_mm256_store_si256((__m256i *)w16[g], _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(w0, vi))));
		_mm256_store_si256((__m256i *)(w16[g] + 16),
				   _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(w1, vi))));
		f[g] = (wm / (float)KVATTN_Q16V_WMAX) * r->q16v_scale;
	}
	__m512i a[KVPK_MAX_GROUP][4];
	for (int g = 0; g < G; g++)
		a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm512_setzero_si512();
	for (int j = 0; j < n; j += 2) { /* row j + 1 past n: in the block, weight 0 */
		__m512i x0 = q16v_codes(r, v + (size_t)j * r->row_bytes, load, perm, shift, mask, add);
		__m512i x1 = q16v_codes(r, v + (size_t)(j + 1) * r->row_bytes, load, perm, shift, mask, add);
		__m512i pa = _mm512_unpacklo_epi8(x0, x1), pb = _mm512_unpackhi_epi8(x0, x1);
		__m512i la = _mm512_permutexvar_epi8(pa, plo), ha = _mm512_permutexvar_epi8(pa, phi);
		__m512i lb = _mm512_permutexvar_epi8(pb, plo), hb = _mm512_permutexvar_epi8(pb, phi);
		__m512i y0 = _mm512_unpacklo_epi8(la, ha), y1 = _mm512_unpackhi_epi8(la, ha);
		__m512i y2 = _mm512_unpacklo_epi8(lb, hb), y3 = _mm512_unpackhi_epi8(lb, hb);
		for (int g = 0; g < G; g++) {
			int32_t wp;
			memcpy(&wp, &w16[g][j], 4);
			__m512i u = _mm512_set1_epi32(wp);
			a[g][0] = _mm512_dpwssd_epi32(a[g][0], y0, u);
			a[g][1] = _mm512_dpwssd_epi32(a[g][1], y1, u);
			a[g][2] = _mm512_dpwssd_epi32(a[g][2], y2, u);
			a[g][3] = _mm512_dpwssd_epi32(a[g][3], y3, u);
		}
	}
	for (int g = 0; g < G; g++) {
		if (!live[g])
			continue;
		__m512 vf = _mm512_set1_ps(f[g]), y[4];
		for (int k = 0; k < 4; k++)
			y[k] = _mm512_mul_ps(_mm512_cvtepi32_ps(a[g][k]), vf);
		__m512 t0 = _mm512_shuffle_f32x4(y[0], y[1], 0x44), t1 = _mm512_shuffle_f32x4(y[2], y[3], 0x44);
		__m512 t2 = _mm512_shuffle_f32x4(y[0], y[1], 0xee), t3 = _mm512_shuffle_f32x4(y[2], y[3], 0xee);
		__m512 o[4] = { _mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xdd),
				_mm512_shuffle_f32x4(t2, t3, 0x88), _mm512_shuffle_f32x4(t2, t3, 0xdd) };
		float *ag = acc + (size_t)g * acc_ld;
		for (int k = 0; 16 * k < d; k++) {
			__mmask16 mk = lanes(d - 16 * k);
			__m512 cur = _mm512_maskz_loadu_ps(mk, ag + 16 * k);
			_mm512_mask_storeu_ps(ag + 16 * k, mk, _mm512_add_ps(cur, o[k]));
		}
	}
}

Q16V_TARGET void kv_attn_values_q16_avx512(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
					   int n, float *acc, int acc_ld)
{
	if (vals->format != KV_FORMAT_TQ || !vals->q16v) {
		kv_attn_values_avx512(vals, p, ld, G, v, n, acc, acc_ld);
		return;
	}
	for (int g0 = 0; g0 < G; g0 += KV_HEADS) {
		const float *pg = p + (size_t)g0 * ld;
		float *ag = acc + (size_t)g0 * acc_ld;
		switch (G - g0 < KV_HEADS ? G - g0 : KV_HEADS) {
		case 1: q16v_heads(vals, pg, ld, 1, v, n, ag, acc_ld); break;
		case 2: q16v_heads(vals, pg, ld, 2, v, n, ag, acc_ld); break;
		case 3: q16v_heads(vals, pg, ld, 3, v, n, ag, acc_ld); break;
		default: q16v_heads(vals, pg, ld, 4, v, n, ag, acc_ld); break;
		}
	}
}
