/*
 * turbokv.c: the turbokv command-line client (ask, chat, status, sessions).
 *
 * A thin main() over libturbokv: argument parsing, printing, the SIGINT
 * handler (which cancels the running generation), and the mapping of
 * library errors to documented exit codes. Everything that talks to the
 * daemon is in client.c.
 *
 * Exit codes (stable; scripts may rely on them):
 *   0    success (also a generation that stopped at max tokens or a full context)
 *   1    the daemon refused or failed the request (any daemon error code)
 *   2    usage: bad option or argument, unreadable --file
 *   3    cannot connect to the daemon (no socket, refused, no permission)
 *   4    the connection broke: protocol error, or the daemon closed it mid-request
 *   130  interrupted (SIGINT): the generation was cancelled
 * Errors are one line on stderr: "turbokv: error: CODE: message", CODE
 * being the name of the daemon's ErrorCode (SESSION_NOT_FOUND,
 * CONTEXT_OVERFLOW, ...) or CONNECT, PROTOCOL, SERVER_CLOSED,
 * INVALID_ARGUMENT, IO, NO_MEMORY. With --json the same error is also
 * written to stdout as {"error":{"code":"CODE","message":"..."}}.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "turbokv/client.h"

enum {
	EXIT_OK = 0,
	EXIT_SERVER = 1,
	EXIT_USAGE = 2,
	EXIT_CONNECT = 3,
	EXIT_PROTOCOL = 4,
	EXIT_INTERRUPTED = 130,
};

#define MAX_FILES 16
#define CLIENT_NAME "turbokv-cli/" TKV_VERSION

/* What the SIGINT handler touches; set around each generation. */
static TkvClient *volatile sigint_client;
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	TkvClient *c = sigint_client;
	(void)sig;
	interrupted = 1;
	if (c)
		tkv_cancel(c, 0);
}

/* No SA_RESTART: a blocking read at the chat prompt returns EINTR. */
static void sigint_install(void)
{
	struct sigaction sa = { .sa_handler = on_sigint };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
}

/* ------------------------------------------------------------------------ */
/* Output helpers */

static void json_cstr(FILE *f, const char *s)
{
	json_write_string(f, s ? s : "", s ? strlen(s) : 0);
}

static int exit_code_for(int code)
{
	if (tkv_error_is_server(code))
		return EXIT_SERVER;
	switch (code) {
	case TKV_E_CONNECT: return EXIT_CONNECT;
	case TKV_E_PROTOCOL:
	case TKV_E_SERVER_CLOSED: return EXIT_PROTOCOL;
	case TKV_E_INVALID_ARGUMENT:
	case TKV_E_IO: return EXIT_USAGE;
	default: return EXIT_SERVER;
	}
}

/* Print err as documented and return the exit code for it. */
static int report_error(const TkvError *err, bool json)
{
	const char *name = tkv_error_code_name(err->code);
	if (!name)
		name = "UNKNOWN";
	fprintf(stderr, "turbokv: error: %s: %s\n", name, err->message);
	if (json) {
		printf("{\"error\":{\"code\":");
		json_cstr(stdout, name);
		printf(",\"message\":");
		json_cstr(stdout, err->message);
		printf("}}\n");
		fflush(stdout);
	}
	return exit_code_for(err->code);
}

static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fputs("turbokv: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'turbokv %s--help'.\n", cmd ? cmd : "");
	return EXIT_USAGE;
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	if (!s || !*s || *s == '-' || *s == '+')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return false;
	*ret = v;
	return true;
}

static bool parse_float(const char *s, float *ret)
{
	char *end;
	float v;
	if (!s || !*s)
		return false;
	errno = 0;
	v = strtof(s, &end);
	if (errno || *end || !isfinite(v) || v < 0)
		return false;
	*ret = v;
	return true;
}

/* Growable byte buffer for collected answers. */
typedef struct Buf {
	char *data;
	size_t len, cap;
} Buf;

