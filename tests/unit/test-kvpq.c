/*
 * test-kvpq.c: the PolarQuant codec (kvpq.h) against its theory, computed
 * again here independently of the codec's solver: the angle densities
 * (normalised, centred at pi/4, matching the angles of Gaussian vectors
 * put through an independent polar transform), the codebooks (each
 * centroid the circular mean of its cell, cells split at midpoints, delta
 * as stated), the distortion of whole codes (Monte Carlo E||u - u~||^2
 * within a few percent of E_L, falling with bits), the row layout byte by
 * byte, norms kept, and scores on the codes equal to the decoded keys' dot
 * products.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bitpack.h"
#include "base/half.h"
#include "engine/codec/codebook.h"
#include "engine/codec/kvpq.h"
#include "engine/kv/kvtype.h"
#include "tests/unit/testutil.h"

static const double PI = 3.14159265358979323846;

/* Simpson's rule of f on [a, b] with n (even) intervals. */
static double simpson(double (*f)(int, double, double), int level, double c, double a, double b, int n)
{
	double h = (b - a) / n, s = f(level, a, c) + f(level, b, c);
	for (int i = 1; i < n; i++)
		s += f(level, a + i * h, c) * (i % 2 ? 4 : 2);
	return s * h / 3;
}

static double dens(int level, double x, double c)
{
	(void)c;
	return kvpq_angle_density(level, x);
}

static double dens_x(int level, double x, double c)
{
	(void)c;
	return x * kvpq_angle_density(level, x);
}

static double dens_cos(int level, double x, double c)
{
	return cos(x - c) * kvpq_angle_density(level, x);
}

static double dens_sin(int level, double x, double c)
{
	(void)c;
	return sin(x) * kvpq_angle_density(level, x);
}

static double dens_cos0(int level, double x, double c)
{
	(void)c;
	return cos(x) * kvpq_angle_density(level, x);
}

START_TEST(densities_normalised_at_pi_over_4)
{
	for (int l = 2; l <= 8; l++) {
		double mass = simpson(dens, l, 0, 0, PI / 2, 20000);
		double mean = simpson(dens_x, l, 0, 0, PI / 2, 20000);
		ck_assert_msg(fabs(mass - 1) < 1e-9, "level %d mass %.12f", l, mass);
		ck_assert_msg(fabs(mean - PI / 4) < 1e-9, "level %d mean %.12f", l, mean);
		/* the mode is pi/4 too: sin^(m-1)(2 psi) */
		ck_assert(kvpq_angle_density(l, PI / 4) > kvpq_angle_density(l, PI / 4 + 0.01));
		ck_assert(kvpq_angle_density(l, PI / 4) > kvpq_angle_density(l, PI / 4 - 0.01));
	}
	ck_assert_double_eq_tol(kvpq_angle_density(1, 1.0), 1 / (2 * PI), 1e-15);
	ck_assert_double_eq(kvpq_angle_density(2, -0.1), 0.0);
	ck_assert_double_eq(kvpq_angle_density(2, 2.0), 0.0);
}
END_TEST

/*
 * The angles of standard Gaussian vectors of 256 coordinates taken to polar
 * form here (pairs (2p, 2p+1), the paper's order: the distribution is the
 * same), binned in 16 cells of equal probability under the density:
 * a chi-square test per level.
 */
