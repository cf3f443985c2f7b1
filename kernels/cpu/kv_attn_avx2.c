/*
 * kv_attn_avx2.c: AVX2/FMA/F16C (+BMI2 pdep) versions of the KV attention
 * kernels of kv_attn.h. Compiled with -mavx2 -mfma -mf16c; called only
 * when kv_attn_have_avx2().
 *
 * Shape of every kernel: keys / values are visited once per call and
 * decoded 8 values at a time into registers, and the query heads of the
 * kv-head (up to KV_HEADS at once, more in rounds) consume each decoded
 * register. Score kernels keep one 8-lane partial sum per (head, key) and
 * reduce 8 keys at once (hsum8). TQ codes are unpacked in registers, 8
 * at a time, to one byte per code (pdep of the `bits` bytes that hold 8
 * codes), then looked up: byte-plane shuffles of the float table (32
 * codes, <= 4 bits), vpermps on 8/16-entry tables (tails) or gathers
 * (5..8 bits); the int8 score kernel uses int8 pshufb tables instead.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/kv_attn_x86.h"
#include "kernels/wtype.h"

#define KV_TARGET __attribute__((target("avx2,fma,f16c,bmi2")))
#define KV_INLINE static inline __attribute__((always_inline)) KV_TARGET
#define KV_HEADS 4 /* query heads per pass */

/* ---- code lookups (loads and unpacking: kv_attn_x86.h) ---- */

/*
 * Codes i .. i+31 as 32 bytes, for the int8 scores. A full chunk of 4-bit
 * codes comes out as [even codes | odd codes] (nibble split, no
 * interleave); kv_attn_query_prepare() lays the query out the same way.
 */
KV_INLINE __m256i codes32_int8(const uint8_t *p, int bits, int n, int i)
{
	if (bits == 4 && i + 32 <= n) {
		__m128i x = _mm_loadu_si128((const __m128i *)(p + i / 2));
		__m128i m = _mm_set1_epi8(0x0f);
		return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
	}
	return codes32(p, bits, n, i);
}

/*
 * A <= 16-entry float table as 4 byte planes, for exact float lookups of
 * 32 codes with byte shuffles (values: 12 shuffles per 32 floats instead
 * of 2 vpermps + a blend per 8).
 */
typedef struct PlaneBook {
	__m256i plane[4];
} PlaneBook;

KV_INLINE void planebook_init(PlaneBook *pb, const float *c, int bits)
{
	uint8_t t[4][16] = { { 0 } };
	for (int k = 0; c && bits <= 4 && k < 1 << bits; k++) {
		uint32_t u;
		memcpy(&u, &c[k], 4);
		for (int b = 0; b < 4; b++)
			t[b][k] = (uint8_t)(u >> (8 * b));
	}
	for (int b = 0; b < 4; b++)
		pb->plane[b] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t[b]));
}

/* out[k] = table[codes 8k .. 8k+7] for the 32 codes (natural order) in c. */
KV_INLINE void planebook_get32(const PlaneBook *pb, __m256i c, __m256 *out)
{
	/* dwords [0 2 4 6 | 1 3 5 7]: after the in-lane unpacks below, codes come out in order */
	c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
	__m256i b0 = _mm256_shuffle_epi8(pb->plane[0], c), b1 = _mm256_shuffle_epi8(pb->plane[1], c);
	__m256i b2 = _mm256_shuffle_epi8(pb->plane[2], c), b3 = _mm256_shuffle_epi8(pb->plane[3], c);
	__m256i l01 = _mm256_unpacklo_epi8(b0, b1), h01 = _mm256_unpackhi_epi8(b0, b1);
	__m256i l23 = _mm256_unpacklo_epi8(b2, b3), h23 = _mm256_unpackhi_epi8(b2, b3);
	out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(l01, l23));
	out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(l01, l23));
	out[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(h01, h23));
	out[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(h01, h23));
}

