/*
 * httpreq.c: OpenAI and Ollama request bodies -> HttpReq (see httpreq.h).
 *
 * JSON is parsed by jansson (json_loadb: strict RFC 8259, NUL in strings
 * refused, duplicate keys refused, nesting bounded by the library); this
 * file only walks the tree and checks types and ranges. Each API has one
 * function; the sampling fields they share are read by small helpers that
 * record the first error in the HttpReqError.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "clients/http/httpreq.h"

static void jsonp_unref(json_t **j)
{
	if (*j)
		json_decref(*j);
}

_printf_(3, 4) static int fail(HttpReqError *err, const char *param, const char *fmt, ...)
{
	va_list ap;
	err->status = 400;
	snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	return 400;
}

HttpReq *httpreq_free(HttpReq *req)
{
	if (!req)
		return NULL;
	free(req->model);
	for (size_t i = 0; i < req->n_messages; i++)
		free((char *)req->messages[i].content);
	free(req->messages);
	free(req->raw_prompt);
	for (size_t i = 0; i < req->n_stop; i++)
		free(req->stop[i]);
	free(req->stop);
	free(req->session);
	free(req);
	return NULL;
}
DEFINE_FREEP(HttpReq, httpreq_free)

static void ignore(HttpReq *req, const char *field)
{
	if (req->n_ignored < HTTPREQ_MAX_IGNORED)
		req->ignored[req->n_ignored++] = field;
}

/* A present, non-null field. */
static json_t *field(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(json_t *obj, const char *key, bool *out, HttpReqError *err)
{
	json_t *v = field(obj, key);
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return fail(err, key, "'%s' must be a boolean", key);
	*out = json_is_true(v);
	return 0;
}

/* A number in [lo, hi] into *out, and bit into *set. */
static int get_float(json_t *obj, const char *key, double lo, double hi, float *out,
		     unsigned *set, unsigned bit, HttpReqError *err)
{
	json_t *v = field(obj, key);
	if (!v)
		return 0;
	if (!json_is_number(v))
		return fail(err, key, "'%s' must be a number", key);
	double d = json_number_value(v);
	if (!(d >= lo && d <= hi))
		return fail(err, key, "'%s' must be between %g and %g", key, lo, hi);
	*out = (float)d;
	*set |= bit;
	return 0;
}

/* An integer in [lo, hi]; *present says whether it was given. */
static int get_int(json_t *obj, const char *key, json_int_t lo, json_int_t hi, json_int_t *out,
		   bool *present, HttpReqError *err)
{
	json_t *v = field(obj, key);
	*present = false;
	if (!v)
		return 0;
	if (!json_is_integer(v))
		return fail(err, key, "'%s' must be an integer", key);
	json_int_t i = json_integer_value(v);
	if (i < lo || i > hi)
		return fail(err, key, "'%s' must be between %lld and %lld", key, (long long)lo,
			    (long long)hi);
	*out = i;
	*present = true;
	return 0;
}

static int get_string(json_t *obj, const char *key, char **out, HttpReqError *err)
{
	json_t *v = field(obj, key);
	if (!v)
		return 0;
	if (!json_is_string(v))
		return fail(err, key, "'%s' must be a string", key);
	char *s = strdup(json_string_value(v));
	if (!s)
		return -ENOMEM;
	free(*out);
	*out = s;
	return 0;
}

/* "stop": a string or an array of strings. */
static int get_stop(json_t *obj, const char *key, HttpReq *req, HttpReqError *err)
{
	json_t *v = field(obj, key);
	size_t n;
	if (!v)
		return 0;
	if (json_is_string(v))
		n = 1;
	else if (json_is_array(v))
		n = json_array_size(v);
	else
		return fail(err, key, "'%s' must be a string or an array of strings", key);
	if (n > HTTPREQ_MAX_STOP)
		return fail(err, key, "at most %d stop strings", HTTPREQ_MAX_STOP);
	req->stop = calloc(n ? n : 1, sizeof(char *));
	if (!req->stop)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *s = json_is_string(v) ? v : json_array_get(v, i);
		if (!json_is_string(s))
			return fail(err, key, "'%s' must be a string or an array of strings", key);
		size_t l = json_string_length(s);
		if (l == 0 || l > HTTPREQ_MAX_STOP_BYTES)
			return fail(err, key, "a stop string must have 1 to %d bytes",
				    HTTPREQ_MAX_STOP_BYTES);
		req->stop[i] = strdup(json_string_value(s));
		if (!req->stop[i])
			return -ENOMEM;
		req->n_stop = i + 1;
	}
	return 0;
}

