/*
 * backend_cuda_emul.c: the kernels of kernels/cuda/backend_cuda.cu (the
 * bcu_* functions of backend_cuda_internal.h) on the host, for tests
 * only: with cuda_runtime_emul.c they let backend_cuda.c run without a
 * GPU. Each function keeps its kernel's contract and arithmetic: the same
 * early returns and error codes, weights read through wtype_dequant.h, the
 * same float operations in the same order per output where the order is
 * fixed (the matrix-vector kernel's lanes and warp reduction, rmsnorm's
 * 256 threads), halves rounded to nearest even by half.h as
 * __float2half_rn rounds. Not the GPU's bits: nvcc contracts a * b + c
 * into FMAs, this C11 code does not.
 *
 * A launch returns cudaGetLastError(), as the real wrappers do, so a
 * failure the host side forgot to clear shows up in the next op.
 *
 * Every pointer a kernel would dereference is checked against the
 * device memory of devmem_emul.c over the whole range the kernel reads
 * or writes, so a host pointer, a freed buffer or a short one aborts
 * with a message where a GPU would fault or corrupt memory; the half
 * stores that use 16-byte vectors check that alignment too.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/half.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/wtype.h"
#include "kernels/wtype_dequant.h"
#include "tests/unit/devmem_emul.h"

/* Abort unless rows r0 .. r0+nr-1 of w lie in device memory; what names the kernel. */
static void check_weight_rows(const MatmulWeight *w, int64_t r0, int64_t nr, const char *what)
{
	size_t row_bytes = wtype_row_bytes(w->type, (uint64_t)w->cols);
	if (r0 < 0 || nr < 1 || r0 + nr > w->rows || !row_bytes || w->row_stride < row_bytes)
		devmem_die("%s: rows %lld .. %lld of a (%lld, %lld) %s weight with row stride %zu", what,
		    (long long)r0, (long long)(r0 + nr - 1), (long long)w->rows, (long long)w->cols,
		    wtype_name(w->type), w->row_stride);
	if (!wdq_is_float(w->type) && w->cols % WDQ_CHUNK)
		devmem_die("%s: %lld columns are not whole chunks of %d", what, (long long)w->cols, WDQ_CHUNK);
	devmem_check((const uint8_t *)w->data + (size_t)r0 * w->row_stride,
		     (size_t)(nr - 1) * w->row_stride + row_bytes, what);
}

/* Row r of w dequantized into out (cols,), as the kernels read it: by chunks, or value by value. */
static void weight_row(const MatmulWeight *w, int64_t r, float *out)
{
	const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_stride;
	if (wdq_is_float(w->type))
		for (int64_t c = 0; c < w->cols; c++)
			out[c] = wdq_float(w->type, row, c);
	else
		for (int64_t g = 0; g < w->cols / WDQ_CHUNK; g++)
			wdq_row_chunk(w->type, row, g, out + g * WDQ_CHUNK);
}

/* __shfl_xor_sync's butterfly over the 32 lanes of v; every lane ends with the sum, lane 0's returned. */
static float warp_sum(float v[32])
{
	for (int o = 16; o > 0; o >>= 1) {
		float t[32];
		for (int l = 0; l < 32; l++)
			t[l] = v[l] + v[l ^ o];
		for (int l = 0; l < 32; l++)
			v[l] = t[l];
	}
	return v[0];
}

/* ---- decode matmul ---- */

