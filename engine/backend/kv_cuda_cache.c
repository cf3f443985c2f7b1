/*
 * kv_cuda_cache.c: the KvCache of the CUDA backend (kv_cuda_cache.h
 * describes the design): one single-sequence CudaKv per layer, a host
 * shadow cache for outlier masks and sessions, and the block copies
 * between them. The kernels are kv_cuda.cu's; nothing here touches CUDA
 * directly.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/kv_cuda_cache.h"
#include "engine/backend/kv_cuda_host.h"
#include "engine/kv/fmt_tq.h"
#include "engine/kv/kvstore.h"

typedef struct CudaKvCache {
	KvCache base;
	bool f32;        /* plain f32 rows; else the shadow is a kvstore cache */
	/*
	 * The host cache of the same type: kvcache_new_quant() with the same
	 * plan and seed, or kvcache_new_f32() (made at the first to_host()
	 * unless adopted). Only its codecs, and after to_host() its blocks,
	 * are current; its n_tokens is set by to_host().
	 */
	KvCache *shadow;
	CudaKv **layers; /* (n_layers,) NULL until built */
	void **reserved; /* (n_layers,) device memory held for a layer built at its first append */
} CudaKvCache;

static const KvCacheOps cuda_kvcache_ops;

static CudaKvCache *cache_of(KvCache *kv)
{
	assert(kv && kv->ops == &cuda_kvcache_ops);
	return (CudaKvCache *)kv;
}

bool cuda_kvcache_is(const KvCache *kv)
{
	return kv && kv->ops == &cuda_kvcache_ops;
}

/* ---- shape and type checks: everything the GPU cannot take fails at creation ---- */

static int check_shape(const KvCacheShape *s, Error *err)
{
	if (s->n_layers <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 || s->head_dim <= 0 ||
	    s->capacity <= 0 || s->n_heads % s->n_kv_heads)
		return error_set(err, -EINVAL, "bad cache shape");
	/* a warp's lanes split a head vector: dims lane, lane + 32, ... */
	if (s->head_dim % 32 || s->head_dim > KVK_MAX_DIM)
		return error_set(err, -EINVAL,
				 "the GPU KV cache needs head_dim a multiple of 32 up to %d, not %d",
				 KVK_MAX_DIM, s->head_dim);
	if (s->n_heads / s->n_kv_heads > CUDA_KV_MAX_G)
		return error_set(err, -EINVAL,
				 "the GPU KV cache takes at most %d query heads per kv-head, not %d "
				 "(%d heads, %d kv-heads)", CUDA_KV_MAX_G, s->n_heads / s->n_kv_heads,
				 s->n_heads, s->n_kv_heads);
	if (cuda_device_count() < 1)
		return error_set(err, -ENODEV, "no CUDA device");
	return 0;
}

/*
 * What cuda_kv_new() and tq_codec_kernel() would refuse later, for layers
 * whose CudaKv waits for the first append.
 */
static int check_types(const CudaKvCache *c, Error *err)
{
	const KvCacheShape *s = &c->base.shape;
	if (c->f32)
		return 0;
	for (int l = 0; l < s->n_layers; l++) {
		const KvLayerTypes *t = kvstore_layer_types(c->shadow, l);
		for (int role = 0; role < 2; role++) {
			Error e = { 0 };
			if (kvformat_supports(role ? &t->v : &t->k, (KvRole)role, s, KV_DEVICE_CUDA, &e))
				return error_set(err, -EINVAL, "layer %d: %s", l, e.msg);
		}
	}
	return 0;
}

/* ---- layers ---- */

/* Whether every codec of layer is known: false while an outlier side waits for its first append. */
static bool layer_ready(const CudaKvCache *c, int layer)
{
	if (c->f32)
		return true;
	const KvLayerTypes *t = kvstore_layer_types(c->shadow, layer);
	for (int h = 0; h < c->base.shape.n_kv_heads; h++) {
		TqDesc d;
		if ((t->k.format == KV_FORMAT_TQ &&
		     kvtq_side_desc(c->shadow, layer, h, KV_ROLE_K, &d)) ||
		    (t->v.format == KV_FORMAT_TQ && kvtq_side_desc(c->shadow, layer, h, KV_ROLE_V, &d)))
			return false;
	}
	return true;
}

