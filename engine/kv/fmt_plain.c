/*
 * fmt_plain.c: the plain KV formats (kvformat.h): f32, f16, q8_0 and q4_0
 * rows, bit-compatible with ggml's, each optionally "+h" (the head vector
 * multiplied by the normalised Hadamard matrix first, as llama.cpp does:
 * kvtype.h). Rows are quantized by kvquant.h and read by the kernels of
 * kernels/cpu/kv_attn.h; a side keeps nothing but its type.
 *
 * == Session record (tag "PLN1", 4 bytes) ==
 *
 *   offset size field
 *   0      1    format: 0 f32, 1 f16, 2 q8_0, 3 q4_0 (KvFormat)
 *   1      1    1 for +h, else 0
 *   2      2    head_dim
 *
 * A record that names another type is KVFORMAT_E_OTHER_TYPE: the file was
 * saved with another --kv.
 */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kvformat.h"
#include "engine/kv/kvquant.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/wtype.h"

#define PLAIN_RECORD_BYTES 4

typedef struct PlainSide {
	KvRowKernels k;          /* first: the rows as the kernels read them (kvformat.h) */
	KvType type;
} PlainSide;
static_assert(offsetof(PlainSide, k) == 0, "kvformat_row_scores() reads the state as KvRowKernels");

static const struct {
	const char *name;
	KvFormat format;
} names[] = {
	{ "f32", KV_FORMAT_F32 },
	{ "f16", KV_FORMAT_F16 },
	{ "q8_0", KV_FORMAT_Q8_0 },
	{ "q4_0", KV_FORMAT_Q4_0 },
};

/* ---- types ---- */

static bool is_pow2(int n)
{
	return n > 0 && (n & (n - 1)) == 0;
}

static int plain_parse(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		size_t n = strlen(names[i].name);
		if (strncmp(name, names[i].name, n) != 0 || (name[n] && strcmp(name + n, "+h") != 0))
			continue;
		KvType t = { .format = names[i].format, .hadamard = name[n] != '\0', .dim = dim };
		if ((t.format == KV_FORMAT_Q8_0 || t.format == KV_FORMAT_Q4_0) && dim % QK8_0 != 0)
			return error_set(err, KVTYPE_E_DIM,
					 "KV type '%s': head_dim %d is not a multiple of the block size 32",
					 name, dim);
		if (t.hadamard && !is_pow2(dim))
			return error_set(err, KVTYPE_E_DIM,
					 "KV type '%s': +h needs a power-of-two head_dim, got %d", name, dim);
		*ret = t;
		return 0;
	}
	return -ENOENT;
}

static void plain_type_name(const KvType *t, char *buf, size_t size)
{
	const char *base = "?";
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (names[i].format == t->format)
			base = names[i].name;
	snprintf(buf, size, "%s%s", base, t->hadamard ? "+h" : "");
}

static bool plain_type_equal(const KvType *a, const KvType *b)
{
	return a->format == b->format && a->hadamard == b->hadamard;
}

static size_t plain_vec_bytes(const KvType *t)
{
	size_t d = (size_t)t->dim;
	switch (t->format) {
	case KV_FORMAT_F32: return 4 * d;
	case KV_FORMAT_F16: return 2 * d;
	case KV_FORMAT_Q8_0: return d / QK8_0 * sizeof(BlockQ8_0);
	case KV_FORMAT_Q4_0: return d / QK4_0 * sizeof(BlockQ4_0);
	default: return 0;
	}
}

static int plain_supports(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
			  Error *err)
{
	if (t->dim > TQ_MAX_DIM) /* kvquant.h's largest vector */
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "head_dim %d above %d", t->dim,
				 TQ_MAX_DIM);
	if (dev == KV_DEVICE_CUDA && t->hadamard && !is_pow2(shape->head_dim))
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "+h needs a power-of-two head_dim on the GPU, not %d", shape->head_dim);
	return 0;
}

/* ---- a side ---- */

