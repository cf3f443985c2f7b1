/*
 * client.c: libturbokv, one connection to turbokvd (include/turbokv/client.h).
 *
 * Owns the client side of the conversation: connecting, Hello, turning a
 * TkvRequest into a Generate frame with its memfd attachments, reading
 * replies until the request ends, cancellation, and the translation of
 * every lower-level failure (ipc/, proto/, libc) into a TkvErrorCode with
 * a message. Framing, fd passing and memfd sealing are ipc/'s; message
 * rules are proto/protocol.h's. No global state, no logging.
 *
 * Cancellation: tkv_cancel() only stores the id in an atomic and writes to
 * an eventfd (both async-signal-safe). The thread in tkv_generate() polls
 * the socket and the eventfd together and sends the Cancel frame itself,
 * so the socket is only ever written by one thread.
 */
#include <assert.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "ipc/frame.h"
#include "ipc/memfd.h"
#include "ipc/utf8.h"
#include "proto/protocol.h"
#include "turbokv/client.h"

#define CANCEL_NONE 0
#define CANCEL_ANY UINT64_MAX
#define STALE_MAX 8
#define READ_CHUNK (64 * 1024)

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "tkv_cancel needs a lock-free 64-bit atomic");
_Static_assert((int)TKV_E_INTERNAL == (int)PROTOCOL_E_INTERNAL, "TkvErrorCode mirrors ErrorCode");
_Static_assert((int)TKV_E_TIMEOUT == (int)PROTOCOL_E_TIMEOUT, "TkvErrorCode mirrors ErrorCode");
_Static_assert((int)TKV_E_BAD_FRAME == (int)PROTOCOL_E_BAD_FRAME, "TkvErrorCode mirrors ErrorCode");
_Static_assert((int)TKV_E_SESSION_NOT_FOUND == (int)PROTOCOL_E_SESSION_NOT_FOUND, "TkvErrorCode mirrors ErrorCode");
_Static_assert((int)TKV_FINISH_STOP_STRING == (int)TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP_STRING,
	       "TkvFinishReason mirrors FinishReason");
_Static_assert(TKV_SESSION_NAME_MAX == PROTOCOL_MAX_SESSION_NAME, "session name limit");

struct TkvClient {
	int fd;                    /* the connected socket */
	int wake_fd;               /* eventfd written by tkv_cancel() */
	FrameReader *reader;
	FrameWriter *writer;
	char *socket_path;
	TkvServerInfo info;        /* strings below are owned */
	uint64_t next_id;          /* request ids the client picks, from 1 */
	_Atomic uint64_t cancel_id; /* CANCEL_NONE, CANCEL_ANY or an id */
	bool dead;                 /* the connection is unusable */
	char dead_msg[200];
	uint64_t stale[STALE_MAX]; /* ids cancelled after they finished: an UNKNOWN_REQUEST may follow */
	size_t n_stale;
};

/* ------------------------------------------------------------------------ */
/* Errors */

static const char *const code_names[] = {
	[TKV_OK] = "OK",
	[TKV_E_BAD_FRAME] = "BAD_FRAME",
	[TKV_E_BAD_MESSAGE] = "BAD_MESSAGE",
	[TKV_E_UNSUPPORTED_VERSION] = "UNSUPPORTED_VERSION",
	[TKV_E_HELLO_REQUIRED] = "HELLO_REQUIRED",
	[TKV_E_TOO_MANY_REQUESTS] = "TOO_MANY_REQUESTS",
	[TKV_E_REQUEST_ID_IN_USE] = "REQUEST_ID_IN_USE",
	[TKV_E_UNKNOWN_REQUEST] = "UNKNOWN_REQUEST",
	[TKV_E_CONTEXT_OVERFLOW] = "CONTEXT_OVERFLOW",
	[TKV_E_ATTACHMENT_NOT_MEMFD] = "ATTACHMENT_NOT_MEMFD",
	[TKV_E_ATTACHMENT_NOT_SEALED] = "ATTACHMENT_NOT_SEALED",
	[TKV_E_ATTACHMENT_TOO_LARGE] = "ATTACHMENT_TOO_LARGE",
	[TKV_E_ATTACHMENT_NOT_UTF8] = "ATTACHMENT_NOT_UTF8",
	[TKV_E_ATTACHMENT_SIZE_MISMATCH] = "ATTACHMENT_SIZE_MISMATCH",
	[TKV_E_SESSION_NOT_FOUND] = "SESSION_NOT_FOUND",
	[TKV_E_SESSION_BAD_NAME] = "SESSION_BAD_NAME",
	[TKV_E_SESSION_QUOTA] = "SESSION_QUOTA",
	[TKV_E_SESSION_CORRUPT] = "SESSION_CORRUPT",
	[TKV_E_SESSION_BUSY] = "SESSION_BUSY",
	[TKV_E_BUSY] = "BUSY",
	[TKV_E_SHUTTING_DOWN] = "SHUTTING_DOWN",
	[TKV_E_CANCELLED] = "CANCELLED",
	[TKV_E_INTERNAL] = "INTERNAL",
	[TKV_E_TIMEOUT] = "TIMEOUT",
};

static const char *const client_code_names[] = {
	[TKV_E_CONNECT - 100] = "CONNECT",
	[TKV_E_PROTOCOL - 100] = "PROTOCOL",
	[TKV_E_SERVER_CLOSED - 100] = "SERVER_CLOSED",
	[TKV_E_INVALID_ARGUMENT - 100] = "INVALID_ARGUMENT",
	[TKV_E_IO - 100] = "IO",
	[TKV_E_NO_MEMORY - 100] = "NO_MEMORY",
};

const char *tkv_error_code_name(int code)
{
	if (code >= 0 && (size_t)code < ARRAY_SIZE(code_names))
		return code_names[code];
	if (code >= 100 && (size_t)(code - 100) < ARRAY_SIZE(client_code_names))
		return client_code_names[code - 100];
	return NULL;
}

