/*
 * kvstore.h: the compressed KV cache. Every KV type of kvtype.h (f32,
 * f16, q8_0, q4_0, +h, TurboQuant), per-layer K and V types from a
 * KvPlan, quantized on write, and attention computed directly on the
 * stored form (turboquant.md section 2): no dequantized K or V is ever
 * materialised.
 *
 * Owns: the block store, its memory accounting, the per (layer, kv-head,
 * K/V) TurboQuant codecs and their seeds, and the attention loop over
 * stored blocks. Not here: the quantizers (kvquant.h, tq.h), type names
 * and specs (kvtype.h), the per-block kernels (kernels/cpu/kv_attn.h:
 * scalar references and AVX2, chosen at run time), session files.
 *
 * == Blocks ==
 *
 * Each (layer, kv-head) keeps its tokens in blocks of KVSTORE_BLOCK_TOKENS
 * (32) consecutive positions: block i holds positions 32 i .. 32 i + 31.
 * One block is one allocation of kvstore_block_bytes() = 32 (kb + vb)
 * bytes, kb / vb = kvtype_vec_bytes() of the layer's K / V type:
 *
 *   offset       size     content
 *   0            32 kb    K rows, position order: kvquant_store() or
 *                         tq_encode() of the key (after RoPE)
 *   32 kb        32 vb    V rows, position order
 *
 * 32 is ggml's block size and keeps the V rows 32-byte aligned whatever
 * kb is; a tq4 block at head_dim 64 is 32 * 68 = 2176 bytes, a few blocks
 * fit L1 while the query heads of one kv-head stream through them. Blocks
 * are allocated (zeroed) on first write and never freed before the cache:
 * rewinding with kvcache_set_n_tokens() keeps them for reuse, so memory
 * grows by blocks up to the largest length ever stored. Rows at positions
 * >= the cache's n_tokens are unspecified.
 *
 * == Seeds of the TurboQuant codecs ==
 *
 * Each (layer l, kv-head h, role r) (r = 0 keys, 1 values) has its own
 * codec: the plan's TqDesc with rot_seed and (QJL only) qjl_seed replaced
 * by kvstore_derive_seeds(seed, l, h, r):
 *
 *   key   = l << 32 | h << 1 | r                          (uint64)
 *   state = seed ^ (0x6b7673746f726531 + key * 0x9e3779b97f4a7c15)
 *   rng_init(state) (rotation.h: four splitmix64 outputs), then
 *   rot_seed = rng_next(); qjl_seed = the next rng_next() that is not 0,
 *   rot_seed or tq_seed_mix(rot_seed).
 *
 * So the cache seed alone recovers every descriptor except the outlier
 * masks below; kvstore_tq_desc() returns the complete records to store
 * next to the blocks.
 *
 * == Outlier-channel types ("o", TQ_GROUP_OUTLIER_CHANNELS) ==
 *
 * The channel mask of (layer, kv-head, K/V) is chosen by
 * tq_desc_choose_outliers() over the rows of the first append to that
 * layer (the prompt's first batch) and kept from then on, rewinds
 * included. Until then kvstore_tq_desc() returns KVSTORE_E_NO_DESC.
 *
 * == Centered keys ("+c", kvtype.h) ==
 *
 * A +c key side keeps an f32 copy of the keys of block 0 (replaced
 * whenever those positions are appended again) and stores zero vectors in
 * their rows; it chooses mu from that copy when position 31 is appended
 * and keeps it, rewinds included. Rows of later positions store k - mu.
 * Attention scores block 0 from the copy, <q, k_p> in f32, and adds
 * <q, mu> / sqrt(d) to the kernel's scores of later blocks: every score is
 * in the frame of the exact keys, whether or not mu was chosen when the
 * query came, so a prompt split into appends differently gets the same
 * floats. kvstore_key_center() returns mu and the copy for session files.
 *
 * kvcache_append() on this cache returns 0, -ENOMEM, or -EINVAL when the
 * rows an outlier mask or a mu is chosen from are not finite.
 *
 * == Attention ==
 *
 * Per (token, kv-head): each of its query heads is prepared once
 * (kvquant_query_prepare / tq_query_prepare), scores come from the codes
 * (kv_attn scores: the sums of kvquant_score / tq_inner_product, the same
 * estimator as tq_decode() including QJL) scaled by 1 / sqrt(d), online
 * softmax per block, values accumulated in the stored domain (TQ:
 * sum_j p_j s_j c[idx_j] in the rotated domain), one inverse rotation per
 * head at the end (kvquant_output_finish / tq_output_finish). Keys are
 * read once per block for all query heads of their kv-head. Work is
 * split over (token, kv-head) and, when that gives the threads fewer
 * than two items each (decode: one per kv-head), over ranges of at least
 * 8 blocks whose partial (max, sum, accumulator) are combined afterwards
 * (flash-decoding), with the item count a multiple of the threads.
 * Scratch (prepared queries, scores) is allocated once per cache and
 * thread count, not per call.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "engine/codec/tq.h"
#include "engine/kv/kvcache.h"
#include "engine/kv/kvtype.h"

#define KVSTORE_BLOCK_TOKENS 32

/* Module error codes (positive; -errno for system errors). */
enum {
	KVSTORE_E_PLAN = 1, /* the plan does not fit the shape or holds a type the store cannot use */
	KVSTORE_E_NO_DESC,  /* not a TQ side, or its outlier mask is not chosen yet */
	KVSTORE_E_NOT_STORE, /* the KvCache is not a kvstore cache */
};

