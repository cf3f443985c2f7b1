/*
 * kv_attn.h: the inner kernels of decode/prefill attention on a
 * compressed KV cache (engine/kv/kvstore.h): scores of a few prepared query
 * heads against up to 32 stored keys, and value sums acc += p_j v~_j over
 * up to 32 stored values, both computed from the stored rows without
 * writing dequantized K or V anywhere.
 *
 * Owns: the stored-row descriptor the kernels read (KvAttnRows), the
 * prepared query (KvAttnQuery), a scalar reference per kernel
 * (kv_attn.c, the definition of the sums), AVX2 twins
 * (kv_attn_avx2.c) and AVX-512 score and value kernels
 * (kv_attn_avx512.c), chosen at run time like the weight kernels
 * (cpu_features(); TURBOKV_NO_SIMD=1 forces the references,
 * TURBOKV_NO_AVX512=1 stops at AVX2). Not here:
 * rotations, codebooks and encoding (engine/codec/tq.h, engine/kv/kvquant.h), the
 * online softmax and block bookkeeping (engine/kv/kvstore.c).
 *
 * == Row formats (one head vector of dim values) ==
 *
 *   F32, F16, Q8_0, Q4_0   as engine/kv/kvquant.h (Q8_0 / Q4_0: dim / 32
 *                          ggml blocks); +h rows are the same bytes, the
 *                          rotation is the caller's business
 *   TQ                     a TurboQuant code record, layout TqLayout
 *                          (engine/codec/tq.h); values in the rotated domain
 *
 * == What the kernels compute ==
 *
 * Scores (q~ = the prepared query of head g, k~_j = stored key j):
 *   scores[g * ld + j] = scale * <q~_g, k~_j>
 * with, for TQ, the estimator of tq_inner_product() (MSE part plus
 * qjl_const * gamma * <S P q, z>). Values:
 *   acc[g * acc_ld + i] += sum_j p[g * ld + j] * v~_j[i]
 * with v~ in the stored (for TQ: rotated, s_g c[idx_i]) domain.
 *
 * The references use the float query as given, and so do the AVX2 and
 * AVX-512 kernels in use: they agree with the references to float rounding
 * (summation order; TQ centroids are looked up exactly, as floats).
 *
 * Measured alternative, not selected: an int8 TQ score kernel
 * (kv_attn_scores_tq_int8_avx2, streams <= 4 bits): the query rounded to
 * int8 with one scale per head (qs = max |q~_i| / 127, kv_attn_query_
 * prepare()), each codebook to int8 (cs = max |c_k| / 127), pshufb
 * lookups and maddubs products. Its error against the reference is
 * bounded by, per code stream with scale s,
 *   |s| * (qs / 2 * sum_i |c[idx_i]| + cs / 2 * sum_i |q~_i| + n qs cs / 4)
 * (times scale), plus float rounding. It scores tq4 keys about 1.2-1.3x
 * faster than the float kernel (about 10% of decode attention), but the
 * int8 rounding is visible on the default model: with it, test-kvstore's
 * tq4 greedy decode agreed with f32 for 2 of 16 tokens instead of 14, and
 * the fused output missed dequantize-then-exact by ~0.5%. So the exact
 * kernel is the one dispatched (docs/benchmarks.md, "Issue 4: decode at
 * depth").
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kv_format.h"
#include "kernels/kv_pk_layout.h"
#include "kernels/kv_pq_layout.h"
#include "kernels/tq_layout.h"

#define KV_ATTN_PAD 32      /* int8 query streams are padded to this many values */

/* One side (keys or values) of a (layer, kv-head) as the kernels read it. */
typedef struct KvAttnRows {
	KvFormat format;
	int dim;
	size_t row_bytes;       /* bytes per stored vector */
	/* TQ only */
	TqLayout tq;            /* offsets of the code record */
	const float *cb[2];     /* centroids of the hi / lo stream (NULL when empty) */
	float qjl_const;        /* K (0 without QJL) */
	float cb32[2][32];      /* cb[s] zero-padded to 32 entries (<= 5 bits; AVX-512 lookups) */
	bool int8;              /* int8 scoring allowed: every stream <= 4 bits */
	float cb8_scale[2];     /* cs of the hi / lo codebook */
	int8_t cb8[2][16];      /* round(c_k / cs), hi / lo (int8 kernel) */
} KvAttnRows;

