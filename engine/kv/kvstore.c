/*
 * kvstore.c: the compressed KV cache of kvstore.h: blocks, appends handed
 * to each side's format, the attention loop over blocks (online softmax,
 * flash-decoding split, combine), memory accounting and the session file
 * operations. Nothing here knows a format: every per-row decision is a
 * call on the side's KvFormatOps.
 */
#include "engine/kv/kvstore.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kv_attn.h"

#define BT KV_BLOCK_TOKENS
#define KVSTORE_SPLIT_MIN_BLOCKS 8 /* auto split: at least 256 tokens per item */
#define KVSTORE_TILE_TOKENS 16     /* prefill: tokens whose queries share a read of each block */

/* One (layer, kv-head, K or V): its format and the format's state. */
typedef struct KvSide {
	const KvFormatOps *ops;
	void *st;
} KvSide;

typedef struct KvHead {
	KvSide k, v;
	uint8_t **blocks;   /* (cap_blocks,) NULL = not allocated */
	int64_t cap_blocks;
	int64_t lo;         /* blocks below lo are NULL: dropped by a windowed layer */
} KvHead;

typedef struct KvLayer {
	KvLayerTypes types; /* as planned */
	size_t k_bytes, v_bytes;
	int64_t window;     /* kvcache_layer_window(): W, 0 for a global layer */
	KvHead *heads;      /* (n_kv_heads,) */
} KvLayer;

/* Per-thread attention scratch, kept by the cache; rows = a tile's query heads. */
typedef struct AttendScratch {
	void *prep;     /* the key format's prepared tile (prep_bytes) */
	void *prep1;    /* one token's prepared heads (prep1_bytes) */
	float *q;       /* (rows, d) the tile's queries, gathered */
	float *scores;  /* (rows, BT) */
	float *ml;      /* (3, rows): running max, sum, correction */
	float *acc;     /* (rows, d + 2) accumulators */
} AttendScratch;

typedef struct KvStore {
	KvCache base;
	uint64_t seed;
	int split_blocks;         /* kvstore_set_split() */
	KvLayer *layers;          /* (n_layers,) */
	size_t bytes_allocated;   /* block payload */
	float *part;              /* attention partials, see AttendJob */
	size_t part_n;
	AttendScratch *scratch;   /* (n_scratch,) one per pool thread, for single tokens */
	int n_scratch, scratch_group;
	size_t prep_bytes;
	int tile_tokens;          /* kvstore_set_tile() */
	bool keep_all;            /* kvstore_set_keep_all() */
} KvStore;

static const KvCacheOps kvstore_ops;

static KvStore *store_of(const KvCache *kv)
{
	assert(kv && kv->ops == &kvstore_ops);
	return (KvStore *)kv;
}

bool kvstore_is(const KvCache *kv)
{
	return kv && kv->ops == &kvstore_ops;
}

static KvSide *side_of(KvHead *H, KvRole role)
{
	return role == KV_ROLE_K ? &H->k : &H->v;
}

/* The rows of one side as its format sees them. */
static KvSideRows side_rows(const KvLayer *L, const KvHead *H, KvRole role)
{
	return (KvSideRows){
		.blocks = H->blocks,
		.n_blocks = H->cap_blocks,
		.first = H->lo,
		.offset = role == KV_ROLE_K ? 0 : BT * L->k_bytes,
		.row_bytes = role == KV_ROLE_K ? L->k_bytes : L->v_bytes,
	};
}

/* ---- construction ---- */

static void store_scratch_free(KvStore *s);
static size_t scratch_array_bytes(int nth, int rows, size_t prep, size_t prep1, int d);

static void store_free(KvCache *kv)
{
	KvStore *s = (KvStore *)kv;
	for (int l = 0; s->layers && l < kv->shape.n_layers; l++) {
		KvLayer *L = &s->layers[l];
		for (int h = 0; L->heads && h < kv->shape.n_kv_heads; h++) {
			KvHead *H = &L->heads[h];
			if (H->k.st)
				H->k.ops->free(H->k.st);
			if (H->v.st)
				H->v.ops->free(H->v.st);
			for (int64_t b = 0; b < H->cap_blocks; b++)
				free(H->blocks[b]);
			free(H->blocks);
		}
		free(L->heads);
	}
	free(s->layers);
	free(s->part);
	store_scratch_free(s);
	free(s);
}

/* Every side of plan on the CPU, through the formats' capability table. */
static int check_plan(const KvCacheShape *shape, const KvPlan *plan, Error *err)
{
	if (plan->n_layers != shape->n_layers || plan->n_kv_heads != shape->n_kv_heads ||
	    plan->head_dim != shape->head_dim)
		return error_set(err, KVSTORE_E_PLAN,
				 "plan for %d layers x %d kv-heads x %d, cache is %d x %d x %d",
				 plan->n_layers, plan->n_kv_heads, plan->head_dim, shape->n_layers,
				 shape->n_kv_heads, shape->head_dim);
	for (int l = 0; l < plan->n_layers; l++)
		for (int role = 0; role < 2; role++) {
			const KvType *t = role ? &plan->layers[l].v : &plan->layers[l].k;
			Error e = { 0 };
			if (kvformat_supports(t, (KvRole)role, shape, KV_DEVICE_CPU, &e) != 0)
				return error_set(err, KVSTORE_E_PLAN, "layer %d %s: %s", l, role ? "V" : "K",
						 e.msg);
		}
	return 0;
}