bool tkv_error_is_server(int code)
{
	return code > 0 && code < 100;
}

const char *tkv_finish_reason_name(int reason)
{
	switch (reason) {
	case TKV_FINISH_STOP: return "stop";
	case TKV_FINISH_LENGTH: return "length";
	case TKV_FINISH_CANCELLED: return "cancelled";
	case TKV_FINISH_CONTEXT_FULL: return "context_full";
	case TKV_FINISH_STOP_STRING: return "stop_string";
	default: return "unspecified";
	}
}

_printf_(4, 5)
static int fail(TkvError *err, int code, int sys_errno, const char *fmt, ...)
{
	assert(code > 0);
	if (err) {
		va_list ap;
		err->code = code;
		err->sys_errno = sys_errno;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
		if (!err->message[0])
			snprintf(err->message, sizeof(err->message), "%s", tkv_error_code_name(code));
	}
	return code;
}

/* Mark the connection unusable and fail with code. */
_printf_(4, 5)
static int client_die(TkvClient *c, TkvError *err, int code, const char *fmt, ...)
{
	char msg[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (!c->dead) {
		c->dead = true;
		snprintf(c->dead_msg, sizeof(c->dead_msg), "%s", msg);
	}
	return fail(err, code, 0, "%s", msg);
}

static int client_check_alive(TkvClient *c, TkvError *err)
{
	if (c->dead)
		return fail(err, TKV_E_SERVER_CLOSED, 0, "connection unusable after an earlier failure: %s",
			    c->dead_msg);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Connection */

int tkv_socket_path_default(char *buf, size_t size, TkvError *err)
{
	const char *env = getenv("TURBOKV_SOCKET");
	int n;

	if (env && env[0])
		n = snprintf(buf, size, "%s", env);
	else {
		const char *xdg = getenv("XDG_RUNTIME_DIR");
		n = -1;
		if (xdg && xdg[0]) {
			n = snprintf(buf, size, "%s/turbokv/turbokv.sock", xdg);
			if (n >= 0 && (size_t)n < size && access(buf, F_OK) < 0)
				n = -1;
		}
		if (n < 0)
			n = snprintf(buf, size, "/run/turbokv/turbokv.sock");
	}
	if (n < 0 || (size_t)n >= size)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "socket path too long");
	return 0;
}

static void server_info_clear(TkvServerInfo *i)
{
	free((char *)i->server_version);
	free((char *)i->model_name);
	free((char *)i->model_fingerprint);
	free((char *)i->kv_type);
	free((char *)i->device);
	memset(i, 0, sizeof(*i));
}

TkvClient *tkv_client_free(TkvClient *c)
{
	if (!c)
		return NULL;
	safe_close(c->fd);
	safe_close(c->wake_fd);
	frame_reader_free(c->reader);
	frame_writer_free(c->writer);
	free(c->socket_path);
	server_info_clear(&c->info);
	free(c);
	return NULL;
}

static inline void tkv_client_freep(TkvClient **c)
{
	tkv_client_free(*c);
}

const TkvServerInfo *tkv_client_server_info(const TkvClient *c)
{
	return &c->info;
}

const char *tkv_client_socket_path(const TkvClient *c)
{
	return c->socket_path;
}

/*
 * Encode m and send it (with n_fds borrowed fds) before returning; the
 * socket is blocking. Refuses, without sending, a message the protocol
 * would refuse (validated with the daemon's own rules).
 */
static int client_send(TkvClient *c, const Turbokv__V1__ClientMessage *m, const int *fds, size_t n_fds,
		       TkvError *err)
{
	_cleanup_(freep) uint8_t *buf = NULL;
	size_t len, cap = PROTOCOL_MAX_FRAME_BYTES;
	Error e = {0};
	int r;

	r = protocol_validate_client_message(m, n_fds, &e);
	if (r == PROTOCOL_E_SESSION_BAD_NAME || r == PROTOCOL_E_ATTACHMENT_TOO_LARGE)
		return fail(err, r, 0, "%s", e.msg);
	if (r != 0)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "invalid request: %s", e.msg);

	len = turbokv__v1__client_message__get_packed_size(m);
	if (c->info.max_frame_bytes && c->info.max_frame_bytes < cap)
		cap = c->info.max_frame_bytes;
	if (len > cap)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0,
			    "request of %zu bytes exceeds the daemon's frame limit of %zu bytes "
			    "(pass long text as an attachment)", len, cap);
	buf = malloc(len ? len : 1);
	if (!buf)
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	turbokv__v1__client_message__pack(m, buf);

	r = frame_writer_push_dup_fds(c->writer, buf, len, fds, n_fds, &e);
	if (r == -ENOMEM)
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	if (r != 0)
		return fail(err, TKV_E_IO, r < 0 ? -r : 0, "cannot queue frame: %s",
			    e.msg[0] ? e.msg : strerror(r < 0 ? -r : EINVAL));
	r = frame_writer_flush(c->writer, c->fd);
	if (r < 0)
		return client_die(c, err, TKV_E_SERVER_CLOSED, "connection to the daemon lost while sending: %s",
				  strerror(-r));
	return 0;
}

