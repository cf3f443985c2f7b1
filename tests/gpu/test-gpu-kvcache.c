/*
 * test-gpu-kvcache.c: the GPU KvCache (engine/backend/kv_cuda_cache.h)
 * against the CPU caches (kvcache_new_f32, kvcache_new_quant) for f32,
 * tq4, q8_0, the default type and a plan whose last layer has outlier
 * types (masks chosen at the first append, when that layer's device
 * cache is built): the same keys and values appended in batches of
 * several sizes to both, attention outputs after every batch within TOL,
 * to_host() blocks byte for byte equal to the CPU store's, and adopt() of
 * the CPU cache attending exactly like the GPU cache it mirrors; every
 * spec again with layer 0 a sliding-window layer (W = 45, the edge inside
 * a block: the device masks it, the CPU store also drops blocks). Also:
 * shapes the GPU cannot take fail at creation, and attend before a
 * layer's first append is an error, not a crash.
 *
 * tests/unit/meson.build also builds this file against a host emulation
 * of kv_cuda.h (tests/unit/kv_cuda_emul.c), so that the cache's host
 * logic runs on every CI machine; there TKV_CUDA_EMUL_MEM_LIMIT caps
 * device memory and check_out_of_memory() runs too.
 *
 * Exits 77 (skipped) where there is no GPU, 1 on any mismatch. Plain C
 * without Check, like test-gpu-kvattn.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/kv_cuda_cache.h"
#include "engine/kv/kvstore.h"
#include "engine/kv/kvtype.h"
#include "kernels/cuda/kv_cuda.h"
#include "tests/gpu/gpu-test-util.h"

#define N_LAYERS 2
#define N_HEADS 8
#define N_KV_HEADS 2
#define DIM 64
#define CAPACITY 300 /* not a multiple of 32 */
#define N_FINAL 8    /* the last prefill, attended again after adopt() */
#define TOL 2e-3     /* |gpu - cpu| / max |cpu| per output */
#define SEED 7

static const char *const specs[] = {
	"f32", "tq4", "q8_0", KV_DEFAULT_SPEC_GPU, "tq4:q8_0,-1--1=tq3h16o:tq3.5o",
};
/* batch sizes: a prompt, a chunk, decode steps, a chunk crossing blocks, the final prefill */
static const int batches[] = { 37, 64, 1, 1, 90, N_FINAL };

#define ROW (N_KV_HEADS * DIM) /* floats per token of K or V */
#define QROW (N_HEADS * DIM)   /* floats per token of q and out */

/* Attention of the GPU cache for q (device) into host got; 0 or -1 on a CUDA error. */
static int gpu_attend(KvCache *gpu, int layer, int64_t pos0, int64_t n, const float *dq,
		      float *dout, float *got)
{
	char msg[256] = "";
	int r = kvcache_attend(gpu, NULL, layer, pos0, n, dq, dout);
	if (r || cuda_sync(msg, sizeof(msg)) || cuda_download(got, dout, n * QROW * sizeof(float))) {
		printf("  attend layer %d at %lld: error %d %s\n", layer, (long long)pos0, r, msg);
		return -1;
	}
	return 0;
}

/* Positions < n of host (to_host of the GPU cache) against cpu, byte for byte: rows differing. */
static int compare_host(const KvCache *host, KvCache *cpu, int64_t n)
{
	int bad = 0;
	if (kvcache_n_tokens(host) != n || kvcache_is_f32(host) != kvcache_is_f32(cpu))
		return 1;
	if (kvcache_is_f32(cpu)) {
		for (int l = 0; l < N_LAYERS; l++) {
			float *hk, *hv, *ck, *cv;
			if (kvcache_f32_rows((KvCache *)host, l, &hk, &hv) ||
			    kvcache_f32_rows(cpu, l, &ck, &cv))
				return 1;
			for (int64_t p = 0; p < n; p++) {
				bad += memcmp(hk + p * ROW, ck + p * ROW, ROW * sizeof(float)) != 0;
				bad += memcmp(hv + p * ROW, cv + p * ROW, ROW * sizeof(float)) != 0;
			}
		}
		return bad;
	}
	for (int l = 0; l < N_LAYERS; l++) {
		const KvLayerTypes *t = kvstore_layer_types(cpu, l);
		size_t kb = kvtype_vec_bytes(&t->k), vb = kvtype_vec_bytes(&t->v);
		for (int h = 0; h < N_KV_HEADS; h++)
			/* a windowed layer holds from the block its next query sees */
			for (int64_t b = kvcache_window_first_block(&cpu->shape, l, n); b * 32 < n; b++) {
				const uint8_t *got = kvstore_block(host, l, h, b);
				const uint8_t *want = kvstore_block(cpu, l, h, b);
				if (!got || !want) {
					bad++;
					continue;
				}
				int valid = (int)(n - b * 32 < 32 ? n - b * 32 : 32);
				for (int j = 0; j < valid; j++) {
					bad += memcmp(got + j * kb, want + j * kb, kb) != 0;
					bad += memcmp(got + 32 * kb + j * vb, want + 32 * kb + j * vb, vb) != 0;
				}
			}
	}
	return bad;
}

