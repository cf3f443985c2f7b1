/*
 * test-rotation.c: engine/codec/rotation.h, checked against definitions.
 *
 * Orthogonality, norm preservation and inverse are checked through P's
 * columns (P e_j), computed in double here. The generator and the way P
 * consumes it are part of the on-disk format: the pinned values below
 * come from an independent Python/numpy implementation of the spec in
 * rotation.h (integer splitmix64 + xoshiro256**, Box-Muller, explicit
 * Sylvester H, numpy.linalg.qr with Q diag(sign(diag R))), so a change of
 * generator, sign order or QR sign convention fails here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/rotation.h"
#include "tests/unit/testutil.h"

typedef struct Config {
	RotationKind kind;
	int dim, rounds;
} Config;

static const Config configs[] = {
	{ ROTATION_HADAMARD, 64, 1 },  { ROTATION_HADAMARD, 64, 2 },  { ROTATION_HADAMARD, 128, 1 },
	{ ROTATION_HADAMARD, 128, 2 }, { ROTATION_HADAMARD, 256, 1 }, { ROTATION_HADAMARD, 256, 2 },
	{ ROTATION_DENSE, 48, 0 },     { ROTATION_DENSE, 64, 0 },     { ROTATION_DENSE, 96, 0 },
	{ ROTATION_DENSE, 100, 0 },
};

static Rotation *make(RotationKind kind, int dim, int rounds, uint64_t seed)
{
	Rotation *r = NULL;
	int k = rotation_new(kind, dim, rounds, seed, &r);
	ck_assert_msg(k == 0, "rotation_new(%d, %d, %d): %d", kind, dim, rounds, k);
	ck_assert_int_eq(rotation_dim(r), dim);
	return r;
}

/* cols (d, d): cols[j*d + i] = (P e_j)_i */
static double *columns(const Rotation *r, int d, bool inverse)
{
	double *cols = malloc((size_t)d * d * sizeof(double));
	float *e = malloc((size_t)d * sizeof(float)), *y = malloc((size_t)d * sizeof(float));
	ck_assert(cols && e && y);
	for (int j = 0; j < d; j++) {
		memset(e, 0, (size_t)d * sizeof(float));
		e[j] = 1;
		if (inverse)
			rotation_apply_inverse(r, e, y);
		else
			rotation_apply(r, e, y);
		for (int i = 0; i < d; i++)
			cols[(size_t)j * d + i] = y[i];
	}
	free(e);
	free(y);
	return cols;
}

START_TEST(orthogonal)
{
	const Config *c = &configs[_i];
	Rotation *r = make(c->kind, c->dim, c->rounds, test_seed() + 11);
	int d = c->dim;
	double *p = columns(r, d, false), *pinv = columns(r, d, true), worst = 0, worst_t = 0;
	for (int i = 0; i < d; i++)
		for (int j = 0; j < d; j++) {
			double dot = 0;
			for (int k = 0; k < d; k++)
				dot += p[(size_t)i * d + k] * p[(size_t)j * d + k];
			worst = fmax(worst, fabs(dot - (i == j)));
			/* the inverse is the transpose: (P^T e_i)_j = (P e_j)_i */
			worst_t = fmax(worst_t, fabs(pinv[(size_t)i * d + j] - p[(size_t)j * d + i]));
		}
	ck_assert_msg(worst < 1e-5, "kind %d d=%d rounds %d: max |P^T P - I| = %g", c->kind, d,
		      c->rounds, worst);
	ck_assert_msg(worst_t < 1e-6, "kind %d d=%d: inverse is not the transpose (%g)", c->kind, d,
		      worst_t);
	free(p);
	free(pinv);
	rotation_free(r);
}
END_TEST

