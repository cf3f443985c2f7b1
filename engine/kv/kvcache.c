/*
 * kvcache.c: the interface dispatch, the uncompressed f32 cache and the
 * recording tap.
 *
 * The f32 cache is the reference every other KV type is measured
 * against, so its attention is the plain definition: scores scaled by
 * 1/sqrt(head_dim), softmax, weighted sum of values; in a windowed
 * layer over the window only (kvcache.h). It keeps every position of
 * every layer, so it is also the full-cache reference of a windowed store.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/kv/kvcache.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_f32.h"
#include "kernels/kv_format.h"

typedef struct KvCacheF32 {
	KvCache base;
	float *k; /* (n_layers, capacity, n_kv_heads * head_dim) */
	float *v; /* (n_layers, capacity, n_kv_heads * head_dim) */
	float *scores;   /* (n_scores,) attention scratch, kept between calls */
	size_t n_scores;
} KvCacheF32;

static size_t f32_row(const KvCacheShape *s)
{
	return (size_t)s->n_kv_heads * s->head_dim;
}

static int f32_append(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
		      const float *v)
{
	KvCacheF32 *c = (KvCacheF32 *)kv;
	const KvCacheShape *s = &kv->shape;
	size_t row = f32_row(s);
	size_t off = ((size_t)layer * s->capacity + pos0) * row;
	memcpy(c->k + off, k, n_tok * row * sizeof(float));
	memcpy(c->v + off, v, n_tok * row * sizeof(float));
	return 0;
}

typedef struct F32AttendJob {
	const KvCacheF32 *c;
	int layer;
	int64_t pos0, n_tok;
	const float *q;
	float *out;
	float *scores;   /* (threads, pos0 + n_tok) */
} F32AttendJob;

/* One (token, head) pair: out_h = softmax(q_h K^T / sqrt(d)) V over the positions pos sees. */
static void f32_attend_one(const F32AttendJob *j, int64_t t, int h, float *scores)
{
	const KvCacheShape *s = &j->c->base.shape;
	int d = s->head_dim;
	int kvh = h / (s->n_heads / s->n_kv_heads);
	size_t row = f32_row(s);
	int64_t n_ctx = j->pos0 + t + 1;
	int64_t p0 = kvcache_first_visible(s, j->layer, j->pos0 + t);
	const float *q = j->q + (t * s->n_heads + h) * d;
	const float *kbase = j->c->k + (size_t)j->layer * s->capacity * row + (size_t)kvh * d;
	const float *vbase = j->c->v + (size_t)j->layer * s->capacity * row + (size_t)kvh * d;
	float scale = 1.0f / sqrtf((float)d);

	for (int64_t p = p0; p < n_ctx; p++)
		scores[p - p0] = vec_f32_dot(d, q, kbase + p * row) * scale;
	op_softmax(scores, n_ctx - p0);

	float *o = j->out + (t * s->n_heads + h) * d;
	memset(o, 0, d * sizeof(float));
	for (int64_t p = p0; p < n_ctx; p++)
		vec_f32_axpy(d, scores[p - p0], vbase + p * row, o);
}

static void f32_attend_task(void *ctx, int ith, int nth)
{
	const F32AttendJob *j = ctx;
	const KvCacheShape *s = &j->c->base.shape;
	long begin, end;
	threadpool_split((long)(j->n_tok * s->n_heads), ith, nth, &begin, &end);
	/* room for the longest row any thread sees */
	float *scores = j->scores + (size_t)ith * (size_t)(j->pos0 + j->n_tok);
	for (long i = begin; i < end; i++)
		f32_attend_one(j, i / s->n_heads, (int)(i % s->n_heads), scores);
}

static int f32_attend(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
		      const float *q, float *out)
{
	KvCacheF32 *c = (KvCacheF32 *)kv;
	size_t need = (size_t)(tp ? threadpool_n_threads(tp) : 1) * (size_t)(pos0 + n_tok);
	if (need > c->n_scores) {
		float *grown = realloc(c->scores, need * sizeof(float));
		if (!grown)
			return -ENOMEM;
		c->scores = grown;
		c->n_scores = need;
	}
	F32AttendJob j = {
		.c = c, .layer = layer, .pos0 = pos0, .n_tok = n_tok, .q = q, .out = out,
		.scores = c->scores,
	};
	threadpool_run(tp, f32_attend_task, &j);
	return 0;
}

