/*
 * kv_kernel.h: the KV codecs as plain data, and the per-vector operations
 * on them that kernels on any device run: storing a K or V vector (the
 * same bytes as tq_encode() / kvquant_store()), preparing a query,
 * scoring one stored key, reading one coordinate of a stored value, and
 * the final inverse rotation. Everything is static inline and free of
 * host-only calls, so the CUDA kernels (kernels/cuda/) include it as is
 * and the CPU unit test (tests/unit/test-kv-kernel.c) checks it against
 * the engine's references byte for byte.
 *
 * Owns: KvkCodec (a TqCodec flattened into one blob that can be copied
 * to a device as is) and the mirrored float arithmetic. Not here:
 * building a KvkCodec (tq_codec_kernel() in tq.c, which can see the
 * codec's insides), the attention loops (kernels/cpu, kernels/cuda).
 *
 * == Why mirrored, operation for operation ==
 *
 * A GPU that appends to a cache must write the bytes the CPU would, so
 * that a session saved on one restores on the other and a code never
 * depends on where it was made. Cell indices are decided by comparisons
 * against codebook boundaries, so one rounding difference in the rotated
 * coordinate can move a code. These functions therefore repeat the
 * engine's float and double operations in the engine's order (the
 * Hadamard butterflies, dense_mul's four-row sums, the double norms),
 * and must be compiled without contraction into FMA (C11 ISO mode does
 * not contract; nvcc needs -fmad=false for code that calls
 * kvk_tq_encode or kvk_plain_store). Scores and value reads have no such
 * constraint: attention is compared within a tolerance.
 *
 * == Blob ==
 *
 * Arrays live in one byte blob at 16-byte aligned offsets; a field
 * holding an offset is -1 when the array is absent. KvkCodec.blob points
 * at the blob (host or device memory); copying the blob and repointing
 * it is all an upload takes.
 */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/bitpack.h"
#include "base/half.h"
#include "kernels/kv_format.h"

#ifdef __CUDACC__
#define KVK_HD __host__ __device__
#else
#define KVK_HD
#endif

#define KVK_MAX_DIM 256   /* head_dim the kernel-side codecs take */
#define KVK_MAX_QJL_M 256 /* QJL rows */
#define KVK_MAX_SCALE 65504.0 /* largest finite fp16: scales saturate there */

/* tq.h's TQ_FLAG_* bits. */
enum {
	KVK_FLAG_NORM_CORRECT = 1u << 0,
	KVK_FLAG_QJL = 1u << 1,
};

/* One rotation as rotation.c applies it. */
typedef struct KvkRot {
	int kind;        /* 0 none, 1 Hadamard, 2 dense (RotationKind) */
	int dim;
	int32_t signs1;  /* Hadamard: (dim,) floats, signs of D_1 times d^(-rounds/2) */
	int32_t signs2;  /* Hadamard: (dim,) +-1 of D_2, or -1 for one round */
	int32_t p, pt;   /* dense: (dim, dim) row-major P and P^T */
} KvkRot;

/* One TurboQuant group (tq.c's TqGroup). */
typedef struct KvkGroup {
	int dim, off, scale;
	int32_t channels; /* (dim,) uint16 input channels, or -1 for the identity */
	KvkRot rot;
} KvkGroup;

/* A TurboQuant codec (one (layer, kv-head, K or V) of a cache). */
typedef struct KvkCodec {
	/* TqLayout */
	int dim, n_hi, bits_hi, bits_lo, qjl_m, n_scales;
	uint32_t off_scale[2], off_gamma, off_hi, off_lo, off_signs, code_bytes;

	uint32_t flags;
	int n_groups;
	KvkGroup groups[2];
	int32_t cb_hi, cb_lo; /* centroids (2^bits floats), or -1 for an empty group */
	int32_t bd_hi, bd_lo; /* boundaries (2^bits - 1 floats) */
	int levels_hi, levels_lo;
	int32_t s;            /* Gaussian S (qjl_m, dim) floats, or -1 */
	KvkRot s_rot;         /* structured S (kind 0 when absent) */
	float qjl_const;
	uint32_t blob_bytes;
	const uint8_t *blob;
} KvkCodec;

static inline KVK_HD const float *kvk_floats(const KvkCodec *c, int32_t off)
{
	return (const float *)(const void *)(c->blob + off);
}

