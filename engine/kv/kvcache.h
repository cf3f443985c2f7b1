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
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "kernels/cpu/threadpool.h"

enum {
	KVCACHE_E_FULL = 1, /* appending would exceed the capacity */
	KVCACHE_E_POSITION, /* append not at the end of the cache */
};

typedef struct KvCacheShape {
	int n_layers;
	int n_heads;
	int n_kv_heads;
	int head_dim;
	int64_t capacity; /* tokens */
} KvCacheShape;

typedef struct KvCache KvCache;

typedef struct KvCacheOps {
	const char *name;
	/*
	 * The backend whose memory k, v, q and out point into (backend.h's
	 * names); NULL: host memory, the CPU backend.
	 */
	const char *device;
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
	/* Bytes stored per token, all layers, K and V. */
	size_t (*bytes_per_token)(const KvCache *kv);
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

int kvcache_append(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
		   const float *v);
/* KvCacheOps.attend: 0 or a negative errno (the request fails, not the process). */
int kvcache_attend(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
		   const float *q, float *out);

/* Tokens present in every layer (advanced by the model after a batch). */
int64_t kvcache_n_tokens(const KvCache *kv);
void kvcache_set_n_tokens(KvCache *kv, int64_t n);

size_t kvcache_bytes_per_token(const KvCache *kv);


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
