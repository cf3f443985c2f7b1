/*
 * fmt_tq.c: the TurboQuant KV format (kvformat.h): each row one code
 * record of tq.h, a codec per (layer, kv-head, K/V) with its own seeds,
 * attention on the codes (kernels/cpu/kv_attn.h: queries rotated once,
 * values accumulated in the rotated domain and rotated back once per head).
 *
 * == Seeds ==
 *
 * Each side's TqDesc is the planned one with rot_seed and (QJL only)
 * qjl_seed replaced by kvtq_derive_seeds(cache seed, layer, head, role)
 * (fmt_tq.h), so the cache seed recovers every descriptor but the outlier
 * masks.
 *
 * == Outlier-channel types ("o", TQ_GROUP_OUTLIER_CHANNELS) ==
 *
 * The channel mask is chosen by tq_desc_choose_outliers() over the rows of
 * the first append (the prompt's first batch; fix()) and kept from then
 * on, rewinds included; the codec is built then.
 *
 * == QJL on values (`tq<B>+qjl` / `+sqjl` as a V type) ==
 *
 * A value row's reconstruction includes the QJL estimate of its residual,
 * y~ + gamma K S^T z (tq_decode_rotated(): unbiased over S for +qjl), so
 * the attention output is an unbiased estimate of the exact one's
 * rotated accumulator. The residual has no per-query shortcut for values
 * (they are summed, not dotted with a query), so each row is read back
 * once per block with its S^T z (O(m d) for +qjl, O(d log d) for +sqjl)
 * and added to every head's accumulator: slower than MSE values. CPU
 * only (the GPU kernels read MSE codes).
 *
 * == Session record (tag "TQD2") ==
 *
 * ("TQD1", of session files before version 6, was the 176-byte
 * descriptor for every type.)
 *
 * Outlier-channel types, 176 bytes: the side's complete descriptor as
 * tq.h's TqDesc record (seeds and mask included, CRC-32C'd). On load it
 * must equal this side's descriptor (an outlier side not appended to yet
 * takes the record's mask, provided everything else is as planned):
 * another descriptor is KVFORMAT_E_OTHER_TYPE, a record that does not
 * decode KVFORMAT_E_CORRUPT.
 *
 * Every other type, 4 bytes: that record's own CRC-32C (its last 4
 * bytes: the checksum of its first 172, seeds and flags included). The
 * plan and the cache seed give the whole descriptor; the checksum says
 * the file was written with the same one (another is
 * KVFORMAT_E_OTHER_TYPE).
 */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/rotation.h"
#include "engine/kv/fmt_tq.h"
#include "engine/kv/kvformat.h"
#include "engine/kv/kvstore.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/kv_kernel.h"

#define TQ_SEED_DOMAIN 0x6b7673746f726531ull /* "kvstore1" */

typedef struct TqSide {
	KvRowKernels k;        /* first: the rows as the kernels read them, once codec (kvformat.h) */
	KvType type;           /* this side's seeds, and mask once chosen */
	KvRole role;
	TqCodec *codec;        /* NULL until an outlier mask is chosen */
} TqSide;
static_assert(offsetof(TqSide, k) == 0, "kvformat_row_scores() reads the state as KvRowKernels");

void kvtq_derive_seeds(uint64_t seed, int layer, int head, KvRole role, uint64_t *ret_rot_seed,
		       uint64_t *ret_qjl_seed)
{
	uint64_t key = (uint64_t)layer << 32 | (uint64_t)head << 1 | (uint64_t)role;
	Rng rng;
	rng_init(&rng, seed ^ (TQ_SEED_DOMAIN + key * 0x9e3779b97f4a7c15ull));
	uint64_t rot = rng_next(&rng), qjl;
	do
		qjl = rng_next(&rng);
	while (qjl == 0 || qjl == rot || qjl == tq_seed_mix(rot));
	*ret_rot_seed = rot;
	*ret_qjl_seed = qjl;
}