START_TEST(norm_and_inverse)
{
	const Config *c = &configs[_i];
	uint64_t st = test_seed() ^ 0x7077;
	Rotation *r = make(c->kind, c->dim, c->rounds, test_seed() + 12);
	int d = c->dim;
	float x[256], y[256], z[256], w[256];
	for (int t = 0; t < 50; t++) {
		double nx = 0, ny = 0, err = 0;
		float scale = t % 2 ? 1000.0f : 0.01f;
		for (int i = 0; i < d; i++) {
			x[i] = scale * test_rand_normal(&st);
			nx += (double)x[i] * x[i];
		}
		rotation_apply(r, x, y);
		for (int i = 0; i < d; i++)
			ny += (double)y[i] * y[i];
		ck_assert_msg(fabs(sqrt(ny) / sqrt(nx) - 1) < 1e-5, "d=%d: norm %g -> %g", d, sqrt(nx),
			      sqrt(ny));
		rotation_apply_inverse(r, y, z);
		for (int i = 0; i < d; i++)
			err = fmax(err, fabs((double)z[i] - x[i]));
		ck_assert_msg(err < 1e-5 * sqrt(nx), "d=%d: inverse(apply(x)) off by %g", d, err);
		/* in place gives the same bytes as out of place */
		memcpy(w, x, (size_t)d * sizeof(float));
		rotation_apply(r, w, w);
		ck_assert_mem_eq(w, y, (size_t)d * sizeof(float));
		rotation_apply_inverse(r, w, w);
		ck_assert_mem_eq(w, z, (size_t)d * sizeof(float));
	}
	rotation_free(r);
}
END_TEST

START_TEST(seeds_deterministic)
{
	const Config *c = &configs[_i];
	int d = c->dim;
	Rotation *a = make(c->kind, d, c->rounds, 1234), *b = make(c->kind, d, c->rounds, 1234),
		 *o = make(c->kind, d, c->rounds, 1235);
	ck_assert_uint_eq(rotation_seed(a), 1234);
	float x[256], ya[256], yb[256], yo[256];
	uint64_t st = test_seed();
	for (int i = 0; i < d; i++)
		x[i] = test_rand_normal(&st);
	rotation_apply(a, x, ya);
	rotation_apply(b, x, yb);
	rotation_apply(o, x, yo);
	ck_assert_mem_eq(ya, yb, (size_t)d * sizeof(float));
	ck_assert_msg(memcmp(ya, yo, (size_t)d * sizeof(float)) != 0, "seed 1235 gave seed 1234's P");
	rotation_free(a);
	rotation_free(b);
	rotation_free(o);
}
END_TEST

START_TEST(generator_pinned)
{
	Rng rng;
	rng_init(&rng, 0);
	ck_assert_uint_eq(rng_next(&rng), 0x99ec5f36cb75f2b4ull);
	ck_assert_uint_eq(rng_next(&rng), 0xbf6e1f784956452aull);
	ck_assert_uint_eq(rng_next(&rng), 0x1a5f849d4933e6e0ull);

	double z[3];
	const double want_z[3] = { 0.27273085609131953, -0.24768620080963788, 0.5703171307228371 };
	rng_init(&rng, 0x5eed);
	rng_fill_normal(&rng, z, 3);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(fabs(z[i] - want_z[i]) < 1e-14, "normal %d: %.17g", i, z[i]);
}
END_TEST

START_TEST(hadamard_pinned)
{
	float e[64] = { 1 }, y[64];
	/* two rounds, d = 64, seed 42: P e_0 * 64 (exact small integers) */
	const float want2[8] = { 4, 4, 12, 4, 0, 8, -16, 0 };
	Rotation *r = make(ROTATION_HADAMARD, 64, 2, 42);
	ck_assert_int_eq(rotation_rounds(r), 2);
	rotation_apply(r, e, y);
	for (int i = 0; i < 8; i++)
		ck_assert_msg(y[i] * 64 == want2[i], "P e_0[%d] * 64 = %g, expected %g", i, y[i] * 64,
			      want2[i]);
	rotation_free(r);

	/* one round, d = 8, seed 7: columns 0 and 1 times sqrt(8) */
	const float want_c0[8] = { -1, -1, -1, -1, -1, -1, -1, -1 };
	const float want_c1[8] = { 1, -1, 1, -1, 1, -1, 1, -1 };
	r = make(ROTATION_HADAMARD, 8, 1, 7);
	for (int col = 0; col < 2; col++) {
		float e8[8] = { 0 };
		e8[col] = 1;
		rotation_apply(r, e8, y);
		for (int i = 0; i < 8; i++)
			ck_assert_msg(fabsf(y[i] * sqrtf(8) - (col ? want_c1 : want_c0)[i]) < 1e-6,
				      "column %d row %d: %g", col, i, y[i] * sqrtf(8));
	}
	ck_assert_float_eq(rotation_signs(r, 1)[0], -1.0f);
	ck_assert_ptr_null(rotation_signs(r, 2));
	rotation_free(r);
}
END_TEST

