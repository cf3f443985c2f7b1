/*
 * cmd_bench.c: `turbokv-lab bench`, prompt and decode throughput.
 *
 * Measures what llama-bench measures, the same way, so the two can be
 * compared line by line: pp N = one batched prefill of N tokens into an
 * empty cache; tg N = N single-token decode steps starting from an empty
 * cache. Tokens are random ids (content does not change the work). Each
 * test runs once as a warm-up, then --repetitions times; we report the
 * median and the standard deviation of tokens per second.
 *
 * --depth D1,D2,...: the prefill and decode tests run once per depth, after
 * the cache has been filled with D tokens by real prefill (llama-bench -d:
 * "pp N @ dD" is N tokens prefilled after D): depths in ascending order,
 * each prefilled on top of the previous one, the cache rewound to D before
 * every timed run. The filling is not counted.
 *
 * Every row also gives the peak RSS so far (getrusage: it never goes down,
 * so a row's figure is the peak of that test and all before it), and decode
 * rows the bytes read per second: every weight matrix once per token (the
 * embedding table excepted: one row of it) plus the KV cache at the mean
 * depth of the run, to set against bench/bench-membw's ceiling.
 * --fill random appends seeded random K and V rows instead of running the
 * model over D tokens: decode reads the same bytes either way, and deep
 * contexts on slow prefill paths are filled in seconds.
 */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "engine/kv/kvstore.h"
#include "kernels/wtype.h"
#include "tools/turbokv-lab/lab.h"

typedef struct BenchOptions {
	LabCommon common;
	long n_prompt;
	long n_gen;
	long reps;
	const char *kv; /* --kv SPEC, NULL: f32 */
	long depth[16]; /* --depth, ascending; {0} by default */
	int n_depth;
	bool fill_random; /* --fill random */
} BenchOptions;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab bench [OPTIONS]\n\n"
		"  -p, --n-prompt N     prompt tokens for the prefill test (default 512, 0: skip)\n"
		"  -n, --n-gen N        tokens for the decode test (default 128, 0: skip)\n"
		"  -r, --repetitions N  measured runs per test (default 5)\n"
		"      --kv SPEC        KV cache types (tq4, q8_0:q4_0, ...; default f32)\n"
		"  -d, --depth LIST     both tests after prefilling each of these many tokens\n"
		"                       (comma-separated, up to 16; default 0)\n"
		"      --fill HOW       how depths are filled: prefill (default, the model runs\n"
		"                       over the tokens) or random (seeded random K/V rows)\n"
		LAB_COMMON_HELP);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

typedef struct BenchResult {
	const char *test;
	long n;
	long depth;
	double median_tps;
	double stdev_tps;
	double read_gbs;   /* decode: bytes read per second / 1e9; 0 for prefill */
	long peak_rss_kib; /* ru_maxrss after the test */
} BenchResult;

/* Bytes of the weight matrices one decode step reads (the embedding: one row). */
static double weight_bytes_per_token(const Model *m)
{
	double b = (double)m->tok_embd.row_stride;
	if (m->output.data != m->tok_embd.data)
		b += (double)m->output.rows * (double)m->output.row_stride;
	else
		b += (double)m->tok_embd.rows * (double)m->tok_embd.row_stride;
	for (int il = 0; il < m->cfg.n_layers; il++) {
		const LayerWeights *w = &m->layers[il];
		const MatmulWeight *ws[] = { &w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down };
		for (size_t i = 0; i < ARRAY_SIZE(ws); i++)
			b += (double)ws[i]->rows * (double)ws[i]->row_stride;
	}
	return b;
}

static int cmp_long(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return (x > y) - (x < y);
}

/* "0,1024,4096" -> o->depth (sorted, duplicates dropped). Returns 0 or -1 (message printed). */
static int parse_depths(BenchOptions *o, const char *arg)
{
	_cleanup_(freep) char *copy = strdup(arg);
	if (!copy)
		return -1;
	o->n_depth = 0;
	for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->n_depth == (int)ARRAY_SIZE(o->depth)) {
			fprintf(stderr, "turbokv-lab: --depth: at most %zu depths\n", ARRAY_SIZE(o->depth));
			return -1;
		}
		long d = lab_parse_long("--depth", tok, 0, 1 << 20);
		if (d < 0)
			return -1;
		o->depth[o->n_depth++] = d;
	}
	if (o->n_depth == 0) {
		fprintf(stderr, "turbokv-lab: --depth: empty list\n");
		return -1;
	}
	qsort(o->depth, (size_t)o->n_depth, sizeof(long), cmp_long);
	int n = 1;
	for (int i = 1; i < o->n_depth; i++)
		if (o->depth[i] != o->depth[n - 1])
			o->depth[n++] = o->depth[i];
	o->n_depth = n;
	return 0;
}

