/*
 * test-gpu-kvattn.c: the CUDA KV cache (kernels/cuda/kv_cuda.h) against
 * the CPU store (engine/kv/kvstore.h) for every KV type: the append kernel
 * must write byte-identical rows, decode and prefill attention must match
 * the CPU's within float tolerance, with GQA, a context that is not a
 * multiple of the block size, forced multi-split runs and a batch of
 * sequences at different lengths.
 *
 * Exits 77 (skipped) where there is no GPU, 1 on any mismatch. Plain C
 * without Check, so tests/gpu/run.sh can build it on a bare GPU machine.
 * With --probe it only checks that the CUDA runtime can run a kernel
 * here (run.sh's first step: a driver older than the toolkit fails it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/kv_cuda_host.h"
#include "engine/kv/kvstore.h"
#include "engine/kv/kvtype.h"
#include "tests/gpu/gpu-test-util.h"

#define N_CTX 777   /* not a multiple of 32 */
#define N_FIRST 500 /* the prefill part of the appends; the rest go one token at a time */
#define N_PREFILL 16
#define TOL 2e-3    /* |gpu - cpu| / max |cpu| per output */

static const char *const specs[] = {
	"f32", "f16", "q8_0", "q4_0", "q8_0+h", "q4_0+h",
	"tq1", "tq2", "tq3", "tq4", "tq5", "tq8", "tq2.5", "tq3.5", "tq4.5",
	"tq5_nc:tq3.5_nc", "tq4:q8_0", "f16:tq4", "tq3+qjl:tq3", "tq4+sqjl:tq4", "tq3h16o:tq3h16o",
	"tq4,0-0=tq8:tq8",
};

typedef struct Shape {
	int n_heads, n_kv_heads, dim;
} Shape;

/*
 * GQA groups of 4 and 3 (the 4-head split kernels), 8 and 6 (the 8-head
 * ones); head_dim 64, 128, 256 and 32: 2, 4, 8 and 1 value dims per lane.
 */
static const Shape shapes[] = { { 8, 2, 64 }, { 12, 4, 128 }, { 16, 2, 256 }, { 6, 1, 32 } };

/* Rows < n_valid of every block of seq: GPU bytes against the CPU store's. Returns rows that differ. */
static int compare_blocks(const KvCache *cpu, const CudaKv *gpu, int seq, int64_t n_tok)
{
	size_t bb = cuda_kv_block_bytes(gpu), kb = cuda_kv_row_bytes(gpu, false),
	       vb = cuda_kv_row_bytes(gpu, true);
	uint8_t *buf = malloc(bb);
	int bad = 0;
	for (int h = 0; h < cpu->shape.n_kv_heads; h++)
		for (int64_t b = 0; b * 32 < n_tok; b++) {
			const uint8_t *want = kvstore_block(cpu, 0, h, b);
			if (!want || bb != kvstore_block_bytes(cpu, 0) ||
			    cuda_kv_blocks_read(gpu, seq, h, b, 1, buf, bb)) {
				bad++;
				continue;
			}
			int valid = (int)(n_tok - b * 32 < 32 ? n_tok - b * 32 : 32);
			for (int j = 0; j < valid; j++) {
				bad += memcmp(buf + j * kb, want + j * kb, kb) != 0;
				bad += memcmp(buf + 32 * kb + j * vb, want + 32 * kb + j * vb, vb) != 0;
			}
		}
	free(buf);
	return bad;
}

