/*
 * kvpq.c: the PolarQuant codec (kvpq.h): angle densities and codebooks,
 * encoding, decoding, query preparation.
 */
#include "engine/codec/kvpq.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "kernels/tq_layout.h"

#define GRID 65536        /* intervals of [0, pi/2] for the deeper levels' integrals */
#define LLOYD_MAX_ITER 400000
#define LLOYD_TOL 1e-12

static const double TWO_PI = 6.283185307179586476925286766559;
static const double HALF_PI = 1.5707963267948966192313216916398;

/* ---- densities ---- */

/* log of the closed-form normalisation Gamma(m) / (2^(m-2) Gamma(m/2)^2). */
static double log_norm(int m)
{
	return lgamma((double)m) - (m - 2) * log(2.0) - 2.0 * lgamma(m / 2.0);
}

double kvpq_angle_density(int level, double psi)
{
	if (level == 1)
		return psi >= 0 && psi < TWO_PI ? 1.0 / TWO_PI : 0.0;
	if (level < 1 || level > KVPQ_MAX_LEVELS || !(psi > 0 && psi < HALF_PI))
		return 0.0;
	int m = 1 << (level - 1);
	return exp(log_norm(m) + (m - 1) * log(sin(2.0 * psi)));
}

/* ---- codebooks ---- */

/* Cumulative integrals of f, f cos, f sin on the grid (GRID + 1 points each). */
typedef struct Tables {
	double *f0, *fc, *fs;
} Tables;

static void tables_free(Tables *t)
{
	free(t->f0);
	free(t->fc);
	free(t->fs);
}

static int tables_build(int level, Tables *t)
{
	static const double gx[3] = { -0.77459666924148337704, 0.0, 0.77459666924148337704 };
	static const double gw[3] = { 5.0 / 9.0, 8.0 / 9.0, 5.0 / 9.0 };
	const double h = HALF_PI / GRID;
	t->f0 = malloc((GRID + 1) * sizeof(double));
	t->fc = malloc((GRID + 1) * sizeof(double));
	t->fs = malloc((GRID + 1) * sizeof(double));
	if (!t->f0 || !t->fc || !t->fs) {
		tables_free(t);
		return -ENOMEM;
	}
	t->f0[0] = t->fc[0] = t->fs[0] = 0.0;
	for (int i = 0; i < GRID; i++) {
		double a0 = 0, ac = 0, as = 0, mid = (i + 0.5) * h;
		for (int k = 0; k < 3; k++) {
			double x = mid + gx[k] * h / 2, w = gw[k] * h / 2 * kvpq_angle_density(level, x);
			a0 += w;
			ac += w * cos(x);
			as += w * sin(x);
		}
		t->f0[i + 1] = t->f0[i] + a0;
		t->fc[i + 1] = t->fc[i] + ac;
		t->fs[i + 1] = t->fs[i] + as;
	}
	/* the closed form must agree with the quadrature */
	if (fabs(t->f0[GRID] - 1.0) > 1e-9) {
		tables_free(t);
		return -EDOM;
	}
	return 0;
}

/* F(x) of a cumulative table, linear between grid points. */
static double cum(const double *F, double x)
{
	const double h = HALF_PI / GRID;
	if (x <= 0)
		return 0.0;
	if (x >= HALF_PI)
		return F[GRID];
	double u = x / h;
	int i = (int)u;
	if (i >= GRID)
		i = GRID - 1;
	return F[i] + (u - i) * (F[i + 1] - F[i]);
}