START_TEST(densities_match_gaussian_angles)
{
	enum { D = 256, N = 2000, CELLS = 16 };
	uint64_t st = test_seed();
	double *ang[8];
	int count[8] = { 0 };
	for (int l = 1; l <= 8; l++)
		ck_assert_ptr_nonnull(ang[l - 1] = malloc(sizeof(double) * (size_t)(N * D >> l)));
	double x[D];
	for (int v = 0; v < N; v++) {
		for (int i = 0; i < D; i++)
			x[i] = test_rand_normal(&st);
		for (int l = 1, n = D / 2; l <= 8; l++, n /= 2)
			for (int p = 0; p < n; p++) {
				double a = x[2 * p], b = x[2 * p + 1];
				double psi = atan2(b, a);
				ang[l - 1][count[l - 1]++] = psi < 0 ? psi + 2 * PI : psi;
				x[p] = hypot(a, b);
			}
	}
	for (int l = 2; l <= 8; l++) {
		/* cell edges at the density's quantiles, by bisection on Simpson's CDF */
		double edge[CELLS + 1];
		edge[0] = 0;
		edge[CELLS] = PI / 2;
		for (int k = 1; k < CELLS; k++) {
			double lo = 0, hi = PI / 2;
			for (int it = 0; it < 50; it++) {
				double mid = (lo + hi) / 2;
				if (simpson(dens, l, 0, 0, mid, 2000) < (double)k / CELLS)
					lo = mid;
				else
					hi = mid;
			}
			edge[k] = (lo + hi) / 2;
		}
		int obs[CELLS] = { 0 };
		for (int i = 0; i < count[l - 1]; i++) {
			int k = 0;
			while (k + 1 < CELLS && ang[l - 1][i] >= edge[k + 1])
				k++;
			obs[k]++;
		}
		double e = (double)count[l - 1] / CELLS, chi2 = 0;
		for (int k = 0; k < CELLS; k++)
			chi2 += (obs[k] - e) * (obs[k] - e) / e;
		/* 15 degrees of freedom: P(chi2 > 37.7) = 0.001 */
		ck_assert_msg(chi2 < 37.7, "level %d: chi2 %.1f over %d angles", l, chi2, count[l - 1]);
	}
	for (int l = 1; l <= 8; l++)
		free(ang[l - 1]);
}
END_TEST

/* Each codebook satisfies the Lloyd conditions for 1 - cos(psi - c), computed here by Simpson. */
START_TEST(codebooks_are_lloyd_optimal)
{
	for (int l = 1; l <= 6; l++)
		for (int b = 1; b <= 5; b++) {
			const KvPqAngles *a;
			ck_assert_int_eq(kvpq_angles_get(l, b, &a), 0);
			ck_assert_int_eq(a->n, 1 << b);
			if (l == 1) {
				double w = 2 * PI / a->n;
				for (int k = 0; k < a->n; k++)
					ck_assert_double_eq_tol(a->centroid[k], (k + 0.5) * w, 1e-6);
				ck_assert_double_eq_tol(a->delta, 1 - sin(w / 2) / (w / 2), 1e-12);
				continue;
			}
			double kept = 0, lo = 0;
			for (int k = 0; k < a->n; k++) {
				double hi = k + 1 < a->n ? a->bound[k] : PI / 2;
				if (k + 1 < a->n)
					ck_assert_double_eq_tol(a->bound[k], 0.5 * (a->centroid[k] + a->centroid[k + 1]),
								1e-6);
				double ms = simpson(dens_sin, l, 0, lo, hi, 4000);
				double mc = simpson(dens_cos0, l, 0, lo, hi, 4000);
				ck_assert_msg(fabs(atan2(ms, mc) - a->centroid[k]) < 2e-6,
					      "level %d, %d bits, cell %d: centroid %.8f, circular mean %.8f", l, b,
					      k, a->centroid[k], atan2(ms, mc));
				kept += simpson(dens_cos, l, a->centroid[k], lo, hi, 4000);
				lo = hi;
			}
			ck_assert_msg(fabs((1 - kept) - a->delta) < 1e-5 * a->delta + 1e-12,
				      "level %d, %d bits: delta %.10g, here %.10g", l, b, a->delta, 1 - kept);
			/* the ring of centroids is symmetric about pi/4 like the density */
			for (int k = 0; k < a->n; k++)
				ck_assert_double_eq_tol(a->centroid[k] + a->centroid[a->n - 1 - k], PI / 2, 1e-6);
		}
}
END_TEST

/* Deeper levels are tighter: at equal bits, delta falls with the level (kvpq.h's allocation). */
START_TEST(deeper_levels_need_fewer_bits)
{
	for (int b = 1; b <= 4; b++) {
		double prev = 1;
		for (int l = 1; l <= 6; l++) {
			const KvPqAngles *a;
			ck_assert_int_eq(kvpq_angles_get(l, b, &a), 0);
			ck_assert_msg(a->delta < prev, "%d bits: level %d delta %g >= %g", b, l, a->delta, prev);
			prev = a->delta;
		}
	}
	/* two bits more at level 1 land within a factor 2 of level 2's delta: the paper's 4 + 2 */
	const KvPqAngles *a1, *a2;
	ck_assert_int_eq(kvpq_angles_get(1, 4, &a1), 0);
	ck_assert_int_eq(kvpq_angles_get(2, 2, &a2), 0);
	ck_assert(a1->delta < 2 * a2->delta && a2->delta < 2 * a1->delta);
}
END_TEST

