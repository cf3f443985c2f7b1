/*
 * kvquant.h: the non-TurboQuant KV types of kvtype.h on one head vector:
 * f32, f16, ggml's q8_0 and q4_0 blocks, and their +h (Hadamard-rotated)
 * variants. Quantize on write, dequantize, and the two operations decode
 * attention needs on the stored form: the score <q, k> of a query against
 * a stored key, and acc += a * v for a stored value.
 *
 * Owns: these scalar references (the plain twins of later SIMD kernels)
 * and the +h rotation. Not here: TurboQuant types (tq.h has their encode,
 * decode and inner product), the KV store and the attention loop.
 *
 * == Stored forms of one head vector x (d,) ==
 *
 *   f32   d floats, little-endian
 *   f16   d IEEE binary16 (round to nearest even)
 *   q8_0  d / 32 BlockQ8_0 (wtype.h): for values j of block b,
 *         amax = max |x_j|, s = amax / 127, q_j = roundf(x_j * (1 / s))
 *         (ties away from zero; q = 0 when s = 0), stored scale fp16(s);
 *         x~_j = fp16(s) * q_j
 *   q4_0  d / 32 BlockQ4_0: m = the x_j of largest magnitude (first one
 *         on ties), with its sign; s = m / -8, q_j = min(15, (int8)(x_j *
 *         (1 / s) + 8.5)) (truncation toward zero; q = 8 when s = 0);
 *         qs[j] = q_j | q_{j+16} << 4; x~_j = fp16(s) * (q_j - 8)
 *
 * Both are ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref, byte for
 * byte (tests/data/kvquant/, from gguf-py's independent implementation).
 * Block pointers need 2-byte alignment (the fp16 scale); block rows of a
 * head vector are 34 (q8_0) or 18 (q4_0) bytes per 32 values.
 *
 * == +h ==
 *
 * Stored vectors are R x with R = H / sqrt(d) (kvtype.h), d a power of
 * two. R = R^T = R^-1, so kvquant_hadamard() is its own inverse. Scores
 * take R q (kvquant_query_prepare); value sums accumulate R v and are
 * rotated back once (kvquant_output_finish).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "base/half.h"
#include "engine/kv/kvtype.h"
#include "kernels/wtype.h"

/* ---- per-format references, d a multiple of 32 for the block formats ---- */

/* x (d,) -> ret (d / 32 blocks). */
void kvquant_quantize_q8_0(const float *x, int d, BlockQ8_0 *ret);
void kvquant_quantize_q4_0(const float *x, int d, BlockQ4_0 *ret);
void kvquant_quantize_f16(const float *x, int d, tkv_half *ret);

/* Stored (d / 32 blocks or d halves) -> ret (d,). */
void kvquant_dequantize_q8_0(const BlockQ8_0 *b, int d, float *ret);
void kvquant_dequantize_q4_0(const BlockQ4_0 *b, int d, float *ret);
void kvquant_dequantize_f16(const tkv_half *h, int d, float *ret);

/* Returns <q, k~> for q (d,) and a stored key k (per block: scale * integer dot). */
float kvquant_score_f32(const float *q, const float *k, int d);
float kvquant_score_f16(const float *q, const tkv_half *k, int d);
float kvquant_score_q8_0(const float *q, const BlockQ8_0 *k, int d);
float kvquant_score_q4_0(const float *q, const BlockQ4_0 *k, int d);

/* acc (d,) += a * v~ for a stored value v. */
void kvquant_axpy_f32(float a, const float *v, int d, float *acc);
void kvquant_axpy_f16(float a, const tkv_half *v, int d, float *acc);
void kvquant_axpy_q8_0(float a, const BlockQ8_0 *v, int d, float *acc);
void kvquant_axpy_q4_0(float a, const BlockQ4_0 *v, int d, float *acc);

/*
 * x (d,) <- R x = H x / sqrt(d) in place, d a power of two (fwht, then
 * the scale). Its own inverse, up to float rounding.
 */
void kvquant_hadamard(float *x, int d);

/* ---- by KvType (any format but KV_FORMAT_TQ; +h handled here) ---- */

/* Whether t is a type of this module (not TQ). */
bool kvquant_supports(const KvType *t);

/* x (dim,) -> ret (kvtype_vec_bytes(t) bytes): rotate if +h, then quantize. */
void kvquant_store(const KvType *t, const float *x, void *ret);

/* The stored vector back in the original domain: dequantize, un-rotate if +h. */
void kvquant_load(const KvType *t, const void *stored, float *ret);

/* ret (dim,) = the query in the stored domain: R q for +h, else q. ret may alias q. */
void kvquant_query_prepare(const KvType *t, const float *q, float *ret);

/* Returns <q, k~> for a prepared query and a stored key. */
float kvquant_score(const KvType *t, const float *q_prepared, const void *k);

/* acc (dim,) += a * (stored v) in the stored domain (rotated for +h). */
void kvquant_axpy(const KvType *t, float a, const void *v, float *acc);

/* acc (dim,) <- the output in the original domain: R acc for +h, else unchanged. */
void kvquant_output_finish(const KvType *t, float *acc);
