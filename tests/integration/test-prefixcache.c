/*
 * test-prefixcache.c: daemon/prefixcache.c on its own: the longest
 * prefix wins, entries are never found by another uid, a taken entry is
 * gone until put back, and the per-uid count and the byte budget evict
 * the least recently used. Real f32 caches of a tiny shape hold the
 * tokens (the cache only counts them here; nothing is evaluated).
 * The spill half runs against a fake PrefixCacheIO, a table of "files"
 * in memory that answers at once: what is written, loaded and deleted,
 * and for whom.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prefixcache.h"

static const KvCacheShape SHAPE = { .n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 4, .capacity = 64 };

/* An f32 cache that claims to hold n tokens. */
static KvCache *cache_of(int64_t n)
{
	KvCache *kv = NULL;
	ck_assert_int_eq(kvcache_new_f32(&SHAPE, &kv), 0);
	kvcache_set_n_tokens(kv, n);
	return kv;
}

START_TEST(test_longest_prefix_same_uid_only)
{
	PrefixCache *pc = NULL;
	int32_t a[] = { 1, 2, 3, 4, 5, 6 }, b[] = { 1, 2, 9, 9 }, q[] = { 1, 2, 3, 4, 7, 7, 7 };
	size_t keep = 99;
	ck_assert_int_eq(prefixcache_new(4, &pc), 0);
	ck_assert_int_eq(prefixcache_put(pc, 1000, cache_of(6), a, 6, 6, 1 << 30), 0);
	ck_assert_int_eq(prefixcache_put(pc, 1000, cache_of(4), b, 4, 4, 1 << 30), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 1000), 2);
	/* another uid with the very same prompt finds nothing, and takes nothing */
	ck_assert_ptr_null(prefixcache_take(pc, 1001, q, 7, 64, &keep));
	ck_assert_uint_eq(keep, 99);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 1000), 2);
	/* the owner gets the longest common prefix, rewound there */
	KvCache *kv = prefixcache_take(pc, 1000, q, 7, 64, &keep);
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(keep, 4);
	ck_assert_int_eq(kvcache_n_tokens(kv), 4);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 1000), 1); /* taken out while in use */
	kvcache_free(kv);
	/* never the whole prompt: its last token is evaluated again */
	kv = prefixcache_take(pc, 1000, b, 4, 64, &keep);
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(keep, 3);
	kvcache_free(kv);
	/* a cache smaller than the request needs is not taken */
	ck_assert_int_eq(prefixcache_put(pc, 1000, cache_of(6), a, 6, 6, 1 << 30), 0);
	ck_assert_ptr_null(prefixcache_take(pc, 1000, q, 7, 65, &keep));
	prefixcache_free(pc);
}
END_TEST

START_TEST(test_eviction)
{
	PrefixCache *pc = NULL;
	int32_t t[3][4] = { { 1, 1, 1, 1 }, { 2, 2, 2, 2 }, { 3, 3, 3, 3 } };
	size_t keep;
	ck_assert_int_eq(prefixcache_new(2, &pc), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), t[i], 4, 4, 1 << 30), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 2); /* the oldest went */
	ck_assert_ptr_null(prefixcache_take(pc, 7, t[0], 4, 1, &keep));
	/* another uid's entry does not count against uid 7, but shares the budget */
	uint64_t one = prefixcache_bytes(pc) / 2;
	ck_assert_int_eq(prefixcache_put(pc, 8, cache_of(4), t[0], 4, 4, 2 * one), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 8), 1);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 1); /* the budget of two took uid 7's oldest */
	ck_assert_ptr_null(prefixcache_take(pc, 7, t[1], 4, 1, &keep));
	KvCache *kv = prefixcache_take(pc, 7, t[2], 4, 1, &keep);
	ck_assert_ptr_nonnull(kv);
	kvcache_free(kv);
	/* an entry larger than the whole budget is not kept; disabled keeps nothing */
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), t[2], 4, 4, 1), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 0);
	prefixcache_free(pc);
	ck_assert_int_eq(prefixcache_new(0, &pc), 0);
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), t[2], 4, 4, 1 << 30), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 0);
	prefixcache_free(pc);
}
END_TEST

/* ---- the spill half, against a disk in memory ---- */

typedef struct FakeFile {
	uid_t uid;
	char name[PREFIXCACHE_NAME_MAX];
	KvCache *kv;
	int32_t *tokens;
	size_t n;
	int damaged;      /* a SESSION_E_* code its load reports */
} FakeFile;

typedef struct FakeDisk {
	PrefixCache *pc;
	FakeFile files[16];
	size_t n;
	unsigned saves, loads, removes, scans;
} FakeDisk;