static bool buf_append(Buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *d;
		while (cap < b->len + n + 1) {
			if (cap > SIZE_MAX / 2)
				return false;
			cap *= 2;
		}
		d = realloc(b->data, cap);
		if (!d)
			return false;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, s, n);
	b->len += n;
	b->data[b->len] = 0;
	return true;
}

/* ------------------------------------------------------------------------ */
/* Streaming */

typedef struct Stream {
	bool json;          /* collect, print at the end */
	bool progress_tty;  /* draw prefill progress on stderr */
	bool progress_shown;
	bool oom;
	Buf text;
} Stream;

static void progress_clear(Stream *s)
{
	if (s->progress_shown) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
		s->progress_shown = false;
	}
}

static void stream_on_progress(uint64_t id, uint32_t done, uint32_t total, void *userdata)
{
	Stream *s = userdata;
	(void)id;
	if (!s->progress_tty || total == 0)
		return;
	fprintf(stderr, "\r\033[Kprefill %u/%u tokens (%u%%)", done, total,
		(unsigned)((uint64_t)done * 100 / total));
	fflush(stderr);
	s->progress_shown = true;
}

static void stream_on_token(uint64_t id, const char *text, size_t len, uint32_t token_id, void *userdata)
{
	Stream *s = userdata;
	(void)id;
	(void)token_id;
	progress_clear(s);
	if (!buf_append(&s->text, text, len))
		s->oom = true;
	if (!s->json && len) {
		fwrite(text, 1, len, stdout);
		fflush(stdout);
	}
}

/* Run one generation with SIGINT cancelling it. Returns the library's code. */
static int run_generate(TkvClient *c, const TkvRequest *req, Stream *s, TkvResult *res, TkvError *err)
{
	TkvCallbacks cb = {
		.on_progress = stream_on_progress,
		.on_token = stream_on_token,
		.userdata = s,
	};
	int r;

	sigint_client = c;
	if (interrupted)
		tkv_cancel(c, 0);
	r = tkv_generate(c, req, &cb, res, err);
	sigint_client = NULL;
	progress_clear(s);
	return r;
}

static void print_result_json(const Stream *s, const TkvResult *res)
{
	printf("{\"text\":");
	json_write_string(stdout, s->text.data ? s->text.data : "", s->text.len);
	printf(",\"finish_reason\":\"%s\",\"request_id\":%llu,\"prompt_tokens\":%u,\"cached_tokens\":%u,"
	       "\"completion_tokens\":%u,\"dropped_tokens\":%u,\"prefill_ms\":%.3f,\"decode_ms\":%.3f,"
	       "\"ttft_ms\":%.3f}\n",
	       tkv_finish_reason_name(res->finish_reason), (unsigned long long)res->request_id,
	       res->prompt_tokens, res->cached_tokens, res->completion_tokens, res->dropped_tokens,
	       res->prefill_ms, res->decode_ms, res->ttft_ms);
	fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* Options shared by ask and chat */

typedef struct GenOpts {
	const char *socket;
	const char *session;
	const char *system;
	TkvAttachment files[MAX_FILES];
	size_t n_files;
	uint32_t max_tokens;
	TkvContextPolicy on_overflow; /* TKV_CONTEXT_ERROR: none given */
	TkvSampling sampling;
	bool json;
} GenOpts;

enum {
	OPT_SOCKET = 0x100,
	OPT_SYSTEM,
	OPT_TEMP,
	OPT_GREEDY,
	OPT_SEED,
	OPT_JSON,
	OPT_ON_OVERFLOW,
};

static const struct option gen_options[] = {
	{ "help", no_argument, NULL, 'h' },
	{ "file", required_argument, NULL, 'f' },
	{ "session", required_argument, NULL, 's' },
	{ "system", required_argument, NULL, OPT_SYSTEM },
	{ "max-tokens", required_argument, NULL, 'n' },
	{ "temp", required_argument, NULL, OPT_TEMP },
	{ "greedy", no_argument, NULL, OPT_GREEDY },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "on-overflow", required_argument, NULL, OPT_ON_OVERFLOW },
	{ 0 },
};

