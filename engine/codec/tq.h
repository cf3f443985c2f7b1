/*
 * tq.h: the TurboQuant codec (turboquant.md sections 1, 3, 4): one head
 * vector x (dim,) <-> one fixed-size code record, and inner products
 * <q, x~> computed on codes without dequantizing. A TqDesc says all a
 * reader needs to decode codes; it is serialised next to them (session
 * files) and checked when they are read back.
 *
 * Owns: the descriptor and its record, the code layout, encode/decode
 * and the scalar reference inner product. Not here: rotations
 * (rotation.h), Lloyd-Max codebooks (codebook.h), the code layout's
 * offsets and per-coordinate helpers that kernels share
 * (kernels/tq_layout.h), fast CPU/CUDA kernels.
 *
 * == Terms ==
 *
 * B = desc.bits, the MSE code width of the "lo" group; the n_hi
 * coordinates of the "hi" group get B+1 bits. `tqB` is n_hi = 0; `tqB.5`
 * is an exact half split, n_hi = dim / 2 (tq2.5 at dim 128: 64 coordinates
 * at 3 bits + 64 at 2 bits). Any other n_hi is allowed: the paper's
 * "32 outlier channels at 3 bits + 96 at 2 bits" is n_hi = 32, and that is
 * 2.25 code bits per value, not the 2.5 turboquant.md section 4 says.
 * `tqB+qjl` (TurboQuant_prod, section 3) spends B bits per coordinate in
 * total: MSE codes at B-1 bits (desc.bits = B-1) plus m = dim QJL sign
 * bits and a gamma. So B >= 2 for +qjl.
 *
 * Group rules (which coordinates are "hi"):
 *   TQ_GROUP_ROTATED_SLICE    one rotation P of dim d and one norm; the
 *                             first n_hi coordinates of the rotated vector
 *                             are hi. Codebooks for (d, B+1) and (d, B).
 *   TQ_GROUP_OUTLIER_CHANNELS a channel mask chosen before rotation
 *                             (tq_desc_choose_outliers) and recorded in the
 *                             descriptor. Each group is its own vector:
 *                             hi = x[mask channels] (n_hi,), lo = the rest,
 *                             in ascending channel order; each has its own
 *                             rotation of its own dimension (dense when
 *                             that is not a power of two), its own norm,
 *                             and codebooks for (n_hi, B+1), (d - n_hi, B).
 *
 * The rotated domain: y (dim,) = [P_hi x_hi ; P_lo x_lo] (slice rule: just
 * P x, hi = y[0, n_hi)). Rotations: rotation_new(kind_g, dim_g, rounds,
 * seed_g) with kind_g = desc.rotation, AUTO resolved per group (Hadamard
 * for powers of two, else dense); seed of the hi (or only) group =
 * rot_seed, of the lo group under OUTLIER_CHANNELS = tq_seed_mix(rot_seed),
 * one splitmix64 output (rotation.h) from state rot_seed ^ 0x6c6f2d67726f7570.
 *
 * Per group g with norm n_g = ||x_g||: idx_i = cell of y_i / n_g in the
 * codebook of i's group. Stored scale s_g = n_g, or with
 * TQ_FLAG_NORM_CORRECT s_g = n_g / ||c[idx_g]|| (the reconstruction then
 * has norm n_g exactly). Reconstruction in the rotated domain:
 * y~_i = s_g c[idx_i]. Scales saturate at the fp16 maximum (65504); a zero
 * group stores scale 0 and all-zero codes.
 *
 * QJL (TQ_FLAG_QJL): residual r (dim,) = y - y~ (using the fp16-rounded
 * scales), gamma = ||r||, z = sign(S r) in {-1,+1}^m (>= 0 counts as +1).
 * S (m, dim):
 *   Gaussian (default): i.i.d. N(0,1); S[i][j] is normal number i*dim + j
 *     of rotation.h's generator (rng_init, rng_fill_normal: xoshiro256**,
 *     Box-Muller pairs in double, rounded to float) seeded with
 *     splitmix64 of (qjl_seed ^ 0x514a4c2d532d6d78) (one splitmix64 output
 *     from that state), so S never shares a stream with a rotation even
 *     for related seeds. Constant K = sqrt(pi/2) / m.
 *   Structured (TQ_FLAG_QJL_STRUCTURED, m = dim): S = rotation_new(AUTO,
 *     dim, 2, the seed above): a two-round random-sign normalised Hadamard
 *     matrix (dense orthogonal for non-powers of two), unit-norm rows.
 *     Each row is then (nearly) uniform on the sphere, E[<s,q> sign(<s,r>)]
 *     = E|t_d| <q,r> / ||r|| with E|t_d| = Gamma(d/2) / (sqrt(pi)
 *     Gamma((d+1)/2)), so K = 1 / (m E|t_d|): sqrt(pi/2) / sqrt(dim) to
 *     O(1/dim) (turboquant.md's constant is this limit; it is 0.39% high
 *     at dim 64, 0.20% at 128), not sqrt(pi/2) / m. One Hadamard round is
 *     not enough: its Rademacher rows bias the estimate of <q, r> by
 *     +1.2% / +2.7% / +5.7% at dim 64 for tq1 / tq2 / tq3 residuals
 *     (measured; two rounds: +0.5%, Haar: +0.3% with the limit constant).
 *     Orthogonal rows also lower the variance: S^T z has norm sqrt(dim)
 *     exactly, so for a query independent of x the error variance is
 *     (K^2 dim - 1) D / dim ~ (pi/2 - 1) / dim * D_mse(B-1), 0.36 times
 *     the Gaussian S's (pi/2) / dim * D_mse(B-1) (measured, test-tq.c).
 * qjl_seed must differ from the rotation seeds (validated).
 * Estimate (the paper's dequantizer, in the rotated domain):
 *   <q, x~> = sum_g s_g sum_{i in g} (Pq)_i c[idx_i] + gamma K <S Pq, z>
 *   x~      = P^T (y~ + gamma K S^T z)
 * with P the block rotation above. Values may use QJL too (fmt_tq.c: the
 * unbiased residual estimate accumulated per value row); whether it pays
 * against one more MSE bit is measured (docs/benchmarks.md, "Issue 25").
 *
 * == Coded vector: tq_code_bytes() bytes, no alignment, little-endian ==
 *
 *   size                           field
 *   2                              scale0: fp16, the hi group under
 *                                  OUTLIER_CHANNELS, else the only scale
 *   2    (OUTLIER_CHANNELS only)   scale1: fp16, the lo group
 *   2    (QJL only)                gamma: fp16, ||r||
 *   bitpack_bytes(B+1, n_hi)       hi codes, rotated coordinates [0, n_hi)
 *   bitpack_bytes(B, dim - n_hi)   lo codes, rotated coordinates [n_hi, dim)
 *   bitpack_bytes(1, m) (QJL only) sign bits: bit i set means z_i = +1
 *
 * Fields follow each other in this order without padding; each code
 * stream uses bitpack.h's layout (LSB first, zero-padded to a byte) and
 * codes are cell indices into the ascending centroids. TqLayout gives the
 * offsets. Every byte counts in tq_bits_per_value(): tq4 at dim 64 is
 * (2 + 32) * 8 / 64 = 4.25 bits/value, tq3 3.25, tq2 2.25.
 *
 * == Descriptor record: TQ_DESC_RECORD_BYTES = 176 bytes, little-endian ==
 *
 *   offset size field
 *   0      4    magic "TQDS"
 *   4      2    version (TQ_DESC_VERSION = 1)
 *   6      2    record size in bytes (176)
 *   8      2    dim, 2..1024
 *   10     1    bits B, 1..8 (1..7 when n_hi > 0)
 *   11     1    group rule (TqGroupRule)
 *   12     2    n_hi, 0..dim (OUTLIER_CHANNELS: 2..dim-2)
 *   14     1    rotation kind (RotationKind: 0 auto, 1 Hadamard, 2 dense)
 *   15     1    rotation rounds (1 or 2; 1 for dense)
 *   16     4    flags (TQ_FLAG_*; unknown bits rejected)
 *   20     2    QJL rows m (0 without QJL; 1..2048, = dim when structured)
 *   22     2    reserved, 0
 *   24     8    rotation seed
 *   32     8    QJL seed (0 without QJL)
 *   40     128  channel mask: channel c is hi if bit c % 8 of byte c / 8
 *               is set. All zero under ROTATED_SLICE; popcount = n_hi and
 *               no bit >= dim under OUTLIER_CHANNELS
 *   168    4    reserved, 0
 *   172    4    CRC-32C (Castagnoli, reflected poly 0x82f63b78, init and
 *               final xor 0xffffffff) of bytes 0..171
 *
 * tq_desc_decode() rejects anything but a canonical record (so decode
 * then encode gives the same bytes); a stored record that decodes but
 * differs from the codec's descriptor is TQ_E_MISMATCH naming the field.
 */