static KvType type_of(const char *name, int dim)
{
	KvType t;
	Error err = { 0 };
	ck_assert_msg(kvtype_from_name(name, KV_ROLE_V, dim, &t, &err) == 0, "%s: %s", name, err.msg);
	ck_assert_int_eq(t.format, KV_FORMAT_PQ);
	return t;
}

/* Names, allocations and bytes per row (kvpq.h's table, kv_pq_layout.h's layout). */
START_TEST(names_and_bytes)
{
	static const struct {
		const char *name;
		int dim, levels, b1, b2;
		size_t bytes;
	} rows[] = {
		{ "pq", 64, 4, 4, 2, 8 + 23 },    /* 3.875 bits */
		{ "pq", 128, 4, 4, 2, 16 + 46 },  /* 3.875 */
		{ "pq3", 64, 4, 3, 1, 8 + 16 },   /* 96 + 28 bits of codes */
		{ "pq5", 64, 4, 5, 3, 8 + 31 },
		{ "pq4f", 64, 6, 4, 2, 2 + 24 },  /* 128 + 62 bits: 3.25 */
		{ "pq3f", 64, 6, 3, 1, 2 + 16 },  /* 96 + 31: 2.25 */
		{ "pq5f", 128, 7, 5, 3, 2 + 64 }, /* 320 + 63 * 3 = 509 bits */
		{ "pq1", 64, 4, 1, 1, 8 + 8 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(rows); i++) {
		KvType t = type_of(rows[i].name, rows[i].dim);
		ck_assert_int_eq(t.pq.levels, rows[i].levels);
		ck_assert_int_eq(t.pq.bits[0], rows[i].b1);
		for (int l = 1; l < t.pq.levels; l++)
			ck_assert_int_eq(t.pq.bits[l], rows[i].b2);
		ck_assert_uint_eq(kvtype_vec_bytes(&t), rows[i].bytes);
		char buf[KVTYPE_NAME_MAX];
		kvtype_name(&t, buf, sizeof(buf));
		KvType back = type_of(buf, rows[i].dim);
		ck_assert(kvtype_equal(&t, &back));
	}
	KvType t = type_of("pq4", 64);
	char buf[KVTYPE_NAME_MAX];
	kvtype_name(&t, buf, sizeof(buf));
	ck_assert_str_eq(buf, "pq");
	ck_assert_double_eq(kvtype_bits_per_value(&t), 3.875);
	static const char *const bad[] = { "pq0", "pq9", "pq4x", "pq44", "pqf", "pq-1", "pq4ff" };
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		ck_assert_int_eq(kvtype_from_name(bad[i], KV_ROLE_K, 64, &t, NULL), KVTYPE_E_UNKNOWN);
	ck_assert_int_eq(kvtype_from_name("pq4f", KV_ROLE_K, 96, &t, NULL), KVTYPE_E_DIM);
	ck_assert_int_eq(kvtype_from_name("pq", KV_ROLE_K, 40, &t, NULL), KVTYPE_E_DIM);
	ck_assert_int_eq(kvtype_from_name("pq", KV_ROLE_K, 96, &t, NULL), 0);
}
END_TEST

static void codec_of(const char *name, int dim, uint64_t seed, KvPq *pq)
{
	KvType t = type_of(name, dim);
	ck_assert_int_eq(kvpq_init(pq, &t.pq, seed), 0);
}

/* The layout by hand: fp16 radii of the rotated vector's polar form, then the codes. */
START_TEST(row_layout_by_hand)
{
	static const char *const names[] = { "pq", "pq3f", "pq6", "pq5f" };
	uint64_t st = test_seed();
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		enum { D = 64 };
		KvPq pq;
		codec_of(names[i], D, 7 + i, &pq);
		const KvPqShape *s = &pq.rows.shape;
		float x[D], y[D];
		uint8_t row[TQ_MAX_DIM * 2], want[TQ_MAX_DIM * 2];
		for (int r = 0; r < 20; r++) {
			for (int j = 0; j < D; j++)
				x[j] = 3 * test_rand_normal(&st);
			kvpq_encode(&pq, x, row);
			rotation_apply(pq.rot, x, y);
			memset(want, 0, sizeof(want));
			uint8_t codes[TQ_MAX_DIM];
			size_t bit = 0;
			uint8_t *cs = want + kvpq_radii_bytes(s);
			for (int l = 1; l <= s->levels; l++) {
				int n = D >> l;
				const KvPqAngles *a;
				ck_assert_int_eq(kvpq_angles_get(l, s->bits[l - 1], &a), 0);
				for (int p = 0; p < n; p++) {
					double psi = atan2(y[p + n], y[p]);
					if (psi < 0)
						psi += 2 * PI;
					/* the nearest centroid in angle */
					int best = 0;
					for (int k = 1; k < a->n; k++)
						if (fabs(psi - a->centroid[k]) < fabs(psi - a->centroid[best]))
							best = k;
					codes[p] = (uint8_t)best;
					y[p] = (float)hypot(y[p], y[p + n]);
				}
				for (int p = 0; p < n; p++)
					for (int k = 0; k < s->bits[l - 1]; k++, bit++)
						cs[bit / 8] |= (uint8_t)(((codes[p] >> k) & 1) << (bit % 8));
			}
			for (int p = 0; p < (D >> s->levels); p++) {
				tkv_half h = f32_to_half(y[p]);
				want[2 * p] = (uint8_t)h;
				want[2 * p + 1] = (uint8_t)(h >> 8);
			}
			ck_assert_uint_eq(kvpq_row_bytes(s), kvpq_radii_bytes(s) + (bit + 7) / 8);
			/* a psi exactly between two centroids may round either way in float: allow none here */
			ck_assert_msg(memcmp(row, want, kvpq_row_bytes(s)) == 0, "%s row %d", names[i], r);
		}
		kvpq_fini(&pq);
	}
}
END_TEST