int kvtq_side_desc(const KvCache *kv, int layer, int head, KvRole role, TqDesc *ret)
{
	const KvFormatOps *ops;
	const void *st = kvstore_side(kv, layer, head, role, &ops);
	while (st && ops->inner) /* +c on TurboQuant keys */
		st = ops->inner(st, &ops);
	const TqSide *s = st;
	if (!s || ops != &kvfmt_tq || !s->codec)
		return -ENOENT;
	*ret = *tq_codec_desc(s->codec);
	return 0;
}

/* ---- types ---- */

static int tq_parse(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	Error tq_err = { 0 };
	TqDesc desc;

	if (strncmp(name, "tq", 2) != 0)
		return -ENOENT;
	/* Syntax first, at the largest dim, so a dim problem is told apart. */
	if (tq_desc_from_name(name, TQ_MAX_DIM, &desc, &tq_err) != 0)
		return error_set(err, KVTYPE_E_UNKNOWN, "unknown KV type '%s': %s", name,
				 tq_err.msg);
	if (dim > TQ_MAX_DIM || tq_desc_from_name(name, dim, &desc, &tq_err) != 0)
		return error_set(err, KVTYPE_E_DIM, "KV type '%s' at head_dim %d: %s", name, dim,
				 dim > TQ_MAX_DIM ? "head_dim too large" : tq_err.msg);
	*ret = (KvType){ .format = KV_FORMAT_TQ, .dim = dim, .tq = desc };
	return 0;
}

static void tq_type_name(const KvType *t, char *buf, size_t size)
{
	tq_desc_name(&t->tq, buf, size);
}

static bool tq_type_equal(const KvType *a, const KvType *b)
{
	return tq_desc_equal(&a->tq, &b->tq);
}

/* tq.h's coded-vector layout, summed field by field. */
static size_t tq_vec_bytes(const KvType *t)
{
	const TqDesc *d = &t->tq;
	bool qjl = d->flags & TQ_FLAG_QJL;
	size_t n = d->group == TQ_GROUP_OUTLIER_CHANNELS ? 4 : 2; /* fp16 scales */
	n += qjl ? 2 : 0;                                         /* fp16 gamma */
	n += bitpack_bytes(d->bits + 1, (size_t)d->n_hi);
	n += bitpack_bytes(d->bits, (size_t)(d->dim - d->n_hi));
	n += qjl ? bitpack_bytes(1, (size_t)d->qjl_m) : 0;        /* sign bits */
	return n;
}

static int tq_supports(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
		       Error *err)
{
	if (t->tq.dim != shape->head_dim)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "TQ dim %d", t->tq.dim);
	if (dev == KV_DEVICE_CUDA && role == KV_ROLE_V && (t->tq.flags & TQ_FLAG_QJL))
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "QJL on values runs on the CPU only (the GPU kernels read MSE values)");
	if (dev == KV_DEVICE_CUDA && t->tq.qjl_m > KVK_MAX_QJL_M)
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "the %s type has %d QJL rows, the GPU takes at most %d",
				 role ? "V" : "K", t->tq.qjl_m, KVK_MAX_QJL_M);
	return 0;
}

/* ---- a side ---- */

/* Build the codec of a side whose descriptor is complete, and its kernel view. */
static int side_codec_new(TqSide *s, Error *err)
{
	int r = tq_codec_new(&s->type.tq, &s->codec, err);
	if (r)
		return r;
	r = kv_attn_rows_init_tq(&s->k.rows, tq_codec_layout(s->codec), tq_codec_centroids(s->codec, true),
				 tq_codec_centroids(s->codec, false), tq_qjl_const(s->codec));
	if (r) {
		s->codec = tq_codec_free(s->codec);
		return error_set(err, r, "TQ layout the attention kernels cannot read");
	}
	return 0;
}

static int tq_init(const KvSideSetup *setup, void **ret_state, Error *err)
{
	_cleanup_(freep) TqSide *s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(err, -ENOMEM, "out of memory");
	s->type = setup->type;
	s->role = setup->role;
	kvformat_row_kernels_init(&s->k);
	uint64_t rot, qjl;
	kvtq_derive_seeds(setup->seed, setup->layer, setup->head, setup->role, &rot, &qjl);
	s->type.tq.rot_seed = rot;
	s->type.tq.qjl_seed = (s->type.tq.flags & TQ_FLAG_QJL) ? qjl : 0;
	if (s->type.tq.group != TQ_GROUP_OUTLIER_CHANNELS) {
		int r = side_codec_new(s, err);
		if (r)
			return r;
	}
	*ret_state = TAKE_PTR(s);
	return 0;
}

