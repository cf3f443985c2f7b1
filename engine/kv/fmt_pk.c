/*
 * fmt_pk.c: pair-coded keys, the `pk<B>` key format (kvformat.h): each
 * block of 32 keys past block 0 coded by kvpk.h with a scale and a bit
 * width per RoPE pair, spent where the queries' energy is. Always
 * centered (kvcenter.h: block 0 exact, later keys stored minus mu).
 *
 * == What a side keeps ==
 *
 *   - w, the query energy per pair: the sum over positions 1..31 of the
 *     energies of the group's query heads in that pair, recorded by
 *     observe() (queries arrive before their keys) and fixed when
 *     position 31 is observed. Keys appended without their queries (a
 *     random fill) fix equal weights when position 31 is appended.
 *   - The stage: exact keys waiting for their block to be whole. A block
 *     is coded by the append that completes it; the stage keeps the rows
 *     of the last coded block and of the partial one after it, and a
 *     batch's rows until the next append (its queries read their own
 *     block exact, so scores do not depend on how a prompt was split).
 *     Rows of older blocks are let go at the next append.
 *   - A rewind (an append below the rows appended) into the last coded
 *     block finds its rows still exact; one into an earlier block puts
 *     that block's rows before pos0 back into the stage as the codes read
 *     (coded again once the block is whole).
 *
 * == Session record (tag "PKY1"), for a file of n_kv tokens ==
 *
 *   kvcenter.h's record (8 + 132 d bytes), then
 *   4      1 if w is chosen, else 0 (1 whenever n_kv >= 32)
 *   4      0
 *   2 d    w, d / 2 f32 (all zero while not chosen)
 *   64 d   only when n_kv < 32: the query energies of positions 0..31,
 *          32 x d / 2 f32
 *   4 d r  the exact keys of positions from = max(32, 32 (n_kv / 32 - 1))
 *          to n_kv - 1 (r = n_kv - from rows, none below 33 tokens: the
 *          last coded block and the partial one), f32
 *   all finite, the energies and weights not negative. In the LAYER
 *   sections the key region of a partial block is zeros (its keys are
 *   here), and blocks 1 .. n_kv / 32 - 1 must pass kvpk_block_coded().
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/kvpk.h"
#include "engine/kv/kvcenter.h"
#include "engine/kv/kvformat.h"
#include "kernels/cpu/kv_attn.h"

#define BT KV_BLOCK_TOKENS

typedef struct PkSide {
	KvCenter center;
	KvPk pk;
	KvAttnPkScoresFn scores;      /* chosen at run time (kv_attn.h) */
	int group;                    /* query heads per kv-head */
	float *qe;                    /* (BT, d/2) query energy per pair at positions 0..31 */
	float *w;                     /* (d/2) the weights, once w_chosen */
	bool w_chosen;
	float *stage;                 /* (stage_cap, d) exact keys of positions stage_pos.. */
	int64_t stage_cap, stage_pos; /* stage_pos: a block start >= BT */
	int64_t stage_n;              /* rows held from stage_pos */
	int64_t pk_blocks;            /* blocks 1 .. pk_blocks - 1 are coded */
} PkSide;

static int dim_of(const PkSide *s)
{
	return s->center.dim;
}

/* ---- types ---- */

static int pk_parse(const char *name, KvRole role, int dim, KvType *ret, Error *err)
{
	if (strncmp(name, "pk", 2) != 0)
		return -ENOENT;
	/* pk<B>: B code bits per coordinate, B d a whole number of bytes */
	char *end = NULL;
	size_t digits = strspn(name + 2, "0123456789.");
	double b = strtod(name + 2, &end);
	if (!end || *end != '\0' || name[2 + digits] != '\0' || !(b >= 1.0 && b <= 8.0) ||
	    name[2] < '0' || name[2] > '9')
		return error_set(err, KVTYPE_E_UNKNOWN, "unknown KV type '%s' (pk<B>, B in [1, 8])", name);
	if (role == KV_ROLE_V)
		return error_set(err, KVTYPE_E_ROLE, "V type '%s': pk is for keys only", name);
	double bits = b * dim;
	if (dim % 4 != 0 || bits != (double)(long)bits || (long)bits % 8 != 0)
		return error_set(err, KVTYPE_E_DIM,
				 "KV type '%s' at head_dim %d: B * head_dim must be a multiple of 8",
				 name, dim);
	*ret = (KvType){ .format = KV_FORMAT_PK, .centered = true, .dim = dim, .code_bits = (int)bits };
	return 0;
}

