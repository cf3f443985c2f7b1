/*
 * reply.h: the bodies turbokv-http sends back, for each API: whole JSON
 * answers, streamed events (OpenAI server-sent events "data: {...}\n\n"
 * ending in "data: [DONE]\n\n"; Ollama NDJSON, one object a line), and
 * errors (OpenAI {"error":{"message","type","param","code"}}, Ollama
 * {"error":"..."}).
 *
 * Pure (jansson only): every function returns a malloc'ed, NUL-terminated
 * string the caller frees, or NULL when out of memory.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clients/http/httpreq.h"
#include "turbokv/client.h"

/* What every event of one answer repeats. */
typedef struct ReplyCtx {
	HttpApi api;
	const char *model;     /* the name echoed back */
	char id[48];           /* "chatcmpl-..." / "cmpl-..." */
	int64_t created;       /* Unix seconds */
	bool include_usage;    /* OpenAI streams: a usage chunk before [DONE] */
} ReplyCtx;

/* Whether api speaks OpenAI's error and event formats (else Ollama's). */
bool reply_api_is_openai(HttpApi api);

/* The first event of a stream (OpenAI chat: the assistant role), or "" . */
char *reply_stream_start(const ReplyCtx *c);

/* One streamed event carrying text[0..len) (UTF-8). */
char *reply_stream_delta(const ReplyCtx *c, const char *text, size_t len);

/* The closing events of a stream: finish reason, usage, [DONE] / done:true. */
char *reply_stream_end(const ReplyCtx *c, const TkvResult *r);

/* A whole (non-streamed) answer with text[0..len). */
char *reply_whole(const ReplyCtx *c, const TkvResult *r, const char *text, size_t len);

/*
 * An error body for the OpenAI (openai true) or Ollama API; in_stream
 * frames it as an event (and, for OpenAI, follows it with [DONE]).
 * type: OpenAI's error type ("invalid_request_error", "server_error", ...);
 * param and code may be NULL.
 */
char *reply_error(bool openai, bool in_stream, const char *type, const char *param,
		  const char *code, const char *message);
