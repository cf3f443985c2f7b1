/*
 * rotation.c: the seeded orthogonal transforms of rotation.h (randomized
 * Hadamard through an in-place FWHT, dense Haar-random Q from a Householder
 * QR) and the generator they are built from. The generator and the order
 * in which P consumes it are part of the on-disk format: see rotation.h.
 * Not here: what is rotated (tq.c) and how seeds are derived per layer.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/rotation.h"

struct Rotation {
	RotationKind kind;
	int dim;
	int rounds;           /* Hadamard: 1 or 2; dense: 0 */
	uint64_t seed;
	float *signs1;        /* (d,) +-1 of D_1 (Hadamard) */
	float *signs2;        /* (d,) +-1 of D_2, NULL for one round */
	float *signs1_scaled; /* (d,) signs1 * d^(-rounds/2): the scale folded in */
	float *p;             /* (d, d) row-major P (dense) */
	float *pt;            /* (d, d) row-major P^T (dense) */
	float *mem;           /* the one allocation behind the arrays above */
};

/* ---- generator ---- */

static uint64_t splitmix64(uint64_t *z)
{
	uint64_t x = (*z += 0x9e3779b97f4a7c15ull);
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

void rng_init(Rng *rng, uint64_t seed)
{
	uint64_t z = seed;
	for (int i = 0; i < 4; i++)
		rng->s[i] = splitmix64(&z);
}

uint64_t rng_next(Rng *rng)
{
	uint64_t *s = rng->s;
	uint64_t r = rotl64(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl64(s[3], 45);
	return r;
}

void rng_fill_normal(Rng *rng, double *out, size_t n)
{
	const double two_pi = 6.283185307179586476925286766559;
	for (size_t i = 0; i < n; i += 2) {
		double u1 = (double)((rng_next(rng) >> 11) + 1) * 0x1p-53;
		double u2 = (double)(rng_next(rng) >> 11) * 0x1p-53;
		double rad = sqrt(-2.0 * log(u1));
		out[i] = rad * cos(two_pi * u2);
		if (i + 1 < n)
			out[i + 1] = rad * sin(two_pi * u2);
	}
}

/* ---- fast Walsh-Hadamard transform ---- */

/* Butterflies a[j], b[j] -> a[j] + b[j], a[j] - b[j] over h values (vectorizes). */
static inline void fwht_butterfly(float *restrict a, float *restrict b, int h)
{
	for (int j = 0; j < h; j++) {
		float u = a[j], v = b[j];
		a[j] = u + v;
		b[j] = u - v;
	}
}

void fwht(float *x, int n)
{
	assert(n >= 1 && (n & (n - 1)) == 0);
	int h = 1;
	if (n >= 4) {
		/* strides 1 and 2 at once, one radix-4 block at a time */
		for (int i = 0; i < n; i += 4) {
			float a = x[i] + x[i + 1], b = x[i] - x[i + 1];
			float c = x[i + 2] + x[i + 3], d = x[i + 2] - x[i + 3];
			x[i] = a + c;
			x[i + 1] = b + d;
			x[i + 2] = a - c;
			x[i + 3] = b - d;
		}
		h = 4;
	}
	if (n >= 8) {
		/* stride 4: fixed-length butterflies GCC turns into one vector op each */
		for (int i = 0; i < n; i += 8)
			fwht_butterfly(x + i, x + i + 4, 4);
		h = 8;
	}
	for (; h < n; h *= 2)
		for (int i = 0; i < n; i += 2 * h)
			fwht_butterfly(x + i, x + i + h, h);
}

/* ---- dense: Householder QR of a Gaussian matrix ---- */

/* Apply the reflector I - 2 v v^T (v unit, rows k..d-1) to columns k0..d-1 of a (d, d). */
static void householder_apply(double *a, int d, int k, int k0, const double *v, double *w)
{
	for (int j = k0; j < d; j++)
		w[j] = 0;
	for (int i = k; i < d; i++) {
		const double *row = a + (size_t)i * d;
		double vi = v[i];
		for (int j = k0; j < d; j++)
			w[j] += vi * row[j];
	}
	for (int i = k; i < d; i++) {
		double *row = a + (size_t)i * d;
		double vi2 = 2 * v[i];
		for (int j = k0; j < d; j++)
			row[j] -= vi2 * w[j];
	}
}

/*
 * P (d, d) = Q diag(sign(R_jj)) for the QR of the seeded Gaussian G,
 * written to p and its transpose to pt (both row-major float).
 */
static int dense_build(int d, uint64_t seed, float *p, float *pt)
{
	size_t dd = (size_t)d * d;
	_cleanup_(freep) double *a = malloc_array(dd, sizeof(double));   /* G, then R and the v's */
	_cleanup_(freep) double *q = malloc_array(dd, sizeof(double));
	_cleanup_(freep) double *vs = malloc_array(dd, sizeof(double));  /* reflector k in row k */
	_cleanup_(freep) double *w = malloc_array((size_t)d, sizeof(double));
	_cleanup_(freep) double *rdiag = malloc_array((size_t)d, sizeof(double));
	if (!a || !q || !vs || !w || !rdiag)
		return -ENOMEM;

	Rng rng;
	rng_init(&rng, seed);
	rng_fill_normal(&rng, a, dd);
	memset(vs, 0, dd * sizeof(double));

	for (int k = 0; k < d; k++) {
		double *v = vs + (size_t)k * d;
		double norm2 = 0;
		for (int i = k; i < d; i++)
			norm2 += a[(size_t)i * d + k] * a[(size_t)i * d + k];
		double akk = a[(size_t)k * d + k];
		if (k == d - 1 || norm2 == 0) {
			rdiag[k] = akk;    /* nothing left to reflect: v stays 0 */
			continue;
		}
		double alpha = akk > 0 ? -sqrt(norm2) : sqrt(norm2);
		/* v = x - alpha e_k, normalized; |v|^2 = 2 (norm2 - alpha akk) > 0 */
		double vnorm = sqrt(2 * (norm2 - alpha * akk));
		v[k] = (akk - alpha) / vnorm;
		for (int i = k + 1; i < d; i++)
			v[i] = a[(size_t)i * d + k] / vnorm;
		householder_apply(a, d, k, k + 1, v, w);
		rdiag[k] = alpha;
	}

	/* Q = H_0 H_1 ... H_{d-2} I, built from the right end */
	memset(q, 0, dd * sizeof(double));
	for (int i = 0; i < d; i++)
		q[(size_t)i * d + i] = 1;
	for (int k = d - 2; k >= 0; k--)
		householder_apply(q, d, k, k, vs + (size_t)k * d, w);

	for (int i = 0; i < d; i++)
		for (int j = 0; j < d; j++) {
			double v = rdiag[j] < 0 ? -q[(size_t)i * d + j] : q[(size_t)i * d + j];
			p[(size_t)i * d + j] = (float)v;
			pt[(size_t)j * d + i] = (float)v;
		}
	return 0;
}

/* ---- the object ---- */

int rotation_new(RotationKind kind, int dim, int rounds, uint64_t seed, Rotation **ret)
{
	bool pow2 = dim >= 1 && (dim & (dim - 1)) == 0;
	if (dim < 1 || dim > ROTATION_MAX_DIM)
		return -EINVAL;
	if (kind == ROTATION_AUTO)
		kind = pow2 ? ROTATION_HADAMARD : ROTATION_DENSE;
	if (kind == ROTATION_HADAMARD && (!pow2 || (rounds != 1 && rounds != 2)))
		return -EINVAL;
	if (kind != ROTATION_HADAMARD && kind != ROTATION_DENSE)
		return -EINVAL;

	_cleanup_(rotation_freep) Rotation *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->kind = kind;
	r->dim = dim;
	r->seed = seed;
	size_t d = (size_t)dim;

	if (kind == ROTATION_HADAMARD) {
		r->rounds = rounds;
		if (!(r->mem = malloc_array(3 * d, sizeof(float))))
			return -ENOMEM;
		r->signs1 = r->mem;
		r->signs1_scaled = r->mem + d;
		if (rounds == 2)
			r->signs2 = r->mem + 2 * d;
		/* d^(-rounds/2): exact for two rounds, rounded once for one */
		float scale = rounds == 2 ? 1.0f / (float)dim : (float)(1.0 / sqrt((double)dim));
		Rng rng;
		rng_init(&rng, seed);
		for (size_t i = 0; i < d; i++) {
			r->signs1[i] = (rng_next(&rng) >> 63) ? -1.0f : 1.0f;
			r->signs1_scaled[i] = r->signs1[i] * scale;
		}
		for (size_t i = 0; r->signs2 && i < d; i++)
			r->signs2[i] = (rng_next(&rng) >> 63) ? -1.0f : 1.0f;
	} else {
		r->rounds = 0;
		if (!(r->mem = malloc_array(2 * d * d, sizeof(float))))
			return -ENOMEM;
		r->p = r->mem;
		r->pt = r->mem + d * d;
		int k = dense_build(dim, seed, r->p, r->pt);
		if (k < 0)
			return k;
	}
	*ret = TAKE_PTR(r);
	return 0;
}

Rotation *rotation_free(Rotation *r)
{
	if (r) {
		free(r->mem);
		free(r);
	}
	return NULL;
}

RotationKind rotation_kind(const Rotation *r)
{
	return r->kind;
}

int rotation_dim(const Rotation *r)
{
	return r->dim;
}

int rotation_rounds(const Rotation *r)
{
	return r->rounds;
}

uint64_t rotation_seed(const Rotation *r)
{
	return r->seed;
}

size_t rotation_bytes(const Rotation *r)
{
	size_t d = (size_t)r->dim;
	return sizeof(*r) + (r->kind == ROTATION_HADAMARD ? 3 * d : 2 * d * d) * sizeof(float);
}

const float *rotation_matrix(const Rotation *r)
{
	return r->p;
}

const float *rotation_signs_scaled(const Rotation *r)
{
	return r->signs1_scaled;
}

const float *rotation_matrix_t(const Rotation *r)
{
	return r->pt;
}

const float *rotation_signs(const Rotation *r, int round)
{
	if (round == 1)
		return r->signs1;
	if (round == 2)
		return r->signs2;
	return NULL;
}

/*
 * y (d,) = M x (d,) for M given by its transpose mt (d, d) row-major:
 * y = sum_j x_j mt[j,:], four rows at a time (vectorizes along i).
 */
static void dense_mul(const float *mt, int d, const float *x, float *y)
{
	float xs[ROTATION_MAX_DIM], acc[ROTATION_MAX_DIM];
	float *restrict a = acc;
	memcpy(xs, x, (size_t)d * sizeof(float));
	memset(acc, 0, (size_t)d * sizeof(float));
	int j = 0;
	for (; j + 4 <= d; j += 4) {
		const float *restrict r0 = mt + (size_t)j * d, *restrict r1 = r0 + d;
		const float *restrict r2 = r1 + d, *restrict r3 = r2 + d;
		float x0 = xs[j], x1 = xs[j + 1], x2 = xs[j + 2], x3 = xs[j + 3];
		for (int i = 0; i < d; i++)
			a[i] += x0 * r0[i] + x1 * r1[i] + x2 * r2[i] + x3 * r3[i];
	}
	for (; j < d; j++) {
		const float *restrict r0 = mt + (size_t)j * d;
		float x0 = xs[j];
		for (int i = 0; i < d; i++)
			a[i] += x0 * r0[i];
	}
	memcpy(y, acc, (size_t)d * sizeof(float));
}

static inline void vec_mul_inplace(float *restrict y, const float *restrict s, int d)
{
	for (int i = 0; i < d; i++)
		y[i] *= s[i];
}

void rotation_apply(const Rotation *r, const float *x, float *y)
{
	int d = r->dim;
	if (r->kind == ROTATION_DENSE) {
		dense_mul(r->pt, d, x, y);
		return;
	}
	/* y = H D_2 H D_1 x / d^(r/2), the scale folded into D_1 */
	for (int i = 0; i < d; i++)
		y[i] = x[i] * r->signs1_scaled[i];
	fwht(y, d);
	if (r->signs2) {
		vec_mul_inplace(y, r->signs2, d);
		fwht(y, d);
	}
}

void rotation_apply_inverse(const Rotation *r, const float *y, float *x)
{
	int d = r->dim;
	if (r->kind == ROTATION_DENSE) {
		dense_mul(r->p, d, y, x);
		return;
	}
	/* P^T = D_1 H D_2 H / d^(r/2) (H and D symmetric) */
	if (x != y)
		memcpy(x, y, (size_t)d * sizeof(float));
	fwht(x, d);
	if (r->signs2) {
		vec_mul_inplace(x, r->signs2, d);
		fwht(x, d);
	}
	vec_mul_inplace(x, r->signs1_scaled, d);
}
