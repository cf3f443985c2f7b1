/*
 * peercred.h: who is on the other end of a Unix socket (SO_PEERCRED).
 *
 * The kernel records the peer's credentials when the connection is made
 * (connect() or socketpair()); they do not change if the peer later drops
 * privileges or passes the socket on. Sessions are owned by this uid.
 */
#pragma once

#include <sys/types.h>

typedef struct PeerCred {
	pid_t pid;
	uid_t uid;
	gid_t gid;
} PeerCred;

/* Credentials of sock's peer. Returns 0 and *ret, or -errno (-ENOTSOCK, ...). */
int peercred_get(int sock, PeerCred *ret);