/*
 * A message's content: a string, or (OpenAI) an array of parts of which
 * only {"type":"text","text":...} is understood; parts are joined.
 */
static int content_text(json_t *c, char **ret, HttpReqError *err)
{
	if (!c) {
		*ret = strdup("");
		return *ret ? 0 : -ENOMEM;
	}
	if (json_is_string(c)) {
		*ret = strdup(json_string_value(c));
		return *ret ? 0 : -ENOMEM;
	}
	if (!json_is_array(c))
		return fail(err, "content", "'content' must be a string or an array of parts");
	size_t total = 0, i;
	json_t *part;
	json_array_foreach(c, i, part) {
		json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
		if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
			return fail(err, "content", "only content parts of type 'text' are supported");
		if (!json_is_string(text))
			return fail(err, "content", "a text part needs a string 'text'");
		total += json_string_length(text); /* bounded by the body size */
	}
	char *s = malloc(total + 1), *p = s;
	if (!s)
		return -ENOMEM;
	json_array_foreach(c, i, part) {
		json_t *text = json_object_get(part, "text");
		memcpy(p, json_string_value(text), json_string_length(text));
		p += json_string_length(text);
	}
	*p = 0;
	*ret = s;
	return 0;
}

static int role_of(const char *s, TkvRole *ret)
{
	if (!strcmp(s, "system") || !strcmp(s, "developer"))
		*ret = TKV_ROLE_SYSTEM;
	else if (!strcmp(s, "user"))
		*ret = TKV_ROLE_USER;
	else if (!strcmp(s, "assistant"))
		*ret = TKV_ROLE_ASSISTANT;
	else
		return -1;
	return 0;
}

static int get_messages(json_t *root, HttpReq *req, HttpReqError *err)
{
	json_t *msgs = json_object_get(root, "messages"), *m;
	size_t i;
	if (!json_is_array(msgs))
		return fail(err, "messages", "'messages' must be an array of messages");
	size_t n = json_array_size(msgs);
	if (n == 0 && req->api == HTTP_API_OPENAI_CHAT)
		return fail(err, "messages", "'messages' must not be empty");
	if (n > HTTPREQ_MAX_MESSAGES)
		return fail(err, "messages", "at most %d messages", HTTPREQ_MAX_MESSAGES);
	req->messages = calloc(n ? n : 1, sizeof(TkvMessage));
	if (!req->messages)
		return -ENOMEM;
	json_array_foreach(msgs, i, m) {
		json_t *role = json_object_get(m, "role");
		TkvRole r;
		if (!json_is_object(m))
			return fail(err, "messages", "each message must be an object");
		if (!json_is_string(role))
			return fail(err, "role", "message %zu: 'role' must be a string", i);
		if (role_of(json_string_value(role), &r) < 0)
			return fail(err, "role",
				    "message %zu: role '%.32s' is not supported (system, developer, user, assistant)",
				    i, json_string_value(role));
		if (field(m, "images"))
			return fail(err, "images", "images are not supported (text models only)");
		if (field(m, "tool_calls"))
			return fail(err, "tool_calls", "tool calls are not supported");
		char *text = NULL;
		int e = content_text(field(m, "content"), &text, err);
		if (e)
			return e;
		req->messages[i].role = r;
		req->messages[i].content = text;
		req->n_messages = i + 1;
	}
	return 0;
}

