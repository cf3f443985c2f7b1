/* test-ops.c: RMSNorm, SwiGLU, softmax and both RoPE pairings against their definitions. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_f32.h"
#include "tests/unit/testutil.h"

START_TEST(rmsnorm_definition)
{
	float x[4] = { 1, -2, 3, -4 }, w[4] = { 1, 0.5f, 2, 1 }, out[4];
	op_rmsnorm(out, x, w, 4, 1e-5f);
	double rms = sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-5);
	for (int i = 0; i < 4; i++)
		ck_assert_double_eq_tol(out[i], x[i] / rms * w[i], 1e-6);
}
END_TEST

START_TEST(swiglu_and_softmax)
{
	float g[3] = { -1, 0, 2 }, u[3] = { 2, 5, -1 };
	op_swiglu(g, u, 3);
	ck_assert_double_eq_tol(g[0], -1 / (1 + exp(1.0)) * 2, 1e-6);
	ck_assert_double_eq_tol(g[1], 0, 1e-7);
	ck_assert_double_eq_tol(g[2], 2 / (1 + exp(-2.0)) * -1, 1e-6);

	float s[3] = { 1000, 1001, 999 }; /* large values: must not overflow */
	op_softmax(s, 3);
	double e = exp(-1.0), z = e + 1 + exp(-2.0);
	ck_assert_double_eq_tol(s[0], e / z, 1e-6);
	ck_assert_double_eq_tol(s[1], 1 / z, 1e-6);
	ck_assert_double_eq_tol(s[2], exp(-2.0) / z, 1e-6);
}
END_TEST

/* gelu in its tanh form, in double: the definition the GELU gate approximates */
static double gelu_tanh(double g)
{
	return 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
}

/*
 * The GELU gate (dispatched: AVX2 on x86, where e^x is a polynomial) and
 * its reference against the double definition, over every range that
 * matters: around 0, the bulk of activations, and far out where the
 * sigmoid saturates (no NaN, no overflow). n is odd so the scalar tail runs.
 */
START_TEST(geglu_matches_definition)
{
	enum { N = 1001 };
	static float g[N], up[N], a[N], r[N];
	uint64_t st = test_seed();
	for (int i = 0; i < N; i++) {
		double x = i < 600 ? (i - 300) / 20.0 : test_rand_normal(&st) * (i < 900 ? 3.0 : 40.0);
		g[i] = (float)x;
		up[i] = (float)test_rand_normal(&st);
	}
	g[0] = 0.0f, g[1] = -0.0f, g[2] = 1e-30f, g[3] = -1e-30f, g[4] = 200.0f, g[5] = -200.0f;
	memcpy(a, g, sizeof(a));
	memcpy(r, g, sizeof(r));
	vec_f32_geglu(N, a, up);
	vec_f32_geglu_ref(N, r, up);
	double worst = 0;
	for (int i = 0; i < N; i++) {
		double want = gelu_tanh(g[i]) * up[i];
		/* a few float roundings of the result, or of g itself where the result is ~0
		 * (the reference's 1 + tanh(u) cancels for negative g) */
		double tol = 2e-6 * fabs(want) + 1e-7 * fabs(up[i]) * fmin(fabs(g[i]), 1.0);
		ck_assert_msg(isfinite(a[i]) && fabs(a[i] - want) <= tol, "gelu(%g) * %g: %.9g, want %.9g", g[i],
			      up[i], a[i], want);
		ck_assert_msg(fabs(r[i] - want) <= tol, "gelu_ref(%g) * %g: %.9g, want %.9g", g[i], up[i], r[i], want);
		if (fabs(want) > 1e-6)
			worst = fmax(worst, fabs(a[i] - want) / fabs(want));
	}
	fprintf(stderr, "geglu: dispatched worst relative error %.2g (results above 1e-6)\n", worst);
	/* op_geglu is the dispatched gate */
	float x[2] = { 1.0f, -1.0f }, u[2] = { 1.0f, 2.0f };
	op_geglu(x, u, 2);
	ck_assert_double_eq_tol(x[0], 0.8411919906, 1e-6);
	ck_assert_double_eq_tol(x[1], -0.1588080094 * 2, 1e-6);
}
END_TEST

/* Rotation by pos * theta_i of pair i, theta_i = base^(-2i/n_rot) / scale. */
static void check_rope(RopeStyle style)
{
	enum { HD = 8, NH = 2 };
	const float base = 10000.0f, scale = 0.5f;
	Rope rope;
	rope_init(&rope, style, HD, base, scale, NULL);
	float x[NH * HD], y[NH * HD];
	uint64_t st = test_seed();
	for (int i = 0; i < NH * HD; i++)
		y[i] = x[i] = test_rand_normal(&st);
	const int64_t pos = 1234;
	rope_apply(&rope, y, NH, HD, pos);
	for (int h = 0; h < NH; h++)
		for (int i = 0; i < HD / 2; i++) {
			int a = style == ROPE_STYLE_NEOX ? i : 2 * i;
			int b = style == ROPE_STYLE_NEOX ? i + HD / 2 : 2 * i + 1;
			double th = pos * pow(base, -2.0 * i / HD) * scale;
			double x0 = x[h * HD + a], x1 = x[h * HD + b];
			ck_assert_double_eq_tol(y[h * HD + a], x0 * cos(th) - x1 * sin(th), 1e-5);
			ck_assert_double_eq_tol(y[h * HD + b], x0 * sin(th) + x1 * cos(th), 1e-5);
		}
	/* rotations preserve the norm, and relative positions are all that matter:
	 * <rope(q, m), rope(k, n)> depends on m - n only */
	float q[HD], k[HD], q2[HD], k2[HD];
	for (int i = 0; i < HD; i++) {
		q2[i] = q[i] = test_rand_normal(&st);
		k2[i] = k[i] = test_rand_normal(&st);
	}
	rope_apply(&rope, q, 1, HD, 100);
	rope_apply(&rope, k, 1, HD, 90);
	rope_apply(&rope, q2, 1, HD, 7010);
	rope_apply(&rope, k2, 1, HD, 7000);
	double d1 = 0, d2 = 0;
	for (int i = 0; i < HD; i++) {
		d1 += q[i] * k[i];
		d2 += q2[i] * k2[i];
	}
	ck_assert_double_eq_tol(d1, d2, 1e-4);
}

START_TEST(rope_norm_pairs)
{
	check_rope(ROPE_STYLE_NORM);
}
END_TEST

START_TEST(rope_neox_halves)
{
	check_rope(ROPE_STYLE_NEOX);
}
END_TEST

START_TEST(rope_freq_factors)
{
	float factors[2] = { 1.0f, 4.0f };
	Rope rope;
	rope_init(&rope, ROPE_STYLE_NORM, 4, 100.0f, 1.0f, factors);
	ck_assert_double_eq_tol(rope.inv_freq[0], 1.0, 1e-7);
	ck_assert_double_eq_tol(rope.inv_freq[1], 0.1 / 4.0, 1e-7);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ops");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, rmsnorm_definition);
	tcase_add_test(tc, swiglu_and_softmax);
	tcase_add_test(tc, geglu_matches_definition);
	tcase_add_test(tc, rope_norm_pairs);
	tcase_add_test(tc, rope_neox_halves);
	tcase_add_test(tc, rope_freq_factors);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
