/*
 * test-gpu-model.c: the whole model on the CUDA backend against the CPU
 * backend (issue 9), for each GGUF given on the command line and each KV
 * type of kv_specs:
 *
 *   prefill   logits of every prompt token (the batched path: cuBLAS on
 *             dequantized tiles) close to the CPU's;
 *   decode    teacher-forced single-token steps (the dequantizing
 *             matrix-vector kernels), logits close, and the GPU's greedy
 *             token equal to the CPU's wherever the CPU's top-1/top-2
 *             margin is clear;
 *   sessions  a GPU cache written as a session file and read back goes on
 *             decoding on the CPU with the logits the GPU gives, and a
 *             CPU session goes on on the GPU the same way.
 *
 * The two backends do not compute bit-identical logits by design: the
 * CPU multiplies quantized weights with activations quantized to 8 bits
 * (as llama.cpp does), the GPU with float activations (f16 in prefill).
 * So closeness is measured against the spread of the logits, and greedy
 * tokens only where the CPU's margin exceeds that noise
 * (model_logits_diff, the same test the daemon runs at start-up).
 *
 * Usage: test-gpu-model MODEL.gguf...; exits 77 without a GPU, 1 if a
 * check fails. TKV_GPU_MODEL_KV='SPEC;SPEC...' checks those KV types
 * instead of kv_specs (';' between them: a layer policy has commas). Plain
 * C without Check, like the other tests/gpu programs.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/kv/kvtype.h"
#include "engine/model/model.h"
#include "engine/session/session.h"

#define N_PROMPT 96
#define N_DECODE 12

static const char *const kv_specs[] = { "f32", "tq5_nc:tq3.5_nc", "tq4", "q8_0" };
#define MAX_SPECS 16

/* The KV specs to check: TKV_GPU_MODEL_KV's ';'-separated list (in buf), else kv_specs. Returns how many. */
static int specs_wanted(const char **specs, char *buf, size_t size)
{
	const char *env = getenv("TKV_GPU_MODEL_KV");
	int n = 0;
	if (!env || !*env) {
		for (; n < (int)(sizeof(kv_specs) / sizeof(kv_specs[0])); n++)
			specs[n] = kv_specs[n];
		return n;
	}
	snprintf(buf, size, "%s", env);
	for (char *save = NULL, *t = strtok_r(buf, ";", &save); t && n < MAX_SPECS; t = strtok_r(NULL, ";", &save))
		specs[n++] = t;
	return n;
}

/*
 * How far the GPU may be from the CPU, as a multiple of model.h's limits.
 * With f32 or 8-bit caches the backends differ only by activation
 * rounding; a coarser cache rounds those slightly different K and V rows
 * into different cells, which doubles the distance (measured on the host
 * emulation: up to 0.094 max and 0.018 mean rel for 3- to 4-bit caches,
 * tq and plain q4_0 alike, against 0.023 and 0.006 for f32 and q8_0).
 */
static double slack = 1.0;

/* Fold a row's diff into the worst seen; returns 1 on a failure (printed). Limits: model.h times slack. */
static int row_verdict(const char *what, int row, const LogitsDiff *d, LogitsDiff *worst)
{
	worst->max_rel = fmax(worst->max_rel, d->max_rel);
	worst->mean_rel = fmax(worst->mean_rel, d->mean_rel);
	LogitsDiff scaled = *d;
	scaled.max_rel /= slack;
	scaled.mean_rel /= slack;
	if (model_logits_agree(&scaled))
		return 0;
	printf("    FAIL %s row %d: max rel %.4f, mean rel %.5f, top-1 gpu %d cpu %d (margin %.3f)\n", what, row,
	       d->max_rel, d->mean_rel, d->top_got, d->top_ref, d->margin);
	return 1;
}

typedef struct Pair {
	Model *cpu, *gpu;
	ModelRun *run_cpu, *run_gpu;
	ThreadPool *tp;
	int n_vocab;
} Pair;