/*
 * Parse ask/chat options from argv (argv[0] is the command). Returns -1
 * when parsed (optind at the first operand), or an exit code.
 */
static int gen_opts_parse(const char *cmd, int argc, char **argv, GenOpts *o, void (*help)(void))
{
	int ch;
	uint64_t v;

	optind = 1;
	while ((ch = getopt_long(argc, argv, "hf:s:n:", gen_options, NULL)) != -1) {
		switch (ch) {
		case 'h':
			help();
			return EXIT_OK;
		case 'f':
			if (o->n_files == MAX_FILES)
				return usage_error(cmd, "at most %d --file options", MAX_FILES);
			o->files[o->n_files++] = (TkvAttachment){ .kind = TKV_ATTACH_FILE, .path = optarg };
			break;
		case 's':
			if (!tkv_session_name_valid(optarg))
				return usage_error(cmd, "invalid session name '%s' (allowed: [A-Za-z0-9._-]{1,64})",
						   optarg);
			o->session = optarg;
			break;
		case OPT_SYSTEM:
			o->system = optarg;
			break;
		case 'n':
			if (!parse_u64(optarg, 1u << 24, &v))
				return usage_error(cmd, "invalid -n '%s' (0 to %u)", optarg, 1u << 24);
			o->max_tokens = (uint32_t)v;
			break;
		case OPT_TEMP:
			if (!parse_float(optarg, &o->sampling.temperature) || o->sampling.temperature > 100.0f)
				return usage_error(cmd, "invalid --temp '%s' (0 to 100)", optarg);
			o->sampling.set |= TKV_SAMPLING_TEMPERATURE;
			break;
		case OPT_GREEDY:
			o->sampling.greedy = true;
			break;
		case OPT_SEED:
			if (!parse_u64(optarg, UINT64_MAX, &o->sampling.seed))
				return usage_error(cmd, "invalid --seed '%s'", optarg);
			o->sampling.set |= TKV_SAMPLING_SEED;
			break;
		case OPT_SOCKET:
			o->socket = optarg;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_ON_OVERFLOW:
			if (strcmp(optarg, "error") == 0)
				o->on_overflow = TKV_CONTEXT_ERROR_SET;
			else if (strcmp(optarg, "drop-oldest") == 0)
				o->on_overflow = TKV_CONTEXT_TRUNCATE_OLDEST;
			else
				return usage_error(cmd, "invalid --on-overflow '%s' (error or drop-oldest)", optarg);
			break;
		default:
			return usage_error(cmd, "invalid usage of '%s'", cmd);
		}
	}
	return -1;
}

static int connect_or_report(const char *socket, TkvClient **ret, bool json)
{
	TkvError err = {0};
	int r = tkv_client_connect(socket, CLIENT_NAME, ret, &err);
	return r ? report_error(&err, json) : -1;
}

/* ------------------------------------------------------------------------ */
/* ask */

