/*
 * codebook.c: Lloyd-Max codebooks for a coordinate of a uniform point on
 * S^{d-1} (codebook.h says what and how), and the process-wide cache of
 * solved codebooks. Not here: quantizing vectors (tq.c).
 *
 * Everything runs on the positive half-line (the codebook is symmetric)
 * in the variable theta = asin(t), where the density of |t| is
 * g(theta) = cos^(d-2)(theta) / Z on [0, pi/2]: smooth for every d >= 2.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/codebook.h"

#define GRID_INTERVALS (1 << 15)
#define THETA_SIGMAS 14.0      /* theta_max in units of 1 / sqrt(d) */
#define NEWTON_MAX_ITERS 200
#define LINE_SEARCH_HALVINGS 30

/* 4-point Gauss-Legendre on [-1, 1] */
static const double gl_x[4] = { -0.86113631159405257522, -0.33998104358485626480,
				0.33998104358485626480, 0.86113631159405257522 };
static const double gl_w[4] = { 0.34785484513745385737, 0.65214515486254614263,
				0.65214515486254614263, 0.34785484513745385737 };

/* The density of |t| in theta, tabulated: cum[3 j + k] = int_0^{j h} sin^k g. */
typedef struct Density {
	int d;
	int m;              /* grid intervals */
	double theta_max;
	double t_max;       /* sin(theta_max) */
	double h;           /* theta_max / m */
	double inv_z;       /* 1 / int_0^theta_max cos^(d-2) */
	double *cum;        /* (m + 1, 3) normalised cumulative moments */
	double *comp;       /* (m + 1,) cumulative of the companding density g^(1/3) cos^(2/3) */
} Density;

static void density_done(Density *D)
{
	free(D->cum);
	free(D->comp);
}

static inline double g_raw(const Density *D, double theta)
{
	return pow(cos(theta), D->d - 2);
}

/* out[k] += int_a^b sin^k(theta) g_raw(theta) dtheta for k = 0, 1, 2 (4-point GL). */
static void moments_add(const Density *D, double a, double b, double out[3])
{
	double half = 0.5 * (b - a), mid = 0.5 * (a + b);
	for (int i = 0; i < 4; i++) {
		double th = mid + half * gl_x[i];
		double w = half * gl_w[i] * g_raw(D, th), s = sin(th);
		out[0] += w;
		out[1] += w * s;
		out[2] += w * s * s;
	}
}

/* Tabulate the cumulative moments (Kahan-summed) and the companding cumulative. */
static int density_init(Density *D, int d)
{
	memset(D, 0, sizeof(*D));
	D->d = d;
	D->m = GRID_INTERVALS;
	D->theta_max = MIN(M_PI / 2, THETA_SIGMAS / sqrt((double)d));
	D->t_max = D->theta_max >= M_PI / 2 ? 1.0 : sin(D->theta_max);
	D->h = D->theta_max / D->m;
	D->cum = malloc_array(3 * ((size_t)D->m + 1), sizeof(double));
	D->comp = malloc_array((size_t)D->m + 1, sizeof(double));
	if (!D->cum || !D->comp)
		return -ENOMEM;

	double sum[3] = { 0, 0, 0 }, comp[3] = { 0, 0, 0 }, csum = 0;
	D->cum[0] = D->cum[1] = D->cum[2] = 0;
	D->comp[0] = 0;
	for (int j = 0; j < D->m; j++) {
		double a = j * D->h, b = (j + 1) * D->h, piece[3] = { 0, 0, 0 };
		moments_add(D, a, b, piece);
		for (int k = 0; k < 3; k++) {
			double y = piece[k] - comp[k], t = sum[k] + y;
			comp[k] = (t - sum[k]) - y;
			sum[k] = t;
			D->cum[3 * (size_t)(j + 1) + k] = t;
		}
		/* companding density: a plain midpoint rule is plenty for a start */
		double mid = 0.5 * (a + b), c = cos(mid);
		csum += D->h * cbrt(g_raw(D, mid) * c * c);
		D->comp[j + 1] = csum;
	}

	/* the analytic half mass, sqrt(pi) Gamma((d-1)/2) / (2 Gamma(d/2)), checks the table */
	double z = sum[0];
	double exact = 0.5 * exp(0.5 * log(M_PI) + lgamma(0.5 * (d - 1)) - lgamma(0.5 * d));
	if (!(fabs(z - exact) <= 1e-10 * exact))
		return -EDOM;
	D->inv_z = 1.0 / z;
	for (size_t i = 0; i < 3 * ((size_t)D->m + 1); i++)
		D->cum[i] *= D->inv_z;
	return 0;
}

static double t_to_theta(const Density *D, double t)
{
	return t >= D->t_max ? D->theta_max : asin(t);
}

