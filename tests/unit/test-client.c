/*
 * test-client.c: libturbokv and the turbokv CLI against a fake daemon.
 *
 * The fake daemon listens on a real Unix socket in a temporary directory
 * and runs in a thread of the test: it reads frames with the ipc/ reader
 * and fd queue, decodes and validates every ClientMessage with the
 * daemon's own rules (protocol_client_message_unpack), answers Hello, and
 * then plays a scripted exchange (Progress, Token deltas, Done, Error, a
 * close mid-stream). What it saw is recorded and checked by the test after
 * the thread is joined; expected values are literals of the test, not
 * outputs of the code under test. The CLI tests exec the built `turbokv`
 * binary (beside this program's build directory, or $TKV_CLI) with
 * --socket and check stdout, stderr and the exit code.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/fdpass.h"
#include "ipc/frame.h"
#include "ipc/memfd.h"
#include "proto/protocol.h"
#include "tests/unit/testutil.h"
#include "turbokv/client.h"

#define IO_TIMEOUT_MS 5000

/* The answer every generate script streams: "Hello €!" with the euro sign split. */
static const char *const deltas[] = { "Hel", "lo \xE2\x82", "\xAC!" };
#define ANSWER "Hello \xE2\x82\xAC!"

typedef struct Conn {
	int fd;
	FrameReader *reader;
	FdQueue *fdq;
	FrameWriter *writer;
} Conn;

typedef struct FakeServer FakeServer;
typedef void (*Script)(FakeServer *s, Conn *c);

struct FakeServer {
	char dir[40];
	char path[80];
	int listen_fd;
	pthread_t thread;
	Script script;
	int n_conns;              /* connections to serve, one after the other */
	int hello_error;          /* answer Hello with this Error code instead */
	char failure[256];        /* first thing the server found wrong */
	/* recorded */
	uint32_t hello_version;
	char client_name[64];
	uint64_t gen_id;
	size_t n_messages;
	int roles[4];
	char contents[4][64];
	uint32_t max_tokens;
	bool greedy;
	bool has_seed;
	uint64_t seed;
	char session[80];
	char stop0[32];
	size_t n_attachments;
	char att_name[4][32];
	char att_mime[4][32];
	uint64_t att_size[4];
	char att_text[4][128];
	bool cancel_seen;
	uint64_t cancel_id;
	volatile int generate_seen;   /* for the SIGINT test */
};