static void ask_help(void)
{
	printf("Usage: turbokv ask [OPTIONS] QUESTION\n"
	       "\n"
	       "Ask the daemon one question and stream the answer to stdout (followed by a\n"
	       "newline if it does not end with one). QUESTION '-' reads it from stdin.\n"
	       "On a terminal, prefill progress is shown on stderr. Ctrl-C cancels (exit 130).\n"
	       "\n"
	       "  -f, --file PATH       attach a text document (sealed memfd); repeatable, up to 16\n"
	       "  -s, --session NAME    continue (or create) the named session\n"
	       "      --system TEXT     system prompt\n"
	       "  -n, --max-tokens N    at most N answer tokens (0: the daemon's limit, 1024\n"
	       "                        unless configured)\n"
	       "      --on-overflow error|drop-oldest  when the conversation outgrows the context:\n"
	       "                        refuse (exit code of CONTEXT_OVERFLOW), or drop its oldest\n"
	       "                        turns; a session keeps the choice (default: the daemon's)\n"
	       "      --temp T          sampling temperature (0: greedy)\n"
	       "      --greedy          always the most likely token\n"
	       "      --seed S          sampler seed, for reproducible answers\n"
	       "      --socket PATH     daemon socket (default: $TURBOKV_SOCKET,\n"
	       "                        $XDG_RUNTIME_DIR/turbokv/turbokv.sock, /run/turbokv/turbokv.sock)\n"
	       "      --json            print one JSON object at the end instead of streaming\n"
	       "  -h, --help            this help\n"
	       "\n"
	       "Exit status: 0 ok, 1 daemon error, 2 usage, 3 cannot connect,\n"
	       "4 connection broken/protocol error, 130 interrupted.\n");
}

static char *read_stdin(void)
{
	Buf b = {0};
	char chunk[4096];
	size_t n;
	while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0)
		if (!buf_append(&b, chunk, n)) {
			free(b.data);
			return NULL;
		}
	if (ferror(stdin)) {
		free(b.data);
		return NULL;
	}
	return b.data ? b.data : strdup("");
}

static int cmd_ask(int argc, char **argv)
{
	GenOpts o = {0};
	TkvMessage msgs[2];
	TkvRequest req = {0};
	TkvResult res = {0};
	TkvError err = {0};
	TkvClient *c = NULL;
	Stream s = {0};
	char *question_buf = NULL;
	const char *question;
	size_t n = 0;
	int r;

	r = gen_opts_parse("ask ", argc, argv, &o, ask_help);
	if (r >= 0)
		return r;
	if (argc - optind != 1)
		return usage_error("ask ", argc - optind ? "too many arguments (quote the question)"
							 : "missing QUESTION");
	question = argv[optind];
	if (strcmp(question, "-") == 0) {
		question = question_buf = read_stdin();
		if (!question_buf) {
			fprintf(stderr, "turbokv: error: IO: cannot read the question from stdin\n");
			return EXIT_USAGE;
		}
	}

	s.json = o.json;
	s.progress_tty = !o.json && isatty(STDERR_FILENO);
	if (o.system)
		msgs[n++] = (TkvMessage){ TKV_ROLE_SYSTEM, o.system };
	msgs[n++] = (TkvMessage){ TKV_ROLE_USER, question };
	req.messages = msgs;
	req.n_messages = n;
	req.attachments = o.files;
	req.n_attachments = o.n_files;
	req.sampling = o.sampling.set || o.sampling.greedy ? &o.sampling : NULL;
	req.max_tokens = o.max_tokens;
	req.context_policy = o.on_overflow;
	req.session = o.session;

	sigint_install();
	r = connect_or_report(o.socket, &c, o.json);
	if (r >= 0)
		goto out;
	r = run_generate(c, &req, &s, &res, &err);
	if (r == 0) {
		if (o.json)
			print_result_json(&s, &res);
		else if (s.text.len && s.text.data[s.text.len - 1] != '\n') {
			fputc('\n', stdout);
			fflush(stdout);
		}
		r = res.finish_reason == TKV_FINISH_CANCELLED && interrupted ? EXIT_INTERRUPTED : EXIT_OK;
	} else {
		if (!o.json && s.text.len)
			fputc('\n', stdout);
		if (interrupted && r == TKV_E_CANCELLED)
			r = EXIT_INTERRUPTED;
		else
			r = report_error(&err, o.json);
	}
	if (r == EXIT_INTERRUPTED)
		fprintf(stderr, "turbokv: interrupted\n");
out:
	tkv_client_free(c);
	free(question_buf);
	free(s.text.data);
	return r;
}

