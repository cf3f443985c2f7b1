/*
 * bounds.h: every bound the daemon puts on what clients control, in one
 * place. Protocol-level limits (frame size, attachment size, string
 * lengths) are proto/protocol.h's; descriptor framing is ipc/fdpass.h's.
 *
 * Fairness: no single uid can take a shared resource whole. Connections,
 * requests in flight and descriptors parked in unfinished frames are
 * capped per connection, per uid and in total, and a per-uid cap is always
 * below the total, so other users still get in.
 *
 *   resource                       per connection   per uid             all
 *   connections                    -                --connections-per-  MANAGER_MAX_CONNECTIONS
 *                                                   user (32)
 *   requests in flight             8 (HelloReply)   MANAGER_MAX_REQUESTS_PER_UID
 *   requests holding a KV cache    -                -                   MANAGER_MAX_ACTIVE_REQUESTS
 *   fds parked (unfinished frames) CONNECTION_MAX_PARKED_FDS           MANAGER_MAX_PARKED_FDS_PER_UID
 *   reply bytes queued             --client-buffer (connection.h)
 *
 * Time: a connection must send Hello within MANAGER_HELLO_TIMEOUT_S (or
 * the idle timeout, if shorter); one with no request in flight that sends
 * no complete frame for --idle-timeout seconds (1800) is closed; a
 * connection closing after an Error that does not read it is dropped after
 * MANAGER_CLOSE_TIMEOUT_S. Each of these first gets Error(TIMEOUT) (or
 * BUSY when refused at the door), never a silent close.
 *
 * Descriptors: at startup RLIMIT_NOFILE's soft limit is raised to its hard
 * limit (systemd's LimitNOFILE= sets both); when accept() still fails with
 * EMFILE/ENFILE, a reserve descriptor is given up to accept the client,
 * tell it BUSY and close it, and accepting pauses for MANAGER_ACCEPT_BACKOFF_MS
 * (doubling up to MANAGER_ACCEPT_BACKOFF_MAX_MS), so a full table never
 * spins the loop.
 */
#pragma once

#define MANAGER_MAX_REQUESTS_PER_CLIENT 8u
#define MANAGER_MAX_REQUESTS_PER_UID 32u
#define MANAGER_MAX_ACTIVE_REQUESTS 16u   /* requests prefilling or decoding at once, all clients */
#define MANAGER_MAX_CONNECTIONS 256u      /* all uids; = CONFIG_MAX_CONNECTIONS */
#define CONNECTION_MAX_PARKED_FDS 32u     /* two frames' worth (FDPASS_MAX_FDS each) */
#define MANAGER_MAX_PARKED_FDS_PER_UID 128u
#define MANAGER_HELLO_TIMEOUT_S 10u
#define MANAGER_CLOSE_TIMEOUT_S 10u
#define MANAGER_ACCEPT_BACKOFF_MS 50u
#define MANAGER_ACCEPT_BACKOFF_MAX_MS 2000u
#define MANAGER_IO_STUCK_S 300u          /* a session save running longer stops the watchdog pings */
#define MANAGER_KV_SEED 0                 /* TurboQuant codec seed of every request's cache */
#define MANAGER_PREFILL_CHUNK 512         /* prompt tokens evaluated per scheduler step */