/* A TQ codebook for float lookups: <= 16 centroids in two vpermps tables, or a gather base. */
typedef struct FloatBook {
	PlaneBook pb;  /* <= 4 bits: byte planes */
	__m256 t0, t1;
	const float *c;
	int bits;
} FloatBook;

KV_INLINE void floatbook_init(FloatBook *fb, const float *c, int bits)
{
	float t[16] = { 0 };
	fb->c = c;
	fb->bits = bits;
	planebook_init(&fb->pb, c, bits);
	if (bits <= 4 && c) {
		memcpy(t, c, sizeof(float) << bits);
		fb->t0 = _mm256_loadu_ps(t);
		fb->t1 = _mm256_loadu_ps(t + 8);
	}
}

/* Centroids of 8 codes (one per byte of w). */
KV_INLINE __m256 floatbook_get8(const FloatBook *fb, uint64_t w)
{
	__m256i i = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)w));
	if (fb->bits <= 3)
		return _mm256_permutevar8x32_ps(fb->t0, i);
	if (fb->bits == 4)
		return _mm256_blendv_ps(_mm256_permutevar8x32_ps(fb->t0, i),
					_mm256_permutevar8x32_ps(fb->t1, i),
					_mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
	return _mm256_i32gather_ps(fb->c, i, 4);
}

/* The 8 values 8c .. 8c+7 of a non-TQ row. */
KV_INLINE __m256 row_get8(KvFormat f, const uint8_t *row, int c)
{
	switch (f) {
	case KV_FORMAT_F32:
		return _mm256_loadu_ps((const float *)row + 8 * c);
	case KV_FORMAT_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 16 * c)));
	case KV_FORMAT_Q8_0: {
		const uint8_t *b = row + (size_t)(c / 4) * sizeof(BlockQ8_0);
		__m128i x = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * (c % 4)));
		return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)), _mm256_set1_ps(load_f16(b)));
	}
	case KV_FORMAT_Q4_0: {
		const uint8_t *b = row + (size_t)(c / 4) * sizeof(BlockQ4_0);
		int w = c % 4;
		__m128i x = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * (w & 1)));
		if (w >= 2)
			x = _mm_srli_epi16(x, 4);
		x = _mm_and_si128(x, _mm_set1_epi8(0x0f));
		__m256i i = _mm256_sub_epi32(_mm256_cvtepu8_epi32(x), _mm256_set1_epi32(8));
		return _mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(load_f16(b)));
	}
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK: /* read by kv_attn_pk_scores_*() only */
	case KV_FORMAT_PQ: /* read by kv_attn_pq_*() only */
		break;
	}
	return _mm256_setzero_ps();
}

/* Scalar value i of a non-TQ row (tails of dims that are not multiples of 8). */
KV_INLINE float row_get1(KvFormat f, const uint8_t *row, int i)
{
	if (f == KV_FORMAT_F32) {
		float x;
		memcpy(&x, row + 4 * (size_t)i, 4);
		return x;
	}
	return load_f16(row + 2 * (size_t)i); /* F16: Q8_0 / Q4_0 dims are multiples of 32 */
}

/* Store the first n (<= 8) lanes of v at dst. */
KV_INLINE void store_n(float *dst, __m256 v, int n)
{
	if (n >= 8) {
		_mm256_storeu_ps(dst, v);
		return;
	}
	float t[8];
	_mm256_storeu_ps(t, v);
	memcpy(dst, t, (size_t)n * sizeof(float));
}

/* ---- QJL: <S P q, z> with z from sign bits ---- */