static int side_init(KvSide *side, const KvType *t, const KvStore *s, int layer, int head,
		     KvRole role, Error *err)
{
	const KvCacheShape *sh = &s->base.shape;
	KvSideSetup setup = { .type = *t, .role = role, .layer = layer, .head = head, .seed = s->seed,
			      .group = sh->n_heads / sh->n_kv_heads,
			      .rope = kvcache_layer_rope(sh, layer) };
	side->ops = kvformat_of(t);
	return side->ops->init(&setup, &side->st, err);
}

int kvcache_new_quant(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		      Error *err)
{
	if (shape->n_layers <= 0 || shape->n_heads <= 0 || shape->n_kv_heads <= 0 ||
	    shape->head_dim <= 0 || shape->head_dim > TQ_MAX_DIM || shape->capacity <= 0 ||
	    shape->n_heads % shape->n_kv_heads || shape->window < 0 || shape->window_period < 0)
		return error_set(err, -EINVAL, "bad cache shape");
	int r = check_plan(shape, plan, err);
	if (r)
		return r;

	_cleanup_(freep) KvStore *raw = calloc(1, sizeof(*raw));
	if (!raw)
		return error_set(err, -ENOMEM, "out of memory");
	raw->base.ops = &kvstore_ops;
	raw->base.shape = *shape;
	raw->seed = seed;
	raw->tile_tokens = KVSTORE_TILE_TOKENS;
	_cleanup_(kvcache_freep) KvCache *kv = &TAKE_PTR(raw)->base;
	KvStore *s = (KvStore *)kv;

	s->layers = calloc_array((size_t)shape->n_layers, sizeof(KvLayer));
	if (!s->layers)
		return error_set(err, -ENOMEM, "out of memory");
	for (int l = 0; l < shape->n_layers; l++) {
		KvLayer *L = &s->layers[l];
		L->types = plan->layers[l];
		L->window = kvcache_layer_window(shape, l);
		L->k_bytes = kvtype_vec_bytes(&L->types.k);
		L->v_bytes = kvtype_vec_bytes(&L->types.v);
		L->heads = calloc_array((size_t)shape->n_kv_heads, sizeof(KvHead));
		if (!L->heads)
			return error_set(err, -ENOMEM, "out of memory");
		for (int h = 0; h < shape->n_kv_heads; h++) {
			KvHead *H = &L->heads[h];
			if ((r = side_init(&H->k, &L->types.k, s, l, h, KV_ROLE_K, err)) ||
			    (r = side_init(&H->v, &L->types.v, s, l, h, KV_ROLE_V, err)))
				return r;
		}
	}
	*ret = TAKE_PTR(kv);
	return 0;
}

int kvcache_new_host(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		     Error *err)
{
	if (plan && !kvplan_is_f32(plan))
		return kvcache_new_quant(shape, plan, seed, ret, err);
	int r = kvcache_new_f32(shape, ret);
	if (r < 0)
		return error_set(err, r, "KV cache of %lld tokens: %s", (long long)shape->capacity,
				 r == -ENOMEM ? "out of memory" : "bad shape");
	return 0;
}

/* ---- accessors ---- */

uint64_t kvstore_seed(const KvCache *kv)
{
	return store_of(kv)->seed;
}

const KvLayerTypes *kvstore_layer_types(const KvCache *kv, int layer)
{
	assert(layer >= 0 && layer < kv->shape.n_layers);
	return &store_of(kv)->layers[layer].types;
}

size_t kvstore_block_bytes(const KvCache *kv, int layer)
{
	const KvLayer *L = &store_of(kv)->layers[layer];
	return BT * (L->k_bytes + L->v_bytes);
}

int64_t kvstore_n_blocks(const KvCache *kv)
{
	return (kv->n_tokens + BT - 1) / BT;
}

const uint8_t *kvstore_block(const KvCache *kv, int layer, int head, int64_t index)
{
	const KvHead *H = &store_of(kv)->layers[layer].heads[head];
	return index >= 0 && index < H->cap_blocks ? H->blocks[index] : NULL;
}

const void *kvstore_side(const KvCache *kv, int layer, int head, KvRole role,
			 const KvFormatOps **ret_ops)
{
	*ret_ops = NULL;
	if (!kvstore_is(kv) || layer < 0 || layer >= kv->shape.n_layers || head < 0 ||
	    head >= kv->shape.n_kv_heads)
		return NULL;
	KvSide *side = side_of(&store_of(kv)->layers[layer].heads[head], role);
	*ret_ops = side->ops;
	return side->st;
}

void kvstore_load_row(const KvCache *kv, int layer, int head, KvRole role, int64_t pos, float *ret)
{
	const KvLayer *L = &store_of(kv)->layers[layer];
	KvHead *H = &L->heads[head];
	KvSideRows rows = side_rows(L, H, role);
	const KvSide *side = side_of(H, role);
	side->ops->load_row(side->st, &rows, pos, ret);
}

size_t kvstore_bytes_allocated(const KvCache *kv)
{
	return store_of(kv)->bytes_allocated;
}

void kvstore_set_split(KvCache *kv, int blocks_per_chunk)
{
	store_of(kv)->split_blocks = blocks_per_chunk > 0 ? blocks_per_chunk : 0;
}

void kvstore_set_tile(KvCache *kv, int tokens)
{
	store_of(kv)->tile_tokens = tokens > 0 ? tokens : KVSTORE_TILE_TOKENS;
}

void kvstore_set_keep_all(KvCache *kv, bool keep)
{
	store_of(kv)->keep_all = keep;
}

int64_t kvstore_blocks_held(const KvCache *kv, int layer, int head)
{
	const KvHead *H = &store_of(kv)->layers[layer].heads[head];
	int64_t n = 0;
	for (int64_t b = 0; b < H->cap_blocks; b++)
		n += H->blocks[b] != NULL;
	return n;
}