/* Normalised int_0^theta sin^k g for k = 0, 1, 2 into out. */
static void density_cumulative(const Density *D, double theta, double out[3])
{
	if (theta >= D->theta_max) {
		memcpy(out, D->cum + 3 * (size_t)D->m, 3 * sizeof(double));
		return;
	}
	int j = (int)(theta / D->h);
	j = MIN(MAX(j, 0), D->m - 1);
	double part[3] = { 0, 0, 0 };
	moments_add(D, j * D->h, theta, part);
	for (int k = 0; k < 3; k++)
		out[k] = D->cum[3 * (size_t)j + k] + part[k] * D->inv_z;
}

/* The density of |t| at t (0 <= t < 1), in t units. */
static double density_at(const Density *D, double t)
{
	double th = t_to_theta(D, t);
	return g_raw(D, th) * D->inv_z / cos(th);
}

/* Solver state for the K positive centroids. */
typedef struct Solver {
	const Density *D;
	int K;
	double *c;       /* (K,) centroids, ascending, > 0 */
	double *cum;     /* (K + 1, 3) cumulative moments at the cell edges */
	double *mass;    /* (K,) cell mass */
	double *mean;    /* (K,) conditional mean of each cell */
} Solver;

/* Cell edge i in t (0 <= i <= K): 0, midpoints, t_max. */
static double edge(const Solver *S, const double *c, int i)
{
	if (i == 0)
		return 0;
	if (i == S->K)
		return S->D->t_max;
	return 0.5 * (c[i - 1] + c[i]);
}

/* Cell masses and conditional means for centroids c; returns max |c - mean|. */
static double solver_eval(Solver *S, const double *c)
{
	double r = 0;
	for (int i = 0; i <= S->K; i++)
		density_cumulative(S->D, t_to_theta(S->D, edge(S, c, i)), S->cum + 3 * i);
	for (int k = 0; k < S->K; k++) {
		const double *lo = S->cum + 3 * k, *hi = S->cum + 3 * (k + 1);
		S->mass[k] = hi[0] - lo[0];
		S->mean[k] = (hi[1] - lo[1]) / S->mass[k];
		r = MAX(r, fabs(c[k] - S->mean[k]));
	}
	return r;
}

static bool centroids_valid(const Solver *S, const double *c)
{
	if (!(c[0] > 0) || !(c[S->K - 1] < S->D->t_max))
		return false;
	for (int k = 1; k < S->K; k++)
		if (!(c[k] > c[k - 1]))
			return false;
	return true;
}

/*
 * Newton step for F(c) = c - mean(c) = 0 (after solver_eval(c)): solve the
 * tridiagonal J delta = -F, where dmean_k/dedge = f(edge)(edge - mean_k)/mass_k
 * and each inner edge moves by half of each neighbouring centroid.
 */
static void solver_newton_step(const Solver *S, const double *c, double *delta, double *work)
{
	int K = S->K;
	double *lower = work, *diag = work + K, *upper = work + 2 * K;
	for (int k = 0; k < K; k++) {
		double dlo = 0, dhi = 0;
		if (k > 0) {
			double e = edge(S, c, k);
			dlo = density_at(S->D, e) * (S->mean[k] - e) / S->mass[k];
		}
		if (k < K - 1) {
			double e = edge(S, c, k + 1);
			dhi = density_at(S->D, e) * (e - S->mean[k]) / S->mass[k];
		}
		lower[k] = -0.5 * dlo;
		upper[k] = -0.5 * dhi;
		diag[k] = 1 - 0.5 * (dlo + dhi);
		delta[k] = -(c[k] - S->mean[k]);
	}
	/* Thomas algorithm */
	for (int k = 1; k < K; k++) {
		double w = lower[k] / diag[k - 1];
		diag[k] -= w * upper[k - 1];
		delta[k] -= w * delta[k - 1];
	}
	delta[K - 1] /= diag[K - 1];
	for (int k = K - 2; k >= 0; k--)
		delta[k] = (delta[k] - upper[k] * delta[k + 1]) / diag[k];
}

/* Initial centroids: quantiles (k + 1/2) / K of the companding density f^(1/3). */
static void solver_init(Solver *S)
{
	const Density *D = S->D;
	double total = D->comp[D->m];
	int j = 0;
	for (int k = 0; k < S->K; k++) {
		double target = (k + 0.5) / S->K * total;
		while (j < D->m - 1 && D->comp[j + 1] < target)
			j++;
		double frac = (target - D->comp[j]) / (D->comp[j + 1] - D->comp[j]);
		S->c[k] = sin((j + frac) * D->h);
	}
}

