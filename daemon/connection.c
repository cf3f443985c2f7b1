/*
 * connection.c: one client: bytes and descriptors in, frames decoded and
 * validated, requests dispatched, replies queued and written (see
 * connection.h).
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "daemon/connection.h"
#include "daemon/log.h"
#include "daemon/request.h"
#include "daemon/scheduler.h"
#include "daemon/sessions.h"
#include "ipc/fdpass.h"
#include "ipc/frame.h"
#include "ipc/memfd.h"

#define CONNECTION_READ_BYTES (64u * 1024)
#define CONNECTION_READS_PER_EVENT 4 /* then let others have the loop */
#define CONNECTION_SMALL_REPLY_BYTES 1024u /* replies up to this size are packed on the stack */

/* More replies wait for the client than --client-buffer allows: pause it (connection.h). */
static bool connection_behind(const Connection *c)
{
	return frame_writer_pending(c->writer) > c->manager->config->client_buffer;
}

static void connection_update_events(Connection *c)
{
	uint32_t ev = 0;
	if (c->dead || !c->io)
		return;
	if (!c->closing && !c->parked && !connection_behind(c))
		ev |= EPOLLIN;
	if (frame_writer_pending(c->writer) > 0)
		ev |= EPOLLOUT;
	(void)sd_event_source_set_io_events(c->io, ev);
}

static void connection_kill(Connection *c)
{
	if (c->dead)
		return;
	c->dead = true;
	c->manager->n_dead++;
	if (c->io)
		(void)sd_event_source_set_enabled(c->io, SD_EVENT_OFF);
}

/* Write what the socket takes; a drained closing connection is done. */
static void connection_flush(Connection *c)
{
	if (c->dead)
		return;
	bool was_blocked = connection_behind(c);
	int r = frame_writer_flush(c->writer, c->fd);
	if (r < 0 && r != -EAGAIN) {
		log_debug("client %llu: write failed: %s", (unsigned long long)c->id, strerror(-r));
		connection_kill(c);
		return;
	}
	if (r == 0 && c->closing) {
		connection_kill(c);
		return;
	}
	connection_update_events(c);
	if (was_blocked && !connection_behind(c))
		scheduler_wake(c->manager->scheduler);
}

void connection_send(Connection *c, const Turbokv__V1__ServerMessage *msg)
{
	/* Token messages (one per generated token) fit the stack: no malloc per token. */
	uint8_t small[CONNECTION_SMALL_REPLY_BYTES];
	_cleanup_(freep) uint8_t *big = NULL;
	uint8_t *buf = small;
	size_t len;
	Error err = { 0 };

	if (c->dead)
		return;
	len = turbokv__v1__server_message__get_packed_size(msg);
	if (len > sizeof(small) && !(buf = big = malloc(len))) {
		log_error("client %llu: out of memory for a reply; dropping the client", (unsigned long long)c->id);
		connection_kill(c);
		return;
	}
	turbokv__v1__server_message__pack(msg, buf);
	if (frame_writer_push(c->writer, buf, len, &err) != 0) {
		log_error("client %llu: cannot queue a reply: %s", (unsigned long long)c->id, err.msg);
		connection_kill(c);
		return;
	}
	connection_flush(c);
}

void connection_send_error(Connection *c, uint64_t request_id, int code, const char *fmt, ...)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Error e = TURBOKV__V1__ERROR__INIT;
	char text[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	e.request_id = request_id;
	e.code = (Turbokv__V1__ErrorCode)code;
	e.message = text;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR;
	msg.error = &e;
	connection_send(c, &msg);
	if (request_id == 0) {
		/* Connection-level: nothing more is read; close once this is written. */
		c->closing_ns = now_ns();
		log_info_ratelimited("client %llu (uid %u): %s: %s; closing", (unsigned long long)c->id,
				     (unsigned)c->cred.uid, protocol_error_code_name(code), text);
		c->closing = true;
		connection_flush(c);
	}
}

bool connection_writable(const Connection *c)
{
	return !c->dead && !c->closing && !connection_behind(c);
}