/*
 * A compressed cache for shape with the per-layer types of plan (copied;
 * plan may be freed afterwards) and codec seeds derived from seed.
 * Nothing is allocated for tokens until they are appended. Returns 0,
 * -EINVAL (bad shape), -ENOMEM, KVSTORE_E_PLAN or a tq.h code, with err
 * set. *ret written only on success.
 */
int kvcache_new_quant(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		      Error *err);

/* Whether kv was made by kvcache_new_quant(). */
bool kvstore_is(const KvCache *kv);

/* The seed given to kvcache_new_quant(). */
uint64_t kvstore_seed(const KvCache *kv);

/* The codec seeds of (layer, head, role) under cache seed (the derivation above). */
void kvstore_derive_seeds(uint64_t seed, int layer, int head, KvRole role, uint64_t *ret_rot_seed,
			  uint64_t *ret_qjl_seed);

/* The planned (K, V) types of layer (TQ descriptors with the plan's default seeds). */
const KvLayerTypes *kvstore_layer_types(const KvCache *kv, int layer);

/* Bytes of one block of layer: KVSTORE_BLOCK_TOKENS * (kb + vb). */
size_t kvstore_block_bytes(const KvCache *kv, int layer);

/* Blocks holding positions 0 .. kvcache_n_tokens() - 1: ceil(n_tokens / 32). */
int64_t kvstore_n_blocks(const KvCache *kv);

/*
 * Block index of (layer, head), kvstore_block_bytes() bytes laid out as
 * above; NULL if it was never allocated (index >= the blocks ever
 * written). Valid until the next append or kvstore_block_put().
 */
const uint8_t *kvstore_block(const KvCache *kv, int layer, int head, int64_t index);

/*
 * Overwrite block index of (layer, head) with len = kvstore_block_bytes()
 * bytes (session restore), allocating it if needed. Does not change
 * n_tokens. Returns 0, -EINVAL (index out of the capacity, wrong len) or
 * -ENOMEM.
 */
int kvstore_block_put(KvCache *kv, int layer, int head, int64_t index, const void *bytes,
		      size_t len);

/*
 * The complete descriptor (seeds, outlier mask) of the TQ codec of
 * (layer, head, role) into *ret. Returns 0 or KVSTORE_E_NO_DESC.
 */
int kvstore_tq_desc(const KvCache *kv, int layer, int head, KvRole role, TqDesc *ret);

