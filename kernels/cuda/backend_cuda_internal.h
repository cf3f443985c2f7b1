/*
 * backend_cuda_internal.h: the kernels of the CUDA backend (backend_cuda.cu)
 * as C functions for its host side (backend_cuda.c).
 *
 * Every function launches on the legacy default stream and returns at
 * once with the launch's cudaError_t as an int (0 is cudaSuccess; errors
 * of earlier asynchronous work may show up here too). Pointers are device
 * memory unless said otherwise. Callers have checked shapes and types
 * (wdq_is_supported(), sizes that fit the kernels' int64 indexing).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/wtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tokens the matrix-vector kernel takes per call; larger batches go to cuBLAS. */
#define BCU_MATVEC_MAX_N 8

/*
 * y (n, w->rows) = x (n, w->cols) @ W^T for 1 <= n <= BCU_MATVEC_MAX_N:
 * one warp per row of W, each weight byte read once.
 */
int bcu_matvec(const MatmulWeight *w, const float *x, float *y, int n);

/*
 * dst (nr, w->cols) halves, row-major = rows r0 .. r0+nr-1 of W (the A
 * operand of the prefill GEMM); dst 16-byte aligned.
 */
int bcu_dequant_half(const MatmulWeight *w, int64_t r0, int64_t nr, void *dst);

/* x (n, emb->cols) floats = rows tokens[i] of emb (tokens: n device ints, in range). */
int bcu_embed(const MatmulWeight *emb, const int32_t *tokens, int64_t n, float *x);

/* dst (n,) halves = src (n,) floats, rounded to nearest (inf above 65504). */
int bcu_to_half(void *dst, const float *src, int64_t n);

/* y (n, dim) = x / rms(x) * w per row; y may alias x. */
int bcu_rmsnorm(float *y, const float *x, const float *w, int64_t n, int64_t dim, float eps);

/* x (n, dim) += bias (dim,) per row */
int bcu_add_bias(float *x, const float *bias, int64_t n, int64_t dim);

/*
 * Rotate the first n_rot dims of each head of x (n, n_heads * head_dim),
 * row i by cs, sn (n, n_rot / 2); neox: pairs (i, i + n_rot/2), else (2i, 2i+1).
 */
int bcu_rope(float *x, int64_t n, int n_heads, int head_dim, int n_rot, int neox,
	     const float *cs, const float *sn);

/* gate (n,) = silu(gate) * up */
int bcu_swiglu(float *gate, const float *up, int64_t n);

/* gate (n,) = gelu_tanh(gate) * up (gemma3) */
int bcu_geglu(float *gate, const float *up, int64_t n);

/* x (n,) *= s */
int bcu_scale(float *x, float s, int64_t n);

/* x (n,) += y (n,) */
int bcu_add(float *x, const float *y, int64_t n);

#ifdef __cplusplus
}
#endif