/* One spec; window > 0: layer 0 windowed (W = window), layer 1 global. */
static int check(const char *spec, int window)
{
	KvCacheShape cs = { .n_layers = N_LAYERS, .n_heads = N_HEADS, .n_kv_heads = N_KV_HEADS,
			    .head_dim = DIM, .capacity = CAPACITY, .window = window, .window_period = 2 };
	bool f32 = strcmp(spec, "f32") == 0;
	Error err = { 0 };
	KvPlan *plan = NULL;
	KvCache *cpu = NULL, *gpu = NULL, *adopted = NULL;
	int failed = 0, r;
	if (f32) {
		r = kvcache_new_f32(&cs, &cpu);
	} else {
		r = kvplan_from_text(spec, N_LAYERS, N_KV_HEADS, DIM, &plan, &err);
		if (!r)
			r = kvcache_new_quant(&cs, plan, SEED, &cpu, &err);
	}
	if (r || (r = cuda_kvcache_new(&cs, plan, SEED, &gpu, &err))) {
		printf("FAIL %-16s: create: %d %s\n", spec, r, err.msg);
		kvcache_free(cpu);
		kvplan_free(plan);
		return 1;
	}
	if (strcmp(kvcache_device(gpu), "cuda") ||
	    kvcache_bytes_per_token(gpu) != kvcache_bytes_per_token(cpu)) {
		printf("  device %s, bytes per token %zu, CPU %zu\n", kvcache_device(gpu),
		       kvcache_bytes_per_token(gpu), kvcache_bytes_per_token(cpu));
		failed = 1;
	}

	int64_t n_ctx = 0;
	for (size_t i = 0; i < sizeof(batches) / sizeof(batches[0]); i++)
		n_ctx += batches[i];
	/* (layer, n_ctx, ROW) keys and values; (n_ctx, QROW) queries */
	float *k = rand_rows(N_LAYERS * n_ctx, ROW), *v = rand_rows(N_LAYERS * n_ctx, ROW);
	float *q = rand_rows(n_ctx, QROW);
	size_t kv_bytes = (size_t)N_LAYERS * n_ctx * ROW * sizeof(float);
	float *dk = upload(k, kv_bytes), *dv = upload(v, kv_bytes);
	float *dq = upload(q, (size_t)n_ctx * QROW * sizeof(float));
	float *dout = cuda_alloc((size_t)n_ctx * QROW * sizeof(float));
	float *want = malloc((size_t)n_ctx * QROW * sizeof(float));
	float *got = malloc((size_t)n_ctx * QROW * sizeof(float));
	float *final_gpu = malloc((size_t)N_LAYERS * N_FINAL * QROW * sizeof(float));
	float *final_cpu = malloc((size_t)N_LAYERS * N_FINAL * QROW * sizeof(float));
	double err_attend = 0.0, err_adopt = 0.0, diff_adopt = 0.0;

	/* as the model does: per batch, append then attend layer by layer, then advance */
	int64_t pos = 0;
	for (size_t i = 0; i < sizeof(batches) / sizeof(batches[0]) && !failed; i++) {
		int64_t n = batches[i];
		for (int l = 0; l < N_LAYERS && !failed; l++) {
			size_t off = ((size_t)l * n_ctx + pos) * ROW;
			if ((r = kvcache_append(cpu, l, pos, n, k + off, v + off)) ||
			    (r = kvcache_append(gpu, l, pos, n, dk + off, dv + off))) {
				printf("  append layer %d at %lld: %d\n", l, (long long)pos, r);
				failed = 1;
				break;
			}
			kvcache_attend(cpu, NULL, l, pos, n, q + pos * QROW, want);
			if (gpu_attend(gpu, l, pos, n, dq + pos * QROW, dout, got)) {
				failed = 1;
				break;
			}
			err_attend = fmax(err_attend, rel_err(got, want, (size_t)n * QROW));
			if (i + 1 == sizeof(batches) / sizeof(batches[0])) {
				size_t f = (size_t)l * N_FINAL * QROW;
				memcpy(final_gpu + f, got, N_FINAL * QROW * sizeof(float));
				memcpy(final_cpu + f, want, N_FINAL * QROW * sizeof(float));
			}
		}
		pos += n;
		kvcache_set_n_tokens(cpu, pos);
		kvcache_set_n_tokens(gpu, pos);
	}

	/* session save: the device blocks in a host cache of the CPU's kind */
	KvCache *host = NULL;
	int bad_rows = -1;
	if (!failed && (r = kvcache_host(gpu, &host)) == 0 && host != gpu)
		bad_rows = compare_host(host, cpu, n_ctx);
	else if (!failed)
		printf("  to_host: %d\n", r);

	/* session restore: the CPU cache itself moves to the GPU and must attend like gpu */
	if (!failed && (r = cuda_kvcache_adopt(cpu, &adopted, &err))) {
		printf("  adopt: %d %s\n", r, err.msg);
		failed = 1;
	}
	if (!failed) {
		cpu = NULL; /* owned by adopted */
		if (kvcache_n_tokens(adopted) != n_ctx)
			failed = 1;
		for (int l = 0; l < N_LAYERS && !failed; l++) {
			size_t off = (size_t)l * N_FINAL * QROW;
			if (gpu_attend(adopted, l, n_ctx - N_FINAL, N_FINAL, dq + (n_ctx - N_FINAL) * QROW,
				       dout, got)) {
				failed = 1;
				break;
			}
			err_adopt = fmax(err_adopt, rel_err(got, final_cpu + off, N_FINAL * QROW));
			diff_adopt = fmax(diff_adopt, rel_err(got, final_gpu + off, N_FINAL * QROW));
		}
	}

	failed |= bad_rows != 0 || !(err_attend <= TOL) || !(err_adopt <= TOL) || diff_adopt != 0.0;
	printf("%s %-16s%s: attend err %.2e, to_host rows differing %d, adopt err %.2e "
	       "(against the GPU cache %.2e)\n", failed ? "FAIL" : "ok  ", spec, window ? " window" : "",
	       err_attend, bad_rows, err_adopt, diff_adopt);

	cuda_free(dk);
	cuda_free(dv);
	cuda_free(dq);
	cuda_free(dout);
	free(k);
	free(v);
	free(q);
	free(want);
	free(got);
	free(final_gpu);
	free(final_cpu);
	kvcache_free(adopted);
	kvcache_free(gpu);
	kvcache_free(cpu);
	kvplan_free(plan);
	return failed;
}

