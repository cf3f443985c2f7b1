/*
 * test-codebook.c: engine/codec/codebook.h against independent facts.
 *
 * - Closed forms: d = 3 (uniform density: centroids -1 + (2i+1)/n, D_mse
 *   = 4^-B), B = 1 for any d (centroid E|t| = 2 Gamma(d/2) / (sqrt(pi)
 *   (d-1) Gamma((d-1)/2)), D_mse = 1 - d c^2), d = 2 (arcsine law: with
 *   t = sin(theta) uniform in theta, a cell's mean is (cos a - cos b) /
 *   (b - a)) and d = 4 (semicircle: antiderivatives in closed form).
 * - Conditional means at d = 64 by a composite Simpson rule on
 *   (1 - t^2)^((d-3)/2), code written here.
 * - turboquant.md's sanity values: Gaussian-limit centroids and D_mse for
 *   B = 1..4; the paper's bounds 4^-B <= D_mse <= sqrt(3) pi / 2 4^-B.
 * - Monte-Carlo: uniform points on the sphere quantized coordinate-wise,
 *   empirical E||u - u~||^2 within 3% of the computed D_mse, d = 64, 128,
 *   B = 1..8; the binary search against a nearest-centroid scan.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/codebook.h"
#include "tests/unit/testutil.h"

static const Codebook *get(int dim, int bits)
{
	const Codebook *cb = NULL;
	int r = codebook_get(dim, bits, &cb);
	ck_assert_msg(r == 0, "codebook_get(%d, %d): %d", dim, bits, r);
	ck_assert_int_eq(cb->dim, dim);
	ck_assert_int_eq(cb->bits, bits);
	ck_assert_int_eq(cb->n_levels, 1 << bits);
	return cb;
}

static void assert_rel(double got, double want, double tol, const char *what, int d, int b, int i)
{
	ck_assert_msg(fabs(got - want) <= tol * fabs(want), "%s d=%d B=%d [%d]: %.9g, expected %.9g",
		      what, d, b, i, got, want);
}

/* Ascending, symmetric, boundaries the midpoints, everything inside (-1, 1). */
START_TEST(structure)
{
	static const int dims[] = { 2, 3, 4, 16, 64, 128, 4096 };
	for (size_t di = 0; di < ARRAY_SIZE(dims); di++)
		for (int b = 1; b <= 8; b++) {
			const Codebook *cb = get(dims[di], b);
			int n = cb->n_levels;
			for (int i = 0; i < n; i++) {
				ck_assert(cb->centroids[i] > -1 && cb->centroids[i] < 1);
				ck_assert_msg(cb->centroids[i] == -cb->centroids[n - 1 - i],
					      "d=%d B=%d: not symmetric at %d", dims[di], b, i);
				if (i > 0)
					ck_assert(cb->centroids[i] > cb->centroids[i - 1]);
			}
			for (int i = 0; i + 1 < n; i++) {
				double mid = 0.5 * ((double)cb->centroids[i] + cb->centroids[i + 1]);
				ck_assert_msg(fabs(cb->boundaries[i] - mid) <= 1e-6 * fabs(cb->centroids[n - 1]),
					      "d=%d B=%d: boundary %d = %g, midpoint %g", dims[di], b, i,
					      cb->boundaries[i], mid);
			}
			ck_assert(cb->mse > 0 && cb->mse < 1);
			assert_rel(cb->mse, dims[di] * cb->mse_coord, 1e-12, "mse", dims[di], b, 0);
		}
}
END_TEST

START_TEST(uniform_d3)
{
	for (int b = 1; b <= 8; b++) {
		const Codebook *cb = get(3, b);
		int n = cb->n_levels;
		for (int i = 0; i < n; i++)
			ck_assert_msg(fabs(cb->centroids[i] - (-1.0 + (2.0 * i + 1) / n)) < 1e-6,
				      "B=%d c[%d] = %.9f", b, i, cb->centroids[i]);
		assert_rel(cb->mse, pow(4, -b), 1e-9, "mse", 3, b, 0);
	}
}
END_TEST

