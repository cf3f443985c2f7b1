/*
 * vec_dot.h: dot products of one weight row with activation rows.
 *
 *   s = sum_i w[i] * a[i],  w (n,) in a weight type, a (n,) in that
 *   type's activation format (quant_act_type_for(): Q8_0, Q8_1, Q8_K or
 *   F32), both as packed blocks (kernels/wtype.h). n is a multiple of the
 *   weight's block size.
 *
 * Every kernel has a scalar reference (vec_dot_ref.c, the definition of
 * the sum) and a SIMD twin (vec_dot_avx2.c, vec_dot_neon.c) that computes the same
 * integer block sums exactly and differs only in the order of float
 * accumulation. The AVX2 "multi" kernels (32-value block types) take one
 * weight row and up to VEC_DOT_MAX_NY activation rows, decoding each
 * weight block once for all of them, and the activation scales
 * pre-converted to floats; matmul() uses them for decode too. (Their
 * Q4_0/Q5_0 versions move the zero point into a float term, so those
 * agree with the reference to float rounding only.)
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/wtype.h"

/* *s = dot(weight row vw, activation row va), n values. */
typedef void (*VecDotFn)(int64_t n, float *s, const void *vw, const void *va);

#define VEC_DOT_MAX_NY 4

/*
 * s[j * s_stride] = dot(vw, va + j * a_stride) for j < ny, 1 <= ny <=
 * VEC_DOT_MAX_NY; a_stride in bytes, s_stride in floats. af holds each
 * activation row's block scales as floats (quant_act_scales(): two per
 * 32-value block), af_stride floats apart: converting them once per
 * matmul instead of once per weight row is a large part of the speed.
 */
typedef void (*VecDotMultiFn)(int64_t n, float *s, size_t s_stride, const void *vw, const void *va,
			      size_t a_stride, const float *af, size_t af_stride, int ny);

/* The scalar reference for weight type t; NULL if there is none. */
VecDotFn vec_dot_ref_get(uint32_t t);
/* The AVX2 kernel for t (call only when cpu_features() has avx2, fma and
 * f16c); NULL where t has none. */
VecDotFn vec_dot_avx2_get(uint32_t t);
VecDotMultiFn vec_dot_avx2_multi_get(uint32_t t);
/* AVX-512 VNNI multi kernels (vec_dot_avx512.c: Q6_K; they ignore af):
 * call only when cpu_features() has avx512 and avx512vnni; NULL if none. */
VecDotMultiFn vec_dot_avx512vnni_multi_get(uint32_t t);
/*
 * The NEON kernel for t (aarch64 builds, vec_dot_neon.c), with the
 * dot-product extension's SDOT where dotprod (call with dotprod true only
 * when cpu_features() has it); NULL where t has none. Like the AVX2 ones
 * they compute the reference's integer block sums exactly and differ only
 * in the order of float accumulation.
 */
VecDotFn vec_dot_neon_get(uint32_t t, bool dotprod);

void vec_dot_f32_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_f16_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_bf16_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q4_0_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q4_1_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q5_0_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q5_1_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q8_0_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q2_K_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q3_K_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q4_K_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q5_K_ref(int64_t n, float *s, const void *vw, const void *va);
void vec_dot_q6_K_ref(int64_t n, float *s, const void *vw, const void *va);

/* Q3_K's 16 signed scales of one super-block (see wtype_q3k_scale). */
static inline void vec_dot_k3_scales(const uint8_t *q, int8_t ret_sc[16])
{
	for (int i = 0; i < 16; i++)
		ret_sc[i] = (int8_t)wtype_q3k_scale(q, i);
}
