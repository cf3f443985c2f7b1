/*
 * test-kv-kernel.c: kernels/kv_kernel.h, the codec code the CUDA kernels
 * compile, against the engine's references on the CPU. Stores must be
 * byte-identical to tq_encode() / kvquant_store() (a GPU append writes
 * what the CPU would), query preparation and the inverse rotation
 * bit-identical, scores and value reads equal to float rounding.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kvquant.h"
#include "engine/codec/tq.h"
#include "engine/kv/kvtype.h"
#include "kernels/kv_kernel.h"
#include "tests/unit/testutil.h"

#define N_VECS 300

/* Test vectors: Gaussian, scaled over many orders of magnitude, a zero and a huge one. */
static void test_vector(uint64_t *st, int k, int d, float *x)
{
	float scale = k % 7 == 0 ? 1e-3f : k % 7 == 1 ? 100.0f : k % 11 == 2 ? 3e4f : 1.0f;
	for (int i = 0; i < d; i++)
		x[i] = k == 0 ? 0.0f : scale * test_rand_normal(st);
	if (k % 13 == 5) /* an outlier channel, as real keys have */
		x[k % d] *= 40.0f;
}

/*
 * Equal as numbers (0.0 + -0.0 is +0.0 in the references: signs of zeros
 * may differ), NaN equal to NaN (an fp16 scale that overflowed times 0).
 */
static bool floats_equal(const float *a, const float *b, int n)
{
	for (int i = 0; i < n; i++)
		if (!(a[i] == b[i]) && !(isnan(a[i]) && isnan(b[i])))
			return false;
	return true;
}

static const char *const tq_names[] = {
	"tq1", "tq2", "tq3", "tq4", "tq5", "tq8", "tq2.5", "tq3.5", "tq4.5_nc", "tq5_nc",
	"tq3.5_nc", "tq3+qjl", "tq4+sqjl", "tq2h32", "tq3h16o", "tq4h8o_nc", "tq3+qjl_nc", "tq5_nc_r1",
};