/* Drain the eventfd (non-blocking). */
static void client_drain_wake(TkvClient *c)
{
	uint64_t v;
	while (read(c->wake_fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
		;
}

/*
 * Next ServerMessage from the daemon. With watch_wake, also returns 0 with
 * *ret NULL when tkv_cancel() woke us. Connection failures mark the client
 * dead.
 */
static int client_recv(TkvClient *c, bool watch_wake, Turbokv__V1__ServerMessage **ret, TkvError *err)
{
	uint8_t buf[READ_CHUNK];
	Error e = {0};

	for (;;) {
		struct pollfd p[2] = {
			{ .fd = c->fd, .events = POLLIN },
			{ .fd = c->wake_fd, .events = POLLIN },
		};
		Frame f;
		ssize_t n;
		int r;

		r = frame_reader_pop(c->reader, &f);
		if (r == 0) {
			Turbokv__V1__ServerMessage *m =
				turbokv__v1__server_message__unpack(NULL, f.len, f.data);
			if (!m)
				return client_die(c, err, TKV_E_PROTOCOL,
						  "daemon sent a frame that is not a ServerMessage");
			if (m->msg_case == TURBOKV__V1__SERVER_MESSAGE__MSG__NOT_SET) {
				protocol_server_message_free(m);
				return client_die(c, err, TKV_E_PROTOCOL, "daemon sent an empty ServerMessage");
			}
			*ret = m;
			return 0;
		}
		if (r != -EAGAIN)
			return client_die(c, err, TKV_E_PROTOCOL, "daemon broke the framing: %s",
					  frame_error_name(r) ? frame_error_name(r) : strerror(-r));

		if (poll(p, watch_wake ? 2 : 1, -1) < 0) {
			if (errno == EINTR) {
				if (watch_wake) {
					*ret = NULL;
					return 0;
				}
				continue;
			}
			return fail(err, TKV_E_IO, errno, "poll: %s", strerror(errno));
		}
		if (watch_wake && (p[1].revents & POLLIN)) {
			client_drain_wake(c);
			*ret = NULL;
			return 0;
		}
		if (!p[0].revents)
			continue;

		n = recv(c->fd, buf, sizeof(buf), 0);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return client_die(c, err, TKV_E_SERVER_CLOSED, "connection to the daemon lost: %s",
					  strerror(errno));
		}
		if (n == 0) {
			r = frame_reader_finish(c->reader, &e);
			if (r == 0 && frame_reader_buffered(c->reader) > 0)
				continue; /* whole frames left: pop them first */
			return client_die(c, err, TKV_E_SERVER_CLOSED, "%s",
					  r == 0 ? "the daemon closed the connection"
						 : "the daemon closed the connection in the middle of a frame");
		}
		r = frame_reader_feed(c->reader, buf, (size_t)n, &e);
		if (r == -ENOMEM)
			return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
		if (r != 0)
			return client_die(c, err, TKV_E_PROTOCOL, "daemon broke the framing: %s", e.msg);
	}
}

static int copy_string(const char **dst, const char *src)
{
	*dst = strdup(src ? src : "");
	return *dst ? 0 : -ENOMEM;
}

static int client_hello(TkvClient *c, const char *client_name, TkvError *err)
{
	Turbokv__V1__ClientMessage m = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__Hello h = TURBOKV__V1__HELLO__INIT;
	_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *reply = NULL;
	const Turbokv__V1__HelloReply *hr;
	int r;

	h.protocol_version = TURBOKV_PROTOCOL_VERSION;
	h.client_name = (char *)(client_name ? client_name : "libturbokv/" TKV_VERSION);
	m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO;
	m.hello = &h;
	r = client_send(c, &m, NULL, 0, err);
	if (r != 0)
		return r;
	r = client_recv(c, false, &reply, err);
	if (r != 0)
		return r;
	if (reply->msg_case == TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR) {
		const Turbokv__V1__Error *e = reply->error;
		int code = protocol_error_code_valid(e->code) ? (int)e->code : TKV_E_PROTOCOL;
		return client_die(c, err, code, "%s", e->message[0] ? e->message : "daemon refused Hello");
	}
	if (reply->msg_case != TURBOKV__V1__SERVER_MESSAGE__MSG_HELLO_REPLY)
		return client_die(c, err, TKV_E_PROTOCOL, "daemon answered Hello with message %d",
				  (int)reply->msg_case);
	hr = reply->hello_reply;
	if (hr->protocol_version != TURBOKV_PROTOCOL_VERSION)
		return client_die(c, err, TKV_E_PROTOCOL, "daemon chose protocol version %u, we asked for %u",
				  hr->protocol_version, TURBOKV_PROTOCOL_VERSION);
	c->info.protocol_version = hr->protocol_version;
	c->info.min_protocol_version = hr->min_protocol_version;
	c->info.max_protocol_version = hr->max_protocol_version;
	c->info.context_size = hr->context_size;
	c->info.n_threads = hr->n_threads;
	c->info.max_frame_bytes = hr->max_frame_bytes;
	c->info.max_attachment_bytes = hr->max_attachment_bytes;
	c->info.max_requests_in_flight = hr->max_requests_in_flight;
	if (copy_string(&c->info.server_version, hr->server_version) < 0 ||
	    copy_string(&c->info.model_name, hr->model_name) < 0 ||
	    copy_string(&c->info.model_fingerprint, hr->model_fingerprint) < 0 ||
	    copy_string(&c->info.kv_type, hr->kv_type) < 0 ||
	    copy_string(&c->info.device, hr->device) < 0)
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	return 0;
}

int tkv_client_connect(const char *socket_path, const char *client_name, TkvClient **ret_client,
		       TkvError *err)
{
	_cleanup_(tkv_client_freep) TkvClient *c = NULL;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char path[sizeof(sa.sun_path)];
	int r;

	if (!ret_client)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "ret_client is NULL");
	if (socket_path) {
		if (!socket_path[0])
			return fail(err, TKV_E_INVALID_ARGUMENT, 0, "empty socket path");
		if (strlen(socket_path) >= sizeof(path))
			return fail(err, TKV_E_CONNECT, ENAMETOOLONG, "socket path too long: %s", socket_path);
		strcpy(path, socket_path);
	} else {
		r = tkv_socket_path_default(path, sizeof(path), err);
		if (r != 0)
			return r;
	}

	c = calloc(1, sizeof(*c));
	if (!c)
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	c->fd = -1;
	c->wake_fd = -1;
	c->next_id = 1;
	atomic_init(&c->cancel_id, CANCEL_NONE);
	c->socket_path = strdup(path);
	if (!c->socket_path || frame_reader_new(FRAME_MAX_BYTES, &c->reader) < 0 ||
	    frame_writer_new(PROTOCOL_MAX_FRAME_BYTES, &c->writer) < 0)
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake_fd < 0)
		return fail(err, TKV_E_IO, errno, "eventfd: %s", strerror(errno));

	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return fail(err, TKV_E_IO, errno, "socket: %s", strerror(errno));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(c->fd, (const struct sockaddr *)&sa, sizeof(sa)) < 0)
		return fail(err, TKV_E_CONNECT, errno, "cannot connect to the daemon at %s: %s", path,
			    strerror(errno));

	r = client_hello(c, client_name, err);
	if (r != 0)
		return r;
	*ret_client = TAKE_PTR(c);
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Replies */

