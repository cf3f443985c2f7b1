/*
 * sessions.h: the daemon's named sessions: per-uid conversations whose
 * KV cache outlives the request that built it.
 *
 * Owns: the table of sessions (uid, name) -> token ids, chat messages and
 * KvCache (engine/session/session.h's SessionState); the memory budget
 * (--session-memory) and least-recently-used spilling to disk; saving
 * (when idle, on spill, on shutdown); restoring on first use; quotas per
 * uid; quarantine of files that fail their checks; the list, show and
 * delete operations. Not here: the file format (engine/session/session.h), how a
 * request builds its prompt from a session (request.c).
 *
 * == On disk ==
 *
 *   <state-dir>/turbokvd.lock        0600, flock()ed by the daemon using the
 *                                    directory (its pid inside): a second
 *                                    daemon on it refuses to start
 *   <state-dir>/sessions/            0700
 *   <state-dir>/sessions/<uid>/      0700, one per user
 *       <name>.tkvs                  0600, engine/session/session.h's format
 *       <name>.tkvs.tmp              a save in progress (removed at startup)
 *       quarantine/<name>.tkvs.<unix-ms>
 *                                    files that failed to load, moved aside
 *                                    untouched for inspection
 *       prefixes/                    anonymous prefix caches (prefixspill.h):
 *                                    not sessions, never listed as such
 *
 * Everything under the state directory is opened relative to a directory
 * fd with O_NOFOLLOW (files also O_NONBLOCK, their type checked with
 * fstat() before reading): a symlink, FIFO or device planted there by
 * whoever can write the directory is refused, never followed or waited
 * on. Session files are checked header first (engine/session/session.h)
 * before their body is read.
 *
 * Every lookup is keyed by the caller's uid (SO_PEERCRED) and name, and
 * the directory of one uid is only ever opened for that uid: a user can
 * neither list, read, overwrite nor delete another user's sessions.
 *
 * == Life of a session ==
 *
 * sessions_acquire() finds (uid, name), loading it from disk if it is
 * not in memory, or creates it (quota permitting), and marks it busy: a
 * second request naming it gets SESSION_BUSY until sessions_release().
 * The request takes the KvCache (sessions_take_kv) and, when it ends,
 * hands back the cache and its token ids and appends its chat turns
 * (sessions_release): the session is then dirty. Dirty sessions are saved
 * when the daemon has been idle for SESSIONS_IDLE_SAVE_MS, when they are
 * spilled (least recently used first, while the sessions in memory exceed
 * the budget) and at shutdown. Saves run on the daemon's I/O worker
 * (worker.h; at shutdown on the main thread): write, fsync, rename, fsync
 * of the directory never stall the event loop. A failed save is logged; the session stays
 * in memory and dirty, and the previous file stays intact.
 *
 * == Quotas (per uid) ==
 *
 * At most --session-max sessions (default SESSIONS_MAX_PER_UID) and
 * --session-disk bytes of session files (default
 * SESSIONS_MAX_BYTES_PER_UID); creating a session beyond the count, or
 * using one while the user's files are over the byte quota, is
 * SESSION_QUOTA. A save may take the files past the byte quota once (the
 * conversation is not lost); the next use is refused until the user
 * deletes sessions.
 *
 * == Test hooks (environment) ==
 *
 *   TURBOKV_SESSION_IDLE_SAVE_MS=T           the idle delay before dirty sessions are saved
 *   TURBOKV_TEST_SESSION_FAIL_WRITE_AFTER=N  saves fail with ENOSPC after N bytes
 *   TURBOKV_TEST_SESSION_SAVE_PAUSE_MS=T     saves sleep T ms after their first 4 KiB
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/manager.h"
#include "engine/session/session.h"
#include "proto/protocol.h"

#define SESSIONS_MAX_PER_UID 64u
#define SESSIONS_MAX_BYTES_PER_UID (8ull << 30)
#define SESSIONS_IDLE_SAVE_MS 5000u
#define SESSIONS_MAX_TOTAL 4096u /* all users */
#define SESSIONS_LOCK_FILE "turbokvd.lock"

typedef struct Sessions Sessions;
typedef struct Session Session;

