/*
 * kv_cuda.cu: the device primitives and the three attention kernels of a
 * CudaKv (kv_cuda.h describes the algorithm; kv_cuda_layer.c is the host
 * side that checks arguments and launches them). The per-row arithmetic
 * (unpacking, codebook lookups, rotations) is kernels/kv_kernel.h's; what
 * is here is the parallel structure: which thread reads what, the online
 * softmax across a warp and the merges.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kv_cuda_internal.h"

#define WARPS KVC_WARPS
#define FULL_MASK 0xffffffffu

/* Lane j of a warp scores key j of a block, and the softmax reduces over the warp. */
static_assert(KV_BLOCK_TOKENS == 32, "a block's keys are one warp's lanes");

/* ---- devices and plain memory ---- */

extern "C" int cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return n;
}

extern "C" int cuda_device_info(char *name, size_t name_size, int *ret_sms, double *ret_peak_gbs)
{
	if (cuda_device_count() < 1)
		return -ENODEV;
	if (name && name_size) {
		cudaDeviceProp prop;
		if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
			return -ENODEV;
		snprintf(name, name_size, "%s", prop.name);
	}
	int sms = 0, mem_khz = 0, bus_bits = 0;
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0);
	cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
	if (ret_sms)
		*ret_sms = sms;
	/* double data rate: two transfers per memory clock */
	if (ret_peak_gbs)
		*ret_peak_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
	return 0;
}

extern "C" void *cuda_alloc(size_t bytes)
{
	void *p = NULL;
	if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
		(void)cudaGetLastError();
		return NULL;
	}
	return p;
}

extern "C" void cuda_free(void *p)
{
	if (p)
		cudaFree(p);
}

extern "C" int cuda_upload(void *dst, const void *src, size_t bytes)
{
	return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -EIO;
}

extern "C" int cuda_download(void *dst, const void *src, size_t bytes)
{
	return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -EIO;
}

extern "C" int cuda_zero(void *dst, size_t bytes)
{
	return cudaMemset(dst, 0, bytes) == cudaSuccess ? 0 : -EIO;
}

extern "C" int cuda_copy(void *dst, const void *src, size_t bytes)
{
	return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess ? 0 : -EIO;
}

extern "C" int cuda_sync(char *msg, size_t msg_size)
{
	cudaError_t e = cudaDeviceSynchronize();
	if (e == cudaSuccess)
		e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	if (msg && msg_size)
		snprintf(msg, msg_size, "CUDA: %s", cudaGetErrorString(e));
	return -EIO;
}

/* splitmix64 of (seed, i), two of them through Box-Muller: normal-ish test data. */
__global__ void fill_random_kernel(float *dst, size_t n, uint64_t seed, float sigma)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
	uint64_t r[2];
	for (int k = 0; k < 2; k++) {
		z += 0x9e3779b97f4a7c15ull;
		uint64_t x = z;
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
		x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
		r[k] = x ^ (x >> 31);
	}
	float u1 = ((float)(r[0] >> 40) + 1.0f) * (1.0f / 16777216.0f);
	float u2 = (float)(r[1] >> 40) * (1.0f / 16777216.0f);
	dst[i] = sigma * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

extern "C" int cuda_fill_random(float *dst, size_t n, uint64_t seed, float sigma)
{
	if (!n)
		return 0;
	fill_random_kernel<<<(unsigned)((n + 255) / 256), 256>>>(dst, n, seed, sigma);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}

/* ---- attention ---- */

/* Positions per sequence of one attend call, by value. */
typedef struct KvcRows {
	int64_t pos0[CUDA_KV_MAX_SEQS];
	int n_seqs;
	int64_t n_tok;
} KvcRows;

static __device__ __forceinline__ int64_t row_ctx(const KvcRows &r, int64_t row)
{
	return r.pos0[row / r.n_tok] + row % r.n_tok + 1;
}