static void tq_free(void *st)
{
	TqSide *s = st;
	if (!s)
		return;
	tq_codec_free(s->codec);
	free(s);
}

static size_t tq_state_bytes(const void *st)
{
	const TqSide *s = st;
	return sizeof(*s) + (s->codec ? tq_codec_bytes(s->codec) : 0);
}

static int tq_fix(void *st, const float *x, int64_t n, size_t stride)
{
	TqSide *s = st;
	int d = s->type.dim;
	if (s->codec || n == 0)
		return 0;
	_cleanup_(freep) float *rows = malloc_array((size_t)n, (size_t)d * sizeof(float));
	if (!rows)
		return -ENOMEM;
	for (int64_t t = 0; t < n; t++)
		memcpy(rows + t * d, x + t * stride, (size_t)d * sizeof(float));
	int r = tq_desc_choose_outliers(rows, (int)MIN(n, INT32_MAX), d, s->type.tq.n_hi,
					s->type.tq.mask);
	if (!r)
		r = side_codec_new(s, NULL);
	if (r) {
		/* back to "no mask chosen", so a later append tries again */
		memset(s->type.tq.mask, 0, TQ_MASK_BYTES);
		return r > 0 ? -EINVAL : r;
	}
	return 0;
}

static int tq_append(void *st, const KvSideRows *rows, int64_t pos0, int64_t n, const float *x,
		     size_t stride)
{
	TqSide *s = st;
	int r = tq_fix(s, x, n, stride);
	if (r)
		return r;
	for (int64_t t = 0; t < n; t++)
		tq_encode(s->codec, x + (size_t)t * stride, kv_side_row(rows, pos0 + t));
	return 0;
}

/* ---- attention ---- */

static size_t tq_query_bytes(const void *st, int G)
{
	return (size_t)G * sizeof(KvAttnQuery);
}

static void tq_query(const void *st, const float *q, int G, void *prep)
{
	const TqSide *s = st;
	KvAttnQuery *qq = prep;
	TqQuery tqq;
	for (int g = 0; g < G; g++) {
		tq_query_prepare(s->codec, q + (size_t)g * s->type.dim, &tqq);
		memcpy(qq[g].q, tqq.rot, (size_t)s->type.dim * sizeof(float));
		if (s->k.rows.tq.qjl_m > 0)
			memcpy(qq[g].sq, tqq.sq, (size_t)s->k.rows.tq.qjl_m * sizeof(float));
		kv_attn_query_prepare(&s->k.rows, &qq[g]);
	}
}

/* Values: the row kernels, or with QJL each row read back whole (see the top). */
static void tq_values(const void *st, const uint8_t *region, int64_t b, const float *p, int ld, int G,
		      int n, float *acc, int acc_ld)
{
	const TqSide *s = st;
	if (!(s->type.tq.flags & TQ_FLAG_QJL)) {
		kvformat_row_values(st, region, b, p, ld, G, n, acc, acc_ld);
		return;
	}
	int d = s->type.dim;
	float v[TQ_MAX_DIM];
	for (int t = 0; t < n; t++) {
		tq_decode_rotated(s->codec, region + (size_t)t * s->k.rows.row_bytes, v);
		for (int g = 0; g < G; g++) {
			float w = p[(size_t)g * ld + t], *a = acc + (size_t)g * acc_ld;
			for (int i = 0; i < d; i++)
				a[i] += w * v[i];
		}
	}
}

/* The rotated domain: P x, as a query is rotated (tq_output_finish() is its inverse). */
static void tq_to_stored(const void *st, const float *x, float *ret)
{
	const TqSide *s = st;
	TqQuery tqq;
	tq_query_prepare(s->codec, x, &tqq);
	memcpy(ret, tqq.rot, (size_t)s->type.dim * sizeof(float));
}

static void tq_finish(const void *st, const float *acc, float *out)
{
	const TqSide *s = st;
	tq_output_finish(s->codec, acc, out);
}

