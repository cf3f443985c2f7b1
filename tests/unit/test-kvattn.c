/*
 * test-kvattn.c: the SIMD KV attention kernels (kernels/cpu/kv_attn.h:
 * AVX2 and AVX-512 on x86, NEON on aarch64) against their scalar references, for every TurboQuant width (1..8, .5
 * splits, outlier groups, +qjl / +sqjl), f32, f16, q8_0 and q4_0 rows,
 * block lengths that are and are not multiples of 8 and 32, head dims
 * that are not powers of two, and 1..5 query heads per kv-head.
 *
 * Tolerances come from independent quantities: float kernels agree to
 * float rounding relative to sum_i |q_i k_i| <= ||q|| ||k~|| (Cauchy-
 * Schwarz on the decoded key, tq_decode); the (measured, not dispatched)
 * int8 TQ score kernel within
 * the bound kv_attn.h states, computed here from bitpack_get() codes and
 * the codec's float centroids. The references themselves are checked
 * against dequantize-then-exact attention by test-kvstore.
 *
 * Each SIMD set's largest differences from the references are printed
 * (docs/benchmarks.md records the aarch64 ones, from qemu).
 *
 * With AVX2 available it also prints a small timing of the score and
 * value kernels (ns per key, head_dim 64, 3 query heads); the AVX-512
 * kernels are checked and timed where the CPU has them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/kv/kvquant.h"
#include "engine/codec/kvpk.h"
#include "engine/codec/kvpq.h"
#include "engine/kv/kvtype.h"
#include "engine/codec/tq.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv_attn.h"
#include "tests/unit/testutil.h"

#define NK 32   /* keys per block */
#define GMAX 5  /* query heads */

static const char *const tq_names[] = {
	"tq1", "tq2", "tq3", "tq4", "tq5", "tq6", "tq7", "tq8",
	"tq1.5", "tq2.5", "tq3.5", "tq4.5", "tq7.5",
	"tq2+qjl", "tq3+qjl", "tq4+qjl", "tq6+qjl", "tq3+sqjl", "tq4+sqjl",
	"tq3.5o", "tq2h16o", "tq4h24o", "tq4_nc", "tq3h8",
};
static const int tq_dims[] = { 64, 128, 65 };

/* One set of stored rows with its query heads. */
typedef struct Case {
	KvAttnRows rows;
	TqCodec *codec;      /* TQ only */
	uint8_t *k;          /* (NK, row_bytes), exactly sized */
	KvAttnQuery *q;      /* (GMAX,) */
	float *deq;          /* (NK, dim) decoded rows (original domain, TQ; stored domain otherwise) */
	int dim;
} Case;

static void case_free(Case *c)
{
	tq_codec_free(c->codec);
	free(c->k);
	free(c->q);
	free(c->deq);
}

/* Random rows of a TQ mode (loud channels, as real keys have) and prepared queries. */
static void case_tq(Case *c, const char *name, int dim, uint64_t *st)
{
	TqDesc desc;
	Error err = { 0 };
	memset(c, 0, sizeof(*c));
	c->dim = dim;
	ck_assert_msg(tq_desc_from_name(name, dim, &desc, &err) == 0, "%s/%d: %s", name, dim, err.msg);
	float *x = malloc_array((size_t)NK * dim, sizeof(float));
	ck_assert(x);
	for (int i = 0; i < NK * dim; i++)
		x[i] = test_rand_normal(st) * ((i % dim) % 7 == 3 ? 5.0f : 1.0f);
	if (desc.group == TQ_GROUP_OUTLIER_CHANNELS)
		ck_assert_int_eq(tq_desc_choose_outliers(x, NK, dim, desc.n_hi, desc.mask), 0);
	ck_assert_msg(tq_codec_new(&desc, &c->codec, &err) == 0, "%s/%d: %s", name, dim, err.msg);
	ck_assert_int_eq(kv_attn_rows_init_tq(&c->rows, tq_codec_layout(c->codec),
					      tq_codec_centroids(c->codec, true),
					      tq_codec_centroids(c->codec, false), tq_qjl_const(c->codec)),
			 0);
	size_t rb = tq_code_bytes(c->codec);
	c->k = malloc(NK * rb);
	c->deq = malloc_array((size_t)NK * dim, sizeof(float));
	c->q = malloc_array(GMAX, sizeof(KvAttnQuery));
	ck_assert(c->k && c->deq && c->q);
	for (int j = 0; j < NK; j++) {
		tq_encode(c->codec, x + j * dim, c->k + j * rb);
		tq_decode(c->codec, c->k + j * rb, c->deq + j * dim);
	}
	TqQuery *tqq = malloc(sizeof(TqQuery));
	ck_assert(tqq);
	for (int g = 0; g < GMAX; g++) {
		float qv[TQ_MAX_DIM];
		for (int i = 0; i < dim; i++)
			qv[i] = test_rand_normal(st) * (g == 1 && i == 2 ? 8.0f : 1.0f);
		tq_query_prepare(c->codec, qv, tqq);
		memcpy(c->q[g].q, tqq->rot, (size_t)dim * sizeof(float));
		memcpy(c->q[g].sq, tqq->sq, (size_t)desc.qjl_m * sizeof(float));
		kv_attn_query_prepare(&c->rows, &c->q[g]);
	}
	free(tqq);
	free(x);
}

/* Random stored rows of a non-TQ format. */
static void case_plain(Case *c, KvFormat f, int dim, uint64_t *st)
{
	memset(c, 0, sizeof(*c));
	c->dim = dim;
	ck_assert_int_eq(kv_attn_rows_init(&c->rows, f, dim), 0);
	size_t rb = c->rows.row_bytes;
	c->k = malloc(NK * rb);
	c->deq = malloc_array((size_t)NK * dim, sizeof(float));
	c->q = malloc_array(GMAX, sizeof(KvAttnQuery));
	ck_assert(c->k && c->deq && c->q);
	KvType t = { .format = f == KV_FORMAT_F32 ? KV_FORMAT_F32 : f == KV_FORMAT_F16 ? KV_FORMAT_F16
				: f == KV_FORMAT_Q8_0 ? KV_FORMAT_Q8_0 : KV_FORMAT_Q4_0,
		     .dim = dim };
	for (int j = 0; j < NK; j++) {
		float x[TQ_MAX_DIM];
		for (int i = 0; i < dim; i++)
			x[i] = test_rand_normal(st) * (i % 11 == 4 ? 6.0f : 1.0f);
		kvquant_store(&t, x, c->k + j * rb);
		kvquant_load(&t, c->k + j * rb, c->deq + j * dim);
	}
	for (int g = 0; g < GMAX; g++) {
		for (int i = 0; i < dim; i++)
			c->q[g].q[i] = test_rand_normal(st);
		kv_attn_query_prepare(&c->rows, &c->q[g]);
	}
}

