/*
 * gpu-attn-bench.c: decode attention alone on the GPU (issue 8's
 * benchmark). Llama-3-8B shapes (32 query heads, 8 kv-heads, head_dim
 * 128), one layer, contexts 4K..128K, batch 1 and 16, for our f16 kernel
 * and the TurboQuant types. Prints a markdown table: time per call
 * (median of rounds), the K/V bytes one call reads, achieved GB/s and the
 * share of the device's peak bandwidth, and the speed-up over f16 at the
 * same context and batch.
 *
 * Usage: gpu-attn-bench [TYPES...]   (default: f16 q8_0 q4_0 tq4 tq3)
 * Environment: CONTEXTS (4096,16384,65536,131072), BATCHES (1,16),
 * ROUNDS (5), CALLS (20 per round). Exits 77 without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend/kv_cuda_host.h"
#include "engine/kv/kvstore.h"
#include "engine/kv/kvtype.h"

#define HEADS 32
#define KV_HEADS 8
#define DIM 128
#define FILL_CHUNK 8192
#define MAX_LIST 16

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_list(const char *env, const char *def, long *out)
{
	const char *s = getenv(env);
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", s && *s ? s : def);
	int n = 0;
	for (char *tok = strtok(buf, ","); tok && n < MAX_LIST; tok = strtok(NULL, ","))
		out[n++] = strtol(tok, NULL, 10);
	return n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

typedef struct Result {
	char type[32];
	long ctx, batch;
	double us;
} Result;

static Result results[256];
static int n_results;

static double f16_time(long ctx, long batch)
{
	for (int i = 0; i < n_results; i++)
		if (!strcmp(results[i].type, "f16") && results[i].ctx == ctx && results[i].batch == batch)
			return results[i].us;
	return 0.0;
}

static int bench_type(const char *spec, const long *ctxs, int n_ctx, const long *batches,
		      int n_batch, int rounds, int calls, double peak)
{
	long max_ctx = 0, max_batch = 0;
	for (int i = 0; i < n_ctx; i++)
		max_ctx = ctxs[i] > max_ctx ? ctxs[i] : max_ctx;
	for (int i = 0; i < n_batch; i++)
		max_batch = batches[i] > max_batch ? batches[i] : max_batch;

	/* a one-token CPU cache supplies the codecs (seeds as the engine derives them) */
	KvCacheShape cs = { .n_layers = 1, .n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = DIM,
			    .capacity = 64 };
	Error err = { 0 };
	KvPlan *plan = NULL;
	KvCache *cpu = NULL;
	CudaKv *gpu = NULL;
	float *dk = NULL, *dv = NULL, *dq = NULL, *dout = NULL;
	int status = 1;
	if (kvplan_from_text(spec, 1, KV_HEADS, DIM, &plan, &err) ||
	    kvcache_new_quant(&cs, plan, 1, &cpu, &err)) {
		fprintf(stderr, "%s: %s\n", spec, err.msg);
		return 1;
	}
	float one[KV_HEADS * DIM];
	for (int i = 0; i < KV_HEADS * DIM; i++)
		one[i] = (float)((i * 7919) % 13) - 6.0f;
	kvcache_append(cpu, 0, 0, 1, one, one); /* outlier types choose their masks here */
	if (cuda_kv_new_like(cpu, 0, (int)max_batch, max_ctx, &gpu, &err)) {
		fprintf(stderr, "%s: %s\n", spec, err.msg);
		kvcache_free(cpu);
		kvplan_free(plan);
		return 1;
	}

	/* fill sequence 0 from random device data, then copy it to the others */
	size_t chunk = (size_t)FILL_CHUNK * KV_HEADS * DIM;
	dk = cuda_alloc(chunk * sizeof(float));
	dv = cuda_alloc(chunk * sizeof(float));
	if (!dk || !dv) {
		fprintf(stderr, "%s: out of device memory for the fill\n", spec);
		goto out;
	}
	double t0 = now_s();
	for (long pos = 0; pos < max_ctx; pos += FILL_CHUNK) {
		long n = max_ctx - pos < FILL_CHUNK ? max_ctx - pos : FILL_CHUNK;
		cuda_fill_random(dk, chunk, 2 * (uint64_t)pos + 1, 1.0f);
		cuda_fill_random(dv, chunk, 2 * (uint64_t)pos + 2, 1.0f);
		cuda_kv_append(gpu, 0, pos, n, dk, dv);
	}
	for (int s = 1; s < max_batch; s++)
		cuda_kv_copy_seq(gpu, s, 0);
	char msg[256] = "";
	if (cuda_sync(msg, sizeof(msg))) {
		fprintf(stderr, "%s: fill: %s\n", spec, msg);
		goto out;
	}
	fprintf(stderr, "%s: filled %ld x %ld tokens in %.1f s (%.1f MiB on the device)\n", spec,
		max_batch, max_ctx, now_s() - t0, cuda_kv_bytes(gpu) / 1048576.0);

	size_t qn = (size_t)max_batch * HEADS * DIM;
	dq = cuda_alloc(qn * sizeof(float));
	dout = cuda_alloc(qn * sizeof(float));
	if (!dq || !dout) {
		fprintf(stderr, "%s: out of device memory for the queries\n", spec);
		goto out;
	}
	cuda_fill_random(dq, qn, 99, 1.0f);
	double row_bytes = cuda_kv_row_bytes(gpu, false) + cuda_kv_row_bytes(gpu, true);

	for (int b = 0; b < n_batch; b++)
		for (int c = 0; c < n_ctx; c++) {
			int64_t pos[CUDA_KV_MAX_SEQS];
			for (int s = 0; s < batches[b]; s++)
				pos[s] = ctxs[c] - 1;
			double times[64];
			for (int w = 0; w < 3; w++)
				cuda_kv_attend(gpu, pos, (int)batches[b], 1, dq, dout);
			for (int r = 0; r < rounds && r < 64; r++) {
				cuda_sync(NULL, 0);
				double start = now_s();
				for (int i = 0; i < calls; i++)
					cuda_kv_attend(gpu, pos, (int)batches[b], 1, dq, dout);
				if (cuda_sync(msg, sizeof(msg))) {
					fprintf(stderr, "%s: attend: %s\n", spec, msg);
					goto out;
				}
				times[r] = (now_s() - start) / calls;
			}
			qsort(times, (size_t)rounds, sizeof(double), cmp_double);
			double t = times[rounds / 2];
			double bytes = row_bytes * KV_HEADS * (double)ctxs[c] * (double)batches[b];
			double gbs = bytes / t / 1e9;
			Result *res = &results[n_results++];
			snprintf(res->type, sizeof(res->type), "%s", spec);
			res->ctx = ctxs[c];
			res->batch = batches[b];
			res->us = t * 1e6;
			double f16 = f16_time(ctxs[c], batches[b]);
			char speed[32] = "";
			if (f16 > 0.0)
				snprintf(speed, sizeof(speed), "%.2fx", f16 / res->us);
			printf("| %-8s | %5ld | %6ld | %9.1f | %8.1f | %7.0f | %5.1f%% | %s |\n", spec,
			       batches[b], ctxs[c], res->us, bytes / 1048576.0, gbs,
			       peak > 0 ? 100.0 * gbs / peak : 0.0, speed);
			fflush(stdout);
		}
	status = 0;