static void pk_type_name(const KvType *t, char *buf, size_t size)
{
	snprintf(buf, size, "pk%g", (double)t->code_bits / t->dim);
}

static bool pk_type_equal(const KvType *a, const KvType *b)
{
	return a->code_bits == b->code_bits;
}

static size_t pk_vec_bytes(const KvType *t)
{
	return kvpk_row_bytes(t->dim, t->code_bits);
}

static int pk_supports(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
		       Error *err)
{
	if (role == KV_ROLE_V || !t->centered)
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "pk values");
	if (shape->n_heads / shape->n_kv_heads > KVPK_MAX_GROUP)
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "pk keys take at most %d query heads per kv-head", KVPK_MAX_GROUP);
	if (dev == KV_DEVICE_CUDA) /* no kernels yet for kv_pk_layout.h's blocks */
		return error_set(err, KVFORMAT_E_UNSUPPORTED,
				 "pair-coded keys (pk) run on the CPU only for now; use a tq type on the GPU");
	return 0;
}

/* ---- a side ---- */

static void pk_free(void *st)
{
	PkSide *s = st;
	if (!s)
		return;
	kvcenter_fini(&s->center);
	free(s->qe);
	free(s->w);
	free(s->stage);
	free(s);
}

static int pk_init(const KvSideSetup *setup, void **ret_state, Error *err)
{
	const KvType *t = &setup->type;
	PkSide *s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(err, -ENOMEM, "out of memory");
	*s = (PkSide){ .group = setup->group, .pk_blocks = 1, .stage_pos = BT,
		       .scores = kv_attn_pk_scores_get() };
	s->qe = calloc_array((size_t)BT * t->dim / 2, sizeof(float));
	s->w = calloc_array((size_t)t->dim / 2, sizeof(float));
	int r = kvcenter_init(&s->center, t->dim);
	if (r || !s->qe || !s->w) {
		pk_free(s);
		return error_set(err, -ENOMEM, "out of memory");
	}
	if (kvpk_init(&s->pk, t->dim, t->code_bits) < 0) {
		pk_free(s);
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "layer %d: pk type the codec cannot read",
				 setup->layer);
	}
	*ret_state = s;
	return 0;
}

static size_t pk_state_bytes(const void *st)
{
	const PkSide *s = st;
	size_t d = (size_t)dim_of(s);
	return sizeof(*s) + kvcenter_bytes(&s->center) + (BT + 1) * d / 2 * sizeof(float) +
	       (size_t)s->stage_cap * d * sizeof(float);
}

/* The stage row of position p (stage_pos <= p < stage_pos + stage_n). */
static float *stage_row(const PkSide *s, int64_t p)
{
	return s->stage + (size_t)(p - s->stage_pos) * dim_of(s);
}

/* Room for the stage to hold rows rows (growing at least twofold). 0 or -ENOMEM. */
static int stage_reserve(PkSide *s, int64_t rows)
{
	if (rows <= s->stage_cap)
		return 0;
	int64_t cap = MAX(rows, 2 * s->stage_cap);
	float *grown = realloc(s->stage, (size_t)cap * dim_of(s) * sizeof(float));
	if (!grown)
		return -ENOMEM;
	s->stage = grown;
	s->stage_cap = cap;
	return 0;
}