int bcu_matvec(const MatmulWeight *w, const float *x, float *y, int n)
{
	if (n < 1 || n > BCU_MATVEC_MAX_N || w->rows < 1)
		return n == 0 || w->rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
	if (!wdq_is_supported(w->type))
		return cudaErrorInvalidValue;
	check_weight_rows(w, 0, w->rows, "bcu_matvec weight");
	devmem_check(x, (size_t)n * (size_t)w->cols * sizeof(float), "bcu_matvec x");
	devmem_check(y, (size_t)n * (size_t)w->rows * sizeof(float), "bcu_matvec y");
	float *wr = malloc((size_t)w->cols * sizeof(float));
	if (!wr)
		devmem_die("out of host memory");
	devmem_open();
	for (int64_t r = 0; r < w->rows; r++) {
		weight_row(w, r, wr);
		for (int t = 0; t < n; t++) {
			const float *xt = x + t * w->cols;
			float acc[32] = { 0 };
			/* a tile is a multiple of 1024 columns: value (or chunk) i is always lane i % 32's */
			if (wdq_is_float(w->type)) {
				for (int64_t c = 0; c < w->cols; c++)
					acc[c % 32] += wr[c] * xt[c];
			} else {
				for (int64_t g = 0; g < w->cols / WDQ_CHUNK; g++) {
					float s = 0.0f;
					for (int l = 0; l < WDQ_CHUNK; l++)
						s += wr[g * WDQ_CHUNK + l] * xt[g * WDQ_CHUNK + l];
					acc[g % 32] += s;
				}
			}
			y[t * w->rows + r] = warp_sum(acc);
		}
	}
	devmem_close();
	free(wr);
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

/* ---- weight rows to halves (the prefill GEMM's A) or floats (embed) ---- */

int bcu_dequant_half(const MatmulWeight *w, int64_t r0, int64_t nr, void *dst)
{
	if (nr < 1)
		return cudaSuccess;
	if (!wdq_is_supported(w->type))
		return cudaErrorInvalidValue;
	check_weight_rows(w, r0, nr, "bcu_dequant_half weight");
	devmem_check(dst, (size_t)nr * (size_t)w->cols * sizeof(tkv_half), "bcu_dequant_half dst");
	if (!wdq_is_float(w->type) && (uintptr_t)dst % 16)
		devmem_die("bcu_dequant_half: dst %p is not 16-byte aligned (the kernel stores 16 bytes at a time)", dst);
	if ((uintptr_t)dst % 2)
		devmem_die("bcu_dequant_half: dst %p is not 2-byte aligned", dst);
	float *wr = malloc((size_t)w->cols * sizeof(float));
	if (!wr)
		devmem_die("out of host memory");
	devmem_open();
	tkv_half *out = dst;
	for (int64_t i = 0; i < nr; i++) {
		weight_row(w, r0 + i, wr);
		for (int64_t c = 0; c < w->cols; c++)
			out[i * w->cols + c] = f32_to_half(wr[c]);
	}
	devmem_close();
	free(wr);
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

int bcu_embed(const MatmulWeight *emb, const int32_t *tokens, int64_t n, float *x)
{
	if (n < 1)
		return cudaSuccess;
	if (!wdq_is_supported(emb->type))
		return cudaErrorInvalidValue;
	check_weight_rows(emb, 0, emb->rows, "bcu_embed weight");
	devmem_check(tokens, (size_t)n * sizeof(int32_t), "bcu_embed tokens");
	devmem_check(x, (size_t)n * (size_t)emb->cols * sizeof(float), "bcu_embed x");
	if ((uintptr_t)x % sizeof(float))
		devmem_die("bcu_embed: x %p is not float-aligned", (void *)x);
	devmem_open();
	for (int64_t i = 0; i < n; i++) {
		if (tokens[i] < 0 || tokens[i] >= emb->rows)
			devmem_die("bcu_embed: token %d of an embedding of %lld rows: the kernel would read out of "
			    "bounds", tokens[i], (long long)emb->rows);
		weight_row(emb, tokens[i], x + i * emb->cols);
	}
	devmem_close();
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

/* ---- element- and row-wise ops ---- */

int bcu_to_half(void *dst, const float *src, int64_t n)
{
	if (n < 1)
		return cudaSuccess;
	devmem_check(dst, (size_t)n * sizeof(tkv_half), "bcu_to_half dst");
	devmem_check(src, (size_t)n * sizeof(float), "bcu_to_half src");
	devmem_open();
	tkv_half *h = dst;
	for (int64_t i = 0; i < n; i++)
		h[i] = f32_to_half(src[i]);
	devmem_close();
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

#define NORM_THREADS 256 /* rmsnorm_kernel's block */

int bcu_rmsnorm(float *y, const float *x, const float *w, int64_t n, int64_t dim, float eps)
{
	if (n < 1)
		return cudaSuccess;
	size_t bytes = (size_t)n * (size_t)dim * sizeof(float);
	devmem_check(x, bytes, "bcu_rmsnorm x");
	devmem_check(y, bytes, "bcu_rmsnorm y");
	devmem_check(w, (size_t)dim * sizeof(float), "bcu_rmsnorm w");
	if (y != x && (const float *)y < x + n * dim && x < (const float *)y + n * dim)
		devmem_die("bcu_rmsnorm: y %p overlaps x %p without being it", (void *)y, (const void *)x);
	devmem_open();
	for (int64_t r = 0; r < n; r++) {
		const float *xr = x + r * dim;
		float *yr = y + r * dim;
		/* thread t sums dims t, t + 256, ...; each warp reduces; the 8 warp sums are added in order */
		float lanes[NORM_THREADS];
		for (int t = 0; t < NORM_THREADS; t++) {
			float ss = 0.0f;
			for (int64_t i = t; i < dim; i += NORM_THREADS)
				ss += xr[i] * xr[i];
			lanes[t] = ss;
		}
		float ss = 0.0f;
		for (int k = 0; k < NORM_THREADS / 32; k++)
			ss += warp_sum(lanes + 32 * k);
		const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
		for (int64_t i = 0; i < dim; i++)
			yr[i] = xr[i] * scale * w[i];
	}
	devmem_close();
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

int bcu_add_bias(float *x, const float *bias, int64_t n, int64_t dim)
{
	const int64_t total = n * dim;
	if (total < 1)
		return cudaSuccess;
	devmem_check(x, (size_t)total * sizeof(float), "bcu_add_bias x");
	devmem_check(bias, (size_t)dim * sizeof(float), "bcu_add_bias bias");
	devmem_open();
	for (int64_t i = 0; i < total; i++)
		x[i] += bias[i % dim];
	devmem_close();
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

int bcu_rope(float *x, int64_t n, int n_heads, int head_dim, int n_rot, int neox, const float *cs,
	     const float *sn)
{
	const int half = n_rot / 2;
	const int64_t total = n * n_heads * half;
	if (total < 1)
		return cudaSuccess;
	devmem_check(x, (size_t)n * n_heads * head_dim * sizeof(float), "bcu_rope x");
	devmem_check(cs, (size_t)n * half * sizeof(float), "bcu_rope cs");
	devmem_check(sn, (size_t)n * half * sizeof(float), "bcu_rope sn");
	devmem_open();
	for (int64_t idx = 0; idx < total; idx++) {
		const int i = (int)(idx % half);
		const int64_t rh = idx / half; /* row * n_heads + head */
		const int64_t r = rh / n_heads;
		float *v = x + rh * head_dim;
		float *pa = v + (neox ? i : 2 * i);
		float *pb = pa + (neox ? half : 1);
		const float c = cs[r * half + i], s = sn[r * half + i];
		const float x0 = *pa, x1 = *pb;
		*pa = x0 * c - x1 * s;
		*pb = x0 * s + x1 * c;
	}
	devmem_close();
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

int bcu_swiglu(float *gate, const float *up, int64_t n)
{
	if (n < 1)
		return cudaSuccess;
	devmem_check(gate, (size_t)n * sizeof(float), "bcu_swiglu gate");
	devmem_check(up, (size_t)n * sizeof(float), "bcu_swiglu up");
	devmem_open();
	for (int64_t i = 0; i < n; i++) {
		const float g = gate[i];
		gate[i] = g / (1.0f + expf(-g)) * up[i];
	}
	devmem_close();
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}

int bcu_geglu(float *gate, const float *up, int64_t n)
{
	if (n < 1)
		return cudaSuccess;
	devmem_check(gate, (size_t)n * sizeof(float), "bcu_geglu gate");
	devmem_check(up, (size_t)n * sizeof(float), "bcu_geglu up");
	devmem_open();
	const float c = 0.7978845608028654f;
	for (int64_t i = 0; i < n; i++) {
		const float g = gate[i];
		gate[i] = 0.5f * g * (1.0f + tanhf(c * g * (1.0f + 0.044715f * g * g))) * up[i];
	}
	devmem_close();
	return cudaGetLastError();
}

int bcu_scale(float *x, float s, int64_t n)
{
	if (n < 1)
		return cudaSuccess;
	devmem_check(x, (size_t)n * sizeof(float), "bcu_scale x");
	devmem_open();
	for (int64_t i = 0; i < n; i++)
		x[i] *= s;
	devmem_close();
	return cudaGetLastError();
}

int bcu_add(float *x, const float *y, int64_t n)
{
	if (n < 1)
		return cudaSuccess;
	devmem_check(x, (size_t)n * sizeof(float), "bcu_add x");
	devmem_check(y, (size_t)n * sizeof(float), "bcu_add y");
	devmem_open();
	for (int64_t i = 0; i < n; i++)
		x[i] += y[i];
	devmem_close();
	return cudaGetLastError(); /* as a launch: earlier failures show up here */
}