#pragma once

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "engine/codec/rotation.h"
#include "kernels/tq_layout.h"

#define TQ_MASK_BYTES (TQ_MAX_DIM / 8)
#define TQ_DESC_VERSION 1
#define TQ_DESC_RECORD_BYTES 176
#define TQ_MAX_CODE_BYTES (6 + TQ_MAX_DIM + TQ_MAX_QJL_M / 8 + 2)

/* The descriptor record, byte by byte (all fields little-endian). */
typedef struct TqDescRecord {
	uint8_t magic[4];     /* "TQDS" */
	uint8_t version[2];
	uint8_t size[2];
	uint8_t dim[2];
	uint8_t bits;
	uint8_t group;
	uint8_t n_hi[2];
	uint8_t rotation;
	uint8_t rounds;
	uint8_t flags[4];
	uint8_t qjl_m[2];
	uint8_t reserved0[2];
	uint8_t rot_seed[8];
	uint8_t qjl_seed[8];
	uint8_t mask[TQ_MASK_BYTES];
	uint8_t reserved1[4];
	uint8_t crc[4];       /* CRC-32C of everything before it */
} TqDescRecord;
static_assert(sizeof(TqDescRecord) == TQ_DESC_RECORD_BYTES, "TqDescRecord is 176 bytes");
static_assert(offsetof(TqDescRecord, rot_seed) == 24, "rot_seed at 24");
static_assert(offsetof(TqDescRecord, mask) == 40, "mask at 40");
static_assert(offsetof(TqDescRecord, crc) == 172, "crc at 172");

