/*
 * cmd_kvstats.c: `turbokv-lab kvstats`, per-layer reconstruction error of
 * KV types on real activations.
 *
 * One f32 pass over a window of the text through a recording cache
 * (kvcache_new_tap) captures every layer's keys (after RoPE), values,
 * queries and attention outputs. Then, for each KV type and layer:
 *   K, V: each head vector stored and read back with the layer's type
 *         (the kvstore's codec seeds; TQ outlier masks chosen from the
 *         layer's rows), mean cosine similarity and mean relative squared
 *         error ||x - x~||^2 / ||x||^2 over (token, kv-head);
 *   out:  the captured keys and values appended to a cache of that type
 *         and the captured queries attended over it (the same causal
 *         attention the model runs), compared per (token, query head)
 *         with the f32 output.
 * Errors do not propagate between layers here: every layer sees the f32
 * inputs (kld measures the end-to-end effect). First, per layer, the share
 * of the keys' energy that lies in their mean, ||mu||^2 / mean ||k||^2
 * (positions 1..T-1, averaged over kv-heads): what centering (+c,
 * kvtype.h) takes off the vectors a quantizer stores, and the same for
 * the values.
 */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/tq.h"
#include "engine/kv/fmt_tq.h"
#include "engine/kv/kvstore.h"
#include "engine/kv/kvtype.h"
#include "tools/turbokv-lab/lab.h"

#define KVSTATS_MAX_SPECS 64

typedef struct KvstatsOptions {
	LabCommon common;
	const char *text_path;
	long skip;
	long last;  /* --last: the out column over the last N tokens only (0: all) */
	int rounds; /* 0: the type's own; 1 or 2: Hadamard rounds of TQ codecs (K/V columns only) */
	bool mass; /* --mass: where the f32 attention goes (block 0, own block) */
	char *specs[KVSTATS_MAX_SPECS];
	int n_specs;
} KvstatsOptions;

/* What the tap captured: per layer, rows of all T tokens. */
typedef struct Capture {
	int64_t T;
	size_t kvdim, qdim;
	float *k, *v;   /* (n_layers, T, kvdim) */
	float *q, *out; /* (n_layers, T, qdim) */
} Capture;

/* Sums for mean cosine and mean relative squared error. */
typedef struct ErrAcc {
	double cos, rel;
	int64_t n;
} ErrAcc;

static void err_add(ErrAcc *a, const float *x, const float *y, int d)
{
	double xx = 0, yy = 0, xy = 0, ee = 0;
	for (int i = 0; i < d; i++) {
		xx += (double)x[i] * x[i];
		yy += (double)y[i] * y[i];
		xy += (double)x[i] * y[i];
		ee += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
	}
	if (xx <= 0)
		return;
	a->cos += yy > 0 ? xy / sqrt(xx * yy) : 0;
	a->rel += ee / xx;
	a->n++;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab kvstats --kv SPEC[,SPEC...] --text FILE [OPTIONS]\n\n"
		"Per layer: cosine similarity and relative squared error of the K and V\n"
		"reconstructions and of the attention output, on the keys, values and\n"
		"queries of one f32 pass over --ctx tokens of FILE (default 1024).\n\n"
		"  -k, --kv SPECS       KV types (repeatable)\n"
		"  -f, --text FILE      text (scripts/fidelity-text.sh prints ours)\n"
		"      --skip N         tokens of the text skipped first (default 0)\n"
		"      --rounds N       K/V columns: TQ codecs with N (1 or 2) Hadamard rounds\n"
		"                       instead of the type's (the out column keeps the type's)\n"
		"      --last N         the out column over the last N tokens only (their\n"
		"                       queries over the whole context: long-context error)\n"
		"      --mass           print per layer the f32 attention's mean weight on\n"
		"                       block 0 (positions 0..31) and on the query's own\n"
		"                       block (the last <= 32 positions), over the --last tokens\n"
		LAB_COMMON_HELP);
}