/*
 * Positions from .. to - 1 of every layer of kv get seeded random K and V
 * rows (N(0, 1) with a few loud channels, like real keys), written
 * through the model's backend in chunks.
 */
static int fill_random(const Model *m, KvCache *kv, long from, long to)
{
	Backend *b = m->backend;
	const long chunk = 256;
	size_t row = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim, bytes = chunk * row * sizeof(float);
	_cleanup_(freep) float *host = malloc(bytes);
	void *dk = NULL, *dv = NULL;
	int r = host ? 0 : -ENOMEM;
	if (r == 0 && (r = b->ops->alloc(b, bytes, &dk)) == 0)
		r = b->ops->alloc(b, bytes, &dv);
	uint64_t s = 0x9e3779b97f4a7c15ull;
	/* chunk by chunk, every layer, as the model appends a batch */
	for (long p = from; r == 0 && p < to; p += chunk) {
		long n = MIN(chunk, to - p);
		for (int il = 0; r == 0 && il < m->cfg.n_layers; il++) {
			for (int side = 0; r == 0 && side < 2; side++) {
				for (size_t i = 0; i < (size_t)n * row; i++) {
					s = s * 6364136223846793005ull + 1442695040888963407ull;
					/* sum of 4 uniforms: close enough to normal for a cache's contents */
					double u = 0.0;
					for (int k = 0; k < 4; k++)
						u += (double)((s >> (11 + 12 * k)) & 0xfff) / 4096.0;
					host[i] = (float)((u - 2.0) * 1.7) * (i % m->cfg.head_dim % 29 == 3 ? 8.0f : 1.0f);
				}
				r = b->ops->upload(b, side ? dv : dk, host, (size_t)n * row * sizeof(float));
			}
			if (r == 0)
				r = kvcache_append(kv, il, p, n, dk, dv);
		}
		if (r == 0)
			kvcache_set_n_tokens(kv, p + n);
	}
	if (dk)
		b->ops->dealloc(b, dk);
	if (dv)
		b->ops->dealloc(b, dv);
	return r;
}

/* One timed run from depth tokens: seconds for the test, or a negative value on failure. */
static double bench_once(const Model *m, ModelRun *run, KvCache *kv, const int32_t *tokens, long n,
			 bool prefill, long depth, float *logits)
{
	kvcache_set_n_tokens(kv, depth);
	tokens += depth;
	uint64_t t0 = now_ns();
	if (prefill) {
		if (model_eval(m, run, kv, tokens, n, logits, NULL) != 0)
			return -1;
	} else {
		for (long i = 0; i < n; i++)
			if (model_eval(m, run, kv, &tokens[i], 1, logits, NULL) != 0)
				return -1;
	}
	return (now_ns() - t0) / 1e9;
}

static int bench_test(const Model *m, ModelRun *run, KvCache *kv, const int32_t *tokens,
		      const BenchOptions *o, bool prefill, long depth, float *logits, BenchResult *ret)
{
	long n = prefill ? o->n_prompt : o->n_gen;
	double tps[64];
	long reps = MIN(o->reps, (long)ARRAY_SIZE(tps));
	if (bench_once(m, run, kv, tokens, n, prefill, depth, logits) < 0) /* warm-up */
		return -1;
	double mean = 0.0;
	for (long i = 0; i < reps; i++) {
		double s = bench_once(m, run, kv, tokens, n, prefill, depth, logits);
		if (s < 0)
			return -1;
		tps[i] = n / s;
		mean += tps[i] / reps;
	}
	double var = 0.0;
	for (long i = 0; i < reps; i++)
		var += (tps[i] - mean) * (tps[i] - mean);
	qsort(tps, reps, sizeof(double), cmp_double);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double med = reps % 2 ? tps[reps / 2] : (tps[reps / 2 - 1] + tps[reps / 2]) / 2;
	double bytes = weight_bytes_per_token(m) + (double)kvcache_bytes_per_token(kv) * ((double)depth + n / 2.0);
	*ret = (BenchResult){
		.read_gbs = prefill ? 0.0 : med * bytes / 1e9,
		.peak_rss_kib = ru.ru_maxrss,
		.test = prefill ? "pp" : "tg",
		.n = n,
		.depth = depth,
		.median_tps = med,
		.stdev_tps = reps > 1 ? sqrt(var / (reps - 1)) : 0.0,
	};
	return 0;
}