/* ---- rotations, in rotation.c's operation order ---- */

/* x <- H x (unnormalised Walsh-Hadamard), the butterflies of fwht(). */
static inline KVK_HD void kvk_fwht(float *x, int n)
{
	for (int h = 1; h < n; h *= 2)
		for (int i = 0; i < n; i += 2 * h)
			for (int j = i; j < i + h; j++) {
				float u = x[j], v = x[j + h];
				x[j] = u + v;
				x[j + h] = u - v;
			}
}

/* y (d,) = M x with M given by its transpose mt (d, d): dense_mul(). x and y must differ. */
static inline KVK_HD void kvk_dense_mul(const float *mt, int d, const float *x, float *y)
{
	for (int i = 0; i < d; i++)
		y[i] = 0.0f;
	int j = 0;
	for (; j + 4 <= d; j += 4) {
		const float *r0 = mt + (long)j * d, *r1 = r0 + d, *r2 = r1 + d, *r3 = r2 + d;
		float x0 = x[j], x1 = x[j + 1], x2 = x[j + 2], x3 = x[j + 3];
		for (int i = 0; i < d; i++)
			y[i] += x0 * r0[i] + x1 * r1[i] + x2 * r2[i] + x3 * r3[i];
	}
	for (; j < d; j++) {
		const float *r0 = mt + (long)j * d;
		float x0 = x[j];
		for (int i = 0; i < d; i++)
			y[i] += x0 * r0[i];
	}
}

/* y = P x (rotation_apply). x and y must differ. */
static inline KVK_HD void kvk_rot_apply(const KvkCodec *c, const KvkRot *r, const float *x, float *y)
{
	int d = r->dim;
	if (r->kind == 2) {
		kvk_dense_mul(kvk_floats(c, r->pt), d, x, y);
		return;
	}
	const float *s1 = kvk_floats(c, r->signs1);
	for (int i = 0; i < d; i++)
		y[i] = x[i] * s1[i];
	kvk_fwht(y, d);
	if (r->signs2 >= 0) {
		const float *s2 = kvk_floats(c, r->signs2);
		for (int i = 0; i < d; i++)
			y[i] *= s2[i];
		kvk_fwht(y, d);
	}
}

/* x = P^T y (rotation_apply_inverse). x and y must differ. */
static inline KVK_HD void kvk_rot_apply_inverse(const KvkCodec *c, const KvkRot *r, const float *y,
						float *x)
{
	int d = r->dim;
	if (r->kind == 2) {
		kvk_dense_mul(kvk_floats(c, r->p), d, y, x);
		return;
	}
	for (int i = 0; i < d; i++)
		x[i] = y[i];
	kvk_fwht(x, d);
	if (r->signs2 >= 0) {
		const float *s2 = kvk_floats(c, r->signs2);
		for (int i = 0; i < d; i++)
			x[i] *= s2[i];
		kvk_fwht(x, d);
	}
	const float *s1 = kvk_floats(c, r->signs1);
	for (int i = 0; i < d; i++)
		x[i] *= s1[i];
}

/* out (G.dim,) = P_g x[channels of g] (tq.c group_rotate). */
static inline KVK_HD void kvk_group_rotate(const KvkCodec *c, const KvkGroup *G, const float *x,
					   float *out)
{
	if (G->channels < 0) {
		kvk_rot_apply(c, &G->rot, x, out);
		return;
	}
	const uint16_t *ch = (const uint16_t *)(const void *)(c->blob + G->channels);
	float tmp[KVK_MAX_DIM];
	for (int i = 0; i < G->dim; i++)
		tmp[i] = x[ch[i]];
	kvk_rot_apply(c, &G->rot, tmp, out);
}

/* x[channels of g] = P_g^T v (G.dim,) (tq.c group_unrotate). */
static inline KVK_HD void kvk_group_unrotate(const KvkCodec *c, const KvkGroup *G, const float *v,
					     float *x)
{
	if (G->channels < 0) {
		kvk_rot_apply_inverse(c, &G->rot, v, x);
		return;
	}
	const uint16_t *ch = (const uint16_t *)(const void *)(c->blob + G->channels);
	float tmp[KVK_MAX_DIM];
	kvk_rot_apply_inverse(c, &G->rot, v, tmp);
	for (int i = 0; i < G->dim; i++)
		x[ch[i]] = tmp[i];
}