static size_t store_bytes_per_token(const KvCache *kv)
{
	const KvStore *s = store_of(kv);
	size_t n = 0;
	for (int l = 0; l < kv->shape.n_layers; l++)
		n += (s->layers[l].k_bytes + s->layers[l].v_bytes) * (size_t)kv->shape.n_kv_heads;
	return n;
}

static size_t store_memory_bytes(const KvCache *kv)
{
	const KvStore *s = store_of(kv);
	const KvCacheShape *sh = &kv->shape;
	size_t n = sizeof(*s) + s->bytes_allocated + s->part_n * sizeof(float);
	if (s->scratch)
		n += scratch_array_bytes(s->n_scratch, s->scratch_group, s->prep_bytes, s->prep_bytes,
					 sh->head_dim);
	for (int l = 0; l < sh->n_layers; l++) {
		n += sizeof(KvLayer) + (size_t)sh->n_kv_heads * sizeof(KvHead);
		for (int h = 0; h < sh->n_kv_heads; h++) {
			const KvHead *H = &s->layers[l].heads[h];
			n += (size_t)H->cap_blocks * sizeof(*H->blocks);
			n += H->k.ops->state_bytes(H->k.st) + H->v.ops->state_bytes(H->v.st);
		}
	}
	return n;
}

/* ---- blocks and append ---- */

/* Block index of (layer, head), allocated (zeroed) if needed; NULL on -ENOMEM. */
static uint8_t *head_block(KvStore *s, const KvLayer *L, KvHead *H, int64_t index)
{
	if (index >= H->cap_blocks) {
		int64_t cap = MAX(index + 1, 2 * H->cap_blocks);
		int64_t max_blocks = (s->base.shape.capacity + BT - 1) / BT;
		cap = MIN(cap, max_blocks);
		assert(index < cap);
		uint8_t **grown = realloc(H->blocks, (size_t)cap * sizeof(*grown));
		if (!grown)
			return NULL;
		memset(grown + H->cap_blocks, 0, (size_t)(cap - H->cap_blocks) * sizeof(*grown));
		H->blocks = grown;
		H->cap_blocks = cap;
	}
	if (!H->blocks[index]) {
		size_t bytes = BT * (L->k_bytes + L->v_bytes);
		H->blocks[index] = calloc(1, bytes);
		if (!H->blocks[index])
			return NULL;
		s->bytes_allocated += bytes;
		H->lo = MIN(H->lo, index); /* a rewound cache filled again from the start */
	}
	return H->blocks[index];
}

/*
 * A windowed layer lets go of its blocks below first: no query from here
 * on sees them (kvcache.h). Freed, not recycled: the allocator keeps a
 * block of a few KB at hand, and the layer's memory stays bounded by its
 * window.
 */
static void layer_drop_below(KvStore *s, KvLayer *L, int64_t first)
{
	if (!L->window || s->keep_all)
		return;
	size_t bytes = BT * (L->k_bytes + L->v_bytes);
	for (int h = 0; h < s->base.shape.n_kv_heads; h++) {
		KvHead *H = &L->heads[h];
		for (int64_t b = H->lo; b < MIN(first, H->cap_blocks); b++)
			if (H->blocks[b]) {
				free(H->blocks[b]);
				H->blocks[b] = NULL;
				s->bytes_allocated -= bytes;
			}
		H->lo = MAX(H->lo, first);
	}
}

/* When the cache grows to n tokens, the windowed layers keep what a query at n still sees. */
static void store_set_n_tokens(KvCache *kv, int64_t n)
{
	KvStore *s = store_of(kv);
	if (n <= kv->n_tokens)
		return; /* a rewind keeps everything it has */
	for (int l = 0; l < kv->shape.n_layers; l++)
		layer_drop_below(s, &s->layers[l], kvcache_window_first_block(&kv->shape, l, n));
}

/* The lowest n > 0 at which every windowed layer still holds what the query at n sees. */
static int64_t store_rewind_floor(const KvCache *kv)
{
	const KvStore *s = store_of(kv);
	int64_t floor = 0;
	for (int l = 0; l < kv->shape.n_layers; l++) {
		const KvLayer *L = &s->layers[l];
		int64_t lo = L->heads[0].lo;
		if (L->window && lo > 0)
			floor = MAX(floor, lo * BT + L->window - 1);
	}
	return floor;
}

int kvstore_block_put(KvCache *kv, int layer, int head, int64_t index, const void *bytes,
		      size_t len)
{
	KvStore *s = store_of(kv);
	KvLayer *L = &s->layers[layer];
	if (index < 0 || index >= (kv->shape.capacity + BT - 1) / BT ||
	    len != BT * (L->k_bytes + L->v_bytes))
		return -EINVAL;
	uint8_t *b = head_block(s, L, &L->heads[head], index);
	if (!b)
		return -ENOMEM;
	memcpy(b, bytes, len);
	return 0;
}

int kvstore_fix(KvCache *kv, int layer, int64_t n_tok, const float *k, const float *v)
{
	assert(layer >= 0 && layer < kv->shape.n_layers && n_tok >= 0);
	KvLayer *L = &store_of(kv)->layers[layer];
	int d = kv->shape.head_dim;
	size_t row = (size_t)kv->shape.n_kv_heads * d;
	int r;
	for (int h = 0; h < kv->shape.n_kv_heads && n_tok > 0; h++) {
		KvHead *H = &L->heads[h];
		if ((H->k.ops->fix && (r = H->k.ops->fix(H->k.st, k + (size_t)h * d, n_tok, row))) ||
		    (H->v.ops->fix && (r = H->v.ops->fix(H->v.st, v + (size_t)h * d, n_tok, row))))
			return r;
	}
	return 0;
}