static int plain_init(const KvSideSetup *setup, void **ret_state, Error *err)
{
	PlainSide *s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(err, -ENOMEM, "out of memory");
	s->type = setup->type;
	if (kv_attn_rows_init(&s->k.rows, s->type.format, s->type.dim) < 0) {
		free(s);
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "layer %d: row shape the kernels cannot read",
				 setup->layer);
	}
	kvformat_row_kernels_init(&s->k);
	*ret_state = s;
	return 0;
}

static void plain_free(void *st)
{
	free(st);
}

static size_t plain_state_bytes(const void *st)
{
	return sizeof(PlainSide);
}

static int plain_append(void *st, const KvSideRows *rows, int64_t pos0, int64_t n, const float *x,
			size_t stride)
{
	const PlainSide *s = st;
	for (int64_t t = 0; t < n; t++)
		kvquant_store(&s->type, x + (size_t)t * stride, kv_side_row(rows, pos0 + t));
	return 0;
}

/* ---- attention ---- */

static size_t plain_query_bytes(const void *st, int G)
{
	return (size_t)G * sizeof(KvAttnQuery);
}

static void plain_query(const void *st, const float *q, int G, void *prep)
{
	const PlainSide *s = st;
	KvAttnQuery *qq = prep;
	for (int g = 0; g < G; g++) {
		kvquant_query_prepare(&s->type, q + (size_t)g * s->type.dim, qq[g].q);
		kv_attn_query_prepare(&s->k.rows, &qq[g]);
	}
}

/* The stored domain: R x for +h (R its own inverse), else x itself. */
static void plain_to_stored(const void *st, const float *x, float *ret)
{
	const PlainSide *s = st;
	kvquant_query_prepare(&s->type, x, ret);
}

static void plain_finish(const void *st, const float *acc, float *out)
{
	const PlainSide *s = st;
	memcpy(out, acc, (size_t)s->type.dim * sizeof(float));
	kvquant_output_finish(&s->type, out);
}

static void plain_load_row(const void *st, const KvSideRows *rows, int64_t pos, float *ret)
{
	const PlainSide *s = st;
	kvquant_load(&s->type, kv_side_row(rows, pos), ret);
}

/* ---- session record ---- */

static size_t plain_record_bytes(const void *st, int64_t n_kv)
{
	return PLAIN_RECORD_BYTES;
}

static int plain_record_save(const void *st, const KvSideRows *rows, int64_t n_kv, uint8_t *out)
{
	const PlainSide *s = st;
	out[0] = (uint8_t)s->type.format;
	out[1] = s->type.hadamard;
	put_le(out + 2, (uint64_t)s->type.dim, 2);
	return 0;
}

static int plain_record_load(void *st, const KvSideRows *rows, int64_t n_kv, const uint8_t *in,
			     Error *err)
{
	const PlainSide *s = st;
	uint8_t want[PLAIN_RECORD_BYTES];
	plain_record_save(s, rows, n_kv, want);
	if (memcmp(in, want, sizeof(want)) != 0)
		return error_set(err, KVFORMAT_E_OTHER_TYPE, "saved as format %u%s at head_dim %u",
				 in[0], in[1] ? "+h" : "", (unsigned)get_le(in + 2, 2));
	return 0;
}

const KvFormatOps kvfmt_plain = {
	.name = "plain",
	.tag = KVREC_TAG('P', 'L', 'N', '1'),
	.parse = plain_parse,
	.type_name = plain_type_name,
	.type_equal = plain_type_equal,
	.vec_bytes = plain_vec_bytes,
	.supports = plain_supports,
	.init = plain_init,
	.free = plain_free,
	.state_bytes = plain_state_bytes,
	.append = plain_append,
	.query_bytes = plain_query_bytes,
	.query = plain_query,
	.scores = kvformat_row_scores,
	.values = kvformat_row_values,
	.to_stored = plain_to_stored,
	.finish = plain_finish,
	.load_row = plain_load_row,
	.record_bytes = plain_record_bytes,
	.record_save = plain_record_save,
	.record_load = plain_record_load,
};
