/*
 * codebook.h: Lloyd-Max scalar quantizers for one coordinate of a uniform
 * point on the unit sphere in R^d (turboquant.md section 1, steps 3-4).
 *
 * The density of a coordinate t is
 *   f(t) = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)) (1 - t^2)^((d-3)/2),  t in [-1, 1],
 * variance 1/d. For 2^bits levels the optimal centroids c_0 < ... < c_{n-1}
 * minimise E[(t - c(t))^2]: boundaries are midpoints of neighbours and each
 * centroid is the conditional mean of its cell. We solve this numerically
 * for the exact f of each d (fine quadrature, iterated to convergence);
 * no Gaussian tables, no calibration data.
 *
 * How: with t = sin(theta) the density becomes cos^(d-2)(theta) on
 * [-pi/2, pi/2], smooth for every d >= 2 (d = 2, the arcsine law, is
 * uniform in theta). Cumulative moments int t^k f for k = 0, 1, 2 are
 * tabulated on 2^15 intervals of [0, theta_max] with 4-point
 * Gauss-Legendre per interval (theta_max = min(pi/2, 14 / sqrt(d)): the
 * mass beyond is below 1e-40), normalised numerically and checked against
 * the lgamma closed form of the mass. The codebook is symmetric; its
 * positive half starts at the f^(1/3) companding quantiles and is solved
 * by Newton's method on the Lloyd-Max conditions (tridiagonal Jacobian,
 * damped, Lloyd steps as fallback) until the largest centroid change is
 * below 1e-13 / sqrt(d): a few steps, about 10 ms per codebook, most of it
 * tabulating the density.
 * Accuracy: centroids to ~1e-12 / sqrt(d) before rounding to float,
 * D_mse to ~1e-9 relative.
 */
#pragma once

#include <stdint.h>

#include "base/util.h"

#ifdef __CUDACC__
#define CODEBOOK_HD __host__ __device__
#else
#define CODEBOOK_HD
#endif

#define CODEBOOK_MAX_BITS 8
#define CODEBOOK_MAX_DIM 65536

typedef struct Codebook {
	int dim;
	int bits;
	int n_levels;                               /* 2^bits */
	float centroids[1 << CODEBOOK_MAX_BITS];    /* ascending, in coordinate units (not scaled by sqrt(d)) */
	float boundaries[(1 << CODEBOOK_MAX_BITS) - 1]; /* boundaries[i] between centroid i and i+1 (midpoint) */
	double mse_coord;                           /* E[(t - c(t))^2] for one coordinate */
	double mse;                                 /* D_mse = d * mse_coord, for unit vectors */
} Codebook;

/*
 * Solve the codebook for (dim, bits): 2 <= dim <= CODEBOOK_MAX_DIM,
 * 1 <= bits <= 8. Returns 0, -EINVAL, -ENOMEM, or -EDOM if the solver
 * did not converge (a bug: never seen for valid arguments).
 */
int codebook_solve(int dim, int bits, Codebook *ret);

/*
 * The cached codebook for (dim, bits), solved on first use (thread-safe;
 * lives until exit; solving holds a process-wide lock, so first uses
 * serialise). Returns what codebook_solve() returns.
 */
int codebook_get(int dim, int bits, const Codebook **ret);

/*
 * Index of the cell of t: the number of boundaries <= t (a tie goes to
 * the upper cell), by a branch-free binary search. NaN gives 0. Static
 * inline and host-only-call free, for kernels.
 */
static inline CODEBOOK_HD uint8_t codebook_quantize(const Codebook *cb, float t)
{
	const float *b = cb->boundaries;
	unsigned idx = 0;
	for (unsigned step = (unsigned)cb->n_levels >> 1; step > 0; step >>= 1)
		idx += (t >= b[idx + step - 1]) ? step : 0;
	return (uint8_t)idx;
}