/* Module error codes (positive; -errno for system errors). */
enum {
	TQ_E_BAD_DESC = 1, /* a descriptor field is out of range or inconsistent */
	TQ_E_CORRUPT,      /* record truncated, bad magic, size or checksum */
	TQ_E_VERSION,      /* record version this build cannot read */
	TQ_E_MISMATCH,     /* stored descriptor differs from the codec's */
};

typedef enum TqGroupRule {
	TQ_GROUP_ROTATED_SLICE = 0,
	TQ_GROUP_OUTLIER_CHANNELS = 1,
} TqGroupRule;

enum {
	TQ_FLAG_NORM_CORRECT = 1u << 0,   /* store n / ||c[idx]|| */
	TQ_FLAG_QJL = 1u << 1,            /* QJL residual signs + gamma */
	TQ_FLAG_QJL_STRUCTURED = 1u << 2, /* S orthogonal (Hadamard), needs QJL */
	TQ_FLAGS_KNOWN = 0x7u,
};

typedef struct TqDesc {
	int dim;              /* head dimension d */
	int bits;             /* B: MSE bits of the lo group */
	int n_hi;             /* coordinates at B+1 bits */
	TqGroupRule group;
	RotationKind rotation;
	int rounds;           /* Hadamard rounds, 1 or 2 (1 for dense) */
	uint32_t flags;       /* TQ_FLAG_* */
	int qjl_m;            /* QJL rows m (0 without QJL) */
	uint64_t rot_seed;
	uint64_t qjl_seed;
	uint8_t mask[TQ_MASK_BYTES]; /* OUTLIER_CHANNELS: hi channel bits */
} TqDesc;