START_TEST(dense_pinned)
{
	const double want[6] = { -0.27403927101461756, 0.0442029871845518,   -0.05736877575972477,
				 0.036873824912944476, 0.07564551503329317, -0.3458874931586581 };
	float e[48] = { 1 }, y[48];
	Rotation *r = make(ROTATION_DENSE, 48, 0, 42);
	ck_assert_int_eq(rotation_kind(r), ROTATION_DENSE);
	ck_assert_int_eq(rotation_rounds(r), 0);
	rotation_apply(r, e, y);
	for (int i = 0; i < 6; i++)
		ck_assert_msg(fabs(y[i] - want[i]) < 1e-6, "P e_0[%d] = %.9f, expected %.9f", i, y[i],
			      want[i]);
	/* rotation_matrix() is P row-major: column 0 is P e_0 */
	const float *p = rotation_matrix(r);
	for (int i = 0; i < 48; i++)
		ck_assert_float_eq(p[i * 48], y[i]);
	rotation_free(r);
}
END_TEST

START_TEST(invalid_arguments)
{
	Rotation *r = NULL;
	ck_assert_int_eq(rotation_new(ROTATION_HADAMARD, 48, 1, 1, &r), -EINVAL);
	ck_assert_int_eq(rotation_new(ROTATION_HADAMARD, 100, 2, 1, &r), -EINVAL);
	ck_assert_int_eq(rotation_new(ROTATION_HADAMARD, 64, 0, 1, &r), -EINVAL);
	ck_assert_int_eq(rotation_new(ROTATION_HADAMARD, 64, 3, 1, &r), -EINVAL);
	ck_assert_int_eq(rotation_new(ROTATION_DENSE, 0, 0, 1, &r), -EINVAL);
	ck_assert_int_eq(rotation_new(ROTATION_AUTO, -4, 1, 1, &r), -EINVAL);
	ck_assert_int_eq(rotation_new(ROTATION_HADAMARD, 8192, 1, 1, &r), -EINVAL);
	ck_assert_int_eq(rotation_new((RotationKind)7, 64, 1, 1, &r), -EINVAL);
	ck_assert_ptr_null(r);

	ck_assert_int_eq(rotation_new(ROTATION_AUTO, 64, 2, 1, &r), 0);
	ck_assert_int_eq(rotation_kind(r), ROTATION_HADAMARD);
	ck_assert_ptr_null(rotation_matrix(r));
	r = rotation_free(r);
	ck_assert_int_eq(rotation_new(ROTATION_AUTO, 100, 2, 1, &r), 0);
	ck_assert_int_eq(rotation_kind(r), ROTATION_DENSE);
	ck_assert_ptr_null(rotation_signs(r, 1));
	r = rotation_free(r);
	ck_assert_int_eq(rotation_new(ROTATION_DENSE, 1, 0, 1, &r), 0);
	float one = 2.5f, out;
	rotation_apply(r, &one, &out);
	ck_assert_float_eq(fabsf(out), 2.5f); /* O(1) = {+1, -1} */
	r = rotation_free(r);
	ck_assert_ptr_null(rotation_free(NULL));
}
END_TEST

