/*
 * cmd_niah.c: `turbokv-lab niah`, needle-in-a-haystack recall of KV types
 * beside an f32 cache (turboquant.md section 6).
 *
 * One trial (context length L, depth d): the prompt is the model's chat
 * template around one user message: filler tokens of the text with the
 * needle sentence "The secret passphrase is <six digits>. Remember it."
 * inserted at a sentence end near fraction d of the filler, then the
 * question. A base model without a chat template (Gemma 3 270M) gets the
 * same filler and needle raw, BOS first, ending in "... The secret
 * passphrase mentioned in the text above is" for it to complete. The filler fills L tokens less the answer budget. The answer
 * is greedy (argmax); the trial succeeds when it contains the passphrase.
 * The passphrase of each (L, d) comes from --seed, so every KV type
 * answers the same questions. The prompt is assembled in token space
 * (template markup, filler ids, needle and question encoded separately),
 * and trials reuse the longest prefix they share with the previous one
 * (depths run from 100% down, so that prefix is the filler before the
 * needle). A compressed store's windowed layers keep every block here
 * (kvstore_set_keep_all(): attention is bit for bit the same, test-kvstore)
 * so that a trial can rewind to that prefix; a cache that cannot
 * (kvcache_rewind_floor()) starts over from 0.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/rotation.h"
#include "engine/kv/kvstore.h"
#include "engine/text/chat.h"
#include "tools/turbokv-lab/lab.h"

#define NIAH_MAX_SPECS 32
#define NIAH_MAX_LENGTHS 16
#define NIAH_MAX_DEPTHS 21
#define NIAH_ANSWER_TOKENS 24

typedef struct NiahOptions {
	LabCommon common;
	const char *text_path;
	char *specs[NIAH_MAX_SPECS];
	int n_specs;
	int64_t lengths[NIAH_MAX_LENGTHS];
	int n_lengths;
	int n_depths;
	uint64_t seed;
	bool verbose;
	bool no_reference; /* --no-f32: skip the f32 column (it is deterministic: reuse a run's) */
} NiahOptions;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab niah --text FILE [--kv SPEC[,SPEC...]] [OPTIONS]\n\n"
		"Needle-in-a-haystack recall: a passphrase sentence hidden in filler from\n"
		"FILE at depths 0..100%%, asked for through the chat template, greedy\n"
		"answer; success when the answer contains the passphrase. f32 is always\n"
		"run first as the reference column.\n\n"
		"  -k, --kv SPECS       KV types besides f32 (repeatable)\n"
		"  -f, --text FILE      filler text (scripts/fidelity-text.sh prints ours)\n"
		"  -L, --lengths LIST   context lengths, comma-separated (default\n"
		"                       1024,2048,4096,8192, at most the model's)\n"
		"  -d, --depths N       depths per length, evenly 0..100%% (default 5)\n"
		"  -s, --seed S         passphrase seed (default 1)\n"
		"  -v, --verbose        print each answer on stderr\n"
		"      --no-f32         leave the f32 column out (same --seed: same f32 answers)\n"
		LAB_COMMON_HELP);
}

static int parse_lengths(NiahOptions *o, const char *arg)
{
	const char *p = arg;
	o->n_lengths = 0;
	while (*p) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p || v < 64 || v > (1 << 20) || o->n_lengths >= NIAH_MAX_LENGTHS ||
		    (*end && *end != ',')) {
			fprintf(stderr, "turbokv-lab: --lengths '%s': a list of integers >= 64\n", arg);
			return -1;
		}
		o->lengths[o->n_lengths++] = v;
		p = *end ? end + 1 : end;
	}
	return o->n_lengths ? 0 : -1;
}

