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
 * Two exceptions, both with 13- to 14-bit integer forms and a stated
 * bound (below): pair-coded keys (an int16 query, every x86 level the
 * same scores), and on AVX-512 VBMI/VNNI CPUs TQ values of the default's
 * tq3.5 kind (int16 weights and centroids).
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

#include <assert.h>
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
	/* TQ values, the int16 kernel (below): set by kv_attn_rows_init_tq() where it applies */
	bool q16v;
	float q16v_scale;       /* cv: c16 = round(c / cv), |c16| <= KVATTN_Q16V_CMAX */
	/*
	 * Row bytes from off_hi to the end of the lo codes unpacked to one
	 * byte per coordinate (vpermb, vpmultishiftqb, mask), lo codes moved
	 * past the hi codebook (+ 2^bits_hi): the index into q16v_planes.
	 */
	uint8_t q16v_perm[64], q16v_shift[64], q16v_mask[64], q16v_add[64];
	uint8_t q16v_planes[2][64]; /* low, high bytes of c16 of hi codes 0.., then lo codes */
	int q16v_bytes;             /* code bytes loaded per row, from q16v_base */
	uint32_t q16v_base;         /* the first code byte of a row */
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
 * TQ values with int16 weights and centroids (AVX-512 VBMI/VNNI,
 * kv_attn_have_avx512vnni(); rows->q16v: MSE codes of <= 5 bits whose two
 * codebooks fit one 64-entry table, one scale, no QJL, dim <= 64 a
 * multiple of 8, the codes within 64 bytes, not 4 bits throughout (tq4's
 * nibbles the float kernel reads faster): the default type's tq3.5
 * values). Per head g and block, for rows j < n:
 *   w_j   = p[g * ld + j] * s_j                (float; s_j the row's scale)
 *   wm    = max_j w_j;  inv = 16383 / wm        (wm = 0: nothing added)
 *   w16_j = round-to-even(w_j * inv)           (0 <= w16_j <= 16383)
 *   f     = (wm / 16383) * cv
 *   acc[g * acc_ld + i] += (float)(sum_j w16_j * c16[idx_ji]) * f
 * exact in int32 (32 * 16383 * 4095 < 2^31). The scalar reference
 * kv_attn_values_q16_ref and the AVX-512 kernel agree bit for bit; against
 * the float reference, per coordinate,
 *   |error| <= 0.5005 (wm / 16383) sum_j (|c_ji| + cv / 2)
 *              + (cv / 2) sum_j w_j + float rounding
 * (test-kvattn). kv_attn_values_avx512() takes this path for such rows.
 */
#define KVATTN_Q16V_WMAX 16383
#define KVATTN_Q16V_CMAX 4095
static_assert((long long)KV_BLOCK_TOKENS * KVATTN_Q16V_WMAX * KVATTN_Q16V_CMAX <= 2147483647LL,
	      "a block's integer value sum fits int32");
void kv_attn_values_q16_ref(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			    int n, float *acc, int acc_ld);
void kv_attn_values_q16_avx512(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
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
	 * [b]: the int16 centroids of the quantized kernels below,
	 * c16[b][k] = round(centroids[b][k] * 2^KVPK_Q16_SHIFT), KVPK_Q16_TABLE
	 * entries (zeros past 2^b: gathers of 4 bytes may read entry k + 1).
	 */
	const int16_t *c16[KVPK_MAX_BITS + 1];
	/* [b]: the bytes of c16[b] by plane, 2 x 256: low bytes, then high bytes (byte lookups) */
	const uint8_t *c16_planes[KVPK_MAX_BITS + 1];
} KvPkRows;

/*
 * == The quantized form (what x86 dispatches) ==
 *
 * Per block and head g, with sigma_j = sigma_{j/2} of a pair of width > 0
 * and 0 for a pair of width 0 (it has no codes):
 *   u_j   = q_gj * sigma_j                       (float)
 *   m     = max_j |u_j|;  inv = 8191 / m          (float; m = 0: u16 = 0, f = 0)
 *   u16_j = round-to-even(u_j * inv)             |u16_j| <= KVPK_Q16_UMAX = 8191
 *   f     = (m / 8191) * (scale * 2^-9)
 *   score = (float)(sum_j u16_j * c16[b][code_tj]) * f
 * the integer sum exact in int32 (|c16| <= KVPK_Q16_CMAX = 4095, so 64
 * columns sum to at most 64 * 8191 * 4095 < 2^31); over dim > 64 the
 * columns go in chunks of 64, each chunk's sum converted and multiplied by
 * f, the chunks added in order. Every kernel of this form (the scalar
 * kv_attn_pk_scores_q16_ref, AVX2 and AVX-512 VBMI/VNNI) computes exactly
 * these integers and these float operations: their scores agree bit for
 * bit (test-kvattn), so dispatching changes no output.
 *
 * Against the float reference (the exact sum E = scale sum_j u_j c_j):
 * with |u16_j (m / 8191) - u_j| <= 0.5005 m / 8191 (rounding, plus inv's
 * own rounding) and |c16 2^-9 - c| <= 2^-10,
 *   |score - E| <= scale (0.5005 (m / 8191) sum_j (|c_j| + 2^-10)
 *                         + 2^-10 sum_j |u_j|) + float rounding,
 * test-kvattn checks it key by key. In the typical case (rounding errors
 * independent, |c| ~ 1) that is a relative error of a few 1e-5 of
 * scale ||u||, below what storing the key in binary16 costs.
 * Why: the float kernels did a float lookup, a multiply by sigma and two
 * operations per head for every code, compute-bound at 3 heads per
 * kv-head; here a code pair costs a byte lookup and one int16 pair
 * multiply-add (vpdpwssd / vpmaddwd) per head, sigma is folded into the
 * query once per block (docs/benchmarks.md, issue 20).
 */
#define KVPK_Q16_SHIFT 9    /* c16 = round(c * 2^9) */
#define KVPK_Q16_CMAX 4095  /* |c16| bound: every |c| < 8 (kvpk_init() checks; the 8-bit codebook reaches about 4) */
#define KVPK_Q16_UMAX 8191  /* |u16| bound */
#define KVPK_Q16_CHUNK 64   /* columns per int32 sum */
#define KVPK_Q16_TABLE 264  /* entries per c16 table (256 and padding) */

static_assert((long long)KVPK_Q16_CHUNK * KVPK_Q16_UMAX * KVPK_Q16_CMAX <= 2147483647LL,
	      "a chunk's integer sum fits int32");

/*
 * c16 (KVPK_Q16_TABLE) and planes (2 x 256) of the 2^b floats c, as
 * KvPkRows.c16[b] / c16_planes[b]. 0, or -ERANGE if a centroid is outside
 * +-KVPK_Q16_CMAX 2^-KVPK_Q16_SHIFT.
 */
int kv_attn_pk_q16_tables(const float *c, int b, int16_t *c16, uint8_t *planes);

/*
 * The float reference (kv_attn_pk_scores_ref: the definition, products and
 * sums in coordinate order) and its NEON twin (bit for bit); the quantized
 * form above: its scalar reference, AVX2 (+BMI2) and AVX-512
 * (F/BW/VBMI/VNNI: kv_attn_have_avx512vnni()) kernels.
 */
typedef void (*KvAttnPkScoresFn)(const KvPkRows *keys, const uint8_t *blk, const float *q, int G,
				 int n, float scale, float *scores, int ld);
void kv_attn_pk_scores_ref(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			   float scale, float *scores, int ld);
void kv_attn_pk_scores_q16_ref(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			       float scale, float *scores, int ld);
void kv_attn_pk_scores_q16_avx2(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
				float scale, float *scores, int ld);
void kv_attn_pk_scores_q16_avx512(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
				  float scale, float *scores, int ld);
/*
 * What runs: on x86 the quantized form (AVX-512 VBMI/VNNI, else AVX2, else
 * its scalar reference: every level the same scores), elsewhere the float
 * form (NEON, else its reference).
 */
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
bool kv_attn_have_avx512vbmi(void); /* and VBMI (byte permutes, multishift) */
bool kv_attn_have_avx512vnni(void); /* and VBMI and VNNI: the quantized pk kernel */

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