/* The CudaKv of layer, with the codecs the shadow has now. */
static int layer_build(CudaKvCache *c, int layer, Error *err)
{
	const KvCacheShape *s = &c->base.shape;
	Error e = { 0 };
	int r;
	if (c->f32) {
		CudaKvShape sh = { .n_seqs = 1, .n_heads = s->n_heads, .n_kv_heads = s->n_kv_heads,
				   .dim = s->head_dim, .capacity = s->capacity,
				   .window = kvcache_layer_window(s, layer) };
		CudaKvSide side = { .format = KV_FORMAT_F32 };
		r = cuda_kv_new(&sh, &side, &side, &c->layers[layer], e.msg, sizeof(e.msg));
	} else {
		r = cuda_kv_new_like(c->shadow, layer, 1, s->capacity, &c->layers[layer], &e);
	}
	if (r)
		return error_set(err, r, "layer %d: %s", layer,
				 e.msg[0] ? e.msg : "GPU KV cache: allocation failed");
	return 0;
}

/* Device memory of layer's blocks (capacity tokens, every kv-head); SIZE_MAX if it overflows. */
static size_t layer_bytes(const CudaKvCache *c, int layer)
{
	const KvCacheShape *s = &c->base.shape;
	size_t block = c->f32 ? 2 * KV_BLOCK_TOKENS * (size_t)s->head_dim * sizeof(float)
			      : kvstore_block_bytes(c->shadow, layer);
	int64_t per_head = (s->capacity + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	size_t blocks = (size_t)s->n_kv_heads * (size_t)per_head, bytes;
	return size_mul_overflows(blocks, block, &bytes) ? SIZE_MAX : bytes;
}

/* Hold the device memory of layer's blocks until its first append builds its CudaKv there. */
static int layer_reserve(CudaKvCache *c, int layer, Error *err)
{
	size_t bytes = layer_bytes(c, layer);
	if (!(c->reserved[layer] = cuda_alloc(bytes)))
		return error_set(err, -ENOMEM,
				 "layer %d: GPU KV cache: out of device memory for %.1f MiB of blocks",
				 layer, bytes / 1048576.0);
	return 0;
}

static int layers_init(CudaKvCache *c, Error *err)
{
	for (int l = 0; l < c->base.shape.n_layers; l++) {
		int r = layer_ready(c, l) ? layer_build(c, l, err) : layer_reserve(c, l, err);
		if (r == -ENOMEM) {
			double total = 0.0;
			for (int i = 0; i < c->base.shape.n_layers; i++)
				total += (double)layer_bytes(c, i);
			Error e = err ? *err : (Error){ 0 };
			return error_set(err, r, "%s (%.1f MiB for all %d layers)", e.msg,
					 total / 1048576.0, c->base.shape.n_layers);
		}
		if (r)
			return r;
	}
	return 0;
}

/*
 * The first append of a layer that waits for its outlier masks: the
 * shadow chooses them from the batch, as the CPU store's first append
 * would (kvstore_fix: only the masks, the rows are not quantized on the
 * CPU), then the layer is built and gets the rows.
 */
static int layer_first_append(CudaKvCache *c, int layer, int64_t pos0, int64_t n_tok,
			      const float *k, const float *v)
{
	const KvCacheShape *s = &c->base.shape;
	size_t n = (size_t)n_tok * (size_t)s->n_kv_heads * (size_t)s->head_dim;
	_cleanup_(freep) float *hk = malloc_array(n, sizeof(float));
	_cleanup_(freep) float *hv = malloc_array(n, sizeof(float));
	if (!hk || !hv)
		return -ENOMEM;
	/* whatever stream wrote k and v, it is done */
	int r = cuda_sync(NULL, 0);
	if (r || (r = cuda_download(hk, k, n * sizeof(float))) ||
	    (r = cuda_download(hv, v, n * sizeof(float))))
		return r;

	if ((r = kvstore_fix(c->shadow, layer, n_tok, hk, hv)))
		return r;
	assert(layer_ready(c, layer));

	cuda_free(c->reserved[layer]);
	c->reserved[layer] = NULL;
	if ((r = layer_build(c, layer, NULL)))
		return r < 0 ? r : -EIO;
	return cuda_kv_append(c->layers[layer], 0, pos0, n_tok, k, v);
}

/* ---- blocks between the device and the shadow ---- */

/*
 * Blocks move in runs of up to TRANSFER_BYTES: the blocks of a (sequence,
 * kv-head) are contiguous on the device, and one transfer per block would
 * cost a round trip each (a 32K-token session of an 8B model has 256K
 * blocks). The emulated test sets a few KiB so that runs split.
 */
#ifndef TRANSFER_BYTES
#define TRANSFER_BYTES ((size_t)4 << 20)
#endif

static int64_t run_blocks(size_t block_bytes, int64_t left)
{
	return MIN(left, (int64_t)MAX(TRANSFER_BYTES / block_bytes, (size_t)1));
}

/* Blocks of positions 0 .. n_tokens-1 of layer, every kv-head: shadow -> device. */
static int layer_upload(CudaKvCache *c, int layer, Error *err)
{
	const KvCacheShape *s = &c->base.shape;
	int64_t n_blocks = (c->base.n_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	if (!n_blocks)
		return 0;
	if (!c->layers[layer])
		return error_set(err, -EINVAL,
				 "layer %d holds tokens but its outlier masks are not chosen", layer);
	const KvCacheFileOps *fo = kvcache_file(c->shadow);
	size_t bb = cuda_kv_block_bytes(c->layers[layer]);
	if (bb != fo->block_bytes(c->shadow, layer))
		return error_set(err, -EINVAL, "layer %d: GPU blocks of %zu bytes, host blocks of %zu",
				 layer, bb, fo->block_bytes(c->shadow, layer));
	_cleanup_(freep) uint8_t *buf = malloc(run_blocks(bb, n_blocks) * bb);
	if (!buf)
		return error_set(err, -ENOMEM, "out of memory");
	for (int h = 0; h < s->n_kv_heads; h++)
		for (int64_t b0 = 0; b0 < n_blocks;) {
			int64_t n = run_blocks(bb, n_blocks - b0);
			for (int64_t i = 0; i < n; i++)
				fo->block_save(c->shadow, layer, h, b0 + i, c->base.n_tokens, buf + i * bb);
			int r = cuda_kv_blocks_write(c->layers[layer], 0, h, b0, n, buf, n * bb);
			if (r)
				return error_set(err, r, "layer %d: block upload failed", layer);
			b0 += n;
		}
	return 0;
}

/* Blocks of positions 0 .. n_tokens-1 of layer, every kv-head: device -> shadow. */
static int layer_download(CudaKvCache *c, int layer)
{
	const KvCacheShape *s = &c->base.shape;
	int64_t n_blocks = (c->base.n_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	if (!n_blocks)
		return 0;
	if (!c->layers[layer])
		return -EIO; /* tokens in every layer, yet this one was never appended to */
	const KvCacheFileOps *fo = kvcache_file(c->shadow);
	size_t bb = cuda_kv_block_bytes(c->layers[layer]);
	_cleanup_(freep) uint8_t *buf = malloc(run_blocks(bb, n_blocks) * bb);
	if (!buf)
		return -ENOMEM;
	for (int h = 0; h < s->n_kv_heads; h++)
		for (int64_t b0 = 0; b0 < n_blocks;) {
			int64_t n = run_blocks(bb, n_blocks - b0);
			int r = cuda_kv_blocks_read(c->layers[layer], 0, h, b0, n, buf, n * bb);
			for (int64_t i = 0; !r && i < n; i++)
				r = fo->block_load(c->shadow, layer, h, b0 + i, c->base.n_tokens, buf + i * bb);
			if (r)
				return r == -ENOMEM ? r : -EIO;
			b0 += n;
		}
	return 0;
}

/* ---- KvCacheOps ---- */

static int cache_append(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
			const float *v)
{
	CudaKvCache *c = cache_of(kv);
	assert(layer >= 0 && layer < kv->shape.n_layers);
	if (n_tok == 0)
		return 0;
	if (!c->layers[layer])
		return layer_first_append(c, layer, pos0, n_tok, k, v);
	return cuda_kv_append(c->layers[layer], 0, pos0, n_tok, k, v);
}

static int cache_attend(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
			const float *q, float *out)
{
	CudaKvCache *c = cache_of(kv);
	assert(layer >= 0 && layer < kv->shape.n_layers);
	if (n_tok <= 0)
		return 0;
	/* a layer without a CudaKv holds no tokens: nothing to attend to */
	return c->layers[layer] ? cuda_kv_attend(c->layers[layer], &pos0, 1, n_tok, q, out) : -EINVAL;
}

static size_t cache_bytes_per_token(const KvCache *kv)
{
	const CudaKvCache *c = (const CudaKvCache *)kv;
	if (c->f32)
		return 2 * (size_t)kv->shape.n_layers * (size_t)kv->shape.n_kv_heads *
		       (size_t)kv->shape.head_dim * sizeof(float);
	return kvcache_bytes_per_token(c->shadow);
}

/* Device memory (built layers, and the blocks reserved for the others) plus the host shadow. */
static size_t cache_memory_bytes(const KvCache *kv)
{
	const CudaKvCache *c = (const CudaKvCache *)kv;
	size_t n = sizeof(*c) + (size_t)kv->shape.n_layers * (sizeof(*c->layers) + sizeof(*c->reserved));
	for (int l = 0; l < kv->shape.n_layers; l++)
		n += c->layers[l] ? cuda_kv_memory_bytes(c->layers[l]) : c->reserved[l] ? layer_bytes(c, l) : 0;
	return n + (c->shadow ? kvcache_memory_bytes(c->shadow) : 0);
}

static int cache_to_host(KvCache *kv, KvCache **ret)
{
	CudaKvCache *c = cache_of(kv);
	int r;
	if (!c->shadow && (r = kvcache_new_f32(&kv->shape, &c->shadow)))
		return r;
	if (cuda_sync(NULL, 0))
		return -EIO;
	for (int l = 0; l < kv->shape.n_layers; l++)
		if ((r = layer_download(c, l)))
			return r;
	kvcache_set_n_tokens(c->shadow, kv->n_tokens);
	*ret = c->shadow;
	return 0;
}

static void cache_free(KvCache *kv)
{
	CudaKvCache *c = (CudaKvCache *)kv;
	for (int l = 0; l < kv->shape.n_layers; l++) {
		if (c->layers)
			cuda_kv_free(c->layers[l]);
		if (c->reserved)
			cuda_free(c->reserved[l]);
	}
	kvcache_free(c->shadow);
	free(c->layers);
	free(c->reserved);
	free(c);
}

static const KvCacheOps cuda_kvcache_ops = {
	.name = "cuda",
	.device = "cuda",
	.append = cache_append,
	.attend = cache_attend,
	.bytes_per_token = cache_bytes_per_token,
	.memory_bytes = cache_memory_bytes,
	.to_host = cache_to_host,
	.free = cache_free,
};

/* ---- construction ---- */

/* An empty cache: no shadow, no layers. */
static int cache_alloc(const KvCacheShape *shape, bool f32, KvCache **ret, Error *err)
{
	CudaKvCache *c = calloc(1, sizeof(*c));
	if (!c)
		return error_set(err, -ENOMEM, "out of memory");
	c->base.ops = &cuda_kvcache_ops;
	c->base.shape = *shape;
	c->f32 = f32;
	c->layers = calloc_array((size_t)shape->n_layers, sizeof(*c->layers));
	c->reserved = calloc_array((size_t)shape->n_layers, sizeof(*c->reserved));
	if (!c->layers || !c->reserved) {
		cache_free(&c->base);
		return error_set(err, -ENOMEM, "out of memory");
	}
	*ret = &c->base;
	return 0;
}

int cuda_kvcache_new(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		     Error *err)
{
	int r = check_shape(shape, err);
	if (r)
		return r;
	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	bool f32 = !plan || kvplan_is_f32(plan);
	if ((r = cache_alloc(shape, f32, &kv, err)))
		return r;
	CudaKvCache *c = cache_of(kv);
	if (!f32 && (r = kvcache_new_quant(shape, plan, seed, &c->shadow, err)))
		return r;
	if ((r = check_types(c, err)) || (r = layers_init(c, err)))
		return r;
	*ret = TAKE_PTR(kv);
	return 0;
}

int cuda_kvcache_adopt(KvCache *host, KvCache **ret, Error *err)
{
	bool f32 = kvcache_is_f32(host);
	if (!f32 && !kvstore_is(host))
		return error_set(err, -EINVAL,
				 "only an f32 or a compressed host cache can move to the GPU");
	int r = check_shape(&host->shape, err);
	if (r)
		return r;
	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	if ((r = cache_alloc(&host->shape, f32, &kv, err)))
		return r;
	CudaKvCache *c = cache_of(kv);
	kv->n_tokens = host->n_tokens;
	c->shadow = host; /* borrowed until success */
	r = check_types(c, err);
	if (!r)
		r = layers_init(c, err);
	for (int l = 0; !r && l < host->shape.n_layers; l++)
		r = layer_upload(c, l, err);
	if (r) {
		c->shadow = NULL; /* left to the caller */
		return r;
	}
	*ret = TAKE_PTR(kv);
	return 0;
}