static uint64_t server_message_request_id(const Turbokv__V1__ServerMessage *m)
{
	switch (m->msg_case) {
	case TURBOKV__V1__SERVER_MESSAGE__MSG_PROGRESS: return m->progress->request_id;
	case TURBOKV__V1__SERVER_MESSAGE__MSG_TOKEN: return m->token->request_id;
	case TURBOKV__V1__SERVER_MESSAGE__MSG_DONE: return m->done->request_id;
	case TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR: return m->error->request_id;
	case TURBOKV__V1__SERVER_MESSAGE__MSG_STATUS_REPLY: return m->status_reply->request_id;
	case TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_LIST_REPLY: return m->session_list_reply->request_id;
	case TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_INFO: return m->session_info->request_id;
	case TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_DELETED: return m->session_deleted->request_id;
	default: return 0;
	}
}

static void client_stale_add(TkvClient *c, uint64_t id)
{
	if (c->n_stale == STALE_MAX) {
		memmove(c->stale, c->stale + 1, (STALE_MAX - 1) * sizeof(c->stale[0]));
		c->n_stale--;
	}
	c->stale[c->n_stale++] = id;
}

/* Whether m is the UNKNOWN_REQUEST answer to a Cancel that came too late (drop it). */
static bool client_stale_take(TkvClient *c, const Turbokv__V1__ServerMessage *m)
{
	if (m->msg_case != TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR ||
	    m->error->code != TURBOKV__V1__ERROR_CODE__ERROR_CODE_UNKNOWN_REQUEST)
		return false;
	for (size_t i = 0; i < c->n_stale; i++)
		if (c->stale[i] == m->error->request_id) {
			memmove(c->stale + i, c->stale + i + 1, (c->n_stale - i - 1) * sizeof(c->stale[0]));
			c->n_stale--;
			return true;
		}
	return false;
}

/*
 * Turn an Error from the daemon into our return value. One for the whole
 * connection (request_id 0) kills the client.
 */
static int client_server_error(TkvClient *c, const Turbokv__V1__Error *e, TkvError *err)
{
	int code = protocol_error_code_valid(e->code) ? (int)e->code : TKV_E_PROTOCOL;
	const char *msg = e->message[0] ? e->message : "(no message)";

	if (code == TKV_E_PROTOCOL)
		return client_die(c, err, code, "daemon sent an unknown error code %d: %s", (int)e->code, msg);
	if (e->request_id == 0)
		return client_die(c, err, code, "%s", msg);
	return fail(err, code, 0, "%s", msg);
}

/*
 * Read until the reply to request id: 0 and *ret (case want), or the
 * error the daemon sent for it.
 */
static int client_await_reply(TkvClient *c, uint64_t id, Turbokv__V1__ServerMessage__MsgCase want,
			      Turbokv__V1__ServerMessage **ret, TkvError *err)
{
	for (;;) {
		_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *m = NULL;
		int r = client_recv(c, false, &m, err);
		if (r != 0)
			return r;
		if (client_stale_take(c, m))
			continue;
		if (m->msg_case == TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR &&
		    (m->error->request_id == id || m->error->request_id == 0))
			return client_server_error(c, m->error, err);
		if (server_message_request_id(m) != id)
			return client_die(c, err, TKV_E_PROTOCOL, "daemon replied to unknown request %llu",
					  (unsigned long long)server_message_request_id(m));
		if (m->msg_case != want)
			return client_die(c, err, TKV_E_PROTOCOL,
					  "daemon answered request %llu with message %d, expected %d",
					  (unsigned long long)id, (int)m->msg_case, (int)want);
		*ret = TAKE_PTR(m);
		return 0;
	}
}

/* ------------------------------------------------------------------------ */
/* Generate */

/* Read all of fd (a file or a pipe), at most max bytes. */
static int read_all(int fd, size_t max, uint8_t **ret, size_t *ret_len, bool *ret_too_large)
{
	_cleanup_(freep) uint8_t *buf = NULL;
	size_t len = 0, cap = 0;

	*ret_too_large = false;
	for (;;) {
		ssize_t n;
		if (len == cap) {
			size_t ncap = cap ? cap * 2 : 64 * 1024;
			uint8_t *nb;
			if (cap > max) {
				*ret_too_large = true;
				return 0;
			}
			nb = realloc(buf, ncap);
			if (!nb)
				return -ENOMEM;
			buf = nb;
			cap = ncap;
		}
		n = read(fd, buf + len, cap - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > max) {
			*ret_too_large = true;
			return 0;
		}
	}
	*ret = TAKE_PTR(buf);
	*ret_len = len;
	return 0;
}