static Request *connection_find(Connection *c, uint64_t id, size_t *ret_index)
{
	for (size_t i = 0; i < c->n_requests; i++)
		if (c->requests[i]->id == id) {
			if (ret_index)
				*ret_index = i;
			return c->requests[i];
		}
	return NULL;
}

void connection_request_done(Connection *c, Request *r)
{
	size_t i;
	if (!connection_find(c, r->id, &i))
		return;
	c->active_ns = now_ns(); /* idle from the end of its last request */
	memmove(c->requests + i, c->requests + i + 1, (c->n_requests - i - 1) * sizeof(Request *));
	c->n_requests--;
	if (!scheduler_remove(c->manager->scheduler, r))
		request_free(r);
}

static void connection_send_hello_reply(Connection *c, uint32_t version)
{
	Manager *m = c->manager;
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__HelloReply h = TURBOKV__V1__HELLO_REPLY__INIT;

	h.protocol_version = version;
	h.min_protocol_version = TURBOKV_PROTOCOL_MIN_VERSION;
	h.max_protocol_version = TURBOKV_PROTOCOL_VERSION;
	h.server_version = (char *)PACKAGE_VERSION;
	h.model_name = m->model_name;
	h.model_fingerprint = m->fingerprint;
	h.kv_type = (char *)m->kv_spec; /* protobuf-c strings are not const; only read */
	h.context_size = (uint32_t)m->n_ctx;
	h.n_threads = (uint32_t)m->config->threads;
	h.device = (char *)m->device_name;
	h.max_frame_bytes = PROTOCOL_MAX_FRAME_BYTES;
	h.max_attachment_bytes = PROTOCOL_MAX_ATTACHMENT_BYTES;
	h.max_requests_in_flight = MANAGER_MAX_REQUESTS_PER_CLIENT;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_HELLO_REPLY;
	msg.hello_reply = &h;
	connection_send(c, &msg);
}

static void connection_send_status(Connection *c, uint64_t id)
{
	Manager *m = c->manager;
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__StatusReply s = TURBOKV__V1__STATUS_REPLY__INIT;

	s.request_id = id;
	s.server_version = (char *)PACKAGE_VERSION;
	s.model_name = m->model_name;
	s.model_fingerprint = m->fingerprint;
	s.kv_type = (char *)m->kv_spec; /* as above */
	s.device = (char *)m->device_name;
	s.context_size = (uint32_t)m->n_ctx;
	s.n_threads = (uint32_t)m->config->threads;
	s.uptime_ms = manager_uptime_ms(m);
	s.connections = m->n_connections;
	s.requests_active = scheduler_n_active(m->scheduler);
	s.requests_queued = scheduler_n_queued(m->scheduler);
	s.session_memory_budget_bytes = m->config->session_memory;
	s.sessions_in_memory = sessions_n_in_memory(m->sessions);
	s.session_memory_bytes = sessions_memory_bytes(m->sessions);
	s.kv_bits_per_value = m->kv_bits_per_value;
	s.tokens_generated = m->tokens_generated;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_STATUS_REPLY;
	msg.status_reply = &s;
	connection_send(c, &msg);
}

/*
 * A Generate: a new Request for the scheduler, or an Error. Returns true
 * when it must wait for its session to load (fds not consumed: park it).
 */