static void fake_save(void *u, uid_t uid, const char *name, KvCache *kv, int32_t *tokens, size_t n, bool now)
{
	FakeDisk *d = u;
	ck_assert_uint_lt(d->n, 16);
	FakeFile *f = &d->files[d->n++];
	*f = (FakeFile){ .uid = uid, .kv = kv, .tokens = tokens, .n = n };
	snprintf(f->name, sizeof(f->name), "%s", name);
	d->saves++;
	prefixcache_saved(d->pc, uid, name, 0, 1000);
}

static FakeFile *fake_find(FakeDisk *d, uid_t uid, const char *name)
{
	for (size_t i = 0; i < d->n; i++)
		if (d->files[i].uid == uid && strcmp(d->files[i].name, name) == 0)
			return &d->files[i];
	return NULL;
}

static void fake_load(void *u, uid_t uid, const char *name)
{
	FakeDisk *d = u;
	FakeFile *f = fake_find(d, uid, name);
	ck_assert_ptr_nonnull(f); /* only ever asked for the uid's own files */
	d->loads++;
	if (f->damaged)
		prefixcache_loaded(d->pc, uid, name, f->damaged, NULL, NULL, 0, 1 << 30);
	else
		prefixcache_loaded(d->pc, uid, name, 0, TAKE_PTR(f->kv), TAKE_PTR(f->tokens), f->n, 1 << 30);
}

static void fake_remove(void *u, uid_t uid, const char *name)
{
	FakeDisk *d = u;
	FakeFile *f = fake_find(d, uid, name);
	ck_assert_ptr_nonnull(f);
	kvcache_free(f->kv);
	free(f->tokens);
	*f = d->files[--d->n];
	d->removes++;
}

static void fake_scan(void *u, uid_t uid)
{
	((FakeDisk *)u)->scans++;
}

static PrefixCache *spilling_cache(FakeDisk *d, unsigned per_uid, unsigned max_files)
{
	static const PrefixCacheIO io = { .save = fake_save, .load = fake_load, .remove = fake_remove,
					  .scan = fake_scan };
	PrefixCacheIO mine = io;
	*d = (FakeDisk){ 0 };
	ck_assert_int_eq(prefixcache_new(per_uid, &d->pc), 0);
	mine.userdata = d;
	prefixcache_set_io(d->pc, &mine, max_files, 1 << 30);
	return d->pc;
}

static void fake_done(FakeDisk *d)
{
	prefixcache_free(d->pc);
	while (d->n)
		fake_remove(d, d->files[d->n - 1].uid, d->files[d->n - 1].name);
}

START_TEST(test_spill_and_reload)
{
	FakeDisk d;
	PrefixCache *pc = spilling_cache(&d, 1, 8);
	int32_t a[] = { 1, 2, 3, 4, 5, 6 }, b[] = { 9, 9, 9, 9 }, a2[] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	size_t keep = 0;
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(5), a, 6, 4, 1 << 30), 0);
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), b, 4, 4, 1 << 30), 0);
	/* one in memory per uid: a went to disk, keyed by its 5 cached tokens and its 4-token prompt */
	ck_assert_uint_eq(d.saves, 1);
	ck_assert_uint_eq(prefixcache_n_spilled(pc, 7), 1);
	char want[PREFIXCACHE_NAME_MAX];
	snprintf(want, sizeof(want), "5-%016llx-4-%016llx.tkvs", (unsigned long long)prefixcache_hash(a, 5),
		 (unsigned long long)prefixcache_hash(a, 4));
	ck_assert_str_eq(d.files[0].name, want);
	ck_assert_uint_eq(d.files[0].n, 6);
	/* another uid with a's continuation finds nothing and reads nothing */
	ck_assert(!prefixcache_prepare(pc, 8, a2, 8));
	ck_assert_uint_eq(d.loads, 0);
	/* the owner's continuation loads it; the file goes, the cache is in memory with all 5 tokens */
	ck_assert(prefixcache_prepare(pc, 7, a2, 8));
	ck_assert_uint_eq(d.loads, 1);
	ck_assert_uint_eq(d.n, 1); /* b, spilled to make room for a */
	ck_assert_str_ne(d.files[0].name, want);
	ck_assert(!prefixcache_loading(pc, 7));
	KvCache *kv = prefixcache_take(pc, 7, a2, 8, 1, &keep);
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(keep, 5);
	kvcache_free(kv);
	/* only the prompt part matches (the answer was retokenized): key B still finds it */
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(5), a, 6, 4, 1 << 30), 0);
	int32_t other[] = { 5, 5, 5 };
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(3), other, 3, 3, 1 << 30), 0); /* a to disk again */
	int32_t a3[] = { 1, 2, 3, 4, 42, 43 };
	unsigned loads = d.loads;
	prefixcache_prepare(pc, 7, a3, 6);
	ck_assert_uint_eq(d.loads, loads + 1);
	kv = prefixcache_take(pc, 7, a3, 6, 1, &keep);
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(keep, 4);
	kvcache_free(kv);
	/* the same short question again after a long answer: its prompt key matches, but take() would
	 * refuse a cache it shares under half of; prepare must not load it (two such files, one memory
	 * slot: loading each spilled the other, again and again, and the request waited forever) */
	int32_t longer[12] = { 1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17, 18 }, again[] = { 1, 2, 3, 99 };
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(11), longer, 12, 3, 1 << 30), 0);
	longer[5] = 77; /* a second answer to it */
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(11), longer, 12, 3, 1 << 30), 0);
	loads = d.loads;
	for (int i = 0; i < 4; i++)
		ck_assert(!prefixcache_prepare(pc, 7, again, 4));
	ck_assert_uint_eq(d.loads, loads);
	ck_assert_ptr_null(prefixcache_take(pc, 7, again, 4, 1, &keep));
	fake_done(&d);
}
END_TEST