static int parse_args(int argc, char **argv, NiahOptions *o)
{
	static const struct option longopts[] = {
		LAB_COMMON_LONGOPTS,
		{ "kv", required_argument, NULL, 'k' },
		{ "text", required_argument, NULL, 'f' },
		{ "lengths", required_argument, NULL, 'L' },
		{ "depths", required_argument, NULL, 'd' },
		{ "seed", required_argument, NULL, 's' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "no-f32", no_argument, NULL, 0x2000 },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	lab_common_init(&o->common);
	o->n_depths = 5;
	o->seed = 1;
	o->specs[o->n_specs++] = strdup("f32");
	int c;
	long v;
	optind = 1;
	while ((c = getopt_long(argc, argv, LAB_COMMON_SHORTOPTS "k:f:L:d:s:vh", longopts, NULL)) !=
	       -1) {
		int r = lab_common_option(&o->common, c, optarg);
		if (r < 0)
			return -1;
		if (r > 0)
			continue;
		switch (c) {
		case 'k':
			if (lab_specs_add(optarg, o->specs, &o->n_specs, NIAH_MAX_SPECS) < 0)
				return -1;
			break;
		case 'f':
			o->text_path = optarg;
			break;
		case 'L':
			if (parse_lengths(o, optarg) < 0)
				return -1;
			break;
		case 'd':
			if ((v = lab_parse_long("--depths", optarg, 1, NIAH_MAX_DEPTHS)) < 0)
				return -1;
			o->n_depths = (int)v;
			break;
		case 's':
			if ((v = lab_parse_long("--seed", optarg, 0, 1L << 62)) < 0)
				return -1;
			o->seed = (uint64_t)v;
			break;
		case 'v':
			o->verbose = true;
			break;
		case 0x2000:
			o->no_reference = true;
			break;
		case 'h':
			usage(stdout);
			exit(LAB_EXIT_OK);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind != argc || !o->text_path || !o->specs[0] ||
	    (o->no_reference && o->n_specs < 2)) {
		fprintf(stderr, "turbokv-lab niah: --text is required (and --kv with --no-f32)\n");
		usage(stderr);
		return -1;
	}
	if (o->no_reference) {
		free(o->specs[0]);
		memmove(o->specs, o->specs + 1, (size_t)(o->n_specs - 1) * sizeof(o->specs[0]));
		o->n_specs--;
	}
	return 0;
}

/* Token ids of text; parse_special for template markup. NULL on failure. */
static int32_t *encode(const Tokenizer *tok, const char *text, bool special, size_t *ret_n)
{
	int32_t *ids = NULL;
	if (tokenizer_encode(tok, text, strlen(text), special, &ids, ret_n) != 0)
		return NULL;
	return ids;
}

/* The fixed parts of every prompt. */
typedef struct NiahParts {
	int32_t *pre, *post, *question; /* template before / after the content; question */
	size_t n_pre, n_post, n_question;
	int32_t *filler;                /* the text's ids */
	size_t n_filler;
} NiahParts;

static void parts_free(NiahParts *p)
{
	free(p->pre);
	free(p->post);
	free(p->question);
	free(p->filler);
}

static int parts_build(const Model *m, const Tokenizer *tok, const char *text, NiahParts *p)
{
	static const char marker[] = "\x01HAYSTACK\x01";
	Error err = { 0 };
	ChatTemplate tmpl;
	_cleanup_(freep) char *rendered = NULL;
	_cleanup_(freep) char *sys = chat_default_system_from_gguf(m->gguf);
	if (chat_template_from_gguf(m->gguf, &tmpl, &err) != 0) {
		/* a base model: the haystack raw, and a sentence for it to complete */
		fprintf(stderr, "turbokv-lab niah: %s: raw prompt\n", err.msg);
		p->pre = encode(tok, "", false, &p->n_pre);
		p->post = encode(tok, "", false, &p->n_post);
		p->question = encode(tok, "\n\nThe secret passphrase mentioned in the text above is", false,
				     &p->n_question);
		goto filler;
	}
	ChatMessage msg = { .role = "user", .content = marker };
	if (chat_render(tmpl, &msg, 1, sys, &rendered, &err) != 0)
		return -1;
	char *at = strstr(rendered, marker);
	if (!at)
		return -1;
	*at = 0;
	p->pre = encode(tok, rendered, true, &p->n_pre);
	p->post = encode(tok, at + strlen(marker), true, &p->n_post);
	p->question = encode(tok,
			     "\n\nWhat is the secret passphrase mentioned in the text above? "
			     "Answer with the passphrase only.",
			     false, &p->n_question);
filler:
	p->filler = encode(tok, text, false, &p->n_filler);
	if (!p->pre || !p->post || !p->question || !p->filler)
		return -1;
	if (tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0) {
		int32_t *with = realloc(p->pre, (p->n_pre + 1) * sizeof(int32_t));
		if (!with)
			return -1;
		memmove(with + 1, with, p->n_pre * sizeof(int32_t));
		with[0] = tokenizer_bos(tok);
		p->pre = with;
		p->n_pre++;
	}
	return 0;
}

/* Whether token id's piece ends a sentence ("." "!" "?" possibly before spaces). */
static bool ends_sentence(const Tokenizer *tok, int32_t id)
{
	size_t len;
	const char *s = tokenizer_piece(tok, id, &len);
	while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\n'))
		len--;
	return len > 0 && (s[len - 1] == '.' || s[len - 1] == '!' || s[len - 1] == '?');
}

/*
 * The prompt of trial (L, depth) into ids (capacity L): pre, n_h filler
 * ids with the needle after the sentence end at or before depth * n_h,
 * question, post. *ret_n its length. Returns 0 or -1 (L too small).
 */
static int prompt_build(const Tokenizer *tok, const NiahParts *p, const int32_t *needle,
			size_t n_needle, int64_t L, double depth, int32_t *ids, size_t *ret_n)
{
	size_t fixed = p->n_pre + p->n_post + p->n_question + n_needle + NIAH_ANSWER_TOKENS;
	if ((size_t)L <= fixed + 16 || p->n_filler < (size_t)L)
		return -1;
	size_t n_h = (size_t)L - fixed;
	size_t at = (size_t)(depth * (double)n_h + 0.5);
	if (at > n_h)
		at = n_h;
	if (at > 0 && at < n_h)
		while (at > 0 && !ends_sentence(tok, p->filler[at - 1]))
			at--;
	size_t n = 0;
	memcpy(ids + n, p->pre, p->n_pre * sizeof(int32_t));
	n += p->n_pre;
	memcpy(ids + n, p->filler, at * sizeof(int32_t));
	n += at;
	memcpy(ids + n, needle, n_needle * sizeof(int32_t));
	n += n_needle;
	memcpy(ids + n, p->filler + at, (n_h - at) * sizeof(int32_t));
	n += n_h - at;
	memcpy(ids + n, p->question, p->n_question * sizeof(int32_t));
	n += p->n_question;
	memcpy(ids + n, p->post, p->n_post * sizeof(int32_t));
	n += p->n_post;
	*ret_n = n;
	return 0;
}

static int argmax(const float *x, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/*
 * Evaluate prompt ids (n) in kv, whose first *cached tokens equal prev
 * (n_prev), then answer greedily into answer (NUL-terminated, size).
 * Returns 0 or -1.
 */
static int trial_run(const Model *m, ModelRun *run, const Tokenizer *tok, KvCache *kv,
		     const int32_t *ids, size_t n, const int32_t *prev, size_t n_prev, float *logits,
		     char *answer, size_t size)
{
	size_t lcp = 0;
	while (lcp < n && lcp < n_prev && ids[lcp] == prev[lcp])
		lcp++;
	if (lcp >= n)
		lcp = n - 1;
	if ((int64_t)lcp > kvcache_n_tokens(kv))
		lcp = (size_t)kvcache_n_tokens(kv);
	if ((int64_t)lcp < kvcache_rewind_floor(kv))
		lcp = 0; /* its windowed layers dropped what the prefix's end sees */
	kvcache_set_n_tokens(kv, (int64_t)lcp);
	if (model_eval(m, run, kv, ids + lcp, (int64_t)(n - lcp), logits, NULL) != 0)
		return -1;
	size_t len = 0;
	answer[0] = 0;
	for (int t = 0; t < NIAH_ANSWER_TOKENS; t++) {
		int32_t next = argmax(logits, m->cfg.n_vocab);
		if (tokenizer_is_eog(tok, next))
			break;
		size_t pl;
		const char *piece = tokenizer_piece(tok, next, &pl);
		if (len + pl < size) {
			memcpy(answer + len, piece, pl);
			len += pl;
			answer[len] = 0;
		}
		if (t + 1 == NIAH_ANSWER_TOKENS || kvcache_n_tokens(kv) >= kv->shape.capacity)
			break;
		if (model_eval(m, run, kv, &next, 1, logits, NULL) != 0)
			return -1;
	}
	return 0;
}

static void print_results(const NiahOptions *o, const uint8_t *ok, const double *bits)
{
	const int D = o->n_depths;
	if (o->common.json) {
		printf("{\"depths\":%d,\"seed\":%llu,\"types\":[", D, (unsigned long long)o->seed);
		for (int s = 0; s < o->n_specs; s++) {
			int hits = 0;
			printf("%s{\"kv\":", s ? "," : "");
			json_write_string(stdout, o->specs[s], strlen(o->specs[s]));
			printf(",\"bits_per_value\":%.4f,\"lengths\":[", bits[s]);
			for (int l = 0; l < o->n_lengths; l++) {
				printf("%s{\"ctx\":%lld,\"found\":[", l ? "," : "", (long long)o->lengths[l]);
				for (int d = 0; d < D; d++) {
					int v = ok[((size_t)s * o->n_lengths + l) * D + d];
					hits += v;
					printf("%s%s", d ? "," : "", v ? "true" : "false");
				}
				printf("]}");
			}
			printf("],\"recall\":%.4f}", (double)hits / (o->n_lengths * D));
		}
		printf("]}\n");
		return;
	}
	printf("needle recall: %d depths from 0%% to 100%% per length, seed %llu (x = found)\n", D,
	       (unsigned long long)o->seed);
	printf("%-30s %6s", "kv", "bits");
	for (int l = 0; l < o->n_lengths; l++)
		printf(" %*lld", D > 6 ? D : 6, (long long)o->lengths[l]);
	printf("  recall\n");
	for (int s = 0; s < o->n_specs; s++) {
		int hits = 0;
		printf("%-30s %6.3f", o->specs[s], bits[s]);
		for (int l = 0; l < o->n_lengths; l++) {
			char cell[NIAH_MAX_DEPTHS + 1];
			for (int d = 0; d < D; d++) {
				int v = ok[((size_t)s * o->n_lengths + l) * D + d];
				hits += v;
				cell[d] = v ? 'x' : '.';
			}
			cell[D] = 0;
			printf(" %*s", D > 6 ? D : 6, cell);
		}
		printf("  %d/%d\n", hits, o->n_lengths * D);
	}
}

int cmd_niah(int argc, char **argv)
{
	NiahOptions o = { 0 };
	int rc = LAB_EXIT_FAILURE;
	NiahParts p = { 0 };
	ThreadPool *tp = NULL;
	ModelRun *run = NULL;
	_cleanup_(model_freep) Model *m = NULL;
	_cleanup_(tokenizer_freep) Tokenizer *tok = NULL;
	_cleanup_(freep) char *text = NULL;
	_cleanup_(freep) uint8_t *ok = NULL;
	_cleanup_(freep) int32_t *ids = NULL;
	_cleanup_(freep) int32_t *prev = NULL;
	_cleanup_(freep) float *logits = NULL;
	double bits[NIAH_MAX_SPECS] = { 0 };
	size_t len;

	if (parse_args(argc, argv, &o) < 0) {
		rc = LAB_EXIT_USAGE;
		goto out;
	}
	if (lab_load(&o.common, &m, &tok) < 0 || !(text = lab_read_file(o.text_path, &len)))
		goto out;
	int64_t limit = m->cfg.n_ctx_train > 0 ? m->cfg.n_ctx_train : 8192;
	if (o.n_lengths == 0) {
		static const int64_t def[] = { 1024, 2048, 4096, 8192 };
		for (size_t i = 0; i < ARRAY_SIZE(def); i++)
			if (def[i] <= limit)
				o.lengths[o.n_lengths++] = def[i];
	}
	int64_t max_len = 0;
	for (int l = 0; l < o.n_lengths; l++)
		max_len = MAX(max_len, o.lengths[l]);
	for (int s = 0; s < o.n_specs; s++) { /* bad specs fail now, not after the f32 trials */
		_cleanup_(kvcache_freep) KvCache *probe = NULL;
		if (lab_kvcache_new(m, o.specs[s], max_len, &probe, NULL) < 0) {
			rc = LAB_EXIT_USAGE;
			goto out;
		}
	}
	if (parts_build(m, tok, text, &p) < 0) {
		fprintf(stderr, "turbokv-lab niah: cannot build the prompt parts\n");
		goto out;
	}
	const int D = o.n_depths;
	ok = calloc((size_t)o.n_specs * o.n_lengths * D, 1);
	ids = malloc((size_t)max_len * sizeof(int32_t));
	prev = malloc((size_t)max_len * sizeof(int32_t));
	logits = malloc((size_t)m->cfg.n_vocab * sizeof(float));
	if (!ok || !ids || !prev || !logits || threadpool_new(o.common.threads, &tp) < 0 ||
	    model_run_new(m, 512, tp, &run) < 0) {
		fprintf(stderr, "turbokv-lab: out of memory\n");
		goto out;
	}

	for (int s = 0; s < o.n_specs; s++) {
		_cleanup_(kvcache_freep) KvCache *kv = NULL;
		if (lab_kvcache_new(m, o.specs[s], max_len, &kv, &bits[s]) < 0)
			goto out;
		if (kvstore_is(kv))
			kvstore_set_keep_all(kv, true); /* trials rewind to their shared prefix */
		size_t n_prev = 0;
		Rng rng;
		rng_init(&rng, o.seed);
		for (int l = 0; l < o.n_lengths; l++) {
			for (int d = D - 1; d >= 0; d--) {
				/* the passphrase of (l, d): the same for every KV type */
				Rng r = rng;
				for (int k = 0; k <= l * D + d; k++)
					rng_next(&r);
				uint64_t x = rng_next(&r);
				char phrase[64], sentence[128];
				snprintf(phrase, sizeof(phrase), "%06u", (unsigned)(x % 900000 + 100000));
				snprintf(sentence, sizeof(sentence),
					 " The secret passphrase is %s. Remember it.", phrase);
				size_t n_needle, n;
				_cleanup_(freep) int32_t *needle = encode(tok, sentence, false, &n_needle);
				double depth = D > 1 ? (double)d / (D - 1) : 0.5;
				if (!needle || prompt_build(tok, &p, needle, n_needle, o.lengths[l], depth,
							    ids, &n) < 0) {
					fprintf(stderr, "turbokv-lab niah: length %lld does not fit\n",
						(long long)o.lengths[l]);
					goto out;
				}
				char answer[256];
				if (trial_run(m, run, tok, kv, ids, n, prev, n_prev, logits, answer,
					      sizeof(answer)) < 0) {
					fprintf(stderr, "turbokv-lab niah: evaluation failed\n");
					goto out;
				}
				memcpy(prev, ids, n * sizeof(int32_t));
				n_prev = n;
				bool hit = strstr(answer, phrase) != NULL;
				ok[((size_t)s * o.n_lengths + l) * D + d] = hit;
				if (o.verbose)
					fprintf(stderr, "%s L=%lld depth=%.0f%% %s: %s -> \"%s\"\n",
						o.specs[s], (long long)o.lengths[l], depth * 100,
						hit ? "found" : "missed", phrase, answer);
			}
		}
		fprintf(stderr, "niah: %s done\n", o.specs[s]);
	}
	print_results(&o, ok, bits);
	rc = LAB_EXIT_OK;
out:
	model_run_free(run);
	threadpool_free(tp);
	parts_free(&p);
	for (int i = 0; i < o.n_specs; i++)
		free(o.specs[i]);
	return rc;
}