/* ------------------------------------------------------------------------ */
/* chat */

static void chat_help(void)
{
	printf("Usage: turbokv chat [OPTIONS]\n"
	       "\n"
	       "Interactive conversation: each line read from stdin is a user message, the\n"
	       "answer streams to stdout. '/exit' or end of input ends it (exit 0). Ctrl-C\n"
	       "cancels the answer being generated; at the prompt it ends the chat (exit 130).\n"
	       "Without --session the conversation is kept here and sent whole each turn;\n"
	       "with --session the daemon keeps it and only new turns are sent.\n"
	       "\n"
	       "  -s, --session NAME    continue (or create) the named session\n"
	       "      --system TEXT     system prompt\n"
	       "  -f, --file PATH       attach a document to the first turn; repeatable\n"
	       "  -n, --max-tokens N    at most N tokens per answer (0: the daemon's limit)\n"
	       "      --on-overflow error|drop-oldest  as for 'turbokv ask'\n"
	       "      --temp T, --greedy, --seed S   sampling, as for 'turbokv ask'\n"
	       "      --socket PATH     daemon socket\n"
	       "  -h, --help            this help\n");
}

typedef struct History {
	TkvMessage *msgs;
	char **owned;   /* (n,) the strings msgs point to */
	size_t n, cap;
} History;

static bool history_push(History *h, TkvRole role, const char *text, size_t len)
{
	char *copy;
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 16;
		TkvMessage *m = realloc(h->msgs, cap * sizeof(*m));
		char **o;
		if (!m)
			return false;
		h->msgs = m;
		o = realloc(h->owned, cap * sizeof(*o));
		if (!o)
			return false;
		h->owned = o;
		h->cap = cap;
	}
	copy = strndup(text ? text : "", len);
	if (!copy)
		return false;
	h->owned[h->n] = copy;
	h->msgs[h->n++] = (TkvMessage){ role, copy };
	return true;
}

static void history_pop(History *h)
{
	free(h->owned[--h->n]);
}

static void history_free(History *h)
{
	while (h->n)
		history_pop(h);
	free(h->msgs);
	free(h->owned);
}

static int cmd_chat(int argc, char **argv)
{
	GenOpts o = {0};
	History h = {0};
	TkvClient *c = NULL;
	char *line = NULL;
	size_t line_cap = 0, sent = 0;
	bool tty = isatty(STDIN_FILENO), first = true;
	int r, ret = EXIT_OK;

	r = gen_opts_parse("chat ", argc, argv, &o, chat_help);
	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("chat ", "unexpected argument '%s'", argv[optind]);

	sigint_install();
	r = connect_or_report(o.socket, &c, false);
	if (r >= 0)
		return r;
	if (o.system && !history_push(&h, TKV_ROLE_SYSTEM, o.system, strlen(o.system))) {
		ret = EXIT_SERVER;
		goto out;
	}

	for (;;) {
		TkvRequest req = {0};
		TkvResult res = {0};
		TkvError err = {0};
		Stream s = { .progress_tty = isatty(STDERR_FILENO) };
		ssize_t n;

		if (tty) {
			fputs("> ", stderr);
			fflush(stderr);
		}
		interrupted = 0;
		n = getline(&line, &line_cap, stdin);
		if (n < 0) {
			if (interrupted) {
				fputc('\n', stderr);
				ret = EXIT_INTERRUPTED;
			}
			break;
		}
		if (n > 0 && line[n - 1] == '\n')
			line[--n] = 0;
		if (n == 0)
			continue;
		if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0)
			break;
		if (!history_push(&h, TKV_ROLE_USER, line, (size_t)n)) {
			ret = EXIT_SERVER;
			break;
		}

		/* a session holds what was sent before: send only the new turns */
		req.messages = o.session ? h.msgs + sent : h.msgs;
		req.n_messages = o.session ? h.n - sent : h.n;
		req.session = o.session;
		req.max_tokens = o.max_tokens;
		req.context_policy = o.on_overflow;
		req.sampling = o.sampling.set || o.sampling.greedy ? &o.sampling : NULL;
		if (first) {
			req.attachments = o.files;
			req.n_attachments = o.n_files;
		}
		r = run_generate(c, &req, &s, &res, &err);
		if (s.text.len)
			fputc('\n', stdout);
		fflush(stdout);
		if (r == 0 || (r == TKV_E_CANCELLED && interrupted)) {
			if (!history_push(&h, TKV_ROLE_ASSISTANT, s.text.data, s.text.len)) {
				free(s.text.data);
				ret = EXIT_SERVER;
				break;
			}
			sent = h.n;
			first = false;
		} else {
			history_pop(&h);
			ret = report_error(&err, false);
			if (ret == EXIT_PROTOCOL) {
				free(s.text.data);
				break;
			}
			ret = EXIT_OK;
		}
		free(s.text.data);
	}