static const char *path_basename(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/* Make the memfd of attachment a (owned in *ret_fd unless MEMFD) and its wire size and name. */
static int attachment_open(const TkvAttachment *a, uint64_t cap, int *ret_fd, bool *ret_owned,
			   uint64_t *ret_size, const char **ret_name, TkvError *err)
{
	_cleanup_(freep) uint8_t *file_data = NULL;
	const void *data;
	size_t size = 0, bad = 0;
	const char *what;
	int r;

	switch (a->kind) {
	case TKV_ATTACH_MEMFD: {
		struct stat st;
		if (a->memfd < 0 || fstat(a->memfd, &st) < 0)
			return fail(err, TKV_E_INVALID_ARGUMENT, errno, "attachment memfd %d is not usable", a->memfd);
		*ret_fd = a->memfd;
		*ret_owned = false;
		*ret_size = (uint64_t)st.st_size;
		*ret_name = a->name ? a->name : "";
		return 0;
	}
	case TKV_ATTACH_FILE: {
		_cleanup_(closep) int fd = -1;
		bool too_large;
		if (!a->path)
			return fail(err, TKV_E_INVALID_ARGUMENT, 0, "file attachment without a path");
		fd = open(a->path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return fail(err, TKV_E_IO, errno, "cannot open %s: %s", a->path, strerror(errno));
		r = read_all(fd, (size_t)MIN(cap, (uint64_t)SIZE_MAX - 1), &file_data, &size, &too_large);
		if (r < 0)
			return fail(err, r == -ENOMEM ? TKV_E_NO_MEMORY : TKV_E_IO, -r, "cannot read %s: %s",
				    a->path, strerror(-r));
		if (too_large)
			return fail(err, TKV_E_ATTACHMENT_TOO_LARGE, 0,
				    "%s: larger than the daemon's attachment limit of %llu bytes", a->path,
				    (unsigned long long)cap);
		data = file_data;
		what = a->path;
		*ret_name = a->name ? a->name : path_basename(a->path);
		break;
	}
	case TKV_ATTACH_BUFFER:
		if (!a->data && a->size)
			return fail(err, TKV_E_INVALID_ARGUMENT, 0, "buffer attachment without data");
		data = a->data ? a->data : "";
		size = a->size;
		what = a->name && a->name[0] ? a->name : "attachment";
		if (size > cap)
			return fail(err, TKV_E_ATTACHMENT_TOO_LARGE, 0,
				    "%s: %zu bytes, larger than the daemon's attachment limit of %llu bytes",
				    what, size, (unsigned long long)cap);
		*ret_name = a->name ? a->name : "";
		break;
	default:
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "unknown attachment kind %d", (int)a->kind);
	}

	if (!utf8_validate(data, size, &bad) || memchr(data, 0, size))
		return fail(err, TKV_E_ATTACHMENT_NOT_UTF8, 0, "%s: not UTF-8 text (bad byte near offset %zu)",
			    what, memchr(data, 0, size) ? (size_t)((const uint8_t *)memchr(data, 0, size) -
								   (const uint8_t *)data) : bad);
	r = memfd_new_sealed("turbokv-attachment", data, size, ret_fd);
	if (r < 0)
		return fail(err, TKV_E_IO, -r, "cannot create memfd for %s: %s", what, strerror(-r));
	*ret_owned = true;
	*ret_size = size;
	return 0;
}

/* Whether a cancel is pending for request id. */
static bool client_cancel_wanted(TkvClient *c, uint64_t id)
{
	uint64_t v = atomic_load(&c->cancel_id);
	return v == CANCEL_ANY || v == id;
}

static int client_send_cancel(TkvClient *c, uint64_t id, TkvError *err)
{
	Turbokv__V1__ClientMessage m = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__Cancel cm = TURBOKV__V1__CANCEL__INIT;
	uint64_t v = id;

	/* consume the request (unless a different id was asked for meanwhile) */
	if (!atomic_compare_exchange_strong(&c->cancel_id, &v, CANCEL_NONE)) {
		v = CANCEL_ANY;
		atomic_compare_exchange_strong(&c->cancel_id, &v, CANCEL_NONE);
	}
	cm.request_id = id;
	m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL;
	m.cancel = &cm;
	return client_send(c, &m, NULL, 0, err);
}

/* Stream the replies to Generate id until it ends. */
static int client_stream(TkvClient *c, uint64_t id, const TkvCallbacks *cb, TkvResult *ret_result,
			 TkvError *err)
{
	bool cancel_sent = false;

	for (;;) {
		_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *m = NULL;
		int r;

		if (!cancel_sent && client_cancel_wanted(c, id)) {
			r = client_send_cancel(c, id, err);
			if (r != 0)
				return r;
			cancel_sent = true;
		}
		r = client_recv(c, !cancel_sent, &m, err);
		if (r != 0)
			return r;
		if (!m || client_stale_take(c, m))
			continue;

		if (m->msg_case == TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR &&
		    (m->error->request_id == id || m->error->request_id == 0)) {
			if (cancel_sent && m->error->code != TURBOKV__V1__ERROR_CODE__ERROR_CODE_CANCELLED)
				client_stale_add(c, id);
			return client_server_error(c, m->error, err);
		}
		if (server_message_request_id(m) != id)
			return client_die(c, err, TKV_E_PROTOCOL, "daemon replied to unknown request %llu",
					  (unsigned long long)server_message_request_id(m));

		switch (m->msg_case) {
		case TURBOKV__V1__SERVER_MESSAGE__MSG_PROGRESS:
			if (cb && cb->on_progress)
				cb->on_progress(id, m->progress->prefilled_tokens, m->progress->total_tokens,
						cb->userdata);
			break;
		case TURBOKV__V1__SERVER_MESSAGE__MSG_TOKEN:
			if (cb && cb->on_token)
				cb->on_token(id, m->token->text.data ? (const char *)m->token->text.data : "",
					     m->token->text.len, m->token->token_id, cb->userdata);
			break;
		case TURBOKV__V1__SERVER_MESSAGE__MSG_DONE: {
			const Turbokv__V1__Done *d = m->done;
			if (cancel_sent && d->finish_reason != TURBOKV__V1__FINISH_REASON__FINISH_REASON_CANCELLED)
				client_stale_add(c, id);
			if (ret_result)
				*ret_result = (TkvResult){
					.request_id = id,
					.finish_reason = (TkvFinishReason)d->finish_reason,
					.prompt_tokens = d->prompt_tokens,
					.cached_tokens = d->cached_tokens,
					.completion_tokens = d->completion_tokens,
					.dropped_tokens = d->dropped_tokens,
					.prefill_ms = d->prefill_ms,
					.decode_ms = d->decode_ms,
					.ttft_ms = d->ttft_ms,
				};
			return 0;
		}
		default:
			return client_die(c, err, TKV_E_PROTOCOL, "daemon sent message %d during a Generate",
					  (int)m->msg_case);
		}
	}
}

typedef struct GenerateMsg {
	Turbokv__V1__ClientMessage m;
	Turbokv__V1__Generate g;
	Turbokv__V1__Chat chat;
	Turbokv__V1__ChatMessage *msgs;   /* (n_messages,) */
	Turbokv__V1__ChatMessage **msgp;  /* (n_messages,) */
	Turbokv__V1__Attachment atts[PROTOCOL_MAX_ATTACHMENTS];
	Turbokv__V1__Attachment *attp[PROTOCOL_MAX_ATTACHMENTS];
	int fds[PROTOCOL_MAX_ATTACHMENTS];
	bool owned[PROTOCOL_MAX_ATTACHMENTS];
	size_t n_fds;
	ProtobufCBinaryData *stop;        /* (n_stop,) */
	Turbokv__V1__Sampling sampling;
} GenerateMsg;

static void generate_msg_done(GenerateMsg *gm)
{
	for (size_t i = 0; i < gm->n_fds; i++)
		if (gm->owned[i])
			safe_close(gm->fds[i]);
	free(gm->msgs);
	free(gm->msgp);
	free(gm->stop);
}

static void sampling_to_wire(const TkvSampling *s, Turbokv__V1__Sampling *w)
{
	*w = (Turbokv__V1__Sampling)TURBOKV__V1__SAMPLING__INIT;
	w->greedy = s->greedy;
	if (s->set & TKV_SAMPLING_TEMPERATURE) {
		w->opt_temperature_case = TURBOKV__V1__SAMPLING__OPT_TEMPERATURE_TEMPERATURE;
		w->temperature = s->temperature;
	}
	if (s->set & TKV_SAMPLING_TOP_K) {
		w->opt_top_k_case = TURBOKV__V1__SAMPLING__OPT_TOP_K_TOP_K;
		w->top_k = s->top_k;
	}
	if (s->set & TKV_SAMPLING_TOP_P) {
		w->opt_top_p_case = TURBOKV__V1__SAMPLING__OPT_TOP_P_TOP_P;
		w->top_p = s->top_p;
	}
	if (s->set & TKV_SAMPLING_MIN_P) {
		w->opt_min_p_case = TURBOKV__V1__SAMPLING__OPT_MIN_P_MIN_P;
		w->min_p = s->min_p;
	}
	if (s->set & TKV_SAMPLING_REPEAT_PENALTY) {
		w->opt_repeat_penalty_case = TURBOKV__V1__SAMPLING__OPT_REPEAT_PENALTY_REPEAT_PENALTY;
		w->repeat_penalty = s->repeat_penalty;
	}
	if (s->set & TKV_SAMPLING_REPEAT_LAST_N) {
		w->opt_repeat_last_n_case = TURBOKV__V1__SAMPLING__OPT_REPEAT_LAST_N_REPEAT_LAST_N;
		w->repeat_last_n = s->repeat_last_n;
	}
	if (s->set & TKV_SAMPLING_SEED) {
		w->opt_seed_case = TURBOKV__V1__SAMPLING__OPT_SEED_SEED;
		w->seed = s->seed;
	}
}

/* Fill gm from req (borrowing req's strings); opens the attachments' memfds. */
static int generate_msg_build(TkvClient *c, const TkvRequest *req, uint64_t id, GenerateMsg *gm,
			      TkvError *err)
{
	uint64_t cap = c->info.max_attachment_bytes ? MIN(c->info.max_attachment_bytes,
							  PROTOCOL_MAX_ATTACHMENT_BYTES)
						    : PROTOCOL_MAX_ATTACHMENT_BYTES;
	Turbokv__V1__Generate *g = &gm->g;
	int r;

	gm->m = (Turbokv__V1__ClientMessage)TURBOKV__V1__CLIENT_MESSAGE__INIT;
	*g = (Turbokv__V1__Generate)TURBOKV__V1__GENERATE__INIT;
	gm->m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE;
	gm->m.generate = g;
	g->request_id = id;
	g->max_tokens = req->max_tokens;
	if ((unsigned)req->context_policy > TKV_CONTEXT_ERROR_SET)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "context_policy: %d is not a policy", (int)req->context_policy);
	g->context_policy = req->context_policy == TKV_CONTEXT_ERROR_SET
			    ? TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_ERROR
			    : (Turbokv__V1__ContextPolicy)req->context_policy;
	g->context_policy_set = req->context_policy != TKV_CONTEXT_ERROR;
	g->session = (char *)(req->session ? req->session : "");

	if (req->n_messages > 0) {
		if (!req->messages || req->n_messages > PROTOCOL_MAX_CHAT_MESSAGES)
			return fail(err, TKV_E_INVALID_ARGUMENT, 0, "messages: missing or more than %u",
				    PROTOCOL_MAX_CHAT_MESSAGES);
		gm->msgs = calloc(req->n_messages, sizeof(*gm->msgs));
		gm->msgp = calloc(req->n_messages, sizeof(*gm->msgp));
		if (!gm->msgs || !gm->msgp)
			return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
		for (size_t i = 0; i < req->n_messages; i++) {
			const char *s = req->messages[i].content ? req->messages[i].content : "";
			gm->msgs[i] = (Turbokv__V1__ChatMessage)TURBOKV__V1__CHAT_MESSAGE__INIT;
			gm->msgs[i].role = (Turbokv__V1__Role)req->messages[i].role;
			gm->msgs[i].content.data = (uint8_t *)s;
			gm->msgs[i].content.len = strlen(s);
			gm->msgp[i] = &gm->msgs[i];
		}
		gm->chat = (Turbokv__V1__Chat)TURBOKV__V1__CHAT__INIT;
		gm->chat.n_messages = req->n_messages;
		gm->chat.messages = gm->msgp;
		g->input_case = TURBOKV__V1__GENERATE__INPUT_CHAT;
		g->chat = &gm->chat;
	} else {
		const char *s = req->raw_prompt ? req->raw_prompt : "";
		g->input_case = TURBOKV__V1__GENERATE__INPUT_RAW_PROMPT;
		g->raw_prompt.data = (uint8_t *)s;
		g->raw_prompt.len = strlen(s);
	}

	if (req->n_stop > 0) {
		if (!req->stop || req->n_stop > PROTOCOL_MAX_STOP_STRINGS)
			return fail(err, TKV_E_INVALID_ARGUMENT, 0, "stop: missing or more than %u strings",
				    PROTOCOL_MAX_STOP_STRINGS);
		gm->stop = calloc(req->n_stop, sizeof(*gm->stop));
		if (!gm->stop)
			return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
		for (size_t i = 0; i < req->n_stop; i++) {
			const char *s = req->stop[i] ? req->stop[i] : "";
			gm->stop[i].data = (uint8_t *)s;
			gm->stop[i].len = strlen(s);
		}
		g->n_stop = req->n_stop;
		g->stop = gm->stop;
	}

	if (req->sampling) {
		sampling_to_wire(req->sampling, &gm->sampling);
		g->sampling = &gm->sampling;
	}

	if (req->n_attachments > PROTOCOL_MAX_ATTACHMENTS)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "more than %u attachments", PROTOCOL_MAX_ATTACHMENTS);
	if (req->n_attachments > 0 && !req->attachments)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "attachments is NULL");
	for (size_t i = 0; i < req->n_attachments; i++) {
		const TkvAttachment *a = &req->attachments[i];
		Turbokv__V1__Attachment *w = &gm->atts[i];
		const char *name = "";

		*w = (Turbokv__V1__Attachment)TURBOKV__V1__ATTACHMENT__INIT;
		r = attachment_open(a, cap, &gm->fds[i], &gm->owned[i], &w->size, &name, err);
		if (r != 0)
			return r;
		gm->n_fds = i + 1;
		w->name = (char *)name;
		w->mime = (char *)(a->mime ? a->mime : "");
		w->fd_index = (uint32_t)i;
		gm->attp[i] = w;
	}
	g->n_attachments = req->n_attachments;
	g->attachments = req->n_attachments ? gm->attp : NULL;
	return 0;
}

