/*
 * codebook.h: Lloyd-Max scalar quantizers for one coordinate of a uniform
 * point on the unit sphere in R^d (turboquant.md section 1, steps 3-4).
 *
 * The density of a coordinate t is
 *   f(t) = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)) (1 - t^2)^((d-3)/2),  t in [-1, 1],
 * variance 1/d. For 2^bits levels the optimal centroids c_0 < ... < c_{n-1}
 * minimise E[(t - c(t))^2]: boundaries are midpoints of neighbours and each
 * centroid is the conditional mean of its cell. We solve this numerically
 * for the exact f of each d (fine quadrature, Lloyd iteration to
 * convergence); no Gaussian tables, no calibration data.
 */
#pragma once

#include <stdint.h>

#include "util.h"

#define CODEBOOK_MAX_BITS 8

typedef struct Codebook {
	int dim;
	int bits;
	int n_levels;                               /* 2^bits */
	float centroids[1 << CODEBOOK_MAX_BITS];    /* ascending, in coordinate units (not scaled by sqrt(d)) */
	float boundaries[(1 << CODEBOOK_MAX_BITS) - 1]; /* boundaries[i] between centroid i and i+1 */
	double mse_coord;                           /* E[(t - c(t))^2] for one coordinate */
	double mse;                                 /* D_mse = d * mse_coord, for unit vectors */
} Codebook;

/* Solve the codebook for (dim, bits): dim >= 2 (<= 65536), 1 <= bits <= 8. Returns 0 or -EINVAL. */
int codebook_solve(int dim, int bits, Codebook *ret);

/*
 * The cached codebook for (dim, bits), solved on first use (thread-safe;
 * lives until exit). Returns 0, -EINVAL or -ENOMEM.
 */
int codebook_get(int dim, int bits, const Codebook **ret);

/* Index of the cell of t: the number of boundaries below t (binary search). */
uint8_t codebook_quantize(const Codebook *cb, float t);
