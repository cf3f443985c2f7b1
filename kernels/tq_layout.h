/*
 * tq_layout.h: where the fields of one TurboQuant coded vector sit
 * (engine/codec/tq.h documents the record byte by byte), and the
 * per-coordinate reads every kernel shares, host and device: a code's
 * centroid, a code stream's dot product with a rotated query, a QJL sign.
 *
 * Owns: TqLayout and those inline helpers. Not here: building a layout
 * from a descriptor, encoding, codebooks (engine/codec/tq.h).
 */
#pragma once

#include <stdint.h>

#include "base/bitpack.h"
#include "base/half.h"

#ifdef __CUDACC__
#define TQ_HD __host__ __device__
#else
#define TQ_HD
#endif

#define TQ_MAX_DIM 1024
#define TQ_MAX_QJL_M 2048

/*
 * Byte offsets of one coded vector (see the layout above). n_scales is 1
 * or 2; off_gamma and off_signs are meaningful only with QJL.
 */
typedef struct TqLayout {
	int dim, n_hi, bits_hi, bits_lo, qjl_m, n_scales;
	uint32_t off_scale[2], off_gamma, off_hi, off_lo, off_signs;
	uint32_t code_bytes;
} TqLayout;

/* ---- per-coordinate helpers shared with kernels (host and device) ---- */

static inline TQ_HD float tq_load_f16(const uint8_t *p)
{
	return half_to_f32((tkv_half)(p[0] | (unsigned)p[1] << 8));
}

static inline TQ_HD void tq_store_f16(uint8_t *p, float v)
{
	tkv_half h = f32_to_half(v);
	p[0] = (uint8_t)(h & 0xff);
	p[1] = (uint8_t)(h >> 8);
}

/* Centroid of code i of a packed stream. */
static inline TQ_HD float tq_code_value(const uint8_t *packed, int bits, const float *centroids,
					int i)
{
	return centroids[bitpack_get(packed, bits, (size_t)i)];
}

/* out (n,) = scale * centroids[code i]. */
static inline TQ_HD void tq_unpack_scaled(const uint8_t *packed, int bits, const float *centroids,
					  int n, float scale, float *out)
{
	for (int i = 0; i < n; i++)
		out[i] = scale * tq_code_value(packed, bits, centroids, i);
}

/* sum_i qrot[i] * centroids[code i] over n codes. */
static inline TQ_HD float tq_dot_codes(const float *qrot, const uint8_t *packed, int bits,
				       const float *centroids, int n)
{
	float acc = 0.0f;
	for (int i = 0; i < n; i++)
		acc += qrot[i] * tq_code_value(packed, bits, centroids, i);
	return acc;
}

/* z_i in {-1, +1} from sign bit i. */
static inline TQ_HD float tq_sign_value(const uint8_t *signs, int i)
{
	int bit = (signs[i >> 3] >> (i & 7)) & 1;
	return (float)(2 * bit - 1); /* branch-free: sign bits are coin flips */
}

/* sum_i sq[i] * z_i over m sign bits. */
static inline TQ_HD float tq_dot_signs(const float *sq, const uint8_t *signs, int m)
{
	float acc = 0.0f;
	for (int i = 0; i < m; i++)
		acc += tq_sign_value(signs, i) * sq[i];
	return acc;
}
