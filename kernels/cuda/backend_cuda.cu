/*
 * backend_cuda.cu: the kernels of the CUDA backend (backend_cuda.c is its
 * host side): the decode matmul, weight dequantization for the prefill
 * GEMM and for embeddings, and the small row- and element-wise ops.
 *
 * The weight formats are read through kernels/wtype_dequant.h, the plain-C
 * chunk dequantizers the CPU unit test checks against wtype.c; kernels are
 * templates on the weight type, so its switches fold away. Nothing here
 * allocates: scratch comes from the caller.
 *
 * == Decode matmul (matvec_kernel) ==
 *
 *   y (n, rows) = x (n, cols) @ W^T, n <= 8: grid (ceil(rows / 8)),
 *   block 8 warps; warp w of block b owns row 8b + w.
 *
 * The activations go through shared memory in tiles of MV_X_VALUES floats
 * (all n tokens together: a tile is MV_X_VALUES / NT columns). In a tile,
 * lane j of a warp takes chunks j, j + 32, ... of 32 values of its row
 * (wtype_dequant.h: one 32-value block, or one eighth of a K-quant
 * super-block), dequantizes the chunk into registers and multiplies it
 * with the tile's 32 values of every token. So each weight byte is read
 * once per call, the 32 lanes together read one contiguous stretch of the
 * row, and float accumulators are reduced across the warp at the end.
 * Float rows (F32/F16/BF16) are read one value per lane instead, so they
 * need not be multiples of 32. In shared memory a pad float follows every
 * 32 values (xs_index()), so lanes reading one value of 32 different
 * chunks hit 32 different banks.
 */
#include <cuda_fp16.h>

#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/wtype_dequant.h"

#define FULL_MASK 0xffffffffu

/* Every weight type the backend takes (wdq_is_supported()): one instantiation each. */
#define WTYPE_CASES(CASE)                                                                      \
	CASE(WTYPE_F32) CASE(WTYPE_F16) CASE(WTYPE_BF16) CASE(WTYPE_Q4_0) CASE(WTYPE_Q4_1)      \
	CASE(WTYPE_Q5_0) CASE(WTYPE_Q5_1) CASE(WTYPE_Q8_0) CASE(WTYPE_Q2_K) CASE(WTYPE_Q3_K)    \
	CASE(WTYPE_Q4_K) CASE(WTYPE_Q5_K) CASE(WTYPE_Q6_K)

template <uint32_t T> struct WTypeTraits {
	static constexpr bool is_float = T == WTYPE_F32 || T == WTYPE_F16 || T == WTYPE_BF16;
};

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