out:
	free(line);
	history_free(&h);
	tkv_client_free(c);
	return ret;
}

/* ------------------------------------------------------------------------ */
/* status and sessions */

static const struct option simple_options[] = {
	{ "help", no_argument, NULL, 'h' },
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "on-overflow", required_argument, NULL, OPT_ON_OVERFLOW },
	{ 0 },
};

/* Parse --socket/--json/--help; returns -1 when parsed, or an exit code. */
static int simple_opts_parse(const char *cmd, int argc, char **argv, const char **socket, bool *json,
			     void (*help)(void))
{
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "h", simple_options, NULL)) != -1) {
		switch (ch) {
		case 'h':
			help();
			return EXIT_OK;
		case OPT_SOCKET:
			*socket = optarg;
			break;
		case OPT_JSON:
			*json = true;
			break;
		default:
			return usage_error(cmd, "invalid usage of '%s'", cmd);
		}
	}
	return -1;
}

static void status_help(void)
{
	printf("Usage: turbokv status [--socket PATH] [--json]\n"
	       "\n"
	       "Print the daemon's state (model, KV type, device, load) as 'key: value' lines,\n"
	       "or one JSON object with --json.\n");
}

static int cmd_status(int argc, char **argv)
{
	const char *socket = NULL;
	bool json = false;
	TkvClient *c = NULL;
	TkvStatus *st = NULL;
	TkvError err = {0};
	int r;

	r = simple_opts_parse("status ", argc, argv, &socket, &json, status_help);
	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("status ", "unexpected argument '%s'", argv[optind]);
	r = connect_or_report(socket, &c, json);
	if (r >= 0)
		return r;
	r = tkv_status(c, &st, &err);
	if (r != 0) {
		r = report_error(&err, json);
		tkv_client_free(c);
		return r;
	}
	if (json) {
		printf("{\"server_version\":");
		json_cstr(stdout, st->server_version);
		printf(",\"model_name\":");
		json_cstr(stdout, st->model_name);
		printf(",\"model_fingerprint\":");
		json_cstr(stdout, st->model_fingerprint);
		printf(",\"kv_type\":");
		json_cstr(stdout, st->kv_type);
		printf(",\"device\":");
		json_cstr(stdout, st->device);
		printf(",\"context_size\":%u,\"n_threads\":%u,\"uptime_ms\":%llu,\"connections\":%u,"
		       "\"requests_active\":%u,\"requests_queued\":%u,\"sessions_in_memory\":%u,"
		       "\"session_memory_bytes\":%llu,\"session_memory_budget_bytes\":%llu,"
		       "\"kv_bits_per_value\":%.4f,\"tokens_generated\":%llu}\n",
		       st->context_size, st->n_threads, (unsigned long long)st->uptime_ms, st->connections,
		       st->requests_active, st->requests_queued, st->sessions_in_memory,
		       (unsigned long long)st->session_memory_bytes,
		       (unsigned long long)st->session_memory_budget_bytes, st->kv_bits_per_value,
		       (unsigned long long)st->tokens_generated);
	} else {
		printf("server_version: %s\nmodel: %s\nmodel_fingerprint: %s\nkv_type: %s\n"
		       "kv_bits_per_value: %.4f\ndevice: %s\ncontext_size: %u\nthreads: %u\n"
		       "uptime_s: %.1f\nconnections: %u\nrequests_active: %u\nrequests_queued: %u\n"
		       "sessions_in_memory: %u\nsession_memory_bytes: %llu\nsession_memory_budget_bytes: %llu\n"
		       "tokens_generated: %llu\n",
		       st->server_version, st->model_name, st->model_fingerprint, st->kv_type,
		       st->kv_bits_per_value, st->device, st->context_size, st->n_threads,
		       (double)st->uptime_ms / 1000.0, st->connections, st->requests_active,
		       st->requests_queued, st->sessions_in_memory,
		       (unsigned long long)st->session_memory_bytes,
		       (unsigned long long)st->session_memory_budget_bytes,
		       (unsigned long long)st->tokens_generated);
	}
	fflush(stdout);
	tkv_status_free(st);
	tkv_client_free(c);
	return EXIT_OK;
}