static double norm(const float *x, int n)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	return sqrt(s);
}

/* The int8 kernel's error bound for key j, query g (kv_attn.h), unscaled. */
static double int8_bound(const Case *c, int g, int j)
{
	const TqLayout *L = tq_codec_layout(c->codec);
	const uint8_t *code = c->k + (size_t)j * L->code_bytes;
	const float *q = c->q[g].q;
	double qmax = 0;
	for (int i = 0; i < c->dim; i++)
		qmax = fmax(qmax, fabs(q[i]));
	double qs = qmax / 127, bound = 0;
	for (int s = 0; s < 2; s++) {
		int n = s ? L->dim - L->n_hi : L->n_hi, off = s ? L->n_hi : 0;
		if (n == 0)
			continue;
		int bits = s ? L->bits_lo : L->bits_hi;
		const float *cb = tq_codec_centroids(c->codec, s == 0);
		double cmax = 0, sum_c = 0, sum_q = 0;
		for (int k = 0; k < 1 << bits; k++)
			cmax = fmax(cmax, fabs(cb[k]));
		for (int i = 0; i < n; i++) {
			sum_c += fabs(cb[bitpack_get(code + (s ? L->off_lo : L->off_hi), bits, (size_t)i)]);
			sum_q += fabs(q[off + i]);
		}
		double cs = cmax / 127;
		double sc = fabs(tq_load_f16(code + L->off_scale[s ? L->n_scales - 1 : 0]));
		bound += sc * (qs / 2 * sum_c + cs / 2 * sum_q + n * qs * cs / 4);
	}
	return bound;
}

/* The largest differences of one kernel set from the references seen so far. */
typedef struct Agree {
	double max_abs;  /* |got - ref| */
	double max_rel;  /* |got - ref| / the test's magnitude (sum of |terms| bound) */
} Agree;

static void agree_add(Agree *a, double err, double mag)
{
	if (!a)
		return;
	a->max_abs = fmax(a->max_abs, err);
	a->max_rel = fmax(a->max_rel, err / (mag + 1e-30));
}

/* Scores of fn against the reference over n keys, G heads. */
static void check_scores(const Case *c, const char *what, KvAttnScoresFn fn, bool int8, int G, int n,
			 Agree *ag)
{
	float want[GMAX * NK], got[GMAX * NK];
	float scale = 1.0f / sqrtf((float)c->dim);
	for (int i = 0; i < GMAX * NK; i++)
		want[i] = got[i] = 12345.0f;
	kv_attn_scores_ref(&c->rows, c->q, G, c->k, n, scale, want, NK);
	fn(&c->rows, c->q, G, c->k, n, scale, got, NK);
	for (int g = 0; g < GMAX; g++)
		for (int j = 0; j < NK; j++) {
			if (g >= G || j >= n) {
				ck_assert_msg(got[g * NK + j] == 12345.0f, "%s: wrote outside (%d, %d)", what, g, j);
				continue;
			}
			/* sum |q_i k_i| <= ||q|| ||k~||; QJL adds gamma K |<sq, z>| <= ||x~|| scale too */
			double mag = norm(c->q[g].q, c->dim) * norm(c->deq + j * c->dim, c->dim);
			if (c->codec && c->rows.tq.qjl_m > 0) {
				const TqLayout *L = tq_codec_layout(c->codec);
				double gk = tq_qjl_const(c->codec) *
					    tq_load_f16(c->k + (size_t)j * L->code_bytes + L->off_gamma);
				mag += gk * norm(c->q[g].sq, L->qjl_m) * sqrt((double)L->qjl_m);
			}
			double tol = 2e-6 * (mag + 1) * scale;
			if (int8)
				tol += int8_bound(c, g, j) * scale * 1.001;
			double err = fabs((double)got[g * NK + j] - want[g * NK + j]);
			agree_add(ag, err, mag * scale);
			ck_assert_msg(err <= tol, "%s G=%d n=%d: score (%d, %d) %.7g vs ref %.7g (err %.3g > tol %.3g)",
				      what, G, n, g, j, got[g * NK + j], want[g * NK + j], err, tol);
		}
}

/* Value sums of fn against the reference. */
static void check_values(const Case *c, const char *what, KvAttnValuesFn fn, int G, int n, uint64_t *st,
			 Agree *ag)
{
	enum { LD = TQ_MAX_DIM + 3 };
	static float p[GMAX * NK], want[GMAX * LD], got[GMAX * LD];
	int d = c->dim;
	for (int i = 0; i < GMAX * NK; i++)
		p[i] = test_rand_uniform(st);
	for (int i = 0; i < GMAX * LD; i++)
		want[i] = got[i] = test_rand_normal(st);
	kv_attn_values_ref(&c->rows, p, NK, G, c->k, n, want, LD);
	fn(&c->rows, p, NK, G, c->k, n, got, LD);
	for (int g = 0; g < GMAX; g++)
		for (int i = 0; i < LD; i++) {
			if (g >= G || i >= d) {
				ck_assert_msg(got[g * LD + i] == want[g * LD + i], "%s: wrote outside (%d, %d)", what, g, i);
				continue;
			}
			/* the reference's own terms: |acc0| + sum_j p_j |v~_j[i]| (stored domain: norms, not coords) */
			double mag = fabs(want[g * LD + i]);
			for (int j = 0; j < n; j++)
				mag += p[g * NK + j] * norm(c->deq + j * d, d);
			double err = fabs((double)got[g * LD + i] - want[g * LD + i]);
			agree_add(ag, err, mag);
			ck_assert_msg(err <= 2e-6 * (mag + 1), "%s G=%d n=%d: acc (%d, %d) %.7g vs ref %.7g", what, G, n,
				      g, i, got[g * LD + i], want[g * LD + i]);
		}
}

#if defined(CPU_KERNELS_X86)
static bool covers_all(KvFormat f)
{
	return true;
}
#elif defined(CPU_KERNELS_NEON)
/* What the NEON kernels compute themselves (kv_attn.h); the rest is the reference's. */
static bool covers_neon(KvFormat f)
{
	return f == KV_FORMAT_F32 || f == KV_FORMAT_F16 || f == KV_FORMAT_TQ;
}
#endif

