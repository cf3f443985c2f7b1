/*
 * rotation.h: seeded random orthogonal transforms P of R^d (turboquant.md
 * section 1, step 2).
 *
 *   ROTATION_HADAMARD  d a power of two: P = H D_r ... H D_1 / d^(r/2), r
 *                      rounds (1 or 2) of random signs D_i followed by the
 *                      Sylvester Hadamard matrix H, applied as an in-place
 *                      fast Walsh-Hadamard transform, O(d log d).
 *   ROTATION_DENSE     any d: Q of the QR decomposition of a seeded
 *                      Gaussian matrix (signs fixed so diag(R) > 0, which
 *                      makes Q Haar-distributed), O(d^2) per vector.
 *
 * The same (kind, dim, rounds, seed) gives the same P on every machine:
 * the generator is our own (splitmix64 + xoshiro256**, Box-Muller in
 * double), never libc's rand. Seeds are recorded with the codes.
 */
#pragma once

#include <stdint.h>

#include "util.h"

typedef enum RotationKind {
	ROTATION_AUTO = 0,     /* Hadamard for powers of two, else dense */
	ROTATION_HADAMARD = 1,
	ROTATION_DENSE = 2,
} RotationKind;

typedef struct Rotation Rotation;

/*
 * Build P. rounds applies to Hadamard (1 or 2) and is ignored for dense.
 * Returns 0, -EINVAL (dim < 1, dim > 4096, Hadamard of a non-power of
 * two, rounds not 1 or 2) or -ENOMEM.
 */
int rotation_new(RotationKind kind, int dim, int rounds, uint64_t seed, Rotation **ret);
Rotation *rotation_free(Rotation *r);
DEFINE_FREEP(Rotation, rotation_free)

RotationKind rotation_kind(const Rotation *r); /* never AUTO */
int rotation_dim(const Rotation *r);

/* y (d,) = P x (d,). x and y may alias. */
void rotation_apply(const Rotation *r, const float *x, float *y);

/* x (d,) = P^T y (d,), the inverse. x and y may alias. */
void rotation_apply_inverse(const Rotation *r, const float *y, float *x);

/* In-place unnormalized fast Walsh-Hadamard transform of n (a power of two) values. */
void fwht(float *x, int n);
