/*
 * kvpq.h: the PolarQuant codec (Han, Kacham, Karbasi, Mirrokni, Zandieh,
 * arXiv 2502.02617), the `pq` KV type (kvtype.h): a head vector rotated by
 * a seeded random orthogonal P, taken to polar coordinates level by level
 * (kernels/kv_pq_layout.h: pairs to a radius and an angle, the radii paired
 * again), its angles quantized with one codebook per level and its level-L
 * radii kept in fp16.
 *
 * Owns: the angle densities and codebooks, the theory of the distortion,
 * encoding and decoding, query preparation. Not here: the row layout
 * (kernels/kv_pq_layout.h), scoring on the codes (kernels/cpu/kv_attn.h),
 * the KV format (engine/kv/fmt_pq.c).
 *
 * == Angle densities (the paper's Lemma on the polar transform) ==
 *
 * After a uniformly random rotation the direction of y = P x is uniform on
 * the sphere, which is the direction of a standard Gaussian vector; for a
 * Gaussian the angles of every level are independent of each other and of
 * the radii, with densities
 *   level 1:    uniform on [0, 2 pi)
 *   level l>=2: f_l(psi) = Gamma(m) / (2^(m-2) Gamma(m/2)^2) sin^(m-1)(2 psi)
 *               on [0, pi/2], m = 2^(l-1)
 * (psi = atan(r2 / r1) of two independent chi variables with m degrees of
 * freedom). f_l peaks at pi/4 with variance about 1 / (4 m): the deeper the
 * level, the tighter the angle, which is why levels past the first need
 * fewer bits. None depends on d or on the data: no calibration.
 *
 * == Codebooks: what they minimise, and why that is the MSE ==
 *
 * A node of the tree with radius R and angle psi, its children read back
 * with unit-norm errors e_a, e_b (independent of psi, mean E_{l-1}), and the
 * angle read back as c: the squared error of the node's 2^l coordinates is
 *   R^2 (2 (1 - cos(psi - c)) + cos psi cos c e_a + sin psi sin c e_b),
 * so for unit vectors
 *   E_l = 2 delta_l + (1 - delta_l) E_{l-1},  E_0 = 0,
 *   delta_l = E[1 - cos(psi - c(psi))].
 * E_L is increasing in every delta_l, so each level's codebook minimises
 * its own delta_l: the Lloyd conditions for the distortion 1 - cos(psi - c)
 * are cells split at midpoints of neighbouring centroids and each centroid
 * c_k = atan2(int_cell f sin, int_cell f cos). Level 1 (uniform on the
 * circle) is solved exactly by the regular polygon: c_k = (k + 1/2) 2 pi / N,
 * delta_1 = 1 - sin(pi / N) / (pi / N). Deeper levels are solved
 * numerically (2^16 intervals of 3-point Gauss-Legendre, Lloyd iterations
 * from the quantiles until no centroid moves by 1e-12). The relative MSE
 * of a type is E_L (kvpq_distortion()): the fp16 radii add ~1e-7.
 * Reconstructions keep each level-L block's norm exactly (cos^2 + sin^2 =
 * 1): a norm-corrected variant would change nothing.
 *
 * == Bit allocation (the paper's, and ours around it) ==
 *
 *   pq, pq4   L = 4, bits (4, 2, 2, 2), fp16 radii at level 4: 3.875 bits
 *             per value at every d (the paper's 4 + 2 + 2 + 2 and one
 *             16-bit radius per 16 coordinates)
 *   pq<B>     L = 4, bits (B, B-2, B-2, B-2), at least 1: pq3 3.0 bits,
 *             pq5 4.875, pq6 5.75 at d = 64
 *   pq<B>f    every level (L = log2 d, d a power of two), one fp16
 *             radius (the norm): pq3f 2.25, pq4f 3.25, pq5f 4.25 bits at
 *             d = 64 (tq2, tq3, tq4's sizes)
 * Level 1 gets two bits more than the others because its angle spreads
 * over 2 pi where deeper ones stay within ~1 / sqrt(m) of pi/4: at equal
 * bits its delta is ~14 times the level-2 one (about 4^2, two bits).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "engine/codec/rotation.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/kv_pq_layout.h"

/* The codebook of one level's angles at some number of bits (shared, read-only). */
typedef struct KvPqAngles {
	int level, bits, n;                  /* n = 2^bits cells */
	float centroid[1 << KVPQ_MAX_BITS];  /* ascending, radians */
	float bound[1 << KVPQ_MAX_BITS];     /* bound[k]: between cells k and k + 1 (n - 1 of them) */
	float cosv[1 << KVPQ_MAX_BITS];      /* cos of each centroid, zero past n (SIMD tables) */
	float sinv[1 << KVPQ_MAX_BITS];
	double delta;                        /* E[1 - cos(psi - c(psi))] */
} KvPqAngles;

/*
 * Level l's codebook at bits bits (1 <= l <= KVPQ_MAX_LEVELS, 1 <= bits <=
 * 8), solved on first use and cached for the process (thread-safe).
 * Returns 0, -EINVAL, -ENOMEM or -EDOM (the solver did not converge).
 */
int kvpq_angles_get(int level, int bits, const KvPqAngles **ret);

/* The cell of psi (radians) in a's codebook. */
int kvpq_angles_quantize(const KvPqAngles *a, float psi);

/* f_l(psi) of the top, normalised by the closed form (0 outside its support). */
double kvpq_angle_density(int level, double psi);

/*
 * Whether s can be a pq type: 1 <= levels <= KVPQ_MAX_LEVELS, every
 * level's bits in 1..8, dim a multiple of 2^levels, 2 <= dim <=
 * TQ_MAX_DIM.
 */
bool kvpq_shape_valid(const KvPqShape *s);

/* E_L of the top for s (the solved deltas): the relative MSE of unit vectors. */
double kvpq_distortion(const KvPqShape *s);

/* One side's codec: a rotation and the codebooks of its shape. */
typedef struct KvPq {
	KvPqRows rows;                                /* shape, row bytes, cos/sin tables: the kernels' view */
	const KvPqAngles *angles[KVPQ_MAX_LEVELS];
	Rotation *rot;                                /* P */
} KvPq;

/*
 * The codec of shape s (kvpq_shape_valid()) with the rotation of seed
 * (rotation_new(ROTATION_AUTO, dim, 2, seed)). 0, -EINVAL, -ENOMEM.
 */
int kvpq_init(KvPq *pq, const KvPqShape *s, uint64_t seed);
void kvpq_fini(KvPq *pq);
/* Bytes the codec holds (its rotation). */
size_t kvpq_bytes(const KvPq *pq);

/* x (dim,) into a row of kvpq_row_bytes() (non-finite x: a zero row). */
void kvpq_encode(const KvPq *pq, const float *x, uint8_t *row);
/* A row back in the rotated domain: y~ (dim,), the scalar reference. */
void kvpq_decode_rotated(const KvPq *pq, const uint8_t *row, float *y);
/* A row back in the original domain: x~ = P^T y~ (dim,). */
void kvpq_decode(const KvPq *pq, const uint8_t *row, float *x);

/* Floats of one prepared query head (kv_attn.h's pq score kernels). */
size_t kvpq_query_floats(const KvPq *pq);
/* q (dim,) into prep (kvpq_query_floats()): P q and the level-1 table. */
void kvpq_query_prepare(const KvPq *pq, const float *q, float *prep);
/* out (dim,) = P^T acc (dim,): values accumulated in the rotated domain, back. */
void kvpq_finish(const KvPq *pq, const float *acc, float *out);