static void sessions_help(void)
{
	printf("Usage: turbokv sessions [list | show NAME | save NAME | rm NAME] [--socket PATH] [--json]\n"
	       "\n"
	       "  list        your sessions, most recently used first, one per line:\n"
	       "              NAME<TAB>TOKENS<TAB>BYTES_ON_DISK<TAB>LAST_USED(UTC)<TAB>memory|disk\n"
	       "  show NAME   one session as 'key: value' lines\n"
	       "  save NAME   write a session to disk now (also done when idle and at shutdown)\n"
	       "  rm NAME     delete a session (memory and disk)\n"
	       "A missing session is exit 1 with 'turbokv: error: SESSION_NOT_FOUND: ...'.\n");
}

static void time_format(int64_t ms, char *buf, size_t size)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	if (ms <= 0 || !gmtime_r(&t, &tm) || !strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(buf, size, "-");
}

static void session_print_json(const TkvSessionInfo *i)
{
	printf("{\"name\":");
	json_cstr(stdout, i->name);
	printf(",\"tokens\":%u,\"bytes_on_disk\":%llu,\"last_used_unix_ms\":%lld,\"in_memory\":%s}",
	       i->tokens, (unsigned long long)i->bytes_on_disk, (long long)i->last_used_unix_ms,
	       i->in_memory ? "true" : "false");
}