/* The OpenAI fields both /v1 endpoints share. */
static int openai_common(json_t *root, HttpReq *req, HttpReqError *err)
{
	TkvSampling *s = &req->sampling;
	json_int_t i;
	bool has, b = false;
	int e;

	if ((e = get_bool(root, "stream", &req->stream, err)))
		return e;
	json_t *so = field(root, "stream_options");
	if (so) {
		if (!json_is_object(so))
			return fail(err, "stream_options", "'stream_options' must be an object");
		if ((e = get_bool(so, "include_usage", &req->include_usage, err)))
			return e;
	}
	if ((e = get_float(root, "temperature", 0, 2, &s->temperature, &s->set,
			   TKV_SAMPLING_TEMPERATURE, err)) ||
	    (e = get_float(root, "top_p", 0, 1, &s->top_p, &s->set, TKV_SAMPLING_TOP_P, err)) ||
	    (e = get_float(root, "min_p", 0, 1, &s->min_p, &s->set, TKV_SAMPLING_MIN_P, err)) ||
	    (e = get_float(root, "repeat_penalty", 0, 10, &s->repeat_penalty, &s->set,
			   TKV_SAMPLING_REPEAT_PENALTY, err)))
		return e;
	if ((e = get_int(root, "top_k", 0, 1 << 20, &i, &has, err)))
		return e;
	if (has) {
		s->top_k = (uint32_t)i;
		s->set |= TKV_SAMPLING_TOP_K;
	}
	if ((e = get_int(root, "seed", INT64_MIN, INT64_MAX, &i, &has, err)))
		return e;
	if (has) {
		s->seed = (uint64_t)i;
		s->set |= TKV_SAMPLING_SEED;
	}
	static const char *const tok_keys[] = { "max_completion_tokens", "max_tokens" };
	for (size_t k = 0; k < ARRAY_SIZE(tok_keys); k++) {
		if ((e = get_int(root, tok_keys[k], 1, UINT32_MAX, &i, &has, err)))
			return e;
		if (has) {
			req->max_tokens = (uint32_t)i;
			break;
		}
	}
	if ((e = get_stop(root, "stop", req, err)))
		return e;
	if ((e = get_int(root, "n", 1, 1, &i, &has, err)))
		return fail(err, "n", "only n = 1 is supported");
	if ((e = get_bool(root, "logprobs", &b, err)))
		return e;
	if (b)
		return fail(err, "logprobs", "logprobs are not supported");
	if (field(root, "top_logprobs"))
		return fail(err, "top_logprobs", "logprobs are not supported");
	json_t *lb = field(root, "logit_bias");
	if (lb && (!json_is_object(lb) || json_object_size(lb) != 0))
		return fail(err, "logit_bias", "logit_bias is not supported");
	static const char *const tuning[] = { "presence_penalty", "frequency_penalty" };
	for (size_t k = 0; k < ARRAY_SIZE(tuning); k++) {
		json_t *v = field(root, tuning[k]);
		if (v && !json_is_number(v))
			return fail(err, tuning[k], "'%s' must be a number", tuning[k]);
		if (v && json_number_value(v) != 0)
			ignore(req, tuning[k]);
	}
	if (field(root, "user"))
		ignore(req, "user");
	return get_string(root, "session", &req->session, err);
}

static int parse_openai_chat(json_t *root, HttpReq *req, HttpReqError *err)
{
	int e;
	if ((e = openai_common(root, req, err)) || (e = get_messages(root, req, err)))
		return e;
	json_t *rf = field(root, "response_format");
	if (rf) {
		json_t *t = json_object_get(rf, "type");
		if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
			return fail(err, "response_format", "only response_format {\"type\":\"text\"} is supported");
	}
	json_t *tc = field(root, "tool_choice");
	if (tc && !(json_is_string(tc) && (!strcmp(json_string_value(tc), "none") ||
					   !strcmp(json_string_value(tc), "auto"))))
		return fail(err, "tool_choice", "tool calls are not supported");
	if (field(root, "tools"))
		ignore(req, "tools");
	if (field(root, "functions"))
		ignore(req, "functions");
	return 0;
}