/* Solve the K positive centroids into S->c. Returns 0 or -EDOM. */
static int solver_run(Solver *S)
{
	int K = S->K;
	double tol = 1e-13 / sqrt((double)S->D->d);
	_cleanup_(freep) double *buf = malloc_array(5 * (size_t)K, sizeof(double));
	if (!buf)
		return -ENOMEM;
	double *delta = buf, *trial = buf + K, *work = buf + 2 * K;

	solver_init(S);
	double res = solver_eval(S, S->c);
	for (int it = 0; it < NEWTON_MAX_ITERS; it++) {
		solver_newton_step(S, S->c, delta, work);
		double lambda = 1, step = 0, res_trial = 0;
		bool ok = false;
		for (int h = 0; h < LINE_SEARCH_HALVINGS && !ok; h++, lambda *= 0.5) {
			for (int k = 0; k < K; k++)
				trial[k] = S->c[k] + lambda * delta[k];
			if (!centroids_valid(S, trial))
				continue;
			res_trial = solver_eval(S, trial);
			ok = res_trial < res;
		}
		if (!ok) {
			/* at the rounding floor or off course: one Lloyd step (centroids <- means) */
			solver_eval(S, S->c);
			memcpy(trial, S->mean, (size_t)K * sizeof(double));
			res_trial = solver_eval(S, trial);
		}
		for (int k = 0; k < K; k++)
			step = MAX(step, fabs(trial[k] - S->c[k]));
		memcpy(S->c, trial, (size_t)K * sizeof(double));
		res = res_trial;
		if (step < tol)
			return 0;
	}
	return res < 1e3 * tol ? 0 : -EDOM;
}

int codebook_solve(int dim, int bits, Codebook *ret)
{
	if (dim < 2 || dim > CODEBOOK_MAX_DIM || bits < 1 || bits > CODEBOOK_MAX_BITS)
		return -EINVAL;

	int n = 1 << bits, K = n / 2, r;
	__attribute__((cleanup(density_done))) Density D = { 0 };
	if ((r = density_init(&D, dim)) < 0)
		return r;

	_cleanup_(freep) double *buf = malloc_array(3 * (size_t)K + 3 * ((size_t)K + 1), sizeof(double));
	if (!buf)
		return -ENOMEM;
	Solver S = { .D = &D, .K = K, .c = buf, .mass = buf + K, .mean = buf + 2 * K,
		     .cum = buf + 3 * K };
	if ((r = solver_run(&S)) < 0)
		return r;

	/* distortion sum_k int_cell (t - c_k)^2 g over the half line = per-coordinate MSE */
	solver_eval(&S, S.c);
	double mse = 0;
	for (int k = 0; k < K; k++) {
		const double *lo = S.cum + 3 * k, *hi = S.cum + 3 * (k + 1);
		double c = S.c[k];
		mse += (hi[2] - lo[2]) - 2 * c * (hi[1] - lo[1]) + c * c * (hi[0] - lo[0]);
	}

	Codebook cb;
	memset(&cb, 0, sizeof(cb));
	cb.dim = dim;
	cb.bits = bits;
	cb.n_levels = n;
	for (int k = 0; k < K; k++) {
		cb.centroids[K + k] = (float)S.c[k];
		cb.centroids[K - 1 - k] = -(float)S.c[k];
	}
	cb.boundaries[K - 1] = 0.0f;
	for (int k = 0; k + 1 < K; k++) {
		float b = (float)(0.5 * (S.c[k] + S.c[k + 1]));
		cb.boundaries[K + k] = b;
		cb.boundaries[K - 2 - k] = -b;
	}
	cb.mse_coord = mse;
	cb.mse = dim * mse;
	*ret = cb;
	return 0;
}

/* ---- the cache ---- */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static Codebook **cache;       /* solved codebooks, never freed */
static size_t cache_n, cache_cap;

int codebook_get(int dim, int bits, const Codebook **ret)
{
	if (dim < 2 || dim > CODEBOOK_MAX_DIM || bits < 1 || bits > CODEBOOK_MAX_BITS)
		return -EINVAL;

	int r = 0;
	pthread_mutex_lock(&cache_lock);
	for (size_t i = 0; i < cache_n; i++)
		if (cache[i]->dim == dim && cache[i]->bits == bits) {
			*ret = cache[i];
			goto out;
		}
	if (cache_n == cache_cap) {
		size_t cap = cache_cap ? 2 * cache_cap : 16;
		Codebook **grown = realloc(cache, cap * sizeof(*grown));
		if (!grown) {
			r = -ENOMEM;
			goto out;
		}
		cache = grown;
		cache_cap = cap;
	}
	Codebook *cb = malloc(sizeof(*cb));
	if (!cb) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = codebook_solve(dim, bits, cb)) < 0) {
		free(cb);
		goto out;
	}
	cache[cache_n++] = cb;
	*ret = cb;
out:
	pthread_mutex_unlock(&cache_lock);
	return r;
}
