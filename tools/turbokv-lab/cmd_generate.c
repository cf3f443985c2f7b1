/*
 * cmd_generate.c: `turbokv-lab generate`, engine-only text generation.
 *
 * Tokenize the prompt (optionally through the model's chat template),
 * prefill it in one batched pass, then decode one token at a time until
 * an end-of-generation token, -n tokens, or the end of the context.
 */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/sampler.h"
#include "engine/text/chat.h"
#include "tools/turbokv-lab/lab.h"

typedef struct GenerateOptions {
	LabCommon common;
	const char *prompt;
	const char *prompt_file;
	const char *system;
	const char *kv;   /* --kv SPEC, NULL: f32 */
	long n_predict;
	bool chat;
	bool ids;
	bool raw_special; /* parse special tokens in a plain prompt */
	SamplerParams sampling;
} GenerateOptions;

enum {
	OPT_GREEDY = 0x2000, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT_PENALTY,
	OPT_REPEAT_LAST_N, OPT_SEED, OPT_CHAT, OPT_SYSTEM, OPT_IDS, OPT_SPECIAL, OPT_KV, OPT_HELP,
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab generate [OPTIONS] (-p PROMPT | -f FILE)\n\n"
		"  -p, --prompt TEXT   prompt text\n"
		"  -f, --file PATH     read the prompt from a file ('-': stdin)\n"
		"  -n, --n-predict N   tokens to generate (default 128)\n"
		"      --chat          wrap the prompt as a user message in the model's chat template\n"
		"      --system TEXT   system message for --chat\n"
		"      --special       parse special tokens (<|im_start|>...) in a plain prompt\n"
		"      --greedy        always take the most likely token (same as --temp 0)\n"
		"      --temp T        temperature (default 0.7)\n"
		"      --top-k K       (default 40, 0: off)\n"
		"      --top-p P       (default 0.95, 1: off)\n"
		"      --min-p P       (default 0.05, 0: off)\n"
		"      --repeat-penalty R  (default 1.0: off)\n"
		"      --repeat-last-n N   (default 64)\n"
		"      --seed S        sampling seed (default 0)\n"
		"      --ids           print token ids instead of text\n"
		"      --kv SPEC       KV cache types (kvtype.h grammar: tq4, q8_0:q4_0, ...; default f32)\n"
		LAB_COMMON_HELP);
}

static int parse_args(int argc, char **argv, GenerateOptions *o)
{
	static const struct option longopts[] = {
		LAB_COMMON_LONGOPTS,
		{ "prompt", required_argument, NULL, 'p' },
		{ "file", required_argument, NULL, 'f' },
		{ "n-predict", required_argument, NULL, 'n' },
		{ "greedy", no_argument, NULL, OPT_GREEDY },
		{ "temp", required_argument, NULL, OPT_TEMP },
		{ "top-k", required_argument, NULL, OPT_TOP_K },
		{ "top-p", required_argument, NULL, OPT_TOP_P },
		{ "min-p", required_argument, NULL, OPT_MIN_P },
		{ "repeat-penalty", required_argument, NULL, OPT_REPEAT_PENALTY },
		{ "repeat-last-n", required_argument, NULL, OPT_REPEAT_LAST_N },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "chat", no_argument, NULL, OPT_CHAT },
		{ "system", required_argument, NULL, OPT_SYSTEM },
		{ "ids", no_argument, NULL, OPT_IDS },
		{ "special", no_argument, NULL, OPT_SPECIAL },
		{ "kv", required_argument, NULL, OPT_KV },
		{ "help", no_argument, NULL, OPT_HELP },
		{}
	};
	int c, r;
	long v;
	double d;

	lab_common_init(&o->common);
	o->n_predict = 128;
	o->sampling = sampler_params_default();
	optind = 1;
	while ((c = getopt_long(argc, argv, LAB_COMMON_SHORTOPTS "p:f:n:", longopts, NULL)) != -1) {
		if ((r = lab_common_option(&o->common, c, optarg)) != 0) {
			if (r < 0)
				return -1;
			continue;
		}
		switch (c) {
		case 'p': o->prompt = optarg; break;
		case 'f': o->prompt_file = optarg; break;
		case 'n':
			if ((v = lab_parse_long("--n-predict", optarg, 0, 1 << 24)) < 0)
				return -1;
			o->n_predict = v;
			break;
		case OPT_GREEDY: o->sampling.temperature = 0.0f; break;
		case OPT_TEMP:
			if ((d = lab_parse_double("--temp", optarg, 0, 100)) < -1e299)
				return -1;
			o->sampling.temperature = (float)d;
			break;
		case OPT_TOP_K:
			if ((v = lab_parse_long("--top-k", optarg, 0, 1 << 24)) < 0)
				return -1;
			o->sampling.top_k = (int)v;
			break;
		case OPT_TOP_P:
			if ((d = lab_parse_double("--top-p", optarg, 0, 1)) < -1e299)
				return -1;
			o->sampling.top_p = (float)d;
			break;
		case OPT_MIN_P:
			if ((d = lab_parse_double("--min-p", optarg, 0, 1)) < -1e299)
				return -1;
			o->sampling.min_p = (float)d;
			break;
		case OPT_REPEAT_PENALTY:
			if ((d = lab_parse_double("--repeat-penalty", optarg, 0.01, 100)) < -1e299)
				return -1;
			o->sampling.repeat_penalty = (float)d;
			break;
		case OPT_REPEAT_LAST_N:
			if ((v = lab_parse_long("--repeat-last-n", optarg, 0, 1 << 24)) < 0)
				return -1;
			o->sampling.repeat_last_n = (int)v;
			break;
		case OPT_SEED: {
			char *end;
			o->sampling.seed = strtoull(optarg, &end, 0);
			if (*end || end == optarg) {
				fprintf(stderr, "turbokv-lab: --seed: '%s' is not an integer\n", optarg);
				return -1;
			}
			break;
		}
		case OPT_CHAT: o->chat = true; break;
		case OPT_SYSTEM: o->system = optarg; break;
		case OPT_IDS: o->ids = true; break;
		case OPT_SPECIAL: o->raw_special = true; break;
		case OPT_KV: o->kv = lab_spec_resolve(optarg); break;
		case OPT_HELP: usage(stdout); exit(LAB_EXIT_OK);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "turbokv-lab generate: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (!o->prompt == !o->prompt_file) {
		fprintf(stderr, "turbokv-lab generate: give exactly one of --prompt and --file\n");
		return -1;
	}
	return 0;
}