static int parse_openai_completion(json_t *root, HttpReq *req, HttpReqError *err)
{
	int e;
	bool echo = false;
	req->max_tokens = 16; /* OpenAI's default for this endpoint */
	if ((e = openai_common(root, req, err)))
		return e;
	json_t *p = field(root, "prompt");
	if (p && json_is_array(p) && json_array_size(p) == 1)
		p = json_array_get(p, 0);
	if (!p || !json_is_string(p))
		return fail(err, "prompt", "'prompt' must be a string (or an array of one string)");
	if (!(req->raw_prompt = strdup(json_string_value(p))))
		return -ENOMEM;
	if ((e = get_bool(root, "echo", &echo, err)))
		return e;
	if (echo)
		return fail(err, "echo", "echo is not supported");
	if (field(root, "suffix"))
		return fail(err, "suffix", "suffix (fill in the middle) is not supported");
	json_t *bo = field(root, "best_of");
	if (bo && !(json_is_integer(bo) && json_integer_value(bo) == 1))
		return fail(err, "best_of", "only best_of = 1 is supported");
	return 0;
}

/* Ollama's "options" object. */
static int ollama_options(json_t *root, HttpReq *req, HttpReqError *err)
{
	TkvSampling *s = &req->sampling;
	json_t *o = field(root, "options");
	json_int_t i;
	bool has;
	int e;
	if (!o)
		return 0;
	if (!json_is_object(o))
		return fail(err, "options", "'options' must be an object");
	if ((e = get_float(o, "temperature", 0, 100, &s->temperature, &s->set,
			   TKV_SAMPLING_TEMPERATURE, err)) ||
	    (e = get_float(o, "top_p", 0, 1, &s->top_p, &s->set, TKV_SAMPLING_TOP_P, err)) ||
	    (e = get_float(o, "min_p", 0, 1, &s->min_p, &s->set, TKV_SAMPLING_MIN_P, err)) ||
	    (e = get_float(o, "repeat_penalty", 0, 10, &s->repeat_penalty, &s->set,
			   TKV_SAMPLING_REPEAT_PENALTY, err)))
		return e;
	if ((e = get_int(o, "top_k", 0, 1 << 20, &i, &has, err)))
		return e;
	if (has) {
		s->top_k = (uint32_t)i;
		s->set |= TKV_SAMPLING_TOP_K;
	}
	if ((e = get_int(o, "repeat_last_n", -1, 1 << 20, &i, &has, err)))
		return e;
	if (has && i >= 0) {
		s->repeat_last_n = (uint32_t)i;
		s->set |= TKV_SAMPLING_REPEAT_LAST_N;
	}
	if ((e = get_int(o, "seed", INT64_MIN, INT64_MAX, &i, &has, err)))
		return e;
	if (has) {
		s->seed = (uint64_t)i;
		s->set |= TKV_SAMPLING_SEED;
	}
	/* -1: no limit, -2: until the context is full. */
	if ((e = get_int(o, "num_predict", -2, UINT32_MAX, &i, &has, err)))
		return e;
	if (has)
		req->max_tokens = i > 0 ? (uint32_t)i : 0;
	if ((e = get_stop(o, "stop", req, err)))
		return e;
	static const char *const tuning[] = { "num_ctx", "presence_penalty", "frequency_penalty",
		"num_keep", "num_thread", "num_gpu", "mirostat", "typical_p" };
	for (size_t k = 0; k < ARRAY_SIZE(tuning); k++)
		if (field(o, tuning[k]))
			ignore(req, tuning[k]);
	return 0;
}

/* The Ollama fields both /api endpoints share. */
static int ollama_common(json_t *root, HttpReq *req, HttpReqError *err)
{
	int e;
	req->stream = true; /* Ollama streams unless told not to */
	if ((e = get_bool(root, "stream", &req->stream, err)) || (e = ollama_options(root, req, err)))
		return e;
	json_t *f = field(root, "format");
	if (f && !(json_is_string(f) && json_string_length(f) == 0))
		return fail(err, "format", "structured output ('format') is not supported");
	if (field(root, "keep_alive"))
		ignore(req, "keep_alive");
	json_t *tools = field(root, "tools");
	if (tools && !(json_is_array(tools) && json_array_size(tools) == 0))
		ignore(req, "tools");
	if (field(root, "think"))
		ignore(req, "think");
	return get_string(root, "session", &req->session, err);
}