/* The SIMD score and value kernel sets of this build, each where the CPU runs it. */
typedef struct Level {
	const char *name;
	bool (*have)(void);
	bool (*covers)(KvFormat f);
	KvAttnScoresFn scores;
	KvAttnValuesFn values;
	bool values_exact; /* the reference's floats bit for bit (kv_attn.h) */
} Level;
static const Level levels[] = {
#if defined(CPU_KERNELS_X86)
	{ "avx2", kv_attn_have_avx2, covers_all, kv_attn_scores_avx2, kv_attn_values_avx2, false },
	{ "avx512", kv_attn_have_avx512, covers_all, kv_attn_scores_avx512, kv_attn_values_avx512, false },
#elif defined(CPU_KERNELS_NEON)
	{ "neon", kv_attn_have_neon, covers_neon, kv_attn_scores_neon, kv_attn_values_neon, true },
#endif
	{ NULL, NULL, NULL, NULL, NULL, false },
};

static bool any_level(void)
{
	for (const Level *l = levels; l->name; l++)
		if (l->have())
			return true;
	return false;
}

static void check_case(const Case *c, const char *what, uint64_t *st)
{
	static const int lens[] = { 32, 17, 1 };
	static const int groups[] = { 1, 2, 3, 5 }; /* 5: a round of 4 heads, then 1 */
	bool values = c->rows.format != KV_FORMAT_TQ || c->rows.tq.qjl_m == 0;
	for (const Level *l = levels; l->name; l++) {
		if (!l->have() || !l->covers(c->rows.format))
			continue;
		Agree as = { 0 }, av = { 0 };
		char whatl[80];
		snprintf(whatl, sizeof(whatl), "%s (%s)", what, l->name);
		for (size_t li = 0; li < ARRAY_SIZE(lens); li++)
			for (size_t gi = 0; gi < ARRAY_SIZE(groups); gi++) {
				int n = lens[li], G = groups[gi];
				check_scores(c, whatl, l->scores, false, G, n, &as);
				if (values)
					check_values(c, whatl, l->values, G, n, st, &av);
#if defined(CPU_KERNELS_X86)
				bool int8 = c->rows.format == KV_FORMAT_TQ && c->rows.int8;
				if (l->scores == kv_attn_scores_avx2 && c->rows.format == KV_FORMAT_TQ)
					check_scores(c, whatl, kv_attn_scores_tq_int8_avx2, int8, G, n, NULL);
#endif
			}
		if (l->values_exact && values)
			ck_assert_msg(av.max_abs == 0.0, "%s: values differ from the reference's by %.3g", whatl,
				      av.max_abs);
		fprintf(stderr, "kvattn %-22s vs ref: scores max |diff| %.3g (%.3g of sum|terms|)", whatl, as.max_abs,
			as.max_rel);
		if (values)
			fprintf(stderr, "; values max |diff| %.3g (%.3g of sum|terms|)", av.max_abs, av.max_rel);
		fprintf(stderr, "\n");
	}
}

START_TEST(tq_kernels_match_reference)
{
	if (!any_level()) {
		fprintf(stderr, "kvattn: no SIMD kernels (or TURBOKV_NO_SIMD): nothing to compare\n");
		return;
	}
#if defined(CPU_KERNELS_X86)
	if (_i == 0 && !kv_attn_have_avx512())
		fprintf(stderr, "kvattn: no AVX-512 (or TURBOKV_NO_AVX512): AVX2 kernels only\n");
#endif
	uint64_t st = test_seed() + (uint64_t)_i;
	const char *name = tq_names[_i];
	for (size_t di = 0; di < ARRAY_SIZE(tq_dims); di++) {
		Case c;
		char what[64];
		snprintf(what, sizeof(what), "%s dim %d", name, tq_dims[di]);
		case_tq(&c, name, tq_dims[di], &st);
		check_case(&c, what, &st);
		case_free(&c);
	}
}
END_TEST

/*
 * tq.h's value helpers: tq_value_axpy(1) then tq_output_finish() is
 * tq_decode() without QJL, and the kernel reference sums the same terms.
 */
START_TEST(tq_value_helpers)
{
	uint64_t st = test_seed() + 500;
	static const char *const names[] = { "tq4", "tq3.5", "tq2h16o", "tq3.5o", "tq6", "tq4_nc" };
	for (size_t ni = 0; ni < ARRAY_SIZE(names); ni++)
		for (size_t di = 0; di < ARRAY_SIZE(tq_dims); di++) {
			Case c;
			int d = tq_dims[di];
			case_tq(&c, names[ni], d, &st);
			size_t rb = tq_code_bytes(c.codec);
			for (int j = 0; j < NK; j += 7) {
				float acc[TQ_MAX_DIM] = { 0 }, acc2[TQ_MAX_DIM] = { 0 }, x[TQ_MAX_DIM];
				float a = 0.25f + test_rand_uniform(&st);
				tq_value_axpy(c.codec, a, c.k + j * rb, acc);
				kv_attn_values_ref(&c.rows, &a, 1, 1, c.k + j * rb, 1, acc2, d);
				for (int i = 0; i < d; i++)
					ck_assert_float_eq(acc[i], acc2[i]);
				tq_value_axpy(c.codec, 1.0f - a, c.k + j * rb, acc);
				tq_output_finish(c.codec, acc, x);
				for (int i = 0; i < d; i++)
					ck_assert_msg(fabsf(x[i] - c.deq[j * d + i]) <= 1e-5f * (1 + fabsf(c.deq[j * d + i])),
						      "%s/%d row %d [%d]: %g vs tq_decode %g", names[ni], d, j, i, x[i],
						      c.deq[j * d + i]);
			}
			case_free(&c);
		}
}
END_TEST