out: /* a CudaKv of several GB must not outlive its type */
	cuda_free(dq);
	cuda_free(dout);
	cuda_free(dk);
	cuda_free(dv);
	cuda_kv_free(gpu);
	kvcache_free(cpu);
	kvplan_free(plan);
	return status;
}

int main(int argc, char **argv)
{
	if (cuda_device_count() < 1) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	char name[128] = "";
	int sms = 0;
	double peak = 0.0;
	cuda_device_info(name, sizeof(name), &sms, &peak);
	long ctxs[MAX_LIST], batches[MAX_LIST];
	int n_ctx = parse_list("CONTEXTS", "4096,16384,65536,131072", ctxs);
	int n_batch = parse_list("BATCHES", "1,16", batches);
	const char *r = getenv("ROUNDS"), *c = getenv("CALLS");
	int rounds = r ? atoi(r) : 5, calls = c ? atoi(c) : 20;
	if (rounds < 1 || rounds > 64)
		rounds = 5;
	if (calls < 1)
		calls = 20;

	printf("decode attention, one layer: %d query heads, %d kv-heads, head_dim %d; %s, %d SMs, "
	       "peak %.0f GB/s; median of %d rounds of %d calls\n\n", HEADS, KV_HEADS, DIM, name, sms,
	       peak, rounds, calls);
	printf("| KV | batch | context | us/call | MiB read | GB/s | of peak | vs f16 |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	static const char *const defaults[] = { "f16", "q8_0", "q4_0", "tq4", "tq3" };
	int failed = 0;
	if (argc > 1)
		for (int i = 1; i < argc; i++)
			failed |= bench_type(argv[i], ctxs, n_ctx, batches, n_batch, rounds, calls, peak);
	else
		for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
			failed |= bench_type(defaults[i], ctxs, n_ctx, batches, n_batch, rounds, calls,
					     peak);
	return failed;
}