static int cmd_sessions(int argc, char **argv)
{
	const char *socket = NULL, *verb = "list", *name = NULL;
	bool json = false;
	TkvClient *c = NULL;
	TkvError err = {0};
	char when[64];
	int r, nargs;

	r = simple_opts_parse("sessions ", argc, argv, &socket, &json, sessions_help);
	if (r >= 0)
		return r;
	nargs = argc - optind;
	if (nargs >= 1)
		verb = argv[optind];
	if (strcmp(verb, "list") == 0 || strcmp(verb, "ls") == 0) {
		if (nargs > 1)
			return usage_error("sessions ", "'list' takes no argument");
		verb = "list";
	} else if (strcmp(verb, "show") == 0 || strcmp(verb, "save") == 0 || strcmp(verb, "rm") == 0) {
		if (nargs != 2)
			return usage_error("sessions ", "'%s' needs exactly one NAME", verb);
		name = argv[optind + 1];
		if (!tkv_session_name_valid(name))
			return usage_error("sessions ", "invalid session name '%s'", name);
	} else
		return usage_error("sessions ", "unknown action '%s' (list, show, save, rm)", verb);

	r = connect_or_report(socket, &c, json);
	if (r >= 0)
		return r;
	if (strcmp(verb, "list") == 0) {
		TkvSessionList *l = NULL;
		r = tkv_session_list(c, &l, &err);
		if (r == 0) {
			if (json)
				printf("{\"sessions\":[");
			for (size_t i = 0; i < l->n_sessions; i++) {
				const TkvSessionInfo *s = &l->sessions[i];
				if (json) {
					if (i)
						putchar(',');
					session_print_json(s);
					continue;
				}
				time_format(s->last_used_unix_ms, when, sizeof(when));
				printf("%s\t%u\t%llu\t%s\t%s\n", s->name, s->tokens,
				       (unsigned long long)s->bytes_on_disk, when, s->in_memory ? "memory" : "disk");
			}
			if (json)
				printf("]}\n");
			tkv_session_list_free(l);
		}
	} else if (strcmp(verb, "show") == 0 || strcmp(verb, "save") == 0) {
		TkvSessionInfo s;
		r = verb[1] == 'h' ? tkv_session_show(c, name, &s, &err) : tkv_session_save(c, name, &s, &err);
		if (r == 0) {
			if (json) {
				session_print_json(&s);
				putchar('\n');
			} else {
				time_format(s.last_used_unix_ms, when, sizeof(when));
				printf("name: %s\ntokens: %u\nbytes_on_disk: %llu\nlast_used: %s\nin_memory: %s\n",
				       s.name, s.tokens, (unsigned long long)s.bytes_on_disk, when,
				       s.in_memory ? "yes" : "no");
			}
		}
	} else {
		r = tkv_session_delete(c, name, &err);
		if (r == 0 && json)
			printf("{\"deleted\":\"%s\"}\n", name);
	}
	fflush(stdout);
	tkv_client_free(c);
	return r ? report_error(&err, json) : EXIT_OK;
}

/* ------------------------------------------------------------------------ */

static void main_help(void)
{
	printf("Usage: turbokv COMMAND [OPTIONS]\n"
	       "\n"
	       "Client of the turbokvd local LLM daemon.\n"
	       "\n"
	       "  ask QUESTION     ask one question, stream the answer\n"
	       "  chat             interactive conversation\n"
	       "  status           the daemon's state\n"
	       "  sessions         list, show or delete your sessions\n"
	       "\n"
	       "'turbokv COMMAND --help' describes each. Every command takes --socket PATH\n"
	       "(default: $TURBOKV_SOCKET, else $XDG_RUNTIME_DIR/turbokv/turbokv.sock if it\n"
	       "exists, else /run/turbokv/turbokv.sock).\n"
	       "\n"
	       "Exit status:\n"
	       "  0    success\n"
	       "  1    the daemon refused or failed the request\n"
	       "  2    usage error (bad option or argument, unreadable --file)\n"
	       "  3    cannot connect to the daemon\n"
	       "  4    protocol error, or the daemon closed the connection mid-request\n"
	       "  130  interrupted (Ctrl-C); the generation was cancelled\n"
	       "Errors are printed as 'turbokv: error: CODE: message'.\n");
}

int main(int argc, char **argv)
{
	const char *cmd;

	if (argc < 2)
		return usage_error(NULL, "missing COMMAND");
	cmd = argv[1];
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		main_help();
		return EXIT_OK;
	}
	if (strcmp(cmd, "--version") == 0) {
		printf("turbokv %s\n", TKV_VERSION);
		return EXIT_OK;
	}
	if (strcmp(cmd, "ask") == 0)
		return cmd_ask(argc - 1, argv + 1);
	if (strcmp(cmd, "chat") == 0)
		return cmd_chat(argc - 1, argv + 1);
	if (strcmp(cmd, "status") == 0)
		return cmd_status(argc - 1, argv + 1);
	if (strcmp(cmd, "sessions") == 0)
		return cmd_sessions(argc - 1, argv + 1);
	return usage_error(NULL, "unknown command '%s'", cmd);
}