/* Level >= 2: Lloyd for the distortion 1 - cos(psi - c) on [0, pi/2]. */
static int solve_deep(int level, int bits, KvPqAngles *a)
{
	int n = 1 << bits;
	Tables t;
	int r = tables_build(level, &t);
	if (r)
		return r;
	double c[1 << KVPQ_MAX_BITS], mc[1 << KVPQ_MAX_BITS], ms[1 << KVPQ_MAX_BITS];
	/* start at the quantiles (k + 1/2) / n */
	for (int k = 0, i = 0; k < n; k++) {
		double want = (k + 0.5) / n;
		while (i < GRID - 1 && t.f0[i + 1] < want)
			i++;
		double span = t.f0[i + 1] - t.f0[i];
		c[k] = (i + (span > 0 ? (want - t.f0[i]) / span : 0.5)) * (HALF_PI / GRID);
	}
	double moved = 1.0;
	int iter;
	for (iter = 0; iter < LLOYD_MAX_ITER && moved > LLOYD_TOL; iter++) {
		moved = 0.0;
		double lo = 0.0;
		for (int k = 0; k < n; k++) {
			double hi = k + 1 < n ? 0.5 * (c[k] + c[k + 1]) : HALF_PI;
			mc[k] = cum(t.fc, hi) - cum(t.fc, lo);
			ms[k] = cum(t.fs, hi) - cum(t.fs, lo);
			lo = hi;
		}
		for (int k = 0; k < n; k++) {
			if (mc[k] * mc[k] + ms[k] * ms[k] <= 0)
				continue; /* a cell without mass keeps its place */
			double nc = atan2(ms[k], mc[k]);
			moved = fmax(moved, fabs(nc - c[k]));
			c[k] = nc;
		}
	}
	if (moved > 1e-9) {
		tables_free(&t);
		return -EDOM;
	}
	double lo = 0.0, kept = 0.0;
	for (int k = 0; k < n; k++) {
		double hi = k + 1 < n ? 0.5 * (c[k] + c[k + 1]) : HALF_PI;
		kept += cos(c[k]) * (cum(t.fc, hi) - cum(t.fc, lo)) + sin(c[k]) * (cum(t.fs, hi) - cum(t.fs, lo));
		a->centroid[k] = (float)c[k];
		if (k + 1 < n)
			a->bound[k] = (float)hi;
		lo = hi;
	}
	a->delta = 1.0 - kept;
	tables_free(&t);
	return 0;
}

static int solve(int level, int bits, KvPqAngles *a)
{
	memset(a, 0, sizeof(*a));
	a->level = level;
	a->bits = bits;
	a->n = 1 << bits;
	if (level == 1) {
		/* the regular polygon: exact for the uniform law on the circle */
		double w = TWO_PI / a->n;
		for (int k = 0; k < a->n; k++) {
			a->centroid[k] = (float)((k + 0.5) * w);
			if (k + 1 < a->n)
				a->bound[k] = (float)((k + 1) * w);
		}
		a->delta = 1.0 - sin(w / 2) / (w / 2);
	} else {
		int r = solve_deep(level, bits, a);
		if (r)
			return r;
	}
	for (int k = 0; k < a->n; k++) {
		a->cosv[k] = (float)cos((double)a->centroid[k]);
		a->sinv[k] = (float)sin((double)a->centroid[k]);
	}
	return 0;
}

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static KvPqAngles *cache[KVPQ_MAX_LEVELS][KVPQ_MAX_BITS]; /* never freed */

int kvpq_angles_get(int level, int bits, const KvPqAngles **ret)
{
	if (level < 1 || level > KVPQ_MAX_LEVELS || bits < 1 || bits > KVPQ_MAX_BITS)
		return -EINVAL;
	int r = 0;
	pthread_mutex_lock(&cache_lock);
	KvPqAngles **slot = &cache[level - 1][bits - 1];
	if (!*slot) {
		KvPqAngles *a = malloc(sizeof(*a));
		if (!a)
			r = -ENOMEM;
		else if ((r = solve(level, bits, a)) < 0)
			free(a);
		else
			*slot = a;
	}
	if (!r)
		*ret = *slot;
	pthread_mutex_unlock(&cache_lock);
	return r;
}

int kvpq_angles_quantize(const KvPqAngles *a, float psi)
{
	if (!(psi >= 0.0f))
		return 0; /* NaN (a vector that overflowed) */
	if (a->level == 1) {
		int k = (int)((double)psi * (a->n / TWO_PI));
		return k < 0 ? 0 : k >= a->n ? a->n - 1 : k;
	}
	int idx = 0;
	for (int step = a->n >> 1; step > 0; step >>= 1)
		idx += psi >= a->bound[idx + step - 1] ? step : 0;
	return idx;
}

/* ---- shapes ---- */

bool kvpq_shape_valid(const KvPqShape *s)
{
	if (s->levels < 1 || s->levels > KVPQ_MAX_LEVELS || s->dim < 2 || s->dim > TQ_MAX_DIM ||
	    s->dim % (1 << s->levels) != 0)
		return false;
	for (int l = 0; l < s->levels; l++)
		if (s->bits[l] < 1 || s->bits[l] > KVPQ_MAX_BITS)
			return false;
	return true;
}

