/*
 * connection.h: one client on the socket.
 *
 * Owns the client's socket, its FrameReader, FrameWriter and FdQueue, its
 * peer credentials, the protocol state (Hello first, then requests by id)
 * and its requests in flight. Decodes and validates each frame and turns
 * it into an action: a reply, a new Request for the scheduler, a cancel.
 * A protocol violation is answered by Error{request_id: 0} and the
 * connection closes once that is written.
 *
 * Backpressure: when more than Config.client_buffer bytes (--client-buffer,
 * default 256 KiB) of replies wait for the client to read them, the
 * daemon stops reading its requests and the scheduler stops generating
 * for it: its requests keep their place and their KV cache but make no
 * progress until it catches up; nothing is dropped. The socket's kernel
 * send buffer is set to the same size, so what a client that never reads
 * costs is bounded by about twice that plus one reply.
 *
 * Limits (bounds.h): descriptors parked in unfinished frames, per
 * connection and per uid; requests in flight per connection and per uid;
 * the Hello, idle and close timeouts (connection_check_timeouts(), which
 * the manager calls every second).
 *
 * A connection is never freed in the middle of an event: a failure marks
 * it dead and manager_gc() frees it (cancelling its requests) afterwards.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/manager.h"
#include "ipc/peercred.h"
#include "proto/protocol.h"

typedef struct Request Request;

struct Connection {
	Manager *manager;
	Connection *prev, *next;
	uint64_t id;
	int fd;
	sd_event_source *io;
	PeerCred cred;
	struct FrameReader *reader;
	struct FrameWriter *writer;
	struct FdQueue *fds;
	bool hello_done;
	bool closing; /* a connection-level Error is queued: read nothing more, close when flushed */
	bool dead;    /* to be freed by manager_gc() */
	char client_name[64];
	uint64_t created_ns, active_ns; /* accepted; last complete frame (or request end) */
	uint64_t closing_ns;            /* when closing was set */
	/*
	 * A Generate waiting for its session to load (sessions_prepare()):
	 * nothing more is read until it is dispatched, so later frames (a
	 * Cancel of it) come after it.
	 */
	Turbokv__V1__ClientMessage *parked;
	int parked_fds[16];
	size_t n_parked_fds;
	Request *requests[MANAGER_MAX_REQUESTS_PER_CLIENT]; /* in arrival order */
	size_t n_requests;
};

/* Take over an accepted socket (consumed, even on error). Returns 0 or -errno. */
int connection_new_consume_fd(Manager *m, int fd, Connection **ret);
/* Cancel its requests silently, close, unlink from the manager. Returns NULL. */
Connection *connection_free(Connection *c);

/* Queue one message and try to write it. Failure marks the connection dead. */
void connection_send(Connection *c, const Turbokv__V1__ServerMessage *msg);
void connection_send_error(Connection *c, uint64_t request_id, int code, const char *fmt, ...)
	_printf_(4, 5);

/* Whether the scheduler may produce output for this connection now. */
bool connection_writable(const Connection *c);

/* Remove r from c's requests and free it. */
void connection_request_done(Connection *c, Request *r);

/*
 * The session load a parked Generate of connection conn_id waited for is
 * done: code 0 dispatches it (it acquires the loaded session), else it is
 * answered Error(code, message). A connection gone meanwhile is ignored.
 */
void connection_session_loaded(Manager *m, uint64_t conn_id, int code, const char *message);

/* What uid's connections hold, summed (a walk of the manager's list). */
typedef struct ConnectionUsage {
	unsigned connections, requests;
	size_t parked_fds;
} ConnectionUsage;
ConnectionUsage connection_uid_usage(const Manager *m, uid_t uid);

/* Error(TIMEOUT) and close when c waited too long for Hello or was idle too long (bounds.h). */
void connection_check_timeouts(Connection *c, uint64_t now);

/*
 * Tell a client we will not serve (a socket just accepted, consumed):
 * one Error{0, code, message} frame if the socket takes it at once, then
 * close. For refusals at the door: too many connections, no descriptors.
 */
void connection_refuse_consume_fd(int fd, int code, const char *message);

/* Shutdown: end every request with Done(CANCELLED) or Error(SHUTTING_DOWN), close after flushing. */
void connection_shutdown(Connection *c);