int tkv_generate(TkvClient *c, const TkvRequest *req, const TkvCallbacks *cb, TkvResult *ret_result,
		 TkvError *err)
{
	GenerateMsg gm = {0};
	uint64_t id, v;
	int r;

	if (!c || !req)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "client or request is NULL");
	r = client_check_alive(c, err);
	if (r != 0)
		return r;
	id = req->request_id ? req->request_id : c->next_id++;
	if (id == CANCEL_ANY)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "request_id %llu is reserved",
			    (unsigned long long)id);

	r = generate_msg_build(c, req, id, &gm, err);
	if (r == 0)
		r = client_send(c, &gm.m, gm.fds, gm.n_fds, err);
	generate_msg_done(&gm);
	if (r == 0)
		r = client_stream(c, id, cb, ret_result, err);

	/* a cancel of "the current one" ends with it */
	v = CANCEL_ANY;
	atomic_compare_exchange_strong(&c->cancel_id, &v, CANCEL_NONE);
	return r;
}

int tkv_cancel(TkvClient *c, uint64_t request_id)
{
	uint64_t one = 1;
	ssize_t n;

	if (!c)
		return 0;
	atomic_store(&c->cancel_id, request_id ? request_id : CANCEL_ANY);
	n = write(c->wake_fd, &one, sizeof(one)); /* EAGAIN: already awake */
	(void)n;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Status and sessions */

/* Send a simple request m (with the id set by the caller) and await its reply. */
static int client_call(TkvClient *c, Turbokv__V1__ClientMessage *m, uint64_t id,
		       Turbokv__V1__ServerMessage__MsgCase want, Turbokv__V1__ServerMessage **ret,
		       TkvError *err)
{
	int r = client_check_alive(c, err);
	if (r != 0)
		return r;
	r = client_send(c, m, NULL, 0, err);
	if (r != 0)
		return r;
	return client_await_reply(c, id, want, ret, err);
}

TkvStatus *tkv_status_free(TkvStatus *s)
{
	if (!s)
		return NULL;
	free(s->server_version);
	free(s->model_name);
	free(s->model_fingerprint);
	free(s->kv_type);
	free(s->device);
	free(s);
	return NULL;
}

static inline void tkv_status_freep(TkvStatus **s)
{
	tkv_status_free(*s);
}

int tkv_status(TkvClient *c, TkvStatus **ret_status, TkvError *err)
{
	Turbokv__V1__ClientMessage m = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__StatusRequest sr = TURBOKV__V1__STATUS_REQUEST__INIT;
	_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *reply = NULL;
	_cleanup_(tkv_status_freep) TkvStatus *s = NULL;
	const Turbokv__V1__StatusReply *x;
	int r;

	if (!c || !ret_status)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "client or ret_status is NULL");
	sr.request_id = c->next_id++;
	m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_STATUS;
	m.status = &sr;
	r = client_call(c, &m, sr.request_id, TURBOKV__V1__SERVER_MESSAGE__MSG_STATUS_REPLY, &reply, err);
	if (r != 0)
		return r;
	x = reply->status_reply;
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	s->server_version = strdup(x->server_version);
	s->model_name = strdup(x->model_name);
	s->model_fingerprint = strdup(x->model_fingerprint);
	s->kv_type = strdup(x->kv_type);
	s->device = strdup(x->device);
	if (!s->server_version || !s->model_name || !s->model_fingerprint || !s->kv_type || !s->device)
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	s->context_size = x->context_size;
	s->n_threads = x->n_threads;
	s->uptime_ms = x->uptime_ms;
	s->connections = x->connections;
	s->requests_active = x->requests_active;
	s->requests_queued = x->requests_queued;
	s->sessions_in_memory = x->sessions_in_memory;
	s->session_memory_bytes = x->session_memory_bytes;
	s->session_memory_budget_bytes = x->session_memory_budget_bytes;
	s->kv_bits_per_value = x->kv_bits_per_value;
	s->tokens_generated = x->tokens_generated;
	*ret_status = TAKE_PTR(s);
	return 0;
}