START_TEST(one_bit_closed_form)
{
	static const int dims[] = { 2, 3, 4, 5, 16, 64, 127, 128, 4096, 65536 };
	for (size_t di = 0; di < ARRAY_SIZE(dims); di++) {
		int d = dims[di];
		double c = 2 * exp(lgamma(0.5 * d) - lgamma(0.5 * (d - 1))) / (sqrt(M_PI) * (d - 1));
		const Codebook *cb = get(d, 1);
		assert_rel(cb->centroids[1], c, 1e-6, "E|t|", d, 1, 1);
		assert_rel(cb->mse, 1 - d * c * c, 1e-9, "mse", d, 1, 0);
	}
}
END_TEST

/* Cell [a, b] of codebook cb in t (edges -1, 1 outermost). */
static void cell(const Codebook *cb, int i, double *a, double *b)
{
	*a = i == 0 ? -1.0 : cb->boundaries[i - 1];
	*b = i == cb->n_levels - 1 ? 1.0 : cb->boundaries[i];
}

/* d = 2 (arcsine) and d = 4 (semicircle): conditional means in closed form. */
START_TEST(conditional_means_closed_form)
{
	for (int b = 1; b <= 8; b++) {
		const Codebook *cb2 = get(2, b), *cb4 = get(4, b);
		for (int i = 0; i < cb2->n_levels; i++) {
			double a, e;
			cell(cb2, i, &a, &e);
			double ta = asin(a), tb = asin(e);
			double mean = (cos(ta) - cos(tb)) / (tb - ta);
			ck_assert_msg(fabs(cb2->centroids[i] - mean) < 5e-7,
				      "d=2 B=%d c[%d] = %.9f, cell mean %.9f", b, i, cb2->centroids[i], mean);

			cell(cb4, i, &a, &e);
			/* f ~ sqrt(1-t^2): int f = (t sqrt(1-t^2) + asin t) / 2, int t f = -(1-t^2)^1.5 / 3 */
			double m0 = 0.5 * (e * sqrt(1 - e * e) + asin(e)) - 0.5 * (a * sqrt(1 - a * a) + asin(a));
			double m1 = -pow(1 - e * e, 1.5) / 3 + pow(1 - a * a, 1.5) / 3;
			ck_assert_msg(fabs(cb4->centroids[i] - m1 / m0) < 5e-7,
				      "d=4 B=%d c[%d] = %.9f, cell mean %.9f", b, i, cb4->centroids[i],
				      m1 / m0);
		}
	}
}
END_TEST

/* m[k] = int_a^b t^k (1 - t^2)^p dt for k = 0, 1, 2: composite Simpson, n (even) panels. */
static void simpson(double a, double b, double p, int n, double m[3])
{
	double h = (b - a) / n;
	m[0] = m[1] = m[2] = 0;
	for (int j = 0; j <= n; j++) {
		double t = a + j * h, w = (j == 0 || j == n) ? 1 : (j % 2 ? 4 : 2);
		double f = w * pow(1 - t * t, p);
		m[0] += f;
		m[1] += f * t;
		m[2] += f * t * t;
	}
	for (int k = 0; k < 3; k++)
		m[k] *= h / 3;
}

START_TEST(conditional_means_simpson_d64)
{
	const int d = 64;
	const double p = (d - 3) / 2.0;
	for (int b = 1; b <= 4; b++) {
		const Codebook *cb = get(d, b);
		double mse = 0, mass = 0;
		for (int i = 0; i < cb->n_levels; i++) {
			double a, e;
			cell(cb, i, &a, &e);
			double m[3], c = cb->centroids[i];
			simpson(a, e, p, 20000, m);
			double m0 = m[0], m1 = m[1], m2 = m[2];
			ck_assert_msg(fabs(c - m1 / m0) < 1e-6 / sqrt(d), "d=64 B=%d c[%d] = %.9f, mean %.9f",
				      b, i, c, m1 / m0);
			mass += m0;
			mse += m2 - 2 * c * m1 + c * c * m0;
		}
		assert_rel(cb->mse, d * mse / mass, 1e-5, "mse (Simpson)", d, b, 0);
	}
}
END_TEST

