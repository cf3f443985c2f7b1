/*
 * kvropemean.c: the keys' mean before RoPE and the block centers it gives
 * (kvropemean.h): the phase tables, the mean, the centers, and the
 * centers' part of the scores.
 */
#include "engine/kv/kvropemean.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BT KV_BLOCK_TOKENS
#define TAB_ENTRIES (1 + KVROPE_LEVELS * KVROPE_RADIX)

static_assert(KV_BLOCK_TOKENS == 32, "block b is positions 32 b .. 32 b + 31: its middle is 32 b + 15.5");
static_assert(sizeof(((Rope *)0)->inv_freq) / sizeof(float) == 256, "at most 256 rotated pairs");

int kvropemean_init(KvRopeMean *r, int dim, const Rope *rope)
{
	*r = (KvRopeMean){ .dim = dim };
	int n_rot = rope ? rope->n_rot : 0;
	if (n_rot < 0 || n_rot > dim || n_rot % 2)
		return -EINVAL;
	r->n_pairs = n_rot / 2;
	r->stride = rope && rope->style == ROPE_STYLE_NEOX ? 1 : 2;
	r->partner = rope && rope->style == ROPE_STYLE_NEOX ? r->n_pairs : 1;
	r->m = calloc_array((size_t)dim, sizeof(float));
	if (!r->m)
		return -ENOMEM;
	if (r->n_pairs == 0)
		return 0;
	size_t P = (size_t)r->n_pairs;
	r->tab = calloc_array(TAB_ENTRIES * P * 2, sizeof(float));
	r->theta = calloc_array(P, sizeof(double));
	if (!r->tab || !r->theta) {
		kvropemean_fini(r);
		return -ENOMEM;
	}
	/* entry 0: theta 15.5; entry 1 + l RADIX + k: theta 32 k RADIX^l (k = 0: the identity) */
	for (int e = 0; e < TAB_ENTRIES; e++) {
		double turns;
		if (e == 0)
			turns = (BT - 1) / 2.0;
		else
			turns = (double)BT * ((e - 1) % KVROPE_RADIX) *
				pow((double)KVROPE_RADIX, (double)((e - 1) / KVROPE_RADIX));
		for (size_t i = 0; i < P; i++) {
			double a = turns * (double)rope->inv_freq[i];
			r->tab[((size_t)e * P + i) * 2] = (float)cos(a);
			r->tab[((size_t)e * P + i) * 2 + 1] = (float)sin(a);
		}
	}
	/* the angles of kvropemean_choose(): the model's, p * inv_freq in double */
	for (size_t i = 0; i < P; i++)
		r->theta[i] = (double)rope->inv_freq[i];
	return 0;
}

void kvropemean_fini(KvRopeMean *r)
{
	free(r->m);
	free(r->tab);
	free(r->theta);
	r->m = r->tab = NULL;
	r->theta = NULL;
}

size_t kvropemean_bytes(const KvRopeMean *r)
{
	return (size_t)r->dim * sizeof(float) + (r->tab ? TAB_ENTRIES * (size_t)r->n_pairs * 2 * sizeof(float) +
						     (size_t)r->n_pairs * sizeof(double) : 0);
}

void kvropemean_choose(KvRopeMean *r, const KvCenter *c)
{
	int d = r->dim;
	assert(c->dim == d);
	if (!c->chosen) {
		memset(r->m, 0, (size_t)d * sizeof(float));
		return;
	}
	memcpy(r->m, c->mu, (size_t)d * sizeof(float));
	for (int i = 0; i < r->n_pairs; i++) {
		int j = i * r->stride, j2 = j + r->partner;
		double th = r->theta[i], sx = 0, sy = 0;
		for (int p = 1; p < BT; p++) {
			double a = (double)p * th, cs = cos(a), sn = sin(a);
			double x = c->first[(size_t)p * d + j], y = c->first[(size_t)p * d + j2];
			sx += x * cs + y * sn; /* R(-a) (x, y) */
			sy += -x * sn + y * cs;
		}
		double D = th == 0.0 ? 1.0 : sin(16.0 * th) / (32.0 * sin(th / 2.0));
		r->m[j] = (float)(D * sx / (BT - 1));
		r->m[j2] = (float)(D * sy / (BT - 1));
	}
}

/* cos, sin (n_pairs,) of theta_i (32 b + 15.5). */
static void phase(const KvRopeMean *r, int64_t b, float *cs, float *sn)
{
	int P = r->n_pairs;
	assert(b >= 0 && b < (int64_t)1 << (5 * KVROPE_LEVELS));
	for (int i = 0; i < P; i++) {
		cs[i] = r->tab[2 * i];
		sn[i] = r->tab[2 * i + 1];
	}
	int64_t rest = b;
	for (int l = 0; l < KVROPE_LEVELS && rest > 0; l++, rest /= KVROPE_RADIX) {
		int k = (int)(rest % KVROPE_RADIX);
		if (k == 0)
			continue; /* the identity */
		const float *t = r->tab + (size_t)(1 + l * KVROPE_RADIX + k) * P * 2;
		for (int i = 0; i < P; i++) {
			float c0 = cs[i], s0 = sn[i];
			cs[i] = c0 * t[2 * i] - s0 * t[2 * i + 1];
			sn[i] = c0 * t[2 * i + 1] + s0 * t[2 * i];
		}
	}
}

void kvropemean_center(const KvRopeMean *r, int64_t b, float *ret)
{
	float cs[256], sn[256];
	memcpy(ret, r->m, (size_t)r->dim * sizeof(float));
	if (r->n_pairs == 0)
		return;
	phase(r, b, cs, sn);
	for (int i = 0; i < r->n_pairs; i++) {
		int j = i * r->stride, j2 = j + r->partner;
		float x = r->m[j], y = r->m[j2];
		ret[j] = x * cs[i] - y * sn[i];
		ret[j2] = x * sn[i] + y * cs[i];
	}
}

void kvropemean_query(const KvRopeMean *r, const float *q, int G, float scale, float *prep)
{
	int d = r->dim, P = r->n_pairs;
	size_t nf = kvropemean_query_floats(r);
	for (int g = 0; g < G; g++) {
		const float *qg = q + (size_t)g * d;
		float *out = prep + (size_t)g * nf;
		float sum = 0.0f; /* the unturned channels: all of them without RoPE, as kvcenter_qmu() */
		for (int j = 2 * P; j < d; j++)
			sum += qg[j] * r->m[j];
		out[2 * P] = sum * scale;
		for (int i = 0; i < P; i++) {
			int j = i * r->stride, j2 = j + r->partner;
			float u = qg[j], v = qg[j2], x = r->m[j], y = r->m[j2];
			out[2 * i] = (u * x + v * y) * scale;
			out[2 * i + 1] = (v * x - u * y) * scale;
		}
	}
}

void kvropemean_add(const KvRopeMean *r, const float *prep, int G, int64_t b, int n, float *scores,
		    int ld)
{
	float cs[256], sn[256];
	int P = r->n_pairs;
	size_t nf = kvropemean_query_floats(r);
	if (P > 0)
		phase(r, b, cs, sn);
	for (int g = 0; g < G; g++) {
		const float *a = prep + (size_t)g * nf;
		float corr = a[2 * P];
		for (int i = 0; i < P; i++)
			corr += a[2 * i] * cs[i] + a[2 * i + 1] * sn[i];
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] += corr;
	}
}
