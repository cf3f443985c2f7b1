/*
 * kvformat.c: the registry of KV formats (kvformat.h) and the helpers
 * they share. Adding a format is one line here (and its KvFormat number
 * in kernels/kv_format.h).
 */
#include "engine/kv/kvformat.h"

#include <math.h>
#include <string.h>

/* The format of each KvFormat number. */
static const KvFormatOps *const registry[KV_FORMAT_COUNT] = {
	[KV_FORMAT_F32] = &kvfmt_plain,
	[KV_FORMAT_F16] = &kvfmt_plain,
	[KV_FORMAT_Q8_0] = &kvfmt_plain,
	[KV_FORMAT_Q4_0] = &kvfmt_plain,
	[KV_FORMAT_TQ] = &kvfmt_tq,
	[KV_FORMAT_PK] = &kvfmt_pk,
	[KV_FORMAT_PQ] = &kvfmt_pq,
};

/* The distinct formats, in the order names are tried. */
static const KvFormatOps *const by_name[] = { &kvfmt_plain, &kvfmt_tq, &kvfmt_pk, &kvfmt_pq };

const KvFormatOps *kvformat_of(const KvType *t)
{
	assert(t->format >= 0 && t->format < KV_FORMAT_COUNT && registry[t->format]);
	const KvFormatOps *ops = registry[t->format];
	return (t->centered && !ops->centers) || t->sink ? &kvfmt_centered : ops;
}

const KvFormatOps *kvformat_at(size_t i)
{
	return i < ARRAY_SIZE(by_name) ? by_name[i] : NULL;
}

int kvformat_supports(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
		      Error *err)
{
	if (t->dim != shape->head_dim)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "a type for head_dim %d, the cache's is %d",
				 t->dim, shape->head_dim);
	return kvformat_of(t)->supports(t, role, shape, dev, err);
}

void kvformat_row_kernels_init(KvRowKernels *rk)
{
	rk->scores = kv_attn_scores_get();
	rk->values = kv_attn_values_get();
}

void kvformat_row_scores(const void *st, const KvSideRows *rows, const float *q, const void *prep,
			 int G, int64_t b, int64_t own, int n, float scale, float *scores, int ld)
{
	const KvRowKernels *rk = st;
	rk->scores(&rk->rows, prep, G, kv_side_region(rows, b), n, scale, scores, ld);
}

void kvformat_row_values(const void *st, const uint8_t *region, int64_t b, const float *p, int ld,
			 int G, int n, float *acc, int acc_ld)
{
	const KvRowKernels *rk = st;
	rk->values(&rk->rows, p, ld, G, region, n, acc, acc_ld);
}

void kvformat_exact_scores(const float *x, int d, const float *q, int G, int n, float scale,
			   float *scores, int ld)
{
	kv_attn_exact_scores_get()(x, d, q, G, n, scale, scores, ld);
}

void kvrec_put_floats(uint8_t **p, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t bits;
		memcpy(&bits, &x[i], 4);
		kvrec_put_u32(p, bits);
	}
}

bool kvrec_get_floats(const uint8_t **p, float *x, size_t n)
{
	bool finite = true;
	for (size_t i = 0; i < n; i++) {
		uint32_t bits = kvrec_get_u32(p);
		memcpy(&x[i], &bits, 4);
		finite &= isfinite(x[i]) != 0;
	}
	return finite;
}

void kvrec_put_f16(uint8_t **p, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		put_le(*p, f32_to_half(x[i]), 2);
		*p += 2;
	}
}

bool kvrec_get_f16(const uint8_t **p, float *x, size_t n)
{
	bool finite = true;
	for (size_t i = 0; i < n; i++) {
		x[i] = half_to_f32((tkv_half)get_le(*p, 2));
		*p += 2;
		finite &= isfinite(x[i]) != 0;
	}
	return finite;
}

void kvrec_put_bf16(uint8_t **p, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		put_le(*p, f32_to_bf16(x[i]), 2);
		*p += 2;
	}
}

bool kvrec_get_bf16(const uint8_t **p, float *x, size_t n)
{
	bool finite = true;
	for (size_t i = 0; i < n; i++) {
		x[i] = bf16_to_f32((tkv_bf16)get_le(*p, 2));
		*p += 2;
		finite &= isfinite(x[i]) != 0;
	}
	return finite;
}
