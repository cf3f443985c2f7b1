/*
 * kvstore.h: the compressed KV cache. Per-layer K and V types from a
 * KvPlan, each side (K or V of one (layer, kv-head)) kept by its KV format
 * (kvformat.h: plain, TurboQuant, centered, pair-coded), quantized on
 * write, and attention computed on the stored form (turboquant.md section
 * 2): no dequantized K or V is ever materialised.
 *
 * Owns: the blocks, the attention loop over them (online softmax,
 * flash-decoding split, the combine), memory accounting, and the session
 * file operations (kvcache.h's KvCacheFileOps) that hand each format its
 * own record. Not here: anything a format knows (kvformat.h and its
 * fmt_*.c), type names and specs (kvtype.h), the kernels
 * (kernels/cpu/kv_attn.h), session files (engine/session/session.h).
 *
 * == Blocks ==
 *
 * Each (layer, kv-head) keeps its tokens in blocks of KV_BLOCK_TOKENS
 * (32) consecutive positions (kernels/kv_format.h): block i holds
 * positions 32 i .. 32 i + 31. One block is one allocation of
 * kvstore_block_bytes() = 32 (kb + vb) bytes, kb / vb = kvtype_vec_bytes()
 * of the layer's K / V type:
 *
 *   offset       size     content
 *   0            32 kb    K rows, position order, as the K format stores them
 *   32 kb        32 vb    V rows, position order
 *
 * 32 keeps the V rows 32-byte aligned whatever kb is; a tq4 block at
 * head_dim 64 is 32 * 68 = 2176 bytes, a few blocks fit L1 while the query
 * heads of one kv-head stream through them. Blocks are allocated (zeroed)
 * when an append first reaches them; rewinding with kvcache_set_n_tokens()
 * keeps them for reuse, so a global layer's memory grows by blocks up to
 * the largest length ever stored. Rows at positions >= the cache's
 * n_tokens are unspecified.
 *
 * == Windowed layers ==
 *
 * A sliding-window layer (kvcache.h: the query at q sees p > q - W) frees
 * its blocks once no query can see them: an append at pos0 drops the
 * blocks below the one holding pos0 - W + 1, and kvcache_set_n_tokens()
 * growing to n drops those below the block of n - W + 1
 * (kvcache_window_first_block()). Between batches such a layer holds at
 * most ceil(W / 32) + 1 blocks per kv-head, during a batch of B tokens at
 * most ceil((W + B - 1) / 32) + 1. Attention starts at the block of each
 * token's first visible position and gives the rows below it inside that
 * block weight exactly 0. A cache that dropped blocks cannot be rewound
 * below kvcache_rewind_floor() (to 0 it always can: the caller
 * recomputes), and its session files hold each windowed layer's blocks
 * from kvcache_window_first_block() of the saved length on.
 *
 * == Attention ==
 *
 * Per (tile of up to 16 tokens, kv-head): the key format prepares the
 * query heads once and scores each block's rows for all of them (keys are
 * read once per block for every head of the tile: G heads per token for
 * the diagonal blocks a token only partly sees, G x 16 for the whole
 * blocks below), scaled by 1 / sqrt(d); online softmax per block; the
 * value format accumulates in its stored domain and finishes once per
 * head (an inverse rotation for TQ and +h). Work is split over (tile,
 * kv-head) and, when that gives the threads fewer than two items each
 * (decode: one per kv-head), over ranges of at least 8 blocks whose
 * partial (max, sum, accumulator) are combined afterwards
 * (flash-decoding), with the item count a multiple of the threads.
 * Scratch (prepared queries, scores, partials) is kept by the cache and
 * counted in kvcache_memory_bytes(); attention only reads the rows and
 * fails with -ENOMEM, never aborts, when scratch cannot grow.
 *
 * kvcache_append() on this cache returns 0, -ENOMEM, or -EINVAL when the
 * rows a format chooses from (an outlier mask, a mean key) are not finite.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "engine/kv/kvcache.h"
#include "engine/kv/kvformat.h"
#include "engine/kv/kvtype.h"

/* Module error codes (positive; -errno for system errors). */
enum {
	KVSTORE_E_PLAN = 1,  /* the plan does not fit the shape or holds a type the store cannot keep */
	KVSTORE_E_NOT_STORE, /* the KvCache is not a kvstore cache */
};