/* Set up the state directory and read nothing else yet. Returns 0 or -errno (logged). */
int sessions_new(Manager *m, Sessions **ret);
/* Save what is dirty, then free everything. */
Sessions *sessions_free(Sessions *ss);
DEFINE_FREEP(Sessions, sessions_free)

/*
 * Before sessions_acquire() of a Generate on connection conn_id: a session
 * that is only on disk is loaded on the I/O worker first. Returns 0 (go
 * on: acquire now), SESSIONS_LOADING (the load runs; the session is busy
 * meanwhile, and connection_session_loaded(conn_id, code, message) is
 * called when it is done, code 0 or what to tell the client) or an error
 * code as sessions_acquire() has, with err set.
 */
#define SESSIONS_LOADING 1000
int sessions_prepare(Sessions *ss, uid_t uid, const char *name, uint64_t conn_id, Error *err);

/*
 * Find or create the session (uid, name) and mark it busy. Returns 0,
 * PROTOCOL_E_SESSION_BUSY, _QUOTA, _CORRUPT (the file was quarantined),
 * PROTOCOL_E_INTERNAL or -ENOMEM, with err saying what to tell the client.
 */
int sessions_acquire(Sessions *ss, uid_t uid, const char *name, Session **ret, Error *err);

/* The state of an acquired session: NULL for a new, empty one. */
const SessionState *session_state(const Session *s);

/* Take the KV cache out of an acquired session (NULL if it has none). */
KvCache *session_take_kv(Session *s);

/* What else a request that ran changes in its session (sessions_release). */
typedef struct SessionRelease {
	const uint8_t *drop;  /* NULL, or (n_drop,) non-zero: the session's message i was dropped (TRUNCATE_OLDEST) */
	size_t n_drop;        /* the session's n_messages when the request began */
	SessionPolicy policy; /* SESSION_POLICY_NONE: keep the stored one */
} SessionRelease;

/*
 * End the use of an acquired session. With kv (consumed) the request ran:
 * tokens (n_tokens, copied) are the conversation's ids, the first
 * kvcache_n_tokens(kv) of them in the cache; kind and turns (consumed,
 * may be NULL) are appended to its messages, after the messages how->drop
 * marks are removed, and how->policy is stored. Without kv nothing changes
 * (a new session that never ran is forgotten).
 */
void sessions_release(Sessions *ss, Session *s, KvCache *kv, const int32_t *tokens, size_t n_tokens,
		      SessionKind kind, SessionMessage *turns, size_t n_turns, const SessionRelease *how);

/* Save every dirty session that is not busy, now, on this thread (shutdown). */
void sessions_save_all(Sessions *ss);
/* The same on the I/O worker (idle timer, SIGUSR2): the loop goes on meanwhile. */
void sessions_save_all_async(Sessions *ss);

/*
 * Whether a request holding s may take its cache now: false while a save
 * of s runs on the I/O worker (the scheduler admits it afterwards).
 */
bool sessions_ready(const Session *s);

/* SessionListReply / SessionInfo / SessionDeleted answers for uid. */
void sessions_list(Sessions *ss, uid_t uid, Connection *c, uint64_t request_id);
void sessions_show(Sessions *ss, uid_t uid, const char *name, Connection *c, uint64_t request_id);
void sessions_delete(Sessions *ss, uid_t uid, const char *name, Connection *c, uint64_t request_id);
/* SessionSave: write uid's session name now, answer with its SessionInfo. */
void sessions_save_request(Sessions *ss, uid_t uid, const char *name, Connection *c, uint64_t request_id);

/*
 * The folder sub of uid's directory (<state-dir>/sessions/<uid>/<sub>),
 * with the uid's directory created 0700 when create: an fd (O_NOFOLLOW,
 * O_DIRECTORY) or -errno. Only ever opened for uid: the anonymous prefix
 * spills (prefixspill.h) live there, beside the sessions but never
 * listed, counted or named as one.
 */
int sessions_dir_open(Sessions *ss, uid_t uid, const char *sub, bool create);
/* What files read for this daemon are checked against (model, shape, KV plan). */
const SessionExpect *sessions_expect(const Sessions *ss);

/* For StatusReply. */
unsigned sessions_n_in_memory(const Sessions *ss);
uint64_t sessions_memory_bytes(const Sessions *ss);
