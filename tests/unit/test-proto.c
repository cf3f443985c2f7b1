/*
 * test-proto.c: the generated turbokv.v1 messages and proto/protocol.c.
 *
 * Round trips of every message type through protobuf-c, wire bytes worked
 * out by hand from the protobuf encoding rules (so the .proto field
 * numbers and oneof presence are pinned, not just self-consistent), the
 * validation of each client-controlled field in turn, garbage and
 * truncated input, the session-name rule, the UTF-8 check against the
 * engine's independent decoder, and the ErrorCode numbering.
 */
#include <math.h>
#include <string.h>

#include "engine/text/unicode.h"
#include "proto/protocol.h"
#include "tests/unit/testutil.h"

/* Pack a ClientMessage into a heap block of exactly its size. */
static uint8_t *pack_client(const Turbokv__V1__ClientMessage *m, size_t *ret_len)
{
	size_t n = turbokv__v1__client_message__get_packed_size(m);
	uint8_t *buf = malloc(n ? n : 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(turbokv__v1__client_message__pack(m, buf), n);
	*ret_len = n;
	return buf;
}

static Turbokv__V1__ServerMessage *roundtrip_server(const Turbokv__V1__ServerMessage *m)
{
	size_t n = turbokv__v1__server_message__get_packed_size(m);
	uint8_t *buf = malloc(n ? n : 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(turbokv__v1__server_message__pack(m, buf), n);
	Turbokv__V1__ServerMessage *out = turbokv__v1__server_message__unpack(NULL, n, buf);
	free(buf);
	ck_assert_ptr_nonnull(out);
	ck_assert_int_eq(out->msg_case, m->msg_case);
	return out;
}

static Turbokv__V1__ClientMessage *roundtrip_client(const Turbokv__V1__ClientMessage *m)
{
	size_t n;
	uint8_t *buf = pack_client(m, &n);
	Turbokv__V1__ClientMessage *out = turbokv__v1__client_message__unpack(NULL, n, buf);
	free(buf);
	ck_assert_ptr_nonnull(out);
	ck_assert_int_eq(out->msg_case, m->msg_case);
	return out;
}

static ProtobufCBinaryData bin(const char *s)
{
	return (ProtobufCBinaryData){ .len = strlen(s), .data = (uint8_t *)s };
}

static void ck_bin_eq(ProtobufCBinaryData a, ProtobufCBinaryData b)
{
	ck_assert_uint_eq(a.len, b.len);
	ck_assert(a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

/*
 * A valid Generate using every field, in storage the test owns, with room
 * for the over-limit variants the validation cases build.
 */
typedef struct Good {
	Turbokv__V1__ClientMessage m;
	Turbokv__V1__Generate g;
	Turbokv__V1__Chat chat;
	Turbokv__V1__ChatMessage msg[2];
	Turbokv__V1__ChatMessage *msgp[2];
	Turbokv__V1__Attachment att[PROTOCOL_MAX_ATTACHMENTS + 1];
	Turbokv__V1__Attachment *attp[PROTOCOL_MAX_ATTACHMENTS + 1];
	Turbokv__V1__Sampling samp;
	ProtobufCBinaryData stop[PROTOCOL_MAX_STOP_STRINGS + 1];
	char long_text[PROTOCOL_MAX_STOP_BYTES + PROTOCOL_MAX_NAME_BYTES + 2];
	size_t n_fds;
} Good;

static void good_init(Good *x)
{
	memset(x, 0, sizeof(*x));
	turbokv__v1__client_message__init(&x->m);
	turbokv__v1__generate__init(&x->g);
	turbokv__v1__chat__init(&x->chat);
	turbokv__v1__sampling__init(&x->samp);

	x->m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE;
	x->m.generate = &x->g;
	x->g.request_id = 7;
	x->g.input_case = TURBOKV__V1__GENERATE__INPUT_CHAT;
	x->g.chat = &x->chat;
	for (int i = 0; i < 2; i++) {
		turbokv__v1__chat_message__init(&x->msg[i]);
		x->msgp[i] = &x->msg[i];
	}
	x->msg[0].role = TURBOKV__V1__ROLE__ROLE_SYSTEM;
	x->msg[0].content = bin("You are terse.");
	x->msg[1].role = TURBOKV__V1__ROLE__ROLE_USER;
	x->msg[1].content = bin("R\xc3\xa9sum\xc3\xa9 of the notes? \xf0\x9f\x98\x80");
	x->chat.n_messages = 2;
	x->chat.messages = x->msgp;

	for (size_t i = 0; i < ARRAY_SIZE(x->att); i++) {
		turbokv__v1__attachment__init(&x->att[i]);
		x->att[i].fd_index = (uint32_t)i;
		x->att[i].size = 100 + i;
		x->attp[i] = &x->att[i];
	}
	/* two attachments naming the two fds in swapped order */
	x->att[0].name = "notes.md";
	x->att[0].mime = "text/markdown; charset=utf-8";
	x->att[0].fd_index = 1;
	x->att[1].name = "";
	x->att[1].fd_index = 0;
	x->g.n_attachments = 2;
	x->g.attachments = x->attp;
	x->n_fds = 2;

	x->samp.opt_temperature_case = TURBOKV__V1__SAMPLING__OPT_TEMPERATURE_TEMPERATURE;
	x->samp.temperature = 0.5f;
	x->samp.opt_top_k_case = TURBOKV__V1__SAMPLING__OPT_TOP_K_TOP_K;
	x->samp.top_k = 40;
	x->samp.opt_top_p_case = TURBOKV__V1__SAMPLING__OPT_TOP_P_TOP_P;
	x->samp.top_p = 0.9f;
	x->samp.opt_min_p_case = TURBOKV__V1__SAMPLING__OPT_MIN_P_MIN_P;
	x->samp.min_p = 0.05f;
	x->samp.opt_repeat_penalty_case = TURBOKV__V1__SAMPLING__OPT_REPEAT_PENALTY_REPEAT_PENALTY;
	x->samp.repeat_penalty = 1.1f;
	x->samp.opt_repeat_last_n_case = TURBOKV__V1__SAMPLING__OPT_REPEAT_LAST_N_REPEAT_LAST_N;
	x->samp.repeat_last_n = 64;
	x->samp.opt_seed_case = TURBOKV__V1__SAMPLING__OPT_SEED_SEED;
	x->samp.seed = 0xfeedfacecafebeefull;
	x->g.sampling = &x->samp;

	x->g.max_tokens = 128;
	for (size_t i = 0; i < ARRAY_SIZE(x->stop); i++)
		x->stop[i] = bin("</s>");
	x->stop[0] = bin("\n\nUser:");
	x->g.n_stop = 2;
	x->g.stop = x->stop;
	x->g.session = "notes-2024.v1";
	x->g.context_policy = TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST;
}

START_TEST(generate_roundtrip_keeps_every_field)
{
	Good x;
	good_init(&x);
	Turbokv__V1__ClientMessage *m = roundtrip_client(&x.m);
	const Turbokv__V1__Generate *g = m->generate;

	ck_assert_uint_eq(g->request_id, 7);
	ck_assert_int_eq(g->input_case, TURBOKV__V1__GENERATE__INPUT_CHAT);
	ck_assert_uint_eq(g->chat->n_messages, 2);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(g->chat->messages[i]->role, x.msg[i].role);
		ck_bin_eq(g->chat->messages[i]->content, x.msg[i].content);
	}
	ck_assert_uint_eq(g->n_attachments, 2);
	for (int i = 0; i < 2; i++) {
		ck_assert_str_eq(g->attachments[i]->name, x.att[i].name);
		ck_assert_str_eq(g->attachments[i]->mime, x.att[i].mime);
		ck_assert_uint_eq(g->attachments[i]->fd_index, x.att[i].fd_index);
		ck_assert_uint_eq(g->attachments[i]->size, x.att[i].size);
	}
	const Turbokv__V1__Sampling *s = g->sampling;
	ck_assert_ptr_nonnull(s);
	ck_assert_int_eq(s->opt_temperature_case, TURBOKV__V1__SAMPLING__OPT_TEMPERATURE_TEMPERATURE);
	ck_assert(s->temperature == 0.5f);
	ck_assert_int_eq(s->opt_top_k_case, TURBOKV__V1__SAMPLING__OPT_TOP_K_TOP_K);
	ck_assert_uint_eq(s->top_k, 40);
	ck_assert(s->top_p == 0.9f && s->min_p == 0.05f && s->repeat_penalty == 1.1f);
	ck_assert_uint_eq(s->repeat_last_n, 64);
	ck_assert_uint_eq(s->seed, 0xfeedfacecafebeefull);
	ck_assert(!s->greedy);
	ck_assert_uint_eq(g->max_tokens, 128);
	ck_assert_uint_eq(g->n_stop, 2);
	ck_bin_eq(g->stop[0], x.stop[0]);
	ck_bin_eq(g->stop[1], x.stop[1]);
	ck_assert_str_eq(g->session, "notes-2024.v1");
	ck_assert_int_eq(g->context_policy, TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST);
	ck_assert_int_eq(protocol_validate_client_message(m, 2, NULL), 0);
	protocol_client_message_free(m);

	/* raw prompt instead of chat, no sampling: the other oneof member */
	x.g.input_case = TURBOKV__V1__GENERATE__INPUT_RAW_PROMPT;
	x.g.raw_prompt = bin("Once upon a time");
	x.g.sampling = NULL;
	m = roundtrip_client(&x.m);
	ck_assert_int_eq(m->generate->input_case, TURBOKV__V1__GENERATE__INPUT_RAW_PROMPT);
	ck_bin_eq(m->generate->raw_prompt, x.g.raw_prompt);
	ck_assert_ptr_null(m->generate->sampling);
	protocol_client_message_free(m);
}
END_TEST

START_TEST(other_client_messages_roundtrip)
{
	Turbokv__V1__ClientMessage in = TURBOKV__V1__CLIENT_MESSAGE__INIT, *m;
	Turbokv__V1__Hello hello = TURBOKV__V1__HELLO__INIT;
	Turbokv__V1__Cancel cancel = TURBOKV__V1__CANCEL__INIT;
	Turbokv__V1__StatusRequest status = TURBOKV__V1__STATUS_REQUEST__INIT;
	Turbokv__V1__SessionList list = TURBOKV__V1__SESSION_LIST__INIT;
	Turbokv__V1__SessionShow show = TURBOKV__V1__SESSION_SHOW__INIT;
	Turbokv__V1__SessionDelete del = TURBOKV__V1__SESSION_DELETE__INIT;

	hello.protocol_version = TURBOKV_PROTOCOL_VERSION;
	hello.client_name = "turbokv-cli/0.1";
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO;
	in.hello = &hello;
	m = roundtrip_client(&in);
	ck_assert_uint_eq(m->hello->protocol_version, TURBOKV_PROTOCOL_VERSION);
	ck_assert_str_eq(m->hello->client_name, "turbokv-cli/0.1");
	ck_assert_int_eq(protocol_validate_client_message(m, 0, NULL), 0);
	protocol_client_message_free(m);

	cancel.request_id = UINT64_MAX;
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL;
	in.cancel = &cancel;
	m = roundtrip_client(&in);
	ck_assert_uint_eq(m->cancel->request_id, UINT64_MAX);
	ck_assert_int_eq(protocol_validate_client_message(m, 0, NULL), 0);
	protocol_client_message_free(m);

	status.request_id = 3;
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_STATUS;
	in.status = &status;
	m = roundtrip_client(&in);
	ck_assert_uint_eq(m->status->request_id, 3);
	ck_assert_int_eq(protocol_validate_client_message(m, 0, NULL), 0);
	protocol_client_message_free(m);

	list.request_id = 4;
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_LIST;
	in.session_list = &list;
	m = roundtrip_client(&in);
	ck_assert_uint_eq(m->session_list->request_id, 4);
	ck_assert_int_eq(protocol_validate_client_message(m, 0, NULL), 0);
	protocol_client_message_free(m);

	show.request_id = 5;
	show.name = "work";
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SHOW;
	in.session_show = &show;
	m = roundtrip_client(&in);
	ck_assert_uint_eq(m->session_show->request_id, 5);
	ck_assert_str_eq(m->session_show->name, "work");
	ck_assert_int_eq(protocol_validate_client_message(m, 0, NULL), 0);
	protocol_client_message_free(m);

	del.request_id = 6;
	del.name = "old.chat";
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_DELETE;
	in.session_delete = &del;
	m = roundtrip_client(&in);
	ck_assert_uint_eq(m->session_delete->request_id, 6);
	ck_assert_str_eq(m->session_delete->name, "old.chat");
	ck_assert_int_eq(protocol_validate_client_message(m, 0, NULL), 0);
	protocol_client_message_free(m);
}
END_TEST

START_TEST(server_messages_roundtrip)
{
	Turbokv__V1__ServerMessage in = TURBOKV__V1__SERVER_MESSAGE__INIT, *m;

	Turbokv__V1__HelloReply hr = TURBOKV__V1__HELLO_REPLY__INIT;
	hr.protocol_version = 1;
	hr.min_protocol_version = 1;
	hr.max_protocol_version = 2;
	hr.server_version = "0.1.0";
	hr.model_name = "SmolLM2-135M-Instruct";
	hr.model_fingerprint = "0123abcd";
	hr.kv_type = "q8_0:tq3";
	hr.context_size = 8192;
	hr.n_threads = 2;
	hr.device = "cpu";
	hr.max_frame_bytes = PROTOCOL_MAX_FRAME_BYTES;
	hr.max_attachment_bytes = PROTOCOL_MAX_ATTACHMENT_BYTES;
	hr.max_requests_in_flight = 8;
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_HELLO_REPLY;
	in.hello_reply = &hr;
	m = roundtrip_server(&in);
	ck_assert_uint_eq(m->hello_reply->protocol_version, 1);
	ck_assert_uint_eq(m->hello_reply->max_protocol_version, 2);
	ck_assert_str_eq(m->hello_reply->model_name, "SmolLM2-135M-Instruct");
	ck_assert_str_eq(m->hello_reply->model_fingerprint, "0123abcd");
	ck_assert_str_eq(m->hello_reply->kv_type, "q8_0:tq3");
	ck_assert_str_eq(m->hello_reply->device, "cpu");
	ck_assert_uint_eq(m->hello_reply->context_size, 8192);
	ck_assert_uint_eq(m->hello_reply->n_threads, 2);
	ck_assert_uint_eq(m->hello_reply->max_attachment_bytes, PROTOCOL_MAX_ATTACHMENT_BYTES);
	ck_assert_uint_eq(m->hello_reply->max_requests_in_flight, 8);
	protocol_server_message_free(m);

	Turbokv__V1__Progress pr = TURBOKV__V1__PROGRESS__INIT;
	pr.request_id = 9;
	pr.prefilled_tokens = 512;
	pr.total_tokens = 4000;
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_PROGRESS;
	in.progress = &pr;
	m = roundtrip_server(&in);
	ck_assert_uint_eq(m->progress->request_id, 9);
	ck_assert_uint_eq(m->progress->prefilled_tokens, 512);
	ck_assert_uint_eq(m->progress->total_tokens, 4000);
	protocol_server_message_free(m);

	Turbokv__V1__Token tok = TURBOKV__V1__TOKEN__INIT;
	tok.request_id = 9;
	tok.text = bin(" caf\xc3\xa9");
	tok.token_id = 49151;
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_TOKEN;
	in.token = &tok;
	m = roundtrip_server(&in);
	ck_bin_eq(m->token->text, tok.text);
	ck_assert_uint_eq(m->token->token_id, 49151);
	protocol_server_message_free(m);

	Turbokv__V1__Done done = TURBOKV__V1__DONE__INIT;
	done.request_id = 9;
	done.finish_reason = TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP_STRING;
	done.prompt_tokens = 4000;
	done.cached_tokens = 3900;
	done.completion_tokens = 77;
	done.dropped_tokens = 12;
	done.prefill_ms = 12.5;
	done.decode_ms = 1500.25;
	done.ttft_ms = 20.75;
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_DONE;
	in.done = &done;
	m = roundtrip_server(&in);
	ck_assert_int_eq(m->done->finish_reason, TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP_STRING);
	ck_assert_uint_eq(m->done->prompt_tokens, 4000);
	ck_assert_uint_eq(m->done->cached_tokens, 3900);
	ck_assert_uint_eq(m->done->completion_tokens, 77);
	ck_assert_uint_eq(m->done->dropped_tokens, 12);
	ck_assert(m->done->prefill_ms == 12.5 && m->done->decode_ms == 1500.25 && m->done->ttft_ms == 20.75);
	protocol_server_message_free(m);

	Turbokv__V1__Error e = TURBOKV__V1__ERROR__INIT;
	e.request_id = 0;
	e.code = TURBOKV__V1__ERROR_CODE__ERROR_CODE_ATTACHMENT_NOT_SEALED;
	e.message = "attachment 0: memfd lacks F_SEAL_GROW";
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR;
	in.error = &e;
	m = roundtrip_server(&in);
	ck_assert_uint_eq(m->error->request_id, 0);
	ck_assert_int_eq(m->error->code, PROTOCOL_E_ATTACHMENT_NOT_SEALED);
	ck_assert_str_eq(m->error->message, e.message);
	protocol_server_message_free(m);

	Turbokv__V1__StatusReply st = TURBOKV__V1__STATUS_REPLY__INIT;
	st.request_id = 11;
	st.server_version = "0.1.0";
	st.model_name = "m";
	st.kv_type = "tq3";
	st.uptime_ms = 123456789012ull;
	st.connections = 20;
	st.requests_active = 4;
	st.requests_queued = 16;
	st.sessions_in_memory = 3;
	st.session_memory_bytes = 1ull << 33;
	st.session_memory_budget_bytes = 1ull << 34;
	st.kv_bits_per_value = 3.0625;
	st.tokens_generated = 99;
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_STATUS_REPLY;
	in.status_reply = &st;
	m = roundtrip_server(&in);
	ck_assert_uint_eq(m->status_reply->request_id, 11);
	ck_assert_uint_eq(m->status_reply->uptime_ms, 123456789012ull);
	ck_assert_uint_eq(m->status_reply->connections, 20);
	ck_assert_uint_eq(m->status_reply->requests_queued, 16);
	ck_assert_uint_eq(m->status_reply->session_memory_budget_bytes, 1ull << 34);
	ck_assert(m->status_reply->kv_bits_per_value == 3.0625);
	ck_assert_uint_eq(m->status_reply->tokens_generated, 99);
	protocol_server_message_free(m);

	Turbokv__V1__SessionInfo si[2] = { TURBOKV__V1__SESSION_INFO__INIT, TURBOKV__V1__SESSION_INFO__INIT };
	Turbokv__V1__SessionInfo *sip[2] = { &si[0], &si[1] };
	si[0].name = "a";
	si[0].tokens = 100;
	si[0].bytes_on_disk = 5000;
	si[0].last_used_unix_ms = 1700000000123ll;
	si[0].in_memory = 1;
	si[1].name = "b";
	si[1].last_used_unix_ms = -1;
	Turbokv__V1__SessionListReply sl = TURBOKV__V1__SESSION_LIST_REPLY__INIT;
	sl.request_id = 12;
	sl.n_sessions = 2;
	sl.sessions = sip;
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_LIST_REPLY;
	in.session_list_reply = &sl;
	m = roundtrip_server(&in);
	ck_assert_uint_eq(m->session_list_reply->n_sessions, 2);
	ck_assert_str_eq(m->session_list_reply->sessions[0]->name, "a");
	ck_assert_uint_eq(m->session_list_reply->sessions[0]->tokens, 100);
	ck_assert_uint_eq(m->session_list_reply->sessions[0]->bytes_on_disk, 5000);
	ck_assert_int_eq(m->session_list_reply->sessions[0]->last_used_unix_ms, 1700000000123ll);
	ck_assert(m->session_list_reply->sessions[0]->in_memory);
	ck_assert_str_eq(m->session_list_reply->sessions[1]->name, "b");
	ck_assert_int_eq(m->session_list_reply->sessions[1]->last_used_unix_ms, -1);
	ck_assert(!m->session_list_reply->sessions[1]->in_memory);
	protocol_server_message_free(m);

	si[0].request_id = 13;
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_INFO;
	in.session_info = &si[0];
	m = roundtrip_server(&in);
	ck_assert_uint_eq(m->session_info->request_id, 13);
	ck_assert_str_eq(m->session_info->name, "a");
	protocol_server_message_free(m);

	Turbokv__V1__SessionDeleted sd = TURBOKV__V1__SESSION_DELETED__INIT;
	sd.request_id = 14;
	sd.name = "a";
	in.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_DELETED;
	in.session_deleted = &sd;
	m = roundtrip_server(&in);
	ck_assert_uint_eq(m->session_deleted->request_id, 14);
	ck_assert_str_eq(m->session_deleted->name, "a");
	protocol_server_message_free(m);
}
END_TEST

/* Byte sequences worked out by hand: tag = field << 3 | wire type. */
START_TEST(wire_bytes_match_the_encoding_rules)
{
	Turbokv__V1__ClientMessage in = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__Hello hello = TURBOKV__V1__HELLO__INIT;
	Turbokv__V1__Cancel cancel = TURBOKV__V1__CANCEL__INIT;
	Turbokv__V1__Generate g = TURBOKV__V1__GENERATE__INIT;
	Turbokv__V1__Sampling s = TURBOKV__V1__SAMPLING__INIT;
	uint8_t *buf;
	size_t n;

	/* hello = 1 (len 7) { protocol_version = 1: 08 01, client_name = 2: 12 03 "cli" } */
	static const uint8_t want_hello[] = { 0x0a, 0x07, 0x08, 0x01, 0x12, 0x03, 'c', 'l', 'i' };
	hello.protocol_version = 1;
	hello.client_name = "cli";
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO;
	in.hello = &hello;
	buf = pack_client(&in, &n);
	ck_assert_uint_eq(n, sizeof(want_hello));
	ck_assert(memcmp(buf, want_hello, n) == 0);
	free(buf);

	/* cancel = 3 (len 3) { request_id = 1: 08, varint 300 = ac 02 } */
	static const uint8_t want_cancel[] = { 0x1a, 0x03, 0x08, 0xac, 0x02 };
	cancel.request_id = 300;
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL;
	in.cancel = &cancel;
	buf = pack_client(&in, &n);
	ck_assert_uint_eq(n, sizeof(want_cancel));
	ck_assert(memcmp(buf, want_cancel, n) == 0);
	free(buf);

	/*
	 * generate = 2 (len 11) { request_id = 1: 08 01, raw_prompt = 3 (set,
	 * empty): 1a 00, sampling = 5 (len 5) { temperature = 1 (fixed32,
	 * set to 0.0): 0d 00 00 00 00 } }: a oneof member is sent even when
	 * it holds its zero value, which is how unset and 0 differ.
	 */
	static const uint8_t want_gen[] = { 0x12, 0x0b, 0x08, 0x01, 0x1a, 0x00, 0x2a, 0x05,
					    0x0d, 0x00, 0x00, 0x00, 0x00 };
	g.request_id = 1;
	g.input_case = TURBOKV__V1__GENERATE__INPUT_RAW_PROMPT;
	g.raw_prompt = (ProtobufCBinaryData){ 0, NULL };
	s.opt_temperature_case = TURBOKV__V1__SAMPLING__OPT_TEMPERATURE_TEMPERATURE;
	s.temperature = 0.0f;
	g.sampling = &s;
	in.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE;
	in.generate = &g;
	buf = pack_client(&in, &n);
	ck_assert_uint_eq(n, sizeof(want_gen));
	ck_assert(memcmp(buf, want_gen, n) == 0);

	/* and back: the zero temperature is present, top_k absent */
	Turbokv__V1__ClientMessage *m = NULL;
	ck_assert_int_eq(protocol_client_message_unpack(buf, n, 0, &m, NULL), 0);
	ck_assert_int_eq(m->generate->sampling->opt_temperature_case,
			 TURBOKV__V1__SAMPLING__OPT_TEMPERATURE_TEMPERATURE);
	ck_assert_int_eq(m->generate->sampling->opt_top_k_case, TURBOKV__V1__SAMPLING__OPT_TOP_K__NOT_SET);
	ck_assert_int_eq(m->generate->input_case, TURBOKV__V1__GENERATE__INPUT_RAW_PROMPT);
	ck_assert_uint_eq(m->generate->raw_prompt.len, 0);
	protocol_client_message_free(m);
	free(buf);
}
END_TEST

/*
 * Validation cases: each starts from the good Generate (or another good
 * message), breaks one thing, and names the code the daemon must send.
 */
typedef struct Case {
	const char *what;
	int want;
} Case;

static const Case cases[] = {
	{ "good generate", 0 },
	{ "request_id 0", PROTOCOL_E_BAD_MESSAGE },
	{ "no input", PROTOCOL_E_BAD_MESSAGE },
	{ "empty chat", PROTOCOL_E_BAD_MESSAGE },
	{ "role unspecified", PROTOCOL_E_BAD_MESSAGE },
	{ "role out of range", PROTOCOL_E_BAD_MESSAGE },
	{ "content overlong utf8", PROTOCOL_E_BAD_MESSAGE },
	{ "content with NUL", PROTOCOL_E_BAD_MESSAGE },
	{ "raw prompt lone continuation byte", PROTOCOL_E_BAD_MESSAGE },
	{ "raw prompt good", 0 },
	{ "more attachments than fds", PROTOCOL_E_BAD_MESSAGE },
	{ "more fds than attachments", PROTOCOL_E_BAD_MESSAGE },
	{ "fd_index out of range", PROTOCOL_E_BAD_MESSAGE },
	{ "fd_index twice", PROTOCOL_E_BAD_MESSAGE },
	{ "too many attachments", PROTOCOL_E_BAD_MESSAGE },
	{ "max attachments", 0 },
	{ "attachment over cap", PROTOCOL_E_ATTACHMENT_TOO_LARGE },
	{ "attachment at cap", 0 },
	{ "attachment name too long", PROTOCOL_E_BAD_MESSAGE },
	{ "attachment name at limit", 0 },
	{ "attachment name not utf8", PROTOCOL_E_BAD_MESSAGE },
	{ "mime control char", PROTOCOL_E_BAD_MESSAGE },
	{ "temperature NaN", PROTOCOL_E_BAD_MESSAGE },
	{ "temperature negative", PROTOCOL_E_BAD_MESSAGE },
	{ "temperature too high", PROTOCOL_E_BAD_MESSAGE },
	{ "temperature infinite", PROTOCOL_E_BAD_MESSAGE },
	{ "temperature zero", 0 },
	{ "top_k too large", PROTOCOL_E_BAD_MESSAGE },
	{ "top_p above 1", PROTOCOL_E_BAD_MESSAGE },
	{ "min_p negative", PROTOCOL_E_BAD_MESSAGE },
	{ "repeat_penalty zero", PROTOCOL_E_BAD_MESSAGE },
	{ "repeat_penalty NaN", PROTOCOL_E_BAD_MESSAGE },
	{ "repeat_last_n too large", PROTOCOL_E_BAD_MESSAGE },
	{ "unset sampling fields ignored", 0 },
	{ "max_tokens too large", PROTOCOL_E_BAD_MESSAGE },
	{ "too many stop strings", PROTOCOL_E_BAD_MESSAGE },
	{ "max stop strings", 0 },
	{ "empty stop string", PROTOCOL_E_BAD_MESSAGE },
	{ "stop string too long", PROTOCOL_E_BAD_MESSAGE },
	{ "stop string surrogate", PROTOCOL_E_BAD_MESSAGE },
	{ "session with slash", PROTOCOL_E_SESSION_BAD_NAME },
	{ "session dotdot", PROTOCOL_E_SESSION_BAD_NAME },
	{ "no session", 0 },
	{ "context policy out of range", PROTOCOL_E_BAD_MESSAGE },
	{ "hello good", 0 },
	{ "hello version 0", PROTOCOL_E_UNSUPPORTED_VERSION },
	{ "hello version too new", PROTOCOL_E_UNSUPPORTED_VERSION },
	{ "hello client name too long", PROTOCOL_E_BAD_MESSAGE },
	{ "hello client name not utf8", PROTOCOL_E_BAD_MESSAGE },
	{ "hello with an fd", PROTOCOL_E_BAD_MESSAGE },
	{ "cancel id 0", PROTOCOL_E_BAD_MESSAGE },
	{ "status id 0", PROTOCOL_E_BAD_MESSAGE },
	{ "session list id 0", PROTOCOL_E_BAD_MESSAGE },
	{ "session show bad name", PROTOCOL_E_SESSION_BAD_NAME },
	{ "session show id 0", PROTOCOL_E_BAD_MESSAGE },
	{ "session delete empty name", PROTOCOL_E_SESSION_BAD_NAME },
	{ "session delete good", 0 },
	{ "nothing set", PROTOCOL_E_BAD_MESSAGE },
};

/* Storage for the non-Generate variants. */
typedef struct Other {
	Turbokv__V1__Hello hello;
	Turbokv__V1__Cancel cancel;
	Turbokv__V1__StatusRequest status;
	Turbokv__V1__SessionList list;
	Turbokv__V1__SessionShow show;
	Turbokv__V1__SessionDelete del;
} Other;

static void case_build(int i, Good *x, Other *o)
{
	const char *w = cases[i].what;
	Turbokv__V1__ClientMessage *m = &x->m;
	Turbokv__V1__Generate *g = &x->g;
	Turbokv__V1__Sampling *s = &x->samp;

	good_init(x);
	turbokv__v1__hello__init(&o->hello);
	o->hello.protocol_version = TURBOKV_PROTOCOL_VERSION;
	o->hello.client_name = "test";
	turbokv__v1__cancel__init(&o->cancel);
	turbokv__v1__status_request__init(&o->status);
	turbokv__v1__session_list__init(&o->list);
	turbokv__v1__session_show__init(&o->show);
	turbokv__v1__session_delete__init(&o->del);
	o->show.request_id = o->del.request_id = 1;
	o->show.name = o->del.name = "work";

	if (!strcmp(w, "request_id 0"))
		g->request_id = 0;
	else if (!strcmp(w, "no input"))
		g->input_case = TURBOKV__V1__GENERATE__INPUT__NOT_SET;
	else if (!strcmp(w, "empty chat"))
		x->chat.n_messages = 0;
	else if (!strcmp(w, "role unspecified"))
		x->msg[1].role = TURBOKV__V1__ROLE__ROLE_UNSPECIFIED;
	else if (!strcmp(w, "role out of range"))
		x->msg[0].role = (Turbokv__V1__Role)4;
	else if (!strcmp(w, "content overlong utf8"))
		x->msg[1].content = bin("a\xc0\xafz"); /* overlong '/' */
	else if (!strcmp(w, "content with NUL"))
		x->msg[1].content = (ProtobufCBinaryData){ 3, (uint8_t *)"a\0b" };
	else if (!strcmp(w, "raw prompt lone continuation byte") || !strcmp(w, "raw prompt good")) {
		g->input_case = TURBOKV__V1__GENERATE__INPUT_RAW_PROMPT;
		g->raw_prompt = bin(w[11] == 'l' ? "x\x80y" : "plain \xe2\x82\xac text");
	} else if (!strcmp(w, "more attachments than fds"))
		g->n_attachments = 3;
	else if (!strcmp(w, "more fds than attachments"))
		x->n_fds = 3;
	else if (!strcmp(w, "fd_index out of range"))
		x->att[1].fd_index = 2;
	else if (!strcmp(w, "fd_index twice"))
		x->att[1].fd_index = 1;
	else if (!strcmp(w, "too many attachments"))
		g->n_attachments = x->n_fds = PROTOCOL_MAX_ATTACHMENTS + 1;
	else if (!strcmp(w, "max attachments")) {
		g->n_attachments = x->n_fds = PROTOCOL_MAX_ATTACHMENTS;
		x->att[0].fd_index = 0;
		x->att[1].fd_index = 1;
	} else if (!strcmp(w, "attachment over cap"))
		x->att[1].size = PROTOCOL_MAX_ATTACHMENT_BYTES + 1;
	else if (!strcmp(w, "attachment at cap"))
		x->att[1].size = PROTOCOL_MAX_ATTACHMENT_BYTES;
	else if (!strcmp(w, "attachment name too long") || !strcmp(w, "attachment name at limit")) {
		size_t n = PROTOCOL_MAX_NAME_BYTES + (strstr(w, "too long") ? 1 : 0);
		memset(x->long_text, 'n', n);
		x->long_text[n] = 0;
		x->att[0].name = x->long_text;
	} else if (!strcmp(w, "attachment name not utf8"))
		x->att[0].name = "caf\xe9.txt"; /* Latin-1 */
	else if (!strcmp(w, "mime control char"))
		x->att[0].mime = "text/plain\n";
	else if (!strcmp(w, "temperature NaN"))
		s->temperature = NAN;
	else if (!strcmp(w, "temperature negative"))
		s->temperature = -0.01f;
	else if (!strcmp(w, "temperature too high"))
		s->temperature = PROTOCOL_MAX_TEMPERATURE * 1.01f;
	else if (!strcmp(w, "temperature infinite"))
		s->temperature = INFINITY;
	else if (!strcmp(w, "temperature zero"))
		s->temperature = 0.0f;
	else if (!strcmp(w, "top_k too large"))
		s->top_k = PROTOCOL_MAX_TOP_K + 1;
	else if (!strcmp(w, "top_p above 1"))
		s->top_p = 1.001f;
	else if (!strcmp(w, "min_p negative"))
		s->min_p = -0.001f;
	else if (!strcmp(w, "repeat_penalty zero"))
		s->repeat_penalty = 0.0f;
	else if (!strcmp(w, "repeat_penalty NaN"))
		s->repeat_penalty = NAN;
	else if (!strcmp(w, "repeat_last_n too large"))
		s->repeat_last_n = PROTOCOL_MAX_REPEAT_LAST_N + 1;
	else if (!strcmp(w, "unset sampling fields ignored")) {
		/* out-of-range values behind unset oneofs are not on the wire */
		s->opt_temperature_case = TURBOKV__V1__SAMPLING__OPT_TEMPERATURE__NOT_SET;
		s->temperature = NAN;
		s->opt_repeat_penalty_case = TURBOKV__V1__SAMPLING__OPT_REPEAT_PENALTY__NOT_SET;
		s->repeat_penalty = 0.0f;
		s->greedy = 1;
	} else if (!strcmp(w, "max_tokens too large"))
		g->max_tokens = PROTOCOL_MAX_MAX_TOKENS + 1;
	else if (!strcmp(w, "too many stop strings"))
		g->n_stop = PROTOCOL_MAX_STOP_STRINGS + 1;
	else if (!strcmp(w, "max stop strings"))
		g->n_stop = PROTOCOL_MAX_STOP_STRINGS;
	else if (!strcmp(w, "empty stop string"))
		x->stop[1] = (ProtobufCBinaryData){ 0, NULL };
	else if (!strcmp(w, "stop string too long")) {
		memset(x->long_text, 's', PROTOCOL_MAX_STOP_BYTES + 1);
		x->stop[1] = (ProtobufCBinaryData){ PROTOCOL_MAX_STOP_BYTES + 1, (uint8_t *)x->long_text };
	} else if (!strcmp(w, "stop string surrogate"))
		x->stop[0] = bin("\xed\xa0\x80");
	else if (!strcmp(w, "session with slash"))
		g->session = "../etc";
	else if (!strcmp(w, "session dotdot"))
		g->session = "..";
	else if (!strcmp(w, "no session"))
		g->session = "";
	else if (!strcmp(w, "context policy out of range"))
		g->context_policy = (Turbokv__V1__ContextPolicy)3;
	else if (!strncmp(w, "hello", 5)) {
		m->msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO;
		m->hello = &o->hello;
		x->n_fds = 0;
		if (!strcmp(w, "hello version 0"))
			o->hello.protocol_version = 0;
		else if (!strcmp(w, "hello version too new"))
			o->hello.protocol_version = TURBOKV_PROTOCOL_VERSION + 1;
		else if (!strcmp(w, "hello client name too long")) {
			memset(x->long_text, 'c', PROTOCOL_MAX_NAME_BYTES + 1);
			x->long_text[PROTOCOL_MAX_NAME_BYTES + 1] = 0;
			o->hello.client_name = x->long_text;
		} else if (!strcmp(w, "hello client name not utf8"))
			o->hello.client_name = "\xff";
		else if (!strcmp(w, "hello with an fd"))
			x->n_fds = 1;
	} else if (!strcmp(w, "cancel id 0")) {
		m->msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL;
		m->cancel = &o->cancel;
		x->n_fds = 0;
	} else if (!strcmp(w, "status id 0")) {
		m->msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_STATUS;
		m->status = &o->status;
		x->n_fds = 0;
	} else if (!strcmp(w, "session list id 0")) {
		m->msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_LIST;
		m->session_list = &o->list;
		x->n_fds = 0;
	} else if (!strncmp(w, "session show", 12)) {
		m->msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SHOW;
		m->session_show = &o->show;
		x->n_fds = 0;
		if (strstr(w, "bad name"))
			o->show.name = "a b";
		else
			o->show.request_id = 0;
	} else if (!strncmp(w, "session delete", 14)) {
		m->msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_DELETE;
		m->session_delete = &o->del;
		x->n_fds = 0;
		if (strstr(w, "empty"))
			o->del.name = "";
	} else if (!strcmp(w, "nothing set")) {
		m->msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG__NOT_SET;
		x->n_fds = 0;
	} else
		ck_assert_msg(!strcmp(w, "good generate"), "case '%s' not built", w);
}

START_TEST(validation_case)
{
	Good x;
	Other o;
	Error err = { 0 };
	const Case *c = &cases[_i];

	case_build(_i, &x, &o);

	/* as built in memory */
	int r = protocol_validate_client_message(&x.m, x.n_fds, &err);
	ck_assert_msg(r == c->want, "%s: validate returned %d (%s), want %d", c->what, r, err.msg, c->want);
	if (r)
		ck_assert_msg(err.msg[0], "%s: no message", c->what);

	/* as the daemon sees it: packed, unpacked, validated */
	size_t n;
	uint8_t *buf = pack_client(&x.m, &n);
	Turbokv__V1__ClientMessage *m = NULL;
	memset(&err, 0, sizeof(err));
	r = protocol_client_message_unpack(buf, n, x.n_fds, &m, &err);
	ck_assert_msg(r == c->want, "%s: unpack returned %d (%s), want %d", c->what, r, err.msg, c->want);
	ck_assert(r == 0 ? m != NULL : m == NULL);
	protocol_client_message_free(m);
	free(buf);
}
END_TEST

START_TEST(frames_over_the_cap_are_bad_frames)
{
	uint8_t *big = calloc(PROTOCOL_MAX_FRAME_BYTES + 1, 1);
	Turbokv__V1__ClientMessage *m = NULL;
	Error err = { 0 };
	ck_assert_ptr_nonnull(big);
	/* zeros are not even valid protobuf (field 0); the length is checked first */
	ck_assert_int_eq(protocol_client_message_unpack(big, PROTOCOL_MAX_FRAME_BYTES + 1, 0, &m, &err),
			 PROTOCOL_E_BAD_FRAME);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(strstr(err.msg, "more than"));
	free(big);

	/* an empty payload decodes (every field default) but says nothing */
	ck_assert_int_eq(protocol_client_message_unpack((const uint8_t *)"", 0, 0, &m, NULL),
			 PROTOCOL_E_BAD_MESSAGE);
}
END_TEST

START_TEST(truncated_and_garbage_input_fails_cleanly)
{
	Good x;
	good_init(&x);
	size_t n;
	uint8_t *buf = pack_client(&x.m, &n);

	/*
	 * Every proper prefix of a Generate frame cuts into the outer
	 * length-delimited field (generate = 2 spans the whole message), so
	 * none of them decodes. Each prefix sits in a block of its own size
	 * so ASan sees any read past it.
	 */
	for (size_t len = 1; len < n; len++) {
		uint8_t *p = malloc(len);
		memcpy(p, buf, len);
		Turbokv__V1__ClientMessage *m = turbokv__v1__client_message__unpack(NULL, len, p);
		ck_assert_msg(m == NULL, "prefix of %zu/%zu bytes decoded", len, n);
		ck_assert_int_eq(protocol_client_message_unpack(p, len, 2, &m, NULL), PROTOCOL_E_BAD_FRAME);
		free(p);
	}

	/* hand-made bad encodings */
	static const struct {
		const char *what;
		uint8_t bytes[16];
		size_t len;
	} bad[] = {
		{ "field number 0", { 0x00, 0x01 }, 2 },
		{ "wire type 7", { 0x0f, 0x00 }, 2 },
		{ "varint of 11 bytes", { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 }, 12 },
		{ "length past the end", { 0x0a, 0x7f, 0x08, 0x01 }, 4 },
		{ "length of 2^32", { 0x0a, 0x80, 0x80, 0x80, 0x80, 0x10 }, 6 },
		{ "nested length past its parent", { 0x0a, 0x03, 0x12, 0x05, 'a', 'b', 'c' }, 7 },
		{ "fixed64 cut short", { 0x19, 0x01, 0x02 }, 3 },
		{ "hello sent as a varint", { 0x08, 0x01 }, 2 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		uint8_t *p = malloc(bad[i].len);
		memcpy(p, bad[i].bytes, bad[i].len);
		Turbokv__V1__ClientMessage *m = turbokv__v1__client_message__unpack(NULL, bad[i].len, p);
		ck_assert_msg(m == NULL, "%s: decoded", bad[i].what);
		free(p);
	}

	/*
	 * Field number 0 spelled as a two-byte tag (85 00: fixed32, field 0):
	 * protobuf-c decodes it as an unknown field, validation refuses it,
	 * at the top level and inside a nested message. An unknown field
	 * with a real number (15, from a newer client) is ignored.
	 */
	static const uint8_t tag0_top[] = { 0x1a, 0x02, 0x08, 0x01, 0x85, 0x00, 1, 2, 3, 4 };
	static const uint8_t tag0_nested[] = { 0x1a, 0x08, 0x08, 0x01, 0x85, 0x00, 1, 2, 3, 4 };
	static const uint8_t tag15[] = { 0x1a, 0x02, 0x08, 0x01, 0x78, 0x05 };
	Turbokv__V1__ClientMessage *m0 = turbokv__v1__client_message__unpack(NULL, sizeof(tag0_top), tag0_top);
	ck_assert_ptr_nonnull(m0);
	ck_assert_uint_eq(m0->base.n_unknown_fields, 1);
	protocol_client_message_free(m0);
	m0 = turbokv__v1__client_message__unpack(NULL, sizeof(tag0_nested), tag0_nested);
	ck_assert_ptr_nonnull(m0);
	ck_assert_uint_eq(m0->cancel->base.n_unknown_fields, 1);
	protocol_client_message_free(m0);
	m0 = NULL;
	ck_assert_int_eq(protocol_client_message_unpack(tag0_top, sizeof(tag0_top), 0, &m0, NULL),
			 PROTOCOL_E_BAD_FRAME);
	ck_assert_int_eq(protocol_client_message_unpack(tag0_nested, sizeof(tag0_nested), 0, &m0, NULL),
			 PROTOCOL_E_BAD_FRAME);
	ck_assert_ptr_null(m0);
	ck_assert_int_eq(protocol_client_message_unpack(tag15, sizeof(tag15), 0, &m0, NULL), 0);
	ck_assert_uint_eq(m0->cancel->request_id, 1);
	protocol_client_message_free(m0);

	/* random bytes and random flips of a good frame: no crash, no leak */
	uint64_t st = test_seed();
	size_t decoded = 0;
	for (int it = 0; it < 20000; it++) {
		size_t len = it % 2 ? test_rand_u64(&st) % 64 : n;
		uint8_t *p = malloc(len ? len : 1);
		if (it % 2) {
			for (size_t k = 0; k < len; k++)
				p[k] = (uint8_t)test_rand_u64(&st);
		} else {
			memcpy(p, buf, n);
			for (int f = 0; f < 3; f++)
				p[test_rand_u64(&st) % n] ^= (uint8_t)(1u << (test_rand_u64(&st) % 8));
		}
		Turbokv__V1__ClientMessage *m = NULL;
		Error err = { 0 };
		int r = protocol_client_message_unpack(p, len, 2, &m, &err);
		ck_assert(r == 0 || protocol_error_code_valid(r));
		ck_assert(r == 0 ? m != NULL : (m == NULL && err.msg[0]));
		decoded += r == 0;
		protocol_client_message_free(m);
		free(p);
	}
	ck_assert(decoded < 20000);
	free(buf);
}
END_TEST

/* A string field holding NUL is refused by its wire bytes, not cut short by protobuf-c. */
START_TEST(nul_in_strings_is_refused)
{
	/* SessionDelete{request_id: 1, name: "good\0x"}: ClientMessage field 7 */
	static const uint8_t del[] = { 0x3a, 0x0a, 0x08, 0x01, 0x12, 0x06, 'g', 'o', 'o', 'd', 0, 'x' };
	/* Hello{protocol_version: 1, client_name: "a\0"} */
	static const uint8_t hello[] = { 0x0a, 0x06, 0x08, 0x01, 0x12, 0x02, 'a', 0 };
	/* Generate{request_id: 1, raw_prompt: "hi", session: "s\0"} */
	static const uint8_t gen[] = { 0x12, 0x0a, 0x08, 0x01, 0x1a, 0x02, 'h', 'i', 0x42, 0x02, 's', 0 };
	/* the same without NUL */
	static const uint8_t ok[] = { 0x3a, 0x08, 0x08, 0x01, 0x12, 0x04, 'g', 'o', 'o', 'd' };
	Turbokv__V1__ClientMessage *m = NULL;
	Error err = { 0 };

	/* protobuf-c alone would let the first one through as "good" */
	Turbokv__V1__ClientMessage *raw = turbokv__v1__client_message__unpack(NULL, sizeof(del), del);
	ck_assert_ptr_nonnull(raw);
	ck_assert_str_eq(raw->session_delete->name, "good");
	protocol_client_message_free(raw);

	ck_assert_int_eq(protocol_client_message_unpack(del, sizeof(del), 0, &m, &err), PROTOCOL_E_BAD_MESSAGE);
	ck_assert_ptr_nonnull(strstr(err.msg, "session_delete.name"));
	ck_assert_ptr_nonnull(strstr(err.msg, "byte 4"));
	ck_assert_int_eq(protocol_check_encoded_strings(hello, sizeof(hello), &err), PROTOCOL_E_BAD_MESSAGE);
	ck_assert_ptr_nonnull(strstr(err.msg, "hello.client_name"));
	ck_assert_int_eq(protocol_check_encoded_strings(gen, sizeof(gen), &err), PROTOCOL_E_BAD_MESSAGE);
	ck_assert_ptr_nonnull(strstr(err.msg, "generate.session"));
	ck_assert_ptr_null(m);
	ck_assert_int_eq(protocol_client_message_unpack(ok, sizeof(ok), 0, &m, &err), 0);
	ck_assert_str_eq(m->session_delete->name, "good");
	protocol_client_message_free(m);
	/* truncated encodings are bad frames, never read past the end */
	for (size_t n = 1; n < sizeof(ok); n++)
		ck_assert_int_ne(protocol_check_encoded_strings(ok, n, &err), 0);
}
END_TEST

START_TEST(session_names)
{
	char max[PROTOCOL_MAX_SESSION_NAME + 2];
	memset(max, 'x', sizeof(max));
	max[PROTOCOL_MAX_SESSION_NAME] = 0;
	ck_assert(protocol_session_name_valid(max));
	max[PROTOCOL_MAX_SESSION_NAME] = 'x';
	max[PROTOCOL_MAX_SESSION_NAME + 1] = 0;
	ck_assert(!protocol_session_name_valid(max));

	static const char *const good[] = { "a", "Z", "0", "work", "notes-2024.v1", "a_b-c.d",
					    "...", ".hidden", "a..b", "-", "_" };
	for (size_t i = 0; i < ARRAY_SIZE(good); i++)
		ck_assert_msg(protocol_session_name_valid(good[i]), "'%s' refused", good[i]);
	static const char *const bad[] = { "", ".", "..", "a/b", "/", "a b", "a\tb", "a\n",
					   "caf\xc3\xa9", "a:b", "a\\b", "*", "~x", "a%2f" };
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		ck_assert_msg(!protocol_session_name_valid(bad[i]), "'%s' accepted", bad[i]);
	ck_assert(!protocol_session_name_valid(NULL));

	/* every single byte against the character class */
	for (int c = 1; c < 256; c++) {
		char s[2] = { (char)c, 0 };
		bool want = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			    c == '_' || c == '-';
		ck_assert_msg(protocol_session_name_valid(s) == want, "byte 0x%02x", c);
	}
}
END_TEST

/* The reference: the engine's strict decoder, one code point at a time. */
static bool ref_text_valid(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		size_t k;
		uint32_t cp = unicode_decode_utf8((const char *)s + i, n - i, &k);
		if (cp == UNICODE_INVALID || cp == 0)
			return false;
		i += k;
	}
	return true;
}

START_TEST(text_check_matches_the_engine_decoder)
{
	static const struct {
		const char *s;
		bool ok;
	} fixed[] = {
		{ "", true },
		{ "plain", true },
		{ "\xc3\xa9", true },             /* U+00E9 */
		{ "\xe2\x82\xac", true },         /* U+20AC */
		{ "\xf0\x9f\x98\x80", true },     /* U+1F600 */
		{ "\xf4\x8f\xbf\xbf", true },     /* U+10FFFF */
		{ "\xef\xbf\xbf", true },         /* U+FFFF */
		{ "\xc0\x80", false },            /* overlong NUL */
		{ "\xc1\xbf", false },            /* overlong */
		{ "\xe0\x9f\xbf", false },        /* overlong 3-byte */
		{ "\xf0\x8f\xbf\xbf", false },    /* overlong 4-byte */
		{ "\xed\xa0\x80", false },        /* U+D800 */
		{ "\xed\xbf\xbf", false },        /* U+DFFF */
		{ "\xf4\x90\x80\x80", false },    /* U+110000 */
		{ "\xf5\x80\x80\x80", false },
		{ "\xe2\x82", false },            /* truncated */
		{ "\x80", false },                /* stray continuation */
		{ "\xc3\x28", false },            /* bad continuation */
		{ "\xff", false },
	};
	for (size_t i = 0; i < ARRAY_SIZE(fixed); i++) {
		const uint8_t *s = (const uint8_t *)fixed[i].s;
		size_t n = strlen(fixed[i].s);
		ck_assert_msg(protocol_text_valid(s, n) == fixed[i].ok, "case %zu", i);
		ck_assert_msg(ref_text_valid(s, n) == fixed[i].ok, "reference, case %zu", i);
	}
	ck_assert(!protocol_text_valid((const uint8_t *)"a\0b", 3));

	/* random strings drawn mostly from lead/continuation bytes */
	uint64_t st = test_seed();
	size_t n_valid = 0;
	for (int it = 0; it < 200000; it++) {
		uint8_t s[8];
		size_t n = 1 + test_rand_u64(&st) % sizeof(s);
		for (size_t k = 0; k < n; k++) {
			uint64_t r = test_rand_u64(&st);
			s[k] = (r & 3) == 0 ? (uint8_t)(0x80 | ((r >> 8) & 0x3f)) : (uint8_t)(r >> 16);
		}
		bool got = protocol_text_valid(s, n), want = ref_text_valid(s, n);
		ck_assert_msg(got == want, "iteration %d: got %d want %d", it, got, want);
		n_valid += got;
	}
	ck_assert(n_valid > 1000); /* the draw reaches valid multi-byte text too */
}
END_TEST

START_TEST(error_codes_are_stable)
{
	/* the numbering of turbokv.proto, as documented: never renumbered */
	static const char *const names[] = {
		"UNSPECIFIED", "BAD_FRAME", "BAD_MESSAGE", "UNSUPPORTED_VERSION", "HELLO_REQUIRED",
		"TOO_MANY_REQUESTS", "REQUEST_ID_IN_USE", "UNKNOWN_REQUEST", "CONTEXT_OVERFLOW",
		"ATTACHMENT_NOT_MEMFD", "ATTACHMENT_NOT_SEALED", "ATTACHMENT_TOO_LARGE",
		"ATTACHMENT_NOT_UTF8", "ATTACHMENT_SIZE_MISMATCH", "SESSION_NOT_FOUND",
		"SESSION_BAD_NAME", "SESSION_QUOTA", "SESSION_CORRUPT", "SESSION_BUSY", "BUSY",
		"SHUTTING_DOWN", "CANCELLED", "INTERNAL", "TIMEOUT",
	};
	for (int i = 0; i < (int)ARRAY_SIZE(names); i++) {
		ck_assert_ptr_nonnull(protocol_error_code_name(i));
		ck_assert_str_eq(protocol_error_code_name(i), names[i]);
		ck_assert(protocol_error_code_valid(i) == (i != 0));
	}
	ck_assert_uint_eq(turbokv__v1__error_code__descriptor.n_values, ARRAY_SIZE(names));
	ck_assert_ptr_null(protocol_error_code_name((int)ARRAY_SIZE(names)));
	ck_assert_ptr_null(protocol_error_code_name(-1));
	ck_assert(!protocol_error_code_valid(9999));

	ck_assert_int_eq(PROTOCOL_E_BAD_FRAME, 1);
	ck_assert_int_eq(PROTOCOL_E_ATTACHMENT_NOT_MEMFD, 9);
	ck_assert_int_eq(PROTOCOL_E_ATTACHMENT_NOT_SEALED, 10);
	ck_assert_int_eq(PROTOCOL_E_ATTACHMENT_TOO_LARGE, 11);
	ck_assert_int_eq(PROTOCOL_E_INTERNAL, 22);
	ck_assert_str_eq(protocol_error_code_name(PROTOCOL_E_SESSION_BAD_NAME), "SESSION_BAD_NAME");

	Error err = { 0 };
	ck_assert_int_eq(protocol_version_check(TURBOKV_PROTOCOL_VERSION, &err), 0);
	ck_assert_int_eq(protocol_version_check(TURBOKV_PROTOCOL_VERSION + 1, &err),
			 PROTOCOL_E_UNSUPPORTED_VERSION);
	ck_assert_int_eq(err.code, PROTOCOL_E_UNSUPPORTED_VERSION);
	ck_assert_ptr_nonnull(strstr(err.msg, "not supported"));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("proto");
	TCase *tc = tcase_create("messages");
	tcase_add_test(tc, generate_roundtrip_keeps_every_field);
	tcase_add_test(tc, other_client_messages_roundtrip);
	tcase_add_test(tc, server_messages_roundtrip);
	tcase_add_test(tc, wire_bytes_match_the_encoding_rules);
	suite_add_tcase(s, tc);

	tc = tcase_create("validation");
	tcase_add_loop_test(tc, validation_case, 0, (int)ARRAY_SIZE(cases));
	tcase_add_test(tc, frames_over_the_cap_are_bad_frames);
	tcase_add_test(tc, truncated_and_garbage_input_fails_cleanly);
	tcase_add_test(tc, session_names);
	tcase_add_test(tc, nul_in_strings_is_refused);
	tcase_add_test(tc, text_check_matches_the_engine_decoder);
	tcase_add_test(tc, error_codes_are_stable);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
