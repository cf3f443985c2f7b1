/*
 * reply.c: the JSON bodies and stream events of turbokv-http (see reply.h).
 *
 * Finish reasons: the daemon's stop, stop_string and cancelled are
 * OpenAI's and Ollama's "stop"; length and context_full are "length".
 * Text deltas from the daemon are whole UTF-8 sequences (daemon/stream.c);
 * should one not be, it is replaced by U+FFFD rather than sending bad JSON.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "clients/http/reply.h"

bool reply_api_is_openai(HttpApi api)
{
	return api == HTTP_API_OPENAI_CHAT || api == HTTP_API_OPENAI_COMPLETION;
}

static const char *finish_name(TkvFinishReason f)
{
	return f == TKV_FINISH_LENGTH || f == TKV_FINISH_CONTEXT_FULL ? "length" : "stop";
}

static json_t *text_value(const char *text, size_t len)
{
	json_t *s = json_stringn(text ? text : "", text ? len : 0);
	return s ? s : json_string("\xef\xbf\xbd");
}

/* Serialize j (reference stolen) framed as SSE ("data: ...\n\n"), NDJSON ("...\n") or bare. */
enum { FRAME_NONE, FRAME_SSE, FRAME_LINE };
static char *dump(json_t *j, int frame)
{
	if (!j)
		return NULL;
	char *s = json_dumps(j, JSON_COMPACT), *out = NULL;
	json_decref(j);
	if (!s)
		return NULL;
	if (frame == FRAME_NONE)
		return s;
	if (asprintf(&out, frame == FRAME_SSE ? "data: %s\n\n" : "%s\n", s) < 0)
		out = NULL;
	free(s);
	return out;
}

/* Ollama's created_at: RFC 3339 UTC with nanoseconds. */
static json_t *now_rfc3339(void)
{
	struct timespec ts;
	struct tm tm;
	char buf[64];
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, sizeof(buf) - n, ".%09ldZ", ts.tv_nsec);
	return json_string(buf);
}

static json_t *openai_usage(const TkvResult *r)
{
	return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)r->prompt_tokens,
			 "completion_tokens", (json_int_t)r->completion_tokens, "total_tokens",
			 (json_int_t)r->prompt_tokens + r->completion_tokens, "prompt_tokens_details",
			 "cached_tokens", (json_int_t)r->cached_tokens);
}

/* OpenAI: one choice; delta/message/text as the API wants it. */
static json_t *openai_object(const ReplyCtx *c, bool chunk, json_t *choice)
{
	const char *object = c->api == HTTP_API_OPENAI_COMPLETION ? "text_completion" :
			     chunk ? "chat.completion.chunk" : "chat.completion";
	json_t *choices = choice ? json_pack("[o]", choice) : json_array();
	return json_pack("{s:s,s:s,s:I,s:s,s:o,s:s}", "id", c->id, "object", object, "created",
			 (json_int_t)c->created, "model", c->model, "choices", choices,
			 "system_fingerprint", "turbokv");
}

static json_t *openai_choice(const ReplyCtx *c, bool chunk, json_t *text, const char *finish)
{
	json_t *fin = finish ? json_string(finish) : json_null();
	if (c->api == HTTP_API_OPENAI_COMPLETION)
		return json_pack("{s:I,s:o,s:n,s:o}", "index", (json_int_t)0, "text",
				 text ? text : json_string(""), "logprobs", "finish_reason", fin);
	json_t *msg = text ? json_pack("{s:s,s:o}", "role", "assistant", "content", text) : json_object();
	if (chunk && text)
		json_object_del(msg, "role");
	return json_pack("{s:I,s:o,s:n,s:o}", "index", (json_int_t)0, chunk ? "delta" : "message", msg,
			 "logprobs", "finish_reason", fin);
}

/* Ollama: the fields of every chat/generate object. */
static json_t *ollama_object(const ReplyCtx *c, json_t *text, bool done)
{
	json_t *o = json_pack("{s:s,s:o,s:b}", "model", c->model, "created_at", now_rfc3339(), "done",
			      done);
	if (!o)
		return NULL;
	if (c->api == HTTP_API_OLLAMA_CHAT)
		json_object_set_new(o, "message",
				    json_pack("{s:s,s:o}", "role", "assistant", "content", text));
	else
		json_object_set_new(o, "response", text);
	return o;
}

