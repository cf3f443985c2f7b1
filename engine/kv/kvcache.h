/*
 * kvcache.h: the attention memory of one sequence, behind a small interface.
 *
 * The model hands each layer's new keys (after RoPE) and values to the
 * cache and asks it for attention outputs; it never reads K or V itself.
 * That is what lets a compressed cache compute attention directly on its
 * codes (turboquant.md section 2) without touching model code: an
 * implementation is a KvCacheOps table.
 *
 * Shapes: per token, K and V are (n_kv_heads, head_dim) rows; queries
 * are (n_heads, head_dim); query head h reads kv-head h / (n_heads /
 * n_kv_heads) (grouped-query attention). Attention is causal: query t of
 * a batch starting at position pos0 sees positions 0 .. pos0 + t.
 *
 * Per layer of a batch the model calls observe() (the batch's queries),
 * append() (its keys and values), then attend(). What a cache stores
 * depends on those rows only: attention reads, it never writes.
 *
 * Sliding-window layers (Gemma 3's local layers, KvCacheShape.window):
 * the query at position q sees only the keys at positions p with
 * q - p < window, i.e. p = q - window + 1 .. q (llama.cpp's
 * LLAMA_SWA_TYPE_STANDARD: masked iff q - p >= n_swa). A cache may drop
 * what no later query of such a layer can see (the compressed store frees
 * whole blocks: kvcache_window_first_block()); it can then no longer be
 * rewound below kvcache_rewind_floor().
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/kv_format.h"

enum {
	KVCACHE_E_FULL = 1,   /* appending would exceed the capacity */
	KVCACHE_E_POSITION,   /* append not at the end of the cache */
	KVCACHE_E_OTHER_TYPE, /* a saved record of another KV type (recompute; nothing is damaged) */
	KVCACHE_E_CORRUPT,    /* a saved record or block that cannot be what was saved */
};

typedef struct KvCacheShape {
	int n_layers;
	int n_heads;
	int n_kv_heads;
	int head_dim;
	int64_t capacity; /* tokens */
	/*
	 * Sliding window W of the windowed layers, 0: none. Layer l is
	 * windowed when window > 0 and either window_period == 0 (every
	 * layer) or l % window_period != window_period - 1 (Gemma 3: period
	 * 6, five local layers then one global).
	 */
	int window;
	int window_period;
	/*
	 * The RoPE that turned the keys of the global layers (rope) and of
	 * the windowed ones (rope_local), as the model applied it; n_rot 0:
	 * not known (a format that follows it, pk's centering, then takes
	 * the keys as unturned).
	 */
	Rope rope, rope_local;
} KvCacheShape;

/* W of layer l of shape s, or 0 for a layer that sees every position. */
static inline int64_t kvcache_layer_window(const KvCacheShape *s, int l)
{
	if (s->window <= 0 || (s->window_period > 0 && l % s->window_period == s->window_period - 1))
		return 0;
	return s->window;
}

/* The RoPE of layer l's keys, NULL where none is known. */
static inline const Rope *kvcache_layer_rope(const KvCacheShape *s, int l)
{
	const Rope *r = kvcache_layer_window(s, l) > 0 ? &s->rope_local : &s->rope;
	return r->n_rot > 0 ? r : NULL;
}

/* The first position the query at q sees in layer l: q - W + 1 (at least 0), 0 for a global layer. */
static inline int64_t kvcache_first_visible(const KvCacheShape *s, int l, int64_t q)
{
	int64_t w = kvcache_layer_window(s, l);
	return w > 0 && q - w + 1 > 0 ? q - w + 1 : 0;
}

/*
 * The first block (KV_BLOCK_TOKENS = 32 positions) any
 * query at position >= n of layer l can see: what a windowed layer of a
 * cache holding n tokens must keep from (0 for a global layer). Session
 * files hold a layer's blocks from here on.
 */
static inline int64_t kvcache_window_first_block(const KvCacheShape *s, int l, int64_t n)
{
	return kvcache_first_visible(s, l, n) / KV_BLOCK_TOKENS;
}

typedef struct KvCache KvCache;

/*
 * What a session file (engine/session/session.h) needs of a host cache.
 * The file's container knows lengths, tags and checksums, never what a
 * record means: the cache (and in the compressed store, each KV format)
 * documents and writes its own bytes. role is 0 for keys, 1 for values.
 */