START_TEST(test_spill_bounds_supersede_damage)
{
	FakeDisk d;
	PrefixCache *pc = spilling_cache(&d, 1, 2);
	int32_t t[4][4] = { { 1, 1, 1, 1 }, { 2, 2, 2, 2 }, { 3, 3, 3, 3 }, { 4, 4, 4, 4 } };
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), t[i], 4, 2, 1 << 30), 0);
	/* three spilled, two files kept: the oldest went */
	ck_assert_uint_eq(d.saves, 3);
	ck_assert_uint_eq(d.n, 2);
	ck_assert_uint_eq(prefixcache_n_spilled(pc, 7), 2);
	ck_assert(!prefixcache_prepare(pc, 7, (int32_t[]){ 1, 1, 1, 1, 1 }, 5));
	/* a new entry holding a spilled one's tokens as its prefix supersedes its file */
	int32_t longer[] = { 2, 2, 2, 2, 2, 2 };
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(6), longer, 6, 5, 1 << 30), 0);
	ck_assert_uint_eq(d.removes, 2);
	/* a damaged file: its load fails, it is deleted, and the next request does not try it again */
	ck_assert_uint_eq(d.n, 2); /* t[2] and t[3] (spilled when longer came) */
	for (size_t i = 0; i < d.n; i++)
		d.files[i].damaged = 5; /* SESSION_E_HEADER */
	int32_t q[] = { 3, 3, 3, 3, 9 };
	ck_assert(prefixcache_prepare(pc, 7, q, 5));
	ck_assert_uint_eq(d.loads, 1);
	ck_assert_uint_eq(d.n, 1);
	ck_assert(!prefixcache_loading(pc, 7));
	size_t keep;
	ck_assert_ptr_null(prefixcache_take(pc, 7, q, 5, 1, &keep));
	ck_assert(!prefixcache_prepare(pc, 7, q, 5));
	ck_assert_uint_eq(d.loads, 1);
	/* shutdown: what is in memory is written */
	unsigned saves = d.saves;
	prefixcache_spill_all(pc);
	ck_assert_uint_eq(d.saves, saves + 1);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 0);
	fake_done(&d);
}
END_TEST

START_TEST(test_spill_names)
{
	FakeDisk d;
	PrefixCache *pc = spilling_cache(&d, 4, 8);
	ck_assert(prefixcache_found(pc, 7, "12-00000000000000ab-3-00000000000000cd.tkvs", 10));
	static const char *const bad[] = {
		"12-ab-3-cd.tkvs", "12-00000000000000AB-3-00000000000000cd.tkvs", "012-00000000000000ab-3-00000000000000cd.tkvs",
		"3-00000000000000ab-12-00000000000000cd.tkvs", "12-00000000000000ab-3-00000000000000cd.tkvs.tmp",
		"+12-00000000000000ab-3-00000000000000cd.tkvs", "chat.tkvs", "../12-00000000000000ab-3-00000000000000cd.tkvs",
		"1-00000000000000ab-1-00000000000000cd.tkvs", "99999999999-00000000000000ab-3-00000000000000cd.tkvs", "",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		ck_assert_msg(!prefixcache_found(pc, 7, bad[i], 10), "%s taken", bad[i]);
	ck_assert_uint_eq(prefixcache_n_spilled(pc, 7), 1);
	ck_assert_uint_eq(prefixcache_n_spilled(pc, 8), 0);
	prefixcache_free(pc);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("prefixcache");
	TCase *tc = tcase_create("prefixcache");
	tcase_add_test(tc, test_longest_prefix_same_uid_only);
	tcase_add_test(tc, test_eviction);
	tcase_add_test(tc, test_spill_and_reload);
	tcase_add_test(tc, test_spill_bounds_supersede_damage);
	tcase_add_test(tc, test_spill_names);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