static void check_tq(const char *name, int d, uint64_t *st)
{
	Error err = { 0 };
	TqDesc desc;
	ck_assert_msg(tq_desc_from_name(name, d, &desc, &err) == 0, "%s d%d: %s", name, d, err.msg);
	desc.rot_seed = test_rand_u64(st);
	if (desc.flags & TQ_FLAG_QJL)
		desc.qjl_seed = desc.rot_seed ^ 0x5555;
	if (desc.group == TQ_GROUP_OUTLIER_CHANNELS) {
		float rows[8 * 256];
		for (int i = 0; i < 8 * d; i++)
			rows[i] = test_rand_normal(st) * (i % d < 5 ? 10.0f : 1.0f);
		ck_assert_int_eq(tq_desc_choose_outliers(rows, 8, d, desc.n_hi, desc.mask), 0);
	}
	TqCodec *c = NULL;
	ck_assert_msg(tq_codec_new(&desc, &c, &err) == 0, "%s d%d: %s", name, d, err.msg);
	KvkCodec k;
	uint8_t *blob = NULL;
	ck_assert_int_eq(tq_codec_kernel(c, &k, &blob), 0);
	ck_assert_uint_eq(k.code_bytes, tq_code_bytes(c));

	uint8_t want[TQ_MAX_CODE_BYTES], got[TQ_MAX_CODE_BYTES];
	float x[256], q[256];
	static TqQuery query;
	float qrot[256], sq[KVK_MAX_QJL_M];
	/* six query heads of one kv-head, for the multi-head score (kvk_tq_score_heads_*) */
	enum { HEADS = 6 };
	static TqQuery heads[HEADS];
	static float qs[HEADS * 256], sqs[HEADS * KVK_MAX_QJL_M];
	double hn[HEADS];
	int m = desc.flags & TQ_FLAG_QJL ? desc.qjl_m : 0;
	for (int g = 0; g < HEADS; g++) {
		test_vector(st, 1000 + g, d, q);
		tq_query_prepare(c, q, &heads[g]);
		kvk_tq_query_prepare(&k, q, qs + g * d, sqs + g * m);
		hn[g] = 0.0;
		for (int i = 0; i < d; i++)
			hn[g] += (double)q[i] * q[i];
	}
	for (int n = 0; n < N_VECS; n++) {
		test_vector(st, n, d, x);
		tq_encode(c, x, want);
		memset(got, 0xa5, sizeof(got));
		kvk_tq_encode(&k, x, got);
		ck_assert_msg(memcmp(want, got, k.code_bytes) == 0, "%s d%d vector %d: codes differ",
			      name, d, n);

		test_vector(st, n + 3, d, q);
		tq_query_prepare(c, q, &query);
		kvk_tq_query_prepare(&k, q, qrot, sq);
		ck_assert_msg(memcmp(qrot, query.rot, (size_t)d * sizeof(float)) == 0,
			      "%s d%d: rotated query differs", name, d);
		if (desc.flags & TQ_FLAG_QJL)
			ck_assert_msg(memcmp(sq, query.sq, (size_t)desc.qjl_m * sizeof(float)) == 0,
				      "%s d%d: query sketch differs", name, d);

		float ref = tq_inner_product(c, &query, want);
		float fast = kvk_tq_score(&k, kvk_floats(&k, k.cb_hi), kvk_floats(&k, k.cb_lo), qrot, sq,
					  want);
		/* float rounding of sums of d products, each at most |q_i| ||x|| */
		double qn = 0.0, xn = 0.0;
		for (int i = 0; i < d; i++) {
			qn += (double)q[i] * q[i];
			xn += (double)x[i] * x[i];
		}
		double tol = 1e-5 * sqrt(qn * xn) * (desc.flags & TQ_FLAG_QJL ? 4.0 : 1.0) + 1e-30;
		ck_assert_msg(ref == fast || fabs((double)ref - fast) <= tol, "%s d%d: score %g vs %g", name, d,
			      (double)fast, (double)ref);

		/* the multi-head form the CUDA kernel runs: 3 heads in the 4-wide one, 6 in the 8-wide */
		float s4[4] = { 7, 7, 7, 7 }, s8[8] = { 7, 7, 7, 7, 7, 7, 7, 7 };
		kvk_tq_score_heads_4(&k, kvk_floats(&k, k.cb_hi), kvk_floats(&k, k.cb_lo), qs, sqs, 3, want, s4);
		kvk_tq_score_heads_8(&k, kvk_floats(&k, k.cb_hi), kvk_floats(&k, k.cb_lo), qs, sqs, HEADS, want,
				     s8);
		for (int g = 0; g < HEADS; g++) {
			float r = tq_inner_product(c, &heads[g], want);
			double t = 1e-5 * sqrt(hn[g] * xn) * (desc.flags & TQ_FLAG_QJL ? 4.0 : 1.0) + 1e-30;
			ck_assert_msg(fabs((double)r - s8[g]) <= t, "%s d%d: 8-wide head %d score %g vs %g", name, d,
				      g, (double)s8[g], (double)r);
			if (g < 3)
				ck_assert_msg(fabs((double)r - s4[g]) <= t, "%s d%d: 4-wide head %d score %g vs %g", name,
					      d, g, (double)s4[g], (double)r);
		}
		ck_assert_msg(s4[3] == 0.0f && s8[HEADS] == 0.0f && s8[7] == 0.0f, "%s d%d: heads past G not 0",
			      name, d);

		float acc[256] = { 0 }, vals[256], out_ref[256], out[256];
		tq_value_axpy(c, 1.0f, want, acc);
		for (int i = 0; i < d; i++)
			vals[i] = kvk_tq_value(&k, want, i);
		ck_assert_msg(floats_equal(vals, acc, d), "%s d%d: value coordinates differ", name, d);
		tq_output_finish(c, acc, out_ref);
		kvk_tq_output_finish(&k, acc, out);
		ck_assert_msg(floats_equal(out, out_ref, d), "%s d%d: inverse rotation differs", name, d);
	}
	free(blob);
	tq_codec_free(c);
}