/*
 * A prepared query head. The caller fills q (the query in the stored
 * domain: P q for TQ, R q for +h, else q) and, for TQ keys with QJL, sq
 * (S P q); kv_attn_query_prepare() then adds the forms the kernels read:
 *   qd  q in decode order: in every full 32-coordinate chunk of a 4-bit
 *       TQ stream the even coordinates first, then the odd ones (how the
 *       AVX-512 kernels unpack 4-bit codes), elsewhere as q;
 *   q8  the int8 form (int8 kernel, rows->int8 only), in the same order.
 */
typedef struct KvAttnQuery {
	float q[TQ_MAX_DIM];      /* (dim,) */
	float qd[TQ_MAX_DIM];     /* (dim,) */
	float sq[TQ_MAX_QJL_M];   /* (qjl_m,) */
	float q8_scale;           /* qs */
	/* (pad32(n_hi) + pad32(dim - n_hi),): hi stream, then lo stream, zero padded */
	int8_t q8[TQ_MAX_DIM + 2 * KV_ATTN_PAD];
	uint8_t q8_abs[TQ_MAX_DIM + 2 * KV_ATTN_PAD];
} KvAttnQuery;

/*
 * Fill rows for a non-TQ format (dim a multiple of 32 for Q8_0 / Q4_0)
 * or, from a codec's layout and centroids, for TQ. Returns 0 or -EINVAL.
 */
int kv_attn_rows_init(KvAttnRows *rows, KvFormat format, int dim);
int kv_attn_rows_init_tq(KvAttnRows *rows, const TqLayout *layout, const float *cb_hi,
			 const float *cb_lo, float qjl_const);

/*
 * Derive qd from q->q, and q8, q8_abs, q8_scale for TQ keys with
 * rows->int8. Call once per query head, after q (and sq): every kernel
 * may read these.
 */
void kv_attn_query_prepare(const KvAttnRows *keys, KvAttnQuery *q);

/*
 * scores (G, ld): scale * <q[g], key j> for g < G, j < n (n <= 32), keys
 * row_bytes apart from k. Other entries are left alone.
 */
typedef void (*KvAttnScoresFn)(const KvAttnRows *keys, const KvAttnQuery *q, int G,
			       const uint8_t *k, int n, float scale, float *scores, int ld);
/*
 * acc (G, acc_ld) += p[g * ld + j] * value j for j < n (n <= 32), values
 * row_bytes apart from v.
 */
typedef void (*KvAttnValuesFn)(const KvAttnRows *vals, const float *p, int ld, int G,
			       const uint8_t *v, int n, float *acc, int acc_ld);

void kv_attn_scores_ref(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
			int n, float scale, float *scores, int ld);
void kv_attn_values_ref(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			int n, float *acc, int acc_ld);

/* AVX2/FMA/F16C/BMI2 twins: call only when kv_attn_have_avx2(). */
void kv_attn_scores_avx2(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
			 int n, float scale, float *scores, int ld);
void kv_attn_values_avx2(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			 int n, float *acc, int acc_ld);

/*
 * AVX-512 (F/DQ/BW/VL, plus the AVX2 set) twins: call only when
 * kv_attn_have_avx512(). TQ keys with QJL are scored by the AVX2 kernel.
 */
void kv_attn_scores_avx512(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
			   int n, float scale, float *scores, int ld);
void kv_attn_values_avx512(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			   int n, float *acc, int acc_ld);

/*
 * The int8 TQ score kernel described above (needs kv_attn_query_prepare();
 * rows without rows->int8 go to the float path). Measured, tested, not
 * dispatched.
 */
void kv_attn_scores_tq_int8_avx2(const KvAttnRows *keys, const KvAttnQuery *q, int G,
				 const uint8_t *k, int n, float scale, float *scores, int ld);

/*
 * Pair-coded keys (kernels/kv_pk_layout.h) as the score kernels read them:
 * scores[g * ld + t] = scale * <q_g, k~_t> for the G (<= KVPK_MAX_GROUP)
 * query heads q (G, dim) as given (no preparation) and rows t < n of the
 * block's key region, k~_tj = sigma_{j/2} * centroids[b][code_tj].
 */
#define KVPK_PLANE_BITS 6 /* widths up to this are looked up by byte plane (AVX2) */