/* z (8,) in {-1, +1} for each byte of sign bits (bit i set: z_i = +1), 8 KB. */
#define Z1(b, i) ((b) >> (i) & 1 ? 1.0f : -1.0f)
#define ZROW(b) { Z1(b, 0), Z1(b, 1), Z1(b, 2), Z1(b, 3), Z1(b, 4), Z1(b, 5), Z1(b, 6), Z1(b, 7) }
#define Z4(b) ZROW(b), ZROW((b) + 1), ZROW((b) + 2), ZROW((b) + 3)
#define Z16(b) Z4(b), Z4((b) + 4), Z4((b) + 8), Z4((b) + 12)
#define Z64(b) Z16(b), Z16((b) + 16), Z16((b) + 32), Z16((b) + 48)
static const float sign_tab[256][8] __attribute__((aligned(32))) = {
	Z64(0), Z64(64), Z64(128), Z64(192),
};

/* a[g] += gk * sum_i z_i sq_g[i] (lanes; scalar tail into tail[g]). */
KV_INLINE void qjl_accumulate(const KvAttnRows *r, const KvAttnQuery *q, int G, const uint8_t *code,
			      __m256 *a, float *tail)
{
	const TqLayout *L = &r->tq;
	const uint8_t *signs = code + L->off_signs;
	float gk = r->qjl_const * load_f16(code + L->off_gamma);
	__m256 vgk = _mm256_set1_ps(gk);
	int i = 0;
	__m256 zs[KV_HEADS];
#pragma GCC unroll 4
	for (int g = 0; g < G; g++)
		zs[g] = _mm256_setzero_ps();
	for (; i + 8 <= L->qjl_m; i += 8) {
		__m256 z = _mm256_load_ps(sign_tab[signs[i / 8]]);
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
			zs[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g].sq + i), z, zs[g]);
	}
#pragma GCC unroll 4
	for (int g = 0; g < G; g++)
		a[g] = _mm256_fmadd_ps(zs[g], vgk, a[g]);
	for (; i < L->qjl_m; i++) {
		float z = tq_sign_value(signs, i) * gk;
		for (int g = 0; g < G; g++)
			tail[g] += z * q[g].sq[i];
	}
}

/* ---- scores ---- */

/*
 * One 8-lane partial per head for key row (float decode): lanes sum to
 * <q~_g, k~> minus tail[g], which gets the scalar remainder.
 */
KV_INLINE void key_float(const KvAttnRows *r, const FloatBook *fb, const KvAttnQuery *q, int G,
			 const uint8_t *row, __m256 *a, float *tail)
{
	int d = r->dim;
	if (r->format != KV_FORMAT_TQ) {
		int c = 0;
		for (; 8 * c + 8 <= d; c++) {
			__m256 k = row_get8(r->format, row, c);
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g].q + 8 * c), k, a[g]);
		}
		for (int i = 8 * c; i < d; i++) {
			float k = row_get1(r->format, row, i);
			for (int g = 0; g < G; g++)
				tail[g] += q[g].q[i] * k;
		}
		return;
	}
	const TqLayout *L = &r->tq;
	for (int s = 0; s < 2; s++) {
		int n = s ? L->dim - L->n_hi : L->n_hi, off = s ? L->n_hi : 0;
		if (n == 0)
			continue;
		int bits = s ? L->bits_lo : L->bits_hi;
		const uint8_t *codes = row + (s ? L->off_lo : L->off_hi);
		float sc = load_f16(row + L->off_scale[s ? L->n_scales - 1 : 0]);
		__m256 vs = _mm256_set1_ps(sc);
		int i = 0;
		if (bits <= 4 && n >= 32) {
			__m256 as[KV_HEADS];
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				as[g] = _mm256_setzero_ps();
			for (; i + 32 <= n; i += 32) {
				__m256 x[4];
				planebook_get32(&fb[s].pb, codes32_nat(codes, bits, n, i), x);
#pragma GCC unroll 4
				for (int g = 0; g < G; g++) {
					const float *qg = q[g].q + off + i;
					__m256 t = _mm256_mul_ps(_mm256_loadu_ps(qg), x[0]);
					t = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8), x[1], t);
					t = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 16), x[2], t);
					as[g] = _mm256_add_ps(as[g], _mm256_fmadd_ps(_mm256_loadu_ps(qg + 24), x[3], t));
				}
			}
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				a[g] = _mm256_fmadd_ps(as[g], vs, a[g]);
		}
		for (; i + 8 <= n; i += 8) {
			__m256 k = _mm256_mul_ps(floatbook_get8(&fb[s], codes8(codes, bits, n, i)), vs);
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g].q + off + i), k, a[g]);
		}
		if (i < n) {
			uint64_t w = codes8(codes, bits, n, i);
			for (; i < n; i++, w >>= 8) {
				float k = sc * r->cb[s][w & 0xff];
				for (int g = 0; g < G; g++)
					tail[g] += q[g].q[off + i] * k;
			}
		}
	}
	if (L->qjl_m > 0)
		qjl_accumulate(r, q, G, row, a, tail);
}