START_TEST(plain_kernels_match_reference)
{
	if (!any_level())
		return;
	uint64_t st = test_seed() + 100;
	static const struct { KvFormat f; const char *name; int dim; } cases[] = {
		{ KV_FORMAT_F32, "f32", 64 }, { KV_FORMAT_F32, "f32", 45 }, { KV_FORMAT_F16, "f16", 64 },
		{ KV_FORMAT_F16, "f16", 37 }, { KV_FORMAT_Q8_0, "q8_0", 64 }, { KV_FORMAT_Q8_0, "q8_0", 96 },
		{ KV_FORMAT_Q4_0, "q4_0", 64 }, { KV_FORMAT_Q4_0, "q4_0", 128 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		Case c;
		char what[64];
		snprintf(what, sizeof(what), "%s dim %d", cases[i].name, cases[i].dim);
		case_plain(&c, cases[i].f, cases[i].dim, &st);
		check_case(&c, what, &st);
		case_free(&c);
	}
}
END_TEST

/*
 * The bound of kv_attn.h on |quantized score - exact score| for head g and
 * key t of a block: scale (0.5005 (m / 8191) sum_j (|c_j| + 2^-10)
 * + 2^-10 sum_j |u_j|), plus float rounding (a relative 1e-5 of
 * scale sum_j |u_j c_j|, far above the few roundings either side does).
 * Also returns the exact score (double).
 */
static double pk_q16_bound(const KvPk *pk, const uint8_t *blk, const float *qg, int t, float scale,
			   double *ret_exact)
{
	int d = pk->rows.dim;
	const uint8_t *sc = kvpk_scales(blk, pk->rows.code_bits), *widths = sc + d / 2;
	double m = 0.0, sum_c = 0.0, sum_u = 0.0, sum_uc = 0.0, exact = 0.0;
	for (int j = 0; j < d; j++)
		if (kvpk_width(widths, j / 2))
			m = fmax(m, fabs((double)(qg[j] * pk->rows.sigma[sc[j / 2]])));
	const uint8_t *col = blk;
	for (int j = 0; j < d; j++) {
		int b = kvpk_width(widths, j / 2);
		if (b == 0)
			continue;
		double c = pk->rows.centroids[b][kvpk_column_code(col, b, t)];
		double u = (double)qg[j] * pk->rows.sigma[sc[j / 2]];
		col += (size_t)KV_BLOCK_TOKENS * b / 8;
		sum_c += fabs(c) + 0x1p-10;
		sum_u += fabs(u);
		sum_uc += fabs(u * c);
		exact += u * c;
	}
	*ret_exact = scale * exact;
	return scale * (0.5005 * (m / KVPK_Q16_UMAX) * sum_c + 0x1p-10 * sum_u + 1e-5 * sum_uc);
}

/*
 * Pair-coded keys: the quantized SIMD score kernels (AVX2, AVX-512
 * VBMI/VNNI) give the quantized reference's floats bit for bit (the same
 * integer sums and float steps), that reference is within kv_attn.h's
 * bound of the exact score and so is the float reference; NEON gives the
 * float reference's floats bit for bit. For every width from 0 to 8 bits
 * per pair (loud and silent pairs, an all-zero pair), 1..9 and 16 query
 * heads, partial blocks, and head_dim 256 (chunks of 64 columns).
 */
START_TEST(pk_kernels_match_reference)
{
	enum { BT = KV_BLOCK_TOKENS };
	uint64_t st = test_seed() + 200;
	static const struct { int dim; double bits; } cases[] = {
		{ 64, 4 }, { 64, 5 }, { 64, 2.5 }, { 64, 8 }, { 128, 3 }, { 256, 4.5 }, { 256, 8 }, { 16, 1 }, { 20, 6 },
	};
	/* every specialised group size of the kernels and two beyond */
	static const int groups[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 16 }, lens[] = { 32, 17, 1 };
	bool seen[KVPK_MAX_BITS + 1] = { false }; /* widths the cases coded: every lookup path of the kernels */
	double worst = 0.0; /* largest error / bound of the quantized scores */
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		int d = cases[i].dim, P = d / 2;
		KvPk pk;
		ck_assert_int_eq(kvpk_init(&pk, d, (int)(cases[i].bits * d)), 0);
		float *x = malloc(sizeof(float) * BT * d), *w = malloc(sizeof(float) * P);
		float *q = malloc(sizeof(float) * 16 * d);
		uint8_t *blk = calloc(BT, pk.row_bytes);
		ck_assert(x && w && q && blk);
		for (int j = 0; j < P; j++) /* energies over orders of magnitude, one pair silent */
			w[j] = j == 3 ? 0.0f : expf(3.0f * test_rand_normal(&st));
		for (int t = 0; t < BT; t++)
			for (int j = 0; j < d; j++)
				x[t * d + j] = j / 2 == 5 ? 0.0f : test_rand_normal(&st) * (1.0f + (float)(j % 7));
		for (int j = 0; j < 16 * d; j++) /* one head all zero: m = 0 */
			q[j] = j / d == 6 ? 0.0f : test_rand_normal(&st) * (j % 5 == 1 ? 30.0f : 1.0f);
		kvpk_encode_block(&pk, x, BT, NULL, w, blk);
		for (int j = 0; j < P; j++)
			seen[kvpk_width(kvpk_scales(blk, pk.rows.code_bits) + P, j)] = true;
		for (size_t g = 0; g < ARRAY_SIZE(groups); g++)
			for (size_t l = 0; l < ARRAY_SIZE(lens); l++) {
				int G = groups[g], n = lens[l];
				float flt[16 * BT], want[16 * BT], got[16 * BT];
				memset(flt, 0, sizeof(flt));
				memset(want, 0, sizeof(want));
				kv_attn_pk_scores_ref(&pk.rows, blk, q, G, n, 0.125f, flt, BT);
				kv_attn_pk_scores_q16_ref(&pk.rows, blk, q, G, n, 0.125f, want, BT);
				for (int h = 0; h < G; h++)
					for (int t = 0; t < n; t++) {
						double exact, bound = pk_q16_bound(&pk, blk, q + (size_t)h * d, t, 0.125f, &exact);
						double e = fabs(want[h * BT + t] - exact);
						ck_assert_msg(e <= bound && fabs(flt[h * BT + t] - exact) <= bound,
							      "pk%g dim %d head %d key %d: quantized %.9g, float %.9g, exact %.9g, bound %.3g",
							      cases[i].bits, d, h, t, want[h * BT + t], flt[h * BT + t], exact, bound);
						if (bound > 0.0)
							worst = fmax(worst, e / bound);
					}
				static const struct { KvAttnPkScoresFn fn, ref; bool (*have)(void); const char *name; } pk_levels[] = {
#if defined(CPU_KERNELS_X86)
					{ kv_attn_pk_scores_q16_avx2, kv_attn_pk_scores_q16_ref, kv_attn_have_avx2, "AVX2" },
					{ kv_attn_pk_scores_q16_avx512, kv_attn_pk_scores_q16_ref, kv_attn_have_avx512vnni,
					  "AVX-512 VBMI/VNNI" },
#elif defined(CPU_KERNELS_NEON)
					{ kv_attn_pk_scores_neon, kv_attn_pk_scores_ref, kv_attn_have_neon, "NEON" },
#endif
					{ NULL, NULL, NULL, NULL },
				};
				for (size_t v = 0; pk_levels[v].fn; v++) {
					if (!pk_levels[v].have())
						continue;
					float *ref = pk_levels[v].ref == kv_attn_pk_scores_ref ? flt : want;
					memset(got, 0, sizeof(got));
					pk_levels[v].fn(&pk.rows, blk, q, G, n, 0.125f, got, BT);
					ck_assert_msg(memcmp(ref, got, sizeof(got)) == 0,
						      "pk%g dim %d, %d heads, %d rows: the %s kernel differs", cases[i].bits,
						      d, G, n, pk_levels[v].name);
				}
			}
		free(x);
		free(w);
		free(q);
		free(blk);
	}
	for (int b = 0; b <= KVPK_MAX_BITS; b++)
		ck_assert_msg(seen[b], "no pair of width %d in the cases", b);
	fprintf(stderr, "pk quantized scores: largest error / bound %.3f\n", worst);
}
END_TEST

