/*
 * kvcenter.c: centered keys (kvcenter.h): the exact first block, the
 * choice of mu, the scores' frame and the record.
 */
#include "engine/kv/kvcenter.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kvformat.h"

#define BT KV_BLOCK_TOKENS

int kvcenter_init(KvCenter *c, int dim)
{
	*c = (KvCenter){ .dim = dim };
	c->mu = calloc_array((size_t)dim, sizeof(float));
	c->first = calloc_array((size_t)BT * dim, sizeof(float));
	if (!c->mu || !c->first) {
		kvcenter_fini(c);
		return -ENOMEM;
	}
	return 0;
}

void kvcenter_fini(KvCenter *c)
{
	free(c->mu);
	free(c->first);
	c->mu = c->first = NULL;
}

size_t kvcenter_bytes(const KvCenter *c)
{
	return (1 + (size_t)BT) * (size_t)c->dim * sizeof(float);
}

int kvcenter_keep(KvCenter *c, int64_t pos0, int64_t n, const float *x, size_t stride)
{
	int d = c->dim;
	for (int64_t t = 0; t < n && pos0 + t < BT; t++)
		memcpy(c->first + (pos0 + t) * d, x + (size_t)t * stride, (size_t)d * sizeof(float));
	if (c->chosen || pos0 + n < BT)
		return 0;
	for (int i = 0; i < d; i++) {
		double sum = 0;
		for (int p = 1; p < BT; p++)
			sum += c->first[(size_t)p * d + i];
		float mu = (float)(sum / (BT - 1));
		if (!isfinite(mu)) {
			memset(c->mu, 0, (size_t)d * sizeof(float));
			return -EINVAL;
		}
		c->mu[i] = mu;
	}
	c->chosen = true;
	return 0;
}

void kvcenter_center(const KvCenter *c, int64_t pos, const float *x, float *ret)
{
	if (pos < BT) {
		memset(ret, 0, (size_t)c->dim * sizeof(float));
		return;
	}
	assert(c->chosen);
	for (int i = 0; i < c->dim; i++)
		ret[i] = x[i] - c->mu[i];
}

void kvcenter_qmu(const KvCenter *c, const float *q, int G, float scale, float *qmu)
{
	int d = c->dim;
	for (int g = 0; g < G; g++) {
		float sum = 0.0f;
		for (int i = 0; i < d; i++)
			sum += q[(size_t)g * d + i] * c->mu[i];
		qmu[g] = sum * scale;
	}
}

void kvcenter_scores(const KvCenter *c, const float *q, int G, int64_t b, int n, float scale,
		     const float *qmu, float *scores, int ld)
{
	if (b == 0) {
		kvformat_exact_scores(c->first, c->dim, q, G, n, scale, scores, ld);
		return;
	}
	for (int g = 0; g < G; g++)
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] += qmu[g];
}

size_t kvcenter_record_bytes(int dim)
{
	return 8 + (1 + (size_t)BT) * (size_t)dim * sizeof(float);
}

void kvcenter_record_save(const KvCenter *c, uint8_t **p)
{
	kvrec_put_u32(p, c->chosen);
	kvrec_put_u32(p, 0);
	kvrec_put_floats(p, c->mu, (size_t)c->dim);
	kvrec_put_floats(p, c->first, (size_t)BT * c->dim);
}

int kvcenter_record_load(KvCenter *c, int64_t n_kv, const uint8_t **p, Error *err)
{
	int d = c->dim;
	uint32_t chosen = kvrec_get_u32(p), reserved = kvrec_get_u32(p);
	/* positions past block 0 are stored centered: their mu must be there */
	if (chosen > 1 || reserved != 0 || (!chosen && n_kv > BT))
		return error_set(err, KVFORMAT_E_CORRUPT, "centered-key state %u with %lld tokens",
				 chosen, (long long)n_kv);
	if (!kvrec_get_floats(p, c->mu, (size_t)d) || !kvrec_get_floats(p, c->first, (size_t)BT * d))
		return error_set(err, KVFORMAT_E_CORRUPT, "a centered-key mean or key not finite");
	for (int i = 0; !chosen && i < d; i++)
		if (c->mu[i] != 0.0f)
			return error_set(err, KVFORMAT_E_CORRUPT, "a centered-key mean before one was chosen");
	c->chosen = chosen;
	return 0;
}