/* The same for TQ keys with int8 queries and codebooks (r->int8). */
KV_INLINE void key_int8(const KvAttnRows *r, const KvAttnQuery *q, int G, const uint8_t *row,
			__m256 *a, float *tail)
{
	const TqLayout *L = &r->tq;
	const __m256i ones = _mm256_set1_epi16(1);
	int at = 0; /* offset of the stream in q8 */
	for (int s = 0; s < 2; s++) {
		int n = s ? L->dim - L->n_hi : L->n_hi;
		if (n == 0)
			continue;
		const uint8_t *codes = row + (s ? L->off_lo : L->off_hi);
		int bits = s ? L->bits_lo : L->bits_hi;
		__m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)r->cb8[s]));
		__m256i acc[KV_HEADS];
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
			acc[g] = _mm256_setzero_si256();
		for (int i = 0; i < n; i += 32) {
			__m256i c = _mm256_shuffle_epi8(tab, codes32_int8(codes, bits, n, i));
#pragma GCC unroll 4
			for (int g = 0; g < G; g++) {
				__m256i qa = _mm256_loadu_si256((const __m256i *)(q[g].q8_abs + at + i));
				__m256i qs = _mm256_loadu_si256((const __m256i *)(q[g].q8 + at + i));
				__m256i p = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(c, qs));
				acc[g] = _mm256_add_epi32(acc[g], _mm256_madd_epi16(p, ones));
			}
		}
		float sc = load_f16(row + L->off_scale[s ? L->n_scales - 1 : 0]) * r->cb8_scale[s];
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
			a[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[g]), _mm256_set1_ps(sc * q[g].q8_scale), a[g]);
		at += (n + KV_ATTN_PAD - 1) / KV_ATTN_PAD * KV_ATTN_PAD;
	}
	if (L->qjl_m > 0)
		qjl_accumulate(r, q, G, row, a, tail);
}

/* Scores of G <= KV_HEADS heads; use_int8 picks key_int8 for TQ. */
KV_INLINE void scores_heads(const KvAttnRows *r, const FloatBook *fb, bool use_int8,
			    const KvAttnQuery *q, const int G, const uint8_t *k, int n, float scale,
			    float *scores, int ld)
{
	__m256 part[KV_HEADS][8];
	float tail[KV_HEADS][8];
	for (int j0 = 0; j0 < n; j0 += 8) {
		int nj = n - j0 < 8 ? n - j0 : 8;
		for (int jj = 0; jj < 8; jj++) {
			__m256 a[KV_HEADS];
			float t[KV_HEADS];
#pragma GCC unroll 4
			for (int g = 0; g < G; g++) {
				a[g] = _mm256_setzero_ps();
				t[g] = 0.0f;
			}
			if (jj < nj) {
				const uint8_t *row = k + (size_t)(j0 + jj) * r->row_bytes;
				if (use_int8)
					key_int8(r, q, G, row, a, t);
				else
					key_float(r, fb, q, G, row, a, t);
			}
#pragma GCC unroll 4
			for (int g = 0; g < G; g++) {
				part[g][jj] = a[g];
				tail[g][jj] = t[g];
			}
		}
		__m256 vscale = _mm256_set1_ps(scale);
		for (int g = 0; g < G; g++) {
			__m256 s = _mm256_add_ps(hsum8(part[g]), _mm256_loadu_ps(tail[g]));
			store_n(scores + (size_t)g * ld + j0, _mm256_mul_ps(s, vscale), nj);
		}
	}
}