static void tq_load_row(const void *st, const KvSideRows *rows, int64_t pos, float *ret)
{
	const TqSide *s = st;
	tq_decode(s->codec, kv_side_row(rows, pos), ret);
}

/* ---- session record ---- */

static bool keeps_mask(const TqSide *s)
{
	return s->type.tq.group == TQ_GROUP_OUTLIER_CHANNELS;
}

static size_t tq_record_bytes(const void *st, int64_t n_kv)
{
	return keeps_mask(st) ? TQ_DESC_RECORD_BYTES : 4;
}

/*
 * The descriptor's record's own checksum (its last field, the CRC-32C of
 * the 172 bytes before it; the CRC of the whole record would be the same
 * constant for every record). 0 or -EINVAL.
 */
static int desc_crc(const TqDesc *desc, uint32_t *ret)
{
	uint8_t rec[TQ_DESC_RECORD_BYTES];
	if (tq_desc_encode(desc, rec))
		return -EINVAL;
	*ret = (uint32_t)get_le(rec + offsetof(TqDescRecord, crc), 4);
	return 0;
}

static int tq_record_save(const void *st, const KvSideRows *rows, int64_t n_kv, uint8_t *out)
{
	const TqSide *s = st;
	uint32_t crc;
	if (!s->codec) /* an outlier side nothing was appended to */
		return -EINVAL;
	if (keeps_mask(s))
		return tq_desc_encode(tq_codec_desc(s->codec), out) ? -EINVAL : 0;
	if (desc_crc(tq_codec_desc(s->codec), &crc))
		return -EINVAL;
	kvrec_put_u32(&out, crc);
	return 0;
}

static int tq_record_load(void *st, const KvSideRows *rows, int64_t n_kv, const uint8_t *in,
			  Error *err)
{
	TqSide *s = st;
	TqDesc desc;
	Error e = { 0 };
	if (!keeps_mask(s)) {
		uint32_t crc;
		if (!s->codec || desc_crc(tq_codec_desc(s->codec), &crc))
			return error_set(err, KVFORMAT_E_CORRUPT, "a TQ side without its codec");
		if (kvrec_get_u32(&in) != crc)
			return error_set(err, KVFORMAT_E_OTHER_TYPE,
					 "saved with another TurboQuant descriptor (seeds or codebook)");
		return 0;
	}
	if (tq_desc_decode(in, TQ_DESC_RECORD_BYTES, &desc, &e) != 0)
		return error_set(err, KVFORMAT_E_CORRUPT, "%s", e.msg);
	if (s->codec)
		return tq_desc_compare(&desc, tq_codec_desc(s->codec), err) ? KVFORMAT_E_OTHER_TYPE : 0;
	/* An outlier side waiting for its mask: everything but the mask must be as planned. */
	TqDesc expect = s->type.tq;
	memcpy(expect.mask, desc.mask, TQ_MASK_BYTES);
	if (tq_desc_compare(&desc, &expect, err) != 0)
		return KVFORMAT_E_OTHER_TYPE;
	if (tq_desc_validate(&desc, err) != 0)
		return KVFORMAT_E_CORRUPT;
	s->type.tq = desc;
	int r = side_codec_new(s, err);
	if (r) {
		memset(s->type.tq.mask, 0, TQ_MASK_BYTES);
		return r < 0 ? r : KVFORMAT_E_CORRUPT;
	}
	return 0;
}

const KvFormatOps kvfmt_tq = {
	.name = "tq",
	.tag = KVREC_TAG('T', 'Q', 'D', '2'),
	.parse = tq_parse,
	.type_name = tq_type_name,
	.type_equal = tq_type_equal,
	.vec_bytes = tq_vec_bytes,
	.supports = tq_supports,
	.init = tq_init,
	.free = tq_free,
	.state_bytes = tq_state_bytes,
	.fix = tq_fix,
	.append = tq_append,
	.query_bytes = tq_query_bytes,
	.query = tq_query,
	.scores = kvformat_row_scores,
	.values = tq_values,
	.to_stored = tq_to_stored,
	.finish = tq_finish,
	.load_row = tq_load_row,
	.record_bytes = tq_record_bytes,
	.record_save = tq_record_save,
	.record_load = tq_record_load,
};
