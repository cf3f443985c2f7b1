/*
 * rotation.h: seeded random orthogonal transforms P of R^d (turboquant.md
 * section 1, step 2), and the random generator they are built from.
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
 * the generator is our own, never libc's rand. It is part of the format
 * (seeds are recorded with the codes), so it is spelled out here:
 *
 *   splitmix64(z):  z += 0x9e3779b97f4a7c15;
 *                   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
 *                   z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 *                   return z ^ (z >> 31)       (z is the running state)
 *   rng_init(seed): s[0..3] = four successive splitmix64 outputs, state
 *                   starting at seed.
 *   rng_next():     xoshiro256**: r = rotl(s1 * 5, 7) * 9; t = s1 << 17;
 *                   s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3; s2 ^= t;
 *                   s3 = rotl(s3, 45); return r.
 *   normals:        Box-Muller in double, one pair per two draws:
 *                   u1 = ((next >> 11) + 1) * 2^-53  (in (0, 1]),
 *                   u2 = (next >> 11) * 2^-53,       (in [0, 1))
 *                   z0 = sqrt(-2 ln u1) cos(2 pi u2), z1 = sqrt(-2 ln u1) sin(2 pi u2);
 *                   an odd count drops the last z1.
 *
 *   Hadamard signs: rng_init(seed); d draws for D_1, then (2 rounds) d
 *                   draws for D_2; entry i is -1 if bit 63 of its draw is
 *                   set, else +1. Bit-exact everywhere.
 *   Dense:          rng_init(seed); d * d normals, row-major G[i][j];
 *                   Householder QR in double; P = Q diag(sign(R_jj)),
 *                   rounded to float. Depends on libm's log/sin/cos, so
 *                   two libms may differ in the last bits of P (relative
 *                   1e-16 before rounding to float): harmless for decoding.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define ROTATION_MAX_DIM 4096

typedef enum RotationKind {
	ROTATION_AUTO = 0,     /* Hadamard for powers of two, else dense */
	ROTATION_HADAMARD = 1,
	ROTATION_DENSE = 2,
} RotationKind;

typedef struct Rotation Rotation;

/*
 * Build P. rounds applies to Hadamard (1 or 2) and is ignored for dense.
 * Returns 0, -EINVAL (dim < 1, dim > ROTATION_MAX_DIM, Hadamard of a
 * non-power of two, rounds not 1 or 2, unknown kind) or -ENOMEM.
 * Dense construction is O(d^3): about 1 ms at d = 128, seconds at 1024.
 */
int rotation_new(RotationKind kind, int dim, int rounds, uint64_t seed, Rotation **ret);
Rotation *rotation_free(Rotation *r);
DEFINE_FREEP(Rotation, rotation_free)

RotationKind rotation_kind(const Rotation *r); /* never AUTO */
int rotation_dim(const Rotation *r);
int rotation_rounds(const Rotation *r);        /* Hadamard rounds; 0 for dense */
uint64_t rotation_seed(const Rotation *r);
/* Bytes r holds (its signs or its dense P and P^T): memory accounting. */
size_t rotation_bytes(const Rotation *r);

/*
 * The dense matrix P (d, d) row-major, y = P x; NULL for Hadamard. Lives
 * as long as r.
 */
const float *rotation_matrix(const Rotation *r);

/*
 * The Hadamard sign vector of round (1 or 2), as +-1.0f (d,); NULL for
 * dense or a missing round. P = H diag(s_r) ... H diag(s_1) / d^(r/2):
 * what a GPU kernel uploads to apply P itself.
 */
const float *rotation_signs(const Rotation *r, int round);

/*
 * What rotation_apply() multiplies by before the first transform: the
 * round-1 signs times d^(-rounds/2) (Hadamard; NULL for dense), and the
 * dense P^T (d, d) it multiplies by (NULL for Hadamard). Kernels that must
 * reproduce rotation_apply() bit for bit (kernels/kv_kernel.h) read these.
 */
const float *rotation_signs_scaled(const Rotation *r);
const float *rotation_matrix_t(const Rotation *r);

/*
 * y (d,) = P x (d,). x and y may alias. Thread-safe (r is read-only);
 * dense uses 2 * ROTATION_MAX_DIM floats of stack.
 */
void rotation_apply(const Rotation *r, const float *x, float *y);

/* x (d,) = P^T y (d,), the inverse. x and y may alias. */
void rotation_apply_inverse(const Rotation *r, const float *y, float *x);

/*
 * In-place unnormalized fast Walsh-Hadamard transform of n (a power of
 * two) values: x <- H x with H the Sylvester Hadamard matrix
 * (H[i][j] = (-1)^popcount(i & j)), so H H = n I.
 */
void fwht(float *x, int n);

/* The generator above; Rng is a plain value, copy it to fork a stream. */
typedef struct Rng {
	uint64_t s[4];
} Rng;

void rng_init(Rng *rng, uint64_t seed);
uint64_t rng_next(Rng *rng);

/* n standard normals (Box-Muller pairs as above) into out (n,). */
void rng_fill_normal(Rng *rng, double *out, size_t n);
