/* test-sampler.c: each sampling stage, checked against its definition. */
#include <math.h>
#include <string.h>

#include "engine/model/sampler.h"
#include "tests/unit/testutil.h"

#define N_DRAWS 20000

static Sampler *make(SamplerParams p, int n_vocab)
{
	Sampler *s = NULL;
	ck_assert_int_eq(sampler_new(&p, n_vocab, &s), 0);
	return s;
}

static SamplerParams plain(float temp)
{
	/* every filter off: pure softmax sampling at temp */
	return (SamplerParams){ .temperature = temp, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
				.repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = test_seed() };
}

START_TEST(greedy_is_argmax_lowest_on_ties)
{
	float logits[6] = { 0.1f, 3.0f, -1.0f, 3.0f, 2.9f, 0.0f };
	ck_assert_int_eq(sampler_greedy(logits, 6), 1);
	Sampler *s = make(plain(0.0f), 6);
	ck_assert_int_eq(sampler_sample(s, logits, NULL, 0), 1);
	sampler_free(s);
}
END_TEST

/* Frequencies of N_DRAWS samples against the softmax at temperature t. */
static void check_distribution(Sampler *s, const float *logits, int n, const double *want)
{
	int counts[16] = { 0 };
	for (int i = 0; i < N_DRAWS; i++) {
		int32_t id = sampler_sample(s, logits, NULL, 0);
		ck_assert(id >= 0 && id < n);
		counts[id]++;
	}
	for (int i = 0; i < n; i++) {
		double p = want[i], got = (double)counts[i] / N_DRAWS;
		double sigma = sqrt(p * (1 - p) / N_DRAWS) + 1e-9;
		ck_assert_msg(fabs(got - p) <= 5 * sigma + (p == 0 ? 0 : 1e-4),
			      "token %d: frequency %.4f, expected %.4f", i, got, p);
	}
}

START_TEST(temperature_matches_softmax)
{
	float logits[4] = { 1.0f, 0.5f, 0.0f, -1.0f };
	const float temp = 0.8f;
	double want[4], sum = 0;
	for (int i = 0; i < 4; i++)
		sum += want[i] = exp(logits[i] / temp);
	for (int i = 0; i < 4; i++)
		want[i] /= sum;
	Sampler *s = make(plain(temp), 4);
	check_distribution(s, logits, 4, want);
	sampler_free(s);
}
END_TEST

START_TEST(top_k_keeps_k_best)
{
	float logits[5] = { 0.0f, 2.0f, 1.0f, 1.9f, -3.0f };
	SamplerParams p = plain(1.0f);
	p.top_k = 2;
	double e1 = exp(2.0), e3 = exp(1.9);
	double want[5] = { 0, e1 / (e1 + e3), 0, e3 / (e1 + e3), 0 };
	Sampler *s = make(p, 5);
	check_distribution(s, logits, 5, want);
	sampler_free(s);
}
END_TEST

START_TEST(top_k_large_vocab)
{
	/* The heap selection on a real vocabulary size: top-1 is argmax */
	enum { V = 49152 };
	static float logits[V];
	uint64_t st = test_seed();
	for (int i = 0; i < V; i++)
		logits[i] = test_rand_normal(&st);
	logits[31337] = 10.0f;
	SamplerParams p = plain(1.0f);
	p.top_k = 1;
	Sampler *s = make(p, V);
	for (int i = 0; i < 50; i++)
		ck_assert_int_eq(sampler_sample(s, logits, NULL, 0), 31337);
	sampler_free(s);
}
END_TEST

START_TEST(top_p_smallest_prefix)
{
	/* p = 0.5, 0.3, 0.15, 0.05: top-p 0.75 keeps the first two */
	float logits[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
	SamplerParams p = plain(1.0f);
	p.top_p = 0.75f;
	double want[4] = { 0.5 / 0.8, 0.3 / 0.8, 0, 0 };
	Sampler *s = make(p, 4);
	check_distribution(s, logits, 4, want);
	sampler_free(s);
}
END_TEST

START_TEST(min_p_relative_floor)
{
	/* min-p 0.25: floor 0.125 keeps 0.5, 0.3, 0.15 */
	float logits[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
	SamplerParams p = plain(1.0f);
	p.min_p = 0.25f;
	double want[4] = { 0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0 };
	Sampler *s = make(p, 4);
	check_distribution(s, logits, 4, want);
	sampler_free(s);
}
END_TEST

START_TEST(repeat_penalty_demotes_recent)
{
	float logits[3] = { 2.0f, 1.9f, -0.5f };
	int32_t history[3] = { 0, 0, 2 };
	SamplerParams p = plain(0.0f);
	p.repeat_penalty = 1.5f; /* 2.0 -> 1.333 < 1.9 */
	Sampler *s = make(p, 3);
	ck_assert_int_eq(sampler_sample(s, logits, history, 3), 1);
	/* outside the window: no penalty */
	p.repeat_last_n = 1;
	Sampler *s2 = make(p, 3);
	ck_assert_int_eq(sampler_sample(s2, logits, history, 3), 0);
	/* negative logits are multiplied: -0.5 -> -0.75, still last */
	float neg[3] = { -0.6f, -0.7f, -0.5f };
	int32_t h2[1] = { 2 };
	ck_assert_int_eq(sampler_sample(s, neg, h2, 1), 0);
	sampler_free(s);
	sampler_free(s2);
}
END_TEST

START_TEST(same_seed_same_tokens)
{
	float logits[8];
	uint64_t st = 7;
	for (int i = 0; i < 8; i++)
		logits[i] = test_rand_normal(&st);
	SamplerParams p = sampler_params_default();
	p.seed = 1234;
	Sampler *a = make(p, 8), *b = make(p, 8);
	p.seed = 1235;
	Sampler *c = make(p, 8);
	int differs = 0;
	for (int i = 0; i < 200; i++) {
		int32_t x = sampler_sample(a, logits, NULL, 0);
		ck_assert_int_eq(x, sampler_sample(b, logits, NULL, 0));
		differs += x != sampler_sample(c, logits, NULL, 0);
	}
	ck_assert_msg(differs > 0, "a different seed should give a different sequence");
	sampler_free(a);
	sampler_free(b);
	sampler_free(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sampler");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, greedy_is_argmax_lowest_on_ties);
	tcase_add_test(tc, temperature_matches_softmax);
	tcase_add_test(tc, top_k_keeps_k_best);
	tcase_add_test(tc, top_k_large_vocab);
	tcase_add_test(tc, top_p_smallest_prefix);
	tcase_add_test(tc, min_p_relative_floor);
	tcase_add_test(tc, repeat_penalty_demotes_recent);
	tcase_add_test(tc, same_seed_same_tokens);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