/* Blocks for n elements at threads per block (grid-stride loops cover the rest). */
static unsigned elem_blocks(int64_t n, int threads)
{
	int64_t b = (n + threads - 1) / threads;
	return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

/* ---- decode matmul ---- */

#define MV_WARPS 8
#define MV_THREADS (MV_WARPS * 32)
#define MV_X_VALUES 8192 /* floats of x per tile, all tokens: 33 KiB of shared memory with padding */

struct MatvecArgs {
	const uint8_t *w;   /* (rows, row_stride bytes) */
	size_t row_stride;
	int64_t rows, cols;
	const float *x;     /* (n, cols) */
	float *y;           /* (n, rows) */
	int n;
};

/* Position of value i of a tile row: one pad float after every 32 values. */
static __device__ __forceinline__ int xs_index(int i)
{
	return i + i / 32;
}

template <uint32_t T, int NT>
__global__ void __launch_bounds__(MV_THREADS) matvec_kernel(MatvecArgs a)
{
	constexpr int TILE = MV_X_VALUES / NT; /* columns per tile: a multiple of 1024 */
	__shared__ float xs[NT][TILE + TILE / 32];

	const int lane = threadIdx.x % 32;
	const int64_t row = (int64_t)blockIdx.x * MV_WARPS + threadIdx.x / 32;
	const bool active = row < a.rows; /* the last block's spare warps still load tiles */
	const uint8_t *wr = a.w + (active ? row : 0) * a.row_stride;

	float acc[NT];
	for (int t = 0; t < NT; t++)
		acc[t] = 0.0f;

	for (int64_t t0 = 0; t0 < a.cols; t0 += TILE) {
		const int len = (int)(a.cols - t0 < TILE ? a.cols - t0 : TILE);
		__syncthreads(); /* every warp is done with the previous tile */
		for (int t = 0; t < NT && t < a.n; t++) {
			const float *xt = a.x + t * a.cols + t0;
			for (int i = threadIdx.x; i < len; i += MV_THREADS)
				xs[t][xs_index(i)] = xt[i];
		}
		__syncthreads();
		if (!active)
			continue;

		if constexpr (WTypeTraits<T>::is_float) {
			for (int i = lane; i < len; i += 32) {
				const float v = wdq_float(T, wr, t0 + i);
#pragma unroll
				for (int t = 0; t < NT; t++)
					if (t < a.n)
						acc[t] += v * xs[t][xs_index(i)];
			}
		} else {
			/* t0 and len are multiples of 32 here: cols is a multiple of the block size */
			const int64_t g0 = t0 / WDQ_CHUNK;
			for (int g = lane; g < len / WDQ_CHUNK; g += 32) {
				float v[WDQ_CHUNK];
				wdq_row_chunk(T, wr, g0 + g, v);
#pragma unroll
				for (int t = 0; t < NT; t++) {
					if (t < a.n) {
						const float *xc = &xs[t][xs_index(g * WDQ_CHUNK)];
						float s = 0.0f;
#pragma unroll
						for (int l = 0; l < WDQ_CHUNK; l++)
							s += v[l] * xc[l];
						acc[t] += s;
					}
				}
			}
		}
	}

#pragma unroll
	for (int t = 0; t < NT; t++) {
		const float s = warp_sum(acc[t]);
		if (active && lane == 0 && t < a.n)
			a.y[t * a.rows + row] = s;
	}
}

template <uint32_t T> static void launch_matvec(const MatvecArgs &a)
{
	const unsigned grid = (unsigned)((a.rows + MV_WARPS - 1) / MV_WARPS);
	if (a.n == 1)
		matvec_kernel<T, 1><<<grid, MV_THREADS>>>(a);
	else if (a.n == 2)
		matvec_kernel<T, 2><<<grid, MV_THREADS>>>(a);
	else if (a.n <= 4)
		matvec_kernel<T, 4><<<grid, MV_THREADS>>>(a);
	else
		matvec_kernel<T, 8><<<grid, MV_THREADS>>>(a);
}

extern "C" int bcu_matvec(const MatmulWeight *w, const float *x, float *y, int n)
{
	if (n < 1 || n > BCU_MATVEC_MAX_N || w->rows < 1)
		return n == 0 || w->rows == 0 ? (int)cudaSuccess : (int)cudaErrorInvalidValue;
	MatvecArgs a = { (const uint8_t *)w->data, w->row_stride, w->rows, w->cols, x, y, n };
	switch (w->type) {
#define CASE(t)                          \
	case t:                          \
		launch_matvec<t>(a);     \
		break;
		WTYPE_CASES(CASE)
#undef CASE
	default:
		return (int)cudaErrorInvalidValue;
	}
	return (int)cudaGetLastError();
}

/* ---- weight rows to floats (embed) or halves (the prefill GEMM's A) ---- */

#define DQ_THREADS 128

struct DequantArgs {
	const uint8_t *w;
	size_t row_stride;
	int64_t cols;
	const int32_t *ids; /* output row i is row ids[i] of W; NULL: row r0 + i */
	int64_t r0;
	void *dst;          /* (rows, cols) of OUT */
};

static __device__ __forceinline__ void store(float *p, float v)
{
	*p = v;
}

static __device__ __forceinline__ void store(__half *p, float v)
{
	*p = __float2half_rn(v);
}

/* v (32,) to p: floats one by one (embed's x may have any alignment) */
static __device__ __forceinline__ void store_chunk(float *p, const float *v)
{
#pragma unroll
	for (int l = 0; l < WDQ_CHUNK; l++)
		p[l] = v[l];
}

static __device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
	return (uint32_t)__half_as_ushort(__float2half_rn(lo)) |
	       (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

/* v (32,) to p as halves, 16 bytes a store: p is 16-byte aligned (the scratch
 * is, and a chunk of a row of cols % 32 == 0 halves starts at a multiple of 64 bytes) */
static __device__ __forceinline__ void store_chunk(__half *p, const float *v)
{
#pragma unroll
	for (int k = 0; k < WDQ_CHUNK / 8; k++) {
		const float *s = v + 8 * k;
		((uint4 *)p)[k] = make_uint4(pack_half2(s[0], s[1]), pack_half2(s[2], s[3]),
					     pack_half2(s[4], s[5]), pack_half2(s[6], s[7]));
	}
}

/* Grid (output rows), DQ_THREADS threads: one chunk (or float value) per thread at a time. */
template <uint32_t T, typename OUT> __global__ void __launch_bounds__(DQ_THREADS) dequant_rows_kernel(DequantArgs a)
{
	const int64_t i = blockIdx.x;
	const int64_t src = a.ids ? (int64_t)a.ids[i] : a.r0 + i;
	const uint8_t *wr = a.w + src * a.row_stride;
	OUT *out = (OUT *)a.dst + i * a.cols;

	if constexpr (WTypeTraits<T>::is_float) {
		for (int64_t j = threadIdx.x; j < a.cols; j += DQ_THREADS)
			store(out + j, wdq_float(T, wr, j));
	} else {
		for (int64_t g = threadIdx.x; g < a.cols / WDQ_CHUNK; g += DQ_THREADS) {
			float v[WDQ_CHUNK];
			wdq_row_chunk(T, wr, g, v);
			store_chunk(out + g * WDQ_CHUNK, v);
		}
	}
}

template <typename OUT> static int launch_dequant(uint32_t type, const DequantArgs &a, int64_t rows)
{
	if (rows < 1)
		return (int)cudaSuccess;
	const unsigned grid = (unsigned)rows;
	switch (type) {
#define CASE(t)                                                             \
	case t:                                                             \
		dequant_rows_kernel<t, OUT><<<grid, DQ_THREADS>>>(a);       \
		break;
		WTYPE_CASES(CASE)
#undef CASE
	default:
		return (int)cudaErrorInvalidValue;
	}
	return (int)cudaGetLastError();
}

extern "C" int bcu_dequant_half(const MatmulWeight *w, int64_t r0, int64_t nr, void *dst)
{
	DequantArgs a = { (const uint8_t *)w->data, w->row_stride, w->cols, NULL, r0, dst };
	return launch_dequant<__half>(w->type, a, nr);
}

extern "C" int bcu_embed(const MatmulWeight *emb, const int32_t *tokens, int64_t n, float *x)
{
	DequantArgs a = { (const uint8_t *)emb->data, emb->row_stride, emb->cols, tokens, 0, x };
	return launch_dequant<float>(emb->type, a, n);
}

/* ---- element- and row-wise ops ---- */

#define EW_THREADS 256

__global__ void to_half_kernel(__half *dst, const float *src, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		dst[i] = __float2half_rn(src[i]);
}

extern "C" int bcu_to_half(void *dst, const float *src, int64_t n)
{
	if (n < 1)
		return (int)cudaSuccess;
	to_half_kernel<<<elem_blocks(n, EW_THREADS), EW_THREADS>>>((__half *)dst, src, n);
	return (int)cudaGetLastError();
}

#define NORM_THREADS 256

/* Grid (n rows), NORM_THREADS threads. Each thread reads and writes only its own indices, so y may alias x. */
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(float *y, const float *x, const float *w,
							       int64_t dim, float eps)
{
	__shared__ float part[NORM_THREADS / 32];
	const float *xr = x + (int64_t)blockIdx.x * dim;
	float *yr = y + (int64_t)blockIdx.x * dim;

	float ss = 0.0f;
	for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS)
		ss += xr[i] * xr[i];
	ss = warp_sum(ss);
	if (threadIdx.x % 32 == 0)
		part[threadIdx.x / 32] = ss;
	__syncthreads();
	ss = 0.0f;
	for (int k = 0; k < NORM_THREADS / 32; k++)
		ss += part[k];

	const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
	for (int64_t i = threadIdx.x; i < dim; i += NORM_THREADS)
		yr[i] = xr[i] * scale * w[i];
}

extern "C" int bcu_rmsnorm(float *y, const float *x, const float *w, int64_t n, int64_t dim, float eps)
{
	if (n < 1)
		return (int)cudaSuccess;
	rmsnorm_kernel<<<(unsigned)n, NORM_THREADS>>>(y, x, w, dim, eps);
	return (int)cudaGetLastError();
}

__global__ void add_bias_kernel(float *x, const float *bias, int64_t total, int64_t dim)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (int64_t)gridDim.x * blockDim.x)
		x[i] += bias[i % dim];
}

