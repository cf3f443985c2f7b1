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

#include <stdint.h>

#include "threadpool.h"

typedef struct MatmulWeight {
	const void *data;
	uint32_t type;        /* WType */
	int64_t rows;         /* output features */
	int64_t cols;         /* input features (multiple of the block size) */
	size_t row_stride;    /* bytes between rows */
} MatmulWeight;

/*
 * Y = X @ W^T. x is (n_tok, cols) with row stride cols; y is (n_tok, rows)
 * with row stride rows. Returns 0 or -ENOMEM (activation scratch).
 */
int matmul(ThreadPool *tp, const MatmulWeight *w, const float *x, float *y, int64_t n_tok);

/* The same product with the scalar reference kernels only, one thread. */
int matmul_ref(const MatmulWeight *w, const float *x, float *y, int64_t n_tok);

/* Dot product of one row of W with one activation row, through the
 * kernel selected at run time (for tests comparing against _ref). */
float matmul_row_dot(const MatmulWeight *w, int64_t row, const float *x);
