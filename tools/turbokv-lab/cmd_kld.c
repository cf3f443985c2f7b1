/*
 * cmd_kld.c: `turbokv-lab kld`, the fidelity of KV types against an f32
 * cache on the same weights (turboquant.md section 6).
 *
 * Teacher-forced over a text in windows of --ctx tokens (the first token
 * of each window replaced by BOS when the model wants one). As in
 * llama.cpp's perplexity/KL-divergence tool, only the second half of each
 * window is scored: the logits at positions n/2 .. n-2 predicting tokens
 * n/2+1 .. n-1, so every scored token sees at least n/2 tokens of
 * context (KV error grows with context; the first tokens say little).
 * For each window the f32 reference runs once; its log-probabilities are
 * kept and every KV type of --kv is compared against them. Per type:
 * bits per value, mean KL(P_f32 || P_type) with its standard error, the
 * 99th percentile of the per-token KLD, top-1 agreement, both perplexities
 * and their ratio.
 *
 * Owns the command only; the cache comes from lab_kvcache_new().
 */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/turbokv-lab/lab.h"

#define KLD_MAX_SPECS 64
#define KLD_SCORE_BATCH 128 /* logits rows evaluated at once */

typedef struct KldOptions {
	LabCommon common;
	const char *text_path;
	long chunks;
	long skip;      /* tokens skipped at the start of the text */
	char *specs[KLD_MAX_SPECS];
	int n_specs;
} KldOptions;

/* Running statistics of one KV type. */
typedef struct KldStats {
	const char *spec;
	double bits;
	double sum_kld, sum_kld2;
	double *klds;     /* (n_scored,) per-token KLD, for the percentile */
	int64_t n;        /* tokens scored */
	int64_t same_top; /* argmax equal to the reference's */
	double nll;       /* sum of -log p(next token) */
	double seconds;
	int failed;
} KldStats;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab kld --kv SPEC[,SPEC...] --text FILE [OPTIONS]\n\n"
		"KL divergence of the next-token distributions with each KV type against\n"
		"an f32 KV cache (the reference, computed once per window), teacher-forced\n"
		"over FILE in windows of --ctx tokens. Only the second half of each window\n"
		"is scored (llama.cpp's convention). Several specs in one run share the f32\n"
		"pass; a comma followed by a layer override (N=...) stays in its spec.\n\n"
		"  -k, --kv SPECS       KV types to compare (repeatable)\n"
		"  -f, --text FILE      text to score (scripts/fidelity-text.sh prints ours)\n"
		"  -n, --chunks K       windows to score (default 1)\n"
		"      --skip N         tokens of the text skipped first (default 0)\n" LAB_COMMON_HELP);
}

static int parse_args(int argc, char **argv, KldOptions *o)
{
	enum { OPT_SKIP = 0x2000 };
	static const struct option longopts[] = {
		LAB_COMMON_LONGOPTS,
		{ "kv", required_argument, NULL, 'k' },
		{ "text", required_argument, NULL, 'f' },
		{ "chunks", required_argument, NULL, 'n' },
		{ "skip", required_argument, NULL, OPT_SKIP },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	lab_common_init(&o->common);
	o->chunks = 1;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, LAB_COMMON_SHORTOPTS "k:f:n:h", longopts, NULL)) != -1) {
		int r = lab_common_option(&o->common, c, optarg);
		if (r < 0)
			return -1;
		if (r > 0)
			continue;
		switch (c) {
		case 'k':
			if (lab_specs_add(optarg, o->specs, &o->n_specs, KLD_MAX_SPECS) < 0)
				return -1;
			break;
		case 'f':
			o->text_path = optarg;
			break;
		case 'n':
			if ((o->chunks = lab_parse_long("--chunks", optarg, 1, 1 << 20)) < 0)
				return -1;
			break;
		case OPT_SKIP:
			if ((o->skip = lab_parse_long("--skip", optarg, 0, 1L << 40)) < 0)
				return -1;
			break;
		case 'h':
			usage(stdout);
			exit(LAB_EXIT_OK);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind != argc || !o->text_path || o->n_specs == 0) {
		fprintf(stderr, "turbokv-lab kld: --kv and --text are required\n");
		usage(stderr);
		return -1;
	}
	return 0;
}