/* Row t of coded block b as attention reads it, plus mu: the key back. */
static void coded_row(const PkSide *s, const KvSideRows *rows, int64_t b, int t, float *y)
{
	kvpk_decode_row(&s->pk, kv_side_region(rows, b), t, y);
	for (int i = 0; i < dim_of(s); i++)
		y[i] += s->center.mu[i];
}

static void pk_observe(void *st, int64_t pos0, int64_t n, const float *q, size_t stride)
{
	PkSide *s = st;
	int d = dim_of(s), P = d / 2, G = s->group;
	if (s->w_chosen)
		return;
	for (int64_t t = 0; t < n && pos0 + t < BT; t++) {
		float *e = s->qe + (size_t)(pos0 + t) * P;
		const float *qt = q + (size_t)t * stride; /* (G, d) */
		for (int i = 0; i < P; i++) {
			float sum = 0.0f;
			for (int g = 0; g < G; g++)
				sum += qt[g * d + 2 * i] * qt[g * d + 2 * i] +
				       qt[g * d + 2 * i + 1] * qt[g * d + 2 * i + 1];
			e[i] = sum;
		}
	}
	if (pos0 + n >= BT) {
		for (int i = 0; i < P; i++) {
			float sum = 0.0f;
			for (int p = 1; p < BT; p++)
				sum += s->qe[(size_t)p * P + i];
			s->w[i] = isfinite(sum) ? sum : 1.0f;
		}
		s->w_chosen = true;
	}
}

/*
 * The first row the stage keeps for what comes next: the last coded
 * block's. Rows below it served the queries of the batch that coded them
 * and are let go at the next append (stage_trim()); a session file reads
 * them from the codes already, as that append would.
 */
static int64_t stage_keep_from(const PkSide *s)
{
	return MAX(s->stage_pos, MAX((int64_t)BT, (s->pk_blocks - 1) * BT));
}

/* Before an append: let go of the rows of coded blocks but the last (their queries have run). */
static void stage_trim(PkSide *s)
{
	int64_t keep_from = stage_keep_from(s);
	if (keep_from <= s->stage_pos)
		return;
	int64_t n = MAX(0, s->stage_pos + s->stage_n - keep_from);
	memmove(s->stage, s->stage + (size_t)(keep_from - s->stage_pos) * dim_of(s),
		(size_t)n * dim_of(s) * sizeof(float));
	s->stage_pos = keep_from;
	s->stage_n = n;
}

/*
 * The append's rows x (n, stride) of positions pos0.. into the stage,
 * after what a rewind below the coded blocks needs (see the top).
 */
static int stage_put(PkSide *s, const KvSideRows *rows, int64_t pos0, int64_t n, const float *x,
		     size_t stride)
{
	int d = dim_of(s);
	int64_t end = pos0 + n;
	if (pos0 < s->pk_blocks * BT) {
		int64_t b = MAX(1, pos0 / BT);
		if (b * BT < s->stage_pos && pos0 > b * BT) {
			/* the block is coded: its first pos0 - b*BT rows come back from the codes */
			if (stage_reserve(s, BT) < 0)
				return -ENOMEM;
			for (int t = 0; t < pos0 - b * BT; t++)
				coded_row(s, rows, b, t, s->stage + (size_t)t * d);
			s->stage_pos = b * BT;
		} else if (b * BT < s->stage_pos) {
			s->stage_pos = b * BT; /* nothing before pos0 to keep */
		}
		s->pk_blocks = b;
	}
	if (stage_reserve(s, end - s->stage_pos) < 0)
		return -ENOMEM;
	for (int64_t t = 0; t < n; t++)
		if (pos0 + t >= s->stage_pos)
			memcpy(stage_row(s, pos0 + t), x + (size_t)t * stride, (size_t)d * sizeof(float));
	s->stage_n = MAX(0, end - s->stage_pos);
	return 0;
}

