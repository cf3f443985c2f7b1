/*
 * fmt_centered.c: "+c", centered keys on any key format that does not
 * center by itself (kvformat.h): kvcenter.h keeps block 0 (binary16) and mu;
 * the inner format (plain or TurboQuant) stores k - mu for the positions
 * after block 0 (zero vectors in block 0's rows, never read), and scores
 * go back to the frame of the exact keys by <q, mu>.
 *
 * And "+s" on values (kvtype.h): the same kept block 0, no mean. The inner
 * format stores v for the positions after block 0 (zero vectors in block
 * 0's rows); values() adds block 0's kept rows, put into the inner
 * format's stored domain by its to_stored() whenever block 0 changes
 * (first_stored), to the accumulator, and finish() is the inner format's.
 * Nothing depends on when position 31 comes, so outputs do not depend on
 * how a prompt is split either.
 *
 * The inner format chooses what it chooses from raw keys (fix(): TQ's
 * outlier masks see the keys as they come, as they would without +c).
 *
 * == Session record (tag "CTR2"; "CTR1", of session files before version 6, held mu and block 0 in f32) ==
 *
 *   The same for +s values (mu, rebuilt on load, is not used there).
 *   kvcenter.h's record (2 d min(n_kv, 32) bytes), then the inner
 *   format's record (its own tag is implied by the plan; its length by
 *   its record_bytes). In the LAYER sections block 0's inner rows (zero
 *   vectors as the inner format codes them) are stored as any rows.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kvcenter.h"
#include "engine/kv/kvformat.h"

typedef struct CenteredSide {
	KvCenter center;
	const KvFormatOps *inner;
	void *inner_st;
	float *first_stored; /* +s values: (32, d) block 0 in the inner's stored domain; NULL for keys */
} CenteredSide;

/* The inner type of a +c or +s type: the same without it. */
static KvType inner_type(const KvType *t)
{
	KvType in = *t;
	in.centered = false;
	in.sink = false;
	return in;
}

/* ---- types: the inner format's, +c is added by kvtype.c ---- */

static int centered_parse(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	return -ENOENT; /* "<inner>+c": kvtype.c strips the suffix and sets centered */
}

static void centered_type_name(const KvType *t, char *buf, size_t size)
{
	KvType in = inner_type(t);
	kvformat_of(&in)->type_name(&in, buf, size);
}

static bool centered_type_equal(const KvType *a, const KvType *b)
{
	KvType x = inner_type(a), y = inner_type(b);
	return kvformat_of(&x)->type_equal(&x, &y);
}

static size_t centered_vec_bytes(const KvType *t)
{
	KvType in = inner_type(t);
	return kvformat_of(&in)->vec_bytes(&in);
}

static int centered_supports(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
			     Error *err)
{
	if (role == KV_ROLE_V && !t->sink)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "+c on values (keys only)");
	if (role == KV_ROLE_K && t->sink)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "+s on keys (values only)");
	if (dev == KV_DEVICE_CUDA) /* no kernels yet for the kept block 0 and mu */
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "%s run on the CPU only for now; drop the %s for the GPU",
				 t->sink ? "exact sink values (+s)" : "centered keys (+c)", t->sink ? "+s" : "+c");
	KvType in = inner_type(t);
	if (t->sink && !kvformat_of(&in)->to_stored)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "+s on %s values", kvformat_of(&in)->name);
	return kvformat_supports(&in, role, shape, dev, err);
}

/* ---- a side ---- */

static void centered_free(void *st)
{
	CenteredSide *s = st;
	if (!s)
		return;
	if (s->inner_st)
		s->inner->free(s->inner_st);
	kvcenter_fini(&s->center);
	free(s->first_stored);
	free(s);
}

static int centered_init(const KvSideSetup *setup, void **ret_state, Error *err)
{
	CenteredSide *s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(err, -ENOMEM, "out of memory");
	KvSideSetup in = *setup;
	in.type = inner_type(&setup->type);
	s->inner = kvformat_of(&in.type);
	int r = kvcenter_init(&s->center, setup->type.dim);
	if (!r && setup->type.sink &&
	    !(s->first_stored = calloc_array((size_t)KV_BLOCK_TOKENS * setup->type.dim, sizeof(float))))
		r = -ENOMEM;
	if (r)
		r = error_set(err, r, "out of memory");
	else
		r = s->inner->init(&in, &s->inner_st, err);
	if (r) {
		centered_free(s);
		return r;
	}
	*ret_state = s;
	return 0;
}

static size_t centered_state_bytes(const void *st)
{
	const CenteredSide *s = st;
	return sizeof(*s) + kvcenter_bytes(&s->center) + s->inner->state_bytes(s->inner_st) +
	       (s->first_stored ? (size_t)KV_BLOCK_TOKENS * s->center.dim * sizeof(float) : 0);
}

static const void *centered_inner(const void *st, const KvFormatOps **ret_ops)
{
	const CenteredSide *s = st;
	*ret_ops = s->inner;
	return s->inner_st;
}

static int centered_fix(void *st, const float *x, int64_t n, size_t stride)
{
	CenteredSide *s = st;
	return s->inner->fix ? s->inner->fix(s->inner_st, x, n, stride) : 0;
}

/*
 * +s values: first_stored rows 0 .. m - 1 from the kept block 0. The
 * inner side has its codec (an append or a record came first).
 */
static void first_stored_update(CenteredSide *s, int64_t m)
{
	int d = s->center.dim;
	for (int64_t p = 0; p < MIN(m, (int64_t)KV_BLOCK_TOKENS); p++)
		s->inner->to_stored(s->inner_st, s->center.first + p * d, s->first_stored + p * d);
}

