/*
 * prefixcache.c: the anonymous prefix caches of each uid (see
 * prefixcache.h). A flat array: at most PREFIXCACHE_MAX_PER_UID entries
 * per uid and few uids, so a linear scan per request costs nothing next
 * to one prefill chunk.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prefixcache.h"

typedef struct Entry {
	uid_t uid;
	int32_t *tokens;   /* (n_tokens,) */
	size_t n_tokens;
	KvCache *kv;       /* holds the first kvcache_n_tokens(kv) of tokens */
	uint64_t used;     /* PrefixCache.clock when last put */
	uint64_t bytes;
} Entry;

struct PrefixCache {
	unsigned per_uid;
	Entry *entries;    /* (n,) */
	size_t n, cap;
	uint64_t bytes;
	uint64_t clock;
};

int prefixcache_new(unsigned per_uid, PrefixCache **ret)
{
	PrefixCache *pc = calloc(1, sizeof(*pc));
	if (!pc)
		return -ENOMEM;
	pc->per_uid = MIN(per_uid, PREFIXCACHE_MAX_PER_UID);
	*ret = pc;
	return 0;
}

static void entry_remove(PrefixCache *pc, size_t i)
{
	pc->bytes -= pc->entries[i].bytes;
	kvcache_free(pc->entries[i].kv);
	free(pc->entries[i].tokens);
	pc->entries[i] = pc->entries[--pc->n];
}

PrefixCache *prefixcache_free(PrefixCache *pc)
{
	if (!pc)
		return NULL;
	while (pc->n)
		entry_remove(pc, pc->n - 1);
	free(pc->entries);
	free(pc);
	return NULL;
}

KvCache *prefixcache_take(PrefixCache *pc, uid_t uid, const int32_t *tokens, size_t n, int64_t capacity,
			  size_t *ret_keep)
{
	size_t best = SIZE_MAX, best_keep = 0;
	if (!pc || n < 2)
		return NULL;
	for (size_t i = 0; i < pc->n; i++) {
		const Entry *e = &pc->entries[i];
		if (e->uid != uid || e->kv->shape.capacity < capacity)
			continue;
		size_t limit = MIN(MIN((size_t)kvcache_n_tokens(e->kv), e->n_tokens), n - 1), keep = 0;
		while (keep < limit && e->tokens[keep] == tokens[keep])
			keep++;
		if ((int64_t)keep < kvcache_rewind_floor(e->kv))
			keep = 0; /* its windowed layers dropped what a query there would see */
		if (keep > best_keep) {
			best = i;
			best_keep = keep;
		}
	}
	if (best == SIZE_MAX)
		return NULL;
	KvCache *kv = TAKE_PTR(pc->entries[best].kv);
	pc->bytes -= pc->entries[best].bytes;
	pc->entries[best].bytes = 0;
	free(pc->entries[best].tokens);
	pc->entries[best] = pc->entries[--pc->n];
	kvcache_set_n_tokens(kv, (int64_t)best_keep);
	*ret_keep = best_keep;
	return kv;
}

/* The least recently used entry (of uid, or of anyone when all is true); SIZE_MAX if none. */
static size_t entry_lru(const PrefixCache *pc, uid_t uid, bool all)
{
	size_t best = SIZE_MAX;
	for (size_t i = 0; i < pc->n; i++)
		if ((all || pc->entries[i].uid == uid) && (best == SIZE_MAX || pc->entries[i].used < pc->entries[best].used))
			best = i;
	return best;
}

int prefixcache_put(PrefixCache *pc, uid_t uid, KvCache *kv, const int32_t *tokens, size_t n_tokens,
		    uint64_t budget)
{
	if (!pc || pc->per_uid == 0 || kvcache_n_tokens(kv) < 1) {
		kvcache_free(kv);
		return 0;
	}
	uint64_t bytes = kvcache_memory_bytes(kv) + n_tokens * sizeof(int32_t);
	if (bytes > budget) {
		kvcache_free(kv);
		return 0;
	}
	if (prefixcache_n_entries(pc, uid) >= pc->per_uid)
		entry_remove(pc, entry_lru(pc, uid, false));
	while (pc->n && pc->bytes + bytes > budget)
		entry_remove(pc, entry_lru(pc, uid, true));
	if (pc->n == pc->cap) {
		size_t cap = pc->cap ? pc->cap * 2 : 8;
		Entry *p = realloc(pc->entries, cap * sizeof(*p));
		if (!p) {
			kvcache_free(kv);
			return -ENOMEM;
		}
		pc->entries = p;
		pc->cap = cap;
	}
	int32_t *t = malloc_array(n_tokens ? n_tokens : 1, sizeof(int32_t));
	if (!t) {
		kvcache_free(kv);
		return -ENOMEM;
	}
	memcpy(t, tokens, n_tokens * sizeof(int32_t));
	pc->entries[pc->n++] = (Entry){ .uid = uid, .tokens = t, .n_tokens = n_tokens, .kv = kv,
					.used = ++pc->clock, .bytes = bytes };
	pc->bytes += bytes;
	return 0;
}

size_t prefixcache_n_entries(const PrefixCache *pc, uid_t uid)
{
	size_t k = 0;
	for (size_t i = 0; pc && i < pc->n; i++)
		k += pc->entries[i].uid == uid;
	return k;
}

uint64_t prefixcache_bytes(const PrefixCache *pc)
{
	return pc ? pc->bytes : 0;
}