typedef struct KvCacheFileOps {
	uint32_t kind; /* the KV section's kind: 0 the f32 cache, 1 the compressed store */
	uint64_t (*seed)(const KvCache *kv);
	/* Bytes of one block (32 positions of one kv-head, K rows then V rows) of layer. */
	size_t (*block_bytes)(const KvCache *kv, int layer);
	/* Block index of (layer, head) as a file of n_kv tokens holds it, into out. */
	void (*block_save)(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			   uint8_t *out);
	/* The same back (block_bytes() bytes at in). 0, -ENOMEM or -EINVAL. */
	int (*block_load)(KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			  const uint8_t *in);
	/*
	 * Block index of (layer, head) as a session file holds it (version 6
	 * on, session.h): its size in a file of n_kv tokens (from the types
	 * and n_kv alone, so a reader knows it), the bytes into out, and back
	 * from in (the block is allocated; what the file leaves out is zeros
	 * or the records' to rebuild). Unpack: 0, -ENOMEM or -EINVAL.
	 */
	size_t (*block_file_bytes)(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv);
	void (*block_pack)(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			   uint8_t *out);
	int (*block_unpack)(KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			    const uint8_t *in);
	/* The tag and size of the record of (layer, head, role) for n_kv tokens. */
	uint32_t (*record_tag)(const KvCache *kv, int layer, int head, int role);
	size_t (*record_bytes)(const KvCache *kv, int layer, int head, int role, int64_t n_kv);
	/* The record into out. 0 or -EINVAL (a state a file cannot hold), err set. */
	int (*record_save)(const KvCache *kv, int layer, int head, int role, int64_t n_kv,
			   uint8_t *out, Error *err);
	/*
	 * The first block of layer a file of n_kv tokens holds: blocks below
	 * it are not in the file (a windowed layer's dropped blocks; the
	 * compressed store: kvcache_window_first_block(), the f32 cache: 0).
	 */
	int64_t (*first_block)(const KvCache *kv, int layer, int64_t n_kv);
	/*
	 * The record back, after every block first_block() .. of positions < n_kv is in.
	 * 0, KVCACHE_E_OTHER_TYPE, KVCACHE_E_CORRUPT or -ENOMEM, err set.
	 */
	int (*record_load)(KvCache *kv, int layer, int head, int role, int64_t n_kv,
			   const uint8_t *in, Error *err);
} KvCacheFileOps;

typedef struct KvCacheOps {
	const char *name;
	/*
	 * The backend whose memory k, v, q and out point into (backend.h's
	 * names); NULL: host memory, the CPU backend.
	 */
	const char *device;
	/*
	 * Optional: the queries q (n_tok, n_heads * head_dim) of the n_tok
	 * tokens at pos0.. of layer, before their keys are appended: what a
	 * cache learns from queries (pair-coded keys' query energies) it
	 * learns here. Cannot fail.
	 */
	void (*observe)(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *q);
	/* Store n_tok tokens at positions pos0.. of layer: k, v (n_tok, n_kv_heads * head_dim). */
	int (*append)(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
		      const float *v);
	/*
	 * out (n_tok, n_heads * head_dim) = causal attention of q (n_tok,
	 * n_heads * head_dim). Reads the cache only. Returns 0 or a negative
	 * errno (-ENOMEM for scratch; out is then unspecified).
	 */
	int (*attend)(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
		      const float *q, float *out);
	/*
	 * Optional: n_tokens changes to n (kvcache_set_n_tokens(), after the
	 * check against the floor): a windowed cache drops the blocks no query
	 * at n or later can see when n grows. Cannot fail.
	 */
	void (*set_n_tokens)(KvCache *kv, int64_t n);
	/* Optional (NULL: 0): the smallest n_tokens > 0 the cache can be rewound to, see kvcache_rewind_floor(). */
	int64_t (*rewind_floor)(const KvCache *kv);
	/* Bytes stored per token, all layers, K and V. */
	size_t (*bytes_per_token)(const KvCache *kv);
	/*
	 * Every byte the cache holds now: rows, scratch, format state, and
	 * for a device cache its device memory and host shadow.
	 */
	size_t (*memory_bytes)(const KvCache *kv);
	/* Host caches that session files can hold; NULL otherwise. */
	const KvCacheFileOps *file;
	/*
	 * Device caches only (NULL for host ones): a host cache (f32 or
	 * kvstore) with the same contents and n_tokens, for session files.
	 * Owned by kv, valid until its next append.
	 */
	int (*to_host)(KvCache *kv, KvCache **ret);
	void (*free)(KvCache *kv);
} KvCacheOps;

