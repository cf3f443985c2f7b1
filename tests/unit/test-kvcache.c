/*
 * test-kvcache.c: the f32 cache's attention against a double-precision
 * evaluation of the definition, with GQA, batches that start mid-cache,
 * and the bookkeeping errors (append past capacity, out of order).
 */
#include <math.h>
#include <string.h>

#include "engine/kv/kvcache.h"
#include "tests/unit/testutil.h"

enum { L = 2, H = 6, KVH = 2, D = 16, CAP = 40 };

/* out_h = softmax(q_h . k_p / sqrt(D)) v_p over p <= pos, for kv-head h / (H/KVH) */
static void reference(const float *k, const float *v, const float *q, int64_t pos, int h, double *out)
{
	int kvh = h / (H / KVH);
	double s[CAP], max = -INFINITY, sum = 0;
	for (int64_t p = 0; p <= pos; p++) {
		double dot = 0;
		for (int i = 0; i < D; i++)
			dot += (double)q[h * D + i] * k[(p * KVH + kvh) * D + i];
		s[p] = dot / sqrt((double)D);
		max = fmax(max, s[p]);
	}
	for (int64_t p = 0; p <= pos; p++)
		sum += s[p] = exp(s[p] - max);
	for (int i = 0; i < D; i++) {
		out[i] = 0;
		for (int64_t p = 0; p <= pos; p++)
			out[i] += s[p] / sum * v[(p * KVH + kvh) * D + i];
	}
}

static void check_batches(int n_threads, const int64_t *batches, int n_batches)
{
	uint64_t st = test_seed() + (uint64_t)n_threads;
	static float k[L][CAP * KVH * D], v[L][CAP * KVH * D], q[CAP * H * D], out[CAP * H * D];
	for (int l = 0; l < L; l++)
		for (int i = 0; i < CAP * KVH * D; i++) {
			k[l][i] = test_rand_normal(&st);
			v[l][i] = test_rand_normal(&st);
		}
	for (int i = 0; i < CAP * H * D; i++)
		q[i] = 2.0f * test_rand_normal(&st);

	KvCacheShape shape = { .n_layers = L, .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .capacity = CAP };
	KvCache *kv = NULL;
	ThreadPool *tp = NULL;
	ck_assert_int_eq(kvcache_new_f32(&shape, &kv), 0);
	ck_assert_int_eq(threadpool_new(n_threads, &tp), 0);
	ck_assert_uint_eq(kvcache_bytes_per_token(kv), 2 * L * KVH * D * sizeof(float));

	int64_t pos0 = 0;
	for (int b = 0; b < n_batches; b++) {
		int64_t n = batches[b];
		for (int l = 0; l < L; l++) {
			ck_assert_int_eq(kvcache_append(kv, l, pos0, n, k[l] + pos0 * KVH * D,
							v[l] + pos0 * KVH * D), 0);
			kvcache_attend(kv, tp, l, pos0, n, q + pos0 * H * D, out + pos0 * H * D);
			for (int64_t t = 0; t < n; t++)
				for (int h = 0; h < H; h++) {
					double want[D];
					reference(k[l], v[l], q + (pos0 + t) * H * D, pos0 + t, h, want);
					for (int i = 0; i < D; i++) {
						float got = out[((pos0 + t) * H + h) * D + i];
						ck_assert_msg(fabs(got - want[i]) < 1e-5 * (1 + fabs(want[i])),
							      "layer %d pos %lld head %d dim %d: %g vs %g", l,
							      (long long)(pos0 + t), h, i, got, want[i]);
					}
				}
		}
		pos0 += n;
		kvcache_set_n_tokens(kv, pos0);
	}
	kvcache_free(kv);
	threadpool_free(tp);
}

START_TEST(f32_attention_matches_definition)
{
	const int64_t prefill_then_decode[] = { 13, 1, 1, 7, 1 };
	const int64_t one_by_one[] = { 1, 1, 1, 1, 1, 1 };
	check_batches(1, prefill_then_decode, 5);
	check_batches(3, prefill_then_decode, 5);
	check_batches(2, one_by_one, 6);
}
END_TEST

START_TEST(append_bounds_and_order)
{
	KvCacheShape shape = { .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .capacity = 3 };
	KvCache *kv = NULL;
	float buf[4 * 4] = { 0 };
	ck_assert_int_eq(kvcache_new_f32(&shape, &kv), 0);
	ck_assert_int_eq(kvcache_append(kv, 0, 1, 1, buf, buf), KVCACHE_E_POSITION);
	ck_assert_int_eq(kvcache_append(kv, 0, 0, 4, buf, buf), KVCACHE_E_FULL);
	ck_assert_int_eq(kvcache_append(kv, 0, 0, 3, buf, buf), 0);
	kvcache_set_n_tokens(kv, 3);
	ck_assert_int_eq(kvcache_append(kv, 0, 3, 1, buf, buf), KVCACHE_E_FULL);
	kvcache_free(kv);

	KvCacheShape bad = shape;
	bad.n_heads = 3;
	bad.n_kv_heads = 2; /* heads not a multiple of kv heads */
	ck_assert_int_eq(kvcache_new_f32(&bad, &kv), -EINVAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kvcache");
	TCase *tc = tcase_create("f32");
	tcase_add_test(tc, f32_attention_matches_definition);
	tcase_add_test(tc, append_bounds_and_order);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