/* The centroid (unscaled) of rotated coordinate i of a TQ row. */
static float tq_centroid_of(const KvAttnRows *r, const uint8_t *row, int i)
{
	const TqLayout *L = &r->tq;
	if (i < L->n_hi)
		return r->cb[0][bitpack_get(row + L->off_hi, L->bits_hi, (size_t)i)];
	return r->cb[1][bitpack_get(row + L->off_lo, L->bits_lo, (size_t)(i - L->n_hi))];
}

/*
 * TQ values with int16 weights (kv_attn.h): the AVX-512 VBMI/VNNI kernel
 * gives the scalar twin's floats bit for bit, and that twin is within the
 * stated bound of the float reference, for the types whose layout the
 * kernel takes (the default's tq3.5 among them), 1..5 heads, partial
 * blocks, a head with no weight.
 */
START_TEST(q16_values_match_reference)
{
	uint64_t st = test_seed() + 500;
	static const char *const names[] = { "tq3.5", "tq3.5_nc", "tq3", "tq2", "tq4.5", "tq1.5", "tq5" };
	static const int lens[] = { 32, 17, 1 };
	double worst = 0.0;
	Case t4; /* tq4 stays on the float kernel (kv_attn.h) */
	case_tq(&t4, "tq4", 64, &st);
	ck_assert(!t4.rows.q16v);
	case_free(&t4);
	for (size_t ni = 0; ni < ARRAY_SIZE(names); ni++) {
		Case c;
		case_tq(&c, names[ni], 64, &st);
		ck_assert_msg(c.rows.q16v, "%s: the int16 value kernel does not take it", names[ni]);
		const TqLayout *L = &c.rows.tq;
		for (size_t li = 0; li < ARRAY_SIZE(lens); li++)
			for (int G = 1; G <= GMAX; G++) {
				int n = lens[li], d = c.dim;
				float p[GMAX * NK], flt[GMAX * 64], want[GMAX * 64], init[GMAX * 64];
				for (int i = 0; i < GMAX * NK; i++) /* softmax-like: many small, a few near 1 */
					p[i] = i / NK == 2 ? 0.0f : expf(-3.0f * fabsf(test_rand_normal(&st)));
				for (int i = 0; i < GMAX * 64; i++)
					init[i] = test_rand_normal(&st);
				memcpy(flt, init, sizeof(init));
				memcpy(want, init, sizeof(init));
				kv_attn_values_ref(&c.rows, p, NK, G, c.k, n, flt, 64);
				kv_attn_values_q16_ref(&c.rows, p, NK, G, c.k, n, want, 64);
				for (int g = 0; g < G; g++) {
					double wm = 0.0, sw = 0.0;
					for (int j = 0; j < n; j++) {
						double w = p[g * NK + j] * tq_load_f16(c.k + (size_t)j * L->code_bytes + L->off_scale[0]);
						wm = fmax(wm, w);
						sw += w;
					}
					double cv = c.rows.q16v_scale;
					for (int i = 0; i < d; i++) {
						double sc = 0.0, sum = 0.0;
						for (int j = 0; j < n; j++) {
							const uint8_t *row = c.k + (size_t)j * L->code_bytes;
							float x = tq_centroid_of(&c.rows, row, i);
							sc += fabs(x) + cv / 2;
							sum += fabs(x) * p[g * NK + j] * tq_load_f16(row + L->off_scale[0]);
						}
						double bound = 0.5005 * (wm / KVATTN_Q16V_WMAX) * sc + cv / 2 * sw +
							       4e-6 * (fabs(init[g * 64 + i]) + sum);
						double e = fabs((double)want[g * 64 + i] - flt[g * 64 + i]);
						ck_assert_msg(e <= bound, "%s, %d heads, %d rows: head %d coordinate %d: %.9g vs %.9g, bound %.3g",
							      names[ni], G, n, g, i, want[g * 64 + i], flt[g * 64 + i], bound);
						if (bound > 8e-6 * (fabs(init[g * 64 + i]) + sum))
							worst = fmax(worst, e / bound);
					}
				}
#if defined(CPU_KERNELS_X86)
				if (kv_attn_have_avx512vnni()) {
					float got[GMAX * 64];
					memcpy(got, init, sizeof(init));
					kv_attn_values_q16_avx512(&c.rows, p, NK, G, c.k, n, got, 64);
					ck_assert_msg(memcmp(got, want, sizeof(got)) == 0,
						      "%s, %d heads, %d rows: the AVX-512 int16 value kernel differs", names[ni], G, n);
				}
#endif
			}
		case_free(&c);
	}
	fprintf(stderr, "int16 values: largest error / bound %.3f\n", worst);
}
END_TEST

/*
 * The PolarQuant kernels at every SIMD level give the reference's floats
 * bit for bit (kv_attn.h): shapes with every level vectorised, levels of
 * fewer than 8 angles (scalar), codes past 4 bits (gathers), a head_dim
 * that is not a power of two, 1..9 heads, partial blocks.
 */