/* The prompt's token ids, through the chat template if asked. */
static int build_prompt(const GenerateOptions *o, const Model *m, const Tokenizer *tok,
			int32_t **ret_ids, size_t *ret_n)
{
	_cleanup_(freep) char *file_text = NULL;
	_cleanup_(freep) char *rendered = NULL;
	_cleanup_(freep) char *default_system = NULL;
	_cleanup_(freep) uint8_t *is_content = NULL;
	const char *text = o->prompt;
	size_t len = text ? strlen(text) : 0;
	bool special = o->raw_special;
	Error err = { 0 };

	if (o->prompt_file) {
		if (!(file_text = lab_read_file(o->prompt_file, &len)))
			return -1;
		text = file_text;
	}
	if (o->chat) {
		ChatTemplate tmpl;
		if (chat_template_from_gguf(m->gguf, &tmpl, &err) != 0) {
			fprintf(stderr, "turbokv-lab: --chat: %s\n", err.msg);
			return -1;
		}
		ChatMessage msgs[2];
		size_t n = 0;
		if (o->system)
			msgs[n++] = (ChatMessage){ .role = "system", .content = o->system };
		msgs[n++] = (ChatMessage){ .role = "user", .content = text };
		default_system = chat_default_system_from_gguf(m->gguf);
		if (chat_render_marked(tmpl, msgs, n, default_system, &rendered, &is_content, &err) != 0) {
			fprintf(stderr, "turbokv-lab: --chat: %s\n", err.msg[0] ? err.msg : "out of memory");
			return -1;
		}
		text = rendered;
		len = strlen(rendered);
	}

	/* with --chat, special tokens are parsed in the template's markup only */
	int32_t *ids;
	size_t n;
	int k = is_content ? tokenizer_encode_marked(tok, text, len, is_content, &ids, &n)
			   : tokenizer_encode(tok, text, len, special, &ids, &n);
	if (k != 0) {
		fprintf(stderr, "turbokv-lab: out of memory while tokenizing\n");
		return -1;
	}
	if (tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0) {
		int32_t *with = realloc(ids, (n + 1) * sizeof(*ids));
		if (!with) {
			free(ids);
			return -1;
		}
		memmove(with + 1, with, n * sizeof(*with));
		with[0] = tokenizer_bos(tok);
		ids = with;
		n++;
	}
	*ret_ids = ids;
	*ret_n = n;
	return 0;
}

static void print_model_error(int r)
{
	if (r == MODEL_E_CONTEXT)
		fprintf(stderr, "turbokv-lab: the prompt does not fit in the context (use --ctx)\n");
	else if (r < 0)
		fprintf(stderr, "turbokv-lab: evaluation failed: %s\n", strerror(-r));
	else
		fprintf(stderr, "turbokv-lab: evaluation failed (code %d)\n", r);
}

