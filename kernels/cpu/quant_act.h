/*
 * quant_act.h: activation rows quantized to the int8 block formats the
 * quantized dot products consume (layouts in kernels/wtype.h).
 *
 *   Q8_0: d = amax / 127, q = roundf(x / d) (ties away from zero)
 *   Q8_1: as Q8_0, plus s = d * sum(q) stored as half
 *   Q8_K: per 256 values, max = the value of largest magnitude (signed),
 *         iscale = -127 / max, q = min(127, round_even(iscale * x)),
 *         d = 1 / iscale (float, sign opposite to max), bsums = sums of
 *         q in groups of 16
 *
 * The _ref functions are bit-identical to ggml's quantize_row_q8_0_ref,
 * quantize_row_q8_1_ref and quantize_row_q8_K_ref (an all-zero Q8_K
 * block also gets zero bsums, which ggml leaves unset). The _avx2
 * versions produce the same bytes as the references (same rounding,
 * same operation order), and are only called when cpu_features() has
 * avx2, fma and f16c; so do the _neon ones (aarch64 builds).
 */
#pragma once

#include <stdint.h>

#include "kernels/wtype.h"

/* x (n,) -> y (n / 32 blocks); n a multiple of 32. */
void quant_act_q8_0_ref(const float *x, BlockQ8_0 *y, int64_t n);
void quant_act_q8_1_ref(const float *x, BlockQ8_1 *y, int64_t n);
/* x (n,) -> y (n / 256 blocks); n a multiple of 256. */
void quant_act_q8_K_ref(const float *x, BlockQ8_K *y, int64_t n);

void quant_act_q8_0_avx2(const float *x, BlockQ8_0 *y, int64_t n);
void quant_act_q8_1_avx2(const float *x, BlockQ8_1 *y, int64_t n);
void quant_act_q8_K_avx2(const float *x, BlockQ8_K *y, int64_t n);
/* NEON (aarch64 builds): the same bytes as the references too. */
void quant_act_q8_0_neon(const float *x, BlockQ8_0 *y, int64_t n);
void quant_act_q8_1_neon(const float *x, BlockQ8_1 *y, int64_t n);
void quant_act_q8_K_neon(const float *x, BlockQ8_K *y, int64_t n);

/*
 * The activation format a weight type is multiplied with: WTYPE_Q8_0,
 * WTYPE_Q8_1 or WTYPE_Q8_K for quantized weights, WTYPE_F32 for float
 * ones (activations used as they are), or -1 for types with no kernel.
 */
int quant_act_type_for(uint32_t wtype);

/*
 * The block scales of a Q8_0 or Q8_1 row of n values as floats, two per
 * block: (d, s) for Q8_1 (its stored half s), (d, d * sum(q)) for Q8_0.
 * ret_scales holds n / 16 floats. (What the multi-row dot kernels read
 * instead of the halves.)
 */
void quant_act_scales(uint32_t act_type, const void *y, float *ret_scales, int64_t n);

/*
 * Quantize one row x (n,) into act_type (Q8_0, Q8_1 or Q8_K; for F32 a
 * plain copy) through the fastest path the CPU allows (simd false: the
 * reference). y holds wtype_row_bytes(act_type, n) bytes.
 */
void quant_act_row(uint32_t act_type, const float *x, void *y, int64_t n, bool simd);