KV_TARGET static void scores_any(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
				 int n, float scale, float *scores, int ld, bool use_int8)
{
	FloatBook fb[2];
	if (keys->format == KV_FORMAT_TQ) {
		floatbook_init(&fb[0], keys->cb[0], keys->tq.bits_hi);
		floatbook_init(&fb[1], keys->cb[1], keys->tq.bits_lo);
	}
	for (int g0 = 0; g0 < G; g0 += KV_HEADS) {
		const KvAttnQuery *qg = q + g0;
		float *sg = scores + (size_t)g0 * ld;
		switch (G - g0 < KV_HEADS ? G - g0 : KV_HEADS) {
		case 1: scores_heads(keys, fb, use_int8, qg, 1, k, n, scale, sg, ld); break;
		case 2: scores_heads(keys, fb, use_int8, qg, 2, k, n, scale, sg, ld); break;
		case 3: scores_heads(keys, fb, use_int8, qg, 3, k, n, scale, sg, ld); break;
		default: scores_heads(keys, fb, use_int8, qg, 4, k, n, scale, sg, ld); break;
		}
	}
}

KV_TARGET void kv_attn_scores_avx2(const KvAttnRows *keys, const KvAttnQuery *q, int G,
				   const uint8_t *k, int n, float scale, float *scores, int ld)
{
	scores_any(keys, q, G, k, n, scale, scores, ld, false);
}

KV_TARGET void kv_attn_scores_tq_int8_avx2(const KvAttnRows *keys, const KvAttnQuery *q, int G,
					   const uint8_t *k, int n, float scale, float *scores, int ld)
{
	scores_any(keys, q, G, k, n, scale, scores, ld, keys->format == KV_FORMAT_TQ && keys->int8);
}

/* ---- values ---- */

/* acc_g (dim,) += p_g * row for G <= KV_HEADS heads. */
/*
 * TQ values, stream s (<= 4 bits), its full 32-coordinate chunks: the
 * chunk outside, the keys inside, so the G x 32 accumulators stay in
 * registers over the block. Returns the coordinates done (0 if none).
 */
KV_INLINE int values_tq_chunks(const KvAttnRows *r, const FloatBook *fb, const float *p, int ld, const int G,
			       const uint8_t *v, int n, float *acc, int acc_ld, int s)
{
	const TqLayout *L = &r->tq;
	int ns = s ? L->dim - L->n_hi : L->n_hi, off = s ? L->n_hi : 0, bits = s ? L->bits_lo : L->bits_hi;
	if (ns < 32 || bits > 4)
		return 0;
	uint32_t oc = s ? L->off_lo : L->off_hi, os = L->off_scale[s ? L->n_scales - 1 : 0];
	float w[KV_HEADS][KV_BLOCK_TOKENS]; /* p_gj s_j */
	for (int j = 0; j < n; j++) {
		float sc = load_f16(v + (size_t)j * r->row_bytes + os);
		for (int g = 0; g < G; g++)
			w[g][j] = p[g * ld + j] * sc;
	}
	int i = 0;
	for (; i + 32 <= ns; i += 32) {
		__m256 a[KV_HEADS][4];
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
#pragma GCC unroll 4
			for (int k = 0; k < 4; k++)
				a[g][k] = _mm256_loadu_ps(acc + (size_t)g * acc_ld + off + i + 8 * k);
		for (int j = 0; j < n; j++) {
			__m256 x[4];
			planebook_get32(&fb[s].pb, codes32_nat(v + (size_t)j * r->row_bytes + oc, bits, ns, i), x);
#pragma GCC unroll 4
			for (int g = 0; g < G; g++) {
				__m256 wv = _mm256_broadcast_ss(&w[g][j]);
#pragma GCC unroll 4
				for (int k = 0; k < 4; k++)
					a[g][k] = _mm256_fmadd_ps(wv, x[k], a[g][k]);
			}
		}
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
#pragma GCC unroll 4
			for (int k = 0; k < 4; k++)
				_mm256_storeu_ps(acc + (size_t)g * acc_ld + off + i + 8 * k, a[g][k]);
	}
	return i;
}