bool tkv_session_name_valid(const char *name)
{
	return protocol_session_name_valid(name);
}

static int session_info_from_wire(TkvClient *c, const Turbokv__V1__SessionInfo *w, TkvSessionInfo *ret,
				  TkvError *err)
{
	if (!protocol_session_name_valid(w->name))
		return client_die(c, err, TKV_E_PROTOCOL, "daemon sent an invalid session name");
	memset(ret, 0, sizeof(*ret));
	snprintf(ret->name, sizeof(ret->name), "%s", w->name);
	ret->tokens = w->tokens;
	ret->bytes_on_disk = w->bytes_on_disk;
	ret->last_used_unix_ms = w->last_used_unix_ms;
	ret->in_memory = w->in_memory;
	return 0;
}

TkvSessionList *tkv_session_list_free(TkvSessionList *l)
{
	if (!l)
		return NULL;
	free(l->sessions);
	free(l);
	return NULL;
}

static inline void tkv_session_list_freep(TkvSessionList **l)
{
	tkv_session_list_free(*l);
}

int tkv_session_list(TkvClient *c, TkvSessionList **ret_list, TkvError *err)
{
	Turbokv__V1__ClientMessage m = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__SessionList sl = TURBOKV__V1__SESSION_LIST__INIT;
	_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *reply = NULL;
	_cleanup_(tkv_session_list_freep) TkvSessionList *l = NULL;
	const Turbokv__V1__SessionListReply *x;
	int r;

	if (!c || !ret_list)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "client or ret_list is NULL");
	sl.request_id = c->next_id++;
	m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_LIST;
	m.session_list = &sl;
	r = client_call(c, &m, sl.request_id, TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_LIST_REPLY, &reply, err);
	if (r != 0)
		return r;
	x = reply->session_list_reply;
	l = calloc(1, sizeof(*l));
	if (!l || !(l->sessions = calloc_array(x->n_sessions, sizeof(*l->sessions))))
		return fail(err, TKV_E_NO_MEMORY, ENOMEM, "out of memory");
	for (size_t i = 0; i < x->n_sessions; i++) {
		r = session_info_from_wire(c, x->sessions[i], &l->sessions[i], err);
		if (r != 0)
			return r;
	}
	l->n_sessions = x->n_sessions;
	*ret_list = TAKE_PTR(l);
	return 0;
}