double kvpq_distortion(const KvPqShape *s)
{
	double e = 0.0;
	for (int l = 1; l <= s->levels; l++) {
		const KvPqAngles *a;
		if (kvpq_angles_get(l, s->bits[l - 1], &a) < 0)
			return NAN;
		e = 2.0 * a->delta + (1.0 - a->delta) * e;
	}
	return e;
}

/* ---- the codec ---- */

int kvpq_init(KvPq *pq, const KvPqShape *s, uint64_t seed)
{
	memset(pq, 0, sizeof(*pq));
	if (!kvpq_shape_valid(s))
		return -EINVAL;
	pq->rows.shape = *s;
	pq->rows.row_bytes = kvpq_row_bytes(s);
	for (int l = 1; l <= s->levels; l++) {
		int r = kvpq_angles_get(l, s->bits[l - 1], &pq->angles[l - 1]);
		if (r < 0)
			return r;
		pq->rows.cosv[l - 1] = pq->angles[l - 1]->cosv;
		pq->rows.sinv[l - 1] = pq->angles[l - 1]->sinv;
	}
	return rotation_new(ROTATION_AUTO, s->dim, 2, seed, &pq->rot);
}

void kvpq_fini(KvPq *pq)
{
	pq->rot = rotation_free(pq->rot);
}

size_t kvpq_bytes(const KvPq *pq)
{
	return pq->rot ? rotation_bytes(pq->rot) : 0;
}

void kvpq_encode(const KvPq *pq, const float *x, uint8_t *row)
{
	const KvPqShape *s = &pq->rows.shape;
	const int d = s->dim, L = s->levels;
	float y[TQ_MAX_DIM];
	memset(row, 0, pq->rows.row_bytes);
	for (int i = 0; i < d; i++)
		if (!isfinite(x[i]))
			return;
	rotation_apply(pq->rot, x, y);
	uint8_t *codes = row + kvpq_radii_bytes(s);
	size_t bit = 0;
	for (int l = 1; l <= L; l++) {
		int nl = kvpq_level_n(s, l), b = s->bits[l - 1];
		for (int p = 0; p < nl; p++) {
			double u = y[p], v = y[p + nl];
			double psi = atan2(v, u);
			if (psi < 0)
				psi += TWO_PI; /* level 1 only: radii are >= 0 */
			unsigned c = (unsigned)kvpq_angles_quantize(pq->angles[l - 1], (float)psi);
			for (int k = 0; k < b; k++, bit++)
				codes[bit >> 3] |= (uint8_t)(((c >> k) & 1u) << (bit & 7));
			y[p] = (float)hypot(u, v);
		}
	}
	for (int p = 0; p < kvpq_level_n(s, L); p++) {
		float r = fminf(y[p], 65504.0f); /* the largest finite binary16 */
		put_le(row + 2 * p, f32_to_half(r), 2);
	}
}

void kvpq_decode_rotated(const KvPq *pq, const uint8_t *row, float *y)
{
	/* the value kernel's reference with one weight of 1: y = 0 + 1 y~, exactly */
	const float one = 1.0f;
	memset(y, 0, (size_t)pq->rows.shape.dim * sizeof(float));
	kv_attn_pq_values_ref(&pq->rows, &one, 1, 1, row, 1, y, pq->rows.shape.dim);
}

void kvpq_decode(const KvPq *pq, const uint8_t *row, float *x)
{
	kvpq_decode_rotated(pq, row, x);
	rotation_apply_inverse(pq->rot, x, x);
}

size_t kvpq_query_floats(const KvPq *pq)
{
	return kv_attn_pq_query_floats(&pq->rows);
}

void kvpq_query_prepare(const KvPq *pq, const float *q, float *prep)
{
	const KvPqShape *s = &pq->rows.shape;
	int n1 = kvpq_level_n(s, 1), b = s->bits[0];
	rotation_apply(pq->rot, q, prep);
	const float *cv = pq->rows.cosv[0], *sv = pq->rows.sinv[0];
	float *t1 = prep + s->dim;
	for (int p = 0; p < n1; p++)
		for (int c = 0; c < 1 << b; c++)
			t1[((size_t)p << b) + c] = cv[c] * prep[p] + sv[c] * prep[p + n1];
}

void kvpq_finish(const KvPq *pq, const float *acc, float *out)
{
	rotation_apply_inverse(pq->rot, acc, out);
}