typedef struct KvPkRows {
	int dim;
	int code_bits; /* per key */
	/*
	 * [b]: 1 << KVPK_MAX_BITS floats, the 2^b normal Lloyd-Max levels then
	 * zeros (SIMD lookups load whole tables of 16 or 32).
	 */
	const float *centroids[KVPK_MAX_BITS + 1];
	const float *sigma; /* [256]: kvpk_scale_of(s) of every scale byte s, a lookup, not an exp2f */
	/*
	 * [b] for 1 <= b <= KVPK_PLANE_BITS: centroids[b] by byte plane,
	 * planes[b][64 p + k] = byte p (little-endian) of centroids[b][k],
	 * 4 x 64 bytes, zero past 2^b entries (AVX2 byte-shuffle lookups
	 * that reassemble the exact floats). Fill with kv_attn_pk_planes().
	 */
	const uint8_t *planes[KVPK_PLANE_BITS + 1];
} KvPkRows;

/* planes (4 x 64 bytes) of the 2^b floats c (b <= KVPK_PLANE_BITS), as KvPkRows.planes[b]. */
void kv_attn_pk_planes(const float *c, int b, uint8_t *planes);

/*
 * The AVX2 and AVX-512 twins compute every product and sum the reference
 * does, in its order, without fused multiply-adds: their scores are the
 * reference's bit for bit (test-kvattn), so dispatching them changes no
 * output.
 */
typedef void (*KvAttnPkScoresFn)(const KvPkRows *keys, const uint8_t *blk, const float *q, int G,
				 int n, float scale, float *scores, int ld);
void kv_attn_pk_scores_ref(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			   float scale, float *scores, int ld);
void kv_attn_pk_scores_avx2(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			    float scale, float *scores, int ld);
void kv_attn_pk_scores_avx512(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			      float scale, float *scores, int ld);
/* The same with VBMI (kv_attn_have_avx512vbmi()): its codes unpacked in the vector unit. */
void kv_attn_pk_scores_avx512vbmi(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
				  float scale, float *scores, int ld);
KvAttnPkScoresFn kv_attn_pk_scores_get(void);

/*
 * Exact f32 keys (a centered format's block 0, pk's own block):
 * scores[g * ld + t] = scale * <q_g, x_t> for the G query heads q (G, d)
 * and rows x (n, d), n <= 32. The reference sums in coordinate order;
 * the AVX2 twin in 8 lanes with fused multiply-adds, so the two differ
 * by float rounding: at most 2 gamma_{d+1} scale sum_i |q_gi x_ti|,
 * gamma_k = k u / (1 - k u), u = 2^-24 (test-kvattn checks that bound).
 */
typedef void (*KvAttnExactScoresFn)(const float *x, int d, const float *q, int G, int n, float scale,
				    float *scores, int ld);
void kv_attn_exact_scores_ref(const float *x, int d, const float *q, int G, int n, float scale,
			      float *scores, int ld);
void kv_attn_exact_scores_avx2(const float *x, int d, const float *q, int G, int n, float scale,
			       float *scores, int ld);
/* NEON (aarch64 builds, kv_attn_have_neon()): four fused lanes per sum. */
void kv_attn_exact_scores_neon(const float *x, int d, const float *q, int G, int n, float scale,
			       float *scores, int ld);
KvAttnExactScoresFn kv_attn_exact_scores_get(void);

/*
 * One step of the online softmax over a block of scores s (G, ld), n
 * per head: with the running max m[g] and sum l[g],
 *   m' = max(m[g], max_j s_gj), s_gj <- exp(s_gj - m'),
 *   ret_corr[g] = exp(m[g] - m'), l[g] <- l[g] ret_corr[g] + sum_j s_gj,
 *   m[g] <- m'.
 * m[g] may be -INFINITY (nothing seen yet: ret_corr 0); scores are finite.
 * The AVX2 exp is a polynomial within 2 ulp of expf (test-kvattn).
 */
typedef void (*KvAttnSoftmaxFn)(float *s, int ld, int G, int n, float *m, float *l, float *ret_corr);
void kv_attn_softmax_ref(float *s, int ld, int G, int n, float *m, float *l, float *ret_corr);
void kv_attn_softmax_avx2(float *s, int ld, int G, int n, float *m, float *l, float *ret_corr);
void kv_attn_softmax_avx512(float *s, int ld, int G, int n, float *m, float *l, float *ret_corr);
KvAttnSoftmaxFn kv_attn_softmax_get(void);