/*
 * A compressed cache for shape with the per-layer types of plan (copied;
 * plan may be freed afterwards) and codec seeds derived from seed.
 * Nothing is allocated for tokens until they are appended. Returns 0,
 * -EINVAL (bad shape), -ENOMEM, KVSTORE_E_PLAN or a codec's code, with
 * err set. *ret written only on success.
 */
int kvcache_new_quant(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		      Error *err);

/*
 * The host cache for plan, the one meaning of "f32" everywhere: the exact
 * f32 cache (kvcache_new_f32, the reference attention) when plan is NULL
 * or holds f32 without +h in every layer (kvplan_is_f32), else the
 * compressed store. Same returns as kvcache_new_quant().
 */
int kvcache_new_host(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		     Error *err);

/* Whether kv was made by kvcache_new_quant(). */
bool kvstore_is(const KvCache *kv);

/* The seed given to kvcache_new_quant(). */
uint64_t kvstore_seed(const KvCache *kv);

/* The planned (K, V) types of layer. */
const KvLayerTypes *kvstore_layer_types(const KvCache *kv, int layer);

/* Bytes of one block of layer: KV_BLOCK_TOKENS * (kb + vb). */
size_t kvstore_block_bytes(const KvCache *kv, int layer);

/* Blocks holding positions 0 .. kvcache_n_tokens() - 1: ceil(n_tokens / 32). */
int64_t kvstore_n_blocks(const KvCache *kv);

/*
 * Block index of (layer, head), kvstore_block_bytes() bytes laid out as
 * above; NULL if it was never allocated. Valid until the next append or
 * kvstore_block_put().
 */
const uint8_t *kvstore_block(const KvCache *kv, int layer, int head, int64_t index);

/*
 * Overwrite block index of (layer, head) with len = kvstore_block_bytes()
 * bytes (session restore, a GPU cache's download), allocating it if
 * needed. Does not change n_tokens. Returns 0, -EINVAL (index out of the
 * capacity, wrong len) or -ENOMEM.
 */
int kvstore_block_put(KvCache *kv, int layer, int head, int64_t index, const void *bytes,
		      size_t len);

/*
 * The format and state of the side (layer, head, role), for a format's
 * own accessors (fmt_tq.h); NULL (and *ret_ops NULL) if kv is not a store.
 */
const void *kvstore_side(const KvCache *kv, int layer, int head, KvRole role,
			 const KvFormatOps **ret_ops);

/*
 * The stored row of position pos (< the positions appended) of (layer,
 * head, role) read back into ret (head_dim) in the original domain, as
 * attention from a later block reads it (tests, kvstats).
 */
void kvstore_load_row(const KvCache *kv, int layer, int head, KvRole role, int64_t pos,
		      float *ret);

/*
 * Let layer's formats fix what they choose from a layer's first rows (TQ
 * outlier masks) from k, v (n_tok, n_kv_heads * head_dim), storing
 * nothing. For a cache on another device that appends the rows itself
 * (engine/backend/kv_cuda_cache.c). Returns 0, -ENOMEM or -EINVAL (rows
 * not finite).
 */
int kvstore_fix(KvCache *kv, int layer, int64_t n_tok, const float *k, const float *v);

/* Bytes of K/V blocks allocated now, all layers and heads (kvcache_memory_bytes() counts the rest). */
size_t kvstore_bytes_allocated(const KvCache *kv);

/*
 * Flash-decoding split: 0 (default) chooses by thread count and context
 * length; n > 0 forces ranges of n blocks per work item (tests).
 */
void kvstore_set_split(KvCache *kv, int blocks_per_chunk);

/*
 * Prefill tiles: 0 (default) reads each whole block once for 16 tokens'
 * query heads (fewer where a group would pass KVPK_MAX_GROUP heads); n > 0
 * forces tiles of n tokens (tests: 1 is a token at a time).
 */
void kvstore_set_tile(KvCache *kv, int tokens);

/*
 * Tests: keep every block of the windowed layers (attention still masks
 * the window): the full-cache reference a dropping store must match bit
 * for bit.
 */
void kvstore_set_keep_all(KvCache *kv, bool keep);

/* Blocks of (layer, head) allocated now (tests: a windowed layer's bound). */
int64_t kvstore_blocks_held(const KvCache *kv, int layer, int head);
