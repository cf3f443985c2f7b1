/*
 * fuzz-httpreq.c: libFuzzer target for turbokv-http's request bodies
 * (clients/http/httpreq.c) and the answers built from them
 * (clients/http/reply.c).
 *
 * Input: one byte choosing the API (its value mod 4: OpenAI chat, OpenAI
 * completion, Ollama chat, Ollama generate), then the body as sent.
 *
 * Promises checked for every input: httpreq_parse() returns 0 with a
 * request or 400 with a message and no request; an accepted request has
 * its fields within the documented limits (messages and stop strings
 * non-NULL, at most HTTPREQ_MAX_*, a valid session name, a known role),
 * and every answer built for it (whole, stream start, a delta of arbitrary
 * bytes from the input, stream end, errors) is valid JSON, framed as the
 * API frames it; nothing leaks (ASan).
 */
#include <jansson.h>
#include <string.h>

#include "base/util.h"
#include "clients/http/httpreq.h"
#include "clients/http/reply.h"

#include "tests/fuzz/fuzz.h"

/* s holds one JSON document per frame: "data: X\n\n" (SSE) or "X\n" (NDJSON) or bare.
 * Generated text may hold U+0000 (a byte-fallback token), which JSON carries as \u0000. */
static void check_frames(const char *s, bool openai, bool framed)
{
	CHECK(s != NULL);
	if (!framed) {
		json_t *j = json_loads(s, JSON_ALLOW_NUL, NULL);
		CHECK(j != NULL);
		json_decref(j);
		return;
	}
	const char *p = s;
	while (*p) {
		const char *sep = openai ? "\n\n" : "\n";
		const char *end = strstr(p, sep);
		CHECK(end != NULL);
		if (openai) {
			CHECK(strncmp(p, "data: ", 6) == 0);
			p += 6;
		}
		if (!(openai && end - p == 6 && !strncmp(p, "[DONE]", 6))) {
			json_t *j = json_loadb(p, (size_t)(end - p), JSON_ALLOW_NUL, NULL);
			CHECK(j != NULL);
			json_decref(j);
		}
		p = end + strlen(sep);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	HttpApi api = (HttpApi)(data[0] % 4);
	const char *body = (const char *)data + 1;
	size_t len = size - 1;
	HttpReq *req = NULL;
	HttpReqError err;

	int r = httpreq_parse(api, body, len, &req, &err);
	if (r != 0) {
		CHECK(r == 400 && err.status == 400);
		CHECK(err.message[0] != 0);
		CHECK(req == NULL);
		char *e = reply_error(reply_api_is_openai(api), false, "invalid_request_error", err.param,
				      NULL, err.message);
		check_frames(e, reply_api_is_openai(api), false);
		free(e);
		return 0;
	}
	CHECK(req != NULL && req->api == api && req->model != NULL);
	CHECK(req->n_messages <= HTTPREQ_MAX_MESSAGES && req->n_stop <= HTTPREQ_MAX_STOP);
	for (size_t i = 0; i < req->n_messages; i++) {
		CHECK(req->messages[i].content != NULL);
		CHECK(req->messages[i].role >= TKV_ROLE_SYSTEM && req->messages[i].role <= TKV_ROLE_ASSISTANT);
	}
	for (size_t i = 0; i < req->n_stop; i++)
		CHECK(req->stop[i] && req->stop[i][0] && strlen(req->stop[i]) <= HTTPREQ_MAX_STOP_BYTES);
	CHECK(!req->session || tkv_session_name_valid(req->session));
	CHECK(httpreq_new_turns_start(req) <= req->n_messages);
	CHECK(req->n_ignored <= HTTPREQ_MAX_IGNORED);

	bool openai = reply_api_is_openai(api);
	ReplyCtx c = { .api = api, .model = req->model, .id = "chatcmpl-fuzz", .created = 1,
		.include_usage = req->include_usage };
	TkvResult res = { .finish_reason = (TkvFinishReason)(len % 6), .prompt_tokens = 3,
		.completion_tokens = 2, .cached_tokens = 1 };
	const char *text = req->n_messages ? req->messages[0].content : body;
	size_t tlen = req->n_messages ? strlen(text) : MIN(len, 64);
	char *s;
	s = reply_whole(&c, &res, text, tlen);
	check_frames(s, openai, false);
	free(s);
	s = reply_stream_start(&c);
	check_frames(s, openai, true);
	free(s);
	s = reply_stream_delta(&c, body, MIN(len, 64)); /* any bytes, valid UTF-8 or not */
	check_frames(s, openai, true);
	free(s);
	s = reply_stream_end(&c, &res);
	check_frames(s, openai, true);
	free(s);
	s = reply_error(openai, true, "server_error", NULL, "internal", body[0] ? "x" : "y");
	check_frames(s, openai, true);
	free(s);
	httpreq_free(req);
	return 0;
}