START_TEST(tq_matches_codec)
{
	uint64_t st = test_seed();
	static const int dims[] = { 64, 128, 96, 256 };
	for (size_t i = 0; i < sizeof(tq_names) / sizeof(tq_names[0]); i++)
		for (size_t j = 0; j < sizeof(dims) / sizeof(dims[0]); j++)
			check_tq(tq_names[i], dims[j], &st);
}
END_TEST

START_TEST(tq_too_large_refused)
{
	TqDesc desc;
	ck_assert_int_eq(tq_desc_from_name("tq4", 512, &desc, NULL), 0);
	TqCodec *c = NULL;
	ck_assert_int_eq(tq_codec_new(&desc, &c, NULL), 0);
	KvkCodec k;
	uint8_t *blob = NULL;
	ck_assert_int_eq(tq_codec_kernel(c, &k, &blob), -EINVAL);
	ck_assert_ptr_null(blob);
	tq_codec_free(c);
}
END_TEST

START_TEST(plain_matches_kvquant)
{
	static const char *const names[] = { "f32", "f16", "q8_0", "q4_0", "f16+h", "q8_0+h", "q4_0+h" };
	static const int dims[] = { 64, 128, 256 };
	uint64_t st = test_seed();
	for (size_t a = 0; a < sizeof(names) / sizeof(names[0]); a++)
		for (size_t b = 0; b < sizeof(dims) / sizeof(dims[0]); b++) {
			int d = dims[b];
			KvType t, plain;
			Error err = { 0 };
			ck_assert_msg(kvtype_from_name(names[a], KV_ROLE_K, d, &t, &err) == 0, "%s: %s",
				      names[a], err.msg);
			plain = t;
			plain.hadamard = false;
			size_t bytes = kvtype_vec_bytes(&t);
			ck_assert_uint_eq(bytes, kvk_plain_row_bytes((int)t.format, d));
			uint8_t want[1024], got[1024];
			float x[256], q[256], qp[256], vals[256], load[256];
			for (int n = 0; n < N_VECS; n++) {
				test_vector(&st, n, d, x);
				kvquant_store(&t, x, want);
				memset(got, 0xa5, sizeof(got));
				kvk_plain_store((int)t.format, t.hadamard, d, x, got);
				ck_assert_msg(memcmp(want, got, bytes) == 0, "%s d%d vector %d: rows differ",
					      names[a], d, n);
				/* values in the stored domain: the type without +h loads them */
				kvquant_load(&plain, want, load);
				for (int i = 0; i < d; i++)
					vals[i] = kvk_plain_value((int)t.format, want, i);
				ck_assert_msg(floats_equal(vals, load, d), "%s d%d: values differ", names[a], d);
				test_vector(&st, n + 1, d, q);
				kvquant_query_prepare(&t, q, qp);
				float ref = kvquant_score(&t, qp, want);
				float fast = kvk_plain_score((int)t.format, d, qp, want);
				double mag = 0.0;
				for (int i = 0; i < d; i++)
					mag += fabs((double)qp[i] * vals[i]);
				/* past fp16's range a scale is inf: the order of inf * 0 decides inf or NaN */
				ck_assert_msg(ref == fast || (!isfinite(ref) && !isfinite(fast)) ||
					      fabs((double)ref - fast) <= 1e-5 * mag + 1e-30,
					      "%s d%d: score %g vs %g", names[a], d, (double)fast,
					      (double)ref);
			}
		}
}
END_TEST

START_TEST(hadamard_matches)
{
	uint64_t st = test_seed();
	for (int d = 32; d <= 256; d *= 2) {
		float a[256], b[256];
		for (int i = 0; i < d; i++)
			a[i] = b[i] = test_rand_normal(&st);
		kvquant_hadamard(a, d);
		kvk_hadamard(b, d);
		ck_assert_msg(memcmp(a, b, (size_t)d * sizeof(float)) == 0, "d%d", d);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv-kernel");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, tq_matches_codec);
	tcase_add_test(tc, tq_too_large_refused);
	tcase_add_test(tc, plain_matches_kvquant);
	tcase_add_test(tc, hadamard_matches);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
