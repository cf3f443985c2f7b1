/*
 * prefixcache.c: the anonymous prefix caches of each uid and the index
 * of those spilled to disk (see prefixcache.h). A flat array: at most
 * PREFIXCACHE_MAX_PER_UID entries in memory and a few files per uid, and
 * few uids, so a linear scan per request costs nothing next to one
 * prefill chunk.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prefixcache.h"

typedef enum EntryWhere {
	ENTRY_MEMORY,   /* kv and tokens here */
	ENTRY_SAVING,   /* handed to io->save, not yet reported */
	ENTRY_ON_DISK,  /* a file: only its key here */
	ENTRY_LOADING,  /* handed to io->load, not yet reported */
} EntryWhere;

typedef struct Entry {
	uid_t uid;
	EntryWhere where;
	int32_t *tokens;   /* (n_tokens,), ENTRY_MEMORY only */
	size_t n_tokens;
	size_t n_prompt;   /* the first n_prompt of tokens were its request's prompt */
	KvCache *kv;       /* ENTRY_MEMORY: holds the first kvcache_n_tokens(kv) of tokens */
	uint64_t used;     /* PrefixCache.clock when last put (0: found on disk at startup) */
	uint64_t bytes;    /* in memory, counted in PrefixCache.bytes */
	/* the key and file of a spilled entry (prefixcache.h) */
	uint32_t n_a, n_b;
	uint64_t h_a, h_b;
	uint64_t disk_bytes;
	char name[PREFIXCACHE_NAME_MAX];
} Entry;