/* The first position a row of context ctx sees: ctx - W in a windowed layer (q - p < W), else 0. */
static __device__ __forceinline__ int64_t row_lo(const KvcParams &p, int64_t ctx)
{
	return p.window > 0 && ctx > p.window ? ctx - p.window : 0;
}

/*
 * 1. prepare: one thread per (row, query head). qp (rows, n_heads, dim)
 * = the query in the keys' stored domain times 1/sqrt(dim); sq (rows,
 * n_heads, qjl_m) = S P q times the same.
 */
__global__ void kvc_prepare_kernel(KvcParams p, int64_t n_rows, const float *q, float *qp, float *sq)
{
	int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= n_rows * p.n_heads)
		return;
	int head = (int)(idx % p.n_heads);
	const float *qi = q + idx * p.dim;
	float *qo = qp + idx * p.dim;
	float *so = sq + idx * (p.qjl_m ? p.qjl_m : 1);
	const float scale = rsqrtf((float)p.dim);
	if (p.kfmt == KV_FORMAT_TQ) {
		kvk_tq_query_prepare(&p.kc[head / p.group], qi, qo, so);
		for (int i = 0; i < p.qjl_m; i++)
			so[i] *= scale;
	} else {
		for (int i = 0; i < p.dim; i++)
			qo[i] = qi[i];
		if (p.khad)
			kvk_hadamard(qo, p.dim);
	}
	for (int i = 0; i < p.dim; i++)
		qo[i] *= scale;
}

/*
 * MG (template): the register arrays' size, G <= MG query heads per
 * kv-head; 4 for the common GQA shapes, 8 otherwise (registers: an 8-head
 * kernel needs about half again as many, which costs occupancy).
 */

/* s[g] = <qs[g], key> for the G query heads, a TQ key: kv_kernel.h's, codes unpacked once. */
template <int MG>
static __device__ __forceinline__ void score_tq(const KvkCodec &c, const float *cbh,
						const float *cbl, const float *qs, const float *sqs,
						int G, const uint8_t *code, float s[MG])
{
	if constexpr (MG == 4)
		kvk_tq_score_heads_4(&c, cbh, cbl, qs, sqs, G, code, s);
	else
		kvk_tq_score_heads_8(&c, cbh, cbl, qs, sqs, G, code, s);
}

/* s[g] = <qs[g], key> for a plain-format key row. */
template <int FMT, int MG>
static __device__ __forceinline__ void score_plain(const float *qs, int dim, int G,
						   const uint8_t *row, float s[MG])
{
#pragma unroll
	for (int g = 0; g < MG; g++)
		s[g] = 0.0f;
	if constexpr (FMT == KV_FORMAT_F16) {
		/* 16-byte loads: rows are 2 * dim bytes, dim a multiple of 32 */
		const uint4 *r4 = (const uint4 *)row;
		for (int c = 0; c < dim / 8; c++) {
			uint4 w = r4[c];
			uint32_t u[4] = { w.x, w.y, w.z, w.w };
#pragma unroll
			for (int k = 0; k < 8; k++) {
				float v = half_to_f32((tkv_half)(u[k / 2] >> (16 * (k % 2))));
#pragma unroll
				for (int g = 0; g < MG; g++)
					if (g < G)
						s[g] += qs[g * dim + 8 * c + k] * v;
			}
		}
	} else {
		for (int i = 0; i < dim; i++) {
			float v = kvk_plain_value(FMT, row, i);
#pragma unroll
			for (int g = 0; g < MG; g++)
				if (g < G)
					s[g] += qs[g * dim + i] * v;
		}
	}
}

static __device__ __forceinline__ float value_at(const KvcParams &p, const KvkCodec &vc,
						 const uint8_t *row, int i)
{
	switch (p.vfmt) {
	case KV_FORMAT_TQ:
		return kvk_tq_value(&vc, row, i);
	case KV_FORMAT_F16:
		return kvk_load_f16(row + 2 * i);
	default:
		return kvk_plain_value(p.vfmt, row, i);
	}
}