static void store_observe(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *q)
{
	KvLayer *L = &store_of(kv)->layers[layer];
	const KvCacheShape *sh = &kv->shape;
	int G = sh->n_heads / sh->n_kv_heads;
	size_t qrow = (size_t)sh->n_heads * sh->head_dim;
	for (int h = 0; h < sh->n_kv_heads && n_tok > 0; h++) {
		KvSide *ks = &L->heads[h].k;
		if (ks->ops->observe)
			ks->ops->observe(ks->st, pos0, n_tok, q + (size_t)h * G * sh->head_dim, qrow);
	}
}

static int store_append(KvCache *kv, int layer, int64_t pos0, int64_t n_tok, const float *k,
			const float *v)
{
	KvStore *s = (KvStore *)kv;
	KvLayer *L = &s->layers[layer];
	int d = kv->shape.head_dim;
	size_t row = (size_t)kv->shape.n_kv_heads * d;
	int r;

	if (n_tok == 0)
		return 0;
	/* what the batch's first query no longer sees goes before new blocks come */
	layer_drop_below(s, L, kvcache_first_visible(&kv->shape, layer, pos0) / BT);
	for (int h = 0; h < kv->shape.n_kv_heads; h++) {
		KvHead *H = &L->heads[h];
		for (int64_t b = pos0 / BT; b <= (pos0 + n_tok - 1) / BT; b++)
			if (!head_block(s, L, H, b))
				return -ENOMEM;
		KvSideRows kr = side_rows(L, H, KV_ROLE_K), vr = side_rows(L, H, KV_ROLE_V);
		if ((r = H->k.ops->append(H->k.st, &kr, pos0, n_tok, k + (size_t)h * d, row)) ||
		    (r = H->v.ops->append(H->v.st, &vr, pos0, n_tok, v + (size_t)h * d, row)))
			return r;
	}
	return 0;
}

/* ---- attention ---- */

/*
 * Partials: part (n_tok, n_kv_heads, n_chunks, group, d + 2): for each
 * query head of the group, acc (d,) in the stored domain, then the
 * running max m and sum l of exp(score - m) over the item's blocks.
 *
 * Work items are (tile, kv-head, chunk): a tile is up to `tile`
 * consecutive tokens of the batch. The blocks below the first token's own
 * block are whole and seen by every token of the tile: they are read once
 * for all of its query heads (G x tokens of them at once, as one group of
 * the kernels). The blocks from there on (the diagonal: partly visible,
 * and a token's own block that pk reads exact) go token by token. Each
 * (token, head) still sees its blocks in ascending order through one
 * online softmax, and the kernels treat every head alike, so the outputs
 * do not depend on the tile (test-kvstore checks tiles of 1 against the
 * default bit for bit).
 */
typedef struct AttendJob {
	const KvStore *s;
	const KvLayer *L;
	int64_t pos0, n_tok;
	int layer;
	int64_t base;          /* the first block any token of the batch sees (windowed layers) */
	int group;             /* query heads per kv-head */
	int tile;              /* tokens per tile */
	int64_t n_tiles;
	int64_t n_chunks;
	int64_t chunk_blocks;  /* blocks per chunk */
	const float *q;        /* (n_tok, n_heads, d) */
	float *part;
	float *out;            /* (n_tok, n_heads, d) */
	AttendScratch *scratch; /* (threads,) */
	KvAttnSoftmaxFn softmax;
} AttendJob;

static void scratch_free(AttendScratch *sc)
{
	free(sc->prep);
	free(sc->prep1);
	free(sc->q);
	free(sc->scores);
	free(sc->ml);
	free(sc->acc);
	*sc = (AttendScratch){ 0 };
}

static AttendScratch *scratch_array_free(AttendScratch *sc, int n)
{
	for (int i = 0; sc && i < n; i++)
		scratch_free(&sc[i]);
	free(sc);
	return NULL;
}

/*
 * Scratch for nth threads, tiles of rows query heads (prepared in prep
 * bytes; one token's in prep1 bytes) of head_dim d. NULL on -ENOMEM.
 */
static AttendScratch *scratch_array_new(int nth, int rows, size_t prep, size_t prep1, int d)
{
	AttendScratch *a = calloc_array((size_t)nth, sizeof(AttendScratch));
	for (int i = 0; a && i < nth; i++) {
		AttendScratch *sc = &a[i];
		sc->prep = malloc(prep ? prep : 1);
		sc->prep1 = malloc(prep1 ? prep1 : 1);
		sc->q = malloc_array((size_t)rows * d, sizeof(float));
		sc->scores = malloc_array((size_t)rows * BT, sizeof(float));
		sc->ml = malloc_array((size_t)rows * 3, sizeof(float));
		sc->acc = malloc_array((size_t)rows * (d + 2), sizeof(float));
		if (!sc->prep || !sc->prep1 || !sc->q || !sc->scores || !sc->ml || !sc->acc)
			return scratch_array_free(a, nth);
	}
	return a;
}

/* Bytes of scratch_array_new()'s arrays. */
static size_t scratch_array_bytes(int nth, int rows, size_t prep, size_t prep1, int d)
{
	return (size_t)nth * (sizeof(AttendScratch) + prep + prep1 +
			      (size_t)rows * (2 * (size_t)d + 2 + BT + 3) * sizeof(float));
}

static void store_scratch_free(KvStore *s)
{
	s->scratch = scratch_array_free(s->scratch, s->n_scratch);
	s->n_scratch = 0;
	s->prep_bytes = 0;
}