static void srv_fail(FakeServer *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void srv_fail(FakeServer *s, const char *fmt, ...)
{
	va_list ap;
	if (s->failure[0])
		return;
	va_start(ap, fmt);
	vsnprintf(s->failure, sizeof(s->failure), fmt, ap);
	va_end(ap);
}

/*
 * Next ClientMessage (validated) with its fds; NULL at EOF or on failure
 * (recorded unless it is a clean EOF).
 */
static Turbokv__V1__ClientMessage *conn_recv(FakeServer *s, Conn *c, int *fds, size_t *ret_n_fds)
{
	for (;;) {
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		uint8_t buf[4096];
		Frame f;
		size_t n;
		int r = frame_reader_pop(c->reader, &f);

		if (r == 0) {
			Turbokv__V1__ClientMessage *raw, *m = NULL;
			size_t n_fds = 0;
			Error e = {0};

			raw = turbokv__v1__client_message__unpack(NULL, f.len, f.data);
			if (!raw) {
				srv_fail(s, "undecodable frame");
				return NULL;
			}
			if (raw->msg_case == TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE)
				n_fds = raw->generate->n_attachments;
			protocol_client_message_free(raw);
			if (fd_queue_take(c->fdq, f.offset, n_fds, fds) != 0) {
				srv_fail(s, "fds did not come with their frame");
				return NULL;
			}
			r = protocol_client_message_unpack(f.data, f.len, n_fds, &m, &e);
			if (r != 0) {
				srv_fail(s, "client sent an invalid message: %s", e.msg);
				for (size_t i = 0; i < n_fds; i++)
					close(fds[i]);
				return NULL;
			}
			if (ret_n_fds)
				*ret_n_fds = n_fds;
			else if (n_fds)
				srv_fail(s, "unexpected fds");
			return m;
		}
		if (poll(&p, 1, IO_TIMEOUT_MS) <= 0) {
			srv_fail(s, "timed out waiting for the client");
			return NULL;
		}
		r = fdpass_recv(c->fd, buf, sizeof(buf), c->fdq, &n);
		if (r != 0) {
			srv_fail(s, "recv: %d", r);
			return NULL;
		}
		if (n == 0)
			return NULL;
		if (frame_reader_feed(c->reader, buf, n, NULL) != 0) {
			srv_fail(s, "bad framing from client");
			return NULL;
		}
	}
}

static void conn_send(FakeServer *s, Conn *c, const Turbokv__V1__ServerMessage *m)
{
	size_t len = turbokv__v1__server_message__get_packed_size(m);
	uint8_t *buf = malloc(len ? len : 1);

	turbokv__v1__server_message__pack(m, buf);
	if (frame_writer_push(c->writer, buf, len, NULL) != 0 || frame_writer_flush(c->writer, c->fd) != 0)
		srv_fail(s, "send failed");
	free(buf);
}

static void send_progress(FakeServer *s, Conn *c, uint64_t id, uint32_t done, uint32_t total)
{
	Turbokv__V1__ServerMessage m = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Progress p = TURBOKV__V1__PROGRESS__INIT;
	p.request_id = id;
	p.prefilled_tokens = done;
	p.total_tokens = total;
	m.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_PROGRESS;
	m.progress = &p;
	conn_send(s, c, &m);
}

static void send_token(FakeServer *s, Conn *c, uint64_t id, const char *text, uint32_t token_id)
{
	Turbokv__V1__ServerMessage m = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Token t = TURBOKV__V1__TOKEN__INIT;
	t.request_id = id;
	t.text.data = (uint8_t *)text;
	t.text.len = strlen(text);
	t.token_id = token_id;
	m.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_TOKEN;
	m.token = &t;
	conn_send(s, c, &m);
}

static void send_done(FakeServer *s, Conn *c, uint64_t id, int reason)
{
	Turbokv__V1__ServerMessage m = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Done d = TURBOKV__V1__DONE__INIT;
	d.request_id = id;
	d.finish_reason = (Turbokv__V1__FinishReason)reason;
	d.prompt_tokens = 10;
	d.cached_tokens = 2;
	d.completion_tokens = 3;
	d.dropped_tokens = 0;
	d.prefill_ms = 1.5;
	d.decode_ms = 2.5;
	d.ttft_ms = 3.5;
	m.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_DONE;
	m.done = &d;
	conn_send(s, c, &m);
}

static void send_error(FakeServer *s, Conn *c, uint64_t id, int code, const char *msg)
{
	Turbokv__V1__ServerMessage m = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Error e = TURBOKV__V1__ERROR__INIT;
	e.request_id = id;
	e.code = (Turbokv__V1__ErrorCode)code;
	e.message = (char *)msg;
	m.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR;
	m.error = &e;
	conn_send(s, c, &m);
}

/* Receive a Generate and record it; returns its id, 0 on failure. */
static uint64_t recv_generate(FakeServer *s, Conn *c)
{
	int fds[FDPASS_MAX_FDS];
	size_t n_fds = 0;
	Turbokv__V1__ClientMessage *m = conn_recv(s, c, fds, &n_fds);
	const Turbokv__V1__Generate *g;
	uint64_t id;

	if (!m || m->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE) {
		srv_fail(s, "expected Generate");
		protocol_client_message_free(m);
		return 0;
	}
	g = m->generate;
	id = s->gen_id = g->request_id;
	if (g->input_case == TURBOKV__V1__GENERATE__INPUT_CHAT) {
		s->n_messages = g->chat->n_messages;
		for (size_t i = 0; i < g->chat->n_messages && i < 4; i++) {
			const Turbokv__V1__ChatMessage *cm = g->chat->messages[i];
			s->roles[i] = cm->role;
			snprintf(s->contents[i], sizeof(s->contents[i]), "%.*s", (int)cm->content.len,
				 (const char *)cm->content.data);
		}
	}
	s->max_tokens = g->max_tokens;
	if (g->sampling) {
		s->greedy = g->sampling->greedy;
		s->has_seed = g->sampling->opt_seed_case == TURBOKV__V1__SAMPLING__OPT_SEED_SEED;
		s->seed = g->sampling->seed;
	}
	snprintf(s->session, sizeof(s->session), "%s", g->session);
	if (g->n_stop)
		snprintf(s->stop0, sizeof(s->stop0), "%.*s", (int)g->stop[0].len, (const char *)g->stop[0].data);
	s->n_attachments = g->n_attachments;
	for (size_t i = 0; i < g->n_attachments && i < 4; i++) {
		const Turbokv__V1__Attachment *a = g->attachments[i];
		MemfdMapping map = {0};
		Error e = {0};
		int r;

		snprintf(s->att_name[i], sizeof(s->att_name[i]), "%s", a->name);
		snprintf(s->att_mime[i], sizeof(s->att_mime[i]), "%s", a->mime);
		s->att_size[i] = a->size;
		r = memfd_map_text(fds[a->fd_index], 0, &map, &e);
		if (r != 0)
			srv_fail(s, "attachment %zu refused: %s", i, e.msg);
		else
			snprintf(s->att_text[i], sizeof(s->att_text[i]), "%.*s", (int)map.size,
				 (const char *)map.data);
		memfd_mapping_release(&map);
	}
	for (size_t i = 0; i < n_fds; i++)
		close(fds[i]);
	protocol_client_message_free(m);
	s->generate_seen = 1;
	return id;
}

static bool handshake(FakeServer *s, Conn *c)
{
	Turbokv__V1__ServerMessage m = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__HelloReply hr = TURBOKV__V1__HELLO_REPLY__INIT;
	Turbokv__V1__ClientMessage *h = conn_recv(s, c, NULL, NULL);

	if (!h || h->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO) {
		srv_fail(s, "expected Hello first");
		protocol_client_message_free(h);
		return false;
	}
	s->hello_version = h->hello->protocol_version;
	snprintf(s->client_name, sizeof(s->client_name), "%s", h->hello->client_name);
	protocol_client_message_free(h);
	if (s->hello_error) {
		send_error(s, c, 0, s->hello_error, "protocol version 1 not in [7, 9]");
		return false;
	}
	hr.protocol_version = 1;
	hr.min_protocol_version = 1;
	hr.max_protocol_version = 1;
	hr.server_version = "9.8.7";
	hr.model_name = "FakeLM-1M";
	hr.model_fingerprint = "abc123";
	hr.kv_type = "q8_0:tq3";
	hr.context_size = 4096;
	hr.n_threads = 3;
	hr.device = "cpu";
	hr.max_frame_bytes = 1u << 20;
	hr.max_attachment_bytes = 1u << 20;
	hr.max_requests_in_flight = 4;
	m.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_HELLO_REPLY;
	m.hello_reply = &hr;
	conn_send(s, c, &m);
	return true;
}

/* Wait for the client to hang up (reading whatever it still sends). */
static void drain_until_eof(FakeServer *s, Conn *c)
{
	Turbokv__V1__ClientMessage *m;
	while ((m = conn_recv(s, c, NULL, NULL))) {
		srv_fail(s, "unexpected message %d", (int)m->msg_case);
		protocol_client_message_free(m);
	}
}

static void *server_main(void *userdata)
{
	FakeServer *s = userdata;

	for (int i = 0; i < s->n_conns; i++) {
		struct pollfd p = { .fd = s->listen_fd, .events = POLLIN };
		Conn c = { .fd = -1 };

		if (poll(&p, 1, IO_TIMEOUT_MS) <= 0) {
			srv_fail(s, "no client connected");
			break;
		}
		c.fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (c.fd < 0 || frame_reader_new(0, &c.reader) < 0 || fd_queue_new(0, &c.fdq) < 0 ||
		    frame_writer_new(0, &c.writer) < 0) {
			srv_fail(s, "accept/setup failed");
			break;
		}
		if (handshake(s, &c))
			s->script(s, &c);
		close(c.fd);
		frame_reader_free(c.reader);
		fd_queue_free(c.fdq);
		frame_writer_free(c.writer);
	}
	return NULL;
}

static void server_start(FakeServer *s, Script script, int n_conns)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	snprintf(s->dir, sizeof(s->dir), "/tmp/tkv-client-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(s->dir));
	snprintf(s->path, sizeof(s->path), "%s/turbokv.sock", s->dir);
	s->script = script;
	s->n_conns = n_conns;
	s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(s->listen_fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
	ck_assert_int_eq(bind(s->listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(s->listen_fd, 4), 0);
	ck_assert_int_eq(pthread_create(&s->thread, NULL, server_main, s), 0);
}

/* Join the server thread (the client must be gone or done) and clean up. */
static void server_stop(FakeServer *s)
{
	ck_assert_int_eq(pthread_join(s->thread, NULL), 0);
	close(s->listen_fd);
	unlink(s->path);
	rmdir(s->dir);
	ck_assert_msg(s->failure[0] == 0, "fake server: %s", s->failure);
}

/* ------------------------------------------------------------------------ */
/* Scripts */

static void script_stream(FakeServer *s, Conn *c)
{
	uint64_t id = recv_generate(s, c);
	if (!id)
		return;
	send_progress(s, c, id, 5, 10);
	send_progress(s, c, id, 10, 10);
	for (size_t i = 0; i < ARRAY_SIZE(deltas); i++)
		send_token(s, c, id, deltas[i], 100 + (uint32_t)i);
	send_done(s, c, id, TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP);
	drain_until_eof(s, c);
}

static void script_error(FakeServer *s, Conn *c)
{
	uint64_t id = recv_generate(s, c);
	Turbokv__V1__ClientMessage *m;

	if (!id)
		return;
	send_error(s, c, id, PROTOCOL_E_SESSION_NOT_FOUND, "no session named 'nope'");
	/* the connection stays usable: a status request follows */
	m = conn_recv(s, c, NULL, NULL);
	if (!m || m->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_STATUS) {
		srv_fail(s, "expected StatusRequest after the error");
	} else {
		Turbokv__V1__ServerMessage r = TURBOKV__V1__SERVER_MESSAGE__INIT;
		Turbokv__V1__StatusReply st = TURBOKV__V1__STATUS_REPLY__INIT;
		st.request_id = m->status->request_id;
		st.server_version = "9.8.7";
		st.model_name = "FakeLM-1M";
		st.kv_type = "tq3";
		st.device = "cpu";
		st.connections = 7;
		st.tokens_generated = 12345;
		st.kv_bits_per_value = 3.125;
		r.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_STATUS_REPLY;
		r.status_reply = &st;
		conn_send(s, c, &r);
	}
	protocol_client_message_free(m);
	drain_until_eof(s, c);
}

static void script_close_mid(FakeServer *s, Conn *c)
{
	uint64_t id = recv_generate(s, c);
	if (!id)
		return;
	send_token(s, c, id, "partial", 1);
	/* and half a frame: the length prefix of a 100-byte frame, 3 bytes */
	{
		uint8_t hdr[FRAME_HEADER_BYTES + 3] = { 0 };
		frame_header_encode(hdr, 100);
		if (write(c->fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr))
			srv_fail(s, "write");
	}
	/* returning closes the connection */
}

/* Expect a Cancel for id next; record it. */
static bool expect_cancel(FakeServer *s, Conn *c, uint64_t id)
{
	Turbokv__V1__ClientMessage *m = conn_recv(s, c, NULL, NULL);
	bool ok = m && m->msg_case == TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL;

	if (!ok)
		srv_fail(s, "expected Cancel");
	else {
		s->cancel_seen = true;
		s->cancel_id = m->cancel->request_id;
		if (s->cancel_id != id)
			srv_fail(s, "Cancel for %llu, generating %llu", (unsigned long long)s->cancel_id,
				 (unsigned long long)id);
	}
	protocol_client_message_free(m);
	return ok;
}

/* Token, then wait for the Cancel the client sends from its callback. */
static void script_cancel_in_callback(FakeServer *s, Conn *c)
{
	uint64_t id = recv_generate(s, c);
	if (!id)
		return;
	send_token(s, c, id, "a", 1);
	if (expect_cancel(s, c, id))
		send_done(s, c, id, TURBOKV__V1__FINISH_REASON__FINISH_REASON_CANCELLED);
	drain_until_eof(s, c);
}

/* Progress, then nothing until a Cancel arrives (from another thread or SIGINT). */
static void script_cancel_waiting(FakeServer *s, Conn *c)
{
	uint64_t id = recv_generate(s, c);
	if (!id)
		return;
	send_progress(s, c, id, 1, 1000);
	if (expect_cancel(s, c, id))
		send_error(s, c, id, PROTOCOL_E_CANCELLED, "cancelled before the first token");
	drain_until_eof(s, c);
}

/* The client cancels after Done was already sent: the daemon's late UNKNOWN_REQUEST must be dropped. */
static void script_cancel_late(FakeServer *s, Conn *c)
{
	uint64_t id = recv_generate(s, c);
	Turbokv__V1__ClientMessage *m;

	if (!id)
		return;
	send_token(s, c, id, "x", 1);
	send_done(s, c, id, TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP);
	if (!expect_cancel(s, c, id))
		return;
	send_error(s, c, id, PROTOCOL_E_UNKNOWN_REQUEST, "request not in flight");
	m = conn_recv(s, c, NULL, NULL);
	if (!m || m->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_DELETE)
		srv_fail(s, "expected SessionDelete");
	else
		send_error(s, c, m->session_delete->request_id, PROTOCOL_E_INTERNAL,
			   "sessions are not implemented yet");
	protocol_client_message_free(m);
	drain_until_eof(s, c);
}

static void script_sessions(FakeServer *s, Conn *c)
{
	Turbokv__V1__ClientMessage *m = conn_recv(s, c, NULL, NULL);
	Turbokv__V1__ServerMessage r = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__SessionListReply lr = TURBOKV__V1__SESSION_LIST_REPLY__INIT;
	Turbokv__V1__SessionInfo a = TURBOKV__V1__SESSION_INFO__INIT, b = TURBOKV__V1__SESSION_INFO__INIT;
	Turbokv__V1__SessionInfo *list[2] = { &a, &b };

	if (!m || m->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_LIST) {
		srv_fail(s, "expected SessionList");
		protocol_client_message_free(m);
		return;
	}
	a.name = "notes";
	a.tokens = 1234;
	a.bytes_on_disk = 99999;
	a.last_used_unix_ms = 1700000000000;
	a.in_memory = true;
	b.name = "old.chat-2";
	b.tokens = 5;
	lr.request_id = m->session_list->request_id;
	lr.n_sessions = 2;
	lr.sessions = list;
	r.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_LIST_REPLY;
	r.session_list_reply = &lr;
	conn_send(s, c, &r);
	protocol_client_message_free(m);

	m = conn_recv(s, c, NULL, NULL);
	if (!m || m->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SHOW) {
		srv_fail(s, "expected SessionShow");
	} else {
		snprintf(s->session, sizeof(s->session), "%s", m->session_show->name);
		send_error(s, c, m->session_show->request_id, PROTOCOL_E_SESSION_NOT_FOUND, "no session 'ghost'");
	}
	protocol_client_message_free(m);
	drain_until_eof(s, c);
}

/* ------------------------------------------------------------------------ */
/* Library tests */

typedef struct Collected {
	char text[256];
	size_t len;
	size_t n_deltas;
	char delta[8][16];
	size_t delta_len[8];
	uint32_t last_token_id;
	size_t n_progress;
	uint32_t progress_done[4], progress_total[4];
	TkvClient *cancel_client;   /* cancel from the first token callback */
} Collected;

static void on_progress(uint64_t id, uint32_t done, uint32_t total, void *userdata)
{
	Collected *col = userdata;
	(void)id;
	if (col->n_progress < 4) {
		col->progress_done[col->n_progress] = done;
		col->progress_total[col->n_progress] = total;
	}
	col->n_progress++;
}

static void on_token(uint64_t id, const char *text, size_t len, uint32_t token_id, void *userdata)
{
	Collected *col = userdata;
	(void)id;
	ck_assert_uint_lt(col->len + len, sizeof(col->text));
	memcpy(col->text + col->len, text, len);
	col->len += len;
	if (col->n_deltas < 8 && len < 16) {
		memcpy(col->delta[col->n_deltas], text, len);
		col->delta_len[col->n_deltas] = len;
	}
	col->n_deltas++;
	col->last_token_id = token_id;
	if (col->cancel_client)
		ck_assert_int_eq(tkv_cancel(col->cancel_client, 0), 0);
}

static TkvClient *connect_ok(const FakeServer *s)
{
	TkvClient *c = NULL;
	TkvError err = {0};
	int r = tkv_client_connect(s->path, "test-client/1", &c, &err);
	ck_assert_msg(r == 0, "connect: %d %s", r, err.message);
	ck_assert_ptr_nonnull(c);
	return c;
}

START_TEST(test_hello)
{
	FakeServer s = {0};
	TkvClient *c;
	const TkvServerInfo *i;

	server_start(&s, drain_until_eof, 1);
	c = connect_ok(&s);
	i = tkv_client_server_info(c);
	ck_assert_str_eq(i->server_version, "9.8.7");
	ck_assert_str_eq(i->model_name, "FakeLM-1M");
	ck_assert_str_eq(i->kv_type, "q8_0:tq3");
	ck_assert_str_eq(i->device, "cpu");
	ck_assert_uint_eq(i->context_size, 4096);
	ck_assert_uint_eq(i->n_threads, 3);
	ck_assert_uint_eq(i->max_attachment_bytes, 1u << 20);
	ck_assert_str_eq(tkv_client_socket_path(c), s.path);
	tkv_client_free(c);
	server_stop(&s);
	ck_assert_uint_eq(s.hello_version, 1);
	ck_assert_str_eq(s.client_name, "test-client/1");
}
END_TEST

START_TEST(test_generate_stream)
{
	FakeServer s = {0};
	TkvClient *c;
	TkvMessage msgs[] = { { TKV_ROLE_SYSTEM, "Be brief." }, { TKV_ROLE_USER, "Say hello" } };
	const char *stop[] = { "\n\n" };
	TkvSampling samp = { .set = TKV_SAMPLING_SEED, .seed = 42, .greedy = true };
	TkvRequest req = {
		.messages = msgs, .n_messages = 2, .max_tokens = 64, .stop = stop, .n_stop = 1,
		.sampling = &samp, .session = "my.session-1",
	};
	TkvCallbacks cb = { on_progress, on_token, NULL };
	Collected col = {0};
	TkvResult res;
	TkvError err = {0};
	int r;

	cb.userdata = &col;
	server_start(&s, script_stream, 1);
	c = connect_ok(&s);
	r = tkv_generate(c, &req, &cb, &res, &err);
	ck_assert_msg(r == 0, "generate: %d %s", r, err.message);
	tkv_client_free(c);
	server_stop(&s);

	/* the deltas arrive byte for byte, the euro sign split as sent */
	ck_assert_uint_eq(col.n_deltas, 3);
	ck_assert_uint_eq(col.delta_len[1], 5);
	ck_assert(memcmp(col.delta[1], "lo \xE2\x82", 5) == 0);
	ck_assert_uint_eq(col.delta_len[2], 2);
	ck_assert(memcmp(col.delta[2], "\xAC!", 2) == 0);
	ck_assert_uint_eq(col.len, strlen(ANSWER));
	ck_assert(memcmp(col.text, ANSWER, col.len) == 0);
	ck_assert_uint_eq(col.last_token_id, 102);
	ck_assert_uint_eq(col.n_progress, 2);
	ck_assert_uint_eq(col.progress_done[0], 5);
	ck_assert_uint_eq(col.progress_done[1], 10);
	ck_assert_uint_eq(col.progress_total[1], 10);

	ck_assert_uint_eq(res.request_id, s.gen_id);
	ck_assert_uint_ne(res.request_id, 0);
	ck_assert_int_eq(res.finish_reason, TKV_FINISH_STOP);
	ck_assert_uint_eq(res.prompt_tokens, 10);
	ck_assert_uint_eq(res.cached_tokens, 2);
	ck_assert_uint_eq(res.completion_tokens, 3);
	ck_assert(res.prefill_ms == 1.5 && res.decode_ms == 2.5 && res.ttft_ms == 3.5);

	/* what the daemon received */
	ck_assert_uint_eq(s.n_messages, 2);
	ck_assert_int_eq(s.roles[0], TURBOKV__V1__ROLE__ROLE_SYSTEM);
	ck_assert_str_eq(s.contents[0], "Be brief.");
	ck_assert_int_eq(s.roles[1], TURBOKV__V1__ROLE__ROLE_USER);
	ck_assert_str_eq(s.contents[1], "Say hello");
	ck_assert_uint_eq(s.max_tokens, 64);
	ck_assert(s.greedy);
	ck_assert(s.has_seed);
	ck_assert_uint_eq(s.seed, 42);
	ck_assert_str_eq(s.session, "my.session-1");
	ck_assert_str_eq(s.stop0, "\n\n");
	ck_assert_uint_eq(s.n_attachments, 0);
}
END_TEST

START_TEST(test_attachments)
{
	static const char doc[] = "Notes: caf\xC3\xA9 au lait.\n";
	static const char file_text[] = "line one\nline two \xE2\x9C\x93\n";
	char dir[] = "/tmp/tkv-client-att-XXXXXX", path[128];
	FakeServer s = {0};
	TkvClient *c;
	TkvAttachment att[2] = {
		{ .kind = TKV_ATTACH_BUFFER, .name = "notes.md", .mime = "text/markdown", .data = doc,
		  .size = sizeof(doc) - 1 },
		{ .kind = TKV_ATTACH_FILE },
	};
	TkvRequest req = { .raw_prompt = "Summarise.", .attachments = att, .n_attachments = 2 };
	TkvResult res;
	TkvError err = {0};
	FILE *f;
	int r;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/report.txt", dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(file_text, f);
	fclose(f);
	att[1].path = path;

	server_start(&s, script_stream, 1);
	c = connect_ok(&s);
	r = tkv_generate(c, &req, NULL, &res, &err);
	ck_assert_msg(r == 0, "generate: %d %s", r, err.message);
	tkv_client_free(c);
	server_stop(&s);
	unlink(path);
	rmdir(dir);

	ck_assert_uint_eq(s.n_attachments, 2);
	ck_assert_str_eq(s.att_name[0], "notes.md");
	ck_assert_str_eq(s.att_mime[0], "text/markdown");
	ck_assert_uint_eq(s.att_size[0], sizeof(doc) - 1);
	ck_assert_str_eq(s.att_text[0], doc);
	ck_assert_str_eq(s.att_name[1], "report.txt");
	ck_assert_uint_eq(s.att_size[1], sizeof(file_text) - 1);
	ck_assert_str_eq(s.att_text[1], file_text);
}
END_TEST

START_TEST(test_attachment_refused_locally)
{
	static const char bad[] = "ok \xC3\x28 not utf-8";
	FakeServer s = {0};
	TkvClient *c;
	TkvAttachment a = { .kind = TKV_ATTACH_BUFFER, .name = "bad.txt", .data = bad, .size = sizeof(bad) - 1 };
	TkvAttachment missing = { .kind = TKV_ATTACH_FILE, .path = "/nonexistent/dir/x.txt" };
	TkvRequest req = { .raw_prompt = "x", .attachments = &a, .n_attachments = 1 };
	TkvError err = {0};

	server_start(&s, script_stream, 1);
	c = connect_ok(&s);
	ck_assert_int_eq(tkv_generate(c, &req, NULL, NULL, &err), TKV_E_ATTACHMENT_NOT_UTF8);
	ck_assert_int_eq(err.code, TKV_E_ATTACHMENT_NOT_UTF8);
	ck_assert_ptr_nonnull(strstr(err.message, "bad.txt"));
	req.attachments = &missing;
	ck_assert_int_eq(tkv_generate(c, &req, NULL, NULL, &err), TKV_E_IO);
	ck_assert_int_eq(err.sys_errno, ENOENT);
	/* the connection is still fine: a good request goes through */
	req.n_attachments = 0;
	ck_assert_int_eq(tkv_generate(c, &req, NULL, NULL, &err), 0);
	tkv_client_free(c);
	server_stop(&s);
}
END_TEST

START_TEST(test_server_error)
{
	FakeServer s = {0};
	TkvClient *c;
	TkvRequest req = { .raw_prompt = "hi", .session = "nope" };
	TkvStatus *st = NULL;
	TkvError err = {0};
	int r;

	server_start(&s, script_error, 1);
	c = connect_ok(&s);
	r = tkv_generate(c, &req, NULL, NULL, &err);
	ck_assert_int_eq(r, TKV_E_SESSION_NOT_FOUND);
	ck_assert_int_eq(err.code, TKV_E_SESSION_NOT_FOUND);
	ck_assert_str_eq(err.message, "no session named 'nope'");
	ck_assert_str_eq(tkv_error_code_name(r), "SESSION_NOT_FOUND");
	ck_assert(tkv_error_is_server(r));

	r = tkv_status(c, &st, &err);
	ck_assert_msg(r == 0, "status: %s", err.message);
	ck_assert_str_eq(st->model_name, "FakeLM-1M");
	ck_assert_str_eq(st->kv_type, "tq3");
	ck_assert_uint_eq(st->connections, 7);
	ck_assert_uint_eq(st->tokens_generated, 12345);
	ck_assert(st->kv_bits_per_value == 3.125);
	tkv_status_free(st);
	tkv_client_free(c);
	server_stop(&s);
}
END_TEST

START_TEST(test_server_closed_mid_stream)
{
	FakeServer s = {0};
	TkvClient *c;
	TkvRequest req = { .raw_prompt = "hi" };
	TkvCallbacks cb = { NULL, on_token, NULL };
	Collected col = {0};
	TkvError err = {0};
	TkvStatus *st = NULL;

	cb.userdata = &col;
	server_start(&s, script_close_mid, 1);
	c = connect_ok(&s);
	ck_assert_int_eq(tkv_generate(c, &req, &cb, NULL, &err), TKV_E_SERVER_CLOSED);
	ck_assert_str_eq(tkv_error_code_name(err.code), "SERVER_CLOSED");
	ck_assert_uint_eq(col.n_deltas, 1);
	/* the client is unusable now, and says so without touching the socket */
	ck_assert_int_eq(tkv_status(c, &st, &err), TKV_E_SERVER_CLOSED);
	ck_assert_ptr_null(st);
	tkv_client_free(c);
	server_stop(&s);
}
END_TEST

START_TEST(test_cancel_in_callback)
{
	FakeServer s = {0};
	TkvClient *c;
	TkvRequest req = { .raw_prompt = "hi", .request_id = 777 };
	TkvCallbacks cb = { NULL, on_token, NULL };
	Collected col = {0};
	TkvResult res;
	TkvError err = {0};
	int r;

	cb.userdata = &col;
	server_start(&s, script_cancel_in_callback, 1);
	c = connect_ok(&s);
	col.cancel_client = c;
	r = tkv_generate(c, &req, &cb, &res, &err);
	ck_assert_msg(r == 0, "generate: %d %s", r, err.message);
	ck_assert_int_eq(res.finish_reason, TKV_FINISH_CANCELLED);
	ck_assert_uint_eq(res.request_id, 777);
	tkv_client_free(c);
	server_stop(&s);
	ck_assert(s.cancel_seen);
	ck_assert_uint_eq(s.cancel_id, 777);
}
END_TEST

typedef struct Canceller {
	TkvClient *c;
	uint64_t id;
} Canceller;

static void *cancel_thread(void *userdata)
{
	Canceller *k = userdata;
	struct timespec ts = { 0, 100 * 1000 * 1000 };
	nanosleep(&ts, NULL);
	tkv_cancel(k->c, k->id);
	return NULL;
}

START_TEST(test_cancel_from_thread)
{
	FakeServer s = {0};
	TkvRequest req = { .raw_prompt = "a long prompt" };
	Canceller k = {0};
	pthread_t t;
	TkvError err = {0};
	int r;

	server_start(&s, script_cancel_waiting, 1);
	k.c = connect_ok(&s);
	ck_assert_int_eq(pthread_create(&t, NULL, cancel_thread, &k), 0);
	r = tkv_generate(k.c, &req, NULL, NULL, &err);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(r, TKV_E_CANCELLED);
	ck_assert_str_eq(err.message, "cancelled before the first token");
	tkv_client_free(k.c);
	server_stop(&s);
	ck_assert(s.cancel_seen);
	ck_assert_uint_eq(s.cancel_id, 1); /* the first id the client picks */
}
END_TEST

START_TEST(test_cancel_late)
{
	FakeServer s = {0};
	TkvClient *c;
	TkvRequest req = { .raw_prompt = "hi" };
	TkvCallbacks cb = { NULL, on_token, NULL };
	Collected col = {0};
	TkvResult res;
	TkvError err = {0};

	cb.userdata = &col;
	server_start(&s, script_cancel_late, 1);
	c = connect_ok(&s);
	col.cancel_client = c;
	ck_assert_int_eq(tkv_generate(c, &req, &cb, &res, &err), 0);
	ck_assert_int_eq(res.finish_reason, TKV_FINISH_STOP);
	/* the UNKNOWN_REQUEST that answers the late Cancel is not taken for this reply */
	ck_assert_int_eq(tkv_session_delete(c, "any", &err), TKV_E_INTERNAL);
	ck_assert_str_eq(err.message, "sessions are not implemented yet");
	tkv_client_free(c);
	server_stop(&s);
}
END_TEST

START_TEST(test_sessions)
{
	FakeServer s = {0};
	TkvClient *c;
	TkvSessionList *l = NULL;
	TkvSessionInfo info;
	TkvError err = {0};

	server_start(&s, script_sessions, 1);
	c = connect_ok(&s);
	ck_assert_int_eq(tkv_session_list(c, &l, &err), 0);
	ck_assert_uint_eq(l->n_sessions, 2);
	ck_assert_str_eq(l->sessions[0].name, "notes");
	ck_assert_uint_eq(l->sessions[0].tokens, 1234);
	ck_assert_uint_eq(l->sessions[0].bytes_on_disk, 99999);
	ck_assert_int_eq(l->sessions[0].last_used_unix_ms, 1700000000000);
	ck_assert(l->sessions[0].in_memory);
	ck_assert_str_eq(l->sessions[1].name, "old.chat-2");
	ck_assert(!l->sessions[1].in_memory);
	tkv_session_list_free(l);
	/* bad names never reach the daemon */
	ck_assert_int_eq(tkv_session_show(c, "../etc", &info, &err), TKV_E_SESSION_BAD_NAME);
	ck_assert_int_eq(tkv_session_show(c, "ghost", &info, &err), TKV_E_SESSION_NOT_FOUND);
	ck_assert_str_eq(err.message, "no session 'ghost'");
	tkv_client_free(c);
	server_stop(&s);
	ck_assert_str_eq(s.session, "ghost");
}
END_TEST

START_TEST(test_hello_refused)
{
	FakeServer s = {0};
	TkvClient *c = NULL;
	TkvError err = {0};

	s.hello_error = PROTOCOL_E_UNSUPPORTED_VERSION;
	server_start(&s, drain_until_eof, 1);
	ck_assert_int_eq(tkv_client_connect(s.path, NULL, &c, &err), TKV_E_UNSUPPORTED_VERSION);
	ck_assert_ptr_null(c);
	ck_assert_str_eq(err.message, "protocol version 1 not in [7, 9]");
	server_stop(&s);
	ck_assert_str_eq(s.client_name, "libturbokv/" TKV_VERSION);
}
END_TEST

START_TEST(test_connect_missing)
{
	TkvClient *c = NULL;
	TkvError err = {0};
	char buf[256];

	ck_assert_int_eq(tkv_client_connect("/nonexistent/turbokv/turbokv.sock", NULL, &c, &err), TKV_E_CONNECT);
	ck_assert_ptr_null(c);
	ck_assert_int_eq(err.sys_errno, ENOENT);
	ck_assert_ptr_nonnull(strstr(err.message, "/nonexistent/turbokv/turbokv.sock"));

	/* default path resolution */
	setenv("TURBOKV_SOCKET", "/x/y.sock", 1);
	ck_assert_int_eq(tkv_socket_path_default(buf, sizeof(buf), NULL), 0);
	ck_assert_str_eq(buf, "/x/y.sock");
	unsetenv("TURBOKV_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/nonexistent-xdg", 1);
	ck_assert_int_eq(tkv_socket_path_default(buf, sizeof(buf), NULL), 0);
	ck_assert_str_eq(buf, "/run/turbokv/turbokv.sock");
	ck_assert_int_eq(tkv_socket_path_default(buf, 4, &err), TKV_E_INVALID_ARGUMENT);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* CLI tests */

static const char *cli_path(void)
{
	static char path[PATH_MAX];
	const char *env = getenv("TKV_CLI");
	char self[PATH_MAX];
	ssize_t n;

	if (env && env[0])
		return env;
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	ck_assert_int_gt(n, 0);
	self[n] = 0;
	/* <build>/tests/unit/test-client -> <build>/clients/turbokv */
	snprintf(path, sizeof(path), "%s/../../clients/turbokv", dirname(self));
	ck_assert_msg(access(path, X_OK) == 0, "turbokv CLI not found at %s (set TKV_CLI)", path);
	return path;
}

typedef struct CliRun {
	char out[4096];
	char err[4096];
	int status;        /* exit code, or 1000 + signal */
	pid_t pid;
	int out_fd, err_fd;
} CliRun;

static void read_fd(int fd, char *buf, size_t size)
{
	size_t len = 0;
	ssize_t n;
	while (len + 1 < size && (n = read(fd, buf + len, size - 1 - len)) > 0)
		len += (size_t)n;
	buf[len] = 0;
	close(fd);
}

static void cli_spawn(CliRun *run, const char *const *args)
{
	int po[2], pe[2];
	const char *argv[24];
	size_t n = 0;

	/* under a cross build's exe_wrapper (qemu-user, one word), so is the CLI */
	const char *wrapper = getenv("MESON_EXE_WRAPPER");
	if (wrapper && wrapper[0])
		argv[n++] = wrapper;
	argv[n++] = cli_path();
	for (; *args; args++) {
		ck_assert_uint_lt(n, 23);
		argv[n++] = *args;
	}
	argv[n] = NULL;
	ck_assert_int_eq(pipe2(po, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(pe, O_CLOEXEC), 0);
	run->pid = fork();
	ck_assert_int_ge(run->pid, 0);
	if (run->pid == 0) {
		int devnull = open("/dev/null", O_RDONLY);
		dup2(devnull, 0);
		dup2(po[1], 1);
		dup2(pe[1], 2);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	run->out_fd = po[0];
	run->err_fd = pe[0];
}

static void cli_wait(CliRun *run)
{
	int st;
	read_fd(run->out_fd, run->out, sizeof(run->out));
	read_fd(run->err_fd, run->err, sizeof(run->err));
	ck_assert_int_eq(waitpid(run->pid, &st, 0), run->pid);
	run->status = WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
}

static void cli_run(CliRun *run, const char *const *args)
{
	cli_spawn(run, args);
	cli_wait(run);
}

START_TEST(test_cli_ask)
{
	FakeServer s = {0};
	CliRun run = {0};

	server_start(&s, script_stream, 1);
	cli_run(&run, (const char *const[]){ "ask", "--socket", s.path, "-n", "32", "--greedy",
					    "--system", "Be brief.", "What is up?", NULL });
	server_stop(&s);
	ck_assert_msg(run.status == 0, "exit %d, stderr: %s", run.status, run.err);
	ck_assert_str_eq(run.out, ANSWER "\n");
	ck_assert_str_eq(run.err, ""); /* stderr is not a terminal: no progress line */
	ck_assert_uint_eq(s.n_messages, 2);
	ck_assert_str_eq(s.contents[0], "Be brief.");
	ck_assert_str_eq(s.contents[1], "What is up?");
	ck_assert_uint_eq(s.max_tokens, 32);
	ck_assert(s.greedy);
	ck_assert_ptr_nonnull(strstr(s.client_name, "turbokv-cli/"));
}
END_TEST

START_TEST(test_cli_ask_json_file)
{
	char dir[] = "/tmp/tkv-client-cli-XXXXXX", path[128];
	FakeServer s = {0};
	CliRun run = {0};
	FILE *f;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/doc.txt", dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("the document\n", f);
	fclose(f);

	server_start(&s, script_stream, 1);
	cli_run(&run, (const char *const[]){ "ask", "--json", "--file", path, "--socket", s.path,
					    "--seed", "7", "Summarise", NULL });
	server_stop(&s);
	unlink(path);
	rmdir(dir);
	ck_assert_msg(run.status == 0, "exit %d, stderr: %s", run.status, run.err);
	ck_assert_ptr_nonnull(strstr(run.out, "{\"text\":\"" ANSWER "\",\"finish_reason\":\"stop\""));
	ck_assert_ptr_nonnull(strstr(run.out, "\"completion_tokens\":3"));
	ck_assert_uint_eq(s.n_attachments, 1);
	ck_assert_str_eq(s.att_name[0], "doc.txt");
	ck_assert_str_eq(s.att_text[0], "the document\n");
	ck_assert(s.has_seed);
	ck_assert_uint_eq(s.seed, 7);
}
END_TEST

START_TEST(test_cli_errors)
{
	FakeServer s = {0};
	CliRun run = {0};

	/* a daemon error: exit 1, a stable message */
	server_start(&s, script_error, 1);
	cli_run(&run, (const char *const[]){ "ask", "--socket", s.path, "--session", "nope", "hi", NULL });
	/* the CLI hangs up after the error; the script's status step then fails harmlessly */
	pthread_join(s.thread, NULL);
	close(s.listen_fd);
	unlink(s.path);
	rmdir(s.dir);
	ck_assert_int_eq(run.status, 1);
	ck_assert_str_eq(run.err, "turbokv: error: SESSION_NOT_FOUND: no session named 'nope'\n");
	ck_assert_str_eq(s.session, "nope");

	/* nobody listening: exit 3 */
	cli_run(&run, (const char *const[]){ "ask", "--socket", "/nonexistent/tkv.sock", "hi", NULL });
	ck_assert_int_eq(run.status, 3);
	ck_assert_ptr_nonnull(strstr(run.err, "turbokv: error: CONNECT: "));
	cli_run(&run, (const char *const[]){ "status", "--socket", "/nonexistent/tkv.sock", NULL });
	ck_assert_int_eq(run.status, 3);

	/* usage: exit 2, nothing on stdout */
	cli_run(&run, (const char *const[]){ "ask", NULL });
	ck_assert_int_eq(run.status, 2);
	ck_assert_str_eq(run.out, "");
	cli_run(&run, (const char *const[]){ "ask", "--bogus", "q", NULL });
	ck_assert_int_eq(run.status, 2);
	cli_run(&run, (const char *const[]){ "ask", "-n", "lots", "q", NULL });
	ck_assert_int_eq(run.status, 2);
	cli_run(&run, (const char *const[]){ "frobnicate", NULL });
	ck_assert_int_eq(run.status, 2);
	cli_run(&run, (const char *const[]){ "sessions", "show", NULL });
	ck_assert_int_eq(run.status, 2);
	cli_run(&run, (const char *const[]){ "ask", "--session", "a/b", "q", NULL });
	ck_assert_int_eq(run.status, 2);
	cli_run(&run, (const char *const[]){ NULL });
	ck_assert_int_eq(run.status, 2);

	/* help: exit 0 */
	cli_run(&run, (const char *const[]){ "ask", "--help", NULL });
	ck_assert_int_eq(run.status, 0);
	ck_assert_ptr_nonnull(strstr(run.out, "Usage: turbokv ask"));
}
END_TEST

START_TEST(test_cli_sigint)
{
	FakeServer s = {0};
	CliRun run = {0};
	struct timespec ts = { 0, 10 * 1000 * 1000 };

	server_start(&s, script_cancel_waiting, 1);
	cli_spawn(&run, (const char *const[]){ "ask", "--socket", s.path, "long question", NULL });
	for (int i = 0; i < 500 && !s.generate_seen; i++)
		nanosleep(&ts, NULL);
	ck_assert(s.generate_seen);
	nanosleep(&ts, NULL);
	ck_assert_int_eq(kill(run.pid, SIGINT), 0);
	cli_wait(&run);
	server_stop(&s);
	ck_assert_msg(run.status == 130, "exit %d, stderr: %s", run.status, run.err);
	ck_assert(s.cancel_seen);
}
END_TEST

START_TEST(test_cli_sessions)
{
	FakeServer s = {0};
	CliRun run = {0};

	server_start(&s, script_sessions, 1);
	cli_run(&run, (const char *const[]){ "sessions", "--socket", s.path, NULL });
	/* the CLI disconnects after the list; the script wanted a show next */
	pthread_join(s.thread, NULL);
	close(s.listen_fd);
	unlink(s.path);
	rmdir(s.dir);
	ck_assert_msg(run.status == 0, "exit %d: %s", run.status, run.err);
	ck_assert_str_eq(run.out, "notes\t1234\t99999\t2023-11-14T22:13:20Z\tmemory\n"
				  "old.chat-2\t5\t0\t-\tdisk\n");
}
END_TEST

static Suite *client_suite(void)
{
	Suite *s = suite_create("client");
	TCase *lib = tcase_create("library");
	TCase *cli = tcase_create("cli");

	tcase_set_timeout(lib, 30);
	tcase_add_test(lib, test_hello);
	tcase_add_test(lib, test_generate_stream);
	tcase_add_test(lib, test_attachments);
	tcase_add_test(lib, test_attachment_refused_locally);
	tcase_add_test(lib, test_server_error);
	tcase_add_test(lib, test_server_closed_mid_stream);
	tcase_add_test(lib, test_cancel_in_callback);
	tcase_add_test(lib, test_cancel_from_thread);
	tcase_add_test(lib, test_cancel_late);
	tcase_add_test(lib, test_sessions);
	tcase_add_test(lib, test_hello_refused);
	tcase_add_test(lib, test_connect_missing);
	suite_add_tcase(s, lib);

	tcase_set_timeout(cli, 60);
	tcase_add_test(cli, test_cli_ask);
	tcase_add_test(cli, test_cli_ask_json_file);
	tcase_add_test(cli, test_cli_errors);
	tcase_add_test(cli, test_cli_sigint);
	tcase_add_test(cli, test_cli_sessions);
	suite_add_tcase(s, cli);
	return s;
}

int main(void)
{
	return test_run_suite(client_suite());
}
