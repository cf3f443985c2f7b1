/*
 * fmt_pq.c: the PolarQuant KV format `pq` (kvformat.h), for keys and
 * values: each row kvpq.h's polar code of one head vector
 * (kernels/kv_pq_layout.h), a codec (rotation and angle codebooks) per
 * (layer, kv-head, K/V), attention on the codes (kernels/cpu/kv_attn.h's
 * pq kernels: queries rotated once with a per-query level-1 table, values
 * accumulated in the rotated domain and rotated back once per head).
 *
 * == Names ==
 *
 *   pq, pq4   the paper's: 4 levels, (4, 2, 2, 2) bits, fp16 level-4 radii
 *   pq<B>     4 levels, (B, B-2, B-2, B-2) bits (at least 1), B in 1..8
 *   pq<B>f    every level (log2 head_dim; a power of two), level 1 at B
 *             bits, the rest at max(1, B - 2), one fp16 radius
 * kvpq.h says why level 1 gets two bits more. The canonical name of the
 * paper's is "pq".
 *
 * == Seed ==
 *
 *   key   = l << 32 | h << 1 | r
 *   rng_init(seed ^ (0x6b76706f6c617231 + key * 0x9e3779b97f4a7c15))  ("kvpolar1")
 *   rot_seed = rng_next()
 *
 * == Session record (tag "PQD1", 4 bytes, little-endian) ==
 *
 * The CRC-32C (base/crc32c.h) of the side's 24-byte descriptor
 *
 *   offset size field
 *   0      8    rot_seed
 *   8      2    head_dim
 *   10     1    levels L
 *   11     1    0
 *   12     10   bits of levels 1..10 (0 past L)
 *   22     2    0
 *
 * which the plan and the cache seed give whole (as TQ's, fmt_tq.c): the
 * checksum says the file was written with the same one; another is
 * KVFORMAT_E_OTHER_TYPE. The rows
 * themselves come in the container's block sections; every code is a
 * valid cell, so only the radii are checked on load (finite, not
 * negative: KVFORMAT_E_CORRUPT otherwise).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/half.h"
#include "engine/codec/kvpq.h"
#include "engine/codec/rotation.h"
#include "engine/kv/kvformat.h"
#include "kernels/cpu/kv_attn.h"

#define PQ_SEED_DOMAIN 0x6b76706f6c617231ull /* "kvpolar1" */
#define PQ_DESC_BYTES 24
#define PQ_RECORD_BYTES 4
#define PQ_PAPER_LEVELS 4

typedef struct PqSide {
	KvPq pq;
	KvAttnPqScoresFn scores;  /* chosen at run time */
	KvAttnPqValuesFn values;
	uint64_t seed;            /* the rotation's */
} PqSide;

/* ---- types ---- */

static bool is_pow2(int n)
{
	return n > 0 && (n & (n - 1)) == 0;
}

static int log2_of(int n)
{
	int l = 0;
	while ((1 << l) < n)
		l++;
	return l;
}

static int pq_parse(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	if (strncmp(name, "pq", 2) != 0)
		return -ENOENT;
	const char *p = name + 2;
	int b = 4;
	bool full = false;
	if (*p) {
		if (*p < '1' || *p > '8')
			goto bad;
		b = *p++ - '0';
		if (*p == 'f') {
			full = true;
			p++;
		}
		if (*p)
			goto bad;
	}
	KvPqShape s = { .dim = dim, .levels = full ? log2_of(dim) : PQ_PAPER_LEVELS };
	if (full && (!is_pow2(dim) || dim < 2))
		return error_set(err, KVTYPE_E_DIM,
				 "KV type '%s' at head_dim %d: every level needs a power of two", name, dim);
	if (s.levels > KVPQ_MAX_LEVELS || dim % (1 << s.levels) != 0)
		return error_set(err, KVTYPE_E_DIM,
				 "KV type '%s' at head_dim %d: head_dim must be a multiple of %d", name,
				 dim, 1 << s.levels);
	s.bits[0] = (uint8_t)b;
	for (int l = 1; l < s.levels; l++)
		s.bits[l] = (uint8_t)(b > 3 ? b - 2 : 1);
	if (!kvpq_shape_valid(&s))
		return error_set(err, KVTYPE_E_DIM, "KV type '%s' at head_dim %d", name, dim);
	*ret = (KvType){ .format = KV_FORMAT_PQ, .dim = dim, .pq = s };
	(void)role;
	return 0;
bad:
	return error_set(err, KVTYPE_E_UNKNOWN,
			 "unknown KV type '%s' (PolarQuant: pq, pq<B> or pq<B>f, B in 1..8)", name);
}