static bool connection_generate(Connection *c, const Turbokv__V1__Generate *g, int *fds, size_t n_fds,
				bool loaded)
{
	Manager *m = c->manager;
	Request *r = NULL;
	Error err = { 0 };
	int k;

	if (!loaded && !m->stopping && g->session && g->session[0] && !connection_find(c, g->request_id, NULL) &&
	    c->n_requests < MANAGER_MAX_REQUESTS_PER_CLIENT) {
		k = sessions_prepare(m->sessions, c->cred.uid, g->session, c->id, &err);
		if (k == SESSIONS_LOADING)
			return true;
		if (k != 0) {
			for (size_t i = 0; i < n_fds; i++)
				safe_close(fds[i]);
			connection_send_error(c, g->request_id, k > 0 ? k : PROTOCOL_E_INTERNAL, "%s", err.msg);
			return false;
		}
	}
	if (m->stopping)
		k = error_set(&err, PROTOCOL_E_SHUTTING_DOWN, "the daemon is stopping");
	else if (connection_find(c, g->request_id, NULL))
		k = error_set(&err, PROTOCOL_E_REQUEST_ID_IN_USE, "request_id %llu is already in flight",
			      (unsigned long long)g->request_id);
	else if (c->n_requests >= MANAGER_MAX_REQUESTS_PER_CLIENT)
		k = error_set(&err, PROTOCOL_E_TOO_MANY_REQUESTS, "at most %u requests may be in flight",
			      MANAGER_MAX_REQUESTS_PER_CLIENT);
	else if (connection_uid_usage(m, c->cred.uid).requests >= MANAGER_MAX_REQUESTS_PER_UID)
		k = error_set(&err, PROTOCOL_E_TOO_MANY_REQUESTS,
			      "your connections have %u requests in flight, the most one user may have",
			      MANAGER_MAX_REQUESTS_PER_UID);
	else {
		k = request_new_consume_fds(m, c, g, fds, n_fds, &r, &err);
		n_fds = 0;
	}
	for (size_t i = 0; i < n_fds; i++)
		safe_close(fds[i]);
	if (k != 0) {
		connection_send_error(c, g->request_id, k > 0 ? k : PROTOCOL_E_INTERNAL, "%s", err.msg);
		return false;
	}
	c->requests[c->n_requests++] = r;
	scheduler_add(m->scheduler, r);
	return false;
}

static void connection_cancel(Connection *c, uint64_t id)
{
	Request *r = connection_find(c, id, NULL);
	if (!r) {
		connection_send_error(c, id, PROTOCOL_E_UNKNOWN_REQUEST, "request %llu is not in flight",
				      (unsigned long long)id);
		return;
	}
	request_cancel(r, false);
	connection_request_done(c, r);
}

/* Keep a Generate (msg taken over, fds too) until its session is loaded; stop reading meanwhile. */
static void connection_park(Connection *c, Turbokv__V1__ClientMessage **msg, const int *fds, size_t n_fds)
{
	c->parked = TAKE_PTR(*msg);
	memcpy(c->parked_fds, fds, n_fds * sizeof(int));
	c->n_parked_fds = n_fds;
	connection_update_events(c);
}

static void connection_unpark(Connection *c)
{
	for (size_t i = 0; i < c->n_parked_fds; i++)
		safe_close(c->parked_fds[i]);
	c->n_parked_fds = 0;
	c->parked = protocol_client_message_free(c->parked);
}

/* Act on one validated message that came after Hello (a Generate may take msg over, see connection_park()). */
static void connection_dispatch(Connection *c, Turbokv__V1__ClientMessage **msgp, int *fds, size_t n_fds)
{
	const Turbokv__V1__ClientMessage *msg = *msgp;
	switch (msg->msg_case) {
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE:
		if (connection_generate(c, msg->generate, fds, n_fds, false))
			connection_park(c, msgp, fds, n_fds);
		return;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL:
		connection_cancel(c, msg->cancel->request_id);
		break;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_STATUS:
		connection_send_status(c, msg->status->request_id);
		break;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_LIST:
		sessions_list(c->manager->sessions, c->cred.uid, c, msg->session_list->request_id);
		break;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SHOW:
		sessions_show(c->manager->sessions, c->cred.uid, msg->session_show->name, c,
			      msg->session_show->request_id);
		break;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SAVE:
		sessions_save_request(c->manager->sessions, c->cred.uid, msg->session_save->name, c,
				      msg->session_save->request_id);
		break;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_DELETE:
		sessions_delete(c->manager->sessions, c->cred.uid, msg->session_delete->name, c,
				msg->session_delete->request_id);
		break;
	default:
		connection_send_error(c, 0, PROTOCOL_E_BAD_MESSAGE, "unexpected message");
		break;
	}
	for (size_t i = 0; i < n_fds; i++)
		safe_close(fds[i]);
}