typedef struct TqCodec TqCodec;

/*
 * The query side of inner products: q rotated once (and sketched by S).
 * Caller-owned and reusable; tq_query_prepare() fills it.
 */
typedef struct TqQuery {
	float rot[TQ_MAX_DIM];  /* (dim,) P q in the rotated domain */
	float sq[TQ_MAX_QJL_M]; /* (m,) S P q, QJL only */
} TqQuery;

/* ---- descriptors ---- */

/*
 * Defaults for a plain tqB: slice rule, n_hi 0, AUTO rotation, 2 rounds,
 * no flags, fixed default seeds. Does not validate.
 */
void tq_desc_init(TqDesc *d, int dim, int bits);

/*
 * A descriptor from a mode name: "tq<B>" (B 1..8), "tq<B>.5" (half split,
 * B 1..7), "tq<B>h<n>" (n_hi = n), then optional "o" (OUTLIER_CHANNELS;
 * the mask still has to be chosen), "+qjl" (Gaussian S, m = dim) or
 * "+sqjl" (structured S), "_nc" (norm correction), "_r1" (one Hadamard
 * round instead of two; dense rotations have one anyway). With +qjl the number is
 * the total bits per coordinate: "tq3+qjl" has desc.bits = 2. The result
 * is validated except for an unchosen outlier mask. Returns 0 or
 * TQ_E_BAD_DESC.
 */
int tq_desc_from_name(const char *name, int dim, TqDesc *ret, Error *err);

/* The mode name of d (the grammar above; "o" for outliers) into buf. */
void tq_desc_name(const TqDesc *d, char *buf, size_t size);

/* Check every field and their consistency. Returns 0 or TQ_E_BAD_DESC naming the field. */
int tq_desc_validate(const TqDesc *d, Error *err);

/* Whether two descriptors describe the same codec (field by field). */
bool tq_desc_equal(const TqDesc *a, const TqDesc *b);

/* 0 if equal, else TQ_E_MISMATCH with "<field>: stored X, expected Y" (a = stored). */
int tq_desc_compare(const TqDesc *stored, const TqDesc *expected, Error *err);

/*
 * Pick the n_hi channels of largest mean |x| over x (n_rows, dim), ties to
 * the lower channel, into mask (TQ_MASK_BYTES, bit c = channel c).
 * Returns 0 or -EINVAL.
 */
int tq_desc_choose_outliers(const float *x, int n_rows, int dim, int n_hi, uint8_t *ret_mask);

/* Serialise a valid descriptor. Returns 0 or TQ_E_BAD_DESC (nothing written). */
int tq_desc_encode(const TqDesc *d, uint8_t out[TQ_DESC_RECORD_BYTES]);

/*
 * Parse a record of len bytes (extra bytes after the record are an
 * error). Returns 0, TQ_E_CORRUPT, TQ_E_VERSION or TQ_E_BAD_DESC; *ret
 * written only on success. Safe on arbitrary input.
 */
int tq_desc_decode(const void *bytes, size_t len, TqDesc *ret, Error *err);

/* CRC-32C of n bytes (the record checksum). */
uint32_t tq_crc32c(const void *data, size_t n);

/* The seed of the lo group's rotation under OUTLIER_CHANNELS. */
uint64_t tq_seed_mix(uint64_t seed);

/* ---- codecs ---- */