/*
 * 2. split: grid (split, kv-head, row), WARPS warps; DPL = dim / 32 value
 * dims per lane. part (rows, n_heads, n_splits, dim + 2): (max, sum, acc).
 */
template <int DPL, int MG>
__global__ void __launch_bounds__(WARPS * 32)
kvc_split_kernel(KvcParams p, KvcRows rows, int blocks_per_split, int n_splits, const float *qp,
		 const float *sq, float *part)
{
	extern __shared__ float sh[];
	const int split = blockIdx.x, kvh = blockIdx.y;
	const int64_t row = blockIdx.z;
	const int G = p.group, dim = p.dim, m = p.qjl_m;
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const KvkCodec &kc = p.kc[kvh];
	const KvkCodec &vc = p.vc[kvh];

	/* shared: queries (G, dim), sketches (G, m), K centroids hi / lo (256 each) */
	float *qs = sh, *sqs = qs + G * dim, *cbh = sqs + G * m, *cbl = cbh + 256;
	const float *qsrc = qp + (row * p.n_heads + kvh * G) * dim;
	for (int i = tid; i < G * dim; i += blockDim.x)
		qs[i] = qsrc[i];
	if (m) {
		const float *ssrc = sq + (row * p.n_heads + kvh * G) * m;
		for (int i = tid; i < G * m; i += blockDim.x)
			sqs[i] = ssrc[i];
	}
	if (p.kfmt == KV_FORMAT_TQ) {
		for (int i = tid; i < kc.levels_hi; i += blockDim.x)
			cbh[i] = kvk_floats(&kc, kc.cb_hi)[i];
		for (int i = tid; i < kc.levels_lo; i += blockDim.x)
			cbl[i] = kvk_floats(&kc, kc.cb_lo)[i];
	}
	__syncthreads();

	const int64_t ctx = row_ctx(rows, row), lo = row_lo(p, ctx);
	const int64_t n_blk = (ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	const int64_t b0 = (int64_t)split * blocks_per_split;
	const int64_t b1 = min(b0 + blocks_per_split, n_blk);
	const int64_t lo_blk = lo / KV_BLOCK_TOKENS; /* blocks below it are outside the window */
	const int seq = (int)(row / rows.n_tok);
	const uint8_t *head_base =
		p.base + ((int64_t)seq * p.n_kv_heads + kvh) * p.capacity_blocks * p.block_bytes;

	float mx[MG], l[MG], acc[MG][DPL];
#pragma unroll
	for (int g = 0; g < MG; g++) {
		mx[g] = -INFINITY;
		l[g] = 0.0f;
#pragma unroll
		for (int c = 0; c < DPL; c++)
			acc[g][c] = 0.0f;
	}

	for (int64_t b = b0 + warp; b < b1; b += WARPS) {
		if (b < lo_blk)
			continue; /* warp-uniform */
		const uint8_t *blk = head_base + b * p.block_bytes;
		const int n_valid = (int)min((int64_t)KV_BLOCK_TOKENS, ctx - b * KV_BLOCK_TOKENS);
		/* the window's edge may cut this block: lanes below lo are masked (lo's lane is not) */
		const bool valid = lane < n_valid && b * KV_BLOCK_TOKENS + lane >= lo;
		float s[MG];
		if (valid) {
			const uint8_t *key = blk + (size_t)lane * p.kb;
			switch (p.kfmt) {
			case KV_FORMAT_TQ:
				score_tq<MG>(kc, cbh, cbl, qs, sqs, G, key, s);
				break;
			case KV_FORMAT_F16:
				score_plain<KV_FORMAT_F16, MG>(qs, dim, G, key, s);
				break;
			case KV_FORMAT_F32:
				score_plain<KV_FORMAT_F32, MG>(qs, dim, G, key, s);
				break;
			case KV_FORMAT_Q8_0:
				score_plain<KV_FORMAT_Q8_0, MG>(qs, dim, G, key, s);
				break;
			default:
				score_plain<KV_FORMAT_Q4_0, MG>(qs, dim, G, key, s);
				break;
			}
		} else {
#pragma unroll
			for (int g = 0; g < MG; g++)
				s[g] = -INFINITY;
		}

		/* online softmax across the warp, per head */
		float pr[MG];
#pragma unroll
		for (int g = 0; g < MG; g++) {
			if (g >= G)
				break;
			float bm = s[g];
			for (int o = 16; o > 0; o /= 2)
				bm = fmaxf(bm, __shfl_xor_sync(FULL_MASK, bm, o));
			float nm = fmaxf(mx[g], bm); /* finite: some lane is valid */
			pr[g] = valid ? __expf(s[g] - nm) : 0.0f;
			float sum = pr[g];
			for (int o = 16; o > 0; o /= 2)
				sum += __shfl_xor_sync(FULL_MASK, sum, o);
			float corr = mx[g] == -INFINITY ? 0.0f : __expf(mx[g] - nm);
			l[g] = l[g] * corr + sum;
			mx[g] = nm;
#pragma unroll
			for (int c = 0; c < DPL; c++)
				acc[g][c] *= corr;
		}

		/* values: lane owns dims lane + 32 c */
		const uint8_t *vrows = blk + KV_BLOCK_TOKENS * (size_t)p.kb;
		for (int j = 0; j < n_valid; j++) {
			const uint8_t *vr = vrows + (size_t)j * p.vb;
			float val[DPL];
#pragma unroll
			for (int c = 0; c < DPL; c++)
				val[c] = value_at(p, vc, vr, lane + 32 * c);
#pragma unroll
			for (int g = 0; g < MG; g++) {
				if (g >= G)
					break;
				float pj = __shfl_sync(FULL_MASK, pr[g], j);
#pragma unroll
				for (int c = 0; c < DPL; c++)
					acc[g][c] += pj * val[c];
			}
		}
	}

	/* merge the warps: shared (WARPS, G, dim + 2), reusing the query area */
	__syncthreads();
	const int stride = dim + 2;
#pragma unroll
	for (int g = 0; g < MG; g++) {
		if (g >= G)
			break;
		float *w = sh + (warp * G + g) * stride;
		if (lane == 0) {
			w[0] = mx[g];
			w[1] = l[g];
		}
#pragma unroll
		for (int c = 0; c < DPL; c++)
			w[2 + lane + 32 * c] = acc[g][c];
	}
	__syncthreads();
	for (int k = tid; k < G * dim; k += blockDim.x) {
		int g = k / dim, i = k % dim;
		float M = -INFINITY;
		for (int w = 0; w < WARPS; w++)
			M = fmaxf(M, sh[(w * G + g) * stride]);
		float L = 0.0f, A = 0.0f;
		if (M != -INFINITY)
			for (int w = 0; w < WARPS; w++) {
				const float *src = sh + (w * G + g) * stride;
				if (src[0] == -INFINITY)
					continue;
				float e = __expf(src[0] - M);
				L += src[1] * e;
				A += src[2 + i] * e;
			}
		float *dst = part + ((row * p.n_heads + kvh * G + g) * n_splits + split) * stride;
		if (i == 0) {
			dst[0] = M;
			dst[1] = L;
		}
		dst[2 + i] = A;
	}
}

/*
 * 3. combine: one block of dim threads per (row, head): merge the splits,
 * normalise, rotate back.
 */
__global__ void kvc_combine_kernel(KvcParams p, KvcRows rows, int blocks_per_split, int n_splits,
				   const float *part, float *out)
{
	extern __shared__ float sh[];
	float *a = sh, *o = sh + p.dim;
	const int64_t rh = blockIdx.x; /* row * n_heads + head */
	const int head = (int)(rh % p.n_heads);
	const int64_t row = rh / p.n_heads;
	const int i = threadIdx.x, stride = p.dim + 2;
	/* splits past the row's context were not written */
	const int64_t n_blk = (row_ctx(rows, row) + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	const int used = (int)min((int64_t)n_splits, (n_blk + blocks_per_split - 1) / blocks_per_split);
	const float *src = part + rh * n_splits * stride;

	float M = -INFINITY;
	for (int s = 0; s < used; s++)
		M = fmaxf(M, src[s * stride]);
	float L = 0.0f, A = 0.0f;
	for (int s = 0; s < used; s++) {
		const float *ps = src + s * stride;
		if (ps[0] == -INFINITY)
			continue;
		float e = __expf(ps[0] - M);
		L += ps[1] * e;
		A += ps[2 + i] * e;
	}
	a[i] = L > 0.0f ? A / L : 0.0f;
	__syncthreads();
	if (i == 0) {
		if (p.vfmt == KV_FORMAT_TQ) {
			kvk_tq_output_finish(&p.vc[head / p.group], a, o);
		} else {
			for (int k = 0; k < p.dim; k++)
				o[k] = a[k];
			if (p.vhad)
				kvk_hadamard(o, p.dim);
		}
	}
	__syncthreads();
	out[rh * p.dim + i] = o[i];
}

template <int DPL, int MG>
static void launch_split(const KvcParams &p, const KvcRows &rows, int64_t n_rows, int bps,
			 int n_splits, const float *qp, const float *sq, float *part)
{
	size_t prep = (size_t)p.group * (p.dim + p.qjl_m) + 512;
	size_t merge = (size_t)WARPS * p.group * (p.dim + 2);
	size_t shmem = (prep > merge ? prep : merge) * sizeof(float);
	dim3 grid((unsigned)n_splits, (unsigned)p.n_kv_heads, (unsigned)n_rows);
	kvc_split_kernel<DPL, MG><<<grid, WARPS * 32, shmem>>>(p, rows, bps, n_splits, qp, sq, part);
}

/* The split kernel for this head_dim and group (head_dim 64 and 128 have a 4-head variant). */
static void launch_split_for(const KvcParams &p, const KvcRows &rows, int64_t n_rows, int bps,
			     int n_splits, const float *qp, const float *sq, float *part)
{
	bool small = p.group <= 4;
	switch (p.dim / 32) {
	case 1: launch_split<1, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part); break;
	case 2:
		if (small)
			launch_split<2, 4>(p, rows, n_rows, bps, n_splits, qp, sq, part);
		else
			launch_split<2, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part);
		break;
	case 3: launch_split<3, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part); break;
	case 4:
		if (small)
			launch_split<4, 4>(p, rows, n_rows, bps, n_splits, qp, sq, part);
		else
			launch_split<4, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part);
		break;
	case 5: launch_split<5, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part); break;
	case 6: launch_split<6, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part); break;
	case 7: launch_split<7, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part); break;
	default: launch_split<8, 8>(p, rows, n_rows, bps, n_splits, qp, sq, part); break;
	}
}

extern "C" int kvc_launch_attend(const KvcParams *pp, const KvcAttend *a)
{
	const KvcParams &p = *pp;
	KvcRows rows;
	memset(&rows, 0, sizeof(rows));
	rows.n_seqs = a->n_seqs;
	rows.n_tok = a->n_tok;
	for (int s = 0; s < a->n_seqs; s++)
		rows.pos0[s] = a->pos0[s];
	const int64_t n_rows = (int64_t)a->n_seqs * a->n_tok;
	const int64_t n_prep = n_rows * p.n_heads;
	kvc_prepare_kernel<<<(unsigned)((n_prep + 63) / 64), 64>>>(p, n_rows, a->q, a->qp, a->sq);
	launch_split_for(p, rows, n_rows, a->blocks_per_split, a->n_splits, a->qp, a->sq, a->part);
	kvc_combine_kernel<<<(unsigned)n_prep, p.dim, 2 * p.dim * sizeof(float)>>>(
		p, rows, a->blocks_per_split, a->n_splits, a->part, a->out);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}