static int centered_append(void *st, const KvSideRows *rows, int64_t pos0, int64_t n,
			   const float *x, size_t stride)
{
	CenteredSide *s = st;
	float row[TQ_MAX_DIM];
	int r = centered_fix(s, x, n, stride);
	if (r || (r = kvcenter_keep(&s->center, pos0, n, x, stride)))
		return r;
	for (int64_t t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * stride;
		if (!s->first_stored)
			kvcenter_center(&s->center, pos0 + t, xt, row);
		else if (pos0 + t < KV_BLOCK_TOKENS)
			memset(row, 0, (size_t)s->center.dim * sizeof(float));
		else
			memcpy(row, xt, (size_t)s->center.dim * sizeof(float));
		if ((r = s->inner->append(s->inner_st, rows, pos0 + t, 1, row, (size_t)s->center.dim)))
			return r;
	}
	if (s->first_stored && pos0 < KV_BLOCK_TOKENS)
		first_stored_update(s, pos0 + n);
	return 0;
}

/* ---- attention ---- */

/* prep: the inner format's G prepared heads, then qmu (G floats). */
static size_t centered_query_bytes(const void *st, int G)
{
	const CenteredSide *s = st;
	return s->inner->query_bytes(s->inner_st, G) + (size_t)G * sizeof(float);
}

static float *prep_qmu(const CenteredSide *s, const void *prep, int G)
{
	return (float *)((uint8_t *)prep + s->inner->query_bytes(s->inner_st, G));
}

static void centered_query(const void *st, const float *q, int G, void *prep)
{
	const CenteredSide *s = st;
	s->inner->query(s->inner_st, q, G, prep);
	kvcenter_qmu(&s->center, q, G, 1.0f / sqrtf((float)s->center.dim), prep_qmu(s, prep, G));
}

static void centered_scores(const void *st, const KvSideRows *rows, const float *q, const void *prep,
			    int G, int64_t b, int64_t own, int n, float scale, float *scores, int ld)
{
	const CenteredSide *s = st;
	if (b > 0)
		s->inner->scores(s->inner_st, rows, q, prep, G, b, own, n, scale, scores, ld);
	kvcenter_scores(&s->center, q, G, b, n, scale, prep_qmu(s, prep, G), scores, ld);
}

/* +s values: block 0 from first_stored (exact), later blocks the inner format's rows. */
static void centered_values(const void *st, const uint8_t *region, int64_t b, const float *p, int ld,
			    int G, int n, float *acc, int acc_ld)
{
	const CenteredSide *s = st;
	int d = s->center.dim;
	if (b > 0) {
		s->inner->values(s->inner_st, region, b, p, ld, G, n, acc, acc_ld);
		return;
	}
	for (int g = 0; g < G; g++) {
		float *a = acc + (size_t)g * acc_ld;
		for (int t = 0; t < n; t++) {
			float w = p[(size_t)g * ld + t];
			const float *x = s->first_stored + (size_t)t * d;
			for (int i = 0; i < d; i++)
				a[i] += w * x[i];
		}
	}
}

static void centered_finish(const void *st, const float *acc, float *out)
{
	const CenteredSide *s = st;
	s->inner->finish(s->inner_st, acc, out);
}

static void centered_load_row(const void *st, const KvSideRows *rows, int64_t pos, float *ret)
{
	const CenteredSide *s = st;
	int d = s->center.dim;
	if (pos < KV_BLOCK_TOKENS) {
		memcpy(ret, s->center.first + pos * d, (size_t)d * sizeof(float));
		return;
	}
	s->inner->load_row(s->inner_st, rows, pos, ret);
	for (int i = 0; s->first_stored == NULL && i < d; i++)
		ret[i] += s->center.mu[i];
}

/* ---- session record ---- */

static size_t centered_record_bytes(const void *st, int64_t n_kv)
{
	const CenteredSide *s = st;
	return kvcenter_record_bytes(s->center.dim, n_kv) + s->inner->record_bytes(s->inner_st, n_kv);
}

static int centered_record_save(const void *st, const KvSideRows *rows, int64_t n_kv, uint8_t *out)
{
	const CenteredSide *s = st;
	kvcenter_record_save(&s->center, n_kv, &out);
	return s->inner->record_save(s->inner_st, rows, n_kv, out);
}

static int centered_record_load(void *st, const KvSideRows *rows, int64_t n_kv, const uint8_t *in,
				Error *err)
{
	CenteredSide *s = st;
	int r = kvcenter_record_load(&s->center, n_kv, &in, err);
	if (!r)
		r = s->inner->record_load(s->inner_st, rows, n_kv, in, err);
	if (!r && s->first_stored)
		first_stored_update(s, n_kv);
	return r;
}

const KvFormatOps kvfmt_centered = {
	.name = "centered",
	.tag = KVREC_TAG('C', 'T', 'R', '2'),
	.parse = centered_parse,
	.type_name = centered_type_name,
	.type_equal = centered_type_equal,
	.vec_bytes = centered_vec_bytes,
	.supports = centered_supports,
	.init = centered_init,
	.free = centered_free,
	.state_bytes = centered_state_bytes,
	.inner = centered_inner,
	.fix = centered_fix,
	.append = centered_append,
	.query_bytes = centered_query_bytes,
	.query = centered_query,
	.scores = centered_scores,
	.values = centered_values,
	.finish = centered_finish,
	.load_row = centered_load_row,
	.record_bytes = centered_record_bytes,
	.record_save = centered_record_save,
	.record_load = centered_record_load,
};
