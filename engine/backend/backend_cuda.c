/*
 * backend_cuda.c: the CUDA backend of engine/backend/backend.h, host side.
 *
 * Owns: device 0's memory as the model sees it (every allocation is
 * tracked and released by free(), uploaded weights included), the cuBLAS
 * handle, and the scratch of the prefill GEMM; the translation of CUDA
 * failures into -ENOMEM / -EIO / -ENODEV. The kernels are
 * backend_cuda.cu's (backend_cuda_internal.h), the KV caches
 * kv_cuda_cache.c's. Everything runs in order on the legacy default
 * stream; download() waits for it.
 *
 * Matmuls: up to BCU_MATVEC_MAX_N tokens run the dequantizing
 * matrix-vector kernel, which reads each weight byte once. Larger batches
 * (prefill) convert X to halves, dequantize W to halves in row tiles of
 * at most GEMM_W_TILE_BYTES (F16 weights are used in place) and multiply
 * with cublasGemmEx: f16 inputs, f32 accumulation and output. Activations
 * beyond the f16 range (65504) would overflow there; llama.cpp's cuBLAS
 * path makes the same trade.
 *
 * Ops return only a code; the CUDA message of the last failure is kept in
 * CudaBackend.msg for backend_last_error(). One forward pass
 * at a time: the scratch buffers are the backend's, not the caller's.
 */
#include <assert.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/backend/kv_cuda_cache.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/wtype.h"
#include "kernels/wtype_dequant.h"

/* Bytes of one row tile of W dequantized to halves for the prefill GEMM. */
#define GEMM_W_TILE_BYTES ((size_t)128 << 20)
#define SCRATCH_ALIGN 256

typedef struct CudaBackend {
	Backend base;
	cublasHandle_t blas;
	void **bufs;           /* (n_bufs,) every device allocation handed out: weights, vectors, alloc() */
	size_t n_bufs, cap_bufs;
	/*
	 * (n_weights,) device copies of uploaded weights, so that one handed in
	 * again is left as it is. Not looked up by host address: the host
	 * memory of a freed model (or test buffer) is reused by the next one.
	 * Tied embeddings are one upload because model.c uploads them once.
	 */
	void **weights;
	size_t n_weights, cap_weights;
	void *scratch;         /* prefill: X then a row tile of W, as halves */
	size_t scratch_bytes;
	void *tokens;          /* embed's token ids (int32) on the device */
	size_t tokens_bytes;
	float *angles;         /* rope_angles' host staging: cs then sn */
	size_t angles_cap;     /* floats */
	char msg[256];         /* the last CUDA failure */
} CudaBackend;

static const BackendOps cuda_ops;

static CudaBackend *cuda_of(Backend *b)
{
	assert(b && b->ops == &cuda_ops);
	return (CudaBackend *)b;
}

