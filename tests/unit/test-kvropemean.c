/*
 * test-kvropemean.c: the keys' mean before RoPE and its block centers
 * (engine/kv/kvropemean.h) against a double reference, at positions up to
 * the tables' last block; and the centering it replaced, kept float for
 * float where no RoPE is known.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kvcenter.h"
#include "engine/kv/kvropemean.h"
#include "tests/unit/testutil.h"

enum { D = 256, G = 4, BT = KV_BLOCK_TOKENS };

/* Channels of pair i under style (ops.h): j and j + partner. */
static void pair_of(RopeStyle style, int n_rot, int i, int *j, int *j2)
{
	*j = style == ROPE_STYLE_NEOX ? i : 2 * i;
	*j2 = *j + (style == ROPE_STYLE_NEOX ? n_rot / 2 : 1);
}

/* Block 0's keys: R(theta p) (c + noise) on the rotated pairs, c + noise elsewhere, kept by kc. */
static void fill_block0(KvCenter *kc, const Rope *rope, const double *c, uint64_t *st)
{
	float k[BT * D];
	int P = rope->n_rot / 2;
	for (int p = 0; p < BT; p++) {
		float *row = k + p * D;
		for (int j = 0; j < D; j++)
			row[j] = (float)(c[j] + 0.3 * test_rand_normal(st));
		for (int i = 0; i < P; i++) {
			int j, j2;
			pair_of(rope->style, rope->n_rot, i, &j, &j2);
			double a = (double)p * rope->inv_freq[i], x = row[j], y = row[j2];
			row[j] = (float)(x * cos(a) - y * sin(a));
			row[j2] = (float)(x * sin(a) + y * cos(a));
		}
	}
	ck_assert_int_eq(kvcenter_keep(kc, 0, BT, k, D), 0);
	ck_assert(kc->chosen);
}

/*
 * The double reference of c_b: the pre-RoPE mean over positions 1..31 of
 * the kept keys, turned to every position of block b and averaged.
 */
static void center_ref(const KvCenter *kc, const Rope *rope, int64_t b, double *ret)
{
	int P = rope->n_rot / 2;
	for (int j = 0; j < D; j++)
		ret[j] = kc->mu[j];
	for (int i = 0; i < P; i++) {
		int j, j2;
		pair_of(rope->style, rope->n_rot, i, &j, &j2);
		double th = rope->inv_freq[i], cx = 0, cy = 0;
		for (int p = 1; p < BT; p++) {
			double a = p * th, x = kc->first[p * D + j], y = kc->first[p * D + j2];
			cx += (x * cos(a) + y * sin(a)) / (BT - 1);
			cy += (-x * sin(a) + y * cos(a)) / (BT - 1);
		}
		double sx = 0, sy = 0;
		for (int t = 0; t < BT; t++) {
			double a = (double)(b * BT + t) * th;
			sx += (cx * cos(a) - cy * sin(a)) / BT;
			sy += (cx * sin(a) + cy * cos(a)) / BT;
		}
		ret[j] = sx;
		ret[j2] = sy;
	}
}

