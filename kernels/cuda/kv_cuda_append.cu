/*
 * kv_cuda_append.cu: quantize-on-append. One thread stores one (token,
 * kv-head, K or V) vector with kv_kernel.h's encoders, which repeat the
 * CPU's arithmetic operation for operation; this file is compiled with
 * -fmad=false (kernels/cuda/meson.build) so that nvcc does not fuse
 * those multiplies and adds, and the bytes equal the CPU's
 * (tests/gpu/test-gpu-kvattn.c checks every KV type).
 */
#include <errno.h>

#include "kernels/cuda/kv_cuda_internal.h"

__global__ void kvc_append_kernel(KvcParams p, int seq, int64_t pos0, int64_t n_tok,
				  const float *k, const float *v)
{
	int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= n_tok * p.n_kv_heads * 2)
		return;
	int role = (int)(idx & 1); /* 0 keys, 1 values */
	int head = (int)(idx / 2 % p.n_kv_heads);
	int64_t t = idx / 2 / p.n_kv_heads;
	int64_t pos = pos0 + t;

	const float *x = (role ? v : k) + (t * p.n_kv_heads + head) * p.dim;
	uint8_t *block = p.base + (((int64_t)seq * p.n_kv_heads + head) * p.capacity_blocks +
				   pos / KV_BLOCK_TOKENS) * p.block_bytes;
	int j = (int)(pos % KV_BLOCK_TOKENS);
	uint8_t *row = role ? block + KV_BLOCK_TOKENS * p.kb + (size_t)j * p.vb : block + (size_t)j * p.kb;
	int fmt = role ? p.vfmt : p.kfmt;
	if (fmt == KV_FORMAT_TQ)
		kvk_tq_encode(&(role ? p.vc : p.kc)[head], x, row);
	else
		kvk_plain_store(fmt, role ? p.vhad : p.khad, p.dim, x, row);
}

int kvc_launch_append(const KvcParams *p, int seq, int64_t pos0, int64_t n_tok, const float *k,
		      const float *v)
{
	int64_t n = n_tok * p->n_kv_heads * 2;
	if (n <= 0)
		return 0;
	const int threads = 64; /* the encoders keep a few KiB of locals per thread */
	kvc_append_kernel<<<(unsigned)((n + threads - 1) / threads), threads>>>(*p, seq, pos0, n_tok,
									     k, v);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}
