/*
 * httpreq.h: the JSON bodies of the OpenAI and Ollama APIs, mapped onto one
 * small request (HttpReq) that the gateway turns into a TkvRequest.
 *
 * Pure: no I/O, no HTTP, no daemon. The only input is the body's bytes;
 * anything wrong with them becomes an HttpReqError (HTTP status 400 or
 * 413, the offending field, a message), never a crash. Fuzzed by
 * tests/fuzz/fuzz-httpreq.c.
 *
 * What is mapped and what is refused is listed in docs/http.md; a field
 * that would change the answer in a way turbokv cannot honour (n > 1,
 * logprobs, response_format, tool calls forced by tool_choice, echo,
 * suffix, Ollama's format) is refused with 400; a field that only tunes
 * (presence/frequency penalties, user, keep_alive, num_ctx, tools offered
 * but not forced) is ignored and named in HttpReq.ignored.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "turbokv/client.h"

typedef enum HttpApi {
	HTTP_API_OPENAI_CHAT = 0,       /* POST /v1/chat/completions */
	HTTP_API_OPENAI_COMPLETION = 1, /* POST /v1/completions */
	HTTP_API_OLLAMA_CHAT = 2,       /* POST /api/chat */
	HTTP_API_OLLAMA_GENERATE = 3,   /* POST /api/generate */
} HttpApi;

/* Limits on what one body may ask for (the body size itself is the gateway's). */
#define HTTPREQ_MAX_MESSAGES 4096
#define HTTPREQ_MAX_STOP 16
#define HTTPREQ_MAX_STOP_BYTES 256
#define HTTPREQ_MAX_IGNORED 16

typedef struct HttpReq {
	HttpApi api;
	char *model;                 /* as the client named it ("" if absent); echoed back */
	TkvMessage *messages;        /* (n_messages,), contents owned here */
	size_t n_messages;
	char *raw_prompt;            /* completions and Ollama raw generate; NULL otherwise */
	TkvSampling sampling;
	uint32_t max_tokens;         /* 0: no limit */
	char **stop;                 /* (n_stop,) */
	size_t n_stop;
	bool stream;
	bool include_usage;          /* OpenAI stream_options.include_usage */
	char *session;               /* the "session" extension field, NULL if absent */
	const char *ignored[HTTPREQ_MAX_IGNORED]; /* (n_ignored,) static field names */
	size_t n_ignored;
} HttpReq;

typedef struct HttpReqError {
	int status;          /* 400 or 413 */
	char param[64];      /* the field at fault, "" for the body as a whole */
	char message[256];
} HttpReqError;

/*
 * Parse body[0..len) (not NUL-terminated, any bytes) for api. Returns 0
 * and *ret_req (free with httpreq_free), or a positive HTTP status (400)
 * with *err filled; -ENOMEM when out of memory.
 */
int httpreq_parse(HttpApi api, const char *body, size_t len, HttpReq **ret_req, HttpReqError *err);

/* NULL is fine. Returns NULL. */
HttpReq *httpreq_free(HttpReq *req);

/*
 * For a request bound to a daemon session: the daemon already holds the
 * history, so only the turns after the last assistant message are new.
 * Returns the index of the first new message (0 if none is an assistant's).
 */
size_t httpreq_new_turns_start(const HttpReq *req);
