/*
 * kvstore.c: the compressed KV cache of kvstore.h: blocks, quantize on
 * write, and attention on stored rows: the block loop, online softmax
 * and flash-decoding split here, the per-block score / softmax / value
 * kernels in kernels/cpu/kv_attn.h (scalar references and AVX2 twins).
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/kvpk.h"
#include "engine/kv/kvquant.h"
#include "engine/codec/rotation.h"
#include "engine/kv/kvstore.h"
#include "kernels/cpu/kv_attn.h"

#define BT KVSTORE_BLOCK_TOKENS
static_assert(KVPK_BLOCK == KVSTORE_BLOCK_TOKENS, "pk blocks are the store's blocks");
#define KVSTORE_SEED_DOMAIN 0x6b7673746f726531ull /* "kvstore1" */
#define KVSTORE_SPLIT_MIN_BLOCKS 8                /* auto split: at least 256 tokens per item */

/* One (layer, kv-head, K or V). */
typedef struct KvSide {
	KvType type;           /* TQ: this side's seeds (and mask, once chosen) */
	TqCodec *codec;        /* TQ only; NULL until an outlier mask is chosen */
	KvAttnRows rows;       /* the stored rows as the attention kernels read them */
	/* +c keys only (kvtype.h) */
	float *center;         /* (d,) mu; zeros until center_chosen */
	float *first_keys;     /* (BT, d) the keys of block 0 (positions 0..31), exact */
	bool center_chosen;
	/* pk keys only (kvpk.h) */
	KvPk pk;
	float *qe;             /* (BT, d/2) query energy per pair at positions 0..31 */
	float *w;              /* (d/2) sum of qe over positions 1..31, once w_chosen */
	bool w_chosen;
	float *stage;          /* (stage_cap, d) keys of positions stage_pos.. */
	int64_t stage_cap, stage_pos; /* stage_pos: a block start >= BT */
	int64_t pk_blocks;     /* blocks 1..pk_blocks-1 are coded */
} KvSide;

typedef struct KvHead {
	KvSide k, v;
	uint8_t **blocks;   /* (cap_blocks,) NULL = not allocated */
	int64_t cap_blocks;
} KvHead;

typedef struct KvLayer {
	KvLayerTypes types; /* as planned */
	size_t k_bytes, v_bytes;
	KvHead *heads;      /* (n_kv_heads,) */
} KvLayer;