static int parse_ollama_chat(json_t *root, HttpReq *req, HttpReqError *err)
{
	int e;
	if ((e = ollama_common(root, req, err)))
		return e;
	if (!field(root, "messages")) /* Ollama: no messages loads the model */
		return 0;
	return get_messages(root, req, err);
}

static int parse_ollama_generate(json_t *root, HttpReq *req, HttpReqError *err)
{
	char *prompt = NULL, *system = NULL;
	bool raw = false;
	int e;
	if ((e = ollama_common(root, req, err)) || (e = get_bool(root, "raw", &raw, err)))
		return e;
	if ((e = get_string(root, "prompt", &prompt, err)) || (e = get_string(root, "system", &system, err)))
		goto out;
	if (field(root, "images"))
		e = fail(err, "images", "images are not supported (text models only)");
	else if (field(root, "context"))
		e = fail(err, "context", "'context' token arrays are not supported; use /api/chat or a session");
	else if (field(root, "template"))
		e = fail(err, "template", "a per-request 'template' is not supported");
	else if (field(root, "suffix"))
		e = fail(err, "suffix", "suffix (fill in the middle) is not supported");
	if (e || !prompt || !prompt[0]) /* no prompt: Ollama loads the model and answers done */
		goto out;
	if (raw) {
		req->raw_prompt = TAKE_PTR(prompt);
		goto out;
	}
	req->messages = calloc(2, sizeof(TkvMessage));
	if (!req->messages) {
		e = -ENOMEM;
		goto out;
	}
	if (system) {
		req->messages[req->n_messages++] = (TkvMessage){ TKV_ROLE_SYSTEM, TAKE_PTR(system) };
	}
	req->messages[req->n_messages++] = (TkvMessage){ TKV_ROLE_USER, TAKE_PTR(prompt) };
out:
	free(prompt);
	free(system);
	return e;
}

int httpreq_parse(HttpApi api, const char *body, size_t len, HttpReq **ret_req, HttpReqError *err)
{
	_cleanup_(httpreq_freep) HttpReq *req = NULL;
	_cleanup_(jsonp_unref) json_t *root = NULL;
	json_error_t jerr;
	int e;

	memset(err, 0, sizeof(*err));
	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fail(err, "", "malformed JSON at line %d, column %d: %s", jerr.line, jerr.column,
			    jerr.text);
	if (!json_is_object(root))
		return fail(err, "", "the body must be a JSON object");
	req = calloc(1, sizeof(*req));
	if (!req)
		return -ENOMEM;
	req->api = api;
	if ((e = get_string(root, "model", &req->model, err)))
		return e;
	if (!req->model && !(req->model = strdup("")))
		return -ENOMEM;
	switch (api) {
	case HTTP_API_OPENAI_CHAT: e = parse_openai_chat(root, req, err); break;
	case HTTP_API_OPENAI_COMPLETION: e = parse_openai_completion(root, req, err); break;
	case HTTP_API_OLLAMA_CHAT: e = parse_ollama_chat(root, req, err); break;
	case HTTP_API_OLLAMA_GENERATE: e = parse_ollama_generate(root, req, err); break;
	default: return fail(err, "", "unknown API");
	}
	if (e)
		return e;
	if (req->session && !tkv_session_name_valid(req->session))
		return fail(err, "session", "a session name is 1 to 64 of [A-Za-z0-9._-]");
	*ret_req = TAKE_PTR(req);
	return 0;
}

size_t httpreq_new_turns_start(const HttpReq *req)
{
	for (size_t i = req->n_messages; i > 0; i--)
		if (req->messages[i - 1].role == TKV_ROLE_ASSISTANT)
			return i;
	return 0;
}