/*
 * Monte Carlo distortion over random unit vectors through the whole codec
 * (rotation included) against E_L, and falling with bits. Prints the
 * table against TurboQuant's D_mse at the same head_dim.
 */
START_TEST(distortion_matches_theory)
{
	static const char *const names[] = { "pq1", "pq3f", "pq3", "pq4f", "pq", "pq5f", "pq5", "pq6" };
	enum { D = 64, N = 3000 };
	uint64_t st = test_seed();
	double prev_bits = 0, prev_e = 1e9;
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		KvPq pq;
		codec_of(names[i], D, 100 + i, &pq);
		double theory = kvpq_distortion(&pq.rows.shape), sum = 0, norm_err = 0;
		float x[D], xr[D];
		uint8_t row[TQ_MAX_DIM * 2];
		for (int v = 0; v < N; v++) {
			double n2 = 0;
			for (int j = 0; j < D; j++) {
				x[j] = test_rand_normal(&st);
				n2 += x[j] * x[j];
			}
			for (int j = 0; j < D; j++)
				x[j] /= (float)sqrt(n2);
			kvpq_encode(&pq, x, row);
			kvpq_decode(&pq, row, xr);
			double e = 0, m = 0;
			for (int j = 0; j < D; j++) {
				e += (x[j] - xr[j]) * (x[j] - xr[j]);
				m += xr[j] * xr[j];
			}
			sum += e;
			norm_err = fmax(norm_err, fabs(sqrt(m) - 1));
		}
		double mc = sum / N;
		double bits = kvpq_row_bytes(&pq.rows.shape) * 8.0 / D;
		printf("%-5s %.4f bits/value: E||u - u~||^2 = %.5f (theory %.5f)\n", names[i], bits, mc, theory);
		/* the Monte Carlo error of the mean is ~ theory / sqrt(N) / 2 */
		ck_assert_msg(fabs(mc - theory) < 0.05 * theory, "%s: %g vs %g", names[i], mc, theory);
		/* norms are kept: up to fp16 rounding of the radii (a level-L block each) */
		ck_assert_msg(norm_err < 2e-3, "%s: norm off by %g", names[i], norm_err);
		if (bits > prev_bits)
			ck_assert_msg(theory < prev_e, "%s: more bits, no less distortion", names[i]);
		prev_bits = bits;
		prev_e = theory;
		kvpq_fini(&pq);
	}
	/* TurboQuant at matched bits, for the record (and the design note's claim) */
	for (int b = 2; b <= 4; b++) {
		const Codebook *cb;
		ck_assert_int_eq(codebook_get(D, b, &cb), 0);
		printf("tq%d   %.4f bits/value: D_mse = %.5f\n", b, b + 16.0 / D, cb->mse);
	}
}
END_TEST