/*
 * The scratch a cache keeps between calls: one token's query heads per
 * thread (decode). A prefill's tiles get theirs for the call only, so a
 * cache at rest holds kilobytes, not the megabytes of a tile's prepared
 * queries. 0 or -ENOMEM.
 */
static int store_scratch_reserve(KvStore *s, int nth, int G, size_t prep)
{
	if (nth <= s->n_scratch && G <= s->scratch_group && prep <= s->prep_bytes)
		return 0;
	store_scratch_free(s);
	if (!(s->scratch = scratch_array_new(nth, G, prep, prep, s->base.shape.head_dim)))
		return -ENOMEM;
	s->n_scratch = nth;
	s->scratch_group = G;
	s->prep_bytes = prep;
	return 0;
}

/*
 * Blocks b0..b1-1 for the nh query heads q (nh, d), prepared in prep, at
 * rows of the running state sc->acc / ml starting at row (stride R of the
 * ml arrays): scores, online softmax, values. own: the querying token's
 * block (-1 for a tile's shared blocks), n_ctx: its context (the last
 * block may be partial), lo: the first position it sees (a windowed
 * layer's edge may cut the first block: the rows below lo get weight
 * exactly 0, and the softmax's max and sum never see them).
 */
static void attend_blocks(const AttendJob *j, const KvHead *H, AttendScratch *sc, const float *q,
			  const void *prep, int nh, int row, int R, int64_t b0, int64_t b1, int64_t own,
			  int64_t n_ctx, int64_t lo)
{
	const KvLayer *L = j->L;
	int d = j->s->base.shape.head_dim;
	float scale = 1.0f / sqrtf((float)d);
	float *m = sc->ml + row, *l = sc->ml + R + row, *corr = sc->ml + 2 * R + row;
	float *acc = sc->acc + (size_t)row * (d + 2), *scores = sc->scores + (size_t)row * BT;
	KvSideRows krows = side_rows(L, H, KV_ROLE_K);
	size_t blk_bytes = BT * (L->k_bytes + L->v_bytes);
	for (int64_t b = b0; b < b1; b++) {
		const uint8_t *blk = H->blocks[b];
		int nj = (int)MIN((int64_t)BT, n_ctx - b * BT);
		int skip = (int)MAX((int64_t)0, lo - b * BT); /* < nj: lo <= the token's position */
		/*
		 * Blocks are separate allocations, so the hardware prefetcher
		 * stops at each block's end: ask for the next one while this
		 * one is scored (all of it: keys and values are both read).
		 */
		if (b + 1 < b1)
			for (size_t off = 0; off < blk_bytes; off += 64)
				__builtin_prefetch(H->blocks[b + 1] + off, 0, 3);
		/* scores: each key row read once for all nh query heads */
		H->k.ops->scores(H->k.st, &krows, q, prep, nh, b, own, nj, scale, scores, BT);
		/* online softmax: rescale what came before to the new running max */
		j->softmax(scores + skip, BT, nh, nj - skip, m, l, corr);
		for (int g = 0; skip && g < nh; g++)
			memset(scores + (size_t)g * BT, 0, (size_t)skip * sizeof(float));
		for (int g = 0; g < nh; g++)
			if (corr[g] != 1.0f)
				for (int x = 0; x < d; x++)
					acc[g * (d + 2) + x] *= corr[g];
		/* values, in the stored domain */
		H->v.ops->values(H->v.st, blk + BT * L->k_bytes, b, scores, BT, nh, nj, acc, d + 2);
	}
}

