/*
 * fmt_pk.c: pair-coded keys, the `pk<B>` key format (kvformat.h): each
 * block of 32 keys past block 0 coded by kvpk.h with a scale and a bit
 * width per RoPE pair, spent where the queries' energy is. Always
 * centered: block 0 kept as binary16 (kvcenter.h), the keys of block b
 * stored minus c_b, the mean of the keys before RoPE (taken over block 0)
 * turned to block b (kvropemean.h; without a known RoPE, c_b is block 0's
 * mean mu for every b).
 *
 * == What a side keeps ==
 *
 *   - w, the query energy per pair: the sum over positions 1..31 of the
 *     energies of the group's query heads in that pair (each energy
 *     bfloat16-rounded), recorded by observe() (queries arrive before
 *     their keys) and chosen when position 31 is observed (again after
 *     a rewind below it, as kvcenter.h's mu). Keys appended without
 *     their queries (a random fill) choose equal weights when position
 *     31 is appended.
 *   - The stage: keys waiting for their block to be whole, kept
 *     binary16-rounded (kvformat_round_f16(), as block 0). A block
 *     is coded by the append that completes it; the stage keeps the rows
 *     of the last coded block and of the partial one after it, and a
 *     batch's rows until the next append (its queries read their own
 *     block as staged, so scores do not depend on how a prompt was split).
 *     Rows of older blocks are let go at the next append.
 *   - A rewind (an append below the rows appended) into the last coded
 *     block finds its rows still staged; one into an earlier block puts
 *     that block's rows before pos0 back into the stage as the codes read
 *     (coded again once the block is whole).
 *
 * == Session record (tag "PKY3"), for a file of n_kv tokens ==
 *
 * ("PKY1", of session files before version 6, held f32 keys and energies;
 * "PKY2" is this record with the blocks coded minus mu at every block:
 * its files are recomputed, SESSION_E_KV_TYPE.)
 *
 *   size         field
 *   2 d m        kvcenter.h's record: the keys of positions 0 .. m - 1,
 *                m = min(n_kv, 32), binary16
 *   4            how w was chosen: 0 not yet (n_kv < 32), 1 from the
 *                energies below, 2 equal weights (keys came without
 *                queries); 0 exactly when n_kv < 32
 *   d (m - 1)    the query energies of positions 1 .. m - 1, d / 2
 *                bfloat16 each (position 0's are never used)
 *   2 d r        the keys of positions from = max(32, 32 (n_kv / 32 - 1))
 *                to n_kv - 1 (r = n_kv - from rows, none below 33 tokens:
 *                the last coded block and the partial one), binary16
 *   all finite, the energies not negative. w is rebuilt on load (the sum
 *   observe() takes, or ones), mu and the centers c_b from block 0 and the
 *   model's RoPE (kvcenter.h, kvropemean.h). In the LAYER
 *   sections block 0's key region and a partial block's take no bytes
 *   (their keys are here; the region is zeros), and blocks 1 .. n_kv / 32
 *   - 1 must pass kvpk_block_coded().
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/codec/kvpk.h"
#include "engine/kv/kvcenter.h"
#include "engine/kv/kvformat.h"
#include "engine/kv/kvropemean.h"
#include "kernels/cpu/kv_attn.h"

#define BT KV_BLOCK_TOKENS

/* The record's field sizes (above): binary16 keys, bfloat16 energies, a u32 word. */
static_assert(sizeof(tkv_half) == 2 && sizeof(tkv_bf16) == 2, "2-byte keys and energies");
static_assert(BT == 32, "block 0 is positions 0..31");