/* lp (n,) <- log-softmax of x (n,); returns the argmax. */
static int log_softmax(const float *x, int n, float *lp)
{
	int best = 0;
	float mx = x[0];
	for (int i = 1; i < n; i++)
		if (x[i] > mx) {
			mx = x[i];
			best = i;
		}
	double s = 0;
	for (int i = 0; i < n; i++)
		s += exp((double)(x[i] - mx));
	float lse = mx + (float)log(s);
	for (int i = 0; i < n; i++)
		lp[i] = x[i] - lse;
	return best;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/*
 * Evaluate window w (n tokens) with the KV spec (NULL: f32) and score
 * rows first .. n-2. ref_lp (n-1-first, n_vocab) and ref_top are written
 * when ref is set, else read. Returns 0 or -1 (message printed).
 */
static int kld_window(const Model *m, ModelRun *run, const int32_t *w, int64_t n, const char *spec,
		      bool ref, float *ref_lp, int32_t *ref_top, KldStats *st)
{
	const int nv = m->cfg.n_vocab;
	const int64_t first = n / 2, n_score = n - 1 - first;
	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	if (lab_kvcache_new(m, spec, n, &kv, &st->bits) < 0)
		return -1;
	_cleanup_(freep) float *logits = malloc((size_t)KLD_SCORE_BATCH * nv * sizeof(float));
	_cleanup_(freep) float *lp = malloc((size_t)nv * sizeof(float));
	if (!logits || !lp) {
		fprintf(stderr, "turbokv-lab: out of memory\n");
		return -1;
	}
	uint64_t t0 = now_ns();
	int r = model_eval(m, run, kv, w, first, NULL, NULL);
	for (int64_t b = 0; r == 0 && b < n_score; b += KLD_SCORE_BATCH) {
		int64_t nb = MIN(KLD_SCORE_BATCH, n_score - b);
		if ((r = model_eval(m, run, kv, w + first + b, nb, NULL, logits)) != 0)
			break;
		for (int64_t i = 0; i < nb; i++) {
			int64_t row = b + i;
			int32_t next = w[first + row + 1];
			float *rl = ref_lp + (size_t)row * nv;
			if (ref) {
				ref_top[row] = log_softmax(logits + (size_t)i * nv, nv, rl);
				st->nll -= rl[next];
				st->n++;
				continue;
			}
			int top = log_softmax(logits + (size_t)i * nv, nv, lp);
			double kld = 0;
			for (int j = 0; j < nv; j++)
				kld += exp((double)rl[j]) * ((double)rl[j] - lp[j]);
			kld = kld < 0 ? 0 : kld; /* rounding */
			st->klds[st->n++] = kld;
			st->sum_kld += kld;
			st->sum_kld2 += kld * kld;
			st->same_top += top == ref_top[row];
			st->nll -= lp[next];
		}
	}
	st->seconds += (double)(now_ns() - t0) * 1e-9;
	if (r != 0) {
		fprintf(stderr, "turbokv-lab: --kv %s: evaluation failed (%d)\n", spec ? spec : "f32", r);
		return -1;
	}
	return 0;
}

/* Summary numbers of one type (ref: the f32 reference's statistics). */
typedef struct KldSummary {
	double mean, stderr_mean, p99, top1, ppl, ppl_ratio;
} KldSummary;

static KldSummary kld_summary(KldStats *st, const KldStats *ref)
{
	KldSummary s = { 0 };
	if (st->n == 0)
		return s;
	double n = (double)st->n;
	s.mean = st->sum_kld / n;
	double var = st->sum_kld2 / n - s.mean * s.mean;
	s.stderr_mean = st->n > 1 && var > 0 ? sqrt(var / (n - 1)) : 0;
	qsort(st->klds, (size_t)st->n, sizeof(double), cmp_double);
	s.p99 = st->klds[MIN(st->n - 1, (int64_t)ceil(0.99 * n) - 1)];
	s.top1 = (double)st->same_top / n;
	s.ppl = exp(st->nll / n);
	s.ppl_ratio = s.ppl / exp(ref->nll / (double)ref->n);
	return s;
}

static void print_report(const KldOptions *o, KldStats *st, const KldStats *ref, int64_t ctx,
			 long windows)
{
	double ref_ppl = ref->n ? exp(ref->nll / (double)ref->n) : 0;
	if (o->common.json) {
		printf("{\"model\":");
		json_write_string(stdout, o->common.model_path, strlen(o->common.model_path));
		printf(",\"ctx\":%lld,\"windows\":%ld,\"scored\":\"second half\",\"tokens_scored\":%lld,"
		       "\"ppl_f32\":%.6f,\"types\":[",
		       (long long)ctx, windows, (long long)ref->n, ref_ppl);
		for (int i = 0; i < o->n_specs; i++) {
			KldSummary s = kld_summary(&st[i], ref);
			printf("%s{\"kv\":", i ? "," : "");
			json_write_string(stdout, st[i].spec, strlen(st[i].spec));
			if (st[i].failed) {
				printf(",\"error\":true}");
				continue;
			}
			printf(",\"bits_per_value\":%.4f,\"kld_mean\":%.6g,\"kld_stderr\":%.3g,"
			       "\"kld_p99\":%.6g,\"top1\":%.6f,\"ppl\":%.6f,\"ppl_ratio\":%.6f,"
			       "\"seconds\":%.1f}",
			       st[i].bits, s.mean, s.stderr_mean, s.p99, s.top1, s.ppl, s.ppl_ratio,
			       st[i].seconds);
		}
		printf("]}\n");
		return;
	}
	printf("ctx %lld, %ld window(s), %lld tokens scored (second half of each window), "
	       "f32 PPL %.4f\n",
	       (long long)ctx, windows, (long long)ref->n, ref_ppl);
	printf("%-34s %6s %10s %9s %10s %7s %9s %8s\n", "kv", "bits", "KLD mean", "+-", "KLD p99",
	       "top-1", "PPL", "ratio");
	for (int i = 0; i < o->n_specs; i++) {
		if (st[i].failed) {
			printf("%-34s failed\n", st[i].spec);
			continue;
		}
		KldSummary s = kld_summary(&st[i], ref);
		printf("%-34s %6.3f %10.6f %9.6f %10.6f %7.4f %9.4f %8.5f\n", st[i].spec, st[i].bits,
		       s.mean, s.stderr_mean, s.p99, s.top1, s.ppl, s.ppl_ratio);
	}
}

/* The text's tokens (no BOS added). */
static int tokenize_text(const Tokenizer *tok, const char *path, int32_t **ret, size_t *ret_n)
{
	size_t len;
	_cleanup_(freep) char *text = lab_read_file(path, &len);
	if (!text)
		return -1;
	if (tokenizer_encode(tok, text, len, false, ret, ret_n) != 0) {
		fprintf(stderr, "turbokv-lab: out of memory while tokenizing\n");
		return -1;
	}
	return 0;
}

int cmd_kld(int argc, char **argv)
{
	KldOptions o = { 0 };
	int rc = LAB_EXIT_FAILURE;
	KldStats st[KLD_MAX_SPECS] = { 0 };
	KldStats ref = { .spec = "f32" };
	ThreadPool *tp = NULL;
	ModelRun *run = NULL;
	float *ref_lp = NULL;
	int32_t *ref_top = NULL;
	_cleanup_(model_freep) Model *m = NULL;
	_cleanup_(tokenizer_freep) Tokenizer *tok = NULL;
	_cleanup_(freep) int32_t *ids = NULL;
	_cleanup_(freep) int32_t *w = NULL;
	size_t n_ids = 0;

	if (parse_args(argc, argv, &o) < 0) {
		rc = LAB_EXIT_USAGE;
		goto out;
	}
	if (lab_load(&o.common, &m, &tok) < 0 || tokenize_text(tok, o.text_path, &ids, &n_ids) < 0)
		goto out;
	int64_t n = o.common.ctx ? o.common.ctx : MIN(m->cfg.n_ctx_train, 8192);
	if (n < 4) {
		fprintf(stderr, "turbokv-lab kld: --ctx must be at least 4\n");
		rc = LAB_EXIT_USAGE;
		goto out;
	}
	if (n_ids < (size_t)o.skip || (n_ids - (size_t)o.skip) / (size_t)n < (size_t)o.chunks) {
		fprintf(stderr, "turbokv-lab kld: the text has %zu tokens, fewer than %ld + %ld x %lld\n",
			n_ids, o.skip, o.chunks, (long long)n);
		goto out;
	}
	for (int i = 0; i < o.n_specs; i++) { /* bad specs fail now, not after the f32 pass */
		_cleanup_(kvcache_freep) KvCache *probe = NULL;
		if (lab_kvcache_new(m, o.specs[i], n, &probe, NULL) < 0) {
			rc = LAB_EXIT_USAGE;
			goto out;
		}
	}
	const int64_t n_score = n - 1 - n / 2;
	const int nv = m->cfg.n_vocab;
	if ((size_t)n_score > SIZE_MAX / sizeof(float) / (size_t)nv)
		goto out;
	ref_lp = malloc((size_t)n_score * nv * sizeof(float));
	ref_top = malloc((size_t)n_score * sizeof(int32_t));
	w = malloc((size_t)n * sizeof(int32_t));
	for (int i = 0; i < o.n_specs; i++) {
		st[i].spec = o.specs[i];
		st[i].klds = malloc((size_t)(n_score * o.chunks) * sizeof(double));
		if (!st[i].klds)
			goto oom;
	}
	if (!ref_lp || !ref_top || !w)
		goto oom;
	if (threadpool_new(o.common.threads, &tp) < 0 || model_run_new(m, 512, tp, &run) < 0)
		goto oom;

	for (long c = 0; c < o.chunks; c++) {
		memcpy(w, ids + o.skip + c * n, (size_t)n * sizeof(int32_t));
		if (tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0)
			w[0] = tokenizer_bos(tok);
		if (kld_window(m, run, w, n, NULL, true, ref_lp, ref_top, &ref) < 0)
			goto out;
		fprintf(stderr, "window %ld/%ld: f32 PPL so far %.4f (%.0f s)\n", c + 1, o.chunks,
			exp(ref.nll / (double)ref.n), ref.seconds);
		for (int i = 0; i < o.n_specs; i++) {
			if (st[i].failed)
				continue;
			if (kld_window(m, run, w, n, st[i].spec, false, ref_lp, ref_top, &st[i]) < 0) {
				st[i].failed = 1;
				continue;
			}
			KldSummary s = kld_summary(&st[i], &ref);
			fprintf(stderr,
				"window %ld/%ld: %-30s bits %.3f KLD %.6f +- %.6f p99 %.6f top-1 %.4f "
				"PPL ratio %.5f (%.0f s)\n",
				c + 1, o.chunks, st[i].spec, st[i].bits, s.mean, s.stderr_mean, s.p99,
				s.top1, s.ppl_ratio, st[i].seconds);
		}
	}
	print_report(&o, st, &ref, n, o.chunks);
	rc = LAB_EXIT_OK;
	for (int i = 0; i < o.n_specs; i++)
		if (st[i].failed)
			rc = LAB_EXIT_FAILURE;
	goto out;
oom:
	fprintf(stderr, "turbokv-lab: out of memory\n");
out:
	model_run_free(run);
	threadpool_free(tp);
	free(ref_lp);
	free(ref_top);
	for (int i = 0; i < o.n_specs; i++) {
		free(st[i].klds);
		free(o.specs[i]);
	}
	return rc;
}
