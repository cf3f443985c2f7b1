/*
 * daemonpool.h: turbokv-http's idle connections to turbokvd. A
 * DaemonPool keeps up to max_idle libturbokv connections that have done
 * their Hello and ended their last generation cleanly, so that the next
 * request skips the connect and the Hello (and the daemon's per-connection
 * setup). It does not decide whether a connection is clean: the caller
 * says so when it gives one back (gateway.c: finished with Done, never
 * cancelled). Thread-safe: every libmicrohttpd connection thread takes
 * and gives.
 *
 * A pooled connection may have died while idle (the daemon restarted, or
 * closed it after --idle-timeout); its next use then fails with
 * TKV_E_SERVER_CLOSED or TKV_E_TIMEOUT before any output, and the caller
 * retries once on a fresh connection (daemonpool_connect). Connections
 * idle for longer than max_idle_s are closed instead of reused.
 */
#pragma once

#include <stdbool.h>

#include "turbokv/client.h"

typedef struct DaemonPool DaemonPool;

/*
 * A pool for the daemon at socket_path (NULL: libturbokv's default) whose
 * connections name themselves client_name; both strings are borrowed and
 * must outlive the pool. max_idle 0 keeps nothing (every take connects).
 * Returns 0 and *ret, or -ENOMEM.
 */
int daemonpool_new(const char *socket_path, const char *client_name, unsigned max_idle,
		   unsigned max_idle_s, DaemonPool **ret);

/* Close every idle connection and free. NULL is fine. Returns NULL. */
DaemonPool *daemonpool_free(DaemonPool *p);

/*
 * A connection: the most recently given back idle one (*ret_reused true),
 * else a new one (false). Returns 0 and *ret_client (give it back with
 * daemonpool_give), or tkv_client_connect()'s error with err filled.
 */
int daemonpool_take(DaemonPool *p, TkvClient **ret_client, bool *ret_reused, TkvError *err);

/* A new connection, never an idle one; as daemonpool_take. */
int daemonpool_connect(DaemonPool *p, TkvClient **ret_client, TkvError *err);

/*
 * Give c back (consumed; NULL is fine): kept for reuse when reusable and
 * fewer than max_idle are idle, else closed. Returns NULL.
 */
TkvClient *daemonpool_give(DaemonPool *p, TkvClient *c, bool reusable);

/* Idle connections now. */
unsigned daemonpool_n_idle(DaemonPool *p);