START_TEST(gaussian_limit)
{
	static const double want[4][8] = {
		{ 0.798 },
		{ 0.453, 1.510 },
		{ 0.245, 0.756, 1.344, 2.152 },
		{ 0.128, 0.388, 0.657, 0.942, 1.256, 1.618, 2.069, 2.733 },
	};
	const int d = 4096;
	for (int b = 1; b <= 4; b++) {
		const Codebook *cb = get(d, b);
		int half = cb->n_levels / 2;
		for (int i = 0; i < half; i++)
			assert_rel(cb->centroids[half + i] * sqrt(d), want[b - 1][i], 0.01, "centroid*sqrt(d)",
				   d, b, half + i);
	}
	/* Gaussian Lloyd-Max distortions (Max 1960); B = 1 is exactly 1 - 2/pi */
	static const double mse_gauss[4] = { 1 - 2 / M_PI, 0.1175, 0.03454, 0.009497 };
	for (int b = 1; b <= 4; b++)
		assert_rel(get(65536, b)->mse, mse_gauss[b - 1], 0.002, "mse (Gaussian)", 65536, b, 0);
}
END_TEST

/* Bounded support: the outer level (in units of 1/sqrt(d)) grows with d towards the Gaussian's. */
START_TEST(outer_level_grows_with_d)
{
	static const int dims[] = { 16, 64, 128, 4096 };
	for (int b = 2; b <= 4; b++) {
		double prev = 0;
		for (size_t di = 0; di < ARRAY_SIZE(dims); di++) {
			const Codebook *cb = get(dims[di], b);
			double outer = cb->centroids[cb->n_levels - 1] * sqrt(dims[di]);
			ck_assert_msg(outer > prev, "B=%d d=%d: outer %g not above %g", b, dims[di], outer, prev);
			prev = outer;
		}
		ck_assert(prev < (b == 2 ? 1.510 : b == 3 ? 2.152 : 2.733) * 1.002);
	}
}
END_TEST

START_TEST(distortion_table)
{
	static const double doc[4] = { 0.36, 0.117, 0.034, 0.0093 };
	static const int dims[] = { 64, 128 };
	for (size_t di = 0; di < ARRAY_SIZE(dims); di++) {
		double prev = 1;
		for (int b = 1; b <= 8; b++) {
			const Codebook *cb = get(dims[di], b);
			if (b <= 4)
				assert_rel(cb->mse, doc[b - 1], 0.03, "mse vs turboquant.md", dims[di], b, 0);
			ck_assert_msg(cb->mse < prev, "d=%d: mse not decreasing at B=%d", dims[di], b);
			ck_assert(cb->mse >= pow(4, -b));
			ck_assert(cb->mse <= sqrt(3) * M_PI / 2 * pow(4, -b));
			prev = cb->mse;
		}
	}
}
END_TEST

/* Uniform points on S^{d-1}: normalized Gaussian vectors, (n, d) float. */
static float *sphere_points(int d, int n, uint64_t seed)
{
	float *u = malloc((size_t)n * d * sizeof(float));
	ck_assert_ptr_nonnull(u);
	uint64_t st = seed;
	for (int v = 0; v < n; v++) {
		float *x = u + (size_t)v * d;
		double norm = 0;
		for (int i = 0; i < d; i++) {
			x[i] = test_rand_normal(&st);
			norm += (double)x[i] * x[i];
		}
		for (int i = 0; i < d; i++)
			x[i] = (float)(x[i] / sqrt(norm));
	}
	return u;
}

static int nearest(const Codebook *cb, float t)
{
	int best = 0;
	for (int i = 1; i < cb->n_levels; i++)
		if (fabsf(t - cb->centroids[i]) < fabsf(t - cb->centroids[best]))
			best = i;
	return best;
}

START_TEST(monte_carlo_distortion)
{
	static const int dims[] = { 64, 128 };
	const int n_vec = 20000;
	for (size_t di = 0; di < ARRAY_SIZE(dims); di++) {
		int d = dims[di];
		float *u = sphere_points(d, n_vec, test_seed() + (uint64_t)d);
		for (int b = 1; b <= 8; b++) {
			const Codebook *cb = get(d, b);
			double sum = 0;
			for (int v = 0; v < n_vec; v++) {
				const float *x = u + (size_t)v * d;
				double err = 0;
				for (int i = 0; i < d; i++) {
					int idx = codebook_quantize(cb, x[i]);
					double e = (double)x[i] - cb->centroids[idx];
					err += e * e;
					if (v < 20 && idx != nearest(cb, x[i]))
						/* a tie within float rounding is the only excuse */
						ck_assert_msg(fabsf(fabsf(x[i] - cb->centroids[idx]) -
								    fabsf(x[i] - cb->centroids[nearest(cb, x[i])])) < 1e-6f,
							      "d=%d B=%d: %g quantized to %d, nearest is %d", d,
							      b, x[i], idx, nearest(cb, x[i]));
				}
				sum += err;
			}
			double emp = sum / n_vec;
			ck_assert_msg(fabs(emp / cb->mse - 1) < 0.03, "d=%d B=%d: empirical %g, computed %g", d,
				      b, emp, cb->mse);
		}
		free(u);
	}
}
END_TEST