int tkv_session_show(TkvClient *c, const char *name, TkvSessionInfo *ret_info, TkvError *err)
{
	Turbokv__V1__ClientMessage m = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__SessionShow ss = TURBOKV__V1__SESSION_SHOW__INIT;
	_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *reply = NULL;
	int r;

	if (!c || !ret_info)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "client or ret_info is NULL");
	if (!protocol_session_name_valid(name))
		return fail(err, TKV_E_SESSION_BAD_NAME, 0, "invalid session name \"%s\"", name ? name : "");
	ss.request_id = c->next_id++;
	ss.name = (char *)name;
	m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SHOW;
	m.session_show = &ss;
	r = client_call(c, &m, ss.request_id, TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_INFO, &reply, err);
	if (r != 0)
		return r;
	return session_info_from_wire(c, reply->session_info, ret_info, err);
}

int tkv_session_save(TkvClient *c, const char *name, TkvSessionInfo *ret_info, TkvError *err)
{
	Turbokv__V1__ClientMessage m = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__SessionSave sv = TURBOKV__V1__SESSION_SAVE__INIT;
	_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *reply = NULL;
	int r;

	if (!c || !ret_info)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "client or ret_info is NULL");
	if (!protocol_session_name_valid(name))
		return fail(err, TKV_E_SESSION_BAD_NAME, 0, "invalid session name \"%s\"", name ? name : "");
	sv.request_id = c->next_id++;
	sv.name = (char *)name;
	m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SAVE;
	m.session_save = &sv;
	r = client_call(c, &m, sv.request_id, TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_INFO, &reply, err);
	if (r != 0)
		return r;
	return session_info_from_wire(c, reply->session_info, ret_info, err);
}

int tkv_session_delete(TkvClient *c, const char *name, TkvError *err)
{
	Turbokv__V1__ClientMessage m = TURBOKV__V1__CLIENT_MESSAGE__INIT;
	Turbokv__V1__SessionDelete sd = TURBOKV__V1__SESSION_DELETE__INIT;
	_cleanup_(protocol_server_message_freep) Turbokv__V1__ServerMessage *reply = NULL;

	if (!c)
		return fail(err, TKV_E_INVALID_ARGUMENT, 0, "client is NULL");
	if (!protocol_session_name_valid(name))
		return fail(err, TKV_E_SESSION_BAD_NAME, 0, "invalid session name \"%s\"", name ? name : "");
	sd.request_id = c->next_id++;
	sd.name = (char *)name;
	m.msg_case = TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_DELETE;
	m.session_delete = &sd;
	return client_call(c, &m, sd.request_id, TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_DELETED, &reply, err);
}