/* Record a CUDA failure; returns its errno: -ENOMEM for device memory, else -EIO. */
static int cuda_fail(CudaBackend *cb, int e, const char *what)
{
	snprintf(cb->msg, sizeof(cb->msg), "CUDA %s: %s", what, cudaGetErrorString((cudaError_t)e));
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

/* A launch wrapper's result to 0 or an errno. */
static int launched(CudaBackend *cb, int e, const char *what)
{
	return e == cudaSuccess ? 0 : cuda_fail(cb, e, what);
}

/* cudaMalloc; on failure cb->msg names the size. Returns 0 or -ENOMEM / -EIO. */
static int dev_malloc(CudaBackend *cb, size_t bytes, void **ret)
{
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
	if (e != cudaSuccess) {
		(void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
		snprintf(cb->msg, sizeof(cb->msg), "CUDA: cannot allocate %zu bytes of device memory: %s",
			 bytes, cudaGetErrorString(e));
		return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
	}
	*ret = p;
	return 0;
}

/* cudaMalloc, tracked in bufs so that free() releases it. */
static int buf_new(CudaBackend *cb, size_t bytes, void **ret)
{
	if (cb->n_bufs == cb->cap_bufs) {
		size_t cap = cb->cap_bufs ? 2 * cb->cap_bufs : 64;
		void **bufs = realloc(cb->bufs, cap * sizeof(*bufs));
		if (!bufs)
			return -ENOMEM;
		cb->bufs = bufs;
		cb->cap_bufs = cap;
	}
	void *p;
	int r = dev_malloc(cb, bytes, &p);
	if (r)
		return r;
	cb->bufs[cb->n_bufs++] = p;
	*ret = p;
	return 0;
}

static void buf_free(CudaBackend *cb, void *p)
{
	for (size_t i = 0; i < cb->n_weights; i++)
		if (cb->weights[i] == p) {
			cb->weights[i] = cb->weights[--cb->n_weights];
			break;
		}
	for (size_t i = 0; i < cb->n_bufs; i++)
		if (cb->bufs[i] == p) {
			cb->bufs[i] = cb->bufs[--cb->n_bufs];
			cudaFree(p); /* waits for the work queued before it */
			return;
		}
	assert(!"dealloc of memory this backend did not allocate");
}

/* Make the device buffer *p hold at least bytes (contents not kept). */
static int scratch_reserve(CudaBackend *cb, void **p, size_t *cap, size_t bytes)
{
	if (bytes <= *cap)
		return 0;
	cudaFree(*p);
	*p = NULL;
	*cap = 0;
	int r = dev_malloc(cb, bytes, p);
	if (r)
		return r;
	*cap = bytes;
	return 0;
}

static void cuda_backend_free(Backend *b)
{
	CudaBackend *cb = cuda_of(b);
	for (size_t i = 0; i < cb->n_bufs; i++)
		cudaFree(cb->bufs[i]);
	free(cb->bufs);
	free(cb->weights);
	cudaFree(cb->scratch);
	cudaFree(cb->tokens);
	free(cb->angles);
	if (cb->blas)
		cublasDestroy(cb->blas);
	free(cb);
}

static const char *cuda_last_error(Backend *b)
{
	return cuda_of(b)->msg;
}

/* ---- memory ---- */

static int cuda_alloc(Backend *b, size_t bytes, void **ret)
{
	return buf_new(cuda_of(b), bytes, ret);
}

static void cuda_dealloc(Backend *b, void *p)
{
	if (p)
		buf_free(cuda_of(b), p);
}

static int cuda_upload(Backend *b, void *dst, const void *src, size_t bytes)
{
	/* From pageable memory this returns once src is staged: the caller may reuse it. */
	cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
	return e == cudaSuccess ? 0 : cuda_fail(cuda_of(b), e, "upload");
}

static int cuda_download(Backend *b, void *dst, const void *src, size_t bytes)
{
	CudaBackend *cb = cuda_of(b);
	/* synchronize first, so a failed kernel is reported as what it is */
	cudaError_t e = cudaDeviceSynchronize();
	if (e != cudaSuccess)
		return cuda_fail(cb, e, "kernel");
	e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
	return e == cudaSuccess ? 0 : cuda_fail(cb, e, "download");
}

/*
 * Bytes of w's data from its first to the end of its last row, for a
 * shape and type the kernels take: 0, or -EINVAL.
 */
static int weight_bytes(CudaBackend *cb, const MatmulWeight *w, size_t *ret)
{
	if (!wdq_is_supported(w->type)) {
		snprintf(cb->msg, sizeof(cb->msg), "no CUDA kernel for weight type %s", wtype_name(w->type));
		return -EINVAL;
	}
	size_t row_bytes = wtype_row_bytes(w->type, (uint64_t)w->cols);
	/* halves and floats are read as such: the rows must be aligned for them */
	size_t align = w->type == WTYPE_F32 ? 4 : 2;
	if (w->rows < 1 || w->cols < 1 || w->cols > INT_MAX || w->rows > INT_MAX || !row_bytes ||
	    w->row_stride < row_bytes || w->row_stride / 2 > INT_MAX || w->row_stride % align || (uintptr_t)w->data % align) {
		snprintf(cb->msg, sizeof(cb->msg), "weight (%lld, %lld) %s: shape or layout the CUDA kernels "
			 "cannot take", (long long)w->rows, (long long)w->cols, wtype_name(w->type));
		return -EINVAL;
	}
	size_t bytes;
	if (size_mul_overflows((size_t)(w->rows - 1), w->row_stride, &bytes) ||
	    size_add_overflows(bytes, row_bytes, &bytes))
		return -EINVAL;
	*ret = bytes;
	return 0;
}

static int cuda_upload_weight(Backend *b, MatmulWeight *w)
{
	CudaBackend *cb = cuda_of(b);
	size_t bytes;
	int r = weight_bytes(cb, w, &bytes);
	if (r)
		return r;
	for (size_t i = 0; i < cb->n_weights; i++)
		if (w->data == cb->weights[i])
			return 0; /* uploaded already (a copy of an uploaded MatmulWeight) */
	if (cb->n_weights == cb->cap_weights) {
		size_t cap = cb->cap_weights ? 2 * cb->cap_weights : 64;
		void **weights = realloc(cb->weights, cap * sizeof(*weights));
		if (!weights)
			return -ENOMEM;
		cb->weights = weights;
		cb->cap_weights = cap;
	}
	void *dev;
	if ((r = buf_new(cb, bytes, &dev)))
		return r;
	cudaError_t e = cudaMemcpy(dev, w->data, bytes, cudaMemcpyHostToDevice);
	if (e != cudaSuccess) {
		buf_free(cb, dev);
		return cuda_fail(cb, e, "weight upload");
	}
	cb->weights[cb->n_weights++] = dev;
	w->data = dev;
	return 0;
}

static int cuda_upload_vector(Backend *b, const float **v, int64_t n)
{
	CudaBackend *cb = cuda_of(b);
	size_t bytes;
	if (n < 0 || size_mul_overflows((size_t)n, sizeof(float), &bytes))
		return -EINVAL;
	void *dev;
	int r = buf_new(cb, bytes, &dev);
	if (r)
		return r;
	cudaError_t e = cudaMemcpy(dev, *v, bytes, cudaMemcpyHostToDevice);
	if (e != cudaSuccess) {
		buf_free(cb, dev);
		return cuda_fail(cb, e, "vector upload");
	}
	*v = dev;
	return 0;
}

/* ---- operators ---- */

static int cuda_embed(Backend *b, const MatmulWeight *emb, const int32_t *tokens, int64_t n, float *x)
{
	CudaBackend *cb = cuda_of(b);
	if (n <= 0)
		return n < 0 ? -EINVAL : 0;
	if (n > INT_MAX || !wdq_is_supported(emb->type))
		return -EINVAL;
	for (int64_t i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= emb->rows)
			return -EINVAL;
	int r = scratch_reserve(cb, &cb->tokens, &cb->tokens_bytes, (size_t)MAX(n, 256) * sizeof(int32_t));
	if (r)
		return r;
	/* stream-ordered after the previous embed's kernel, which read the old ids */
	cudaError_t e = cudaMemcpy(cb->tokens, tokens, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice);
	if (e != cudaSuccess)
		return cuda_fail(cb, e, "token upload");
	return launched(cb, bcu_embed(emb, cb->tokens, n, x), "embed");
}

static int cuda_rmsnorm(Backend *b, float *y, const float *x, const float *w, int64_t n, int64_t dim,
			float eps)
{
	if (n < 0 || n > INT_MAX || dim < 1)
		return -EINVAL;
	return launched(cuda_of(b), bcu_rmsnorm(y, x, w, n, dim, eps), "rmsnorm");
}

/*
 * Y (n, rows) = X (n, cols) @ W^T for the rows of W from its row tiles,
 * Xh the halves of X.
 *
 * cuBLAS is column-major, and a row-major (a, b) matrix with row pitch ld
 * is, read column-major, the (b, a) matrix of its transpose with leading
 * dimension ld. So with everything row-major as the backend has it:
 *   C = Y^T   (rows, n),    ldc = rows       (Y row-major (n, rows))
 *   A = W^T   (cols, rows), lda = row pitch  (W row-major) -> transa = T: op(A) = W (rows, cols)
 *   B = X^T   (cols, n),    ldb = cols       (X row-major) -> transb = N: op(B) = X^T (cols, n)
 * and C = op(A) op(B) = W X^T = (X W^T)^T = Y^T, i.e. Y. m = rows, n = n,
 * k = cols. A tile of rows r0 .. r0+nr-1 of W gives rows r0.. of Y^T,
 * which are columns r0.. of Y: C starts at y + r0 with the same ldc.
 */
static int gemm_weight(CudaBackend *cb, const MatmulWeight *w, const void *xh, void *wh,
		       int64_t tile_rows, float *y, int64_t n)
{
	const float alpha = 1.0f, beta = 0.0f;
	/* F16 rows are W's own; others are dequantized into wh, tile by tile */
	const bool in_place = w->type == WTYPE_F16;
	for (int64_t r0 = 0; r0 < w->rows; r0 += tile_rows) {
		int64_t nr = MIN(tile_rows, w->rows - r0);
		const void *a;
		int lda;
		if (in_place) {
			a = (const uint8_t *)w->data + (size_t)r0 * w->row_stride;
			lda = (int)(w->row_stride / 2);
		} else {
			int e = bcu_dequant_half(w, r0, nr, wh);
			if (e)
				return cuda_fail(cb, e, "weight dequantization");
			a = wh;
			lda = (int)w->cols;
		}
		cublasStatus_t s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n,
						(int)w->cols, &alpha, a, CUDA_R_16F, lda, xh, CUDA_R_16F,
						(int)w->cols, &beta, y + r0, CUDA_R_32F, (int)w->rows,
						CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (s != CUBLAS_STATUS_SUCCESS) {
			snprintf(cb->msg, sizeof(cb->msg), "cublasGemmEx (%lld x %lld x %lld): %s",
				 (long long)nr, (long long)n, (long long)w->cols, cublasGetStatusString(s));
			return s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
		}
	}
	return 0;
}

/* The prefill path of matmul(): n > BCU_MATVEC_MAX_N tokens. */
static int matmul_gemm(CudaBackend *cb, const MatmulWeight *const *ws, float *const *ys, int n_w,
		       const float *x, int64_t n)
{
	const int64_t cols = ws[0]->cols;
	size_t x_bytes, w_bytes = 0, need;
	if (n > INT_MAX || size_mul_overflows((size_t)n, (size_t)cols * 2, &x_bytes))
		return -EINVAL;
	x_bytes = (x_bytes + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;

	int64_t tile_rows = MAX((int64_t)(GEMM_W_TILE_BYTES / ((size_t)cols * 2)), 1);
	for (int i = 0; i < n_w; i++)
		if (ws[i]->type != WTYPE_F16)
			w_bytes = MAX(w_bytes, (size_t)MIN(tile_rows, ws[i]->rows) * (size_t)cols * 2);
	if (size_add_overflows(x_bytes, w_bytes, &need))
		return -EINVAL;
	int r = scratch_reserve(cb, &cb->scratch, &cb->scratch_bytes, need);
	if (r)
		return r;

	void *xh = cb->scratch, *wh = (uint8_t *)cb->scratch + x_bytes;
	int e = bcu_to_half(xh, x, n * cols);
	if (e)
		return cuda_fail(cb, e, "activation conversion");
	for (int i = 0; i < n_w; i++)
		if ((r = gemm_weight(cb, ws[i], xh, wh, tile_rows, ys[i], n)))
			return r;
	return 0;
}

static int cuda_matmul(Backend *b, ThreadPool *tp, const MatmulWeight *const *ws, float *const *ys,
		       int n_w, const float *x, int64_t n)
{
	CudaBackend *cb = cuda_of(b);
	assert(n_w >= 1 && n_w <= MATMUL_GROUP_MAX);
	if (n <= 0)
		return n < 0 ? -EINVAL : 0;
	for (int i = 0; i < n_w; i++) {
		size_t bytes;
		int r = weight_bytes(cb, ws[i], &bytes);
		if (r)
			return r;
		if (ws[i]->cols != ws[0]->cols)
			return -EINVAL;
	}
	if (n > BCU_MATVEC_MAX_N)
		return matmul_gemm(cb, ws, ys, n_w, x, n);
	for (int i = 0; i < n_w; i++) {
		int r = launched(cb, bcu_matvec(ws[i], x, ys[i], (int)n), "matvec");
		if (r)
			return r;
	}
	return 0;
}

static int cuda_add_bias(Backend *b, float *x, const float *bias, int64_t n, int64_t dim)
{
	if (n < 0 || dim < 1)
		return -EINVAL;
	return launched(cuda_of(b), bcu_add_bias(x, bias, n, dim), "add_bias");
}

/* On the host, by the CPU's own rope_angles() (double-precision phase), then uploaded. */
static int cuda_rope_angles(Backend *b, const Rope *rope, const int64_t *pos, int64_t n, float *cs,
			    float *sn)
{
	CudaBackend *cb = cuda_of(b);
	const int half = rope->n_rot / 2;
	size_t count;
	if (n <= 0)
		return n < 0 ? -EINVAL : 0;
	if (size_mul_overflows((size_t)n, (size_t)half * 2, &count))
		return -EINVAL;
	if (count > cb->angles_cap) {
		float *p = malloc_array(count, sizeof(float));
		if (!p)
			return -ENOMEM;
		free(cb->angles);
		cb->angles = p;
		cb->angles_cap = count;
	}
	float *hc = cb->angles, *hs = cb->angles + (size_t)n * half;
	for (int64_t i = 0; i < n; i++)
		rope_angles(rope, pos[i], hc + i * half, hs + i * half);
	/* the copies return once the staging buffer is read, so it may be reused next call */
	size_t bytes = (size_t)n * half * sizeof(float);
	cudaError_t e = cudaMemcpy(cs, hc, bytes, cudaMemcpyHostToDevice);
	if (e == cudaSuccess)
		e = cudaMemcpy(sn, hs, bytes, cudaMemcpyHostToDevice);
	return e == cudaSuccess ? 0 : cuda_fail(cb, e, "rope angles upload");
}

static int cuda_rope(Backend *b, const Rope *rope, float *x, int64_t n, int n_heads, int head_dim,
		     const float *cs, const float *sn)
{
	if (n < 0 || n_heads < 0 || rope->n_rot > head_dim || rope->n_rot % 2)
		return -EINVAL;
	return launched(cuda_of(b),
			bcu_rope(x, n, n_heads, head_dim, rope->n_rot, rope->style == ROPE_STYLE_NEOX, cs, sn),
			"rope");
}

static int cuda_swiglu(Backend *b, float *gate, const float *up, int64_t n)
{
	return launched(cuda_of(b), bcu_swiglu(gate, up, n), "swiglu");
}

static int cuda_geglu(Backend *b, float *gate, const float *up, int64_t n)
{
	return launched(cuda_of(b), bcu_geglu(gate, up, n), "geglu");
}

static int cuda_scale(Backend *b, float *x, float s, int64_t n)
{
	return launched(cuda_of(b), bcu_scale(x, s, n), "scale");
}

static int cuda_add(Backend *b, float *x, const float *y, int64_t n)
{
	return launched(cuda_of(b), bcu_add(x, y, n), "add");
}

/* ---- KV caches ---- */

static int cuda_kvcache_new_op(Backend *b, const KvCacheShape *shape, const KvPlan *plan, uint64_t seed,
			       KvCache **ret, Error *err)
{
	return cuda_kvcache_new(shape, plan, seed, ret, err);
}

static int cuda_kvcache_adopt_op(Backend *b, KvCache *host, KvCache **ret, Error *err)
{
	return cuda_kvcache_adopt(host, ret, err);
}

static const BackendOps cuda_ops = {
	.name = "cuda",
	.free = cuda_backend_free,
	.last_error = cuda_last_error,
	.alloc = cuda_alloc,
	.dealloc = cuda_dealloc,
	.upload = cuda_upload,
	.download = cuda_download,
	.upload_weight = cuda_upload_weight,
	.upload_vector = cuda_upload_vector,
	.embed = cuda_embed,
	.rmsnorm = cuda_rmsnorm,
	.matmul = cuda_matmul,
	.add_bias = cuda_add_bias,
	.rope_angles = cuda_rope_angles,
	.rope = cuda_rope,
	.swiglu = cuda_swiglu,
	.geglu = cuda_geglu,
	.scale = cuda_scale,
	.add = cuda_add,
	.kvcache_new = cuda_kvcache_new_op,
	.kvcache_adopt = cuda_kvcache_adopt_op,
};

int backend_cuda_new(Backend **ret, Error *err)
{
	/* Without a driver this fails (cudaErrorInsufficientDriver, cudaErrorNoDevice ...) rather than returning 0. */
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e == cudaErrorInsufficientDriver) /* also what a machine without the driver says */
		return error_set(err, -ENODEV, "no NVIDIA driver, or one too old for CUDA %d.%d",
				 CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
	if (e == cudaErrorNoDevice || (e == cudaSuccess && n < 1))
		return error_set(err, -ENODEV, "no CUDA GPU found");
	if (e != cudaSuccess)
		return error_set(err, -ENODEV, "no usable CUDA GPU: %s", cudaGetErrorString(e));
	/* create device 0's context now, so its failures show here and not in the first op */
	if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess) {
		(void)cudaGetLastError();
		return error_set(err, -ENODEV, "CUDA device 0: %s", cudaGetErrorString(e));
	}

	CudaBackend *cb = calloc(1, sizeof(*cb));
	if (!cb)
		return error_set(err, -ENOMEM, "out of memory");
	cb->base.ops = &cuda_ops;
	cublasStatus_t s = cublasCreate(&cb->blas);
	if (s != CUBLAS_STATUS_SUCCESS) {
		cb->blas = NULL;
		cuda_backend_free(&cb->base);
		return error_set(err, s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -ENODEV, "cuBLAS: %s",
				 cublasGetStatusString(s));
	}
	*ret = &cb->base;
	return 0;
}
