/*
 * vec_f32.h: float vector primitives for attention and other f32 loops.
 *
 * Each has a scalar reference (_ref) and an AVX2/FMA (x86) or NEON
 * (aarch64) version picked at run time; they differ only in summation order
 * (the GELU gate: in how e^x is approximated; aarch64 runs its reference).
 */
#pragma once

#include <stdint.h>

/* sum_i a[i] * b[i] */
float vec_f32_dot(int64_t n, const float *a, const float *b);
float vec_f32_dot_ref(int64_t n, const float *a, const float *b);
float vec_f32_dot_avx2(int64_t n, const float *a, const float *b);
float vec_f32_dot_neon(int64_t n, const float *a, const float *b);

/* y[i] += alpha * x[i] */
void vec_f32_axpy(int64_t n, float alpha, const float *x, float *y);
void vec_f32_axpy_ref(int64_t n, float alpha, const float *x, float *y);
void vec_f32_axpy_avx2(int64_t n, float alpha, const float *x, float *y);
void vec_f32_axpy_neon(int64_t n, float alpha, const float *x, float *y);

/*
 * gate[i] = gelu(gate[i]) * up[i], GELU in its tanh form (ggml's ggml_gelu,
 * Gemma's FFN): gelu(g) = 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3).
 * The AVX2 version uses 0.5 (1 + tanh(u)) = sigmoid(2u).
 */
void vec_f32_geglu(int64_t n, float *gate, const float *up);
void vec_f32_geglu_ref(int64_t n, float *gate, const float *up);
void vec_f32_geglu_avx2(int64_t n, float *gate, const float *up);