static int check(const char *spec, const Shape *sh)
{
	int H = sh->n_heads, KVH = sh->n_kv_heads, D = sh->dim, failed = 0;
	int64_t cap = N_CTX + 64;
	KvCacheShape cs = { .n_layers = 1, .n_heads = H, .n_kv_heads = KVH, .head_dim = D,
			    .capacity = cap };
	Error err = { 0 };
	KvPlan *plan = NULL;
	KvCache *cpu = NULL;
	if (kvplan_from_text(spec, 1, KVH, D, &plan, &err) ||
	    kvcache_new_quant(&cs, plan, 7, &cpu, &err)) {
		printf("FAIL %-18s d%-3d: %s\n", spec, D, err.msg);
		kvplan_free(plan);
		return 1;
	}

	/* the CPU store: a prefill batch, then one token at a time */
	float *k = rand_rows(N_CTX, KVH * D), *v = rand_rows(N_CTX, KVH * D);
	size_t row = (size_t)KVH * D;
	if (kvcache_append(cpu, 0, 0, N_FIRST, k, v))
		failed = 1;
	kvcache_set_n_tokens(cpu, N_FIRST);
	for (int64_t t = N_FIRST; t < N_CTX; t++) {
		failed |= kvcache_append(cpu, 0, t, 1, k + t * row, v + t * row) != 0;
		kvcache_set_n_tokens(cpu, t + 1);
	}

	CudaKv *gpu = NULL;
	if (cuda_kv_new_like(cpu, 0, 2, cap, &gpu, &err)) {
		printf("FAIL %-18s d%-3d: %s\n", spec, D, err.msg);
		free(k);
		free(v);
		kvcache_free(cpu);
		kvplan_free(plan);
		return 1;
	}
	float *dk = upload(k, N_CTX * row * sizeof(float)), *dv = upload(v, N_CTX * row * sizeof(float));
	/* sequence 0 as the CPU was filled, sequence 1 in one batch */
	failed |= cuda_kv_append(gpu, 0, 0, N_FIRST, dk, dv) != 0;
	for (int64_t t = N_FIRST; t < N_CTX; t++)
		failed |= cuda_kv_append(gpu, 0, t, 1, dk + t * row, dv + t * row) != 0;
	failed |= cuda_kv_append(gpu, 1, 0, N_CTX, dk, dv) != 0;
	char msg[256] = "";
	if (cuda_sync(msg, sizeof(msg))) {
		printf("FAIL %-18s d%-3d: append: %s\n", spec, D, msg);
		failed = 1;
	}
	int bad0 = compare_blocks(cpu, gpu, 0, N_CTX), bad1 = compare_blocks(cpu, gpu, 1, N_CTX);

	/* decode: sequence 0 at the end, sequence 1 at a shorter context; then prefill */
	size_t qrow = (size_t)H * D;
	float *q = rand_rows(2 * N_PREFILL, (int)qrow);
	float *want = malloc(2 * N_PREFILL * qrow * sizeof(float));
	float *got = malloc(2 * N_PREFILL * qrow * sizeof(float));
	float *dq = upload(q, 2 * N_PREFILL * qrow * sizeof(float));
	float *dout = cuda_alloc(2 * N_PREFILL * qrow * sizeof(float));
	double err_dec = 0.0, err_pre = 0.0, err_split = 0.0;
	const int64_t pos_short = 300;

	kvcache_attend(cpu, NULL, 0, N_CTX - 1, 1, q, want);
	kvcache_attend(cpu, NULL, 0, pos_short, 1, q + qrow, want + qrow);
	static const int forced[] = { 0, 1, 3 };
	for (size_t f = 0; f < sizeof(forced) / sizeof(forced[0]); f++) {
		cuda_kv_set_split(gpu, forced[f]);
		/* the decode batch: sequence s's query is row s of q */
		int64_t pos[2] = { N_CTX - 1, pos_short };
		failed |= cuda_kv_attend(gpu, pos, 2, 1, dq, dout) != 0;
		failed |= cuda_sync(msg, sizeof(msg)) != 0;
		failed |= cuda_download(got, dout, 2 * qrow * sizeof(float)) != 0;
		double e = rel_err(got, want, 2 * qrow);
		if (f == 0)
			err_dec = e;
		else
			err_split = fmax(err_split, e);
	}
	cuda_kv_set_split(gpu, 0);

	int64_t pos_pre = N_CTX - N_PREFILL;
	kvcache_attend(cpu, NULL, 0, pos_pre, N_PREFILL, q, want);
	failed |= cuda_kv_attend(gpu, &pos_pre, 1, N_PREFILL, dq, dout) != 0;
	failed |= cuda_sync(msg, sizeof(msg)) != 0;
	failed |= cuda_download(got, dout, N_PREFILL * qrow * sizeof(float)) != 0;
	err_pre = rel_err(got, want, N_PREFILL * qrow);

	failed |= bad0 || bad1 || !(err_dec <= TOL) || !(err_pre <= TOL) || !(err_split <= TOL);
	printf("%s %-18s d%-3d G%d: rows differing %d/%d, decode err %.2e, split %.2e, prefill err %.2e\n",
	       failed ? "FAIL" : "ok  ", spec, D, H / KVH, bad0, bad1, err_dec, err_split, err_pre);

	cuda_free(dq);
	cuda_free(dout);
	cuda_free(dk);
	cuda_free(dv);
	free(q);
	free(want);
	free(got);
	free(k);
	free(v);
	cuda_kv_free(gpu);
	kvcache_free(cpu);
	kvplan_free(plan);
	return failed;
}

/* One allocation, one kernel, one copy back: 0, or 1 with CUDA's message. */
static int probe(void)
{
	float *d = cuda_alloc(256 * sizeof(float)), h[256];
	char msg[256] = "";
	int r = !d || cuda_fill_random(d, 256, 1, 1.0f) || cuda_sync(msg, sizeof(msg)) ||
		cuda_download(h, d, sizeof(h));
	cuda_free(d);
	printf("probe: %s\n", r ? (msg[0] ? msg : "a CUDA call failed") : "a kernel ran");
	return r;
}

int main(int argc, char **argv)
{
	if (cuda_device_count() < 1) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	if (argc > 1 && strcmp(argv[1], "--probe") == 0)
		return probe();
	char name[128] = "";
	int sms = 0;
	double peak = 0.0;
	cuda_device_info(name, sizeof(name), &sms, &peak);
	printf("device: %s, %d SMs, peak %.0f GB/s\n", name, sms, peak);

	int failures = 0, runs = 0;
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++, runs++)
			failures += check(specs[i], &shapes[s]);
	printf("%d of %d GPU/CPU checks failed\n", failures, runs);
	return failures ? 1 : 0;
}