int cmd_bench(int argc, char **argv)
{
	enum { OPT_HELP = 0x2000, OPT_KV, OPT_FILL };
	static const struct option longopts[] = {
		LAB_COMMON_LONGOPTS,
		{ "n-prompt", required_argument, NULL, 'p' },
		{ "n-gen", required_argument, NULL, 'n' },
		{ "repetitions", required_argument, NULL, 'r' },
		{ "kv", required_argument, NULL, OPT_KV },
		{ "depth", required_argument, NULL, 'd' },
		{ "fill", required_argument, NULL, OPT_FILL },
		{ "help", no_argument, NULL, OPT_HELP },
		{}
	};
	BenchOptions o = { .n_prompt = 512, .n_gen = 128, .reps = 5, .n_depth = 1 };
	int c, r;
	lab_common_init(&o.common);
	optind = 1;
	while ((c = getopt_long(argc, argv, LAB_COMMON_SHORTOPTS "p:n:r:d:", longopts, NULL)) != -1) {
		if ((r = lab_common_option(&o.common, c, optarg)) != 0) {
			if (r < 0)
				return LAB_EXIT_USAGE;
			continue;
		}
		switch (c) {
		case 'p':
			if ((o.n_prompt = lab_parse_long("--n-prompt", optarg, 0, 1 << 20)) < 0)
				return LAB_EXIT_USAGE;
			break;
		case 'n':
			if ((o.n_gen = lab_parse_long("--n-gen", optarg, 0, 1 << 20)) < 0)
				return LAB_EXIT_USAGE;
			break;
		case 'r':
			if ((o.reps = lab_parse_long("--repetitions", optarg, 1, 64)) < 0)
				return LAB_EXIT_USAGE;
			break;
		case OPT_KV: o.kv = lab_spec_resolve(optarg); break;
		case 'd':
			if (parse_depths(&o, optarg) < 0)
				return LAB_EXIT_USAGE;
			break;
		case OPT_FILL:
			if (strcmp(optarg, "random") != 0 && strcmp(optarg, "prefill") != 0) {
				fprintf(stderr, "turbokv-lab: --fill '%s': prefill or random\n", optarg);
				return LAB_EXIT_USAGE;
			}
			o.fill_random = strcmp(optarg, "random") == 0;
			break;
		case OPT_HELP: usage(stdout); return LAB_EXIT_OK;
		default: usage(stderr); return LAB_EXIT_USAGE;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return LAB_EXIT_USAGE;
	}

	_cleanup_(model_freep) Model *m = NULL;
	if (lab_load(&o.common, &m, NULL) < 0)
		return LAB_EXIT_FAILURE;

	int64_t n_ctx = o.depth[o.n_depth - 1] + MAX(o.n_prompt, o.n_gen);
	if (n_ctx < 1)
		return LAB_EXIT_OK;
	ThreadPool *tp = NULL;
	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	_cleanup_(model_run_freep) ModelRun *run = NULL;
	double kv_bits;
	const char *kv_name = o.kv ? o.kv : "f32";
	if (lab_kvcache_new(m, o.kv, n_ctx, &kv, &kv_bits) < 0)
		return LAB_EXIT_FAILURE;
	/* runs rewind to their depth: windowed layers keep their blocks (attention reads the same) */
	if (kvstore_is(kv))
		kvstore_set_keep_all(kv, true);
	_cleanup_(freep) int32_t *tokens = malloc_array(n_ctx, sizeof(int32_t));
	_cleanup_(freep) float *logits = malloc_array(m->cfg.n_vocab, sizeof(float));
	if (!tokens || !logits || threadpool_new(o.common.threads, &tp) < 0 ||
	    model_run_new(m, 512, tp, &run) < 0) {
		fprintf(stderr, "turbokv-lab: out of memory\n");
		threadpool_free(tp);
		return LAB_EXIT_FAILURE;
	}
	uint64_t seed = 42;
	for (int64_t i = 0; i < n_ctx; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		tokens[i] = (int32_t)((seed >> 33) % (uint64_t)m->cfg.n_vocab);
	}

	BenchResult res[2 * ARRAY_SIZE(o.depth)];
	int n_res = 0;
	r = 0;
	long filled = 0; /* tokens 0 .. filled-1 are in the cache from the previous depth */
	for (int i = 0; r == 0 && i < o.n_depth; i++) {
		long d = o.depth[i];
		kvcache_set_n_tokens(kv, filled);
		if (d > filled && (o.fill_random ? fill_random(m, kv, filled, d)
						 : model_eval(m, run, kv, tokens + filled, d - filled, logits, NULL)) != 0)
			r = -1;
		filled = d;
		if (r == 0 && o.n_prompt > 0)
			r = bench_test(m, run, kv, tokens, &o, true, d, logits, &res[n_res++]);
		if (r == 0 && o.n_gen > 0)
			r = bench_test(m, run, kv, tokens, &o, false, d, logits, &res[n_res++]);
	}
	threadpool_free(tp);
	if (r != 0) {
		fprintf(stderr, "turbokv-lab: benchmark evaluation failed\n");
		return LAB_EXIT_FAILURE;
	}

	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	char desc[256];
	model_describe(m, desc, sizeof(desc));
	const char *base = strrchr(o.common.model_path, '/');
	base = base ? base + 1 : o.common.model_path;
	if (o.common.json) {
		printf("{\"model\": ");
		json_write_string(stdout, base, strlen(base));
		printf(", \"model_bytes\": %zu, \"device\": \"%s\", \"threads\": %d, \"kv\": ",
		       gguf_file_size(m->gguf), backend_name(m->backend), o.common.threads);
		json_write_string(stdout, kv_name, strlen(kv_name));
		printf(", \"kv_bits_per_value\": %.4f, \"kv_bytes_per_token\": %zu, \"peak_rss_bytes\": %ld, \"results\": [",
		       kv_bits, kvcache_bytes_per_token(kv), ru.ru_maxrss * 1024L);
		for (int i = 0; i < n_res; i++)
			printf("%s{\"test\": \"%s%ld\", \"depth\": %ld, \"tokens_per_s\": %.2f, \"stdev\": %.2f, \"repetitions\": %ld, "
			       "\"read_gb_per_s\": %.2f, \"peak_rss_bytes\": %ld}",
			       i ? ", " : "", res[i].test, res[i].n, res[i].depth, res[i].median_tps, res[i].stdev_tps,
			       o.reps, res[i].read_gbs, res[i].peak_rss_kib * 1024L);
		printf("]}\n");
	} else {
		printf("model: %s (%s), on %s\n", base, desc, backend_name(m->backend));
		printf("| %-36s | %9s | %7s | %14s | %22s | %6s | %9s |\n", "model", "size", "threads", "test",
		       "t/s (median ± sd)", "GB/s", "peak RSS");
		printf("| %.36s | %.9s | %.7s | %.14s | %.22s | %.6s | %.9s |\n", "------------------------------------",
		       "---------", "-------", "--------------", "----------------------", "------", "---------");
		for (int i = 0; i < n_res; i++) {
			char test[32];
			if (res[i].depth > 0)
				snprintf(test, sizeof(test), "%s%ld @ d%ld", res[i].test, res[i].n, res[i].depth);
			else
				snprintf(test, sizeof(test), "%s%ld", res[i].test, res[i].n);
			char gbs[16] = "-";
			if (res[i].read_gbs > 0)
				snprintf(gbs, sizeof(gbs), "%.1f", res[i].read_gbs);
			printf("| %-36.36s | %5.1f MiB | %7d | %14s | %12.2f ± %7.2f | %6s | %5.0f MiB |\n", base,
			       gguf_file_size(m->gguf) / 1048576.0, o.common.threads, test, res[i].median_tps,
			       res[i].stdev_tps, gbs, res[i].peak_rss_kib / 1024.0);
		}
		printf("peak RSS: %.1f MiB, KV cache %s: %.4f bits/value, %zu bytes/token\n",
		       ru.ru_maxrss / 1024.0, kv_name, kv_bits, kvcache_bytes_per_token(kv));
	}
	return LAB_EXIT_OK;
}