/* Shapes the GPU cannot take fail at creation (-EINVAL); attend before any append is an error. */
static int check_refusals(void)
{
	int failed = 0;
	KvPlan *plan = NULL;
	KvCache *kv = NULL;
	Error err = { 0 };
	static const KvCacheShape bad[] = {
		{ .n_layers = 1, .n_heads = 4, .n_kv_heads = 2, .head_dim = 48, .capacity = 64 },
		{ .n_layers = 1, .n_heads = 32, .n_kv_heads = 2, .head_dim = 64, .capacity = 64 },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		/* f16 resolves for any head_dim: the refusal must be the GPU's */
		int r = kvplan_from_text("f16", 1, bad[i].n_kv_heads, bad[i].head_dim, &plan, &err);
		if (!r)
			r = cuda_kvcache_new(&bad[i], plan, SEED, &kv, &err);
		int r0 = cuda_kvcache_new(&bad[i], NULL, 0, &kv, &err);
		printf("%s refuse head_dim %d, %d heads per kv-head: %d / %d (%s)\n",
		       r == -EINVAL && r0 == -EINVAL ? "ok  " : "FAIL", bad[i].head_dim,
		       bad[i].n_heads / bad[i].n_kv_heads, r, r0, err.msg);
		failed |= r != -EINVAL || r0 != -EINVAL;
		plan = kvplan_free(plan);
	}

	KvCacheShape cs = { .n_layers = 1, .n_heads = N_HEADS, .n_kv_heads = N_KV_HEADS,
			    .head_dim = DIM, .capacity = 64 };
	/* centered keys: no GPU kernels yet, so a clear refusal rather than wrong scores */
	int r = kvplan_from_text("tq5_nc+c:tq3.5_nc", 1, N_KV_HEADS, DIM, &plan, &err);
	if (!r)
		r = cuda_kvcache_new(&cs, plan, SEED, &kv, &err);
	bool said = strstr(err.msg, "+c") != NULL;
	printf("%s refuse tq5_nc+c:tq3.5_nc: %d (%s)\n", r == -EINVAL && said ? "ok  " : "FAIL", r,
	       err.msg);
	failed |= r != -EINVAL || !said;
	plan = kvplan_free(plan);
	/* pair-coded keys likewise */
	r = kvplan_from_text("pk4:tq3", 1, N_KV_HEADS, DIM, &plan, &err);
	if (!r)
		r = cuda_kvcache_new(&cs, plan, SEED, &kv, &err);
	said = strstr(err.msg, "pk") != NULL;
	printf("%s refuse pk4:tq3: %d (%s)\n", r == -EINVAL && said ? "ok  " : "FAIL", r, err.msg);
	failed |= r != -EINVAL || !said;
	plan = kvplan_free(plan);

	r = kvplan_from_text("tq3.5o", 1, N_KV_HEADS, DIM, &plan, &err);
	if (!r)
		r = cuda_kvcache_new(&cs, plan, SEED, &kv, &err);
	int first = 0, append = -1;
	if (!r) {
		float *dq = cuda_alloc(QROW * sizeof(float)), *dout = cuda_alloc(QROW * sizeof(float));
		first = kvcache_attend(kv, NULL, 0, 0, 1, dq, dout);
		float *x = rand_rows(1, QROW), *dx = upload(x, QROW * sizeof(float));
		append = kvcache_append(kv, 0, 0, 1, dx, dx); /* the failed attend left nothing behind */
		cuda_free(dx);
		free(x);
		cuda_free(dq);
		cuda_free(dout);
	}
	if (r)
		printf("  create: %d %s\n", r, err.msg);
	r = r || first != -EINVAL || append != 0;
	printf("%s attend before the first append: error %d, then append %d\n", r ? "FAIL" : "ok  ",
	       first, append);
	failed |= r != 0;
	kvcache_free(kv);
	kvplan_free(plan);
	return failed;
}