static size_t f32_bytes_per_token(const KvCache *kv)
{
	return 2 * (size_t)kv->shape.n_layers * f32_row(&kv->shape) * sizeof(float);
}

static size_t f32_memory_bytes(const KvCache *kv)
{
	const KvCacheF32 *c = (const KvCacheF32 *)kv;
	return sizeof(*c) + (size_t)kv->shape.capacity * f32_bytes_per_token(kv) +
	       c->n_scores * sizeof(float);
}

/* ---- session files: f32 rows in the store's block layout, no records ---- */

#define F32_RECORD_TAG 0x20323346u /* "F32 " */
#define BT KV_BLOCK_TOKENS

static uint64_t f32_file_seed(const KvCache *kv)
{
	return 0;
}

static size_t f32_block_bytes(const KvCache *kv, int layer)
{
	return (size_t)BT * 2 * (size_t)kv->shape.head_dim * sizeof(float);
}

/* Between block index of (layer, head) (32 K rows, then 32 V rows) and the arrays, rows below n_kv. */
static void f32_block_copy(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			   float *block, bool to_block)
{
	const KvCacheF32 *c = (const KvCacheF32 *)kv;
	const KvCacheShape *s = &kv->shape;
	size_t d = (size_t)s->head_dim, row = f32_row(s);
	float *k = c->k + (size_t)layer * s->capacity * row, *v = c->v + (size_t)layer * s->capacity * row;
	for (int t = 0; t < BT; t++) {
		int64_t p = index * BT + t;
		float *kb = block + (size_t)t * d, *vb = block + (size_t)(BT + t) * d;
		size_t off = (size_t)p * row + (size_t)head * d;
		if (p >= n_kv) {
			if (to_block) {
				memset(kb, 0, d * sizeof(float));
				memset(vb, 0, d * sizeof(float));
			}
			continue;
		}
		if (to_block) {
			memcpy(kb, k + off, d * sizeof(float));
			memcpy(vb, v + off, d * sizeof(float));
		} else {
			memcpy(k + off, kb, d * sizeof(float));
			memcpy(v + off, vb, d * sizeof(float));
		}
	}
}

static void f32_block_save(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			   uint8_t *out)
{
	f32_block_copy(kv, layer, head, index, n_kv, (float *)out, true);
}

static int f32_block_load(KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			  const uint8_t *in)
{
	if (index < 0 || n_kv > kv->shape.capacity)
		return -EINVAL;
	f32_block_copy(kv, layer, head, index, n_kv, (float *)in, false);
	return 0;
}

static int f32_rows_below(int64_t index, int64_t n_kv)
{
	return (int)MAX(0, MIN((int64_t)BT, n_kv - index * BT));
}

/* In a file: the n rows below n_kv of K, then those of V (n x head_dim f32 each). */
static size_t f32_block_file_bytes(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv)
{
	return (size_t)f32_rows_below(index, n_kv) * 2 * (size_t)kv->shape.head_dim * sizeof(float);
}

static void f32_block_pack(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			   uint8_t *out)
{
	const KvCacheF32 *c = (const KvCacheF32 *)kv;
	const KvCacheShape *s = &kv->shape;
	size_t d = (size_t)s->head_dim, row = f32_row(s);
	int n = f32_rows_below(index, n_kv);
	const float *k = c->k + (size_t)layer * s->capacity * row, *v = c->v + (size_t)layer * s->capacity * row;
	for (int t = 0; t < n; t++) {
		size_t off = (size_t)(index * BT + t) * row + (size_t)head * d;
		memcpy(out + (size_t)t * d * sizeof(float), k + off, d * sizeof(float));
		memcpy(out + (size_t)(n + t) * d * sizeof(float), v + off, d * sizeof(float));
	}
}