/* ---- TurboQuant ---- */

/* The number of boundaries <= t (codebook_quantize(); NaN gives 0). */
static inline KVK_HD uint8_t kvk_cell(const float *boundaries, int n_levels, float t)
{
	unsigned idx = 0;
	for (unsigned step = (unsigned)n_levels >> 1; step > 0; step >>= 1)
		idx += (t >= boundaries[idx + step - 1]) ? step : 0u;
	return (uint8_t)idx;
}

static inline KVK_HD float kvk_saturate_scale(double s)
{
	return (float)(s > KVK_MAX_SCALE ? KVK_MAX_SCALE : s);
}

static inline KVK_HD void kvk_tq_sketch(const KvkCodec *c, const float *v, float *w)
{
	if (c->s_rot.kind) {
		kvk_rot_apply(c, &c->s_rot, v, w);
		return;
	}
	const float *s = kvk_floats(c, c->s);
	for (int i = 0; i < c->qjl_m; i++) {
		const float *row = s + (long)i * c->dim;
		float acc = 0.0f;
		for (int j = 0; j < c->dim; j++)
			acc += row[j] * v[j];
		w[i] = acc;
	}
}

/* Encode x (dim,) into code (code_bytes): tq_encode(), byte for byte. */
static inline KVK_HD void kvk_tq_encode(const KvkCodec *c, const float *x, uint8_t *code)
{
	float y[KVK_MAX_DIM], rec[KVK_MAX_DIM];
	uint8_t idx[KVK_MAX_DIM];

	for (uint32_t i = 0; i < c->code_bytes; i++)
		code[i] = 0;
	for (int g = 0; g < c->n_groups; g++) {
		const KvkGroup *G = &c->groups[g];
		double n2 = 0.0;
		if (G->channels >= 0) {
			const uint16_t *ch = (const uint16_t *)(const void *)(c->blob + G->channels);
			for (int i = 0; i < G->dim; i++)
				n2 += (double)x[ch[i]] * x[ch[i]];
		} else {
			for (int i = 0; i < G->dim; i++)
				n2 += (double)x[i] * x[i];
		}
		double n = sqrt(n2);
		kvk_group_rotate(c, G, x, y + G->off);

		float inv = n > 0.0 ? (float)(1.0 / n) : 0.0f;
		double c2 = 0.0;
		for (int i = G->off; i < G->off + G->dim; i++) {
			bool hi = i < c->n_hi;
			const float *cb = kvk_floats(c, hi ? c->cb_hi : c->cb_lo);
			idx[i] = n > 0.0 ? kvk_cell(kvk_floats(c, hi ? c->bd_hi : c->bd_lo),
						    hi ? c->levels_hi : c->levels_lo, y[i] * inv)
					 : 0;
			c2 += (double)cb[idx[i]] * cb[idx[i]];
		}
		double s = n;
		if ((c->flags & KVK_FLAG_NORM_CORRECT) && n > 0.0 && c2 > 0.0)
			s = n / sqrt(c2);
		else if (n == 0.0)
			s = 0.0;
		uint8_t *sp = code + c->off_scale[G->scale];
		tkv_half h = f32_to_half(kvk_saturate_scale(s));
		sp[0] = (uint8_t)(h & 0xff);
		sp[1] = (uint8_t)(h >> 8);
		float sf = half_to_f32(h);
		for (int i = G->off; i < G->off + G->dim; i++)
			rec[i] = sf * kvk_floats(c, i < c->n_hi ? c->cb_hi : c->cb_lo)[idx[i]];
	}
	if (c->n_hi > 0)
		bitpack_pack(idx, (size_t)c->n_hi, c->bits_hi, code + c->off_hi);
	if (c->n_hi < c->dim)
		bitpack_pack(idx + c->n_hi, (size_t)(c->dim - c->n_hi), c->bits_lo, code + c->off_lo);
	if (c->flags & KVK_FLAG_QJL) {
		float r[KVK_MAX_DIM], w[KVK_MAX_QJL_M];
		double g2 = 0.0;
		for (int i = 0; i < c->dim; i++) {
			r[i] = y[i] - rec[i];
			g2 += (double)r[i] * r[i];
		}
		tkv_half h = f32_to_half(kvk_saturate_scale(sqrt(g2)));
		code[c->off_gamma] = (uint8_t)(h & 0xff);
		code[c->off_gamma + 1] = (uint8_t)(h >> 8);
		kvk_tq_sketch(c, r, w);
		uint8_t *signs = code + c->off_signs;
		for (int i = 0; i < c->qjl_m; i++)
			if (w[i] >= 0.0f)
				signs[i >> 3] |= (uint8_t)(1u << (i & 7));
	}
}

