/*
 * matmul.h: weight-times-activation products for every weight type.
 *
 *   Y (n_tok, rows) = X (n_tok, cols) @ W^T,  W (rows, cols) in type wtype,
 *   row-major: row r of W is wtype_row_bytes(wtype, cols) bytes at
 *   w + r * row_stride.
 *
 * Quantized weights are multiplied against activations quantized to int8
 * blocks (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the
 * K-quants), as ggml does; float weights use float dot products. Each
 * type has a scalar reference vec_dot and, where the CPU allows, an
 * AVX2/FMA one picked at run time; both compute the same sums up to float
 * rounding. Work is split across the pool by rows of W (and, for prefill,
 * tiled over tokens so each weight row is read once per tile).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/threadpool.h"
#include "kernels/wtype.h"

/*
 * Y = X @ W^T. x is (n_tok, cols) with row stride cols; y is (n_tok, rows)
 * with row stride rows. Returns 0, -EINVAL (a type or shape with no
 * kernel, a row_stride below the row size) or -ENOMEM (scratch).
 */
int matmul(ThreadPool *tp, const MatmulWeight *w, const float *x, float *y, int64_t n_tok);

/*
 * Several products of one input, Y_i = X @ W_i^T for i < n_w (q/k/v,
 * gate/up): X is quantized once and all rows go out in one dispatch,
 * which also balances small matrices better across threads. All W_i
 * share cols and activation format; y_i is (n_tok, ws[i]->rows).
 * 1 <= n_w <= MATMUL_GROUP_MAX. Returns 0, -EINVAL or -ENOMEM.
 */
#define MATMUL_GROUP_MAX 4
int matmul_group(ThreadPool *tp, const MatmulWeight *const *ws, float *const *ys, int n_w, const float *x,
		 int64_t n_tok);

/* The same product with the scalar reference kernels only, one thread. */
int matmul_ref(const MatmulWeight *w, const float *x, float *y, int64_t n_tok);

/*
 * Whether w (row-major) should be repacked (kernels/cpu/repack.h) on this
 * CPU: repack_supported(w), and its type has a SIMD tile kernel here that
 * matmul() would pick, or is Q4_K (whose reference tile is its reference
 * row kernel, so nothing gets slower). Elsewhere the row kernels are faster
 * than a reference tile would be: the Q4_0, Q4_1 and Q8_0 tiles exist for
 * AVX2 only (AVX-512 CPUs included), so NEON keeps those row-major.
 */
bool matmul_repack_wanted(const MatmulWeight *w);

/* Dot product of one row of W with one activation row, through the
 * kernel selected at run time (for tests comparing against _ref). */
float matmul_row_dot(const MatmulWeight *w, int64_t row, const float *x);