/* One work item: the query heads of kv-head h at the tokens of a tile, over the blocks of chunk c. */
static void attend_item(const AttendJob *j, AttendScratch *sc, int64_t tile, int h, int64_t c)
{
	const KvCacheShape *sh = &j->s->base.shape;
	const KvHead *H = &j->L->heads[h];
	int d = sh->head_dim, G = j->group;
	int64_t t0 = tile * j->tile, t1 = MIN(j->n_tok, t0 + j->tile);
	int nq = (int)(t1 - t0), R = nq * G;
	int64_t last_blocks = (j->pos0 + t1 - 1) / BT + 1; /* of the tile's last token */
	int64_t cb0 = j->base + c * j->chunk_blocks, cb1 = MIN(last_blocks, cb0 + j->chunk_blocks);
	/*
	 * Whole blocks every token of the tile sees: below the first token's
	 * own block and, in a windowed layer, at or above the last token's
	 * first visible position. Shared by the tile: [sh0, sh1).
	 */
	int64_t lo_last = kvcache_first_visible(sh, j->layer, j->pos0 + t1 - 1);
	int64_t sh0 = MAX(cb0, (lo_last + BT - 1) / BT), sh1 = MIN(cb1, (j->pos0 + t0) / BT);
	if (nq < 2 || sh0 >= sh1)
		sh0 = sh1 = cb0; /* none */

	for (int r = 0; r < R; r++) {
		memset(sc->acc + (size_t)r * (d + 2), 0, (size_t)d * sizeof(float));
		sc->ml[r] = -INFINITY;
		sc->ml[R + r] = 0.0f;
	}
	/*
	 * Every (token, head) sees its blocks in ascending order: first the
	 * window's lower edge below sh0 token by token, then the shared
	 * blocks, then the diagonal from sh1 up.
	 */
	for (int i = 0; i < nq; i++) {
		int64_t n_ctx = j->pos0 + t0 + i + 1, lo = kvcache_first_visible(sh, j->layer, n_ctx - 1);
		int64_t b0 = MAX(cb0, lo / BT), b1 = MIN(sh0, MIN(cb1, (n_ctx + BT - 1) / BT));
		const float *qt = j->q + ((size_t)(t0 + i) * sh->n_heads + (size_t)h * G) * d; /* (G, d) */
		if (b0 >= b1)
			continue;
		H->k.ops->query(H->k.st, qt, G, sc->prep1);
		attend_blocks(j, H, sc, qt, sc->prep1, G, i * G, R, b0, b1, (n_ctx - 1) / BT, n_ctx, lo);
	}
	if (sh0 < sh1) {
		/* the tile's query heads, token-major (nq, G, d), as one group */
		for (int i = 0; i < nq; i++)
			memcpy(sc->q + (size_t)i * G * d, j->q + ((size_t)(t0 + i) * sh->n_heads + (size_t)h * G) * d,
			       (size_t)G * d * sizeof(float));
		H->k.ops->query(H->k.st, sc->q, R, sc->prep);
		attend_blocks(j, H, sc, sc->q, sc->prep, R, 0, R, sh0, sh1, -1, j->pos0 + t0 + 1, 0);
	}
	for (int i = 0; i < nq; i++) {
		int64_t n_ctx = j->pos0 + t0 + i + 1, lo = kvcache_first_visible(sh, j->layer, n_ctx - 1);
		int64_t b0 = MAX(MAX(cb0, sh1), lo / BT), b1 = MIN(cb1, (n_ctx + BT - 1) / BT);
		const float *qt = j->q + ((size_t)(t0 + i) * sh->n_heads + (size_t)h * G) * d; /* (G, d) */
		if (b0 >= b1)
			continue;
		H->k.ops->query(H->k.st, qt, G, sc->prep1);
		attend_blocks(j, H, sc, qt, sc->prep1, G, i * G, R, b0, b1, (n_ctx - 1) / BT, n_ctx, lo);
	}
	for (int i = 0; i < nq; i++) {
		float *part = j->part + (((t0 + i) * sh->n_kv_heads + h) * j->n_chunks + c) * G * (d + 2);
		for (int g = 0; g < G; g++) {
			int r = i * G + g;
			memcpy(part + g * (d + 2), sc->acc + (size_t)r * (d + 2), (size_t)d * sizeof(float));
			part[g * (d + 2) + d] = sc->ml[r];
			part[g * (d + 2) + d + 1] = sc->ml[R + r];
		}
	}
}

static void attend_task(void *ctx, int ith, int nth)
{
	const AttendJob *j = ctx;
	const KvCacheShape *sh = &j->s->base.shape;
	int64_t n_items = j->n_tiles * sh->n_kv_heads * j->n_chunks;
	AttendScratch *sc = &j->scratch[ith];
	/* strided: causal items grow with the tile, so interleave them across threads */
	for (int64_t i = ith; i < n_items; i += nth) {
		int64_t c = i % j->n_chunks;
		int64_t th = i / j->n_chunks;
		attend_item(j, sc, th / sh->n_kv_heads, (int)(th % sh->n_kv_heads), c);
	}
}

/* Merge the chunks of each (token, query head), normalise, finish into out. */
static void combine_task(void *ctx, int ith, int nth)
{
	const AttendJob *j = ctx;
	const KvCacheShape *sh = &j->s->base.shape;
	int G = j->group, d = sh->head_dim;
	long begin, end;
	threadpool_split((long)(j->n_tok * sh->n_heads), ith, nth, &begin, &end);
	for (long i = begin; i < end; i++) {
		int64_t t = i / sh->n_heads;
		int hq = (int)(i % sh->n_heads), h = hq / G, g = hq % G;
		const KvSide *vs = &j->L->heads[h].v;
		const float *base = j->part + (t * sh->n_kv_heads + h) * j->n_chunks * G * (d + 2);
		float acc[TQ_MAX_DIM];
		float m = -INFINITY, l = 0.0f;
		for (int64_t c = 0; c < j->n_chunks; c++)
			m = fmaxf(m, base[(c * G + g) * (d + 2) + d]);
		memset(acc, 0, (size_t)d * sizeof(float));
		for (int64_t c = 0; c < j->n_chunks; c++) {
			const float *p = base + (c * G + g) * (d + 2);
			if (p[d + 1] == 0.0f)
				continue; /* an empty chunk */
			float w = expf(p[d] - m);
			l += w * p[d + 1];
			for (int x = 0; x < d; x++)
				acc[x] += w * p[x];
		}
		float inv = 1.0f / l;
		for (int x = 0; x < d; x++)
			acc[x] *= inv;
		vs->ops->finish(vs->st, acc, j->out + ((size_t)t * sh->n_heads + hq) * d);
	}
}

/* How many block ranges each (tile, kv-head) is split into, and their length. */
static void choose_split(const KvStore *s, ThreadPool *tp, int64_t base, int64_t pos0, int64_t n_tok,
			 int64_t n_tiles, int64_t *ret_chunks, int64_t *ret_chunk_blocks)
{
	int64_t max_blocks = (pos0 + n_tok + BT - 1) / BT - base; /* from the first block seen */
	int64_t items = n_tiles * s->base.shape.n_kv_heads;
	int nth = tp ? threadpool_n_threads(tp) : 1;
	int64_t per = max_blocks;
	if (s->split_blocks > 0)
		per = s->split_blocks;
	else if (items < 2 * nth && max_blocks >= 2 * KVSTORE_SPLIT_MIN_BLOCKS) {
		/*
		 * Few items (decode: one per kv-head): split the context so the
		 * threads get equal shares, e.g. 3 kv-heads on 2 threads -> 2
		 * chunks each, 6 items, not 2 + 1.
		 */
		int64_t chunks = (nth + items - 1) / items;
		while (chunks < 4 * nth && (items * chunks) % nth)
			chunks++;
		chunks = MIN(chunks, max_blocks / KVSTORE_SPLIT_MIN_BLOCKS);
		per = (max_blocks + chunks - 1) / chunks;
	}
	*ret_chunk_blocks = per;
	*ret_chunks = (max_blocks + per - 1) / per;
}