/* qrot (dim,) = P q; with QJL also sq (qjl_m,) = S P q (tq_query_prepare()). */
static inline KVK_HD void kvk_tq_query_prepare(const KvkCodec *c, const float *q, float *qrot,
					       float *sq)
{
	for (int g = 0; g < c->n_groups; g++)
		kvk_group_rotate(c, &c->groups[g], q, qrot + c->groups[g].off);
	if (c->flags & KVK_FLAG_QJL)
		kvk_tq_sketch(c, qrot, sq);
}

static inline KVK_HD float kvk_load_f16(const uint8_t *p)
{
	return half_to_f32((tkv_half)(p[0] | (unsigned)p[1] << 8));
}

/* The stored scale of rotated coordinate i's stream. */
static inline KVK_HD float kvk_tq_scale(const KvkCodec *c, const uint8_t *code, int i)
{
	int k = i < c->n_hi || c->n_scales == 1 ? 0 : 1;
	return kvk_load_f16(code + c->off_scale[k]);
}

/* The MSE reconstruction of rotated coordinate i: s_g c[idx_i] (values). */
static inline KVK_HD float kvk_tq_value(const KvkCodec *c, const uint8_t *code, int i)
{
	if (i < c->n_hi)
		return kvk_tq_scale(c, code, i) *
		       kvk_floats(c, c->cb_hi)[bitpack_get(code + c->off_hi, c->bits_hi, (size_t)i)];
	return kvk_tq_scale(c, code, i) *
	       kvk_floats(c, c->cb_lo)[bitpack_get(code + c->off_lo, c->bits_lo, (size_t)(i - c->n_hi))];
}

/*
 * <q, x~> for a prepared query (qrot, sq) and a stored key: the estimator
 * of tq_inner_product(), centroids read from cb_hi / cb_lo (the blob's,
 * or copies in faster memory).
 */
static inline KVK_HD float kvk_tq_score(const KvkCodec *c, const float *cb_hi, const float *cb_lo,
					const float *qrot, const float *sq, const uint8_t *code)
{
	float mse = 0.0f;
	if (c->n_hi > 0) {
		float acc = 0.0f;
		for (int i = 0; i < c->n_hi; i++)
			acc += qrot[i] * cb_hi[bitpack_get(code + c->off_hi, c->bits_hi, (size_t)i)];
		mse += kvk_load_f16(code + c->off_scale[0]) * acc;
	}
	if (c->n_hi < c->dim) {
		float acc = 0.0f;
		for (int i = 0; i < c->dim - c->n_hi; i++)
			acc += qrot[c->n_hi + i] *
			       cb_lo[bitpack_get(code + c->off_lo, c->bits_lo, (size_t)i)];
		mse += kvk_load_f16(code + c->off_scale[c->n_scales - 1]) * acc;
	}
	if (!(c->flags & KVK_FLAG_QJL))
		return mse;
	float acc = 0.0f;
	const uint8_t *signs = code + c->off_signs;
	for (int i = 0; i < c->qjl_m; i++)
		acc += (float)(2 * ((signs[i >> 3] >> (i & 7)) & 1) - 1) * sq[i];
	return mse + c->qjl_const * (kvk_load_f16(code + c->off_gamma) * acc);
}

/*
 * s[g] = <qs[g], key> for G <= MG prepared query heads of one kv-head
 * (qs (G, dim) rotated queries, sqs (G, qjl_m) sketched ones; s has MG
 * entries, those from G on are 0): the same
 * estimator as kvk_tq_score(), with each code unpacked and looked up
 * once for all G heads. The CUDA split kernel runs exactly this (MG 4
 * and 8: register arrays need a constant size, and C has no templates,
 * hence the macro); test-kv-kernel checks it against tq_inner_product().
 */