extern "C" int bcu_add_bias(float *x, const float *bias, int64_t n, int64_t dim)
{
	const int64_t total = n * dim;
	if (total < 1)
		return (int)cudaSuccess;
	add_bias_kernel<<<elem_blocks(total, EW_THREADS), EW_THREADS>>>(x, bias, total, dim);
	return (int)cudaGetLastError();
}

/* One thread per (row, head, rotation index): ops.c's rope_rotate(). */
__global__ void rope_kernel(float *x, int64_t total, int n_heads, int head_dim, int half, int neox,
			    const float *cs, const float *sn)
{
	for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
	     idx += (int64_t)gridDim.x * blockDim.x) {
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
}

extern "C" int bcu_rope(float *x, int64_t n, int n_heads, int head_dim, int n_rot, int neox,
			const float *cs, const float *sn)
{
	const int half = n_rot / 2;
	const int64_t total = n * n_heads * half;
	if (total < 1)
		return (int)cudaSuccess;
	rope_kernel<<<elem_blocks(total, EW_THREADS), EW_THREADS>>>(x, total, n_heads, head_dim, half,
								     neox, cs, sn);
	return (int)cudaGetLastError();
}

__global__ void swiglu_kernel(float *gate, const float *up, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		const float g = gate[i];
		gate[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

extern "C" int bcu_swiglu(float *gate, const float *up, int64_t n)
{
	if (n < 1)
		return (int)cudaSuccess;
	swiglu_kernel<<<elem_blocks(n, EW_THREADS), EW_THREADS>>>(gate, up, n);
	return (int)cudaGetLastError();
}

/* gelu_tanh(gate) * up, ops.c's op_geglu() (the CPU's) written for the device */
__global__ void geglu_kernel(float *gate, const float *up, int64_t n)
{
	const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		const float g = gate[i];
		gate[i] = 0.5f * g * (1.0f + tanhf(c * g * (1.0f + 0.044715f * g * g))) * up[i];
	}
}

extern "C" int bcu_geglu(float *gate, const float *up, int64_t n)
{
	if (n < 1)
		return (int)cudaSuccess;
	geglu_kernel<<<elem_blocks(n, EW_THREADS), EW_THREADS>>>(gate, up, n);
	return (int)cudaGetLastError();
}

__global__ void scale_kernel(float *x, float s, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		x[i] *= s;
}

extern "C" int bcu_scale(float *x, float s, int64_t n)
{
	if (n < 1)
		return (int)cudaSuccess;
	scale_kernel<<<elem_blocks(n, EW_THREADS), EW_THREADS>>>(x, s, n);
	return (int)cudaGetLastError();
}

__global__ void add_kernel(float *x, const float *y, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		x[i] += y[i];
}

extern "C" int bcu_add(float *x, const float *y, int64_t n)
{
	if (n < 1)
		return (int)cudaSuccess;
	add_kernel<<<elem_blocks(n, EW_THREADS), EW_THREADS>>>(x, y, n);
	return (int)cudaGetLastError();
}