KV_INLINE void value_heads(const KvAttnRows *r, const FloatBook *fb, const float *p, int ld, const int G,
			   const uint8_t *v, int n, float *acc, int acc_ld)
{
	int d = r->dim;
	int done[2] = { 0, 0 };
	if (r->format == KV_FORMAT_TQ)
		for (int s = 0; s < 2; s++)
			done[s] = values_tq_chunks(r, fb, p, ld, G, v, n, acc, acc_ld, s);
	for (int j = 0; j < n; j++) {
		const uint8_t *row = v + (size_t)j * r->row_bytes;
		__m256 w[KV_HEADS];
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
			w[g] = _mm256_set1_ps(p[g * ld + j]);
		if (r->format != KV_FORMAT_TQ) {
			int c = 0;
			for (; 8 * c + 8 <= d; c++) {
				__m256 x = row_get8(r->format, row, c);
#pragma GCC unroll 4
				for (int g = 0; g < G; g++) {
					float *ag = acc + (size_t)g * acc_ld + 8 * c;
					_mm256_storeu_ps(ag, _mm256_fmadd_ps(w[g], x, _mm256_loadu_ps(ag)));
				}
			}
			for (int i = 8 * c; i < d; i++) {
				float x = row_get1(r->format, row, i);
				for (int g = 0; g < G; g++)
					acc[(size_t)g * acc_ld + i] += p[g * ld + j] * x;
			}
			continue;
		}
		const TqLayout *L = &r->tq;
		for (int s = 0; s < 2; s++) {
			int ns = s ? L->dim - L->n_hi : L->n_hi, off = s ? L->n_hi : 0;
			if (ns == 0)
				continue;
			const uint8_t *codes = row + (s ? L->off_lo : L->off_hi);
			int bits = s ? L->bits_lo : L->bits_hi;
			float sc = load_f16(row + L->off_scale[s ? L->n_scales - 1 : 0]);
			__m256 ws[KV_HEADS];
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				ws[g] = _mm256_mul_ps(w[g], _mm256_set1_ps(sc));
			int i = done[s];
			if (i == ns)
				continue;
			for (; i + 8 <= ns; i += 8) {
				__m256 x = floatbook_get8(&fb[s], codes8(codes, bits, ns, i));
#pragma GCC unroll 4
				for (int g = 0; g < G; g++) {
					float *ag = acc + (size_t)g * acc_ld + off + i;
					_mm256_storeu_ps(ag, _mm256_fmadd_ps(ws[g], x, _mm256_loadu_ps(ag)));
				}
			}
			if (i < ns) {
				uint64_t cw = codes8(codes, bits, ns, i);
				for (; i < ns; i++, cw >>= 8)
					for (int g = 0; g < G; g++)
						acc[(size_t)g * acc_ld + off + i] += p[g * ld + j] * sc * r->cb[s][cw & 0xff];
			}
		}
	}
}

KV_TARGET void kv_attn_values_avx2(const KvAttnRows *vals, const float *p, int ld, int G,
				   const uint8_t *v, int n, float *acc, int acc_ld)
{
	FloatBook fb[2];
	if (vals->format == KV_FORMAT_TQ) {
		floatbook_init(&fb[0], vals->cb[0], vals->tq.bits_hi);
		floatbook_init(&fb[1], vals->cb[1], vals->tq.bits_lo);
	}
	for (int g0 = 0; g0 < G; g0 += KV_HEADS) {
		const float *pg = p + (size_t)g0 * ld;
		float *ag = acc + (size_t)g0 * acc_ld;
		switch (G - g0 < KV_HEADS ? G - g0 : KV_HEADS) {
		case 1: value_heads(vals, fb, pg, ld, 1, v, n, ag, acc_ld); break;
		case 2: value_heads(vals, fb, pg, ld, 2, v, n, ag, acc_ld); break;
		case 3: value_heads(vals, fb, pg, ld, 3, v, n, ag, acc_ld); break;
		default: value_heads(vals, fb, pg, ld, 4, v, n, ag, acc_ld); break;
		}
	}
}