START_TEST(pq_kernels_match_reference)
{
	enum { BT = KV_BLOCK_TOKENS };
	uint64_t st = test_seed() + 300;
	static const struct { const char *name; int dim; } cases[] = {
		{ "pq", 64 }, { "pq3f", 64 }, { "pq6", 64 }, { "pq8f", 64 }, { "pq", 96 },
		{ "pq5f", 128 }, { "pq2", 256 }, { "pq1f", 16 },
	};
	static const int groups[] = { 1, 2, 3, 9 }, lens[] = { 32, 17, 1 };
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		int d = cases[i].dim;
		KvType t;
		ck_assert_int_eq(kvtype_from_name(cases[i].name, KV_ROLE_K, d, &t, NULL), 0);
		KvPq pq;
		ck_assert_int_eq(kvpq_init(&pq, &t.pq, 5 + i), 0);
		size_t rb = pq.rows.row_bytes, qf = kvpq_query_floats(&pq);
		uint8_t *rows = calloc(BT, rb);
		float *prep = malloc(sizeof(float) * 9 * qf), *x = malloc(sizeof(float) * d);
		float *p = malloc(sizeof(float) * 9 * BT);
		ck_assert(rows && prep && x && p);
		for (int r = 0; r < BT; r++) {
			for (int j = 0; j < d; j++)
				x[j] = test_rand_normal(&st) * (1.0f + (float)(j % 5));
			kvpq_encode(&pq, x, rows + (size_t)r * rb);
		}
		for (int g = 0; g < 9; g++) {
			for (int j = 0; j < d; j++)
				x[j] = test_rand_normal(&st);
			kvpq_query_prepare(&pq, x, prep + (size_t)g * qf);
		}
		for (int k = 0; k < 9 * BT; k++)
			p[k] = test_rand_uniform(&st);
		for (size_t g = 0; g < ARRAY_SIZE(groups); g++)
			for (size_t l = 0; l < ARRAY_SIZE(lens); l++) {
				int G = groups[g], n = lens[l];
				float want[9 * BT] = { 0 };
				kv_attn_pq_scores_ref(&pq.rows, prep, G, rows, n, 0.125f, want, BT);
				float *acc_w = calloc((size_t)G * (d + 2), sizeof(float));
				float *acc_g = calloc((size_t)G * (d + 2), sizeof(float));
				kv_attn_pq_values_ref(&pq.rows, p, BT, G, rows, n, acc_w, d + 2);
#if defined(CPU_KERNELS_X86)
				if (kv_attn_have_avx2()) {
					float got[9 * BT] = { 0 };
					kv_attn_pq_scores_avx2(&pq.rows, prep, G, rows, n, 0.125f, got, BT);
					ck_assert_msg(memcmp(want, got, sizeof(want)) == 0,
						      "%s dim %d, %d heads, %d rows: the AVX2 scores differ",
						      cases[i].name, d, G, n);
					kv_attn_pq_values_avx2(&pq.rows, p, BT, G, rows, n, acc_g, d + 2);
					ck_assert_msg(memcmp(acc_w, acc_g, sizeof(float) * G * (d + 2)) == 0,
						      "%s dim %d, %d heads, %d rows: the AVX2 values differ",
						      cases[i].name, d, G, n);
				}
#endif
				free(acc_w);
				free(acc_g);
			}
		free(rows);
		free(prep);
		free(x);
		free(p);
		kvpq_fini(&pq);
	}
}
END_TEST

/* The int8 bound is not vacuous: on tq4 the kernel is within it, and the bound is small. */
START_TEST(int8_bound_is_tight)
{
	if (!kv_attn_have_avx2())
		return;
	uint64_t st = test_seed() + 200;
	Case c;
	case_tq(&c, "tq4", 64, &st);
	ck_assert(c.rows.int8);
	double worst = 0;
	for (int j = 0; j < NK; j++) {
		double mag = norm(c.q[0].q, 64) * norm(c.deq + j * 64, 64);
		worst = fmax(worst, int8_bound(&c, 0, j) / mag);
	}
	fprintf(stderr, "kvattn: tq4 int8 score error bound <= %.4f of ||q|| ||k~||\n", worst);
	ck_assert_double_lt(worst, 0.05);
	case_free(&c);
}
END_TEST

/* _i: 0 the AVX2 kernel, 1 the AVX-512 one (each where the CPU has it;
 * aarch64 dispatches the reference softmax: nothing to compare). */
START_TEST(softmax_matches_reference)
{
#if !defined(CPU_KERNELS_X86)
	return;
#else
	if (_i == 0 ? !kv_attn_have_avx2() : !kv_attn_have_avx512())
		return;
	KvAttnSoftmaxFn fn = _i == 0 ? kv_attn_softmax_avx2 : kv_attn_softmax_avx512;
	uint64_t st = test_seed() + 300;
	for (int trial = 0; trial < 50; trial++) {
		int G = 1 + trial % GMAX, n = 1 + (trial * 7) % NK;
		float s_ref[GMAX * NK], s_got[GMAX * NK];
		float m_ref[GMAX], l_ref[GMAX], m_got[GMAX], l_got[GMAX], c_ref[GMAX], c_got[GMAX];
		for (int i = 0; i < GMAX * NK; i++)
			s_ref[i] = s_got[i] = -40.0f + 50.0f * test_rand_uniform(&st);
		for (int g = 0; g < G; g++) {
			m_ref[g] = m_got[g] = trial % 3 == 0 ? -INFINITY : 5.0f * test_rand_normal(&st);
			l_ref[g] = l_got[g] = trial % 3 == 0 ? 0.0f : 3.0f * test_rand_uniform(&st);
		}
		kv_attn_softmax_ref(s_ref, NK, G, n, m_ref, l_ref, c_ref);
		fn(s_got, NK, G, n, m_got, l_got, c_got);
		for (int g = 0; g < G; g++) {
			ck_assert_float_eq(m_got[g], m_ref[g]);
			ck_assert_float_eq(c_got[g], c_ref[g]);
			ck_assert_msg(fabsf(l_got[g] - l_ref[g]) <= 1e-6f * l_ref[g], "l %g vs %g", l_got[g], l_ref[g]);
			for (int j = 0; j < n; j++) {
				float w = s_ref[g * NK + j], x = s_got[g * NK + j];
				ck_assert_msg(fabsf(x - w) <= 3e-7f * w + 1e-37f, "exp: %.9g vs %.9g", x, w);
			}
		}
	}
#endif
}
END_TEST

/*
 * The exact-key score kernels against the reference, within the rounding
 * bound kv_attn.h states: each of the two sums of d products is within
 * gamma_d sum |q_i x_i| of the exact one (any order, with or without
 * fused multiply-adds), and the scale adds one rounding: 2 gamma_{d+1}.
 * Dims with and without a tail of 8, 1..9 heads, partial blocks.
 */
