/*
 * test-httpreq.c: clients/http/httpreq.c (OpenAI and Ollama bodies ->
 * HttpReq) and clients/http/reply.c (answers and stream events), field by
 * field: what is mapped, its defaults, what is refused with which param,
 * what is ignored, and that every answer parses back as the JSON the APIs
 * define. The end-to-end checks with real clients are
 * tests/integration/test-http.py.
 */
#include <jansson.h>
#include <string.h>

#include "clients/http/httpreq.h"
#include "clients/http/reply.h"
#include "tests/unit/testutil.h"

static HttpReq *parse_ok(HttpApi api, const char *body)
{
	HttpReq *req = NULL;
	HttpReqError err;
	int r = httpreq_parse(api, body, strlen(body), &req, &err);
	ck_assert_msg(r == 0, "%s: %d %s (%s)", body, r, err.message, err.param);
	return req;
}

static void parse_bad(HttpApi api, const char *body, const char *param)
{
	HttpReq *req = NULL;
	HttpReqError err;
	int r = httpreq_parse(api, body, strlen(body), &req, &err);
	ck_assert_msg(r == 400, "%s: accepted (%d)", body, r);
	ck_assert_ptr_null(req);
	ck_assert_int_eq(err.status, 400);
	ck_assert(err.message[0] != 0);
	ck_assert_msg(!strcmp(err.param, param), "%s: param '%s', want '%s'", body, err.param, param);
}

static bool ignored(const HttpReq *req, const char *field)
{
	for (size_t i = 0; i < req->n_ignored; i++)
		if (!strcmp(req->ignored[i], field))
			return true;
	return false;
}