struct PrefixCache {
	unsigned per_uid;
	Entry *entries;    /* (n,) */
	size_t n, cap;
	uint64_t bytes;
	uint64_t clock;
	bool has_io;
	PrefixCacheIO io;
	unsigned max_files;
	uint64_t max_bytes;
	uid_t *scanned;    /* (n_scanned,) uids whose files were listed */
	size_t n_scanned;
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

void prefixcache_set_io(PrefixCache *pc, const PrefixCacheIO *io, unsigned max_files, uint64_t max_bytes)
{
	pc->has_io = io != NULL;
	if (io)
		pc->io = *io;
	pc->max_files = max_files;
	pc->max_bytes = max_bytes;
}

uint64_t prefixcache_hash(const int32_t *tokens, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		for (int b = 0; b < 4; b++) {
			h ^= ((uint32_t)tokens[i] >> (8 * b)) & 0xff;
			h *= 0x100000001b3ull;
		}
	return h;
}

/* "<n_a>-<A>-<n_b>-<B>.tkvs": two u32 in decimal, two u64 in 16 hex digits, three dashes, the suffix, NUL */
static_assert(PREFIXCACHE_NAME_MAX >= 2 * 10 + 2 * 16 + 3 + 5 + 1, "a spilled entry's name must fit");

static void key_name(uint32_t n_a, uint64_t h_a, uint32_t n_b, uint64_t h_b, char buf[PREFIXCACHE_NAME_MAX])
{
	snprintf(buf, PREFIXCACHE_NAME_MAX, "%" PRIu32 "-%016" PRIx64 "-%" PRIu32 "-%016" PRIx64 ".tkvs", n_a, h_a,
		 n_b, h_b);
}

static void entry_remove(PrefixCache *pc, size_t i)
{
	pc->bytes -= pc->entries[i].bytes;
	kvcache_free(pc->entries[i].kv);
	free(pc->entries[i].tokens);
	pc->entries[i] = pc->entries[--pc->n];
}

/* Forget spilled entry i and delete its file. */
static void entry_delete(PrefixCache *pc, size_t i)
{
	Entry *e = &pc->entries[i];
	if (pc->has_io)
		pc->io.remove(pc->io.userdata, e->uid, e->name);
	entry_remove(pc, i);
}

PrefixCache *prefixcache_free(PrefixCache *pc)
{
	if (!pc)
		return NULL;
	while (pc->n)
		entry_remove(pc, pc->n - 1);
	free(pc->entries);
	free(pc->scanned);
	free(pc);
	return NULL;
}

static Entry *entry_add(PrefixCache *pc)
{
	if (pc->n == pc->cap) {
		size_t cap = pc->cap ? pc->cap * 2 : 8;
		Entry *p = realloc(pc->entries, cap * sizeof(*p));
		if (!p)
			return NULL;
		pc->entries = p;
		pc->cap = cap;
	}
	Entry *e = &pc->entries[pc->n++];
	*e = (Entry){ 0 };
	return e;
}

/* The entry of uid named name in state where; SIZE_MAX if none. */
static size_t entry_named(const PrefixCache *pc, uid_t uid, const char *name, EntryWhere where)
{
	for (size_t i = 0; i < pc->n; i++)
		if (pc->entries[i].uid == uid && pc->entries[i].where == where && strcmp(pc->entries[i].name, name) == 0)
			return i;
	return SIZE_MAX;
}

/*
 * Tokens of tokens (n,) that memory entry e shares with them, at most
 * n - 1; 0 when its windows forbid, or when that is less than half of
 * what it holds (prefixcache.h).
 */
static size_t entry_common(const Entry *e, const int32_t *tokens, size_t n)
{
	size_t limit = MIN(MIN((size_t)kvcache_n_tokens(e->kv), e->n_tokens), n - 1), keep = 0;
	while (keep < limit && e->tokens[keep] == tokens[keep])
		keep++;
	if ((int64_t)keep < kvcache_rewind_floor(e->kv))
		keep = 0; /* its windowed layers dropped what a query there would see */
	if (keep < (size_t)kvcache_n_tokens(e->kv) / 2)
		keep = 0; /* another conversation (a system prompt in common): it stays for its own */
	return keep;
}

/*
 * The prefix of tokens (n,) spilled entry e's key vouches for, at most
 * n - 1 (a request repeating the prompt whole reuses all but its last
 * token); 0 if none.
 */
static size_t entry_key_match(const Entry *e, const int32_t *tokens, size_t n)
{
	size_t len = 0;
	if (e->n_a <= n && prefixcache_hash(tokens, e->n_a) == e->h_a)
		len = MIN((size_t)e->n_a, n - 1);
	else if (e->n_b > 0 && e->n_b <= n && prefixcache_hash(tokens, e->n_b) == e->h_b)
		len = MIN((size_t)e->n_b, n - 1);
	/* entry_common()'s rule, so that a file is loaded only when take() would
	 * reuse it: loading one it then refuses would load it again and again */
	return len < (size_t)e->n_a / 2 ? 0 : len;
}

KvCache *prefixcache_take(PrefixCache *pc, uid_t uid, const int32_t *tokens, size_t n, int64_t capacity,
			  size_t *ret_keep)
{
	size_t best = SIZE_MAX, best_keep = 0;
	if (!pc || n < 2)
		return NULL;
	for (size_t i = 0; i < pc->n; i++) {
		const Entry *e = &pc->entries[i];
		if (e->uid != uid || e->where != ENTRY_MEMORY || e->kv->shape.capacity < capacity)
			continue;
		size_t keep = entry_common(e, tokens, n);
		if (keep > best_keep) {
			best = i;
			best_keep = keep;
		}
	}
	if (best == SIZE_MAX)
		return NULL;
	KvCache *kv = TAKE_PTR(pc->entries[best].kv);
	entry_remove(pc, best);
	kvcache_set_n_tokens(kv, (int64_t)best_keep);
	*ret_keep = best_keep;
	return kv;
}

/* The least recently used entry in state where (of uid, or of anyone when all is true); SIZE_MAX if none. */
static size_t entry_lru(const PrefixCache *pc, uid_t uid, bool all, EntryWhere where)
{
	size_t best = SIZE_MAX;
	for (size_t i = 0; i < pc->n; i++) {
		const Entry *e = &pc->entries[i];
		if ((all || e->uid == uid) && e->where == where && (best == SIZE_MAX || e->used < pc->entries[best].used))
			best = i;
	}
	return best;
}

/* Delete uid's least recently used files while it has more than max_files (minus room) or max_bytes. */
static void disk_enforce(PrefixCache *pc, uid_t uid, unsigned room)
{
	for (;;) {
		size_t files = 0;
		uint64_t bytes = 0;
		for (size_t i = 0; i < pc->n; i++) {
			const Entry *e = &pc->entries[i];
			if (e->uid == uid && e->where != ENTRY_MEMORY) {
				files++;
				bytes += e->disk_bytes;
			}
		}
		if (files + room <= pc->max_files && bytes <= pc->max_bytes)
			return;
		size_t lru = entry_lru(pc, uid, false, ENTRY_ON_DISK);
		if (lru == SIZE_MAX)
			return;
		entry_delete(pc, lru);
	}
}

/*
 * Memory entry i goes: spilled through the io (its key computed, its
 * cache and tokens handed over), else freed. Indices of other entries
 * may change (the io may report at once).
 */
static void entry_spill(PrefixCache *pc, size_t i, bool now)
{
	Entry *e = &pc->entries[i];
	int64_t n_kv = kvcache_n_tokens(e->kv);
	if (!pc->has_io || pc->max_files == 0 || n_kv < 2 || n_kv > UINT32_MAX) {
		entry_remove(pc, i);
		return;
	}
	uint32_t n_a = (uint32_t)n_kv, n_b = (uint32_t)MIN((size_t)n_a, e->n_prompt);
	char name[PREFIXCACHE_NAME_MAX];
	key_name(n_a, prefixcache_hash(e->tokens, n_a), n_b, prefixcache_hash(e->tokens, n_b), name);
	for (size_t j = 0; j < pc->n; j++)
		if (j != i && pc->entries[j].uid == e->uid && pc->entries[j].where != ENTRY_MEMORY &&
		    strcmp(pc->entries[j].name, name) == 0) {
			entry_remove(pc, i); /* the very same tokens are on disk already */
			return;
		}
	/* now an entry being written: only its key stays here */
	uid_t uid = e->uid;
	KvCache *kv = TAKE_PTR(e->kv);
	int32_t *tokens = TAKE_PTR(e->tokens);
	size_t n_tokens = e->n_tokens;
	pc->bytes -= e->bytes;
	e->bytes = 0;
	e->where = ENTRY_SAVING;
	e->n_a = n_a;
	e->n_b = n_b;
	e->h_a = prefixcache_hash(tokens, n_a);
	e->h_b = prefixcache_hash(tokens, n_b);
	memcpy(e->name, name, sizeof(name));
	disk_enforce(pc, uid, 0); /* older files go first; this one counts */
	pc->io.save(pc->io.userdata, uid, name, kv, tokens, n_tokens, now);
}

/* Delete uid's files whose whole cache is a prefix of tokens (n,), kept in memory now. */
static void disk_supersede(PrefixCache *pc, uid_t uid, const int32_t *tokens, size_t n)
{
	for (size_t i = pc->n; i-- > 0;) {
		const Entry *e = &pc->entries[i];
		if (e->uid == uid && e->where == ENTRY_ON_DISK && e->n_a <= n && prefixcache_hash(tokens, e->n_a) == e->h_a)
			entry_delete(pc, i);
	}
}

int prefixcache_put(PrefixCache *pc, uid_t uid, KvCache *kv, const int32_t *tokens, size_t n_tokens,
		    size_t n_prompt, uint64_t budget)
{
	if (!pc || pc->per_uid == 0 || kvcache_n_tokens(kv) < 1) {
		kvcache_free(kv);
		return 0;
	}
	uint64_t bytes = kvcache_memory_bytes(kv) + n_tokens * sizeof(int32_t);
	if (pc->has_io)
		disk_supersede(pc, uid, tokens, MIN(n_tokens, (size_t)kvcache_n_tokens(kv)));
	bool too_big = bytes > budget; /* larger than the whole budget: straight to disk, or gone */
	if (too_big && !pc->has_io) {
		kvcache_free(kv);
		return 0;
	}
	if (!too_big && prefixcache_n_entries(pc, uid) >= pc->per_uid)
		entry_spill(pc, entry_lru(pc, uid, false, ENTRY_MEMORY), false);
	for (size_t lru; !too_big && pc->bytes + bytes > budget &&
			 (lru = entry_lru(pc, uid, true, ENTRY_MEMORY)) != SIZE_MAX;)
		entry_spill(pc, lru, false);
	Entry *e = entry_add(pc);
	int32_t *t = e ? malloc_array(n_tokens ? n_tokens : 1, sizeof(int32_t)) : NULL;
	if (!t) {
		if (e)
			pc->n--;
		kvcache_free(kv);
		return -ENOMEM;
	}
	memcpy(t, tokens, n_tokens * sizeof(int32_t));
	*e = (Entry){ .uid = uid, .where = ENTRY_MEMORY, .tokens = t, .n_tokens = n_tokens, .n_prompt = n_prompt,
		      .kv = kv, .used = ++pc->clock, .bytes = bytes };
	pc->bytes += bytes;
	if (too_big)
		entry_spill(pc, pc->n - 1, false);
	return 0;
}

void prefixcache_spill_all(PrefixCache *pc)
{
	for (size_t i; pc && (i = entry_lru(pc, 0, true, ENTRY_MEMORY)) != SIZE_MAX;)
		entry_spill(pc, i, true);
}

/* List uid's files once (io->scan, then the bounds). */
static void disk_scan(PrefixCache *pc, uid_t uid)
{
	for (size_t i = 0; i < pc->n_scanned; i++)
		if (pc->scanned[i] == uid)
			return;
	uid_t *p = realloc(pc->scanned, (pc->n_scanned + 1) * sizeof(*p));
	if (!p)
		return;
	pc->scanned = p;
	pc->scanned[pc->n_scanned++] = uid;
	pc->io.scan(pc->io.userdata, uid);
	disk_enforce(pc, uid, 0);
}

bool prefixcache_prepare(PrefixCache *pc, uid_t uid, const int32_t *tokens, size_t n)
{
	if (!pc || !pc->has_io || pc->per_uid == 0 || n < 2)
		return false;
	disk_scan(pc, uid);
	if (prefixcache_loading(pc, uid))
		return true;
	size_t best_mem = 0, best = SIZE_MAX, best_len = 0;
	for (size_t i = 0; i < pc->n; i++) {
		const Entry *e = &pc->entries[i];
		if (e->uid == uid && e->where == ENTRY_MEMORY)
			best_mem = MAX(best_mem, entry_common(e, tokens, n));
	}
	for (size_t i = 0; i < pc->n; i++) {
		const Entry *e = &pc->entries[i];
		bool spilled = e->where == ENTRY_ON_DISK || e->where == ENTRY_SAVING;
		size_t len = e->uid == uid && spilled ? entry_key_match(e, tokens, n) : 0;
		if (len > best_mem && len > best_len) {
			best = i;
			best_len = len;
		}
	}
	if (best == SIZE_MAX)
		return false;
	if (pc->entries[best].where == ENTRY_SAVING)
		return true; /* being written: wait for its end, then load it */
	pc->entries[best].where = ENTRY_LOADING;
	pc->io.load(pc->io.userdata, uid, pc->entries[best].name);
	return true;
}

bool prefixcache_loading(const PrefixCache *pc, uid_t uid)
{
	for (size_t i = 0; pc && i < pc->n; i++)
		if (pc->entries[i].uid == uid && pc->entries[i].where == ENTRY_LOADING)
			return true;
	return false;
}

void prefixcache_saved(PrefixCache *pc, uid_t uid, const char *name, int r, uint64_t bytes)
{
	size_t i = entry_named(pc, uid, name, ENTRY_SAVING);
	if (i == SIZE_MAX)
		return;
	if (r != 0) {
		entry_remove(pc, i); /* nothing on disk (the writer leaves no partial file) */
		return;
	}
	pc->entries[i].where = ENTRY_ON_DISK;
	pc->entries[i].disk_bytes = bytes;
	disk_enforce(pc, uid, 0);
}

void prefixcache_loaded(PrefixCache *pc, uid_t uid, const char *name, int r, KvCache *kv, int32_t *tokens,
			size_t n_tokens, uint64_t budget)
{
	size_t i = entry_named(pc, uid, name, ENTRY_LOADING);
	if (i == SIZE_MAX) {
		kvcache_free(kv);
		free(tokens);
		return;
	}
	size_t n_prompt = pc->entries[i].n_b;
	/* in memory now (or damaged): the file is superseded either way; a system error only forgets it */
	if (r >= 0 || r == -ENOENT)
		entry_delete(pc, i);
	else
		entry_remove(pc, i);
	if (r == 0)
		(void)prefixcache_put(pc, uid, kv, tokens, n_tokens, n_prompt, budget);
	else
		kvcache_free(kv);
	free(tokens);
}

/* Parse a spilled entry's file name strictly: it must be what key_name() writes. */
static bool key_parse(const char *name, uint32_t *n_a, uint64_t *h_a, uint32_t *n_b, uint64_t *h_b)
{
	char again[PREFIXCACHE_NAME_MAX];
	unsigned long long a, b, x, y;
	if (strlen(name) >= PREFIXCACHE_NAME_MAX || sscanf(name, "%10llu-%16llx-%10llu-%16llx.tkvs", &a, &x, &b, &y) != 4 ||
	    a > UINT32_MAX || b > a || a < 2)
		return false;
	key_name((uint32_t)a, x, (uint32_t)b, y, again);
	if (strcmp(again, name) != 0)
		return false;
	*n_a = (uint32_t)a;
	*n_b = (uint32_t)b;
	*h_a = x;
	*h_b = y;
	return true;
}

bool prefixcache_found(PrefixCache *pc, uid_t uid, const char *name, uint64_t bytes)
{
	uint32_t n_a, n_b;
	uint64_t h_a, h_b;
	if (!key_parse(name, &n_a, &h_a, &n_b, &h_b))
		return false;
	for (size_t i = 0; i < pc->n; i++)
		if (pc->entries[i].uid == uid && strcmp(pc->entries[i].name, name) == 0)
			return true;
	Entry *e = entry_add(pc);
	if (!e)
		return true;
	*e = (Entry){ .uid = uid, .where = ENTRY_ON_DISK, .n_a = n_a, .n_b = n_b, .h_a = h_a, .h_b = h_b,
		      .disk_bytes = bytes };
	memcpy(e->name, name, strlen(name) + 1);
	return true;
}

size_t prefixcache_n_entries(const PrefixCache *pc, uid_t uid)
{
	size_t k = 0;
	for (size_t i = 0; pc && i < pc->n; i++)
		k += pc->entries[i].uid == uid && pc->entries[i].where == ENTRY_MEMORY;
	return k;
}

size_t prefixcache_n_spilled(const PrefixCache *pc, uid_t uid)
{
	size_t k = 0;
	for (size_t i = 0; pc && i < pc->n; i++)
		k += pc->entries[i].uid == uid && pc->entries[i].where != ENTRY_MEMORY;
	return k;
}

uint64_t prefixcache_bytes(const PrefixCache *pc)
{
	return pc ? pc->bytes : 0;
}