START_TEST(centers_follow_rope)
{
	static const struct { RopeStyle style; int n_rot; float base; } ropes[] = {
		{ ROPE_STYLE_NEOX, D, 1e6f },     /* Gemma 3's global layers */
		{ ROPE_STYLE_NEOX, D, 1e4f },     /* its local ones */
		{ ROPE_STYLE_NORM, D / 2, 1e4f }, /* half the channels unturned */
	};
	static const int64_t blocks[] = { 1, 2, 31, 32, 500, 1023, 33000, (1 << 20) - 1 };
	uint64_t st = test_seed() + 22;
	for (size_t r = 0; r < ARRAY_SIZE(ropes); r++) {
		Rope rope;
		rope_init(&rope, ropes[r].style, ropes[r].n_rot, ropes[r].base, 1.0f, NULL);
		double c[D], norm = 0;
		for (int j = 0; j < D; j++) {
			c[j] = test_rand_normal(&st) * (j % 11 == 0 ? 8.0 : 1.0);
			norm += c[j] * c[j];
		}
		norm = sqrt(norm);
		KvCenter kc;
		KvRopeMean rm;
		ck_assert_int_eq(kvcenter_init(&kc, D), 0);
		ck_assert_int_eq(kvropemean_init(&rm, D, &rope), 0);
		fill_block0(&kc, &rope, c, &st);
		kvropemean_choose(&rm, &kc);
		float q[G * D], prep[G * (D + 1)], scores[G * BT];
		for (int i = 0; i < G * D; i++)
			q[i] = (float)test_rand_normal(&st);
		float scale = 1.0f / sqrtf((float)D);
		kvropemean_query(&rm, q, G, scale, prep);
		for (size_t bi = 0; bi < ARRAY_SIZE(blocks); bi++) {
			int64_t b = blocks[bi];
			double want[D];
			float got[D];
			center_ref(&kc, &rope, b, want);
			kvropemean_center(&rm, b, got);
			double err = 0;
			for (int j = 0; j < D; j++)
				err = fmax(err, fabs(got[j] - want[j]));
			ck_assert_msg(err <= 2e-5 * norm, "rope %zu block %lld: center off by %g (|c| %g)", r,
				      (long long)b, err, norm);
			/* the scores' part: <q_g, c_b> scale, added to every row */
			memset(scores, 0, sizeof(scores));
			kvropemean_add(&rm, prep, G, b, BT, scores, BT);
			for (int g = 0; g < G; g++) {
				double dot = 0, qn = 0;
				for (int j = 0; j < D; j++) {
					dot += q[g * D + j] * want[j];
					qn += (double)q[g * D + j] * q[g * D + j];
				}
				double tol = 2e-5 * sqrt(qn) * norm * scale;
				for (int t = 0; t < BT; t++)
					ck_assert_msg(fabs(scores[g * BT + t] - dot * scale) <= tol,
						      "rope %zu block %lld head %d: <q, c_b> %g, want %g", r,
						      (long long)b, g, scores[g * BT + t], dot * scale);
			}
		}
		/* a pair that turns slowly keeps its pre-RoPE part far from block 0: mu is not c_b there */
		float c0[D], cfar[D];
		kvropemean_center(&rm, 0, c0);
		kvropemean_center(&rm, 500, cfar);
		double moved = 0;
		for (int j = 0; j < D; j++)
			moved += ((double)c0[j] - cfar[j]) * ((double)c0[j] - cfar[j]);
		ck_assert_msg(sqrt(moved) > 0.1 * norm, "rope %zu: the center at block 500 did not turn", r);
		kvropemean_fini(&rm);
		kvcenter_fini(&kc);
	}
}
END_TEST

/* No RoPE known: every center is mu and the scores' part kvcenter_qmu()'s, float for float. */
START_TEST(no_rope_is_mu)
{
	uint64_t st = test_seed() + 23;
	Rope none = { .n_rot = 0 };
	float k[BT * D], q[G * D], qmu[G], prep[G], scores[G * BT], ctr[D];
	for (int i = 0; i < BT * D; i++)
		k[i] = (float)(test_rand_normal(&st) + (i % D == 5 ? 4.0 : 0.0));
	for (int i = 0; i < G * D; i++)
		q[i] = (float)test_rand_normal(&st);
	for (int with = 0; with < 2; with++) {
		KvCenter kc;
		KvRopeMean rm;
		ck_assert_int_eq(kvcenter_init(&kc, D), 0);
		ck_assert_int_eq(kvropemean_init(&rm, D, with ? &none : NULL), 0);
		ck_assert_uint_eq(kvropemean_query_floats(&rm), 1);
		ck_assert_int_eq(kvcenter_keep(&kc, 0, BT, k, D), 0);
		kvropemean_choose(&rm, &kc);
		for (int64_t b = 1; b < 5000; b += 777) {
			kvropemean_center(&rm, b, ctr);
			ck_assert_mem_eq(ctr, kc.mu, sizeof(ctr));
		}
		kvcenter_qmu(&kc, q, G, 0.0625f, qmu);
		kvropemean_query(&rm, q, G, 0.0625f, prep);
		ck_assert_mem_eq(prep, qmu, sizeof(qmu));
		memset(scores, 0, sizeof(scores));
		kvropemean_add(&rm, prep, G, 9, BT, scores, BT);
		for (int g = 0; g < G; g++)
			ck_assert_float_eq(scores[g * BT + 7], qmu[g]);
		kvropemean_fini(&rm);
		kvcenter_fini(&kc);
	}
	KvRopeMean bad;
	Rope wide = { .style = ROPE_STYLE_NORM, .n_rot = 2 * D };
	ck_assert_int_eq(kvropemean_init(&bad, D, &wide), -EINVAL);
}
END_TEST

static Suite *kvropemean_suite(void)
{
	Suite *s = suite_create("kvropemean");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, centers_follow_rope);
	tcase_add_test(tc, no_rope_is_mu);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(kvropemean_suite());
}
