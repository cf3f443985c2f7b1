/*
 * prefixcache.h: prefix reuse without names. The KV caches of a uid's
 * recent requests that named no session, kept so that the next such
 * request (a stateless chat client sending the whole history again)
 * prefills only what is new.
 *
 * Owns: per uid at most --prefix-cache entries (token ids and the
 * KvCache holding the first kvcache_n_tokens() of them), least recently
 * used first out; all entries together within a byte budget that the
 * caller shares with the sessions (--session-memory minus what sessions
 * hold): over it, the least recently used entries of any uid are freed.
 * Entries live in memory only: one that does not fit is dropped, never
 * written to disk (the request it served is over; its prompt is
 * recomputed if it comes again).
 *
 * Every lookup is keyed by uid: an entry is only ever found by a request
 * of the uid that made it. An entry is taken out while a request uses it
 * (two requests never share a cache) and put back, with the longer
 * conversation, when that request ends.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/util.h"
#include "engine/kv/kvcache.h"

#define PREFIXCACHE_MAX_PER_UID 64u

typedef struct PrefixCache PrefixCache;

/* A cache of per_uid entries per uid (0: disabled). Returns 0 or -ENOMEM. */
int prefixcache_new(unsigned per_uid, PrefixCache **ret);
PrefixCache *prefixcache_free(PrefixCache *pc);
DEFINE_FREEP(PrefixCache, prefixcache_free)

/*
 * Take out the entry of uid whose tokens share the longest prefix with
 * tokens (n,), among those whose cache holds at least capacity tokens,
 * if that prefix is at least one token; the cache is rewound to the
 * prefix, at most n - 1 tokens (the last prompt token is evaluated again
 * for its logits). Returns the cache (the caller owns it) with *ret_keep
 * its tokens, or NULL (nothing taken, *ret_keep untouched).
 */
KvCache *prefixcache_take(PrefixCache *pc, uid_t uid, const int32_t *tokens, size_t n, int64_t capacity,
			  size_t *ret_keep);

/*
 * Keep kv (consumed) for uid, with tokens (n_tokens, copied; its first
 * kvcache_n_tokens(kv) are the cache's). The uid's least recently used
 * entry goes when it has per_uid already, and the least recently used of
 * all while they hold more than budget bytes (kvcache_memory_bytes() and
 * the tokens). Returns 0, or -ENOMEM (kv freed).
 */
int prefixcache_put(PrefixCache *pc, uid_t uid, KvCache *kv, const int32_t *tokens, size_t n_tokens,
		    uint64_t budget);

/* Entries of uid now; bytes of all entries. */
size_t prefixcache_n_entries(const PrefixCache *pc, uid_t uid);
uint64_t prefixcache_bytes(const PrefixCache *pc);