int cmd_generate(int argc, char **argv)
{
	GenerateOptions o = { 0 };
	if (parse_args(argc, argv, &o) < 0)
		return LAB_EXIT_USAGE;

	_cleanup_(model_freep) Model *m = NULL;
	_cleanup_(tokenizer_freep) Tokenizer *tok = NULL;
	if (lab_load(&o.common, &m, &tok) < 0)
		return LAB_EXIT_FAILURE;

	_cleanup_(freep) int32_t *prompt = NULL;
	size_t n_prompt = 0;
	if (build_prompt(&o, m, tok, &prompt, &n_prompt) < 0)
		return LAB_EXIT_FAILURE;
	if (n_prompt == 0) {
		fprintf(stderr, "turbokv-lab: the prompt is empty\n");
		return LAB_EXIT_USAGE;
	}

	int64_t n_ctx = o.common.ctx ? o.common.ctx : MIN(m->cfg.n_ctx_train, 8192);
	if ((int64_t)n_prompt > n_ctx) {
		fprintf(stderr, "turbokv-lab: the prompt has %zu tokens, more than the context of %lld (use --ctx)\n",
			n_prompt, (long long)n_ctx);
		return LAB_EXIT_FAILURE;
	}

	ThreadPool *tp_raw = NULL;
	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	_cleanup_(model_run_freep) ModelRun *run = NULL;
	_cleanup_(sampler_freep) Sampler *sampler = NULL;
	int r;
	if (lab_kvcache_new(m, o.kv, n_ctx, &kv, NULL) < 0)
		return LAB_EXIT_FAILURE;
	if (threadpool_new(o.common.threads, &tp_raw) < 0 || model_run_new(m, 512, tp_raw, &run) < 0 || sampler_new(&o.sampling, m->cfg.n_vocab, &sampler) < 0) {
		fprintf(stderr, "turbokv-lab: out of memory\n");
		threadpool_free(tp_raw);
		return LAB_EXIT_FAILURE;
	}

	size_t cap = n_prompt + (size_t)o.n_predict;
	_cleanup_(freep) int32_t *history = malloc_array(cap, sizeof(int32_t));
	_cleanup_(freep) float *logits = malloc_array(m->cfg.n_vocab, sizeof(float));
	_cleanup_(freep) char *text = malloc(1);
	size_t text_len = 0;
	if (!history || !logits || !text) {
		threadpool_free(tp_raw);
		return LAB_EXIT_FAILURE;
	}
	memcpy(history, prompt, n_prompt * sizeof(int32_t));
	size_t n_hist = n_prompt;

	uint64_t t0 = now_ns();
	r = model_eval(m, run, kv, prompt, (int64_t)n_prompt, logits, NULL);
	uint64_t t_prefill = now_ns() - t0;
	const char *finish = "length";
	long n_gen = 0;
	t0 = now_ns();
	while (r == 0 && n_gen < o.n_predict) {
		int32_t next = sampler_sample(sampler, logits, history, n_hist);
		if (tokenizer_is_eog(tok, next)) {
			finish = "stop";
			break;
		}
		history[n_hist++] = next;
		n_gen++;
		size_t plen;
		const char *piece = tokenizer_piece(tok, next, &plen);
		if (!o.common.json) {
			if (o.ids)
				printf("%s%d", n_gen > 1 ? " " : "", next);
			else
				fwrite(piece, 1, plen, stdout);
			fflush(stdout);
		}
		char *grown = realloc(text, text_len + plen + 1);
		if (!grown) {
			r = -ENOMEM;
			break;
		}
		text = grown;
		memcpy(text + text_len, piece, plen);
		text_len += plen;
		if (n_gen == o.n_predict)
			break;
		if (kvcache_n_tokens(kv) >= n_ctx) {
			finish = "context";
			break;
		}
		r = model_eval(m, run, kv, &next, 1, logits, NULL);
	}
	uint64_t t_decode = now_ns() - t0;
	threadpool_free(tp_raw);
	if (r != 0) {
		if (!o.common.json)
			putchar('\n');
		print_model_error(r);
		return LAB_EXIT_FAILURE;
	}

	double prefill_tps = n_prompt / (t_prefill / 1e9);
	double decode_tps = n_gen > 1 ? (n_gen - 1) / (t_decode / 1e9) : 0.0;
	if (o.common.json) {
		printf("{\"prompt_tokens\": %zu, \"completion_tokens\": %ld, \"finish_reason\": \"%s\", ",
		       n_prompt, n_gen, finish);
		printf("\"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, \"tokens\": [",
		       prefill_tps, decode_tps);
		for (long i = 0; i < n_gen; i++)
			printf("%s%d", i ? ", " : "", history[n_prompt + i]);
		printf("], \"text\": ");
		json_write_string(stdout, text, text_len);
		printf("}\n");
	} else {
		putchar('\n');
		fprintf(stderr, "[prompt %zu tokens, %.1f tok/s; generated %ld tokens, %.1f tok/s; %s]\n",
			n_prompt, prefill_tps, n_gen, decode_tps, finish);
	}
	return LAB_EXIT_OK;
}