struct KvCache {
	const KvCacheOps *ops;
	KvCacheShape shape;
	int64_t n_tokens; /* positions 0 .. n_tokens-1 are valid in every layer */
};

/* An uncompressed f32 cache of shape->capacity tokens. Returns 0 or -ENOMEM / -EINVAL. */
int kvcache_new_f32(const KvCacheShape *shape, KvCache **ret);

KvCache *kvcache_free(KvCache *kv);
DEFINE_FREEP(KvCache, kvcache_free)

/* KvCacheOps.observe, if the cache has it. */
void kvcache_observe(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *q);
int kvcache_append(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
		   const float *v);
/* KvCacheOps.attend: 0 or a negative errno (the request fails, not the process). */
int kvcache_attend(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
		   const float *q, float *out);

/* Tokens present in every layer (advanced by the model after a batch). */
int64_t kvcache_n_tokens(const KvCache *kv);
/*
 * Advance or rewind to n tokens. Rewinding to 0 always works (a fresh
 * start: the prompt is recomputed); to 0 < n < kvcache_rewind_floor() is
 * a programming error (a windowed layer no longer holds what a query at n
 * would see): callers check the floor first and recompute from 0.
 */
void kvcache_set_n_tokens(KvCache *kv, int64_t n);
/*
 * The smallest n > 0 kv can be rewound to: 0 for a cache that keeps every
 * position, else (windowed layers that dropped blocks) a position at most
 * n_tokens. A rewind below it must start over from 0 instead.
 */
int64_t kvcache_rewind_floor(const KvCache *kv);

size_t kvcache_bytes_per_token(const KvCache *kv);

/* KvCacheOps.memory_bytes: every byte kv holds. */
size_t kvcache_memory_bytes(const KvCache *kv);

/* kv's session-file operations, NULL for a cache files cannot hold (a device cache: kvcache_host()). */
const KvCacheFileOps *kvcache_file(const KvCache *kv);


/* The backend name of kv's memory: "cpu" for host caches. */
const char *kvcache_device(const KvCache *kv);

/*
 * kv itself for a host cache; for a device cache, a host copy of its
 * contents (KvCacheOps.to_host). Returns 0, -ENOMEM or -EIO.
 */
int kvcache_host(KvCache *kv, KvCache **ret);

/* Whether kv was made by kvcache_new_f32(). */
bool kvcache_is_f32(const KvCache *kv);

/*
 * The rows of layer in an f32 cache (session files): *ret_k, *ret_v point
 * at (capacity, n_kv_heads * head_dim) floats, position-major; rows at
 * positions >= n_tokens are unspecified. Returns 0, or -EINVAL if kv is
 * not an f32 cache or layer is out of range.
 */
int kvcache_f32_rows(KvCache *kv, int layer, float **ret_k, float **ret_v);

/*
 * A recording cache (a tap): every operation is forwarded to inner, and
 * the rows that pass through are shown to callbacks, so a tool can see
 * real keys, values, queries and attention outputs without touching model
 * code. inner is borrowed (it must outlive the tap) and follows the tap's
 * n_tokens. Callbacks may be NULL; they run after the forwarded call.
 */
typedef struct KvCacheTap {
	void *userdata;
	/* after a successful append: k, v (n_tok, n_kv_heads * head_dim) */
	void (*on_append)(void *userdata, int layer, int64_t pos0, int64_t n_tok, const float *k,
			  const float *v);
	/* after attend: q, out (n_tok, n_heads * head_dim) */
	void (*on_attend)(void *userdata, int layer, int64_t pos0, int64_t n_tok, const float *q,
			  const float *out);
} KvCacheTap;

/* A tap around inner (same shape), a host cache. Returns 0, -EINVAL or -ENOMEM. */
int kvcache_new_tap(KvCache *inner, const KvCacheTap *tap, KvCache **ret);