static int pk_append(void *st, const KvSideRows *rows, int64_t pos0, int64_t n, const float *x,
		     size_t stride)
{
	PkSide *s = st;
	int r;
	stage_trim(s);
	if ((r = kvcenter_keep(&s->center, pos0, n, x, stride)) ||
	    (r = stage_put(s, rows, pos0, n, x, stride)))
		return r;
	if (!s->w_chosen && pos0 + n >= BT) {
		/* position 31's key came without its query: equal weights */
		for (int i = 0; i < dim_of(s) / 2; i++)
			s->w[i] = 1.0f;
		s->w_chosen = true;
	}
	for (int64_t b = s->pk_blocks; (b + 1) * BT <= pos0 + n; b++) {
		kvpk_encode_block(&s->pk, stage_row(s, b * BT), BT, s->center.mu, s->w,
				  kv_side_region(rows, b));
		s->pk_blocks = b + 1;
	}
	return 0;
}

/* ---- attention ---- */

/* prep: qmu (G floats); the kernels read the queries as given. */
static size_t pk_query_bytes(const void *st, int G)
{
	return (size_t)G * sizeof(float);
}

static void pk_query(const void *st, const float *q, int G, void *prep)
{
	const PkSide *s = st;
	kvcenter_qmu(&s->center, q, G, 1.0f / sqrtf((float)dim_of(s)), prep);
}

/*
 * Block 0 and the query's own block from exact keys, blocks between from
 * the codes of k - mu plus <q, mu> (kvcenter_scores()).
 */
static void pk_scores(const void *st, const KvSideRows *rows, const float *q, const void *prep,
		      int G, int64_t b, int64_t own, int n, float scale, float *scores, int ld)
{
	const PkSide *s = st;
	if (b == own && b > 0) {
		kvformat_exact_scores(stage_row(s, b * BT), dim_of(s), q, G, n, scale, scores, ld);
		return;
	}
	if (b > 0)
		s->scores(&s->pk.rows, kv_side_region(rows, b), q, G, n, scale, scores, ld);
	kvcenter_scores(&s->center, q, G, b, n, scale, prep, scores, ld);
}

/* The key of pos as a query of a later block reads it: exact in block 0, else from its codes. */
static void pk_load_row(const void *st, const KvSideRows *rows, int64_t pos, float *ret)
{
	const PkSide *s = st;
	int d = dim_of(s);
	if (pos < BT)
		memcpy(ret, s->center.first + pos * d, (size_t)d * sizeof(float));
	else if (pos / BT < s->pk_blocks)
		coded_row(s, rows, pos / BT, (int)(pos % BT), ret);
	else
		memcpy(ret, stage_row(s, pos), (size_t)d * sizeof(float));
}

/* ---- session record ---- */

/* The first position of the record's exact keys for n_kv tokens. */
static int64_t tail_from(int64_t n_kv)
{
	int64_t whole = MAX(1, n_kv / BT);
	return MAX((int64_t)BT, (whole - 1) * BT);
}

static size_t pk_record_bytes(const void *st, int64_t n_kv)
{
	const PkSide *s = st;
	size_t d = (size_t)dim_of(s);
	size_t floats = d / 2 + (n_kv < BT ? BT * d / 2 : 0) + (size_t)MAX(0, n_kv - tail_from(n_kv)) * d;
	return kvcenter_record_bytes((int)d) + 8 + 4 * floats;
}

static int pk_record_save(const void *st, const KvSideRows *rows, int64_t n_kv, uint8_t *out)
{
	const PkSide *s = st;
	int d = dim_of(s);
	float y[KVPK_MAX_DIM];
	kvcenter_record_save(&s->center, &out);
	kvrec_put_u32(&out, s->w_chosen);
	kvrec_put_u32(&out, 0);
	kvrec_put_floats(&out, s->w, (size_t)d / 2);
	if (n_kv < BT)
		kvrec_put_floats(&out, s->qe, (size_t)BT * d / 2);
	int64_t keep = stage_keep_from(s);
	for (int64_t p = tail_from(n_kv); p < n_kv; p++) {
		/*
		 * Rows appended past n_kv and coded (an evaluation that was then
		 * abandoned) may have let these rows go: they read back from the
		 * codes, as the next append would.
		 */
		if (p >= keep && p < s->stage_pos + s->stage_n)
			memcpy(y, stage_row(s, p), (size_t)d * sizeof(float));
		else
			coded_row(s, rows, p / BT, (int)(p % BT), y);
		kvrec_put_floats(&out, y, (size_t)d);
	}
	return 0;
}

