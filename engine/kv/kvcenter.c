/*
 * kvcenter.c: centered keys (kvcenter.h): the first block (binary16), the
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

/* mu from the keys of positions 1..31. 0 or -EINVAL (not finite: nothing chosen). */
static int center_choose(KvCenter *c)
{
	int d = c->dim;
	for (int i = 0; i < d; i++) {
		double sum = 0;
		for (int p = 1; p < BT; p++)
			sum += c->first[(size_t)p * d + i];
		float mu = (float)(sum / (BT - 1));
		if (!isfinite(mu)) {
			memset(c->mu, 0, (size_t)d * sizeof(float));
			c->chosen = false;
			return -EINVAL;
		}
		c->mu[i] = mu;
	}
	c->chosen = true;
	return 0;
}

int kvcenter_keep(KvCenter *c, int64_t pos0, int64_t n, const float *x, size_t stride)
{
	int d = c->dim;
	for (int64_t t = 0; t < n && pos0 + t < BT; t++) {
		float *row = c->first + (pos0 + t) * d;
		for (int i = 0; i < d; i++)
			row[i] = kvformat_round_f16(x[(size_t)t * stride + i]);
	}
	/* chosen again whenever position 31 is (re)appended: mu follows the keys there */
	if (pos0 >= BT || pos0 + n < BT)
		return 0;
	return center_choose(c);
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

static int64_t first_rows(int64_t n_kv)
{
	return MIN(n_kv, (int64_t)BT);
}

size_t kvcenter_record_bytes(int dim, int64_t n_kv)
{
	return (size_t)first_rows(n_kv) * (size_t)dim * 2;
}

void kvcenter_record_save(const KvCenter *c, int64_t n_kv, uint8_t **p)
{
	kvrec_put_f16(p, c->first, (size_t)first_rows(n_kv) * c->dim);
}

int kvcenter_record_load(KvCenter *c, int64_t n_kv, const uint8_t **p, Error *err)
{
	int d = c->dim;
	int64_t m = first_rows(n_kv);
	memset(c->first, 0, (size_t)BT * d * sizeof(float));
	memset(c->mu, 0, (size_t)d * sizeof(float));
	c->chosen = false;
	if (!kvrec_get_f16(p, c->first, (size_t)m * d))
		return error_set(err, KVFORMAT_E_CORRUPT, "a centered key of block 0 not finite");
	/* positions past block 0 are stored centered: their mu comes back from block 0 */
	if (n_kv >= BT && center_choose(c) != 0)
		return error_set(err, KVFORMAT_E_CORRUPT, "the centered-key mean is not finite");
	return 0;
}
