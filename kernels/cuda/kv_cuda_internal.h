/*
 * kv_cuda_internal.h: what the pieces of a CudaKv share. kv_cuda_layer.c
 * (plain C: checks, layout, scratch, the split rule) drives the kernels
 * through kvc_launch_append() (kv_cuda_append.cu, built without FMA
 * contraction) and kvc_launch_attend() (kv_cuda.cu), on the device
 * primitives below; tests/unit/kv_cuda_emul.c provides the same on the
 * host.
 */
#pragma once

#include "kernels/cuda/kv_cuda.h"

/* Everything a kernel needs about the layer, passed by value. */
typedef struct KvcParams {
	int n_heads, n_kv_heads, dim, group; /* group: query heads per kv-head */
	int64_t capacity_blocks;
	int64_t window;                      /* CudaKvShape.window: 0, or the layer's W */
	uint32_t block_bytes, kb, vb;        /* bytes per block, K row, V row */
	int kfmt, vfmt;
	bool khad, vhad;
	int qjl_m;                           /* K side QJL rows (0 without) */
	uint8_t *base;                       /* the blocks */
	const KvkCodec *kc, *vc;             /* (n_kv_heads,) device codecs, blobs on the device */
} KvcParams;

struct CudaKv {
	CudaKvShape shape;
	KvcParams p;
	int split_blocks;       /* forced blocks per split, 0 = automatic */
	int n_sms;
	KvkCodec *d_codecs;     /* (2, n_kv_heads): K then V */
	uint8_t *d_blobs;
	size_t blob_bytes;
	float *scratch;         /* prepared queries and partials, grown as needed */
	size_t scratch_bytes;
};

/* Warps per thread block of the split kernel; also the fewest blocks per split. */
#define KVC_WARPS 4

/* One attention call, checked and laid out by cuda_kv_attend(). */
typedef struct KvcAttend {
	const int64_t *pos0;         /* host: (n_seqs,) first position of each sequence's rows */
	int n_seqs;
	int64_t n_tok;
	int blocks_per_split, n_splits;
	const float *q;              /* (n_seqs * n_tok, n_heads, dim) */
	float *qp, *sq, *part;       /* scratch: prepared queries, sketches, partials */
	float *out;                  /* like q */
} KvcAttend;

#ifdef __cplusplus
extern "C" {
#endif

/* Device memory beyond kv_cuda.h's: zero it, copy within it. 0 or -EIO. */
int cuda_zero(void *dst, size_t bytes);
int cuda_copy(void *dst, const void *src, size_t bytes);

/* Launch the attention kernels: prepare, split, combine (kv_cuda.cu). 0 or -EIO. */
int kvc_launch_attend(const KvcParams *p, const KvcAttend *a);

/* Launch the append kernel (kv_cuda_append.cu). */
int kvc_launch_append(const KvcParams *p, int seq, int64_t pos0, int64_t n_tok, const float *k,
		      const float *v);

#ifdef __cplusplus
}
#endif
