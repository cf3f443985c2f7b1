/*
 * prefixcache.h: prefix reuse without names. The KV caches of a uid's
 * recent requests that named no session, kept so that the next such
 * request (a stateless chat client sending the whole history again)
 * prefills only what is new.
 *
 * Owns: per uid at most --prefix-cache entries in memory (token ids and
 * the KvCache holding the first kvcache_n_tokens() of them), least
 * recently used first out; all entries in memory together within a byte
 * budget that the caller shares with the sessions (--session-memory minus
 * what sessions hold): over it, the least recently used entries of any
 * uid go. With a PrefixCacheIO (prefixcache_set_io()) an entry that goes
 * is spilled to disk instead of freed, and so is every entry at shutdown
 * (prefixcache_spill_all()); this module keeps the index of the spilled
 * entries (their file names and keys, never their bytes) and decides what
 * is written, loaded and deleted. Not here: the files themselves (the I/O
 * is the PrefixCacheIO's: daemon/prefixspill.c, where they live and how).
 *
 * == Spilled entries ==
 *
 * A spilled entry is known by its key, two token-prefix hashes: A of the
 * n_a tokens its cache holds, B of the first n_b = min(n_prompt, n_a)
 * (the prompt of the request that made it). Both are in its file name,
 *
 *   <n_a>-<A>-<n_b>-<B>.tkvs      n decimal, A and B 16 lower-case hex
 *                                 digits: prefixcache_hash()
 *
 * so that after a restart the index is a directory listing: no file is
 * read to decide whether it matches. A request matches an entry when its
 * first n_a (else n_b) tokens hash to A (B), n_a (n_b) at most its prompt
 * length; then the file is loaded (on the I/O worker; requests of that
 * uid wait meanwhile: prefixcache_prepare()), its tokens are compared
 * for real, and the cache goes into memory and the file is deleted. A
 * spilled entry is also deleted when it is superseded: a new entry of
 * the same uid holds its n_a tokens as a prefix. Bounds on disk, per uid:
 * at most max_files files and max_bytes bytes (prefixcache_set_io()),
 * least recently used first out.
 *
 * An entry is reused by a request that continues its conversation: one
 * whose prompt shares at least half of the tokens its cache holds. A
 * request that shares less (another conversation with the same system
 * prompt) computes its prompt and leaves the entry for its own.
 *
 * Every lookup is keyed by uid: an entry is only ever found by a request
 * of the uid that made it, and a uid's files are only ever listed, read
 * or deleted for that uid. An entry is taken out while a request uses it
 * (two requests never share a cache) and put back, with the longer
 * conversation, when that request ends.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/util.h"
#include "engine/kv/kvcache.h"

#define PREFIXCACHE_MAX_PER_UID 64u
#define PREFIXCACHE_NAME_MAX 64u   /* a spilled entry's file name with its NUL */

typedef struct PrefixCache PrefixCache;

/*
 * The disk half. Each call starts its work and reports its end, maybe
 * later on the loop thread, through prefixcache_saved() /
 * prefixcache_loaded(); userdata is passed back unchanged.
 */
typedef struct PrefixCacheIO {
	void *userdata;
	/*
	 * Write kv and tokens (n_tokens; both consumed) as uid's file name;
	 * then prefixcache_saved(). now: on this thread (shutdown).
	 */
	void (*save)(void *userdata, uid_t uid, const char *name, KvCache *kv, int32_t *tokens, size_t n_tokens,
		     bool now);
	/* Read uid's file name; then prefixcache_loaded(). */
	void (*load)(void *userdata, uid_t uid, const char *name);
	/* Delete uid's file name (superseded, out of the bounds, damaged). */
	void (*remove)(void *userdata, uid_t uid, const char *name);
	/* prefixcache_found() for each of uid's files (once per uid, at its first request). */
	void (*scan)(void *userdata, uid_t uid);
} PrefixCacheIO;

/* A cache of per_uid entries per uid (0: disabled). Returns 0 or -ENOMEM. */
int prefixcache_new(unsigned per_uid, PrefixCache **ret);
PrefixCache *prefixcache_free(PrefixCache *pc);
DEFINE_FREEP(PrefixCache, prefixcache_free)

/* Spill through io (copied) from now on, at most max_files files and max_bytes bytes per uid. */
void prefixcache_set_io(PrefixCache *pc, const PrefixCacheIO *io, unsigned max_files, uint64_t max_bytes);

/* FNV-1a (64 bits) of tokens (n,) as little-endian u32: the keys of spilled entries. */
uint64_t prefixcache_hash(const int32_t *tokens, size_t n);

/*
 * Take out the entry of uid whose tokens share the longest prefix with
 * tokens (n,), among those in memory whose cache holds at least capacity
 * tokens, if that prefix is at least one token and half of what the
 * entry's cache holds; the cache is rewound to
 * the prefix, at most n - 1 tokens (the last prompt token is evaluated
 * again for its logits). Returns the cache (the caller owns it) with
 * *ret_keep its tokens, or NULL (nothing taken, *ret_keep untouched).
 */
KvCache *prefixcache_take(PrefixCache *pc, uid_t uid, const int32_t *tokens, size_t n, int64_t capacity,
			  size_t *ret_keep);

/*
 * Whether a request of uid with prompt tokens (n,) must wait before it is
 * admitted (the scheduler asks each time it could admit it): when a
 * spilled entry of uid matches a longer prefix than any entry in memory,
 * its load starts (or, while it is still being written, waits for that
 * to end). Returns true while a load of uid's, or the write of the best
 * match, runs; their ends wake the scheduler.
 */
bool prefixcache_prepare(PrefixCache *pc, uid_t uid, const int32_t *tokens, size_t n);

/* Whether a load of one of uid's entries runs: its requests wait (the scheduler). */
bool prefixcache_loading(const PrefixCache *pc, uid_t uid);

/*
 * Keep kv (consumed) for uid, with tokens (n_tokens, copied; its first
 * kvcache_n_tokens(kv) are the cache's; the first n_prompt of them were
 * its request's prompt). The uid's least recently used entry goes when it
 * has per_uid in memory already, and the least recently used of all while
 * they hold more than budget bytes (kvcache_memory_bytes() and the
 * tokens); spilled, with an io. Spilled entries of uid that the new one
 * supersedes are deleted. Returns 0, or -ENOMEM (kv freed).
 */
int prefixcache_put(PrefixCache *pc, uid_t uid, KvCache *kv, const int32_t *tokens, size_t n_tokens,
		    size_t n_prompt, uint64_t budget);

/* Spill every entry in memory (shutdown: io->save(now)). */
void prefixcache_spill_all(PrefixCache *pc);

/*
 * The io's reports. saved: the file name of uid was written (r 0, bytes
 * its size) or not (r != 0: forgotten). loaded: r 0 with kv and tokens
 * (consumed) read from it; else forgotten (and deleted when r > 0, a
 * damaged file). found: uid has the file name of bytes (the scan);
 * returns false for a name that is not a spilled entry's.
 */
void prefixcache_saved(PrefixCache *pc, uid_t uid, const char *name, int r, uint64_t bytes);
void prefixcache_loaded(PrefixCache *pc, uid_t uid, const char *name, int r, KvCache *kv, int32_t *tokens,
			size_t n_tokens, uint64_t budget);
bool prefixcache_found(PrefixCache *pc, uid_t uid, const char *name, uint64_t bytes);

/* Entries of uid in memory now; entries of uid on disk (or being written); bytes of all entries in memory. */
size_t prefixcache_n_entries(const PrefixCache *pc, uid_t uid);
size_t prefixcache_n_spilled(const PrefixCache *pc, uid_t uid);
uint64_t prefixcache_bytes(const PrefixCache *pc);