static int f32_block_unpack(KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			    const uint8_t *in)
{
	KvCacheF32 *c = (KvCacheF32 *)kv;
	const KvCacheShape *s = &kv->shape;
	if (index < 0 || n_kv > s->capacity)
		return -EINVAL;
	size_t d = (size_t)s->head_dim, row = f32_row(s);
	int n = f32_rows_below(index, n_kv);
	float *k = c->k + (size_t)layer * s->capacity * row, *v = c->v + (size_t)layer * s->capacity * row;
	for (int t = 0; t < n; t++) {
		size_t off = (size_t)(index * BT + t) * row + (size_t)head * d;
		memcpy(k + off, in + (size_t)t * d * sizeof(float), d * sizeof(float));
		memcpy(v + off, in + (size_t)(n + t) * d * sizeof(float), d * sizeof(float));
	}
	return 0;
}

/* The f32 cache keeps every position: its files hold every block. */
static int64_t f32_first_block(const KvCache *kv, int layer, int64_t n_kv)
{
	return 0;
}

static uint32_t f32_record_tag(const KvCache *kv, int layer, int head, int role)
{
	return F32_RECORD_TAG;
}

static size_t f32_record_bytes(const KvCache *kv, int layer, int head, int role, int64_t n_kv)
{
	return 0;
}

static int f32_record_save(const KvCache *kv, int layer, int head, int role, int64_t n_kv,
			   uint8_t *out, Error *err)
{
	return 0;
}

static int f32_record_load(KvCache *kv, int layer, int head, int role, int64_t n_kv,
			   const uint8_t *in, Error *err)
{
	return 0;
}

static const KvCacheFileOps f32_file_ops = {
	.kind = 0,
	.seed = f32_file_seed,
	.block_bytes = f32_block_bytes,
	.block_save = f32_block_save,
	.block_load = f32_block_load,
	.block_file_bytes = f32_block_file_bytes,
	.block_pack = f32_block_pack,
	.block_unpack = f32_block_unpack,
	.first_block = f32_first_block,
	.record_tag = f32_record_tag,
	.record_bytes = f32_record_bytes,
	.record_save = f32_record_save,
	.record_load = f32_record_load,
};

static void f32_free(KvCache *kv)
{
	KvCacheF32 *c = (KvCacheF32 *)kv;
	free(c->k);
	free(c->v);
	free(c->scores);
	free(c);
}

static const KvCacheOps kvcache_f32_ops = {
	.name = "f32",
	.append = f32_append,
	.attend = f32_attend,
	.bytes_per_token = f32_bytes_per_token,
	.memory_bytes = f32_memory_bytes,
	.file = &f32_file_ops,
	.free = f32_free,
};

int kvcache_new_f32(const KvCacheShape *shape, KvCache **ret)
{
	if (shape->n_layers <= 0 || shape->n_heads <= 0 || shape->n_kv_heads <= 0 ||
	    shape->head_dim <= 0 || shape->capacity <= 0 || shape->n_heads % shape->n_kv_heads ||
	    shape->window < 0 || shape->window_period < 0)
		return -EINVAL;

	_cleanup_(freep) KvCacheF32 *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	size_t n;
	if (size_mul_overflows((size_t)shape->n_layers * shape->capacity, f32_row(shape), &n))
		return -ENOMEM;
	c->k = malloc_array(n, sizeof(float));
	c->v = malloc_array(n, sizeof(float));
	if (!c->k || !c->v) {
		free(c->k);
		free(c->v);
		return -ENOMEM;
	}
	c->base.ops = &kvcache_f32_ops;
	c->base.shape = *shape;
	*ret = &TAKE_PTR(c)->base;
	return 0;
}

KvCache *kvcache_free(KvCache *kv)
{
	if (kv)
		kv->ops->free(kv);
	return NULL;
}

void kvcache_observe(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *q)
{
	if (kv->ops->observe)
		kv->ops->observe(kv, layer, pos0, n_tok, q);
}

int kvcache_append(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
		   const float *v)
{
	if (pos0 != kv->n_tokens)
		return KVCACHE_E_POSITION;
	if (n_tok < 0 || pos0 + n_tok > kv->shape.capacity)
		return KVCACHE_E_FULL;
	return kv->ops->append(kv, layer, pos0, n_tok, k, v);
}

int kvcache_attend(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
		   const float *q, float *out)
{
	return kv->ops->attend(kv, tp, layer, pos0, n_tok, q, out);
}

int64_t kvcache_n_tokens(const KvCache *kv)
{
	return kv->n_tokens;
}

