/*
 * test-prefixcache.c: daemon/prefixcache.c on its own: the longest
 * prefix wins, entries are never found by another uid, a taken entry is
 * gone until put back, and the per-uid count and the byte budget evict
 * the least recently used. Real f32 caches of a tiny shape hold the
 * tokens (the cache only counts them here; nothing is evaluated).
 */
#include <check.h>
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
	ck_assert_int_eq(prefixcache_put(pc, 1000, cache_of(6), a, 6, 1 << 30), 0);
	ck_assert_int_eq(prefixcache_put(pc, 1000, cache_of(4), b, 4, 1 << 30), 0);
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
	ck_assert_int_eq(prefixcache_put(pc, 1000, cache_of(6), a, 6, 1 << 30), 0);
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
		ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), t[i], 4, 1 << 30), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 2); /* the oldest went */
	ck_assert_ptr_null(prefixcache_take(pc, 7, t[0], 4, 1, &keep));
	/* another uid's entry does not count against uid 7, but shares the budget */
	uint64_t one = prefixcache_bytes(pc) / 2;
	ck_assert_int_eq(prefixcache_put(pc, 8, cache_of(4), t[0], 4, 2 * one), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 8), 1);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 1); /* the budget of two took uid 7's oldest */
	ck_assert_ptr_null(prefixcache_take(pc, 7, t[1], 4, 1, &keep));
	KvCache *kv = prefixcache_take(pc, 7, t[2], 4, 1, &keep);
	ck_assert_ptr_nonnull(kv);
	kvcache_free(kv);
	/* an entry larger than the whole budget is not kept; disabled keeps nothing */
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), t[2], 4, 1), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 0);
	prefixcache_free(pc);
	ck_assert_int_eq(prefixcache_new(0, &pc), 0);
	ck_assert_int_eq(prefixcache_put(pc, 7, cache_of(4), t[2], 4, 1 << 30), 0);
	ck_assert_uint_eq(prefixcache_n_entries(pc, 7), 0);
	prefixcache_free(pc);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("prefixcache");
	TCase *tc = tcase_create("prefixcache");
	tcase_add_test(tc, test_longest_prefix_same_uid_only);
	tcase_add_test(tc, test_eviction);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