/* The request id a message carries, 0 if none. */
static uint64_t message_request_id(const Turbokv__V1__ClientMessage *m)
{
	switch (m->msg_case) {
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE: return m->generate ? m->generate->request_id : 0;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL: return m->cancel ? m->cancel->request_id : 0;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_STATUS: return m->status ? m->status->request_id : 0;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_LIST: return m->session_list ? m->session_list->request_id : 0;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SHOW: return m->session_show ? m->session_show->request_id : 0;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SAVE:
		return m->session_save ? m->session_save->request_id : 0;
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_DELETE:
		return m->session_delete ? m->session_delete->request_id : 0;
	default: return 0;
	}
}

/*
 * One frame: decode, claim its descriptors, validate, check the
 * connection's state, act.
 */
static void connection_handle_frame(Connection *c, const Frame *f)
{
	_cleanup_(protocol_client_message_freep) Turbokv__V1__ClientMessage *msg = NULL;
	int fds[FDPASS_MAX_FDS];
	size_t n_fds = 0;
	Error err = { 0 };
	int r;

	msg = turbokv__v1__client_message__unpack(NULL, f->len, f->data);
	if (!msg) {
		fd_queue_take(c->fds, f->offset, 0, fds); /* closes strays, if any */
		connection_send_error(c, 0, PROTOCOL_E_BAD_FRAME, "%zu bytes that are not a ClientMessage", f->len);
		return;
	}
	if (msg->msg_case == TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE && msg->generate)
		n_fds = msg->generate->n_attachments;
	if (n_fds > FDPASS_MAX_FDS) {
		connection_send_error(c, 0, PROTOCOL_E_BAD_MESSAGE, "generate.attachments: more than %u",
				      (unsigned)FDPASS_MAX_FDS);
		return;
	}
	r = fd_queue_take(c->fds, f->offset, n_fds, fds);
	if (r != 0) {
		connection_send_error(c, 0, PROTOCOL_E_BAD_MESSAGE, "descriptors do not match the frame: %s",
				      r > 0 ? fdpass_error_name(r) : strerror(-r));
		return;
	}

	r = protocol_check_encoded_strings(f->data, f->len, &err);
	if (r == 0)
		r = protocol_validate_client_message(msg, n_fds, &err);
	if (r == 0 && !c->hello_done && msg->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO)
		r = error_set(&err, PROTOCOL_E_HELLO_REQUIRED, "the first message must be Hello");
	else if (r == 0 && c->hello_done && msg->msg_case == TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO)
		r = error_set(&err, PROTOCOL_E_HELLO_REQUIRED, "a second Hello");
	if (r != 0) {
		uint64_t id = r == PROTOCOL_E_HELLO_REQUIRED || r == PROTOCOL_E_BAD_FRAME || !c->hello_done
			? 0 : message_request_id(msg);
		for (size_t i = 0; i < n_fds; i++)
			safe_close(fds[i]);
		connection_send_error(c, id, r, "%s", err.msg);
		return;
	}

	if (msg->msg_case == TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO) {
		c->hello_done = true;
		snprintf(c->client_name, sizeof(c->client_name), "%s",
			 msg->hello->client_name ? msg->hello->client_name : "");
		log_debug("client %llu: hello from '%s' (uid %u, pid %d)", (unsigned long long)c->id,
			  c->client_name, (unsigned)c->cred.uid, (int)c->cred.pid);
		connection_send_hello_reply(c, msg->hello->protocol_version);
		return;
	}
	connection_dispatch(c, &msg, fds, n_fds);
}

/* Handle the complete frames the reader holds (until one parks). */
static void connection_handle_frames(Connection *c)
{
	Frame f;
	while (!c->dead && !c->closing && !c->parked && frame_reader_pop(c->reader, &f) == 0) {
		c->active_ns = now_ns();
		connection_handle_frame(c, &f);
	}
}