START_TEST(exact_kernels_match_reference)
{
	enum { BT = KV_BLOCK_TOKENS };
	uint64_t st = test_seed() + 300;
	static const int dims[] = { 64, 128, 80, 20 }, groups[] = { 1, 2, 3, 4, 5, 9 }, lens[] = { 32, 7 };
	const double u = 1.0 / 16777216.0;
#if defined(CPU_KERNELS_X86)
	KvAttnExactScoresFn fast = kv_attn_have_avx2() ? kv_attn_exact_scores_avx2 : NULL;
#elif defined(CPU_KERNELS_NEON)
	KvAttnExactScoresFn fast = kv_attn_have_neon() ? kv_attn_exact_scores_neon : NULL;
#else
	KvAttnExactScoresFn fast = NULL;
#endif
	if (!fast)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(dims); i++) {
		int d = dims[i];
		float *x = malloc(sizeof(float) * BT * d), *q = malloc(sizeof(float) * 9 * d);
		ck_assert(x && q);
		for (int j = 0; j < BT * d; j++)
			x[j] = test_rand_normal(&st) * (1.0f + (float)(j % 5));
		for (int j = 0; j < 9 * d; j++)
			q[j] = test_rand_normal(&st);
		double gamma = (d + 1) * u / (1 - (d + 1) * u);
		for (size_t g = 0; g < ARRAY_SIZE(groups); g++)
			for (size_t l = 0; l < ARRAY_SIZE(lens); l++) {
				int G = groups[g], n = lens[l];
				float want[9 * BT], got[9 * BT];
				kv_attn_exact_scores_ref(x, d, q, G, n, 0.125f, want, BT);
				fast(x, d, q, G, n, 0.125f, got, BT);
				for (int h = 0; h < G; h++)
					for (int t = 0; t < n; t++) {
						double mag = 0;
						for (int k = 0; k < d; k++)
							mag += fabs((double)q[h * d + k] * x[t * d + k]);
						double bound = 2 * gamma * 0.125 * mag;
						ck_assert_msg(fabs((double)got[h * BT + t] - want[h * BT + t]) <= bound,
							      "exact scores d %d, %d heads, row %d: %g vs %g (bound %g)", d, G,
							      t, got[h * BT + t], want[h * BT + t], bound);
					}
			}
		free(x);
		free(q);
	}
}
END_TEST

#if defined(CPU_KERNELS_X86)
/* ns per key of fn over one block, best of a few rounds. */
static double time_scores(const Case *c, KvAttnScoresFn fn, int G)
{
	float s[GMAX * NK];
	double best = 1e30;
	for (int round = 0; round < 7; round++) {
		uint64_t t0 = now_ns();
		for (int it = 0; it < 500; it++)
			fn(&c->rows, c->q, G, c->k, NK, 0.125f, s, NK);
		best = fmin(best, (double)(now_ns() - t0) / (500.0 * NK));
	}
	return best;
}

static double time_values(const Case *c, KvAttnValuesFn fn, int G)
{
	static float p[GMAX * NK], acc[GMAX * TQ_MAX_DIM];
	for (int i = 0; i < GMAX * NK; i++)
		p[i] = 0.01f;
	double best = 1e30;
	for (int round = 0; round < 7; round++) {
		uint64_t t0 = now_ns();
		for (int it = 0; it < 500; it++)
			fn(&c->rows, p, NK, G, c->k, NK, acc, c->dim);
		best = fmin(best, (double)(now_ns() - t0) / (500.0 * NK));
	}
	return best;
}

#include <immintrin.h>
/*
 * The approach (a) taken literally, for the timing only: per
 * query head a table T[i][k] = q_i c[k] (dim x 16 floats) and, per key,
 * one vgatherdps of T[i][idx_i] per 8 coordinates (tq4 keys, one stream,
 * dim a multiple of 8, no QJL). Checked against the reference below.
 */
__attribute__((target("avx2,fma"))) static void lut_gather_scores(const Case *c, const float *tab, int G,
								 float *scores)
{
	const TqLayout *L = tq_codec_layout(c->codec);
	const __m256i lane = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
	for (int j = 0; j < NK; j++) {
		const uint8_t *code = c->k + (size_t)j * L->code_bytes;
		float s = tq_load_f16(code + L->off_scale[0]);
		for (int g = 0; g < G; g++) {
			const float *t = tab + (size_t)g * c->dim * 16;
			__m256 acc = _mm256_setzero_ps();
			for (int i = 0; i < c->dim; i += 8) {
				uint32_t w;
				memcpy(&w, code + L->off_lo + i / 2, 4);
				__m256i idx = _mm256_and_si256(
					_mm256_srlv_epi32(_mm256_set1_epi32((int)w), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
					_mm256_set1_epi32(15));
				acc = _mm256_add_ps(acc, _mm256_i32gather_ps(t + (size_t)i * 16, _mm256_add_epi32(idx, lane), 4));
			}
			float v[8];
			_mm256_storeu_ps(v, acc);
			scores[g * NK + j] = 0.125f * s * (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])));
		}
	}
}

static double time_lut_gather(const Case *c, int G)
{
	static float tab[GMAX * TQ_MAX_DIM * 16];
	float s[GMAX * NK], want[GMAX * NK];
	const float *cb = tq_codec_centroids(c->codec, false);
	double best = 1e30;
	for (int round = 0; round < 7; round++) {
		uint64_t t0 = now_ns();
		for (int it = 0; it < 500; it++) {
			if (it % 64 == 0) /* a new query every 64 blocks: about 2000 keys per table build */
				for (int g = 0; g < G; g++)
					for (int i = 0; i < c->dim; i++)
						for (int k = 0; k < 16; k++)
							tab[((size_t)g * c->dim + i) * 16 + k] = c->q[g].q[i] * cb[k];
			lut_gather_scores(c, tab, G, s);
		}
		best = fmin(best, (double)(now_ns() - t0) / (500.0 * NK));
	}
	kv_attn_scores_ref(&c->rows, c->q, G, c->k, NK, 0.125f, want, NK);
	for (int i = 0; i < G * NK; i++)
		ck_assert_msg(fabsf(s[i] - want[i]) <= 1e-4f * (1 + fabsf(want[i])), "lut %g vs %g", s[i], want[i]);
	return best;
}

