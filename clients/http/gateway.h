/*
 * gateway.h: the HTTP side of turbokv-http: libmicrohttpd daemons on
 * listening sockets the caller opened, routing, limits, and a libturbokv
 * connection per generation, kept for reuse in a DaemonPool (gateway.c,
 * daemonpool.c). main.c owns options, the
 * configuration file and the sockets.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct GatewayConfig {
	const char *daemon_socket;  /* NULL: libturbokv's default */
	const char *token;          /* NULL or "": no authentication */
	size_t max_body_bytes;      /* larger bodies: 413 */
	size_t max_header_bytes;    /* request line + headers (431 past it) */
	unsigned max_requests;      /* concurrent requests; more: 503 */
	unsigned timeout_s;         /* idle connection timeout (also slow headers) */
} GatewayConfig;

typedef struct Gateway Gateway;

/* Returns 0 and *ret (free with gateway_free), or -ENOMEM. cfg's strings must outlive it. */
int gateway_new(const GatewayConfig *cfg, Gateway **ret);

/*
 * Serve HTTP on fd, a listening stream socket (TCP or Unix), borrowed
 * until gateway_free. Returns 0, -EINVAL when more than
 * GATEWAY_MAX_LISTENERS are open, or -EIO if libmicrohttpd refuses it.
 */
#define GATEWAY_MAX_LISTENERS 8
int gateway_listen_fd(Gateway *gw, int fd);

/* Stop serving (streams in flight are cancelled) and free. NULL is fine. Returns NULL. */
Gateway *gateway_free(Gateway *gw);