/* fwht() against the definition H[i][j] = (-1)^popcount(i & j). */
START_TEST(fwht_definition)
{
	uint64_t st = test_seed() ^ 0xf;
	for (int n = 1; n <= 256; n *= 2) {
		float x[256], y[256];
		for (int i = 0; i < n; i++)
			x[i] = test_rand_normal(&st);
		memcpy(y, x, sizeof(float) * (size_t)n);
		fwht(y, n);
		for (int i = 0; i < n; i++) {
			double want = 0;
			for (int j = 0; j < n; j++)
				want += (__builtin_popcount((unsigned)(i & j)) & 1) ? -x[j] : x[j];
			ck_assert_msg(fabs(y[i] - want) < 1e-4 * sqrt(n), "n=%d i=%d: %g vs %g", n, i,
				      y[i], want);
		}
	}
}
END_TEST

/*
 * A fixed unit vector rotated by many seeds: each coordinate has mean 0
 * and variance 1/d (5 sigma bounds). Dense P is Haar, so each coordinate
 * is a coordinate of a uniform point on the sphere: E t^4 = 3 / (d (d+2)).
 */
static void check_seed_statistics(RotationKind kind, int d, int rounds, int n_seeds, bool kurtosis)
{
	uint64_t st = test_seed() ^ 0x57a7;
	float x[128], y[128];
	double s1[128] = { 0 }, s2[128] = { 0 }, s4 = 0, nx = 0;
	for (int i = 0; i < d; i++) {
		x[i] = test_rand_normal(&st);
		nx += (double)x[i] * x[i];
	}
	for (int i = 0; i < d; i++)
		x[i] = (float)(x[i] / sqrt(nx));
	for (int s = 0; s < n_seeds; s++) {
		Rotation *r = make(kind, d, rounds, test_seed() * 1000003 + (uint64_t)s);
		rotation_apply(r, x, y);
		for (int i = 0; i < d; i++) {
			double t = y[i];
			s1[i] += t;
			s2[i] += t * t;
			s4 += t * t * t * t;
		}
		rotation_free(r);
	}
	double sd_mean = 1 / sqrt((double)d * n_seeds), sd_var = sqrt(2.0 / n_seeds) / d;
	for (int i = 0; i < d; i++) {
		double mean = s1[i] / n_seeds, var = s2[i] / n_seeds;
		ck_assert_msg(fabs(mean) < 5 * sd_mean, "kind %d d=%d coord %d: mean %g (sd %g)", kind, d,
			      i, mean, sd_mean);
		ck_assert_msg(fabs(var - 1.0 / d) < 5 * sd_var, "kind %d d=%d coord %d: var %g, 1/d = %g",
			      kind, d, i, var, 1.0 / d);
	}
	if (kurtosis) {
		/* pooled over coordinates; sd of one t^4 is about sqrt(96) / d^2 */
		double m4 = s4 / ((double)n_seeds * d), want = 3.0 / (d * (d + 2.0));
		double sd = sqrt(96.0) / ((double)d * d) / sqrt((double)n_seeds * d);
		ck_assert_msg(fabs(m4 - want) < 5 * sd, "kind %d d=%d: E t^4 = %g, sphere %g (sd %g)",
			      kind, d, m4, want, sd);
	}
}

START_TEST(seed_statistics)
{
	check_seed_statistics(ROTATION_HADAMARD, 64, 1, 2000, false);
	check_seed_statistics(ROTATION_HADAMARD, 128, 2, 2000, true);
	check_seed_statistics(ROTATION_DENSE, 48, 0, 1000, true);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rotation");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, orthogonal, 0, (int)ARRAY_SIZE(configs));
	tcase_add_loop_test(tc, norm_and_inverse, 0, (int)ARRAY_SIZE(configs));
	tcase_add_loop_test(tc, seeds_deterministic, 0, (int)ARRAY_SIZE(configs));
	tcase_add_test(tc, generator_pinned);
	tcase_add_test(tc, hadamard_pinned);
	tcase_add_test(tc, dense_pinned);
	tcase_add_test(tc, invalid_arguments);
	tcase_add_test(tc, fwht_definition);
	tcase_add_test(tc, seed_statistics);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