/* Scores on the codes (the reference kernel) are <q, x~> of the decoded keys. */
START_TEST(scores_are_decoded_dot_products)
{
	static const char *const names[] = { "pq", "pq3f", "pq6", "pq2" };
	enum { D = 64, N = 32, G = 3 };
	uint64_t st = test_seed();
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		KvPq pq;
		codec_of(names[i], D, 11 + i, &pq);
		size_t rb = pq.rows.row_bytes, qf = kvpq_query_floats(&pq);
		uint8_t *rows = calloc(N, rb);
		float *prep = malloc(G * qf * sizeof(float));
		float x[N][D], q[G][D], scores[G * N], acc[G * D], out[D];
		for (int t = 0; t < N; t++) {
			for (int j = 0; j < D; j++)
				x[t][j] = test_rand_normal(&st) + (j == 3 ? 4.0f : 0.0f);
			kvpq_encode(&pq, x[t], rows + t * rb);
		}
		for (int g = 0; g < G; g++) {
			for (int j = 0; j < D; j++)
				q[g][j] = test_rand_normal(&st);
			kvpq_query_prepare(&pq, q[g], prep + g * qf);
		}
		kv_attn_pq_scores_ref(&pq.rows, prep, G, rows, N, 0.5f, scores, N);
		memset(acc, 0, sizeof(acc));
		float p[G * N];
		for (int k = 0; k < G * N; k++)
			p[k] = test_rand_uniform(&st);
		kv_attn_pq_values_ref(&pq.rows, p, N, G, rows, N, acc, D);
		for (int g = 0; g < G; g++) {
			double want_v[D] = { 0 };
			for (int t = 0; t < N; t++) {
				float xr[D];
				kvpq_decode(&pq, rows + t * rb, xr);
				double dot = 0, mag = 0;
				for (int j = 0; j < D; j++) {
					dot += (double)q[g][j] * xr[j];
					mag += fabs((double)q[g][j] * xr[j]);
					want_v[j] += p[g * N + t] * xr[j];
				}
				ck_assert_msg(fabs(scores[g * N + t] - 0.5 * dot) < 1e-5 * (1 + mag),
					      "%s head %d key %d: %g vs %g", names[i], g, t, scores[g * N + t],
					      0.5 * dot);
			}
			kvpq_finish(&pq, acc + g * D, out);
			for (int j = 0; j < D; j++)
				ck_assert_msg(fabs(out[j] - want_v[j]) < 1e-4 * (1 + fabs(want_v[j])),
					      "%s head %d value coordinate %d: %g vs %g", names[i], g, j, out[j],
					      want_v[j]);
		}
		free(rows);
		free(prep);
		kvpq_fini(&pq);
	}
}
END_TEST

/* Non-finite input stores a zero row; a zero vector reads back as zero. */
START_TEST(degenerate_input)
{
	enum { D = 64 };
	KvPq pq;
	codec_of("pq", D, 3, &pq);
	float x[D] = { 0 }, xr[D];
	uint8_t row[64];
	kvpq_encode(&pq, x, row);
	kvpq_decode(&pq, row, xr);
	for (int j = 0; j < D; j++)
		ck_assert_float_eq(xr[j], 0.0f);
	x[5] = NAN;
	kvpq_encode(&pq, x, row);
	for (size_t i = 0; i < pq.rows.row_bytes; i++)
		ck_assert_uint_eq(row[i], 0);
	x[5] = 1e30f; /* radii clamp at the largest binary16 */
	kvpq_encode(&pq, x, row);
	kvpq_decode(&pq, row, xr);
	for (int j = 0; j < D; j++)
		ck_assert(isfinite(xr[j]));
	kvpq_fini(&pq);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kvpq");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, densities_normalised_at_pi_over_4);
	tcase_add_test(tc, densities_match_gaussian_angles);
	tcase_add_test(tc, codebooks_are_lloyd_optimal);
	tcase_add_test(tc, deeper_levels_need_fewer_bits);
	tcase_add_test(tc, names_and_bytes);
	tcase_add_test(tc, row_layout_by_hand);
	tcase_add_test(tc, distortion_matches_theory);
	tcase_add_test(tc, scores_are_decoded_dot_products);
	tcase_add_test(tc, degenerate_input);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