static bool none_negative(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (x[i] < 0)
			return false;
	return true;
}

static int pk_record_load(void *st, const KvSideRows *rows, int64_t n_kv, const uint8_t *in,
			  Error *err)
{
	PkSide *s = st;
	int d = dim_of(s), P = d / 2;
	int64_t whole = MAX(1, n_kv / BT), from = tail_from(n_kv), n_tail = MAX(0, n_kv - from);
	int r = kvcenter_record_load(&s->center, n_kv, &in, err);
	if (r)
		return r;
	uint32_t chosen = kvrec_get_u32(&in), reserved = kvrec_get_u32(&in);
	if (chosen > 1 || reserved || (!chosen && n_kv >= BT))
		return error_set(err, KVFORMAT_E_CORRUPT, "pk state %u with %lld tokens", chosen,
				 (long long)n_kv);
	if (stage_reserve(s, n_tail) < 0)
		return -ENOMEM;
	if (!kvrec_get_floats(&in, s->w, (size_t)P) || !none_negative(s->w, (size_t)P) ||
	    (n_kv < BT && (!kvrec_get_floats(&in, s->qe, (size_t)BT * P) ||
			   !none_negative(s->qe, (size_t)BT * P))) ||
	    !kvrec_get_floats(&in, s->stage, (size_t)n_tail * d))
		return error_set(err, KVFORMAT_E_CORRUPT, "pk keys: a weight, energy or key not finite, "
				 "or negative");
	for (int i = 0; !chosen && i < P; i++)
		if (s->w[i] != 0)
			return error_set(err, KVFORMAT_E_CORRUPT, "pk weights while not chosen");
	for (int64_t b = MAX(1, rows->first); b < whole; b++)
		if (b >= rows->n_blocks || !rows->blocks[b] ||
		    !kvpk_block_coded(&s->pk, kv_side_region(rows, b)))
			return error_set(err, KVFORMAT_E_CORRUPT, "pk block %lld is not a coded block",
					 (long long)b);
	if (n_kv >= BT)
		memset(s->qe, 0, (size_t)BT * P * sizeof(float));
	s->w_chosen = chosen;
	s->pk_blocks = whole;
	s->stage_pos = from;
	s->stage_n = n_tail;
	return 0;
}

/* A partial block's keys are in the record: its key region is saved as zeros. */
static void pk_region_save(const void *st, const uint8_t *region, int64_t b, int n, uint8_t *out)
{
	const PkSide *s = st;
	size_t bytes = (size_t)BT * s->pk.row_bytes;
	if (n < BT)
		memset(out, 0, bytes);
	else
		memcpy(out, region, bytes);
}

const KvFormatOps kvfmt_pk = {
	.name = "pk",
	.tag = KVREC_TAG('P', 'K', 'Y', '1'),
	.centers = true,
	.parse = pk_parse,
	.type_name = pk_type_name,
	.type_equal = pk_type_equal,
	.vec_bytes = pk_vec_bytes,
	.supports = pk_supports,
	.init = pk_init,
	.free = pk_free,
	.state_bytes = pk_state_bytes,
	.observe = pk_observe,
	.append = pk_append,
	.query_bytes = pk_query_bytes,
	.query = pk_query,
	.scores = pk_scores,
	.load_row = pk_load_row,
	.record_bytes = pk_record_bytes,
	.record_save = pk_record_save,
	.record_load = pk_record_load,
	.region_save = pk_region_save,
};
