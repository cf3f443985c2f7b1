/*
 * vec_f32.h: float vector primitives for attention and other f32 loops.
 *
 * Each has a scalar reference (_ref) and an AVX2/FMA (x86) or NEON
 * (aarch64) version picked at run time; they differ only in summation order.
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