static int store_attend(KvCache *kv, ThreadPool *tp, int layer, int64_t pos0, int64_t n_tok,
			const float *q, float *out)
{
	KvStore *s = (KvStore *)kv;
	const KvCacheShape *sh = &kv->shape;
	const KvLayer *L = &s->layers[layer];
	if (n_tok <= 0)
		return 0;
	/* every block the queries see was appended, and none was dropped */
	int64_t last = (pos0 + n_tok - 1) / BT, base = kvcache_first_visible(sh, layer, pos0) / BT;
	for (int h = 0; h < sh->n_kv_heads; h++)
		if (last >= L->heads[h].cap_blocks || !L->heads[h].blocks[last] || base < L->heads[h].lo)
			return -EINVAL;
	int G = sh->n_heads / sh->n_kv_heads;
	AttendJob j = {
		.s = s, .L = L, .pos0 = pos0, .n_tok = n_tok, .layer = layer, .base = base, .group = G,
		.q = q, .out = out,
		/* a tile's heads are one group of the kernels: at most KVPK_MAX_GROUP */
		.tile = (int)MAX(1, MIN((int64_t)s->tile_tokens, MIN(n_tok, (int64_t)(KVPK_MAX_GROUP / G)))),
	};
	j.n_tiles = (n_tok + j.tile - 1) / j.tile;
	choose_split(s, tp, base, pos0, n_tok, j.n_tiles, &j.n_chunks, &j.chunk_blocks);

	size_t n;
	if (size_mul_overflows((size_t)n_tok * sh->n_heads, (size_t)j.n_chunks, &n) ||
	    size_mul_overflows(n, (size_t)sh->head_dim + 2, &n))
		return -ENOMEM;
	if (n > s->part_n) {
		float *grown = realloc(s->part, n * sizeof(float));
		if (!grown)
			return -ENOMEM;
		s->part = grown;
		s->part_n = n;
	}
	j.part = s->part;
	const KvSide *ks = &L->heads[0].k;
	int nth = tp ? threadpool_n_threads(tp) : 1;
	_cleanup_(freep) AttendScratch *tiles = NULL; /* a prefill's, for this call */
	if (j.tile > 1) {
		tiles = scratch_array_new(nth, j.tile * G, ks->ops->query_bytes(ks->st, j.tile * G),
					  ks->ops->query_bytes(ks->st, G), sh->head_dim);
		if (!tiles)
			return -ENOMEM;
		j.scratch = tiles;
	} else {
		if (store_scratch_reserve(s, nth, G, ks->ops->query_bytes(ks->st, G)) < 0)
			return -ENOMEM;
		j.scratch = s->scratch;
	}
	j.softmax = kv_attn_softmax_get();
	threadpool_run(tp, attend_task, &j);
	threadpool_run(tp, combine_task, &j);
	for (int i = 0; tiles && i < nth; i++)
		scratch_free(&tiles[i]);
	return 0;
}

/* ---- session files (kvcache.h's KvCacheFileOps): each format's own record ---- */

static uint64_t file_seed(const KvCache *kv)
{
	return kvstore_seed(kv);
}

static size_t file_block_bytes(const KvCache *kv, int layer)
{
	return kvstore_block_bytes(kv, layer);
}

/* Rows of block index below n_kv (0..32). */
static int rows_below(int64_t index, int64_t n_kv)
{
	return (int)MAX(0, MIN((int64_t)BT, n_kv - index * BT));
}

/* Bytes of one side's region of block index in a file: the format's say, or its n rows. */
static size_t region_file_bytes(const KvSide *side, int64_t index, int n, size_t row_bytes)
{
	if (n == 0)
		return 0;
	return side->ops->region_file_bytes ? side->ops->region_file_bytes(side->st, index, n)
					    : (size_t)n * row_bytes;
}

/* The full block as the CUDA cache moves it: rows < n then zeros; a format's region as its file holds it. */
static void region_save(const KvSide *side, const uint8_t *region, int64_t index, int n,
			size_t row_bytes, uint8_t *out)
{
	size_t bytes = region_file_bytes(side, index, n, row_bytes);
	if (side->ops->region_save)
		side->ops->region_save(side->st, region, index, n, out);
	else
		memcpy(out, region, bytes);
	memset(out + bytes, 0, BT * row_bytes - bytes);
}

static void file_block_save(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			    uint8_t *out)
{
	const KvLayer *L = &store_of(kv)->layers[layer];
	const KvHead *H = &L->heads[head];
	const uint8_t *b = index < H->cap_blocks ? H->blocks[index] : NULL;
	int n = rows_below(index, n_kv);
	if (!b || n == 0) {
		memset(out, 0, BT * (L->k_bytes + L->v_bytes));
		return;
	}
	region_save(&H->k, b, index, n, L->k_bytes, out);
	region_save(&H->v, b + BT * L->k_bytes, index, n, L->v_bytes, out + BT * L->k_bytes);
}

static size_t file_block_file_bytes(const KvCache *kv, int layer, int head, int64_t index,
				    int64_t n_kv)
{
	const KvLayer *L = &store_of(kv)->layers[layer];
	const KvHead *H = &L->heads[head];
	int n = rows_below(index, n_kv);
	return region_file_bytes(&H->k, index, n, L->k_bytes) + region_file_bytes(&H->v, index, n, L->v_bytes);
}