/*
 * NEON twins (aarch64 builds, kv_attn_neon.c): call only when
 * kv_attn_have_neon(). Scores and values cover F16 and TQ rows (the
 * default type's tq values, tq4) in the stored domain with fused
 * multiply-adds, so they agree with the references to float rounding;
 * other formats go to the references. The pk score kernel computes the
 * reference's products and sums in its order without fusing: bit for bit.
 */
void kv_attn_scores_neon(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
			 int n, float scale, float *scores, int ld);
void kv_attn_values_neon(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			 int n, float *acc, int acc_ld);
void kv_attn_pk_scores_neon(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			    float scale, float *scores, int ld);

/* Whether the NEON kernels may run (an aarch64 build, SIMD not disabled). */
bool kv_attn_have_neon(void);

/* Whether the AVX2 kernels may run (CPU features, SIMD not disabled). */
bool kv_attn_have_avx2(void);
/* Whether the AVX-512 kernels may run (and AVX2 too; AVX-512 not disabled). */
bool kv_attn_have_avx512(void);
bool kv_attn_have_avx512vbmi(void); /* and VBMI: the pk kernel that unpacks codes in the vector unit */

/* The kernels to use now: AVX-512, else AVX2 where allowed (x86), NEON
 * (aarch64), else the references. */
KvAttnScoresFn kv_attn_scores_get(void);
KvAttnValuesFn kv_attn_values_get(void);

/*
 * PolarQuant rows (kernels/kv_pq_layout.h) as the pq kernels read them.
 * cosv[l] / sinv[l] (l = level - 1): cos and sin of the 2^bits[l]
 * centroids of that level, zero-padded to 1 << KVPQ_MAX_BITS floats (SIMD
 * lookups load 8 or 16).
 *
 * Scores: the prepared query of a head is dim + n_1 2^b_1 floats: y = P q,
 * then the level-1 table T1[p 2^b_1 + c] = cos_1[c] y[p] + sin_1[c] y[p + n_1]
 * (a product, a product, a sum). For a key with codes c_l[p] and radii r:
 *   s_1[p] = T1[p 2^b_1 + c_1[p]]                          p < n_1
 *   s_l[p] = cos_l[c_l[p]] s_{l-1}[p] + sin_l[c_l[p]] s_{l-1}[p + n_l]
 *   scores[g * ld + t] = scale * (sum_{p < n_L} r[p] s_L[p], summed in order)
 * which is <P q, y~>: <q, x~> for x~ = P^T y~. Values: acc (G, acc_ld) +=
 * p[g * ld + t] * y~_t, y~ read back top-down in the rotated domain
 * (kv_pq_layout.h). The AVX2 twins compute the same products and sums in
 * the same order (no fused multiply-add): bit for bit the references'
 * (test-kvattn). No AVX-512 twin: not written, as no machine here could
 * test it.
 */
typedef struct KvPqRows {
	KvPqShape shape;
	size_t row_bytes;
	const float *cosv[KVPQ_MAX_LEVELS];
	const float *sinv[KVPQ_MAX_LEVELS];
} KvPqRows;

typedef void (*KvAttnPqScoresFn)(const KvPqRows *keys, const float *prep, int G, const uint8_t *k,
				 int n, float scale, float *scores, int ld);
typedef void (*KvAttnPqValuesFn)(const KvPqRows *vals, const float *p, int ld, int G,
				 const uint8_t *v, int n, float *acc, int acc_ld);
/* Floats of one prepared query head: dim + n_1 2^b_1. */
size_t kv_attn_pq_query_floats(const KvPqRows *keys);
void kv_attn_pq_scores_ref(const KvPqRows *keys, const float *prep, int G, const uint8_t *k, int n,
			   float scale, float *scores, int ld);
void kv_attn_pq_values_ref(const KvPqRows *vals, const float *p, int ld, int G, const uint8_t *v,
			   int n, float *acc, int acc_ld);
void kv_attn_pq_scores_avx2(const KvPqRows *keys, const float *prep, int G, const uint8_t *k, int n,
			    float scale, float *scores, int ld);
void kv_attn_pq_values_avx2(const KvPqRows *vals, const float *p, int ld, int G, const uint8_t *v,
			    int n, float *acc, int acc_ld);
KvAttnPqScoresFn kv_attn_pq_scores_get(void);
KvAttnPqValuesFn kv_attn_pq_values_get(void);