/* A session file of kv's contents in memory, read back as a host cache for expect's plan. */
static int session_roundtrip(const Model *m, KvCache *kv, const int32_t *tokens, size_t n, const char *spec,
			     const KvPlan *plan, int64_t capacity, KvCache **ret)
{
	int fd = memfd_create("tkv-session", MFD_CLOEXEC);
	if (fd < 0)
		return -1;
	SessionState st = { .kind = SESSION_KIND_RAW, .tokens = (int32_t *)tokens, .n_tokens = n, .kv = kv };
	uint64_t bytes = 0;
	Error err = { 0 };
	uint64_t fp = gguf_fingerprint(m->gguf);
	int r = session_write_fd(fd, &st, fp, spec, NULL, &bytes, &err);
	if (r != 0) {
		printf("    session write: %s\n", err.msg);
		close(fd);
		return -1;
	}
	void *data = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (data == MAP_FAILED)
		return -1;
	SessionExpect e = { .fingerprint = fp, .shape = model_kv_shape(m, capacity), .n_vocab = m->cfg.n_vocab,
			    .plan = plan };
	SessionState *back = NULL;
	r = session_read(data, bytes, &e, &back, &err);
	munmap(data, bytes);
	if (r != 0) {
		printf("    session read: %s\n", err.msg);
		return -1;
	}
	*ret = back->kv;
	back->kv = NULL;
	session_state_free(back);
	return 0;
}