static void pq_type_name(const KvType *t, char *buf, size_t size)
{
	const KvPqShape *s = &t->pq;
	if (s->levels == PQ_PAPER_LEVELS && s->bits[0] == 4)
		snprintf(buf, size, "pq");
	else
		snprintf(buf, size, "pq%d%s", s->bits[0], s->levels == PQ_PAPER_LEVELS ? "" : "f");
}

static bool pq_type_equal(const KvType *a, const KvType *b)
{
	return a->pq.levels == b->pq.levels && memcmp(a->pq.bits, b->pq.bits, sizeof(a->pq.bits)) == 0;
}

static size_t pq_vec_bytes(const KvType *t)
{
	return kvpq_row_bytes(&t->pq);
}

static int pq_supports(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
		       Error *err)
{
	if (t->pq.dim != shape->head_dim)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "pq dim %d", t->pq.dim);
	if (dev == KV_DEVICE_CUDA) /* no kernels yet */
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "PolarQuant (pq) runs on the CPU only for now; use a tq type on the GPU");
	return 0;
}

/* ---- a side ---- */

static uint64_t derive_seed(uint64_t seed, int layer, int head, KvRole role)
{
	uint64_t key = (uint64_t)layer << 32 | (uint64_t)head << 1 | (uint64_t)role;
	Rng rng;
	rng_init(&rng, seed ^ (PQ_SEED_DOMAIN + key * 0x9e3779b97f4a7c15ull));
	return rng_next(&rng);
}

static void pq_free(void *st)
{
	PqSide *s = st;
	if (!s)
		return;
	kvpq_fini(&s->pq);
	free(s);
}

static int pq_init(const KvSideSetup *setup, void **ret_state, Error *err)
{
	PqSide *s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(err, -ENOMEM, "out of memory");
	s->seed = derive_seed(setup->seed, setup->layer, setup->head, setup->role);
	s->scores = kv_attn_pq_scores_get();
	s->values = kv_attn_pq_values_get();
	int r = kvpq_init(&s->pq, &setup->type.pq, s->seed);
	if (r) {
		pq_free(s);
		return error_set(err, r == -ENOMEM ? -ENOMEM : KVFORMAT_E_UNSUPPORTED,
				 "layer %d: PolarQuant codec: %s", setup->layer, strerror(-r));
	}
	*ret_state = s;
	return 0;
}

static size_t pq_state_bytes(const void *st)
{
	const PqSide *s = st;
	return sizeof(*s) + kvpq_bytes(&s->pq);
}

static int pq_append(void *st, const KvSideRows *rows, int64_t pos0, int64_t n, const float *x,
		     size_t stride)
{
	const PqSide *s = st;
	for (int64_t t = 0; t < n; t++)
		kvpq_encode(&s->pq, x + (size_t)t * stride, kv_side_row(rows, pos0 + t));
	return 0;
}

/* ---- attention ---- */

static size_t pq_query_bytes(const void *st, int G)
{
	const PqSide *s = st;
	return (size_t)G * kvpq_query_floats(&s->pq) * sizeof(float);
}

static void pq_query(const void *st, const float *q, int G, void *prep)
{
	const PqSide *s = st;
	size_t qf = kvpq_query_floats(&s->pq);
	for (int g = 0; g < G; g++)
		kvpq_query_prepare(&s->pq, q + (size_t)g * s->pq.rows.shape.dim, (float *)prep + (size_t)g * qf);
}