static void ollama_done_fields(json_t *o, const TkvResult *r)
{
	json_int_t prefill = (json_int_t)(r->prefill_ms * 1e6), decode = (json_int_t)(r->decode_ms * 1e6);
	json_object_set_new(o, "done_reason", json_string(finish_name(r->finish_reason)));
	json_object_set_new(o, "total_duration", json_integer(prefill + decode));
	json_object_set_new(o, "load_duration", json_integer(0));
	json_object_set_new(o, "prompt_eval_count", json_integer(r->prompt_tokens));
	json_object_set_new(o, "prompt_eval_duration", json_integer(prefill));
	json_object_set_new(o, "eval_count", json_integer(r->completion_tokens));
	json_object_set_new(o, "eval_duration", json_integer(decode));
}

char *reply_stream_start(const ReplyCtx *c)
{
	if (c->api != HTTP_API_OPENAI_CHAT)
		return strdup("");
	json_t *choice = json_pack("{s:I,s:{s:s,s:s},s:n,s:n}", "index", (json_int_t)0, "delta", "role",
				   "assistant", "content", "", "logprobs", "finish_reason");
	return dump(openai_object(c, true, choice), FRAME_SSE);
}

char *reply_stream_delta(const ReplyCtx *c, const char *text, size_t len)
{
	if (reply_api_is_openai(c->api))
		return dump(openai_object(c, true, openai_choice(c, true, text_value(text, len), NULL)),
			    FRAME_SSE);
	return dump(ollama_object(c, text_value(text, len), false), FRAME_LINE);
}

char *reply_stream_end(const ReplyCtx *c, const TkvResult *r)
{
	if (!reply_api_is_openai(c->api)) {
		json_t *o = ollama_object(c, json_string(""), true);
		if (o)
			ollama_done_fields(o, r);
		return dump(o, FRAME_LINE);
	}
	json_t *choice = c->api == HTTP_API_OPENAI_COMPLETION ?
		openai_choice(c, true, json_string(""), finish_name(r->finish_reason)) :
		openai_choice(c, true, NULL, finish_name(r->finish_reason));
	char *fin = dump(openai_object(c, true, choice), FRAME_SSE), *usage = NULL, *out = NULL;
	if (!fin)
		return NULL;
	if (c->include_usage) {
		json_t *u = openai_object(c, true, NULL);
		if (u)
			json_object_set_new(u, "usage", openai_usage(r));
		if (!(usage = dump(u, FRAME_SSE))) {
			free(fin);
			return NULL;
		}
	}
	if (asprintf(&out, "%s%sdata: [DONE]\n\n", fin, usage ? usage : "") < 0)
		out = NULL;
	free(fin);
	free(usage);
	return out;
}

char *reply_whole(const ReplyCtx *c, const TkvResult *r, const char *text, size_t len)
{
	if (!reply_api_is_openai(c->api)) {
		json_t *o = ollama_object(c, text_value(text, len), true);
		if (o)
			ollama_done_fields(o, r);
		return dump(o, FRAME_NONE);
	}
	json_t *o = openai_object(c, false,
				  openai_choice(c, false, text_value(text, len), finish_name(r->finish_reason)));
	if (o)
		json_object_set_new(o, "usage", openai_usage(r));
	return dump(o, FRAME_NONE);
}

char *reply_error(bool openai, bool in_stream, const char *type, const char *param,
		  const char *code, const char *message)
{
	if (!openai) {
		json_t *e = json_pack("{s:s}", "error", message);
		return dump(e ? e : json_pack("{s:s}", "error", "invalid request"),
			    in_stream ? FRAME_LINE : FRAME_NONE);
	}
	json_t *e = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", message, "type", type,
			      "param", param && param[0] ? json_string(param) : json_null(), "code",
			      code ? json_string(code) : json_null());
	if (!e) /* a message that quoted invalid UTF-8 from the request */
		e = json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", "invalid request", "type",
			      type, "param", "code");
	char *s = dump(e, in_stream ? FRAME_SSE : FRAME_NONE), *out = NULL;
	if (!s || !in_stream)
		return s;
	if (asprintf(&out, "%sdata: [DONE]\n\n", s) < 0)
		out = NULL;
	free(s);
	return out;
}