START_TEST(quantize_edges)
{
	for (int b = 1; b <= 8; b++) {
		const Codebook *cb = get(64, b);
		int n = cb->n_levels;
		ck_assert_uint_eq(codebook_quantize(cb, -1.0f), 0);
		ck_assert_uint_eq(codebook_quantize(cb, -INFINITY), 0);
		ck_assert_uint_eq(codebook_quantize(cb, 1.0f), n - 1);
		ck_assert_uint_eq(codebook_quantize(cb, INFINITY), n - 1);
		ck_assert_uint_eq(codebook_quantize(cb, NAN), 0);
		for (int i = 0; i + 1 < n; i++) {
			float e = cb->boundaries[i];
			ck_assert_uint_eq(codebook_quantize(cb, e), i + 1); /* a tie goes up */
			ck_assert_uint_eq(codebook_quantize(cb, nextafterf(e, -2.0f)), i);
		}
		for (int i = 0; i < n; i++)
			ck_assert_uint_eq(codebook_quantize(cb, cb->centroids[i]), i);
	}
}
END_TEST

START_TEST(invalid_arguments)
{
	Codebook cb;
	const Codebook *p = NULL;
	ck_assert_int_eq(codebook_solve(1, 2, &cb), -EINVAL);
	ck_assert_int_eq(codebook_solve(0, 2, &cb), -EINVAL);
	ck_assert_int_eq(codebook_solve(CODEBOOK_MAX_DIM + 1, 2, &cb), -EINVAL);
	ck_assert_int_eq(codebook_solve(64, 0, &cb), -EINVAL);
	ck_assert_int_eq(codebook_solve(64, 9, &cb), -EINVAL);
	ck_assert_int_eq(codebook_get(64, 9, &p), -EINVAL);
	ck_assert_int_eq(codebook_get(-3, 1, &p), -EINVAL);
	ck_assert_ptr_null(p);
}
END_TEST

typedef struct Job {
	const Codebook *got[3][4];
} Job;

static void *job_run(void *arg)
{
	Job *j = arg;
	for (int di = 0; di < 3; di++)
		for (int b = 1; b <= 4; b++)
			if (codebook_get(32 + 32 * di, b, &j->got[di][b - 1]) != 0)
				j->got[di][b - 1] = NULL;
	return NULL;
}

/* Concurrent first use: one codebook per (dim, bits), equal to a fresh solve. */
START_TEST(cache_threads)
{
	Job jobs[4];
	pthread_t th[4];
	memset(jobs, 0, sizeof(jobs));
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, job_run, &jobs[i]), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (int di = 0; di < 3; di++)
		for (int b = 1; b <= 4; b++) {
			const Codebook *first = jobs[0].got[di][b - 1];
			ck_assert_ptr_nonnull(first);
			for (int i = 1; i < 4; i++)
				ck_assert_ptr_eq(jobs[i].got[di][b - 1], first);
			Codebook fresh;
			ck_assert_int_eq(codebook_solve(32 + 32 * di, b, &fresh), 0);
			ck_assert_mem_eq(fresh.centroids, first->centroids, sizeof(fresh.centroids));
			ck_assert_mem_eq(fresh.boundaries, first->boundaries, sizeof(fresh.boundaries));
			ck_assert(fresh.mse == first->mse && fresh.mse_coord == first->mse_coord);
		}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("codebook");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, structure);
	tcase_add_test(tc, uniform_d3);
	tcase_add_test(tc, one_bit_closed_form);
	tcase_add_test(tc, conditional_means_closed_form);
	tcase_add_test(tc, conditional_means_simpson_d64);
	tcase_add_test(tc, gaussian_limit);
	tcase_add_test(tc, outer_level_grows_with_d);
	tcase_add_test(tc, distortion_table);
	tcase_add_test(tc, monte_carlo_distortion);
	tcase_add_test(tc, quantize_edges);
	tcase_add_test(tc, invalid_arguments);
	tcase_add_test(tc, cache_threads);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
