/*
 * kv_format.h: what every KV store and every backend's attention kernels
 * agree on: the block of consecutive positions a store is made of, and
 * the numbers of the row formats (one head vector of one token, K or V).
 *
 * Owns: KV_BLOCK_TOKENS and KvFormat. Not here: what a format stores and
 * how it attends (engine/kv/kvformat.h: one implementation per format),
 * type names and specs (engine/kv/kvtype.h).
 *
 * == Block ==
 *
 * A store keeps each (layer, kv-head)'s positions in blocks of
 * KV_BLOCK_TOKENS: block i holds positions 32 i .. 32 i + 31, its K rows
 * then its V rows. 32 is ggml's block size, one key per lane of a CUDA
 * warp, and a whole number of 64-bit words of 1..8-bit codes (pk columns);
 * code that relies on one of these says so with a static_assert.
 *
 * == Formats ==
 *
 * The numbers are part of the GPU's codec blobs (kernels/kv_kernel.h) and
 * of nothing on disk (session records carry their own tags).
 */
#pragma once

#define KV_BLOCK_TOKENS 32

typedef enum KvFormat {
	KV_FORMAT_F32 = 0,  /* 4 d bytes */
	KV_FORMAT_F16 = 1,  /* 2 d bytes, IEEE binary16 */
	KV_FORMAT_Q8_0 = 2, /* d / 32 ggml block_q8_0 */
	KV_FORMAT_Q4_0 = 3, /* d / 32 ggml block_q4_0 */
	KV_FORMAT_TQ = 4,   /* a TurboQuant code record (kernels/tq_layout.h) */
	KV_FORMAT_PK = 5,   /* pair-coded keys: per-block columns (kernels/kv_pk_layout.h) */
	KV_FORMAT_PQ = 6,   /* a PolarQuant row (kernels/kv_pq_layout.h) */
} KvFormat;

#define KV_FORMAT_COUNT (KV_FORMAT_PQ + 1)