void kvcache_set_n_tokens(KvCache *kv, int64_t n)
{
	assert(n >= 0 && n <= kv->shape.capacity);
	assert(n == 0 || n >= kvcache_rewind_floor(kv));
	if (kv->ops->set_n_tokens)
		kv->ops->set_n_tokens(kv, n);
	kv->n_tokens = n;
}

int64_t kvcache_rewind_floor(const KvCache *kv)
{
	return kv->ops->rewind_floor ? kv->ops->rewind_floor(kv) : 0;
}

size_t kvcache_bytes_per_token(const KvCache *kv)
{
	return kv->ops->bytes_per_token(kv);
}

size_t kvcache_memory_bytes(const KvCache *kv)
{
	return kv->ops->memory_bytes(kv);
}

const KvCacheFileOps *kvcache_file(const KvCache *kv)
{
	return kv->ops->file;
}

const char *kvcache_device(const KvCache *kv)
{
	return kv->ops->device ? kv->ops->device : "cpu";
}

int kvcache_host(KvCache *kv, KvCache **ret)
{
	if (!kv->ops->to_host) {
		*ret = kv;
		return 0;
	}
	return kv->ops->to_host(kv, ret);
}

bool kvcache_is_f32(const KvCache *kv)
{
	return kv && kv->ops == &kvcache_f32_ops;
}

int kvcache_f32_rows(KvCache *kv, int layer, float **ret_k, float **ret_v)
{
	if (!kvcache_is_f32(kv) || layer < 0 || layer >= kv->shape.n_layers)
		return -EINVAL;
	KvCacheF32 *c = (KvCacheF32 *)kv;
	size_t off = (size_t)layer * kv->shape.capacity * f32_row(&kv->shape);
	*ret_k = c->k + off;
	*ret_v = c->v + off;
	return 0;
}

/* ---- the recording tap ---- */

typedef struct KvCacheTapped {
	KvCache base;
	KvCache *inner; /* borrowed */
	KvCacheTap tap;
} KvCacheTapped;

static void tap_observe(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *q)
{
	KvCacheTapped *c = (KvCacheTapped *)kv;
	c->inner->n_tokens = kv->n_tokens;
	kvcache_observe(c->inner, layer, pos0, n_tok, q);
}

static int tap_append(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
		      const float *v)
{
	KvCacheTapped *c = (KvCacheTapped *)kv;
	c->inner->n_tokens = kv->n_tokens;
	int r = kvcache_append(c->inner, layer, pos0, n_tok, k, v);
	if (r == 0 && c->tap.on_append)
		c->tap.on_append(c->tap.userdata, layer, pos0, n_tok, k, v);
	return r;
}

static int tap_attend(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
		      const float *q, float *out)
{
	KvCacheTapped *c = (KvCacheTapped *)kv;
	c->inner->n_tokens = kv->n_tokens;
	int r = kvcache_attend(c->inner, tp, layer, pos0, n_tok, q, out);
	if (r == 0 && c->tap.on_attend)
		c->tap.on_attend(c->tap.userdata, layer, pos0, n_tok, q, out);
	return r;
}

static size_t tap_bytes_per_token(const KvCache *kv)
{
	return kvcache_bytes_per_token(((const KvCacheTapped *)kv)->inner);
}

/* The tap's own: inner is borrowed and counted by its owner. */
static size_t tap_memory_bytes(const KvCache *kv)
{
	return sizeof(KvCacheTapped);
}

static void tap_free(KvCache *kv)
{
	free(kv);
}

static const KvCacheOps kvcache_tap_ops = {
	.name = "tap",
	.observe = tap_observe,
	.append = tap_append,
	.attend = tap_attend,
	.bytes_per_token = tap_bytes_per_token,
	.memory_bytes = tap_memory_bytes,
	.free = tap_free,
};

int kvcache_new_tap(KvCache *inner, const KvCacheTap *tap, KvCache **ret)
{
	if (inner->ops->device) /* the callbacks read rows in host memory */
		return -EINVAL;
	KvCacheTapped *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->base.ops = &kvcache_tap_ops;
	c->base.shape = inner->shape;
	c->base.n_tokens = inner->n_tokens;
	c->inner = inner;
	c->tap = *tap;
	*ret = &c->base;
	return 0;
}
