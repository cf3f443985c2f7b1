/*
 * bench-kvattend.c: the CPU time of one decode token's attention at
 * depth (kvcache_attend() of one query at position D over D stored
 * positions), per KV cache type, on one thread, for the default model's
 * attention shape (30 layers, 9 query heads, 3 kv-heads, head_dim 64:
 * the token attends in every layer, so the rows come from memory, not
 * from a cache level that one layer's rows would fit in). Not a test:
 * numbers only, printed as a markdown table.
 *
 * Why CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), best of
 * rounds, types interleaved round by round: on a shared, loaded machine
 * wall-clock decode figures swing with whoever else runs; the thread's own
 * CPU time of a single-threaded call, at its minimum, swings much less
 * (cache and SMT sharing still show). It measures the attention kernels
 * and the store's loop, not the model's matrix products.
 *
 * The stored rows are synthetic but shaped like a real model's: queries
 * and keys with per-pair energies spread over orders of magnitude
 * (exp(1.5 N(0,1)) per RoPE pair, so pair-coded keys get widths from 0 to
 * 8 bits as on real models), keys with a common offset (what centering
 * removes), values N(0,1). Queries are observed before their keys, as the
 * model does.
 *
 *   bench-kvattend [depth [rounds [type...]]]
 *   default: 8000 7 f16 tq4 pk5:tq3.5_nc
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kv/kvstore.h"
#include "engine/kv/kvtype.h"

enum { NH = 9, NKV = 3, D = 64, CHUNK = 256, LAYERS = 30 };

static double cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double rand_u(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return ((double)((x * 0x2545f4914f6cdd1dull) >> 11) + 0.5) / 9007199254740992.0;
}

static float rand_normal(void)
{
	return (float)(sqrt(-2.0 * log(rand_u())) * cos(6.283185307179586 * rand_u()));
}

typedef struct Bench {
	const char *spec;
	KvCache *kv;
	double best_ns;
} Bench;

/* rows (n, heads, D) of N(0,1) times e[pair], plus off[coordinate]. */
static void fill_rows(float *x, int n, int heads, const float *e, const float *off)
{
	for (int i = 0; i < n * heads; i++)
		for (int j = 0; j < D; j++)
			x[(size_t)i * D + j] = rand_normal() * (e ? e[j / 2] : 1.0f) + (off ? off[j] : 0.0f);
}

/* A cache of type spec holding depth positions (and room for the query's). 0 or -1. */
static int bench_new(Bench *b, int depth, const float *qe, const float *ke, const float *koff)
{
	KvCacheShape shape = { .n_layers = LAYERS, .n_heads = NH, .n_kv_heads = NKV, .head_dim = D,
			       .capacity = depth + 1 };
	KvPlan *plan = NULL;
	Error err = { 0 };
	int r = kvplan_from_text(b->spec, LAYERS, NKV, D, &plan, &err);
	if (r == 0)
		r = kvcache_new_host(&shape, plan, 1, &b->kv, &err);
	kvplan_free(plan);
	if (r) {
		fprintf(stderr, "bench-kvattend: %s: %s\n", b->spec, err.msg);
		return -1;
	}
	float *q = malloc(sizeof(float) * CHUNK * NH * D), *k = malloc(sizeof(float) * CHUNK * NKV * D);
	float *v = malloc(sizeof(float) * CHUNK * NKV * D);
	if (!q || !k || !v) {
		free(q), free(k), free(v);
		return -1;
	}
	rng_state = 0x9e3779b97f4a7c15ull; /* every type stores the same rows */
	for (int p = 0; p < depth && r == 0; p += CHUNK) {
		int n = depth - p < CHUNK ? depth - p : CHUNK;
		fill_rows(q, n, NH, qe, NULL);
		fill_rows(k, n, NKV, ke, koff);
		fill_rows(v, n, NKV, NULL, NULL);
		for (int l = 0; l < LAYERS && r == 0; l++) {
			kvcache_observe(b->kv, l, p, n, q);
			r = kvcache_append(b->kv, l, p, n, k, v);
		}
		kvcache_set_n_tokens(b->kv, p + n);
	}
	free(q), free(k), free(v);
	if (r) {
		fprintf(stderr, "bench-kvattend: %s: append failed (%d)\n", b->spec, r);
		return -1;
	}
	b->best_ns = 1e300;
	return 0;
}

int main(int argc, char **argv)
{
	int depth = argc > 1 ? atoi(argv[1]) : 8000, rounds = argc > 2 ? atoi(argv[2]) : 7;
	static const char *const defaults[] = { "f16", "tq4", "pk5:tq3.5_nc" };
	int n_types = argc > 3 ? argc - 3 : 3;
	if (depth < 64 || depth > 1 << 20 || rounds < 1 || n_types > 16) {
		fprintf(stderr, "usage: bench-kvattend [depth (64..2^20) [rounds [type...]]]\n");
		return 2;
	}
	float qe[D / 2], ke[D / 2], koff[D];
	for (int i = 0; i < D / 2; i++) {
		qe[i] = expf(1.5f * rand_normal());
		ke[i] = expf(0.75f * rand_normal());
	}
	for (int j = 0; j < D; j++)
		koff[j] = 2.0f * rand_normal();

	Bench b[16];
	for (int t = 0; t < n_types; t++) {
		b[t] = (Bench){ .spec = argc > 3 ? argv[3 + t] : defaults[t] };
		if (bench_new(&b[t], depth, qe, ke, koff) < 0)
			return 1;
	}
	float q[NH * D], k[NKV * D], v[NKV * D], out[NH * D];
	fill_rows(q, 1, NH, qe, NULL);
	fill_rows(k, 1, NKV, ke, koff);
	fill_rows(v, 1, NKV, NULL, NULL);
	for (int t = 0; t < n_types; t++) { /* the query's own position, as decode appends it */
		for (int l = 0; l < LAYERS; l++) {
			kvcache_observe(b[t].kv, l, depth, 1, q);
			if (kvcache_append(b[t].kv, l, depth, 1, k, v) != 0)
				return 1;
		}
		kvcache_set_n_tokens(b[t].kv, depth + 1);
	}
	for (int round = 0; round < rounds; round++)
		for (int t = 0; t < n_types; t++) {
			double t0 = cpu_ns();
			for (int it = 0; it < 3; it++)
				for (int l = 0; l < LAYERS; l++)
					if (kvcache_attend(b[t].kv, NULL, l, depth, 1, q, out) != 0)
						return 1;
			double ns = (cpu_ns() - t0) / 3;
			if (ns < b[t].best_ns)
				b[t].best_ns = ns;
		}
	printf("| KV type (depth %d, 1 thread) | ms per token (%d layers) | ns per position per kv-head | vs %s |\n",
	       depth, LAYERS, b[0].spec);
	printf("|---|---|---|---|\n");
	for (int t = 0; t < n_types; t++) {
		printf("| %s | %.2f | %.2f | %.2fx |\n", b[t].spec, b[t].best_ns / 1e6,
		       b[t].best_ns / ((double)(depth + 1) * NKV * LAYERS), b[0].best_ns / b[t].best_ns);
		kvcache_free(b[t].kv);
	}
	return 0;
}