static void pq_scores(const void *st, const KvSideRows *rows, const float *q, const void *prep,
		      int G, int64_t b, int64_t own, int n, float scale, float *scores, int ld)
{
	const PqSide *s = st;
	s->scores(&s->pq.rows, prep, G, kv_side_region(rows, b), n, scale, scores, ld);
}

static void pq_values(const void *st, const uint8_t *region, int64_t b, const float *p, int ld, int G,
		      int n, float *acc, int acc_ld)
{
	const PqSide *s = st;
	s->values(&s->pq.rows, p, ld, G, region, n, acc, acc_ld);
}

static void pq_finish(const void *st, const float *acc, float *out)
{
	const PqSide *s = st;
	kvpq_finish(&s->pq, acc, out);
}

static void pq_load_row(const void *st, const KvSideRows *rows, int64_t pos, float *ret)
{
	const PqSide *s = st;
	kvpq_decode(&s->pq, kv_side_row(rows, pos), ret);
}

/* ---- session record ---- */

static size_t pq_record_bytes(const void *st, int64_t n_kv)
{
	return PQ_RECORD_BYTES;
}

/* The CRC-32C of the side's descriptor (the top). */
static uint32_t desc_crc(const PqSide *s)
{
	const KvPqShape *sh = &s->pq.rows.shape;
	uint8_t desc[PQ_DESC_BYTES] = { 0 };
	put_le(desc, s->seed, 8);
	put_le(desc + 8, (uint64_t)sh->dim, 2);
	desc[10] = (uint8_t)sh->levels;
	memcpy(desc + 12, sh->bits, KVPQ_MAX_LEVELS);
	return crc32c(desc, sizeof(desc));
}

static int pq_record_save(const void *st, const KvSideRows *rows, int64_t n_kv, uint8_t *out)
{
	put_le(out, desc_crc(st), 4);
	return 0;
}

static int pq_record_load(void *st, const KvSideRows *rows, int64_t n_kv, const uint8_t *in,
			  Error *err)
{
	const PqSide *s = st;
	const KvPqShape *sh = &s->pq.rows.shape;
	if ((uint32_t)get_le(in, 4) != desc_crc(s))
		return error_set(err, KVFORMAT_E_OTHER_TYPE,
				 "saved with another PolarQuant type or seed (descriptor CRC %08x, this "
				 "side's %08x)", (unsigned)get_le(in, 4), (unsigned)desc_crc(s));
	/* a sliding-window layer's blocks below rows->first are not kept (kvformat.h) */
	for (int64_t pos = rows->first * KV_BLOCK_TOKENS; pos < n_kv; pos++) {
		int64_t b = pos / KV_BLOCK_TOKENS;
		if (b >= rows->n_blocks || !rows->blocks[b])
			return error_set(err, KVFORMAT_E_CORRUPT, "pq block %lld missing", (long long)b);
		const uint8_t *row = kv_side_row(rows, pos);
		for (int p = 0; p < kvpq_level_n(sh, sh->levels); p++) {
			float r = half_to_f32((tkv_half)get_le(row + 2 * p, 2));
			if (!isfinite(r) || r < 0)
				return error_set(err, KVFORMAT_E_CORRUPT,
						 "pq row %lld: radius not finite or negative", (long long)pos);
		}
	}
	return 0;
}

const KvFormatOps kvfmt_pq = {
	.name = "pq",
	.tag = KVREC_TAG('P', 'Q', 'D', '1'),
	.parse = pq_parse,
	.type_name = pq_type_name,
	.type_equal = pq_type_equal,
	.vec_bytes = pq_vec_bytes,
	.supports = pq_supports,
	.init = pq_init,
	.free = pq_free,
	.state_bytes = pq_state_bytes,
	.append = pq_append,
	.query_bytes = pq_query_bytes,
	.query = pq_query,
	.scores = pq_scores,
	.values = pq_values,
	.finish = pq_finish,
	.load_row = pq_load_row,
	.record_bytes = pq_record_bytes,
	.record_save = pq_record_save,
	.record_load = pq_record_load,
};
