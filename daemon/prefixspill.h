/*
 * prefixspill.h: where and how the daemon spills the anonymous prefix
 * caches (prefixcache.h's PrefixCacheIO): files beside the uid's named
 * sessions, written and read with the session file machinery
 * (engine/session/session.h: the atomic, fsynced, checksummed writer and
 * the validating reader), on the I/O worker.
 *
 * == On disk ==
 *
 *   <state-dir>/sessions/<uid>/prefixes/     0700, made at the first spill
 *       <n_a>-<A>-<n_b>-<B>.tkvs             0600, a session file of kind raw,
 *                                            no messages, no policy: the
 *                                            cache and its token ids; the
 *                                            name is its key (prefixcache.h)
 *       <...>.tkvs.tmp                       a write in progress (removed
 *                                            when the uid's files are listed)
 *
 * A folder, not files beside the sessions: no session name (a file
 * <name>.tkvs) can collide with it, and the session listing, quotas and
 * SessionShow/Delete never see it (they read only the uid's own
 * <name>.tkvs files). Opened only for its uid, relative to the uid's
 * directory fd, O_NOFOLLOW. A file that fails to load (damaged,
 * truncated, another model or KV type) is logged and deleted: it is a
 * cache, the prompt is computed again; nothing is quarantined.
 *
 * == Bounds (per uid) ==
 *
 * At most --prefix-spill files (default 8; 0: memory only) and
 * --session-disk / 8 bytes, least recently used first out. They do not
 * count against the session quotas: a stateless client never makes a
 * named session fail; and they are a small share of the disk a user may
 * fill, since each one costs what a session of its tokens costs.
 */
#pragma once

#include "daemon/manager.h"

#define PREFIXSPILL_DIR "prefixes"

/* Give m->prefixes its disk half (after sessions_new()). */
void prefixspill_attach(Manager *m);