/* ns per key of a pk score kernel: pk<bits> keys, d = 64, G = 3, one block hot in L1, best of 7. */
static double time_pk(KvAttnPkScoresFn fn, double bits, uint64_t *st)
{
	enum { BT = KV_BLOCK_TOKENS, D = 64 };
	KvPk pk;
	ck_assert_int_eq(kvpk_init(&pk, D, (int)(bits * D)), 0);
	float x[BT * D], w[D / 2], q[3 * D], scores[3 * BT];
	uint8_t *blk = calloc(BT, pk.row_bytes);
	ck_assert(blk);
	for (int j = 0; j < D / 2; j++) /* pair energies over orders of magnitude, as real keys */
		w[j] = expf(2.0f * test_rand_normal(st));
	for (int i = 0; i < BT * D; i++)
		x[i] = test_rand_normal(st);
	for (int i = 0; i < 3 * D; i++)
		q[i] = test_rand_normal(st);
	kvpk_encode_block(&pk, x, BT, NULL, w, blk);
	double best = 1e30;
	for (int round = 0; round < 7; round++) {
		uint64_t t0 = now_ns();
		for (int it = 0; it < 2000; it++)
			fn(&pk.rows, blk, q, 3, BT, 0.125f, scores, BT);
		best = fmin(best, (double)(now_ns() - t0) / (2000.0 * BT));
	}
	free(blk);
	return best;
}

static void timing_avx512(const Case *c, const char *name)
{
	if (kv_attn_have_avx512())
		fprintf(stderr, "kvattn timing %-8s d=64 G=3, ns/key: scores avx512 %.1f; values avx512 %.1f\n", name,
			time_scores(c, kv_attn_scores_avx512, 3), time_values(c, kv_attn_values_avx512, 3));
	if (kv_attn_have_avx512vnni() && c->rows.q16v)
		fprintf(stderr, "kvattn timing %-8s d=64 G=3, ns/key: values int16 avx512 vbmi/vnni %.1f\n", name,
			time_values(c, kv_attn_values_q16_avx512, 3));
}

#endif

/* x86 only: aarch64 runs under qemu here, whose timings mean nothing. */
START_TEST(timing)
{
#if defined(__SANITIZE_ADDRESS__) || !defined(CPU_KERNELS_X86)
	return; /* meaningless under the sanitizer */
#else
	if (!kv_attn_have_avx2())
		return;
	uint64_t st = test_seed() + 400;
	static const char *const names[] = { "tq4", "tq3", "tq4+qjl" };
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		Case c;
		case_tq(&c, names[i], 64, &st);
		fprintf(stderr,
			"kvattn timing %-8s d=64 G=3, ns/key: scores ref %.1f, float-lookup avx2 %.1f, int8-shuffle avx2 %.1f; values ref %.1f, avx2 %.1f\n",
			names[i], time_scores(&c, kv_attn_scores_ref, 3), time_scores(&c, kv_attn_scores_avx2, 3),
			time_scores(&c, kv_attn_scores_tq_int8_avx2, 3), time_values(&c, kv_attn_values_ref, 3),
			time_values(&c, kv_attn_values_avx2, 3));
		timing_avx512(&c, names[i]);
		if (i == 0)
			fprintf(stderr, "kvattn timing tq4      d=64 G=3, ns/key: scores by q_i c[k] tables + vgatherdps %.1f\n",
				time_lut_gather(&c, 3));
		case_free(&c);
	}
	static const struct { KvFormat f; const char *name; } plain[] = {
		{ KV_FORMAT_F16, "f16" }, { KV_FORMAT_Q8_0, "q8_0" }, { KV_FORMAT_Q4_0, "q4_0" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(plain); i++) {
		Case c;
		case_plain(&c, plain[i].f, 64, &st);
		fprintf(stderr, "kvattn timing %-8s d=64 G=3, ns/key: scores ref %.1f, avx2 %.1f; values ref %.1f, avx2 %.1f\n",
			plain[i].name, time_scores(&c, kv_attn_scores_ref, 3), time_scores(&c, kv_attn_scores_avx2, 3),
			time_values(&c, kv_attn_values_ref, 3), time_values(&c, kv_attn_values_avx2, 3));
		timing_avx512(&c, plain[i].name);
		case_free(&c);
	}
	for (int b = 4; b <= 5; b++)
		fprintf(stderr, "kvattn timing pk%d      d=64 G=3, ns/key: scores float ref %.1f, quantized ref %.1f, avx2 %.1f, avx512 vbmi/vnni %.1f\n",
			b, time_pk(kv_attn_pk_scores_ref, b, &st), time_pk(kv_attn_pk_scores_q16_ref, b, &st),
			time_pk(kv_attn_pk_scores_q16_avx2, b, &st),
			kv_attn_have_avx512vnni() ? time_pk(kv_attn_pk_scores_q16_avx512, b, &st) : 0.0);
	static const char *const more[] = { "tq5", "tq3.5" }; /* the default type's key and value halves */
	for (size_t i = 0; i < ARRAY_SIZE(more); i++) {
		Case c;
		case_tq(&c, more[i], 64, &st);
		fprintf(stderr, "kvattn timing %-8s d=64 G=3, ns/key: scores avx2 %.1f; values avx2 %.1f\n", more[i],
			time_scores(&c, kv_attn_scores_avx2, 3), time_values(&c, kv_attn_values_avx2, 3));
		timing_avx512(&c, more[i]);
		case_free(&c);
	}
#endif
}
END_TEST

static Suite *kvattn_suite(void)
{
	Suite *s = suite_create("kvattn");
	TCase *tc = tcase_create("kernels");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, tq_kernels_match_reference, 0, (int)ARRAY_SIZE(tq_names));
	tcase_add_test(tc, plain_kernels_match_reference);
	tcase_add_test(tc, pk_kernels_match_reference);
	tcase_add_test(tc, q16_values_match_reference);
	tcase_add_test(tc, pq_kernels_match_reference);
	tcase_add_test(tc, exact_kernels_match_reference);
	tcase_add_test(tc, tq_value_helpers);
	tcase_add_test(tc, int8_bound_is_tight);
	tcase_add_loop_test(tc, softmax_matches_reference, 0, 2);
	suite_add_tcase(s, tc);
	TCase *tt = tcase_create("timing");
	tcase_set_timeout(tt, 600);
	tcase_add_test(tt, timing);
	suite_add_tcase(s, tt);
	return s;
}

int main(void)
{
	return test_run_suite(kvattn_suite());
}