/* Build rotations, codebooks and S for a valid desc. Returns 0, TQ_E_BAD_DESC or -ENOMEM. */
int tq_codec_new(const TqDesc *desc, TqCodec **ret, Error *err);
TqCodec *tq_codec_free(TqCodec *c);
DEFINE_FREEP(TqCodec, tq_codec_free)

const TqDesc *tq_codec_desc(const TqCodec *c);
const TqLayout *tq_codec_layout(const TqCodec *c);

/*
 * Check a stored descriptor record against the codec. Returns 0, the
 * decode error, or TQ_E_MISMATCH naming the first differing field.
 */
int tq_codec_check(const TqCodec *c, const void *bytes, size_t len, Error *err);

/* Bytes the codec holds (rotations, QJL matrix, channel lists; codebooks are shared). */
size_t tq_codec_bytes(const TqCodec *c);

/* Bytes of one coded vector. */
size_t tq_code_bytes(const TqCodec *c);

/* Stored bits per value: tq_code_bytes() * 8 / dim, everything counted. */
double tq_bits_per_value(const TqCodec *c);

/* Centroids (ascending, coordinate units) of the hi / lo codebook; NULL for an empty group. */
const float *tq_codec_centroids(const TqCodec *c, bool hi);

/* The QJL constant K (0 without QJL). */
float tq_qjl_const(const TqCodec *c);

/* Encode x (dim,), finite, into code (tq_code_bytes() bytes). */
void tq_encode(const TqCodec *c, const float *x, uint8_t *code);

/* x (dim,) = the reconstruction of code (with QJL: the paper's dequantizer). */
void tq_decode(const TqCodec *c, const uint8_t *code, float *x);

/* Rotate q (dim,) into query (and S P q with QJL). */
void tq_query_prepare(const TqCodec *c, const float *q, TqQuery *query);

/* <q, x~> from the code, without dequantizing. */
float tq_inner_product(const TqCodec *c, const TqQuery *query, const uint8_t *code);

/*
 * The two terms of tq_inner_product(): *ret_mse = sum_g s_g <(Pq)_g, c[idx_g]>,
 * *ret_qjl = gamma <S P q, z> (0 without QJL); the estimate is
 * *ret_mse + tq_qjl_const(c) * *ret_qjl.
 */
void tq_inner_product_parts(const TqCodec *c, const TqQuery *query, const uint8_t *code,
			    float *ret_mse, float *ret_qjl);

/*
 * The value side of attention, in the rotated domain: acc (dim,) +=
 * a * y~ (the MSE reconstruction s_g c[idx_i]; the QJL term, which
 * values do not use, is left out), then tq_output_finish() maps the
 * finished accumulator back: x (dim,) = P^T acc, once per head.
 */
void tq_value_axpy(const TqCodec *c, float a, const uint8_t *code, float *acc);
void tq_output_finish(const TqCodec *c, const float *acc, float *x);

/*
 * The reconstruction in the rotated domain, v (dim,) = y~ + gamma K S^T z
 * with QJL (y~ alone without), so that tq_decode() is tq_output_finish()
 * of it. With a Gaussian S (+qjl) the QJL term is an unbiased estimate of
 * the residual: E_S[v] = P x exactly, up to the fp16 norms, which is what
 * QJL on values (`tq<B>+qjl` as a V type) accumulates.
 */
void tq_decode_rotated(const TqCodec *c, const uint8_t *code, float *v);

/* ---- the kernel-side view ---- */

struct KvkCodec;

/*
 * Flatten c into *ret (kernels/kv_kernel.h) with its arrays in one blob,
 * malloc'ed into *ret_blob (ret->blob points at it; free() it). Returns
 * 0, -EINVAL (dim > KVK_MAX_DIM or qjl_m > KVK_MAX_QJL_M) or -ENOMEM.
 */
int tq_codec_kernel(const TqCodec *c, struct KvkCodec *ret, uint8_t **ret_blob);