typedef struct KvStore {
	KvCache base;
	uint64_t seed;
	int split_blocks;         /* kvstore_set_split() */
	KvLayer *layers;          /* (n_layers,) */
	size_t bytes_allocated;   /* block payload */
	float *part;              /* attention partials, see AttendJob */
	size_t part_n;
	struct AttendScratch *scratch; /* (n_scratch,) one per pool thread, kept */
	int n_scratch, scratch_group;
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

/* ---- seeds and codecs ---- */

void kvstore_derive_seeds(uint64_t seed, int layer, int head, KvRole role, uint64_t *ret_rot_seed,
			  uint64_t *ret_qjl_seed)
{
	uint64_t key = (uint64_t)layer << 32 | (uint64_t)head << 1 | (uint64_t)role;
	Rng rng;
	rng_init(&rng, seed ^ (KVSTORE_SEED_DOMAIN + key * 0x9e3779b97f4a7c15ull));
	uint64_t rot = rng_next(&rng), qjl;
	do
		qjl = rng_next(&rng);
	while (qjl == 0 || qjl == rot || qjl == tq_seed_mix(rot));
	*ret_rot_seed = rot;
	*ret_qjl_seed = qjl;
}

static bool side_is_tq(const KvSide *s)
{
	return s->type.format == KV_FORMAT_TQ;
}

static bool side_is_pk(const KvSide *s)
{
	return s->type.format == KV_FORMAT_PK;
}

/*
 * The first position the stage keeps between attentions: the last coded
 * block stays exact too, so a rewind of up to 32 tokens (a chat turn
 * re-rendered a little differently) codes nothing twice.
 */
static int64_t pk_keep_from(const KvSide *side)
{
	return MAX((int64_t)BT, (side->pk_blocks - 1) * BT);
}

/* The stage row of position p (stage_pos <= p). */
static const float *pk_stage_row(const KvSide *side, int64_t p)
{
	return side->stage + (size_t)(p - side->stage_pos) * side->type.dim;
}

/* Room for the stage to hold rows rows (growing at least twofold). 0 or -ENOMEM. */
static int pk_stage_reserve(KvSide *side, int64_t rows)
{
	if (rows <= side->stage_cap)
		return 0;
	int64_t cap = MAX(rows, 2 * side->stage_cap);
	float *grown = realloc(side->stage, (size_t)cap * side->type.dim * sizeof(float));
	if (!grown)
		return -ENOMEM;
	side->stage = grown;
	side->stage_cap = cap;
	return 0;
}

/* Build the codec of a TQ side whose descriptor is complete, and its kernel view. */
static int side_codec_new(KvSide *s, KvRole role, Error *err)
{
	(void)role; /* both roles read rows the same way */
	int r = tq_codec_new(&s->type.tq, &s->codec, err);
	if (r)
		return r;
	r = kv_attn_rows_init_tq(&s->rows, tq_codec_layout(s->codec), tq_codec_centroids(s->codec, true),
				 tq_codec_centroids(s->codec, false), tq_qjl_const(s->codec));
	if (r)
		return error_set(err, r, "TQ layout the attention kernels cannot read");
	return 0;
}

static void side_free(KvSide *s)
{
	s->codec = tq_codec_free(s->codec);
	free(s->center);
	free(s->first_keys);
	free(s->qe);
	free(s->w);
	free(s->stage);
	s->center = s->first_keys = s->qe = s->w = s->stage = NULL;
}

static KvAttnFormat attn_format(KvFormat f)
{
	switch (f) {
	case KV_FORMAT_F32: return KV_ATTN_F32;
	case KV_FORMAT_F16: return KV_ATTN_F16;
	case KV_FORMAT_Q8_0: return KV_ATTN_Q8_0;
	case KV_FORMAT_Q4_0: return KV_ATTN_Q4_0;
	case KV_FORMAT_TQ: break;
	case KV_FORMAT_PK: break;
	}
	return KV_ATTN_TQ;
}

/* Set up one side: seeds for TQ, the codec unless it waits for an outlier mask. */
static int side_init(KvSide *s, const KvType *t, uint64_t seed, int layer, int head, KvRole role,
		     Error *err)
{
	s->type = *t;
	if (t->centered) {
		s->center = calloc_array((size_t)t->dim, sizeof(float));
		s->first_keys = calloc_array((size_t)BT * t->dim, sizeof(float));
		if (!s->center || !s->first_keys)
			return error_set(err, -ENOMEM, "out of memory");
	}
	if (side_is_pk(s)) {
		s->qe = calloc_array((size_t)BT * t->dim / 2, sizeof(float));
		s->w = calloc_array((size_t)t->dim / 2, sizeof(float));
		s->pk_blocks = 1;
		s->stage_pos = BT;
		if (!s->qe || !s->w)
			return error_set(err, -ENOMEM, "out of memory");
		if (kvpk_init(&s->pk, t->dim, t->pk_bits, kvtype_vec_bytes(t)) < 0)
			return error_set(err, KVSTORE_E_PLAN, "layer %d: pk type the codec cannot read",
					 layer);
		return 0;
	}
	if (!side_is_tq(s)) {
		if (kv_attn_rows_init(&s->rows, attn_format(t->format), t->dim) < 0)
			return error_set(err, KVSTORE_E_PLAN, "layer %d: row shape the kernels cannot read",
					 layer);
		return 0;
	}
	uint64_t rot, qjl;
	kvstore_derive_seeds(seed, layer, head, role, &rot, &qjl);
	s->type.tq.rot_seed = rot;
	s->type.tq.qjl_seed = (s->type.tq.flags & TQ_FLAG_QJL) ? qjl : 0;
	if (s->type.tq.group == TQ_GROUP_OUTLIER_CHANNELS)
		return 0;
	return side_codec_new(s, role, err);
}

/* ---- construction ---- */

static void store_scratch_free(KvStore *s);

static void store_free(KvCache *kv)
{
	KvStore *s = (KvStore *)kv;
	if (s->layers)
		for (int l = 0; l < kv->shape.n_layers; l++) {
			KvLayer *L = &s->layers[l];
			if (!L->heads)
				continue;
			for (int h = 0; h < kv->shape.n_kv_heads; h++) {
				KvHead *H = &L->heads[h];
				side_free(&H->k);
				side_free(&H->v);
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

static int check_plan(const KvCacheShape *shape, const KvPlan *plan, Error *err)
{
	if (plan->n_layers != shape->n_layers || plan->n_kv_heads != shape->n_kv_heads ||
	    plan->head_dim != shape->head_dim)
		return error_set(err, KVSTORE_E_PLAN,
				 "plan for %d layers x %d kv-heads x %d, cache is %d x %d x %d",
				 plan->n_layers, plan->n_kv_heads, plan->head_dim, shape->n_layers,
				 shape->n_kv_heads, shape->head_dim);
	for (int l = 0; l < plan->n_layers; l++) {
		const KvLayerTypes *t = &plan->layers[l];
		for (int role = 0; role < 2; role++) {
			const KvType *ty = role ? &t->v : &t->k;
			if (ty->format == KV_FORMAT_PK && (role || !ty->centered))
				return error_set(err, KVSTORE_E_PLAN, "layer %d: pk values", l);
			if (ty->format == KV_FORMAT_PK && shape->n_heads / shape->n_kv_heads > KVPK_MAX_GROUP)
				return error_set(err, KVSTORE_E_PLAN,
						 "layer %d: pk keys take at most %d query heads per kv-head",
						 l, KVPK_MAX_GROUP);
			if (ty->dim != shape->head_dim ||
			    (ty->format != KV_FORMAT_TQ && ty->format != KV_FORMAT_PK &&
			     !kvquant_supports(ty)))
				return error_set(err, KVSTORE_E_PLAN, "layer %d: unsupported %s type",
						 l, role ? "V" : "K");
			if (ty->format == KV_FORMAT_TQ && ty->tq.dim != shape->head_dim)
				return error_set(err, KVSTORE_E_PLAN, "layer %d: TQ dim %d", l,
						 ty->tq.dim);
		}
		if (t->v.centered)
			return error_set(err, KVSTORE_E_PLAN, "layer %d: +c on values (keys only)", l);
		if (t->v.format == KV_FORMAT_TQ && (t->v.tq.flags & TQ_FLAG_QJL))
			return error_set(err, KVSTORE_E_PLAN,
					 "layer %d: QJL on values (values are averaged, not ranked)", l);
	}
	return 0;
}

int kvcache_new_quant(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		      Error *err)
{
	if (shape->n_layers <= 0 || shape->n_heads <= 0 || shape->n_kv_heads <= 0 ||
	    shape->head_dim <= 0 || shape->head_dim > TQ_MAX_DIM || shape->capacity <= 0 ||
	    shape->n_heads % shape->n_kv_heads)
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
	_cleanup_(kvcache_freep) KvCache *kv = &TAKE_PTR(raw)->base;
	KvStore *s = (KvStore *)kv;

	s->layers = calloc_array((size_t)shape->n_layers, sizeof(KvLayer));
	if (!s->layers)
		return error_set(err, -ENOMEM, "out of memory");
	for (int l = 0; l < shape->n_layers; l++) {
		KvLayer *L = &s->layers[l];
		L->types = plan->layers[l];
		L->k_bytes = kvtype_vec_bytes(&L->types.k);
		L->v_bytes = kvtype_vec_bytes(&L->types.v);
		L->heads = calloc_array((size_t)shape->n_kv_heads, sizeof(KvHead));
		if (!L->heads)
			return error_set(err, -ENOMEM, "out of memory");
		for (int h = 0; h < shape->n_kv_heads; h++) {
			KvHead *H = &L->heads[h];
			if ((r = side_init(&H->k, &L->types.k, seed, l, h, KV_ROLE_K, err)) ||
			    (r = side_init(&H->v, &L->types.v, seed, l, h, KV_ROLE_V, err)))
				return r;
		}
	}
	*ret = TAKE_PTR(kv);
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

int kvstore_tq_desc(const KvCache *kv, int layer, int head, KvRole role, TqDesc *ret)
{
	const KvHead *H = &store_of(kv)->layers[layer].heads[head];
	const KvSide *s = role == KV_ROLE_K ? &H->k : &H->v;
	if (!side_is_tq(s) || !s->codec)
		return KVSTORE_E_NO_DESC;
	*ret = *tq_codec_desc(s->codec);
	return 0;
}

int kvstore_tq_desc_put(KvCache *kv, int layer, int head, KvRole role, const TqDesc *desc,
			Error *err)
{
	KvHead *H = &store_of(kv)->layers[layer].heads[head];
	KvSide *s = role == KV_ROLE_K ? &H->k : &H->v;
	if (!side_is_tq(s))
		return error_set(err, KVSTORE_E_NO_DESC, "layer %d head %d %s: not a TurboQuant side", layer,
				 head, role == KV_ROLE_K ? "K" : "V");
	if (s->codec)
		return tq_desc_compare(desc, tq_codec_desc(s->codec), err);
	/* An outlier side waiting for its mask: everything but the mask must be as planned. */
	TqDesc expect = s->type.tq;
	memcpy(expect.mask, desc->mask, TQ_MASK_BYTES);
	int r = tq_desc_compare(desc, &expect, err);
	if (r == 0)
		r = tq_desc_validate(desc, err);
	if (r != 0)
		return r;
	s->type.tq = *desc;
	r = side_codec_new(s, role, err);
	if (r != 0) {
		side_free(s);
		memset(s->type.tq.mask, 0, TQ_MASK_BYTES);
	}
	return r;
}

int kvstore_key_center(const KvCache *kv, int layer, int head, bool *ret_chosen, float *center,
		       float *first_keys)
{
	const KvSide *s = &store_of(kv)->layers[layer].heads[head].k;
	if (!s->type.centered)
		return KVSTORE_E_NO_DESC;
	*ret_chosen = s->center_chosen;
	memcpy(center, s->center, (size_t)s->type.dim * sizeof(float));
	memcpy(first_keys, s->first_keys, (size_t)BT * s->type.dim * sizeof(float));
	return 0;
}

int kvstore_key_center_put(KvCache *kv, int layer, int head, bool chosen, const float *center,
			   const float *first_keys)
{
	KvSide *s = &store_of(kv)->layers[layer].heads[head].k;
	int d = s->type.dim;
	if (!s->type.centered)
		return KVSTORE_E_NO_DESC;
	for (int i = 0; i < d; i++)
		if (!isfinite(center[i]) || (!chosen && center[i] != 0.0f))
			return -EINVAL;
	for (int i = 0; i < BT * d; i++)
		if (!isfinite(first_keys[i]))
			return -EINVAL;
	memcpy(s->center, center, (size_t)d * sizeof(float));
	memcpy(s->first_keys, first_keys, (size_t)BT * d * sizeof(float));
	s->center_chosen = chosen;
	return 0;
}

int kvstore_pk_state(const KvCache *kv, int layer, int head, int64_t n_kv, bool *ret_chosen,
		     float *qe, float *w, float *tail)
{
	const KvSide *s = &store_of(kv)->layers[layer].heads[head].k;
	int d = s->type.dim;
	if (!side_is_pk(s))
		return KVSTORE_E_NO_DESC;
	int64_t whole = MAX(1, n_kv / BT);
	if (s->pk_blocks < whole || (n_kv >= BT && !s->w_chosen))
		return -EAGAIN;
	*ret_chosen = s->w_chosen;
	memcpy(qe, s->qe, (size_t)BT * d / 2 * sizeof(float));
	if (s->w_chosen)
		memcpy(w, s->w, (size_t)d / 2 * sizeof(float));
	else
		memset(w, 0, (size_t)d / 2 * sizeof(float));
	int64_t from = MAX((int64_t)BT, (whole - 1) * BT);
	memset(tail, 0, (size_t)2 * BT * d * sizeof(float));
	for (int64_t p = from; p < n_kv; p++) {
		float *y = tail + (size_t)(p - from) * d;
		if (p >= s->stage_pos) {
			memcpy(y, pk_stage_row(s, p), (size_t)d * sizeof(float));
			continue;
		}
		/*
		 * Rows appended past n_kv and attended (an evaluation that was
		 * then abandoned) coded later blocks and let these rows go:
		 * they read back from the codes, as the next append would.
		 */
		const KvHead *H = &store_of(kv)->layers[layer].heads[head];
		kvpk_decode_row(&s->pk, H->blocks[p / BT], (int)(p % BT), y);
		for (int i = 0; i < d; i++)
			y[i] += s->center[i];
	}
	return 0;
}

int kvstore_pk_put(KvCache *kv, int layer, int head, int64_t n_kv, bool chosen, const float *qe,
		   const float *w, const float *tail)
{
	KvHead *H = &store_of(kv)->layers[layer].heads[head];
	KvSide *s = &H->k;
	int d = s->type.dim;
	if (!side_is_pk(s))
		return KVSTORE_E_NO_DESC;
	int64_t whole = MAX(1, n_kv / BT);
	int64_t from = MAX((int64_t)BT, (whole - 1) * BT), n_tail = n_kv - from;
	if ((!chosen && n_kv >= BT) || (n_kv < BT && !qe))
		return -EINVAL;
	for (int i = 0; qe && i < BT * d / 2; i++)
		if (!isfinite(qe[i]) || qe[i] < 0)
			return -EINVAL;
	for (int i = 0; i < d / 2; i++)
		if (!isfinite(w[i]) || w[i] < 0 || (!chosen && w[i] != 0))
			return -EINVAL;
	for (int64_t i = 0; i < MAX(0, n_tail) * d; i++)
		if (!isfinite(tail[i]))
			return -EINVAL;
	for (int64_t b = 1; b < whole; b++)
		if (b >= H->cap_blocks || !H->blocks[b] || !kvpk_block_coded(&s->pk, H->blocks[b]))
			return -EINVAL;
	if (pk_stage_reserve(s, n_tail) < 0)
		return -ENOMEM;
	if (qe)
		memcpy(s->qe, qe, (size_t)BT * d / 2 * sizeof(float));
	else
		memset(s->qe, 0, (size_t)BT * d / 2 * sizeof(float));
	memcpy(s->w, w, (size_t)d / 2 * sizeof(float));
	s->w_chosen = chosen;
	s->pk_blocks = whole;
	s->stage_pos = from;
	if (n_tail > 0)
		memcpy(s->stage, tail, (size_t)n_tail * d * sizeof(float));
	return 0;
}

size_t kvstore_bytes_allocated(const KvCache *kv)
{
	return store_of(kv)->bytes_allocated;
}

void kvstore_set_split(KvCache *kv, int blocks_per_chunk)
{
	store_of(kv)->split_blocks = blocks_per_chunk > 0 ? blocks_per_chunk : 0;
}

static size_t store_bytes_per_token(const KvCache *kv)
{
	const KvStore *s = store_of(kv);
	size_t n = 0;
	for (int l = 0; l < kv->shape.n_layers; l++)
		n += (s->layers[l].k_bytes + s->layers[l].v_bytes) * (size_t)kv->shape.n_kv_heads;
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
	}
	return H->blocks[index];
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

/* Choose the outlier mask of a side from rows x (n_tok, row stride) of kv-head h, then build its codec. */
static int side_choose_outliers(KvSide *side, KvRole role, const float *x, int64_t n_tok,
				size_t stride, int d)
{
	_cleanup_(freep) float *rows = malloc_array((size_t)n_tok, (size_t)d * sizeof(float));
	if (!rows)
		return -ENOMEM;
	for (int64_t t = 0; t < n_tok; t++)
		memcpy(rows + t * d, x + t * stride, (size_t)d * sizeof(float));
	int r = tq_desc_choose_outliers(rows, (int)MIN(n_tok, INT32_MAX), d, side->type.tq.n_hi,
					side->type.tq.mask);
	if (r)
		return r;
	r = side_codec_new(side, role, NULL);
	if (r) {
		/* back to "no mask chosen", so a later append tries again */
		side_free(side);
		memset(side->type.tq.mask, 0, TQ_MASK_BYTES);
		return r > 0 ? -EINVAL : r;
	}
	return 0;
}

int kvstore_choose_outliers(KvCache *kv, int layer, int64_t n_tok, const float *k,
			    const float *v)
{
	assert(layer >= 0 && layer < kv->shape.n_layers && n_tok >= 0);
	KvLayer *L = &store_of(kv)->layers[layer];
	int d = kv->shape.head_dim;
	size_t row = (size_t)kv->shape.n_kv_heads * d;
	int r;

	if (n_tok == 0)
		return 0;
	for (int h = 0; h < kv->shape.n_kv_heads; h++) {
		KvHead *H = &L->heads[h];
		if (side_is_tq(&H->k) && !H->k.codec &&
		    (r = side_choose_outliers(&H->k, KV_ROLE_K, k + (size_t)h * d, n_tok, row, d)))
			return r;
		if (side_is_tq(&H->v) && !H->v.codec &&
		    (r = side_choose_outliers(&H->v, KV_ROLE_V, v + (size_t)h * d, n_tok, row, d)))
			return r;
	}
	return 0;
}

/*
 * The +c key sides of layer (kvtype.h), before any row of an append is
 * stored: the append's keys at positions 0..31 go to the exact copy of
 * block 0, and once position 31 is there, a side without mu takes the
 * mean of positions 1..31. Returns 0 or -EINVAL (that mean is not
 * finite; nothing chosen).
 */
static int keep_first_keys(KvLayer *L, int n_kv_heads, int d, int64_t pos0, int64_t n_tok,
			   const float *k)
{
	size_t row = (size_t)n_kv_heads * d;
	for (int h = 0; h < n_kv_heads; h++) {
		KvSide *side = &L->heads[h].k;
		if (!side->type.centered)
			continue;
		for (int64_t t = 0; t < n_tok && pos0 + t < BT; t++)
			memcpy(side->first_keys + (pos0 + t) * d, k + (size_t)t * row + (size_t)h * d,
			       (size_t)d * sizeof(float));
		if (side->center_chosen || pos0 + n_tok < BT)
			continue;
		for (int i = 0; i < d; i++) {
			double sum = 0;
			for (int p = 1; p < BT; p++)
				sum += side->first_keys[(size_t)p * d + i];
			float mu = (float)(sum / (BT - 1));
			if (!isfinite(mu)) {
				memset(side->center, 0, (size_t)d * sizeof(float));
				return -EINVAL;
			}
			side->center[i] = mu;
		}
		side->center_chosen = true;
	}
	return 0;
}

/*
 * Row x at position pos into its stored form at ret. A +c side stores
 * x - mu, and in block 0 (kept exact by keep_first_keys) a zero vector.
 */
static void side_store(const KvSide *side, int64_t pos, const float *x, uint8_t *ret)
{
	float centered[TQ_MAX_DIM];
	if (side->type.centered) {
		int d = side->type.dim;
		if (pos < BT) {
			memset(centered, 0, (size_t)d * sizeof(float));
		} else {
			assert(side->center_chosen);
			for (int i = 0; i < d; i++)
				centered[i] = x[i] - side->center[i];
		}
		x = centered;
	}
	if (side_is_tq(side))
		tq_encode(side->codec, x, ret);
	else
		kvquant_store(&side->type, x, ret);
}

/*
 * pk keys (kvpk.h): rows wait in the stage, exact, until their block is
 * whole and the query energies are known; then pk_encode_ready() codes
 * the block, and after the attention that read it exact the stage lets
 * it go. A query always reads its own block from the stage, so its
 * scores do not depend on how the prompt was split into appends.
 * A rewind into the last coded block finds its rows still there (see
 * pk_keep_from()); one into an earlier block puts that block's rows
 * before pos0 back into the stage as they read from the codes (they are
 * coded again, with the rest of the block, once it is whole).
 */
static int pk_stage(KvSide *side, const uint8_t *const *blocks, int64_t pos0, int64_t n_tok,
		    const float *k, size_t row)
{
	int d = side->type.dim;
	int64_t end = pos0 + n_tok;
	if (pos0 < side->pk_blocks * BT) {
		int64_t b = MAX(1, pos0 / BT);
		if (b * BT < side->stage_pos && pos0 > b * BT) {
			/* the block is coded: its first pos0 - b*BT rows come back from the codes */
			if (pk_stage_reserve(side, BT) < 0)
				return -ENOMEM;
			for (int t = 0; t < pos0 - b * BT; t++) {
				float *y = side->stage + (size_t)t * d;
				kvpk_decode_row(&side->pk, blocks[b], t, y);
				for (int i = 0; i < d; i++)
					y[i] += side->center[i];
			}
			side->stage_pos = b * BT;
		} else if (b * BT < side->stage_pos) {
			side->stage_pos = b * BT; /* nothing before pos0 to keep */
		}
		side->pk_blocks = b;
	}
	if (pk_stage_reserve(side, end - side->stage_pos) < 0)
		return -ENOMEM;
	for (int64_t t = 0; t < n_tok; t++)
		if (pos0 + t >= side->stage_pos)
			memcpy(side->stage + (size_t)(pos0 + t - side->stage_pos) * d,
			       k + (size_t)t * row, (size_t)d * sizeof(float));
	return 0;
}

/* After attention over positions ..end-1: drop the rows of coded blocks but the last. */
static void pk_stage_trim(KvSide *side, int64_t end)
{
	int64_t keep_from = pk_keep_from(side);
	if (keep_from <= side->stage_pos)
		return;
	int64_t n = MAX(0, end - keep_from);
	memmove(side->stage, pk_stage_row(side, keep_from), (size_t)n * side->type.dim * sizeof(float));
	side->stage_pos = keep_from;
}

/*
 * Before attention over positions pos0..pos0+n_tok-1: record the query
 * energies of positions 1..31 (fixing w at 31), then code every whole
 * block not yet coded.
 */
static void pk_encode_ready(KvStore *s, KvLayer *L, int h, int64_t pos0, int64_t n_tok,
			    const float *q)
{
	const KvCacheShape *sh = &s->base.shape;
	KvHead *H = &L->heads[h];
	KvSide *side = &H->k;
	int d = sh->head_dim, P = d / 2, G = sh->n_heads / sh->n_kv_heads;
	if (!side->w_chosen) {
		for (int64_t t = 0; t < n_tok && pos0 + t < BT; t++) {
			float *e = side->qe + (size_t)(pos0 + t) * P;
			const float *qt = q + ((size_t)t * sh->n_heads + (size_t)h * G) * d;
			for (int i = 0; i < P; i++) {
				float sum = 0.0f;
				for (int g = 0; g < G; g++)
					sum += qt[g * d + 2 * i] * qt[g * d + 2 * i] +
					       qt[g * d + 2 * i + 1] * qt[g * d + 2 * i + 1];
				e[i] = sum;
			}
		}
		if (pos0 + n_tok >= BT) {
			for (int i = 0; i < P; i++) {
				float sum = 0.0f;
				for (int p = 1; p < BT; p++)
					sum += side->qe[(size_t)p * P + i];
				side->w[i] = isfinite(sum) ? sum : 1.0f;
			}
			side->w_chosen = true;
		}
	}
	for (int64_t b = side->pk_blocks; (b + 1) * BT <= pos0 + n_tok; b++) {
		/* rows appended with no attention from position 0 (a random fill): equal weights */
		if (!side->w_chosen) {
			for (int i = 0; i < P; i++)
				side->w[i] = 1.0f;
			side->w_chosen = true;
		}
		kvpk_encode_block(&side->pk, pk_stage_row(side, b * BT), BT, side->center, side->w,
				  H->blocks[b]);
		side->pk_blocks = b + 1;
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
	if ((r = kvstore_choose_outliers(kv, layer, n_tok, k, v)) ||
	    (r = keep_first_keys(L, kv->shape.n_kv_heads, d, pos0, n_tok, k)))
		return r;
	for (int h = 0; h < kv->shape.n_kv_heads; h++) {
		KvHead *H = &L->heads[h];
		if (side_is_pk(&H->k) &&
		    (r = pk_stage(&H->k, (const uint8_t *const *)H->blocks, pos0, n_tok,
				  k + (size_t)h * d, row)))
			return r;
		for (int64_t t = 0; t < n_tok; t++) {
			int64_t p = pos0 + t;
			uint8_t *b = head_block(s, L, H, p / BT);
			if (!b)
				return -ENOMEM;
			const float *kx = k + (size_t)t * row + (size_t)h * d;
			const float *vx = v + (size_t)t * row + (size_t)h * d;
			if (!side_is_pk(&H->k))
				side_store(&H->k, p, kx, b + (size_t)(p % BT) * L->k_bytes);
			side_store(&H->v, p, vx, b + BT * L->k_bytes + (size_t)(p % BT) * L->v_bytes);
		}
	}
	return 0;
}

/* ---- attention ---- */

/*
 * Partials: part (n_tok, n_kv_heads, n_chunks, group, d + 2): for each
 * query head of the group, acc (d,) in the stored domain, then the
 * running max m and sum l of exp(score - m) over the item's blocks.
 */
typedef struct AttendJob {
	const KvStore *s;
	const KvLayer *L;
	int64_t pos0, n_tok;
	int group;             /* query heads per kv-head */
	int64_t n_chunks;
	int64_t chunk_blocks;  /* blocks per chunk */
	const float *q;        /* (n_tok, n_heads, d) */
	float *part;
	float *out;            /* (n_tok, n_heads, d) */
	KvAttnScoresFn scores;
	KvAttnSoftmaxFn softmax;
	KvAttnValuesFn values;
} AttendJob;

/* Per-thread scratch, allocated once per cache (kvstore.c owns it). */
typedef struct AttendScratch {
	KvAttnQuery *q;   /* (group,) prepared query heads */
	TqQuery *tqq;     /* tq_query_prepare() output */
	float *scores;    /* (group, BT) */
	float *ml;        /* (3, group): running max, sum, correction */
	float *qmu;       /* (group,) +c keys: <q, mu> / sqrt(d) */
} AttendScratch;

static void scratch_free(AttendScratch *sc)
{
	free(sc->q);
	free(sc->tqq);
	free(sc->scores);
	free(sc->ml);
	free(sc->qmu);
	*sc = (AttendScratch){ 0 };
}

static void store_scratch_free(KvStore *s)
{
	for (int i = 0; i < s->n_scratch; i++)
		scratch_free(&s->scratch[i]);
	free(s->scratch);
	s->scratch = NULL;
	s->n_scratch = 0;
}

/* Scratch for nth threads and query groups of G heads; -ENOMEM on failure. */
static int store_scratch_reserve(KvStore *s, int nth, int G)
{
	if (nth <= s->n_scratch && G <= s->scratch_group)
		return 0;
	store_scratch_free(s);
	s->scratch = calloc_array((size_t)nth, sizeof(AttendScratch));
	if (!s->scratch)
		return -ENOMEM;
	s->n_scratch = nth;
	s->scratch_group = G;
	for (int i = 0; i < nth; i++) {
		AttendScratch *sc = &s->scratch[i];
		sc->q = malloc_array((size_t)G, sizeof(KvAttnQuery));
		sc->tqq = malloc(sizeof(TqQuery));
		sc->scores = malloc_array((size_t)G * BT, sizeof(float));
		sc->ml = malloc_array((size_t)G * 3, sizeof(float));
		sc->qmu = malloc_array((size_t)G, sizeof(float));
		if (!sc->q || !sc->tqq || !sc->scores || !sc->ml || !sc->qmu) {
			store_scratch_free(s);
			return -ENOMEM;
		}
	}
	return 0;
}

/* scores[g * stride + p] = <q_g, x_p> * scale over exact rows x (nj, d), in f32. */
static void exact_scores(const float *x, int d, const float *q, int G, int nj, float scale,
			 float *scores, int stride)
{
	for (int g = 0; g < G; g++)
		for (int p = 0; p < nj; p++) {
			float sum = 0.0f;
			for (int i = 0; i < d; i++)
				sum += q[(size_t)g * d + i] * x[(size_t)p * d + i];
			scores[(size_t)g * stride + p] = sum * scale;
		}
}

/*
 * +c keys (kvtype.h): the scores, for the G query heads q (G, d), of the
 * rows of block b that the kernel scored from stored codes. Block 0 is
 * scored from its exact keys, <q, k_p> / sqrt(d), over the kernel's zero
 * rows; later blocks hold k - mu, so qmu[g] = <q_g, mu> / sqrt(d) goes
 * back on (same frame as block 0). Neither depends on when mu was chosen,
 * so a prompt gives the same scores however it was split into appends.
 */
static void centered_scores(const KvSide *ks, const float *q, int G, int64_t b, int nj, float scale,
			    const float *qmu, float *scores, int stride)
{
	if (b == 0) {
		exact_scores(ks->first_keys, ks->type.dim, q, G, nj, scale, scores, stride);
		return;
	}
	for (int g = 0; g < G; g++)
		for (int p = 0; p < nj; p++)
			scores[(size_t)g * stride + p] += qmu[g];
}

/*
 * pk keys: block 0 and the query's own block (own) from exact keys,
 * blocks between from codes of k - mu plus <q, mu> (the frame of
 * centered_scores()).
 */
static void pk_scores(const KvSide *ks, const float *q, int G, int64_t b, int64_t own,
		      const uint8_t *blk, int nj, float scale, const float *qmu, float *scores,
		      int stride)
{
	if (b == own && b > 0) {
		exact_scores(pk_stage_row(ks, b * BT), ks->type.dim, q, G, nj, scale, scores, stride);
		return;
	}
	if (b > 0)
		kvpk_scores(&ks->pk, blk, q, G, nj, scale, scores, stride);
	centered_scores(ks, q, G, b, nj, scale, qmu, scores, stride);
}

/* q (d,) of one query head into the stored domain of keys, then the kernel's form. */
static void query_prepare(const KvSide *ks, const float *q, TqQuery *tqq, KvAttnQuery *ret)
{
	int d = ks->type.dim;
	if (side_is_tq(ks)) {
		tq_query_prepare(ks->codec, q, tqq);
		memcpy(ret->q, tqq->rot, (size_t)d * sizeof(float));
		if (ks->rows.tq.qjl_m > 0)
			memcpy(ret->sq, tqq->sq, (size_t)ks->rows.tq.qjl_m * sizeof(float));
	} else {
		kvquant_query_prepare(&ks->type, q, ret->q);
	}
	kv_attn_query_prepare(&ks->rows, ret);
}

/* One work item: query heads of kv-head h at token t over blocks of chunk c. */
static void attend_item(const AttendJob *j, AttendScratch *sc, int64_t t, int h, int64_t c)
{
	const KvCacheShape *sh = &j->s->base.shape;
	const KvLayer *L = j->L;
	const KvHead *H = &L->heads[h];
	int d = sh->head_dim, G = j->group;
	float scale = 1.0f / sqrtf((float)d);
	int64_t n_ctx = j->pos0 + t + 1;
	int64_t n_blocks = (n_ctx + BT - 1) / BT;
	int64_t b0 = c * j->chunk_blocks, b1 = MIN(n_blocks, b0 + j->chunk_blocks);
	float *part = j->part + ((t * sh->n_kv_heads + h) * j->n_chunks + c) * G * (d + 2);
	float *m = sc->ml, *l = sc->ml + G, *corr = sc->ml + 2 * G;

	for (int g = 0; g < G; g++) {
		memset(part + g * (d + 2), 0, (size_t)d * sizeof(float));
		m[g] = -INFINITY;
		l[g] = 0.0f;
	}
	const float *qt = j->q + ((size_t)t * sh->n_heads + (size_t)h * G) * d; /* (G, d) */
	for (int g = 0; g < G && b0 < b1; g++) {
		if (!side_is_pk(&H->k))
			query_prepare(&H->k, qt + (size_t)g * d, sc->tqq, &sc->q[g]);
		if (H->k.type.centered) {
			float sum = 0.0f;
			for (int i = 0; i < d; i++)
				sum += qt[(size_t)g * d + i] * H->k.center[i];
			sc->qmu[g] = sum * scale;
		}
	}

	size_t blk_bytes = BT * (L->k_bytes + L->v_bytes);
	for (int64_t b = b0; b < b1; b++) {
		const uint8_t *blk = H->blocks[b];
		int nj = (int)MIN((int64_t)BT, n_ctx - b * BT);
		/*
		 * Blocks are separate allocations, so the hardware prefetcher
		 * stops at each block's end: ask for the next one while this
		 * one is scored (all of it: keys and values are both read).
		 */
		if (b + 1 < b1)
			for (size_t off = 0; off < blk_bytes; off += 64)
				__builtin_prefetch(H->blocks[b + 1] + off, 0, 3);
		/* scores: each key row read once for all query heads */
		if (side_is_pk(&H->k))
			pk_scores(&H->k, qt, G, b, (n_ctx - 1) / BT, blk, nj, scale, sc->qmu, sc->scores,
				  BT);
		else
			j->scores(&H->k.rows, sc->q, G, blk, nj, scale, sc->scores, BT);
		if (H->k.type.centered && !side_is_pk(&H->k))
			centered_scores(&H->k, qt, G, b, nj, scale, sc->qmu, sc->scores, BT);
		/* online softmax: rescale what came before to the new running max */
		j->softmax(sc->scores, BT, G, nj, m, l, corr);
		for (int g = 0; g < G; g++)
			if (corr[g] != 1.0f)
				for (int x = 0; x < d; x++)
					part[g * (d + 2) + x] *= corr[g];
		/* values, in the stored (rotated) domain */
		j->values(&H->v.rows, sc->scores, BT, G, blk + BT * L->k_bytes, nj, part, d + 2);
	}
	for (int g = 0; g < G; g++) {
		part[g * (d + 2) + d] = m[g];
		part[g * (d + 2) + d + 1] = l[g];
	}
}

static void attend_task(void *ctx, int ith, int nth)
{
	const AttendJob *j = ctx;
	const KvCacheShape *sh = &j->s->base.shape;
	int64_t n_items = j->n_tok * sh->n_kv_heads * j->n_chunks;
	AttendScratch *sc = &j->s->scratch[ith];
	/* strided: causal items grow with t, so interleave them across threads */
	for (int64_t i = ith; i < n_items; i += nth) {
		int64_t c = i % j->n_chunks;
		int64_t th = i / j->n_chunks;
		attend_item(j, sc, th / sh->n_kv_heads, (int)(th % sh->n_kv_heads), c);
	}
}

/* Merge the chunks of each (token, query head), normalise, rotate back into out. */
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
		float *o = j->out + ((size_t)t * sh->n_heads + hq) * d;
		if (side_is_tq(vs)) {
			tq_output_finish(vs->codec, acc, o);
		} else {
			kvquant_output_finish(&vs->type, acc);
			memcpy(o, acc, (size_t)d * sizeof(float));
		}
	}
}

/* How many block ranges each (token, kv-head) is split into, and their length. */
static void choose_split(const KvStore *s, ThreadPool *tp, int64_t pos0, int64_t n_tok,
			 int64_t *ret_chunks, int64_t *ret_chunk_blocks)
{
	int64_t max_blocks = (pos0 + n_tok + BT - 1) / BT;
	int64_t items = n_tok * s->base.shape.n_kv_heads;
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
	if (n_tok <= 0)
		return 0;
	for (int h = 0; h < sh->n_kv_heads; h++)
		if (side_is_pk(&s->layers[layer].heads[h].k))
			pk_encode_ready(s, &s->layers[layer], h, pos0, n_tok, q);
	AttendJob j = {
		.s = s, .L = &s->layers[layer], .pos0 = pos0, .n_tok = n_tok,
		.group = sh->n_heads / sh->n_kv_heads, .q = q, .out = out,
	};
	choose_split(s, tp, pos0, n_tok, &j.n_chunks, &j.chunk_blocks);

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
	if (store_scratch_reserve(s, tp ? threadpool_n_threads(tp) : 1, j.group) < 0)
		return -ENOMEM;
	j.scores = kv_attn_scores_get();
	j.softmax = kv_attn_softmax_get();
	j.values = kv_attn_values_get();
	threadpool_run(tp, attend_task, &j);
	threadpool_run(tp, combine_task, &j);
	for (int h = 0; h < sh->n_kv_heads; h++)
		if (side_is_pk(&s->layers[layer].heads[h].k))
			pk_stage_trim(&s->layers[layer].heads[h].k, pos0 + n_tok);
	return 0;
}

static const KvCacheOps kvstore_ops = {
	.name = "kvstore",
	.append = store_append,
	.attend = store_attend,
	.bytes_per_token = store_bytes_per_token,
	.free = store_free,
};