START_TEST(test_openai_chat_fields)
{
	HttpReq *req = parse_ok(HTTP_API_OPENAI_CHAT,
		"{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"S\"},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
		"{\"role\":\"assistant\",\"content\":null},{\"role\":\"user\",\"content\":\"q\"}],"
		"\"temperature\":0,\"top_p\":0.5,\"seed\":-1,\"max_tokens\":9,\"max_completion_tokens\":7,"
		"\"stop\":\"END\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
		"\"presence_penalty\":0.3,\"frequency_penalty\":0,\"tools\":[{}],\"session\":\"s-1\"}");
	ck_assert_str_eq(req->model, "m");
	ck_assert_uint_eq(req->n_messages, 4);
	ck_assert_int_eq(req->messages[0].role, TKV_ROLE_SYSTEM);
	ck_assert_str_eq(req->messages[1].content, "ab");
	ck_assert_str_eq(req->messages[2].content, "");
	ck_assert_uint_eq(req->sampling.set, TKV_SAMPLING_TEMPERATURE | TKV_SAMPLING_TOP_P | TKV_SAMPLING_SEED);
	ck_assert(req->sampling.temperature == 0.0f && req->sampling.top_p == 0.5f);
	ck_assert(req->sampling.seed == UINT64_MAX);
	ck_assert_uint_eq(req->max_tokens, 7); /* max_completion_tokens wins */
	ck_assert_uint_eq(req->n_stop, 1);
	ck_assert_str_eq(req->stop[0], "END");
	ck_assert(req->stream && req->include_usage);
	ck_assert_str_eq(req->session, "s-1");
	ck_assert(ignored(req, "presence_penalty") && !ignored(req, "frequency_penalty"));
	ck_assert(ignored(req, "tools"));
	ck_assert_uint_eq(httpreq_new_turns_start(req), 3);
	httpreq_free(req);

	req = parse_ok(HTTP_API_OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
	ck_assert_str_eq(req->model, "");
	ck_assert(!req->stream && req->max_tokens == 0 && req->sampling.set == 0 && !req->session);
	ck_assert_uint_eq(httpreq_new_turns_start(req), 0);
	httpreq_free(req);
}
END_TEST

START_TEST(test_openai_refusals)
{
	HttpApi c = HTTP_API_OPENAI_CHAT;
	parse_bad(c, "", "");
	parse_bad(c, "{", "");
	parse_bad(c, "{\"messages\":[]} x", "");
	parse_bad(c, "\"str\"", "");
	parse_bad(c, "{\"messages\":[],\"messages\":[]}", "");
	parse_bad(c, "{}", "messages");
	parse_bad(c, "{\"messages\":[]}", "messages");
	parse_bad(c, "{\"messages\":[1]}", "messages");
	parse_bad(c, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "role");
	parse_bad(c, "{\"messages\":[{\"content\":\"x\"}]}", "role");
	parse_bad(c, "{\"messages\":[{\"role\":\"user\",\"content\":{}}]}", "content");
	parse_bad(c, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "content");
	parse_bad(c, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "");
#define M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
	parse_bad(c, "{" M ",\"model\":3}", "model");
	parse_bad(c, "{" M ",\"temperature\":2.5}", "temperature");
	parse_bad(c, "{" M ",\"temperature\":\"1\"}", "temperature");
	parse_bad(c, "{" M ",\"top_p\":-0.1}", "top_p");
	parse_bad(c, "{" M ",\"max_tokens\":0}", "max_tokens");
	parse_bad(c, "{" M ",\"max_tokens\":4294967296}", "max_tokens");
	parse_bad(c, "{" M ",\"seed\":1.5}", "seed");
	parse_bad(c, "{" M ",\"stop\":[\"\"]}", "stop");
	parse_bad(c, "{" M ",\"stop\":{}}", "stop");
	parse_bad(c, "{" M ",\"stream\":1}", "stream");
	parse_bad(c, "{" M ",\"n\":2}", "n");
	parse_bad(c, "{" M ",\"logprobs\":true}", "logprobs");
	parse_bad(c, "{" M ",\"logit_bias\":{\"1\":5}}", "logit_bias");
	parse_bad(c, "{" M ",\"response_format\":{\"type\":\"json_object\"}}", "response_format");
	parse_bad(c, "{" M ",\"tool_choice\":\"required\"}", "tool_choice");
	parse_bad(c, "{" M ",\"presence_penalty\":\"x\"}", "presence_penalty");
	parse_bad(c, "{" M ",\"session\":\"a/b\"}", "session");
	parse_bad(c, "{" M ",\"session\":\"..\"}", "session");
#undef M
	HttpApi p = HTTP_API_OPENAI_COMPLETION;
	parse_bad(p, "{}", "prompt");
	parse_bad(p, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
	parse_bad(p, "{\"prompt\":\"a\",\"echo\":true}", "echo");
	parse_bad(p, "{\"prompt\":\"a\",\"suffix\":\"b\"}", "suffix");
	parse_bad(p, "{\"prompt\":\"a\",\"best_of\":3}", "best_of");
}
END_TEST

START_TEST(test_openai_completion)
{
	HttpReq *req = parse_ok(HTTP_API_OPENAI_COMPLETION, "{\"prompt\":[\"Once\"]}");
	ck_assert_str_eq(req->raw_prompt, "Once");
	ck_assert_uint_eq(req->n_messages, 0);
	ck_assert_uint_eq(req->max_tokens, 16); /* OpenAI's default here */
	httpreq_free(req);
}
END_TEST

START_TEST(test_ollama)
{
	HttpReq *req = parse_ok(HTTP_API_OLLAMA_CHAT,
		"{\"model\":\"x:latest\",\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"images\":null}],"
		"\"options\":{\"temperature\":0.2,\"top_k\":5,\"min_p\":0.1,\"repeat_penalty\":1.1,"
		"\"repeat_last_n\":-1,\"num_predict\":-1,\"stop\":[\"a\",\"b\"],\"num_ctx\":4096},"
		"\"keep_alive\":\"5m\",\"tools\":[],\"format\":\"\"}");
	ck_assert(req->stream); /* Ollama's default */
	ck_assert_uint_eq(req->max_tokens, 0);
	ck_assert_uint_eq(req->sampling.set, TKV_SAMPLING_TEMPERATURE | TKV_SAMPLING_TOP_K |
			  TKV_SAMPLING_MIN_P | TKV_SAMPLING_REPEAT_PENALTY);
	ck_assert_uint_eq(req->n_stop, 2);
	ck_assert(ignored(req, "num_ctx") && ignored(req, "keep_alive") && !ignored(req, "tools"));
	httpreq_free(req);

	req = parse_ok(HTTP_API_OLLAMA_CHAT, "{\"model\":\"x\",\"stream\":false}");
	ck_assert(!req->stream && req->n_messages == 0 && !req->raw_prompt); /* a load */
	httpreq_free(req);

	req = parse_ok(HTTP_API_OLLAMA_GENERATE,
		       "{\"prompt\":\"q\",\"system\":\"S\",\"options\":{\"num_predict\":5,\"seed\":3}}");
	ck_assert_uint_eq(req->n_messages, 2);
	ck_assert_int_eq(req->messages[0].role, TKV_ROLE_SYSTEM);
	ck_assert_str_eq(req->messages[1].content, "q");
	ck_assert_uint_eq(req->max_tokens, 5);
	ck_assert(req->sampling.seed == 3);
	httpreq_free(req);

	req = parse_ok(HTTP_API_OLLAMA_GENERATE, "{\"prompt\":\"<raw>\",\"raw\":true}");
	ck_assert_str_eq(req->raw_prompt, "<raw>");
	ck_assert_uint_eq(req->n_messages, 0);
	httpreq_free(req);

	HttpApi c = HTTP_API_OLLAMA_CHAT, g = HTTP_API_OLLAMA_GENERATE;
	parse_bad(c, "{\"messages\":{}}", "messages");
	parse_bad(c, "{\"messages\":[],\"options\":[]}", "options");
	parse_bad(c, "{\"messages\":[],\"options\":{\"num_predict\":-3}}", "num_predict");
	parse_bad(c, "{\"messages\":[],\"format\":\"json\"}", "format");
	parse_bad(c, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"AA\"]}]}", "images");
	parse_bad(g, "{\"prompt\":\"x\",\"context\":[1]}", "context");
	parse_bad(g, "{\"prompt\":\"x\",\"template\":\"t\"}", "template");
	parse_bad(g, "{\"prompt\":1}", "prompt");
	parse_bad(g, "{\"prompt\":\"x\",\"raw\":\"yes\"}", "raw");
}
END_TEST

static json_t *load(const char *s, size_t len)
{
	json_error_t e;
	json_t *j = json_loadb(s, len, 0, &e);
	ck_assert_msg(j != NULL, "not JSON: %.*s (%s)", (int)len, s, e.text);
	return j;
}

START_TEST(test_reply_openai)
{
	ReplyCtx c = { .api = HTTP_API_OPENAI_CHAT, .model = "m", .id = "chatcmpl-1", .created = 5,
		.include_usage = true };
	TkvResult r = { .finish_reason = TKV_FINISH_CONTEXT_FULL, .prompt_tokens = 10,
		.completion_tokens = 3, .cached_tokens = 4 };
	char *s = reply_whole(&c, &r, "hi", 2);
	json_t *j = load(s, strlen(s));
	ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	ck_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "length");
	ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "message"), "content")), "hi");
	json_t *u = json_object_get(j, "usage");
	ck_assert_int_eq(json_integer_value(json_object_get(u, "total_tokens")), 13);
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
							       "cached_tokens")), 4);
	json_decref(j);
	free(s);

	/* A delta with invalid UTF-8 still gives valid JSON. */
	s = reply_stream_delta(&c, "\xff\xfe", 2);
	ck_assert(!strncmp(s, "data: ", 6) && !strcmp(s + strlen(s) - 2, "\n\n"));
	j = load(s + 6, strlen(s) - 8);
	json_decref(j);
	free(s);

	s = reply_stream_end(&c, &r);
	ck_assert_msg(strstr(s, "\"finish_reason\":\"length\"") && strstr(s, "\"usage\"") &&
		      !strcmp(s + strlen(s) - 14, "data: [DONE]\n\n"), "%s", s);
	free(s);

	s = reply_error(true, false, "invalid_request_error", "temperature", NULL, "bad \xff");
	j = load(s, strlen(s));
	ck_assert(json_is_object(json_object_get(j, "error")));
	json_decref(j);
	free(s);
}
END_TEST