/* The K region's file bytes, then the V region's (session.h, LAYER). */
static void file_block_pack(const KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			    uint8_t *out)
{
	const KvLayer *L = &store_of(kv)->layers[layer];
	const KvHead *H = &L->heads[head];
	const uint8_t *b = index < H->cap_blocks ? H->blocks[index] : NULL;
	int n = rows_below(index, n_kv);
	size_t kb = region_file_bytes(&H->k, index, n, L->k_bytes);
	size_t vb = region_file_bytes(&H->v, index, n, L->v_bytes);
	if (!b) {
		memset(out, 0, kb + vb);
		return;
	}
	const uint8_t *kr = b, *vr = b + BT * L->k_bytes;
	if (H->k.ops->region_save && kb)
		H->k.ops->region_save(H->k.st, kr, index, n, out);
	else
		memcpy(out, kr, kb);
	if (H->v.ops->region_save && vb)
		H->v.ops->region_save(H->v.st, vr, index, n, out + kb);
	else
		memcpy(out + kb, vr, vb);
}

static int file_block_unpack(KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			     const uint8_t *in)
{
	KvStore *st = store_of(kv);
	KvLayer *L = &st->layers[layer];
	KvHead *H = &L->heads[head];
	if (index < 0 || index >= (kv->shape.capacity + BT - 1) / BT)
		return -EINVAL;
	uint8_t *b = head_block(st, L, H, index);
	if (!b)
		return -ENOMEM;
	int n = rows_below(index, n_kv);
	size_t kb = region_file_bytes(&H->k, index, n, L->k_bytes);
	size_t vb = region_file_bytes(&H->v, index, n, L->v_bytes);
	memset(b, 0, BT * (L->k_bytes + L->v_bytes));
	memcpy(b, in, kb);
	memcpy(b + BT * L->k_bytes, in + kb, vb);
	return 0;
}

/* A windowed layer's file holds what a query at n_kv still sees. */
static int64_t file_first_block(const KvCache *kv, int layer, int64_t n_kv)
{
	return kvcache_window_first_block(&kv->shape, layer, n_kv);
}

static int file_block_load(KvCache *kv, int layer, int head, int64_t index, int64_t n_kv,
			   const uint8_t *in)
{
	return kvstore_block_put(kv, layer, head, index, in, kvstore_block_bytes(kv, layer));
}

static KvSide *file_side(const KvCache *kv, int layer, int head, int role)
{
	return side_of(&store_of(kv)->layers[layer].heads[head], (KvRole)role);
}

static uint32_t file_record_tag(const KvCache *kv, int layer, int head, int role)
{
	return file_side(kv, layer, head, role)->ops->tag;
}

static size_t file_record_bytes(const KvCache *kv, int layer, int head, int role, int64_t n_kv)
{
	const KvSide *side = file_side(kv, layer, head, role);
	return side->ops->record_bytes(side->st, n_kv);
}

static int file_record_save(const KvCache *kv, int layer, int head, int role, int64_t n_kv,
			    uint8_t *out, Error *err)
{
	const KvLayer *L = &store_of(kv)->layers[layer];
	const KvSide *side = file_side(kv, layer, head, role);
	KvSideRows rows = side_rows(L, &L->heads[head], (KvRole)role);
	int r = side->ops->record_save(side->st, &rows, n_kv, out);
	if (r)
		return error_set(err, r, "layer %d head %d %s: the %s state cannot be saved yet", layer,
				 head, role ? "V" : "K", side->ops->name);
	return 0;
}

static int file_record_load(KvCache *kv, int layer, int head, int role, int64_t n_kv,
			    const uint8_t *in, Error *err)
{
	const KvLayer *L = &store_of(kv)->layers[layer];
	KvSide *side = file_side(kv, layer, head, role);
	KvSideRows rows = side_rows(L, &L->heads[head], (KvRole)role);
	rows.first = MAX(rows.first, kvcache_window_first_block(&kv->shape, layer, n_kv));
	Error e = { 0 };
	int r = side->ops->record_load(side->st, &rows, n_kv, in, &e);
	if (r < 0)
		return error_set(err, r, "layer %d head %d %s: %s", layer, head, role ? "V" : "K", e.msg);
	if (r)
		return error_set(err, r == KVFORMAT_E_OTHER_TYPE ? KVCACHE_E_OTHER_TYPE : KVCACHE_E_CORRUPT,
				 "layer %d head %d %s (%s): %s", layer, head, role ? "V" : "K",
				 side->ops->name, e.msg);
	return 0;
}

static const KvCacheFileOps kvstore_file_ops = {
	.kind = 1,
	.seed = file_seed,
	.block_bytes = file_block_bytes,
	.block_save = file_block_save,
	.block_load = file_block_load,
	.block_file_bytes = file_block_file_bytes,
	.block_pack = file_block_pack,
	.block_unpack = file_block_unpack,
	.first_block = file_first_block,
	.record_tag = file_record_tag,
	.record_bytes = file_record_bytes,
	.record_save = file_record_save,
	.record_load = file_record_load,
};

static const KvCacheOps kvstore_ops = {
	.name = "kvstore",
	.observe = store_observe,
	.append = store_append,
	.attend = store_attend,
	.set_n_tokens = store_set_n_tokens,
	.rewind_floor = store_rewind_floor,
	.bytes_per_token = store_bytes_per_token,
	.memory_bytes = store_memory_bytes,
	.file = &kvstore_file_ops,
	.free = store_free,
};