typedef struct PkSide {
	KvCenter center;
	KvRopeMean rmean;             /* the blocks' centers c_b */
	KvPk pk;
	KvAttnPkScoresFn scores;      /* chosen at run time (kv_attn.h) */
	int group;                    /* query heads per kv-head */
	float *qe;                    /* (BT, d/2) query energy per pair at positions 0..31 */
	float *w;                     /* (d/2) the weights, once w_chosen */
	bool w_chosen;
	int w_source;                 /* how: 1 from qe, 2 equal weights (the record's word) */
	bool w_observed;              /* observe() chose w for the append that comes next */
	float *stage;                 /* (stage_cap, d) keys (binary16-rounded) of positions stage_pos.. */
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
	kvropemean_fini(&s->rmean);
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
	if (!r)
		r = kvropemean_init(&s->rmean, t->dim, setup->rope);
	if (r == -EINVAL) {
		pk_free(s);
		return error_set(err, KVFORMAT_E_UNSUPPORTED, "layer %d: RoPE over more channels than a head",
				 setup->layer);
	}
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
	return sizeof(*s) + kvcenter_bytes(&s->center) + kvropemean_bytes(&s->rmean) +
	       (BT + 1) * d / 2 * sizeof(float) +
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

/* Row t of coded block b as attention reads it, plus c_b: the key back. */
static void coded_row(const PkSide *s, const KvSideRows *rows, int64_t b, int t, float *y)
{
	float c[KVPK_MAX_DIM];
	kvpk_decode_row(&s->pk, kv_side_region(rows, b), t, y);
	kvropemean_center(&s->rmean, b, c);
	for (int i = 0; i < dim_of(s); i++)
		y[i] += c[i];
}

/* w from the energies of positions 1..31. */
static void weights_from_energies(PkSide *s)
{
	int P = dim_of(s) / 2;
	for (int i = 0; i < P; i++) {
		float sum = 0.0f;
		for (int p = 1; p < BT; p++)
			sum += s->qe[(size_t)p * P + i];
		s->w[i] = isfinite(sum) ? sum : 1.0f;
	}
	s->w_chosen = true;
	s->w_source = 1;
}

static void equal_weights(PkSide *s)
{
	for (int i = 0; i < dim_of(s) / 2; i++)
		s->w[i] = 1.0f;
	s->w_chosen = true;
	s->w_source = 2;
}

/* Row x (d,) into the stage row at, binary16-rounded. */
static void stage_copy(const PkSide *s, float *at, const float *x)
{
	for (int i = 0; i < dim_of(s); i++)
		at[i] = kvformat_round_f16(x[i]);
}

static void pk_observe(void *st, int64_t pos0, int64_t n, const float *q, size_t stride)
{
	PkSide *s = st;
	int d = dim_of(s), P = d / 2, G = s->group;
	if (pos0 >= BT)
		return;
	for (int64_t t = 0; t < n && pos0 + t < BT; t++) {
		float *e = s->qe + (size_t)(pos0 + t) * P;
		const float *qt = q + (size_t)t * stride; /* (G, d) */
		for (int i = 0; i < P; i++) {
			float sum = 0.0f;
			for (int g = 0; g < G; g++)
				sum += qt[g * d + 2 * i] * qt[g * d + 2 * i] +
				       qt[g * d + 2 * i + 1] * qt[g * d + 2 * i + 1];
			e[i] = kvformat_round_bf16(sum);
		}
	}
	if (pos0 + n >= BT) {
		weights_from_energies(s);
		s->w_observed = true;
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
			for (int t = 0; t < pos0 - b * BT; t++) {
				float *y = s->stage + (size_t)t * d;
				coded_row(s, rows, b, t, y);
				stage_copy(s, y, y);
			}
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
			stage_copy(s, stage_row(s, pos0 + t), x + (size_t)t * stride);
	s->stage_n = MAX(0, end - s->stage_pos);
	return 0;
}

static int pk_append(void *st, const KvSideRows *rows, int64_t pos0, int64_t n, const float *x,
		     size_t stride)
{
	PkSide *s = st;
	int r;
	stage_trim(s);
	if ((r = kvcenter_keep(&s->center, pos0, n, x, stride)))
		return r;
	if (pos0 < BT && pos0 + n >= BT) /* mu was chosen (again): so are the centers */
		kvropemean_choose(&s->rmean, &s->center);
	if ((r = stage_put(s, rows, pos0, n, x, stride)))
		return r;
	if (pos0 < BT && pos0 + n >= BT && !s->w_observed)
		equal_weights(s); /* position 31's key came without its query */
	s->w_observed = false;
	for (int64_t b = s->pk_blocks; (b + 1) * BT <= pos0 + n; b++) {
		float c[KVPK_MAX_DIM];
		kvropemean_center(&s->rmean, b, c);
		kvpk_encode_block(&s->pk, stage_row(s, b * BT), BT, c, s->w, kv_side_region(rows, b));
		s->pk_blocks = b + 1;
	}
	return 0;
}

/* ---- attention ---- */

/* prep: kvropemean_query()'s (G, 2 n_pairs + 1) floats; the kernels read the queries as given. */
static size_t pk_query_bytes(const void *st, int G)
{
	const PkSide *s = st;
	return (size_t)G * kvropemean_query_floats(&s->rmean) * sizeof(float);
}

static void pk_query(const void *st, const float *q, int G, void *prep)
{
	const PkSide *s = st;
	kvropemean_query(&s->rmean, q, G, 1.0f / sqrtf((float)dim_of(s)), prep);
}

/*
 * Block 0 and the query's own block from the kept (binary16) keys, blocks between from
 * the codes of k - c_b plus <q, c_b> (kvropemean_add()).
 */
static void pk_scores(const void *st, const KvSideRows *rows, const float *q, const void *prep,
		      int G, int64_t b, int64_t own, int n, float scale, float *scores, int ld)
{
	const PkSide *s = st;
	if (b == own && b > 0) {
		kvformat_exact_scores(stage_row(s, b * BT), dim_of(s), q, G, n, scale, scores, ld);
		return;
	}
	if (b == 0) {
		kvcenter_scores(&s->center, q, G, b, n, scale, NULL, scores, ld);
		return;
	}
	s->scores(&s->pk.rows, kv_side_region(rows, b), q, G, n, scale, scores, ld);
	kvropemean_add(&s->rmean, prep, G, b, n, scores, ld);
}

/* The key of pos as a query of a later block reads it: as kept in block 0, else from its codes. */
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

/* The first position of the record's tail keys for n_kv tokens. */
static int64_t tail_from(int64_t n_kv)
{
	int64_t whole = MAX(1, n_kv / BT);
	return MAX((int64_t)BT, (whole - 1) * BT);
}

/* Positions 1 .. m - 1 whose energies the record holds. */
static int64_t energy_rows(int64_t n_kv)
{
	return MAX(0, MIN(n_kv, (int64_t)BT) - 1);
}

static size_t pk_record_bytes(const void *st, int64_t n_kv)
{
	const PkSide *s = st;
	size_t d = (size_t)dim_of(s);
	return kvcenter_record_bytes((int)d, n_kv) + 4 + (size_t)energy_rows(n_kv) * d +
	       (size_t)MAX(0, n_kv - tail_from(n_kv)) * 2 * d;
}

static int pk_record_save(const void *st, const KvSideRows *rows, int64_t n_kv, uint8_t *out)
{
	const PkSide *s = st;
	int d = dim_of(s);
	float y[KVPK_MAX_DIM];
	kvcenter_record_save(&s->center, n_kv, &out);
	kvrec_put_u32(&out, n_kv >= BT ? (uint32_t)s->w_source : 0);
	kvrec_put_bf16(&out, s->qe + d / 2, (size_t)energy_rows(n_kv) * d / 2);
	int64_t keep = stage_keep_from(s);
	for (int64_t p = tail_from(n_kv); p < n_kv; p++) {
		/*
		 * Rows appended past n_kv and coded (an evaluation that was then
		 * abandoned) may have let these rows go: they read back from the
		 * codes, as the next append would (rounded as it rounds them).
		 */
		if (p >= keep && p < s->stage_pos + s->stage_n)
			memcpy(y, stage_row(s, p), (size_t)d * sizeof(float));
		else {
			coded_row(s, rows, p / BT, (int)(p % BT), y);
			stage_copy(s, y, y);
		}
		kvrec_put_f16(&out, y, (size_t)d);
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
	size_t n_energy = (size_t)energy_rows(n_kv) * P;
	int r = kvcenter_record_load(&s->center, n_kv, &in, err);
	if (r)
		return r;
	kvropemean_choose(&s->rmean, &s->center);
	uint32_t source = kvrec_get_u32(&in);
	if (source > 2 || (source == 0) != (n_kv < BT))
		return error_set(err, KVFORMAT_E_CORRUPT, "pk weights chosen by %u with %lld tokens",
				 source, (long long)n_kv);
	if (stage_reserve(s, n_tail) < 0)
		return -ENOMEM;
	memset(s->qe, 0, (size_t)BT * P * sizeof(float));
	if (!kvrec_get_bf16(&in, s->qe + P, n_energy) || !none_negative(s->qe + P, n_energy) ||
	    !kvrec_get_f16(&in, s->stage, (size_t)n_tail * d))
		return error_set(err, KVFORMAT_E_CORRUPT, "pk keys: an energy or key not finite, "
				 "or an energy negative");
	for (int64_t b = MAX(1, rows->first); b < whole; b++)
		if (b >= rows->n_blocks || !rows->blocks[b] ||
		    !kvpk_block_coded(&s->pk, kv_side_region(rows, b)))
			return error_set(err, KVFORMAT_E_CORRUPT, "pk block %lld is not a coded block",
					 (long long)b);
	memset(s->w, 0, (size_t)P * sizeof(float));
	s->w_chosen = false;
	s->w_source = 0;
	s->w_observed = false;
	if (source == 1)
		weights_from_energies(s);
	else if (source == 2)
		equal_weights(s);
	s->pk_blocks = whole;
	s->stage_pos = from;
	s->stage_n = n_tail;
	return 0;
}

/* Block 0's and a partial block's keys are in the records: those regions take no bytes. */
static size_t pk_region_file_bytes(const void *st, int64_t b, int n)
{
	const PkSide *s = st;
	return b == 0 || n < BT ? 0 : (size_t)BT * s->pk.row_bytes;
}

const KvFormatOps kvfmt_pk = {
	.name = "pk",
	.tag = KVREC_TAG('P', 'K', 'Y', '3'),
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
	.region_file_bytes = pk_region_file_bytes,
};