START_TEST(test_reply_ollama)
{
	ReplyCtx c = { .api = HTTP_API_OLLAMA_GENERATE, .model = "m" };
	TkvResult r = { .finish_reason = TKV_FINISH_STOP_STRING, .prompt_tokens = 10,
		.completion_tokens = 3, .prefill_ms = 2, .decode_ms = 1.5 };
	char *s = reply_stream_end(&c, &r);
	ck_assert(s[strlen(s) - 1] == '\n');
	json_t *j = load(s, strlen(s) - 1);
	ck_assert(json_is_true(json_object_get(j, "done")));
	ck_assert_str_eq(json_string_value(json_object_get(j, "done_reason")), "stop");
	ck_assert_str_eq(json_string_value(json_object_get(j, "response")), "");
	ck_assert_int_eq(json_integer_value(json_object_get(j, "prompt_eval_duration")), 2000000);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "eval_count")), 3);
	json_decref(j);
	free(s);
	s = reply_error(false, false, NULL, NULL, NULL, "nope");
	ck_assert_str_eq(s, "{\"error\":\"nope\"}");
	free(s);
}
END_TEST

static Suite *httpreq_suite(void)
{
	Suite *s = suite_create("httpreq");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_openai_chat_fields);
	tcase_add_test(tc, test_openai_refusals);
	tcase_add_test(tc, test_openai_completion);
	tcase_add_test(tc, test_ollama);
	tcase_add_test(tc, test_reply_openai);
	tcase_add_test(tc, test_reply_ollama);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(httpreq_suite());
}