#define KVK_DEFINE_TQ_SCORE_HEADS(MG)                                                                   \
	static inline KVK_HD void kvk_tq_score_heads_##MG(const KvkCodec *c, const float *cbh,            \
							  const float *cbl, const float *qs,              \
							  const float *sqs, int G, const uint8_t *code,   \
							  float *s)                                        \
	{                                                                                                \
		/* the layout in locals: read once, kept in registers by nvcc */                         \
		const int dim = c->dim, n_hi = c->n_hi, bits_hi = c->bits_hi, bits_lo = c->bits_lo;     \
		const int m = c->flags & KVK_FLAG_QJL ? c->qjl_m : 0;                                   \
		const uint8_t *hi_codes = code + c->off_hi, *lo_codes = code + c->off_lo;               \
		float hi[MG], lo[MG], qj[MG];                                                            \
		for (int g = 0; g < MG; g++)                                                             \
			hi[g] = lo[g] = qj[g] = 0.0f;                                                    \
		for (int i = 0; i < n_hi; i++) {                                                         \
			float v = cbh[bitpack_get(hi_codes, bits_hi, (size_t)i)];                        \
			for (int g = 0; g < MG; g++)                                                     \
				if (g < G)                                                               \
					hi[g] += qs[g * dim + i] * v;                                    \
		}                                                                                        \
		for (int i = n_hi; i < dim; i++) {                                                       \
			float v = cbl[bitpack_get(lo_codes, bits_lo, (size_t)(i - n_hi))];               \
			for (int g = 0; g < MG; g++)                                                     \
				if (g < G)                                                               \
					lo[g] += qs[g * dim + i] * v;                                    \
		}                                                                                        \
		float s_hi = kvk_load_f16(code + c->off_scale[0]);                                      \
		float s_lo = kvk_load_f16(code + c->off_scale[c->n_scales - 1]);                        \
		const uint8_t *signs = code + c->off_signs;                                              \
		for (int i = 0; i < m; i++) {                                                            \
			float z = (float)(2 * ((signs[i >> 3] >> (i & 7)) & 1) - 1);                     \
			for (int g = 0; g < MG; g++)                                                     \
				if (g < G)                                                               \
					qj[g] += z * sqs[g * m + i];                                     \
		}                                                                                        \
		float gk = m ? c->qjl_const * kvk_load_f16(code + c->off_gamma) : 0.0f;                  \
		for (int g = 0; g < MG; g++) /* heads past G: 0 */                                      \
			s[g] = s_hi * hi[g] + s_lo * lo[g] + gk * qj[g];                                 \
	}
KVK_DEFINE_TQ_SCORE_HEADS(4)
KVK_DEFINE_TQ_SCORE_HEADS(8)

/* x (dim,) = P^T acc, the output back from the rotated domain (tq_output_finish()). */
static inline KVK_HD void kvk_tq_output_finish(const KvkCodec *c, const float *acc, float *x)
{
	for (int g = 0; g < c->n_groups; g++)
		kvk_group_unrotate(c, &c->groups[g], acc + c->groups[g].off, x);
}

/* ---- f32, f16, q8_0, q4_0 rows (kvquant.h), +h as a flag ---- */

/* Bytes of one stored vector of dim values (dim a multiple of 32 for the block formats). */
static inline KVK_HD uint32_t kvk_plain_row_bytes(int format, int dim)
{
	switch (format) {
	case KV_FORMAT_F32:
		return (uint32_t)dim * 4;
	case KV_FORMAT_F16:
		return (uint32_t)dim * 2;
	case KV_FORMAT_Q8_0:
		return (uint32_t)dim / 32 * 34;
	case KV_FORMAT_Q4_0:
		return (uint32_t)dim / 32 * 18;
	}
	return 0;
}

/* x <- R x = H x / sqrt(d) (kvquant_hadamard()). */
static inline KVK_HD void kvk_hadamard(float *x, int d)
{
	kvk_fwht(x, d);
	const float scale = (float)(1.0 / sqrt((double)d));
	for (int i = 0; i < d; i++)
		x[i] *= scale;
}

static inline KVK_HD void kvk_store_f16(uint8_t *p, float v)
{
	tkv_half h = f32_to_half(v);
	p[0] = (uint8_t)(h & 0xff);
	p[1] = (uint8_t)(h >> 8);
}