/* Capacity at which one layer of a plan's cache takes about 60% of limit bytes: two do not fit. */
static int64_t oom_capacity(const KvPlan *plan, size_t limit)
{
	KvCacheShape cs = { .n_layers = N_LAYERS, .n_heads = N_HEADS, .n_kv_heads = N_KV_HEADS,
			    .head_dim = DIM, .capacity = 32 };
	KvCache *kv = NULL;
	Error err = { 0 };
	if (cuda_kvcache_new(&cs, plan, SEED, &kv, &err))
		return 0;
	size_t layer_per_token = kvcache_bytes_per_token(kv) / N_LAYERS;
	kvcache_free(kv);
	return (int64_t)(0.6 * (double)limit / (double)layer_per_token) / 32 * 32;
}

/*
 * Under the emulation, with device memory capped at limit bytes: a cache
 * that does not fit fails at creation with -ENOMEM, says how much it
 * needed and gives all its device memory back, whether its layers are
 * built at creation (f32) or reserved for their first append (an outlier
 * type); an attend that gets no scratch returns -ENOMEM and leaves the
 * cache usable once memory is back.
 */
static int check_out_of_memory(size_t limit)
{
	static const char *const oom_specs[] = { "f32", "tq3.5o" };
	int failed = 0;
	for (size_t i = 0; i < sizeof(oom_specs) / sizeof(oom_specs[0]); i++) {
		KvPlan *plan = NULL;
		KvCache *kv = NULL;
		Error err = { 0 };
		int r = strcmp(oom_specs[i], "f32") ? kvplan_from_text(oom_specs[i], N_LAYERS, N_KV_HEADS,
								       DIM, &plan, &err) : 0;
		KvCacheShape cs = { .n_layers = N_LAYERS, .n_heads = N_HEADS, .n_kv_heads = N_KV_HEADS,
				    .head_dim = DIM, .capacity = r ? 0 : oom_capacity(plan, limit) };
		if (!r && cs.capacity > 0)
			r = cuda_kvcache_new(&cs, plan, SEED, &kv, &err);
		void *all = cuda_alloc(limit); /* nothing is left allocated */
		bool ok = r == -ENOMEM && !kv && strstr(err.msg, "out of device memory") && all;
		printf("%s out of device memory: %s, capacity %lld: %d (%s)%s\n", ok ? "ok  " : "FAIL",
		       oom_specs[i], (long long)cs.capacity, r, err.msg,
		       all ? "" : ", device memory not given back");
		failed |= !ok;
		cuda_free(all);
		kvcache_free(kv);
		kvplan_free(plan);
	}

	/* a cache that fits, then the rest of the device filled: attend gets no scratch */
	KvCacheShape cs = { .n_layers = 1, .n_heads = N_HEADS, .n_kv_heads = N_KV_HEADS,
			    .head_dim = DIM, .capacity = 64 };
	KvCache *kv = NULL;
	Error err = { 0 };
	float *x = rand_rows(32, QROW); /* 32 tokens of q, and of k and v (ROW <= QROW) */
	float *dx = upload(x, 32 * QROW * sizeof(float)), *dout = cuda_alloc(32 * QROW * sizeof(float));
	void *fill[64];
	int n_fill = 0, failed_attend = 0, append = -1, again = -1;
	int r = cuda_kvcache_new(&cs, NULL, 0, &kv, &err);
	if (!r && !(r = kvcache_append(kv, 0, 0, 32, dx, dx)))
		kvcache_set_n_tokens(kv, 32);
	for (size_t size = limit; size >= 64 && n_fill < 64;)
		if ((fill[n_fill] = cuda_alloc(size)))
			n_fill++;
		else
			size /= 2;
	if (!r)
		failed_attend = kvcache_attend(kv, NULL, 0, 0, 32, dx, dout);
	while (n_fill > 0)
		cuda_free(fill[--n_fill]);
	if (!r) {
		append = kvcache_append(kv, 0, 32, 1, dx, dx);
		again = kvcache_attend(kv, NULL, 0, 0, 32, dx, dout);
	}
	bool ok = !r && failed_attend == -ENOMEM && append == 0 && again == 0;
	printf("%s attend without scratch: %d; with memory again: append %d, attend %d%s\n",
	       ok ? "ok  " : "FAIL", failed_attend, append, again, r ? " (setup failed)" : "");
	failed |= !ok;
	kvcache_free(kv);
	cuda_free(dx);
	cuda_free(dout);
	free(x);
	return failed;
}

int main(void)
{
	if (cuda_device_count() < 1) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	int failures = check_refusals();
	size_t n_checks = 1 + 2 * (sizeof(specs) / sizeof(specs[0]));
	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
		failures += check(specs[i], 0);
	/* a sliding window of 45 (its edge inside a block) in layer 0, against the CPU caches' mask */
	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
		failures += check(specs[i], 45);
	/* only under tests/unit/kv_cuda_emul.c: a GPU's memory is what it is */
	const char *limit = getenv("TKV_CUDA_EMUL_MEM_LIMIT");
	if (limit) {
		failures += check_out_of_memory(strtoull(limit, NULL, 10));
		n_checks++;
	}
	/* run.sh reads this line */
	printf("%d of %zu GPU KV cache checks failed\n", failures, n_checks);
	return failures ? 1 : 0;
}