static int check_spec(Pair *p, const char *path, const char *spec)
{
	const Model *mc = p->cpu;
	int V = p->n_vocab, fails = 0;
	int64_t cap = N_PROMPT + N_DECODE + 2;
	Error err = { 0 };
	KvPlan *plan = NULL;
	if (strcmp(spec, "f32") != 0 &&
	    kvplan_from_text(spec, mc->cfg.n_layers, mc->cfg.n_kv_heads, mc->cfg.head_dim, &plan, &err) != 0) {
		printf("  %s: %s\n", spec, err.msg);
		return 1;
	}
	slack = !plan || kvplan_bits_per_value(plan) >= 8.0 ? 1.0 : 2.0;
	KvCache *kc = NULL, *kg = NULL;
	if (model_kvcache_new(p->cpu, plan, 0, cap, &kc, &err) || model_kvcache_new(p->gpu, plan, 0, cap, &kg, &err)) {
		printf("  %s: cannot make the caches: %s\n", spec, err.msg);
		kvcache_free(kc);
		kvplan_free(plan);
		return 1;
	}

	int32_t tokens[N_PROMPT + N_DECODE + 2];
	uint64_t s = 0x1234567ull;
	for (int i = 0; i < N_PROMPT; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		tokens[i] = (int32_t)((s >> 33) % (uint64_t)V);
	}
	float *lc = malloc(sizeof(float) * (size_t)V * N_PROMPT), *lg = malloc(sizeof(float) * (size_t)V * N_PROMPT);
	LogitsDiff worst = { 0 };
	int r1 = model_eval(p->cpu, p->run_cpu, kc, tokens, N_PROMPT, NULL, lc);
	int r2 = model_eval(p->gpu, p->run_gpu, kg, tokens, N_PROMPT, NULL, lg);
	if (r1 || r2) {
		printf("  %s: prefill failed (cpu %d, gpu %d): %s\n", spec, r1, r2, backend_last_error(p->gpu->backend));
		fails++;
		goto out;
	}
	for (int i = 0; i < N_PROMPT; i++) {
		LogitsDiff d = model_logits_diff(lg + (size_t)i * V, lc + (size_t)i * V, V);
		fails += row_verdict("prefill", i, &d, &worst);
	}
	printf("  %-18s prefill %d tokens: worst max rel %.4f, mean rel %.5f\n", spec, N_PROMPT, worst.max_rel,
	       worst.mean_rel);

	/* decode, teacher-forced on the CPU's greedy tokens */
	worst = (LogitsDiff){ 0 };
	int agree = 0, clear = 0;
	const float *last = lc + (size_t)(N_PROMPT - 1) * V;
	for (int t = 0; t < N_DECODE; t++) {
		tokens[N_PROMPT + t] = model_logits_diff(last, last, V).top_ref;
		r1 = model_eval(p->cpu, p->run_cpu, kc, &tokens[N_PROMPT + t], 1, lc, NULL);
		r2 = model_eval(p->gpu, p->run_gpu, kg, &tokens[N_PROMPT + t], 1, lg, NULL);
		if (r1 || r2) {
			printf("  %s: decode step %d failed (cpu %d, gpu %d): %s\n", spec, t, r1, r2,
			       backend_last_error(p->gpu->backend));
			fails++;
			goto out;
		}
		LogitsDiff d = model_logits_diff(lg, lc, V);
		fails += row_verdict("decode", t, &d, &worst);
		bool clear_margin = d.margin > MODEL_LOGITS_CLEAR_MARGIN;
		clear += clear_margin;
		agree += clear_margin && d.top_got == d.top_ref;
		last = lc;
	}
	printf("  %-18s decode %d steps: worst max rel %.4f, mean rel %.5f, greedy agrees %d of %d clear steps\n",
	       spec, N_DECODE, worst.max_rel, worst.mean_rel, agree, clear);

	/*
	 * Sessions across devices: each cache goes through a session file and
	 * the other backend continues from it; one more token on each side.
	 */
	int64_t n = N_PROMPT + N_DECODE;
	int32_t next = tokens[n - 1];
	KvCache *from_gpu = NULL, *from_cpu = NULL, *on_gpu = NULL;
	if (session_roundtrip(p->gpu, kg, tokens, (size_t)n, spec, plan, cap, &from_gpu) ||
	    session_roundtrip(p->cpu, kc, tokens, (size_t)n, spec, plan, cap, &from_cpu) ||
	    model_kvcache_adopt(p->gpu, from_cpu, &on_gpu, &err)) {
		printf("  %s: session round trip failed %s\n", spec, err.msg);
		kvcache_free(from_gpu);
		kvcache_free(from_cpu);
		fails++;
		goto out;
	}
	float *l_cpu_from_gpu = malloc(sizeof(float) * V), *l_gpu_from_cpu = malloc(sizeof(float) * V);
	r1 = model_eval(p->cpu, p->run_cpu, from_gpu, &next, 1, l_cpu_from_gpu, NULL);
	r2 = model_eval(p->gpu, p->run_gpu, on_gpu, &next, 1, l_gpu_from_cpu, NULL);
	int r3 = model_eval(p->cpu, p->run_cpu, kc, &next, 1, lc, NULL);
	int r4 = model_eval(p->gpu, p->run_gpu, kg, &next, 1, lg, NULL);
	if (r1 || r2 || r3 || r4) {
		printf("  %s: decode after the session failed (%d %d %d %d)\n", spec, r1, r2, r3, r4);
		fails++;
	} else {
		/* CPU continuing a GPU session ~ the GPU continuing it; GPU continuing a CPU one ~ the CPU */
		LogitsDiff a = model_logits_diff(l_cpu_from_gpu, lg, V), b = model_logits_diff(l_gpu_from_cpu, lc, V);
		LogitsDiff w = { 0 };
		fails += row_verdict("session gpu->cpu", 0, &a, &w);
		fails += row_verdict("session cpu->gpu", 0, &b, &w);
		printf("  %-18s sessions across devices: max rel %.4f (gpu->cpu), %.4f (cpu->gpu)\n", spec,
		       a.max_rel, b.max_rel);
	}
	free(l_cpu_from_gpu);
	free(l_gpu_from_cpu);
	kvcache_free(from_gpu);
	kvcache_free(on_gpu);
out:
	free(lc);
	free(lg);
	kvcache_free(kc);
	kvcache_free(kg);
	kvplan_free(plan);
	(void)path;
	return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: test-gpu-model MODEL.gguf...\n");
		return 2;
	}
	Backend *gpu = NULL;
	Error err = { 0 };
	int r = backend_cuda_new(&gpu, &err);
	if (r != 0) {
		/* only a missing GPU is a skip; anything else is this test's failure */
		printf("no CUDA backend (%s)%s\n", err.msg, r == -ENODEV ? ": skipped" : "");
		return r == -ENODEV ? 77 : 1;
	}
	ThreadPool *tp = NULL;
	if (threadpool_new(8, &tp) != 0)
		return 1;

	int failures = 0, runs = 0;
	const char *specs[MAX_SPECS];
	char spec_buf[512];
	int n_specs = specs_wanted(specs, spec_buf, sizeof(spec_buf));
	for (int a = 1; a < argc; a++) {
		Pair p = { .tp = tp };
		if (model_load(argv[a], &p.cpu, &err) != 0 || model_load_on(argv[a], gpu, &p.gpu, &err) != 0) {
			printf("%s: cannot load: %s\n", argv[a], err.msg);
			failures++;
			runs++;
			model_free(p.cpu);
			continue;
		}
		char desc[256];
		model_describe(p.cpu, desc, sizeof(desc));
		printf("%s (%s)\n", argv[a], desc);
		p.n_vocab = p.cpu->cfg.n_vocab;
		if (model_run_new(p.cpu, 64, tp, &p.run_cpu) != 0 || model_run_new(p.gpu, 64, NULL, &p.run_gpu) != 0) {
			printf("  cannot allocate activations\n");
			failures++;
		} else {
			for (int i = 0; i < n_specs; i++, runs++)
				failures += check_spec(&p, argv[a], specs[i]);
		}
		model_run_free(p.run_cpu);
		model_run_free(p.run_gpu);
		model_free(p.cpu);
		model_free(p.gpu);
	}
	threadpool_free(tp);
	backend_free(gpu);
	printf("%d of %d GPU/CPU model checks failed\n", failures, runs);
	return failures ? 1 : 0;
}