/* ---- exact f32 keys ---- */

/* Scores of G <= KV_HEADS heads against the n rows x: each row chunk loaded once for all heads. */
KV_INLINE void exact_heads(const float *x, int d, const float *q, const int G, int n, float scale,
			   float *scores, int ld)
{
	for (int t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * d;
		__m256 a[KV_HEADS];
		float tail[KV_HEADS] = { 0 };
#pragma GCC unroll 4
		for (int g = 0; g < G; g++)
			a[g] = _mm256_setzero_ps();
		int i = 0;
		for (; i + 8 <= d; i += 8) {
			__m256 xv = _mm256_loadu_ps(xt + i);
#pragma GCC unroll 4
			for (int g = 0; g < G; g++)
				a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)g * d + i), xv, a[g]);
		}
		for (; i < d; i++)
			for (int g = 0; g < G; g++)
				tail[g] += q[(size_t)g * d + i] * xt[i];
#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			float v[8];
			_mm256_storeu_ps(v, a[g]);
			float sum = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])) + tail[g];
			scores[(size_t)g * ld + t] = sum * scale;
		}
	}
}

KV_TARGET void kv_attn_exact_scores_avx2(const float *x, int d, const float *q, int G, int n, float scale,
					 float *scores, int ld)
{
	for (int g0 = 0; g0 < G; g0 += KV_HEADS) {
		const float *qg = q + (size_t)g0 * d;
		float *sg = scores + (size_t)g0 * ld;
		switch (G - g0 < KV_HEADS ? G - g0 : KV_HEADS) {
		case 1: exact_heads(x, d, qg, 1, n, scale, sg, ld); break;
		case 2: exact_heads(x, d, qg, 2, n, scale, sg, ld); break;
		case 3: exact_heads(x, d, qg, 3, n, scale, sg, ld); break;
		default: exact_heads(x, d, qg, 4, n, scale, sg, ld); break;
		}
	}
}

/* ---- softmax ---- */

KV_TARGET void kv_attn_softmax_avx2(float *s, int ld, int G, int n, float *m, float *l, float *ret_corr)
{
	for (int g = 0; g < G; g++) {
		float *sg = s + (size_t)g * ld, mx = m[g];
		for (int j = 0; j < n; j++)
			mx = sg[j] > mx ? sg[j] : mx;
		__m256 vm = _mm256_set1_ps(mx), sum = _mm256_setzero_ps();
		int j = 0;
		for (; j + 8 <= n; j += 8) {
			__m256 e = exp_nonpos_avx2(_mm256_sub_ps(_mm256_loadu_ps(sg + j), vm));
			_mm256_storeu_ps(sg + j, e);
			sum = _mm256_add_ps(sum, e);
		}
		float t[8];
		_mm256_storeu_ps(t, sum);
		float total = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
		if (j < n) {
			float in[8] = { 0 };
			memcpy(in, sg + j, (size_t)(n - j) * sizeof(float));
			_mm256_storeu_ps(t, exp_nonpos_avx2(_mm256_sub_ps(_mm256_loadu_ps(in), vm)));
			for (int i = 0; i < n - j; i++) {
				sg[j + i] = t[i];
				total += t[i];
			}
		}
		ret_corr[g] = m[g] == mx ? 1.0f : expf(m[g] - mx);
		l[g] = l[g] * ret_corr[g] + total;
		m[g] = mx;
	}
}
