/*
 * fmt_centered.c: "+c", centered keys on any key format that does not
 * center by itself (kvformat.h): kvcenter.h keeps block 0 (binary16) and mu;
 * the inner format (plain or TurboQuant) stores k - mu for the positions
 * after block 0 (zero vectors in block 0's rows, never read), and scores
 * go back to the frame of the exact keys by <q, mu>.
 *
 * The inner format chooses what it chooses from raw keys (fix(): TQ's
 * outlier masks see the keys as they come, as they would without +c).
 *
 * == Session record (tag "CTR2"; "CTR1", of session files before version 6, held mu and block 0 in f32) ==
 *
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
} CenteredSide;

/* The inner type of a +c type: the same without +c. */
static KvType inner_type(const KvType *t)
{
	KvType in = *t;
	in.centered = false;
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
	if (role == KV_ROLE_V)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "+c on values (keys only)");
	if (dev == KV_DEVICE_CUDA) /* no kernels yet for the kept block 0 and mu */
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "centered keys (+c) run on the CPU only for now; drop the +c for the GPU");
	KvType in = inner_type(t);
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
	return sizeof(*s) + kvcenter_bytes(&s->center) + s->inner->state_bytes(s->inner_st);
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

static int centered_append(void *st, const KvSideRows *rows, int64_t pos0, int64_t n,
			   const float *x, size_t stride)
{
	CenteredSide *s = st;
	float row[TQ_MAX_DIM];
	int r = centered_fix(s, x, n, stride);
	if (r || (r = kvcenter_keep(&s->center, pos0, n, x, stride)))
		return r;
	for (int64_t t = 0; t < n; t++) {
		kvcenter_center(&s->center, pos0 + t, x + (size_t)t * stride, row);
		if ((r = s->inner->append(s->inner_st, rows, pos0 + t, 1, row, (size_t)s->center.dim)))
			return r;
	}
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

static void centered_load_row(const void *st, const KvSideRows *rows, int64_t pos, float *ret)
{
	const CenteredSide *s = st;
	int d = s->center.dim;
	if (pos < KV_BLOCK_TOKENS) {
		memcpy(ret, s->center.first + pos * d, (size_t)d * sizeof(float));
		return;
	}
	s->inner->load_row(s->inner_st, rows, pos, ret);
	for (int i = 0; i < d; i++)
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
	return r ? r : s->inner->record_load(s->inner_st, rows, n_kv, in, err);
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
	.load_row = centered_load_row,
	.record_bytes = centered_record_bytes,
	.record_save = centered_record_save,
	.record_load = centered_record_load,
};