/*
 * Session restore: install the stored descriptor of the TQ side (layer,
 * head, role). A side whose codec exists must have exactly this
 * descriptor (TQ_E_MISMATCH naming the field otherwise); an outlier side
 * whose mask is not chosen yet takes desc's mask, provided every other
 * field equals the planned type with this cache's derived seeds, and
 * builds its codec. Returns 0, KVSTORE_E_NO_DESC (not a TQ side),
 * TQ_E_MISMATCH, TQ_E_BAD_DESC or -ENOMEM, with err set.
 */
int kvstore_tq_desc_put(KvCache *kv, int layer, int head, KvRole role, const TqDesc *desc,
			Error *err);

/*
 * Choose the outlier masks of layer's sides that have none yet from k, v
 * (n_tok, n_kv_heads * head_dim), as the layer's first append does, and
 * build their codecs; nothing is stored. For a cache on another device
 * that appends the rows itself (engine/backend/kv_cuda_cache.c). Returns 0,
 * -ENOMEM or -EINVAL (rows not finite).
 */
int kvstore_choose_outliers(KvCache *kv, int layer, int64_t n_tok, const float *k,
			    const float *v);

/*
 * A +c key side (kvtype.h) of (layer, head): its mu into center
 * (head_dim floats), the exact keys of block 0 into first_keys
 * (KVSTORE_BLOCK_TOKENS * head_dim floats, positions not stored yet
 * unspecified), *ret_chosen false while mu is not chosen (center all zero
 * then). Returns 0 or KVSTORE_E_NO_DESC (not a +c key side).
 */
int kvstore_key_center(const KvCache *kv, int layer, int head, bool *ret_chosen, float *center,
		       float *first_keys);

/*
 * Session restore: install what kvstore_key_center() returned. Returns 0,
 * KVSTORE_E_NO_DESC (not a +c key side) or -EINVAL (a value not finite,
 * or a center that is not all zero while not chosen).
 */
int kvstore_key_center_put(KvCache *kv, int layer, int head, bool chosen, const float *center,
			   const float *first_keys);

/*
 * A pk key side (kvpk.h) of (layer, head) holding n_kv tokens: the query
 * energies of positions 0..31 into qe (32 * head_dim / 2 floats; needed
 * only while the weights are not chosen, which they are from n_kv >= 32
 * on), the pair weights into w (head_dim / 2; all zero while not chosen),
 * and the exact keys of the last coded block and the partial one after it
 * into tail (room for 64 * head_dim floats: positions from max(32, 32 *
 * (n_kv / 32 - 1)) to n_kv - 1, the rest zero; block 0 is
 * kvstore_key_center()'s). Returns 0, KVSTORE_E_NO_DESC (not a pk side),
 * or -EAGAIN (appended rows that no attention has read: a whole block not
 * coded, or no weights with 32 tokens or more).
 */
int kvstore_pk_state(const KvCache *kv, int layer, int head, int64_t n_kv, bool *ret_chosen,
		     float *qe, float *w, float *tail);

/*
 * Session restore, after the blocks: install what kvstore_pk_state()
 * returned for n_kv tokens; qe may be NULL from 32 tokens on, and tail
 * holds just the rows named there. Returns 0, KVSTORE_E_NO_DESC or
 * -EINVAL (a value not finite or negative, weights while not chosen, none
 * from 32 tokens on, no qe below, or a coded block whose bit widths do not
 * add up).
 */
int kvstore_pk_put(KvCache *kv, int layer, int head, int64_t n_kv, bool chosen, const float *qe,
		   const float *w, const float *tail);

/* Bytes of K/V blocks allocated now, all layers and heads (codecs and scratch excluded). */
size_t kvstore_bytes_allocated(const KvCache *kv);

/*
 * Flash-decoding split: 0 (default) chooses by thread count and context
 * length; n > 0 forces ranges of n blocks per work item (tests).
 */
void kvstore_set_split(KvCache *kv, int blocks_per_chunk);
