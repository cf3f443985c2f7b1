/*
 * listener.h: the listening socket, socket-activated or our own.
 *
 * With socket activation (sd_listen_fds() == 1: an AF_UNIX stream socket
 * systemd opened) we use that and never touch the path. Otherwise we bind
 * --socket ourselves: the parent directory is created (0755), a socket
 * file left over from an earlier run is removed only if nothing accepts
 * connections on it (connect() fails with ECONNREFUSED), another daemon
 * listening there is an error, and the socket gets mode 0600 for a user
 * instance or 0660 when running as root (the turbokv group of the
 * packaged units can then connect). Our own socket file is unlinked when
 * the listener is freed.
 */
#pragma once

#include <stdbool.h>

#include "daemon/manager.h"

/* Returns 0 or -errno (logged). Accepted clients become Connections of m. */
int listener_new(Manager *m, const char *path, Listener **ret);
Listener *listener_free(Listener *l);
DEFINE_FREEP(Listener, listener_free)

/* Stop accepting (shutdown). */
void listener_stop(Listener *l);

/* Whether the socket came from systemd. */
bool listener_activated(const Listener *l);