static int parse_args(int argc, char **argv, KvstatsOptions *o)
{
	enum { OPT_SKIP = 0x2000, OPT_ROUNDS, OPT_LAST, OPT_MASS };
	static const struct option longopts[] = {
		LAB_COMMON_LONGOPTS,
		{ "kv", required_argument, NULL, 'k' },
		{ "text", required_argument, NULL, 'f' },
		{ "skip", required_argument, NULL, OPT_SKIP },
		{ "rounds", required_argument, NULL, OPT_ROUNDS },
		{ "last", required_argument, NULL, OPT_LAST },
		{ "mass", no_argument, NULL, OPT_MASS },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	lab_common_init(&o->common);
	int c;
	long v;
	optind = 1;
	while ((c = getopt_long(argc, argv, LAB_COMMON_SHORTOPTS "k:f:h", longopts, NULL)) != -1) {
		int r = lab_common_option(&o->common, c, optarg);
		if (r < 0)
			return -1;
		if (r > 0)
			continue;
		switch (c) {
		case 'k':
			if (lab_specs_add(optarg, o->specs, &o->n_specs, KVSTATS_MAX_SPECS) < 0)
				return -1;
			break;
		case 'f':
			o->text_path = optarg;
			break;
		case OPT_SKIP:
			if ((o->skip = lab_parse_long("--skip", optarg, 0, 1L << 40)) < 0)
				return -1;
			break;
		case OPT_LAST:
			if ((o->last = lab_parse_long("--last", optarg, 1, 1L << 40)) < 0)
				return -1;
			break;
		case OPT_MASS:
			o->mass = true;
			break;
		case OPT_ROUNDS:
			if ((v = lab_parse_long("--rounds", optarg, 1, 2)) < 0)
				return -1;
			o->rounds = (int)v;
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
		fprintf(stderr, "turbokv-lab kvstats: --kv and --text are required\n");
		usage(stderr);
		return -1;
	}
	return 0;
}

static void capture_append(void *ud, int layer, int64_t pos0, int64_t n_tok, const float *k,
			   const float *v)
{
	Capture *c = ud;
	size_t at = ((size_t)layer * c->T + pos0) * c->kvdim, n = (size_t)n_tok * c->kvdim;
	memcpy(c->k + at, k, n * sizeof(float));
	memcpy(c->v + at, v, n * sizeof(float));
}

static void capture_attend(void *ud, int layer, int64_t pos0, int64_t n_tok, const float *q,
			   const float *out)
{
	Capture *c = ud;
	size_t at = ((size_t)layer * c->T + pos0) * c->qdim, n = (size_t)n_tok * c->qdim;
	memcpy(c->q + at, q, n * sizeof(float));
	memcpy(c->out + at, out, n * sizeof(float));
}

/*
 * The rows x (T, n_kv_heads, d) of layer/role as kv stores them, read
 * back (kvstore_load_row(): as attention from a later block reads them;
 * block 0 of a centered side is exact), the error into *acc.
 */
static void stored_error(const Capture *c, const KvCache *kv, int layer, KvRole role, int n_kv_heads,
			 int d, ErrAcc *acc)
{
	const float *x = (role == KV_ROLE_K ? c->k : c->v) + (size_t)layer * c->T * c->kvdim;
	float y[TQ_MAX_DIM];
	for (int h = 0; h < n_kv_heads; h++)
		for (int64_t i = 0; i < c->T; i++) {
			const float *row = x + i * c->kvdim + (size_t)h * d;
			kvstore_load_row(kv, layer, h, role, i, y);
			err_add(acc, row, y, d);
		}
}

/* mu of a centered side as kvcenter.h chooses it: the mean of positions 1..31, in double. */
static void key_mean(const float *x, size_t stride, int d, float *mu)
{
	for (int i = 0; i < d; i++) {
		double sum = 0;
		for (int p = 1; p < KV_BLOCK_TOKENS; p++)
			sum += x[(size_t)p * stride + i];
		mu[i] = (float)(sum / (KV_BLOCK_TOKENS - 1));
	}
}

/*
 * Store and read back the rows x (T, n_kv_heads, d) of layer/role with
 * type t, accumulating the error into *acc. The cache's own bytes, read
 * back; with --rounds, TQ types coded again here with codecs of that many
 * Hadamard rounds (the cache's seeds; +c with the cache's mu, block 0
 * exact). Returns 0 or -1.
 */
static int recon_error(const Capture *c, const KvCache *kv, const KvType *t, int layer,
		       KvRole role, int n_kv_heads, int rounds, ErrAcc *acc)
{
	const int d = t->dim;
	if (!rounds || t->format != KV_FORMAT_TQ) {
		stored_error(c, kv, layer, role, n_kv_heads, d, acc);
		return 0;
	}
	const float *x = (role == KV_ROLE_K ? c->k : c->v) + (size_t)layer * c->T * c->kvdim;
	_cleanup_(freep) uint8_t *code = malloc(kvtype_vec_bytes(t) + TQ_MAX_CODE_BYTES);
	_cleanup_(freep) float *y = malloc((size_t)d * sizeof(float));
	_cleanup_(freep) float *rows = malloc((size_t)c->T * d * sizeof(float));
	_cleanup_(freep) float *mu = calloc((size_t)d, sizeof(float));
	_cleanup_(freep) float *x_mu = malloc((size_t)d * sizeof(float));
	if (!code || !y || !rows || !mu || !x_mu)
		return -1;
	for (int h = 0; h < n_kv_heads; h++) {
		if (t->centered && c->T >= KV_BLOCK_TOKENS)
			key_mean(x + (size_t)h * d, c->kvdim, d, mu);
		TqDesc desc = t->tq;
		kvtq_derive_seeds(kvstore_seed(kv), layer, h, role, &desc.rot_seed, &desc.qjl_seed);
		if (!(desc.flags & TQ_FLAG_QJL))
			desc.qjl_seed = 0;
		if (desc.rotation != ROTATION_DENSE)
			desc.rounds = rounds;
		if (desc.group == TQ_GROUP_OUTLIER_CHANNELS) {
			for (int64_t i = 0; i < c->T; i++)
				memcpy(rows + i * d, x + i * c->kvdim + (size_t)h * d, (size_t)d * sizeof(float));
			if (tq_desc_choose_outliers(rows, (int)c->T, d, desc.n_hi, desc.mask) < 0)
				return -1;
		}
		Error err = { 0 };
		_cleanup_(tq_codec_freep) TqCodec *codec = NULL;
		if (tq_codec_new(&desc, &codec, &err) != 0) {
			fprintf(stderr, "turbokv-lab: codec: %s\n", err.msg);
			return -1;
		}
		for (int64_t i = 0; i < c->T; i++) {
			const float *row = x + i * c->kvdim + (size_t)h * d;
			if (t->centered && i < KV_BLOCK_TOKENS) {
				err_add(acc, row, row, d); /* kept exact */
				continue;
			}
			for (int j = 0; j < d; j++)
				x_mu[j] = t->centered ? row[j] - mu[j] : row[j];
			tq_encode(codec, x_mu, code);
			tq_decode(codec, code, y);
			if (t->centered)
				for (int j = 0; j < d; j++)
					y[j] += mu[j];
			err_add(acc, row, y, d);
		}
	}
	return 0;
}

/* share (n_layers,): ||mu||^2 / mean ||x||^2 of each layer's keys (x = c->k) or values, as in the header. */
static void mean_share(const Capture *c, const float *rows, int n_layers, int n_kv_heads, int d,
		       double *share)
{
	for (int l = 0; l < n_layers; l++) {
		share[l] = 0;
		if (c->T < 2)
			continue;
		for (int h = 0; h < n_kv_heads; h++) {
			double energy = 0, mu2 = 0;
			for (int i = 0; i < d; i++) {
				double sum = 0;
				for (int64_t t = 1; t < c->T; t++) {
					double x = rows[((size_t)l * c->T + t) * c->kvdim + (size_t)h * d + i];
					sum += x;
					energy += x * x;
				}
				double mu = sum / (double)(c->T - 1);
				mu2 += mu * mu;
			}
			share[l] += energy > 0 ? mu2 / (energy / (double)(c->T - 1)) / n_kv_heads : 0;
		}
	}
}

/*
 * Per layer, the mean over (token from..T-1, query head) of the f32
 * softmax weight on block 0 (b0) and on the query's own block (own): how
 * much of attention a format that keeps those rows exact would read exact.
 */
static int attn_mass(const Capture *c, const ModelConfig *cfg, int64_t from, double *b0,
		     double *own)
{
	const int d = cfg->head_dim, G = cfg->n_heads / cfg->n_kv_heads;
	const float scale = 1.0f / sqrtf((float)d);
	_cleanup_(freep) float *s = malloc((size_t)c->T * sizeof(float));
	if (!s)
		return -1;
	for (int l = 0; l < cfg->n_layers; l++) {
		double sum0 = 0, sumown = 0;
		int64_t n = 0;
		for (int64_t t = from; t < c->T; t++)
			for (int hq = 0; hq < cfg->n_heads; hq++) {
				const float *q = c->q + ((size_t)l * c->T + t) * c->qdim + (size_t)hq * d;
				const float *k = c->k + (size_t)l * c->T * c->kvdim + (size_t)(hq / G) * d;
				float m = -INFINITY;
				for (int64_t p = 0; p <= t; p++) {
					float dot = 0;
					for (int i = 0; i < d; i++)
						dot += q[i] * k[(size_t)p * c->kvdim + i];
					s[p] = dot * scale;
					m = fmaxf(m, s[p]);
				}
				double z = 0, z0 = 0, zo = 0;
				int64_t ob = t / KV_BLOCK_TOKENS * KV_BLOCK_TOKENS;
				for (int64_t p = 0; p <= t; p++) {
					double e = exp((double)(s[p] - m));
					z += e;
					z0 += p < KV_BLOCK_TOKENS ? e : 0;
					zo += p >= ob ? e : 0;
				}
				sum0 += z0 / z;
				sumown += zo / z;
				n++;
			}
		b0[l] = n ? sum0 / (double)n : 0;
		own[l] = n ? sumown / (double)n : 0;
	}
	return 0;
}

typedef struct LayerStats {
	ErrAcc k, v, out;
} LayerStats;

/* All layers of one spec into ls (n_layers,). Returns 0 or -1 (message printed). */
static int spec_stats(const Model *m, ThreadPool *tp, const Capture *c, const char *spec,
		      int rounds, int64_t last, LayerStats *ls, double *ret_bits)
{
	const ModelConfig *cfg = &m->cfg;
	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	if (lab_kvcache_new(m, spec, c->T, &kv, ret_bits) < 0)
		return -1;
	if (kvstore_is(kv))
		kvstore_set_keep_all(kv, true); /* every row read back below; attention is the same */
	_cleanup_(kvplan_freep) KvPlan *plan = NULL;
	Error err = { 0 };
	if (strcmp(spec, "f32") != 0 &&
	    kvplan_from_text(spec, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &plan, &err) != 0)
		return -1;
	_cleanup_(freep) float *out = malloc((size_t)c->T * c->qdim * sizeof(float));
	if (!out)
		return -1;
	for (int l = 0; l < cfg->n_layers; l++) {
		size_t kvat = (size_t)l * c->T * c->kvdim;
		/* the queries first, as the model shows them: pk keys weigh their pairs by them */
		kvcache_observe(kv, l, 0, c->T, c->q + (size_t)l * c->T * c->qdim);
		if (kvcache_append(kv, l, 0, c->T, c->k + kvat, c->v + kvat) != 0) {
			fprintf(stderr, "turbokv-lab: --kv %s: append failed\n", spec);
			return -1;
		}
	}
	kvcache_set_n_tokens(kv, c->T);
	int64_t from = last > 0 && last < c->T ? c->T - last : 0; /* the out column's first token */
	for (int l = 0; l < cfg->n_layers; l++) {
		memset(&ls[l], 0, sizeof(ls[l]));
		size_t qat = (size_t)l * c->T * c->qdim + (size_t)from * c->qdim;
		if (kvcache_attend(kv, tp, l, from, c->T - from, c->q + qat, out) != 0) {
			fprintf(stderr, "turbokv-lab: --kv %s: attention failed\n", spec);
			return -1;
		}
		if (kvstore_is(kv)) {
			const KvLayerTypes *lt = &plan->layers[l];
			if (recon_error(c, kv, &lt->k, l, KV_ROLE_K, cfg->n_kv_heads, rounds, &ls[l].k) < 0 ||
			    recon_error(c, kv, &lt->v, l, KV_ROLE_V, cfg->n_kv_heads, rounds, &ls[l].v) < 0)
				return -1;
		}
		for (int64_t i = 0; i < (c->T - from) * cfg->n_heads; i++)
			err_add(&ls[l].out, c->out + qat + i * cfg->head_dim, out + i * cfg->head_dim,
				cfg->head_dim);
	}
	return 0;
}

static double mean_of(const ErrAcc *a, bool cos)
{
	return a->n ? (cos ? a->cos : a->rel) / (double)a->n : (cos ? 1.0 : 0.0);
}

static void print_spec(const KvstatsOptions *o, const Model *m, const char *spec, double bits,
		       const LayerStats *ls, bool first)
{
	const int L = m->cfg.n_layers;
	ErrAcc all[3] = { 0 };
	for (int l = 0; l < L; l++) {
		const ErrAcc *e[3] = { &ls[l].k, &ls[l].v, &ls[l].out };
		for (int j = 0; j < 3; j++) {
			all[j].cos += mean_of(e[j], true);
			all[j].rel += mean_of(e[j], false);
			all[j].n++;
		}
	}
	if (o->common.json) {
		printf("%s{\"kv\":", first ? "" : ",");
		json_write_string(stdout, spec, strlen(spec));
		printf(",\"rounds\":%d", o->rounds);
		printf(",\"bits_per_value\":%.4f,\"mean\":{\"k_cos\":%.6f,\"k_rel\":%.6g,"
		       "\"v_cos\":%.6f,\"v_rel\":%.6g,\"out_cos\":%.6f,\"out_rel\":%.6g},\"layers\":[",
		       bits, mean_of(&all[0], true), mean_of(&all[0], false), mean_of(&all[1], true),
		       mean_of(&all[1], false), mean_of(&all[2], true), mean_of(&all[2], false));
		for (int l = 0; l < L; l++)
			printf("%s{\"k_cos\":%.6f,\"k_rel\":%.6g,\"v_cos\":%.6f,\"v_rel\":%.6g,"
			       "\"out_cos\":%.6f,\"out_rel\":%.6g}",
			       l ? "," : "", mean_of(&ls[l].k, true), mean_of(&ls[l].k, false),
			       mean_of(&ls[l].v, true), mean_of(&ls[l].v, false),
			       mean_of(&ls[l].out, true), mean_of(&ls[l].out, false));
		printf("]}");
		return;
	}
	printf("\nkv %s (%.3f bits/value)", spec, bits);
	if (o->rounds)
		printf(", K/V columns with %d Hadamard round(s)", o->rounds);
	printf("\n");
	printf("%5s %9s %10s %9s %10s %9s %10s\n", "layer", "K cos", "K relerr", "V cos", "V relerr",
	       "out cos", "out relerr");
	for (int l = 0; l < L; l++)
		printf("%5d %9.6f %10.3e %9.6f %10.3e %9.6f %10.3e\n", l, mean_of(&ls[l].k, true),
		       mean_of(&ls[l].k, false), mean_of(&ls[l].v, true), mean_of(&ls[l].v, false),
		       mean_of(&ls[l].out, true), mean_of(&ls[l].out, false));
	printf("%5s %9.6f %10.3e %9.6f %10.3e %9.6f %10.3e\n", "mean", mean_of(&all[0], true),
	       mean_of(&all[0], false), mean_of(&all[1], true), mean_of(&all[1], false),
	       mean_of(&all[2], true), mean_of(&all[2], false));
}

int cmd_kvstats(int argc, char **argv)
{
	KvstatsOptions o = { 0 };
	int rc = LAB_EXIT_FAILURE;
	Capture c = { 0 };
	ThreadPool *tp = NULL;
	ModelRun *run = NULL;
	_cleanup_(model_freep) Model *m = NULL;
	_cleanup_(tokenizer_freep) Tokenizer *tok = NULL;
	_cleanup_(freep) int32_t *ids = NULL;
	_cleanup_(freep) LayerStats *ls = NULL;
	_cleanup_(freep) char *text = NULL;
	size_t n_ids = 0, len;

	if (parse_args(argc, argv, &o) < 0) {
		rc = LAB_EXIT_USAGE;
		goto out;
	}
	if (o.common.device != DEVICE_CPU) {
		/* it hands captured rows in host memory to the caches it measures */
		fprintf(stderr, "turbokv-lab kvstats: runs on the CPU only (--device cpu)\n");
		return LAB_EXIT_USAGE;
	}
	if (lab_load(&o.common, &m, &tok) < 0 || !(text = lab_read_file(o.text_path, &len)))
		goto out;
	if (tokenizer_encode(tok, text, len, false, &ids, &n_ids) != 0)
		goto oom;
	const ModelConfig *cfg = &m->cfg;
	c.T = o.common.ctx ? o.common.ctx : 1024;
	if ((size_t)o.skip > n_ids || n_ids - (size_t)o.skip < (size_t)c.T) {
		fprintf(stderr, "turbokv-lab kvstats: the text has %zu tokens, fewer than %ld + %lld\n",
			n_ids, o.skip, (long long)c.T);
		goto out;
	}
	c.kvdim = (size_t)cfg->n_kv_heads * cfg->head_dim;
	c.qdim = (size_t)cfg->n_heads * cfg->head_dim;
	size_t rows = (size_t)cfg->n_layers * (size_t)c.T;
	c.k = malloc_array(rows * c.kvdim, sizeof(float));
	c.v = malloc_array(rows * c.kvdim, sizeof(float));
	c.q = malloc_array(rows * c.qdim, sizeof(float));
	c.out = malloc_array(rows * c.qdim, sizeof(float));
	ls = calloc((size_t)cfg->n_layers, sizeof(*ls));
	if (!c.k || !c.v || !c.q || !c.out || !ls)
		goto oom;
	if (threadpool_new(o.common.threads, &tp) < 0 || model_run_new(m, 512, tp, &run) < 0)
		goto oom;

	/* the f32 pass through the tap */
	{
		_cleanup_(kvcache_freep) KvCache *ref = NULL;
		_cleanup_(kvcache_freep) KvCache *tapped = NULL;
		KvCacheTap tap = { .userdata = &c, .on_append = capture_append,
				   .on_attend = capture_attend };
		if (lab_kvcache_new(m, "f32", c.T, &ref, NULL) < 0)
			goto out;
		if (kvcache_new_tap(ref, &tap, &tapped) < 0)
			goto oom;
		int32_t *w = ids + o.skip;
		if (tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0)
			w[0] = tokenizer_bos(tok);
		if (model_eval(m, run, tapped, w, c.T, NULL, NULL) != 0) {
			fprintf(stderr, "turbokv-lab: evaluation failed\n");
			goto out;
		}
	}

	{
		_cleanup_(freep) double *share = calloc((size_t)cfg->n_layers, sizeof(double));
		_cleanup_(freep) double *vshare = calloc((size_t)cfg->n_layers, sizeof(double));
		if (!share || !vshare)
			goto oom;
		mean_share(&c, c.k, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, share);
		mean_share(&c, c.v, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, vshare);
		double mean = 0, vmean = 0;
		for (int l = 0; l < cfg->n_layers; l++) {
			mean += share[l] / cfg->n_layers;
			vmean += vshare[l] / cfg->n_layers;
		}
		if (o.common.json) {
			printf("{\"ctx\":%lld,\"key_mean_share\":{\"mean\":%.4f,\"layers\":[", (long long)c.T,
			       mean);
			for (int l = 0; l < cfg->n_layers; l++)
				printf("%s%.4f", l ? "," : "", share[l]);
			printf("]},\"value_mean_share\":{\"mean\":%.4f,\"layers\":[", vmean);
			for (int l = 0; l < cfg->n_layers; l++)
				printf("%s%.4f", l ? "," : "", vshare[l]);
			printf("]},\"types\":[");
		} else {
			printf("keys' energy in their mean (what +c removes), per layer, mean %.2f:\n", mean);
			for (int l = 0; l < cfg->n_layers; l++)
				printf("%s%.2f", l % 15 ? " " : l ? "\n  " : "  ", share[l]);
			printf("\nvalues' energy in their mean, per layer, mean %.2f:\n", vmean);
			for (int l = 0; l < cfg->n_layers; l++)
				printf("%s%.2f", l % 15 ? " " : l ? "\n  " : "  ", vshare[l]);
			printf("\n");
		}
	}
	if (o.mass && !o.common.json) {
		int64_t from = o.last > 0 && o.last < c.T ? c.T - o.last : 0;
		_cleanup_(freep) double *b0 = calloc((size_t)cfg->n_layers, sizeof(double));
		_cleanup_(freep) double *own = calloc((size_t)cfg->n_layers, sizeof(double));
		if (!b0 || !own || attn_mass(&c, cfg, from, b0, own) < 0)
			goto oom;
		printf("f32 attention weight on block 0 / on the own block, per layer:\n");
		for (int l = 0; l < cfg->n_layers; l++)
			printf("%s%.2f/%.2f", l % 10 ? " " : l ? "\n  " : "  ", b0[l], own[l]);
		printf("\n");
		fflush(stdout);
	}
	for (int i = 0; i < o.n_specs; i++) {
		double bits = 0;
		if (spec_stats(m, tp, &c, o.specs[i], o.rounds, o.last, ls, &bits) < 0) {
			fprintf(stderr, "turbokv-lab kvstats: --kv %s failed\n", o.specs[i]);
			goto out;
		}
		print_spec(&o, m, o.specs[i], bits, ls, i == 0);
		fflush(stdout);
	}
	if (o.common.json)
		printf("]}\n");
	rc = LAB_EXIT_OK;
	goto out;
oom:
	fprintf(stderr, "turbokv-lab: out of memory\n");
out:
	model_run_free(run);
	threadpool_free(tp);
	free(c.k);
	free(c.v);
	free(c.q);
	free(c.out);
	for (int i = 0; i < o.n_specs; i++)
		free(o.specs[i]);
	return rc;
}