/* kvquant_store(): rotate if +h, then quantize (ggml's reference quantizers). */
static inline KVK_HD void kvk_plain_store(int format, bool hadamard, int dim, const float *x,
					  uint8_t *out)
{
	float t[KVK_MAX_DIM];
	for (int i = 0; i < dim; i++)
		t[i] = x[i];
	if (hadamard)
		kvk_hadamard(t, dim);
	switch (format) {
	case KV_FORMAT_F32:
		for (int i = 0; i < dim; i++) {
			uint32_t u = tkv_f32_to_bits(t[i]);
			for (int k = 0; k < 4; k++)
				out[4 * i + k] = (uint8_t)(u >> (8 * k));
		}
		return;
	case KV_FORMAT_F16:
		for (int i = 0; i < dim; i++)
			kvk_store_f16(out + 2 * i, t[i]);
		return;
	case KV_FORMAT_Q8_0:
		for (int b = 0; b < dim / 32; b++) {
			const float *xb = t + 32 * b;
			uint8_t *ob = out + 34 * b;
			float amax = 0.0f;
			for (int j = 0; j < 32; j++)
				amax = fmaxf(amax, fabsf(xb[j]));
			float d = amax / 127.0f;
			float id = d != 0.0f ? 1.0f / d : 0.0f;
			kvk_store_f16(ob, d);
			for (int j = 0; j < 32; j++) {
				float v = xb[j] * id;
				int8_t q = 0;
				if (v == v) {
					v = roundf(v);
					q = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
				}
				ob[2 + j] = (uint8_t)q;
			}
		}
		return;
	case KV_FORMAT_Q4_0:
		for (int b = 0; b < dim / 32; b++) {
			const float *xb = t + 32 * b;
			uint8_t *ob = out + 18 * b;
			float amax = 0.0f, max = 0.0f;
			for (int j = 0; j < 32; j++)
				if (amax < fabsf(xb[j])) { /* strict: the first on ties */
					amax = fabsf(xb[j]);
					max = xb[j];
				}
			const float s = max / -8.0f;
			const float inv = s != 0.0f ? 1.0f / s : 0.0f;
			kvk_store_f16(ob, s);
			for (int j = 0; j < 16; j++) {
				float v0 = xb[j] * inv + 8.5f, v1 = xb[j + 16] * inv + 8.5f;
				int q0 = v0 >= 15.0f ? 15 : v0 <= 0.0f ? 0 : v0 == v0 ? (int)v0 : 0;
				int q1 = v1 >= 15.0f ? 15 : v1 <= 0.0f ? 0 : v1 == v1 ? (int)v1 : 0;
				ob[2 + j] = (uint8_t)(q0 | q1 << 4);
			}
		}
		return;
	}
}

/* Value i of a stored row in the stored domain (rotated for +h). */
static inline KVK_HD float kvk_plain_value(int format, const uint8_t *row, int i)
{
	switch (format) {
	case KV_FORMAT_F32:
		return tkv_bits_to_f32((uint32_t)row[4 * i] | (uint32_t)row[4 * i + 1] << 8 |
				       (uint32_t)row[4 * i + 2] << 16 | (uint32_t)row[4 * i + 3] << 24);
	case KV_FORMAT_F16:
		return kvk_load_f16(row + 2 * i);
	case KV_FORMAT_Q8_0: {
		const uint8_t *b = row + 34 * (i / 32);
		return kvk_load_f16(b) * (float)(int8_t)b[2 + i % 32];
	}
	case KV_FORMAT_Q4_0: {
		const uint8_t *b = row + 18 * (i / 32);
		int j = i % 32;
		int q = j < 16 ? (b[2 + j] & 0x0f) : (b[2 + j - 16] >> 4);
		return kvk_load_f16(b) * (float)(q - 8);
	}
	}
	return 0.0f;
}

/* <q, k~> for a query in the stored domain and a stored key row. */
static inline KVK_HD float kvk_plain_score(int format, int dim, const float *q, const uint8_t *row)
{
	float acc = 0.0f;
	for (int i = 0; i < dim; i++)
		acc += q[i] * kvk_plain_value(format, row, i);
	return acc;
}
