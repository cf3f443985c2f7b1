/*
 * kv_cuda_internal.h: what kv_cuda.cu (attention, memory) and
 * kv_cuda_append.cu (quantize-on-append, built without FMA contraction)
 * share: the CudaKv object and the plain-value view kernels receive.
 */
#pragma once

#include "kv_cuda.h"

/* Everything a kernel needs about the layer, passed by value. */
typedef struct KvcParams {
	int n_heads, n_kv_heads, dim, group; /* group: query heads per kv-head */
	int64_t capacity_blocks;
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
	float *scratch;         /* prepared queries and partials, grown as needed */
	size_t scratch_bytes;
};

/* Launch the append kernel (kv_cuda_append.cu). */
int kvc_launch_append(const KvcParams *p, int seq, int64_t pos0, int64_t n_tok, const float *k,
		      const float *v);