void connection_session_loaded(Manager *m, uint64_t conn_id, int code, const char *message)
{
	Connection *c = m->connections;
	while (c && c->id != conn_id)
		c = c->next;
	if (!c || c->dead || !c->parked)
		return;
	const Turbokv__V1__Generate *g = c->parked->generate;
	if (code != 0) {
		connection_send_error(c, g->request_id, code > 0 ? code : PROTOCOL_E_INTERNAL, "%s", message);
		connection_unpark(c);
	} else {
		(void)connection_generate(c, g, c->parked_fds, c->n_parked_fds, true); /* consumes the fds */
		c->n_parked_fds = 0;
		connection_unpark(c);
	}
	connection_handle_frames(c);
	connection_update_events(c);
	manager_gc(m);
}

/* Read what is there, handle complete frames. */
static void connection_read(Connection *c)
{
	uint8_t buf[CONNECTION_READ_BYTES];
	Error err = { 0 };

	for (int i = 0; i < CONNECTION_READS_PER_EVENT && !c->dead && !c->closing && !c->parked; i++) {
		size_t n;
		int r = fdpass_recv(c->fd, buf, sizeof(buf), c->fds, &n);
		if (r == -EAGAIN || r == -EINTR)
			return;
		if (r == FDPASS_E_CTRUNC) {
			connection_send_error(c, 0, PROTOCOL_E_BAD_MESSAGE,
					      "more than %u descriptors sent with one message", (unsigned)FDPASS_MAX_FDS);
			return;
		}
		if (r == FDPASS_E_TOO_MANY_FDS) {
			connection_send_error(c, 0, PROTOCOL_E_TOO_MANY_REQUESTS,
					      "too many descriptors waiting for their frames (at most %u)",
					      CONNECTION_MAX_PARKED_FDS);
			return;
		}
		if (r != 0) {
			log_info_ratelimited("client %llu: receive failed: %s; dropping it", (unsigned long long)c->id,
					     r > 0 ? fdpass_error_name(r) : strerror(-r));
			connection_kill(c);
			return;
		}
		if (n == 0) {
			/* The client hung up; an unfinished frame does not matter any more. */
			connection_kill(c);
			return;
		}
		if (fd_queue_size(c->fds) > 0 &&
		    connection_uid_usage(c->manager, c->cred.uid).parked_fds > MANAGER_MAX_PARKED_FDS_PER_UID) {
			connection_send_error(c, 0, PROTOCOL_E_BUSY,
					      "your connections hold more than %u descriptors for unfinished messages",
					      MANAGER_MAX_PARKED_FDS_PER_UID);
			return;
		}
		r = frame_reader_feed(c->reader, buf, n, &err);
		if (r != 0) {
			connection_send_error(c, 0, PROTOCOL_E_BAD_FRAME, "%s", r > 0 ? err.msg : strerror(-r));
			return;
		}
		connection_handle_frames(c);
	}
}

static int connection_on_io(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	Connection *c = userdata;

	if (revents & EPOLLOUT)
		connection_flush(c);
	if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
		if (c->closing && (revents & (EPOLLHUP | EPOLLERR)))
			connection_kill(c);
		else if (!c->closing)
			connection_read(c);
	}
	manager_gc(c->manager);
	return 0;
}

int connection_new_consume_fd(Manager *m, int fd, Connection **ret)
{
	Connection *c = calloc(1, sizeof(*c));
	int r;

	if (!c) {
		safe_close(fd);
		return -ENOMEM;
	}
	c->manager = m;
	c->fd = fd;
	c->id = ++m->next_connection_id;
	c->created_ns = c->active_ns = now_ns();
	/* The kernel holds no more than we would: a client that does not read is paused sooner. */
	int sndbuf = (int)m->config->client_buffer;
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	if ((r = peercred_get(fd, &c->cred)) < 0 || (r = frame_reader_new(PROTOCOL_MAX_FRAME_BYTES, &c->reader)) < 0 ||
	    (r = frame_writer_new(PROTOCOL_MAX_FRAME_BYTES, &c->writer)) < 0 ||
	    (r = fd_queue_new(CONNECTION_MAX_PARKED_FDS, &c->fds)) < 0 ||
	    (r = sd_event_add_io(m->event, &c->io, fd, EPOLLIN, connection_on_io, c)) < 0) {
		connection_free(c);
		return r;
	}
	(void)sd_event_source_set_description(c->io, "client");
	c->next = m->connections;
	if (m->connections)
		m->connections->prev = c;
	m->connections = c;
	m->n_connections++;
	*ret = c;
	return 0;
}

Connection *connection_free(Connection *c)
{
	if (!c)
		return NULL;
	Manager *m = c->manager;
	if (c->prev || m->connections == c) {
		if (c->prev)
			c->prev->next = c->next;
		else
			m->connections = c->next;
		if (c->next)
			c->next->prev = c->prev;
		m->n_connections--;
	}
	for (size_t i = 0; i < c->n_requests; i++)
		if (!scheduler_remove(m->scheduler, c->requests[i]))
			request_free(c->requests[i]);
	c->n_requests = 0;
	scheduler_forget(m->scheduler, c);
	if (c->dead)
		m->n_dead--;
	connection_unpark(c);
	sd_event_source_disable_unref(c->io);
	frame_reader_free(c->reader);
	frame_writer_free(c->writer);
	fd_queue_free(c->fds);
	safe_close(c->fd);
	free(c);
	return NULL;
}

void connection_shutdown(Connection *c)
{
	if (c->parked) {
		connection_send_error(c, c->parked->generate->request_id, PROTOCOL_E_SHUTTING_DOWN, "the daemon is stopping");
		connection_unpark(c);
	}
	while (c->n_requests > 0) {
		Request *r = c->requests[0];
		request_cancel(r, true);
		connection_request_done(c, r);
	}
	c->closing = true;
	connection_flush(c);
}

ConnectionUsage connection_uid_usage(const Manager *m, uid_t uid)
{
	ConnectionUsage u = { 0 };
	for (const Connection *c = m->connections; c; c = c->next)
		if (c->cred.uid == uid && !c->dead) {
			u.connections++;
			u.requests += (unsigned)c->n_requests;
			u.parked_fds += fd_queue_size(c->fds);
		}
	return u;
}

void connection_check_timeouts(Connection *c, uint64_t now)
{
	const Config *cfg = c->manager->config;
	uint64_t idle_ns = (uint64_t)cfg->idle_timeout_s * 1000000000ull;
	uint64_t hello_ns = (uint64_t)MANAGER_HELLO_TIMEOUT_S * 1000000000ull;

	if (c->dead)
		return;
	if (c->closing) {
		/* An Error it does not read: drop it rather than hold its slot. */
		if (now - c->closing_ns > (uint64_t)MANAGER_CLOSE_TIMEOUT_S * 1000000000ull)
			connection_kill(c);
		return;
	}
	if (idle_ns && idle_ns < hello_ns)
		hello_ns = idle_ns;
	if (!c->hello_done && now - c->created_ns > hello_ns)
		connection_send_error(c, 0, PROTOCOL_E_TIMEOUT, "no Hello within %.0f s of connecting", hello_ns / 1e9);
	else if (c->hello_done && idle_ns && c->n_requests == 0 && now - c->active_ns > idle_ns)
		connection_send_error(c, 0, PROTOCOL_E_TIMEOUT, "idle for %u s; connect again when needed",
				      cfg->idle_timeout_s);
}

void connection_refuse_consume_fd(int fd, int code, const char *message)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Error e = TURBOKV__V1__ERROR__INIT;
	uint8_t buf[4 + 512];

	e.code = (Turbokv__V1__ErrorCode)code;
	e.message = (char *)message;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_ERROR;
	msg.error = &e;
	size_t len = turbokv__v1__server_message__get_packed_size(&msg);
	if (len + 4 <= sizeof(buf)) {
		put_le(buf, len, 4);
		turbokv__v1__server_message__pack(&msg, buf + 4);
		(void)!send(fd, buf, len + 4, MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	safe_close(fd);
}
