/*
 * kv_cuda.h: the compressed KV cache of one layer in GPU memory, the
 * append kernel that quantizes into it, and attention computed on the
 * stored rows (decode and prefill), for every KV type of kvtype.h.
 *
 * Owns: device memory for the blocks and the codecs, the kernels
 * (kv_cuda.cu: attention, built with FMA contraction; kv_cuda_append.cu:
 * quantize-on-append, built with -fmad=false so that it writes exactly
 * the CPU's bytes), and the launch arithmetic. Not here: the codecs'
 * math (kernels/kv_kernel.h, shared with the CPU and unit-tested there),
 * building a CudaKv from a CPU cache (engine/backend/kv_cuda_host.h).
 *
 * == Memory ==
 *
 * Blocks have the CPU store's layout (engine/kv/kvstore.h): one block holds
 * 32 consecutive positions of one (sequence, kv-head), 32 K rows then 32
 * V rows, each row the bytes kvquant_store() / tq_encode() would write.
 * Blocks of (seq, head) are contiguous: block b of (seq, head) is at
 *   base + ((seq * n_kv_heads + head) * capacity_blocks + b) * block_bytes.
 * cuda_kv_blocks_read/_write move blocks to and from the host unchanged,
 * so a session saved from the GPU restores on the CPU and back.
 *
 * == Attention (flash-decoding) ==
 *
 * For every query row (sequence s, token t) the context is positions
 * 0 .. pos0[s] + t (causal). Three kernels:
 *   1. prepare: each query head rotated into the stored domain of its
 *      kv-head's keys (P q, and S P q with QJL; R q for +h) and scaled
 *      by 1 / sqrt(dim).
 *   2. split: grid (split, kv-head, row), 4 warps. The context is cut
 *      into splits of whole 32-token blocks; each warp takes every 4th
 *      block of its split. Lane j scores key j of the block for all G
 *      query heads of the kv-head at once (codes unpacked once, centroids
 *      from shared memory), an online softmax runs across the warp, then
 *      each lane accumulates dims lane, lane + 32, ... of the values in
 *      the stored domain. The warps' (max, sum, acc) are merged in shared
 *      memory into one partial per (split, head).
 *   3. combine: the partials of all splits merged, divided by the sum,
 *      and rotated back once per head (P^T acc for TQ, R acc for +h).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kv_kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_KV_MAX_SEQS 64 /* sequences of one CudaKv (batch) */
#define CUDA_KV_MAX_G 8     /* query heads per kv-head */
#define CUDA_KV_MAX_ROWS 65535 /* query rows of one attend call: a grid dimension */

typedef struct CudaKv CudaKv;

typedef struct CudaKvShape {
	int n_seqs;       /* 1 .. CUDA_KV_MAX_SEQS */
	int n_heads;      /* query heads */
	int n_kv_heads;   /* n_heads / n_kv_heads <= CUDA_KV_MAX_G */
	int dim;          /* head_dim: a multiple of 32, <= KVK_MAX_DIM */
	int64_t capacity; /* tokens per sequence */
	/*
	 * Sliding window W of the layer, 0: none. The query at q sees p
	 * with q - p < W (engine/kv/kvcache.h). Masked only: the device
	 * keeps every block of the capacity.
	 */
	int64_t window;
} CudaKvShape;

/* One side (K or V) of the layer. */
typedef struct CudaKvSide {
	int format;           /* KV_FORMAT_F32 .. KV_FORMAT_TQ */
	bool hadamard;        /* +h (block formats, not TQ) */
	const KvkCodec *tq;   /* TQ: (n_kv_heads,) codecs with host blobs; else NULL */
} CudaKvSide;

/* Devices visible (0 without a driver or a GPU). */
int cuda_device_count(void);

/*
 * Name, multiprocessors and theoretical peak memory bandwidth (GB/s,
 * from the memory clock and bus width) of device 0. Returns 0 or -ENODEV.
 */
int cuda_device_info(char *name, size_t name_size, int *ret_sms, double *ret_peak_gbs);

/*
 * Allocate the layer on device 0 (zeroed). Returns 0, -EINVAL (shape or
 * side out of range, with msg), -ENODEV or -ENOMEM (device memory: msg
 * says how much was asked). msg (msg_size bytes) may be NULL.
 */
int cuda_kv_new(const CudaKvShape *shape, const CudaKvSide *k, const CudaKvSide *v, CudaKv **ret,
		char *msg, size_t msg_size);
CudaKv *cuda_kv_free(CudaKv *kv);

/* Bytes of one stored row of the K / V side, of one block, and of all blocks. */
uint32_t cuda_kv_row_bytes(const CudaKv *kv, bool values);
size_t cuda_kv_block_bytes(const CudaKv *kv);
size_t cuda_kv_bytes(const CudaKv *kv);
/* Every byte of device memory kv holds: blocks, codecs, attention scratch. */
size_t cuda_kv_memory_bytes(const CudaKv *kv);

/*
 * Quantize and store n_tok tokens at positions pos0 .. of sequence seq:
 * k, v device pointers (n_tok, n_kv_heads * dim) floats. Asynchronous.
 * Returns 0, -EINVAL (out of the capacity) or -EIO (launch failed).
 */
int cuda_kv_append(CudaKv *kv, int seq, int64_t pos0, int64_t n_tok, const float *k,
		   const float *v);

/*
 * out (n_seqs, n_tok, n_heads * dim) = causal attention of q (same shape)
 * for sequences 0 .. n_seqs-1, token t of sequence s at position
 * pos0[s] + t (pos0 a host array; positions 0 .. pos0[s] + t must have
 * been appended). Device pointers; asynchronous. Returns 0, -EINVAL
 * (also for more than CUDA_KV_MAX_ROWS rows n_seqs * n_tok: callers
 * chunk prefill), -ENOMEM (scratch) or -EIO.
 */
int cuda_kv_attend(CudaKv *kv, const int64_t *pos0, int n_seqs, int64_t n_tok, const float *q,
		   float *out);

/* Force n blocks per split (0: choose by occupancy). Tests cover several splits with it. */
void cuda_kv_set_split(CudaKv *kv, int blocks_per_split);

/*
 * Copy blocks b0 .. b0+n-1 of (seq, head) to / from the host, len = n *
 * cuda_kv_block_bytes() (they are contiguous: one transfer). Synchronous.
 */
int cuda_kv_blocks_read(const CudaKv *kv, int seq, int head, int64_t b0, int64_t n, void *host,
			size_t len);
int cuda_kv_blocks_write(CudaKv *kv, int seq, int head, int64_t b0, int64_t n, const void *host,
			 size_t len);

/* Copy every block of sequence src over sequence dst on the device (benchmarks fill one sequence). */
int cuda_kv_copy_seq(CudaKv *kv, int dst, int src);

/* Plain device memory for inputs and outputs. */
void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
int cuda_upload(void *dst, const void *src, size_t bytes);
int cuda_download(void *dst, const void *src, size_t bytes);

/* Fill n floats at dst with N(0, sigma^2)-ish values from seed (device-side; benchmarks). */
int cuda_fill_random(float *dst, size_t n, uint64_t seed, float sigma);

/* Wait for the device; 0 or -EIO with the CUDA error in msg. */
int cuda_sync(char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif
