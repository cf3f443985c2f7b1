/*
 * test-kvtype.c: KV types and --kv specs (engine/kv/kvtype.h) and the block
 * KV quantizers (engine/kv/kvquant.h).
 *
 * Independent references: ggml's q8_0 / q4_0 blocks and f16 as produced by
 * gguf-py (tests/data/kvquant/, scripts/gen-kvquant-golden.py); bits per
 * value worked out by hand from turboquant.md section 6 and the layouts;
 * the Hadamard matrix from its definition H[i][j] = (-1)^popcount(i & j);
 * scores and value sums recomputed in double from dequantized vectors.
 * Property tests use test_seed() (printed; set TKV_SEED to vary).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv/kvquant.h"
#include "engine/codec/tq.h"
#include "engine/kv/kvtype.h"
#include "tests/unit/testutil.h"

/* ---- helpers ---- */

static KvPlan *plan_ok(const char *text, int n_layers, int n_kv_heads, int head_dim)
{
	KvPlan *plan = NULL;
	Error err = { 0 };
	int r = kvplan_from_text(text, n_layers, n_kv_heads, head_dim, &plan, &err);
	ck_assert_msg(r == 0, "'%s': %d %s", text, r, err.msg);
	return plan;
}

static void check_layer(const KvPlan *plan, int l, const char *k, const char *v)
{
	char kn[KVTYPE_NAME_MAX], vn[KVTYPE_NAME_MAX];
	kvtype_name(&plan->layers[l].k, kn, sizeof(kn));
	kvtype_name(&plan->layers[l].v, vn, sizeof(vn));
	ck_assert_msg(strcmp(kn, k) == 0 && strcmp(vn, v) == 0,
		      "layer %d: got %s:%s, want %s:%s", l, kn, vn, k, v);
}

static void rand_vec(uint64_t *st, int d, float *x)
{
	for (int i = 0; i < d; i++)
		x[i] = test_rand_normal(st);
}

/*
 * Key-like: Gaussian plus three fixed outlier channels 10-20x larger
 * (real keys have a few such channels, the same ones in every token).
 */
static void rand_outlier_vec(uint64_t *st, int d, float *x)
{
	static const int channels[] = { 3, 17, 41 };
	rand_vec(st, d, x);
	for (size_t k = 0; k < ARRAY_SIZE(channels); k++)
		x[channels[k] % d] *= 10.0f + 10.0f * test_rand_uniform(st);
}

static double dot_d(const float *a, const float *b, int d)
{
	double s = 0.0;
	for (int i = 0; i < d; i++)
		s += (double)a[i] * b[i];
	return s;
}

static double dot_abs(const float *a, const float *b, int d)
{
	double s = 0.0;
	for (int i = 0; i < d; i++)
		s += fabs((double)a[i] * b[i]);
	return s;
}

static KvType type_ok(const char *name, KvRole role, int dim)
{
	KvType t;
	Error err = { 0 };
	int r = kvtype_from_name(name, role, dim, &t, &err);
	ck_assert_msg(r == 0, "'%s' at %d: %d %s", name, dim, r, err.msg);
	return t;
}

/* ---- specs ---- */

START_TEST(test_spec_uniform)
{
	_cleanup_(kvplan_freep) KvPlan *a = plan_ok("tq4", 30, 3, 64);
	ck_assert_int_eq(a->n_layers, 30);
	for (int l = 0; l < 30; l++)
		check_layer(a, l, "tq4", "tq4");
	ck_assert(kvplan_is_uniform(a));
	ck_assert_int_eq(a->layers[7].k.format, KV_FORMAT_TQ);
	ck_assert_int_eq(a->layers[7].k.tq.bits, 4);

	_cleanup_(kvplan_freep) KvPlan *b = plan_ok("q8_0:q4_0+h", 30, 3, 64);
	for (int l = 0; l < 30; l++)
		check_layer(b, l, "q8_0", "q4_0+h");
	ck_assert_int_eq(b->layers[0].k.format, KV_FORMAT_Q8_0);
	ck_assert(!b->layers[0].k.hadamard);
	ck_assert_int_eq(b->layers[0].v.format, KV_FORMAT_Q4_0);
	ck_assert(b->layers[0].v.hadamard);

	_cleanup_(kvplan_freep) KvPlan *c = plan_ok("tq3+qjl:tq3_nc", 4, 1, 128);
	check_layer(c, 3, "tq3+qjl", "tq3_nc");
	ck_assert_int_eq(c->layers[3].k.tq.bits, 2);
	ck_assert(c->layers[3].k.tq.flags & TQ_FLAG_QJL);
	ck_assert(c->layers[3].v.tq.flags & TQ_FLAG_NORM_CORRECT);
}
END_TEST

START_TEST(test_spec_overrides)
{
	_cleanup_(kvplan_freep) KvPlan *a = plan_ok("tq3.5:tq3,0-1=q8_0,-2--1=q8_0", 30, 3, 64);
	for (int l = 0; l < 30; l++) {
		bool edge = l < 2 || l >= 28;
		check_layer(a, l, edge ? "q8_0" : "tq3.5", edge ? "q8_0" : "tq3");
	}
	ck_assert(!kvplan_is_uniform(a));
	ck_assert_int_eq(a->layers[5].k.tq.n_hi, 32);

	/* Later overrides win; a single layer; K:V on an override. */
	_cleanup_(kvplan_freep) KvPlan *b =
		plan_ok("f16,0-9=q8_0,5=q4_0,7=f32:q4_0+h", 12, 2, 128);
	for (int l = 0; l < 12; l++) {
		const char *k = l == 5 ? "q4_0" : l == 7 ? "f32" : l < 10 ? "q8_0" : "f16";
		const char *v = l == 5 ? "q4_0" : l == 7 ? "q4_0+h" : l < 10 ? "q8_0" : "f16";
		check_layer(b, l, k, v);
	}

	/* Mixed signs: 1 to the last; -n is layer 0. */
	_cleanup_(kvplan_freep) KvPlan *c = plan_ok("f32,1--1=tq2,-30=tq8", 30, 3, 64);
	check_layer(c, 0, "tq8", "tq8");
	for (int l = 1; l < 30; l++)
		check_layer(c, l, "tq2", "tq2");
}
END_TEST

START_TEST(test_spec_name_roundtrip)
{
	static const char *const texts[] = {
		"tq4",
		"q8_0:q4_0",
		"tq3.5:tq3,0-1=q8_0,-2--1=q8_0",
		"tq4+qjl:tq4,5=f16:q8_0,-1=f32+h",
		"q4_0+h,1--1=tq2.5",
		"tq4_nc+c:tq3_nc,0=q4_0+h+c:f16",
	};
	for (size_t i = 0; i < ARRAY_SIZE(texts); i++) {
		KvSpec a, b;
		char buf[KVSPEC_MAX_LEN];
		Error err = { 0 };
		ck_assert_int_eq(kvspec_parse(texts[i], &a, &err), 0);
		kvspec_name(&a, buf, sizeof(buf));
		ck_assert_str_eq(buf, texts[i]);
		ck_assert_int_eq(kvspec_parse(buf, &b, &err), 0);
		ck_assert_int_eq(a.n_rules, b.n_rules);
		for (int r = 0; r < a.n_rules; r++) {
			ck_assert(a.rules[r].all == b.rules[r].all);
			ck_assert_int_eq(a.rules[r].first, b.rules[r].first);
			ck_assert_int_eq(a.rules[r].last, b.rules[r].last);
			ck_assert_str_eq(a.rules[r].k, b.rules[r].k);
			ck_assert_str_eq(a.rules[r].v, b.rules[r].v);
		}
	}
	/* "q8_0:q8_0" is printed once. */
	KvSpec s;
	char buf[64];
	ck_assert_int_eq(kvspec_parse("q8_0:q8_0,3=f16:f16", &s, NULL), 0);
	kvspec_name(&s, buf, sizeof(buf));
	ck_assert_str_eq(buf, "q8_0,3=f16");
}
END_TEST

typedef struct BadSpec {
	const char *text;
	int n_layers, head_dim;
	int code;
	const char *needle; /* must appear in the message */
} BadSpec;

START_TEST(test_spec_errors)
{
	static const BadSpec bad[] = {
		{ "", 30, 64, KVTYPE_E_SYNTAX, "empty KV spec" },
		{ "q5_0", 30, 64, KVTYPE_E_UNKNOWN, "'q5_0'" },
		{ "tq4,3=q5_1", 30, 64, KVTYPE_E_UNKNOWN, "'q5_1'" },
		{ "Q8_0", 30, 64, KVTYPE_E_UNKNOWN, "'Q8_0'" },
		{ "q4_0+hh", 30, 64, KVTYPE_E_UNKNOWN, "'q4_0+hh'" },
		{ "tq4+h", 30, 64, KVTYPE_E_UNKNOWN, "'tq4+h'" },
		{ "tq9", 30, 64, KVTYPE_E_UNKNOWN, "'tq9'" },
		{ "tq1+qjl", 30, 64, KVTYPE_E_UNKNOWN, "'tq1+qjl'" },
		{ "tq4:tq3+c", 30, 64, KVTYPE_E_ROLE, "'tq3+c'" },
		{ "tq4,0=q8_0:pk4", 30, 64, KVTYPE_E_ROLE, "'pk4'" },
		{ "tq4+c", 30, 64, KVTYPE_E_ROLE, "'tq4+c'" }, /* one type: V too */
		{ "tq4:q8_0+c", 30, 64, KVTYPE_E_ROLE, "'q8_0+c'" },
		{ "tq4+c+c:tq4", 30, 64, KVTYPE_E_UNKNOWN, "+c twice" },
		{ "+c:tq4", 30, 64, KVTYPE_E_UNKNOWN, "empty KV type" },
		{ "tq9+c:tq4", 30, 64, KVTYPE_E_UNKNOWN, "'tq9'" },
		{ "pk4", 30, 64, KVTYPE_E_ROLE, "'pk4'" }, /* one type: V too */
		{ "pk4+c:tq3", 30, 64, KVTYPE_E_UNKNOWN, "always centered" },
		{ "tq4+s", 30, 64, KVTYPE_E_ROLE, "'tq4+s'" }, /* one type: K too */
		{ "tq4_nc+s:tq3", 30, 64, KVTYPE_E_ROLE, "values only" },
		{ "tq4:pq+s", 30, 64, KVTYPE_E_UNKNOWN, "plain or TurboQuant" },
		{ "tq4:tq3+s+s", 30, 64, KVTYPE_E_UNKNOWN, "'tq3+s'" },
		{ "pk9:tq3", 30, 64, KVTYPE_E_UNKNOWN, "'pk9'" },
		{ "pk:tq3", 30, 64, KVTYPE_E_UNKNOWN, "'pk'" },
		{ "pk-4:tq3", 30, 64, KVTYPE_E_UNKNOWN, "'pk-4'" },
		{ "pk4x:tq3", 30, 64, KVTYPE_E_UNKNOWN, "'pk4x'" },
		{ "pk4e0:tq3", 30, 64, KVTYPE_E_UNKNOWN, "'pk4e0'" },
		{ "pk4.1:tq3", 30, 64, KVTYPE_E_DIM, "multiple of 8" },
		{ "q4_0+c+h:tq4", 30, 64, KVTYPE_E_UNKNOWN, "'q4_0+c+h'" },
		{ "q8_0:q4_0:f16", 30, 64, KVTYPE_E_SYNTAX, "'q8_0:q4_0:f16'" },
		{ "tq4,2=q8_0::f16", 30, 64, KVTYPE_E_SYNTAX, "more than one ':'" },
		{ "q8_0:", 30, 64, KVTYPE_E_SYNTAX, "'q8_0:'" },
		{ ":q8_0", 30, 64, KVTYPE_E_SYNTAX, "':q8_0'" },
		{ "tq4,,q8_0", 30, 64, KVTYPE_E_SYNTAX, "empty item 2" },
		{ "tq4,", 30, 64, KVTYPE_E_SYNTAX, "empty item 2" },
		{ ",tq4", 30, 64, KVTYPE_E_SYNTAX, "empty item 1" },
		{ "0=q8_0", 30, 64, KVTYPE_E_SYNTAX, "'0=q8_0'" },
		{ "tq4,q8_0", 30, 64, KVTYPE_E_SYNTAX, "'q8_0'" },
		{ "tq4,0-1", 30, 64, KVTYPE_E_SYNTAX, "'0-1'" },
		{ "tq4,1=2=q8_0", 30, 64, KVTYPE_E_SYNTAX, "'1=2=q8_0'" },
		{ "tq4,a-b=q8_0", 30, 64, KVTYPE_E_SYNTAX, "'a-b'" },
		{ "tq4,1-=q8_0", 30, 64, KVTYPE_E_SYNTAX, "'1-'" },
		{ "tq4,=q8_0", 30, 64, KVTYPE_E_SYNTAX, "bad layer range ''" },
		{ "tq4,1-2-3=q8_0", 30, 64, KVTYPE_E_SYNTAX, "'1-2-3'" },
		{ "tq4,-0=q8_0", 30, 64, KVTYPE_E_SYNTAX, "'-0'" },
		{ "tq4,999999=q8_0", 30, 64, KVTYPE_E_SYNTAX, "'999999'" },
		{ "tq4,3-1=q8_0", 30, 64, KVTYPE_E_RANGE, "'3-1'" },
		{ "tq4,-1--2=q8_0", 30, 64, KVTYPE_E_RANGE, "'-1--2'" },
		/* Only known against the model: */
		{ "tq4,30=q8_0", 30, 64, KVTYPE_E_RANGE, "'30'" },
		{ "tq4,28-30=q8_0", 30, 64, KVTYPE_E_RANGE, "'28-30'" },
		{ "tq4,-31=f16", 30, 64, KVTYPE_E_RANGE, "'-31'" },
		{ "tq4,5--28=f16", 30, 64, KVTYPE_E_RANGE, "'5--28'" },
		{ "q4_0", 30, 48, KVTYPE_E_DIM, "'q4_0'" },
		{ "f16,3=q8_0+h", 30, 96, KVTYPE_E_DIM, "'q8_0+h'" },
		{ "f32+h", 30, 80, KVTYPE_E_DIM, "'f32+h'" },
		{ "tq3h100", 30, 64, KVTYPE_E_DIM, "'tq3h100'" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		KvPlan *plan = NULL;
		Error err = { 0 };
		int r = kvplan_from_text(bad[i].text, bad[i].n_layers, 3, bad[i].head_dim, &plan,
					 &err);
		ck_assert_msg(r == bad[i].code, "'%s': got %d (%s), want %d", bad[i].text, r,
			      err.msg, bad[i].code);
		ck_assert_msg(strstr(err.msg, bad[i].needle), "'%s': message '%s' lacks %s",
			      bad[i].text, err.msg, bad[i].needle);
		ck_assert_ptr_null(plan);
	}
	/* NULL, too long, bad model dims. */
	KvSpec spec;
	ck_assert_int_eq(kvspec_parse(NULL, &spec, NULL), KVTYPE_E_SYNTAX);
	char longtext[KVSPEC_MAX_LEN + 8];
	memset(longtext, 'a', sizeof(longtext) - 1);
	longtext[sizeof(longtext) - 1] = '\0';
	ck_assert_int_eq(kvspec_parse(longtext, &spec, NULL), KVTYPE_E_SYNTAX);
	KvPlan *plan = NULL;
	ck_assert_int_eq(kvplan_from_text("f16", 0, 3, 64, &plan, NULL), -EINVAL);
	ck_assert_int_eq(kvplan_from_text("f16", 30, 0, 64, &plan, NULL), -EINVAL);
	ck_assert_int_eq(kvplan_from_text("f16", 30, 3, 0, &plan, NULL), -EINVAL);
	ck_assert_ptr_null(plan);
	/* Too many rules. */
	char many[KVSPEC_MAX_LEN] = "f16";
	for (int i = 0; i < KVSPEC_MAX_RULES; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), ",%d=f32", i);
	ck_assert_int_eq(kvspec_parse(many, &spec, NULL), KVTYPE_E_SYNTAX);
}
END_TEST

START_TEST(test_type_roles_and_names)
{
	KvType t;
	Error err = { 0 };
	/* +qjl is for keys and values (the unbiased residual estimate of v). */
	ck_assert_int_eq(kvtype_from_name("tq4+qjl", KV_ROLE_K, 64, &t, &err), 0);
	ck_assert_int_eq(kvtype_from_name("tq4+qjl", KV_ROLE_V, 64, &t, &err), 0);
	ck_assert_int_eq(kvtype_from_name("tq4+sqjl", KV_ROLE_V, 64, &t, &err), 0);
	/* +c is for keys only, on any format, and it changes nothing else */
	ck_assert_int_eq(kvtype_from_name("tq4_nc+c", KV_ROLE_V, 64, &t, &err), KVTYPE_E_ROLE);
	ck_assert_ptr_nonnull(strstr(err.msg, "keys only"));
	KvType plain = type_ok("tq3.5o", KV_ROLE_K, 64), centered = type_ok("tq3.5o+c", KV_ROLE_K, 64);
	ck_assert(centered.centered && !plain.centered && !kvtype_equal(&plain, &centered));
	centered.centered = false;
	ck_assert(kvtype_equal(&plain, &centered));
	ck_assert_uint_eq(kvtype_vec_bytes(&plain), kvtype_vec_bytes(&centered));
	/* +s is for values only (plain and TQ formats), and it changes nothing else */
	ck_assert_int_eq(kvtype_from_name("tq2.5_nc+s", KV_ROLE_K, 64, &t, &err), KVTYPE_E_ROLE);
	static const char *const sink_names[] = { "tq2.5_nc+s", "q4_0+h+s", "f16+s", "tq3+qjl+s", "tq3.5o+s" };
	for (size_t i = 0; i < ARRAY_SIZE(sink_names); i++) {
		char buf[KVTYPE_NAME_MAX], base[KVTYPE_NAME_MAX];
		KvType s = type_ok(sink_names[i], KV_ROLE_V, 64);
		kvtype_name(&s, buf, sizeof(buf));
		ck_assert_str_eq(buf, sink_names[i]);
		snprintf(base, sizeof(base), "%.*s", (int)strlen(sink_names[i]) - 2, sink_names[i]);
		KvType b = type_ok(base, KV_ROLE_V, 64);
		ck_assert(s.sink && !s.centered && !b.sink && !kvtype_equal(&s, &b));
		ck_assert_uint_eq(kvtype_vec_bytes(&s), kvtype_vec_bytes(&b));
	}

	static const char *const names[] = {
		"f32", "f16", "q8_0", "q4_0", "f32+h", "f16+h", "q8_0+h", "q4_0+h",
		"tq1", "tq2", "tq3", "tq4", "tq5", "tq6", "tq7", "tq8", "tq2.5", "tq3.5",
		"tq4.5", "tq3+qjl", "tq4+sqjl", "tq3_nc", "tq3h16", "tq3.5o", "tq4+qjl_nc",
		"f16+c", "q8_0+c", "q4_0+h+c", "tq4_nc+c", "tq3+qjl+c", "tq3.5o+c",
		"pk1", "pk2.5", "pk4", "pk5.125", "pk8",
		"pq", "pq3", "pq4f", "pq1f", "pq8", "pq+c",
	};
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		for (int dim = 64; dim <= 128; dim *= 2) {
			char buf[KVTYPE_NAME_MAX];
			KvType a = type_ok(names[i], KV_ROLE_K, dim), b;
			kvtype_name(&a, buf, sizeof(buf));
			ck_assert_str_eq(buf, names[i]);
			b = type_ok(buf, KV_ROLE_K, dim);
			ck_assert(kvtype_equal(&a, &b));
		}
	}
	KvType a = type_ok("q4_0", KV_ROLE_K, 64), b = type_ok("q4_0+h", KV_ROLE_K, 64);
	ck_assert(!kvtype_equal(&a, &b));
	b = type_ok("q4_0", KV_ROLE_K, 128);
	ck_assert(!kvtype_equal(&a, &b));
}
END_TEST

/* ---- bits per value ---- */

typedef struct BitsRow {
	const char *name;
	double bits64, bits128; /* by hand: every stored byte * 8 / d */
} BitsRow;

START_TEST(test_bits_per_value)
{
	/*
	 * TQ: 2 bytes of fp16 norm (4 with "o": two groups), + 2 of gamma
	 * and d/8 of sign bits with +qjl (whose MSE codes have B-1 bits),
	 * + ceil(n * bits / 8) per code group. tq2.5 at 64: 2 + 32*3/8 +
	 * 32*2/8 = 22 bytes = 2.75 bits.
	 */
	static const BitsRow rows[] = {
		{ "f32", 32, 32 },        { "f16", 16, 16 },
		{ "q8_0", 8.5, 8.5 },     { "q4_0", 4.5, 4.5 },
		{ "q8_0+h", 8.5, 8.5 },   { "q4_0+h", 4.5, 4.5 },
		{ "f16+h", 16, 16 },      { "tq1", 1.25, 1.125 },
		{ "tq2", 2.25, 2.125 },   { "tq3", 3.25, 3.125 },
		{ "tq4", 4.25, 4.125 },   { "tq5", 5.25, 5.125 },
		{ "tq8", 8.25, 8.125 },   { "tq2.5", 2.75, 2.625 },
		{ "tq3.5", 3.75, 3.625 }, { "tq4.5", 4.75, 4.625 },
		{ "tq2+qjl", 2.5, 2.25 }, { "tq3+qjl", 3.5, 3.25 },
		{ "tq4+qjl", 4.5, 4.25 }, { "tq4+sqjl", 4.5, 4.25 },
		{ "tq4_nc", 4.25, 4.125 }, { "tq3.5o", 4.0, 3.75 },
		{ "tq3h16", 3.5, 3.25 },
		/* pk: B d / 8 code bytes + ceil(3 d / 4 / 32) of side data per row */
		{ "pk4", 4.25, 4.1875 },  { "pk2.5", 2.75, 2.6875 },
		{ "pk4.125", 4.375, 4.3125 },
		/* pq: fp16 radii + the angle codes (kv_pq_layout.h) */
		{ "pq", 3.875, 3.875 },   { "pq4f", 3.25, 3.125 },
		{ "pq3f", 2.25, 2.125 },  { "pq5f", 4.25, 4.125 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(rows); i++) {
		for (int dim = 64; dim <= 128; dim *= 2) {
			double want = dim == 64 ? rows[i].bits64 : rows[i].bits128;
			KvType t = type_ok(rows[i].name, KV_ROLE_K, dim);
			double got = kvtype_bits_per_value(&t);
			ck_assert_msg(got == want, "%s at %d: %g bits, want %g", rows[i].name, dim,
				      got, want);
			ck_assert_uint_eq(kvtype_vec_bytes(&t), (size_t)(want * dim / 8));
			if (t.format != KV_FORMAT_TQ)
				continue;
			/* The codec agrees on its own layout. */
			TqCodec *c = NULL;
			ck_assert_int_eq(tq_codec_new(&t.tq, &c, NULL), 0);
			ck_assert_uint_eq(tq_code_bytes(c), kvtype_vec_bytes(&t));
			tq_codec_free(c);
		}
	}

	/* Whole plans: the default model's shape (30 layers, 3 kv-heads, d 64). */
	_cleanup_(kvplan_freep) KvPlan *f16 = plan_ok("f16", 30, 3, 64);
	ck_assert_uint_eq(kvplan_bytes_per_token(f16), 30 * 3 * 2 * 64 * 2);
	ck_assert(kvplan_bits_per_value(f16) == 16.0);
	_cleanup_(kvplan_freep) KvPlan *tq4 = plan_ok("tq4", 30, 3, 64);
	ck_assert(kvplan_bits_per_value(tq4) == 4.25);
	ck_assert_uint_eq(kvplan_bytes_per_token(tq4), 30 * 3 * 2 * 34);
	/* 26 layers of tq3.5 (30 B) + tq3 (26 B), 4 of q8_0 (68 B + 68 B). */
	_cleanup_(kvplan_freep) KvPlan *mix = plan_ok("tq3.5:tq3,0-1=q8_0,-2--1=q8_0", 30, 3, 64);
	ck_assert_uint_eq(kvplan_bytes_per_token(mix), (26 * (30 + 26) + 4 * 136) * 3);
	ck_assert_double_eq_tol(kvplan_bits_per_value(mix), 6000.0 * 8 / (2 * 30 * 3 * 64), 1e-12);
	_cleanup_(kvplan_freep) KvPlan *kv = plan_ok("q8_0:q4_0", 2, 1, 128);
	ck_assert(kvplan_bits_per_value(kv) == 6.5);
}
END_TEST

/* ---- block quantizers against gguf-py ---- */

#define GOLD_DIM 128

static void *read_gold(const char *name, size_t *ret_len)
{
	void *p = test_read_file(test_data_path(name), ret_len);
	ck_assert_msg(p, "cannot read %s (scripts/gen-kvquant-golden.py)", name);
	return p;
}

START_TEST(test_golden_blocks)
{
	size_t nx, n8, n4, n16;
	_cleanup_(freep) float *x = read_gold("kvquant/vectors.f32", &nx);
	_cleanup_(freep) uint8_t *g8 = read_gold("kvquant/q8_0.bin", &n8);
	_cleanup_(freep) uint8_t *g4 = read_gold("kvquant/q4_0.bin", &n4);
	_cleanup_(freep) uint8_t *g16 = read_gold("kvquant/f16.bin", &n16);
	size_t n_vec = nx / (GOLD_DIM * sizeof(float));
	const size_t b8 = GOLD_DIM / 32 * 34, b4 = GOLD_DIM / 32 * 18, b16 = GOLD_DIM * 2;

	ck_assert_uint_ge(n_vec, 30);
	ck_assert_uint_eq(nx, n_vec * GOLD_DIM * sizeof(float));
	ck_assert_uint_eq(n8, n_vec * b8);
	ck_assert_uint_eq(n4, n_vec * b4);
	ck_assert_uint_eq(n16, n_vec * b16);
	for (size_t v = 0; v < n_vec; v++) {
		const float *xv = x + v * GOLD_DIM;
		BlockQ8_0 q8[GOLD_DIM / 32];
		BlockQ4_0 q4[GOLD_DIM / 32];
		tkv_half h[GOLD_DIM];
		kvquant_quantize_q8_0(xv, GOLD_DIM, q8);
		kvquant_quantize_q4_0(xv, GOLD_DIM, q4);
		kvquant_quantize_f16(xv, GOLD_DIM, h);
		for (size_t i = 0; i < b8; i++)
			ck_assert_msg(((uint8_t *)q8)[i] == g8[v * b8 + i],
				      "q8_0 vector %zu byte %zu: %02x, gguf-py %02x", v, i,
				      ((uint8_t *)q8)[i], g8[v * b8 + i]);
		for (size_t i = 0; i < b4; i++)
			ck_assert_msg(((uint8_t *)q4)[i] == g4[v * b4 + i],
				      "q4_0 vector %zu byte %zu: %02x, gguf-py %02x", v, i,
				      ((uint8_t *)q4)[i], g4[v * b4 + i]);
		ck_assert_msg(memcmp(h, g16 + v * b16, b16) == 0, "f16 vector %zu", v);

		/* Through the KvType interface: the same bytes. */
		_Alignas(16) uint8_t buf[GOLD_DIM * 4];
		KvType t8 = type_ok("q8_0", KV_ROLE_K, GOLD_DIM);
		KvType t4 = type_ok("q4_0", KV_ROLE_V, GOLD_DIM);
		kvquant_store(&t8, xv, buf);
		ck_assert_mem_eq(buf, g8 + v * b8, b8);
		kvquant_store(&t4, xv, buf);
		ck_assert_mem_eq(buf, g4 + v * b4, b4);
	}
}
END_TEST

/* Dequantization by the format's definition (wtype.h), written out here. */
START_TEST(test_dequantize_definition)
{
	uint64_t st = test_seed() ^ 0x11;
	const int d = 64;
	float x[64], y[64];
	BlockQ8_0 q8[2];
	BlockQ4_0 q4[2];

	for (int it = 0; it < 200; it++) {
		rand_outlier_vec(&st, d, x);
		kvquant_quantize_q8_0(x, d, q8);
		kvquant_dequantize_q8_0(q8, d, y);
		for (int i = 0; i < d; i++) {
			float s = half_to_f32(q8[i / 32].d);
			ck_assert(y[i] == s * (float)q8[i / 32].qs[i % 32]);
			/* Half a step, plus |q| <= 127 times the fp16 rounding of s. */
			ck_assert(fabsf(x[i] - y[i]) <= s * (0.5f + 127.0f / 2048.0f) + 1e-6f);
		}
		kvquant_quantize_q4_0(x, d, q4);
		kvquant_dequantize_q4_0(q4, d, y);
		for (int i = 0; i < d; i++) {
			const BlockQ4_0 *b = &q4[i / 32];
			int j = i % 32;
			int q = j < 16 ? (b->qs[j] & 15) : (b->qs[j - 16] >> 4);
			float s = half_to_f32(b->d);
			ck_assert(y[i] == s * (float)(q - 8));
			/* Nearest level, except the clamped top one (q 15). */
			ck_assert(fabsf(x[i] - y[i]) <= fabsf(s) * 1.01f + 1e-6f);
		}
	}
}
END_TEST

/* ---- scores and value sums on the stored form ---- */

START_TEST(test_score_axpy_vs_dequantized)
{
	static const char *const names[] = { "f32", "f16", "q8_0", "q4_0",
					     "f32+h", "f16+h", "q8_0+h", "q4_0+h" };
	uint64_t st = test_seed() ^ 0x22;

	for (size_t n = 0; n < ARRAY_SIZE(names); n++) {
		for (int d = 64; d <= 128; d *= 2) {
			KvType t = type_ok(names[n], KV_ROLE_K, d);
			float q[128], qp[128], k[128], kd[128], acc[128], ref[128];
			_Alignas(16) uint8_t stored[512];
			for (int it = 0; it < 100; it++) {
				rand_outlier_vec(&st, d, k);
				rand_vec(&st, d, q);
				kvquant_store(&t, k, stored);
				/* The stored (possibly rotated) vector, dequantized. */
				KvType plain = t;
				plain.hadamard = false;
				kvquant_load(&plain, stored, kd);

				kvquant_query_prepare(&t, q, qp);
				double want = dot_d(qp, kd, d);
				double got = kvquant_score(&t, qp, stored);
				double tol = 1e-5 * dot_abs(qp, kd, d) + 1e-30;
				ck_assert_msg(fabs(got - want) <= tol, "%s d %d: score %g, want %g",
					      names[n], d, got, want);

				float a = test_rand_normal(&st);
				for (int i = 0; i < d; i++)
					acc[i] = ref[i] = test_rand_normal(&st);
				kvquant_axpy(&t, a, stored, acc);
				for (int i = 0; i < d; i++) {
					double r = (double)ref[i] + (double)a * kd[i];
					double e = 1e-6 * (fabs(ref[i]) + fabs(a * kd[i])) + 1e-30;
					ck_assert_msg(fabs(acc[i] - r) <= e, "%s d %d: axpy[%d]",
						      names[n], d, i);
				}
			}
		}
	}
}
END_TEST

/* ---- +h ---- */

static int popcount(unsigned v)
{
	int n = 0;
	for (; v; v >>= 1)
		n += v & 1;
	return n;
}

START_TEST(test_hadamard_matrix)
{
	for (int d = 32; d <= 256; d *= 2) {
		float *r = malloc(sizeof(float) * (size_t)d * (size_t)d); /* column j = R e_j */
		ck_assert_ptr_nonnull(r);
		for (int j = 0; j < d; j++) {
			float *col = r + (size_t)j * (size_t)d;
			memset(col, 0, sizeof(float) * (size_t)d);
			col[j] = 1.0f;
			kvquant_hadamard(col, d);
		}
		double s = 1.0 / sqrt(d);
		for (int i = 0; i < d; i++)
			for (int j = 0; j < d; j++) {
				double want = (popcount((unsigned)(i & j)) & 1) ? -s : s;
				ck_assert(fabs(r[(size_t)j * d + i] - want) < 1e-7);
			}
		/* Orthogonal: R^T R = I. */
		for (int i = 0; i < d; i++)
			for (int j = 0; j < d; j++) {
				double g = dot_d(r + (size_t)i * d, r + (size_t)j * d, d);
				ck_assert(fabs(g - (i == j)) < 1e-6);
			}
		free(r);
	}
	/* Its own inverse. */
	uint64_t st = test_seed() ^ 0x33;
	float x[128], y[128];
	rand_vec(&st, 128, x);
	memcpy(y, x, sizeof(x));
	kvquant_hadamard(y, 128);
	kvquant_hadamard(y, 128);
	for (int i = 0; i < 128; i++)
		ck_assert(fabsf(x[i] - y[i]) < 1e-5f);
}
END_TEST

START_TEST(test_hadamard_scores_and_values)
{
	uint64_t st = test_seed() ^ 0x44;
	const int d = 64, n_tok = 16;

	/* f32+h: scores and value sums equal the unrotated ones to rounding. */
	for (int pass = 0; pass < 3; pass++) {
		const char *name = pass == 0 ? "f32+h" : pass == 1 ? "q8_0+h" : "q4_0+h";
		KvType t = type_ok(name, KV_ROLE_K, d);
		/* Relative error allowed for scores, and for the value sum. */
		double tol = pass == 0 ? 1e-5 : pass == 1 ? 0.02 : 0.25;
		float q[64], qp[64], k[64], v[64], out[64], vd[64];
		double ref[64] = { 0 }, ref_q[64] = { 0 };
		_Alignas(16) uint8_t stored[256];
		memset(out, 0, sizeof(out));
		rand_vec(&st, d, q);
		kvquant_query_prepare(&t, q, qp);
		for (int j = 0; j < n_tok; j++) {
			rand_outlier_vec(&st, d, k);
			kvquant_store(&t, k, stored);
			double exact = dot_d(q, k, d);
			double got = kvquant_score(&t, qp, stored);
			double scale = sqrt(dot_d(q, q, d) * dot_d(k, k, d));
			ck_assert_msg(fabs(got - exact) <= tol * scale, "%s: score %g, exact %g",
				      name, got, exact);
			/* Against the un-rotated dequantized key: float rounding only. */
			kvquant_load(&t, stored, vd);
			ck_assert(fabs(got - dot_d(q, vd, d)) <= 1e-5 * scale);

			float p = test_rand_uniform(&st);
			rand_outlier_vec(&st, d, v);
			kvquant_store(&t, v, stored);
			kvquant_axpy(&t, p, stored, out);
			kvquant_load(&t, stored, vd);
			for (int i = 0; i < d; i++) {
				ref[i] += (double)p * v[i];
				ref_q[i] += (double)p * vd[i];
			}
		}
		kvquant_output_finish(&t, out);
		double e2 = 0, eq2 = 0, n2 = 0;
		for (int i = 0; i < d; i++) {
			e2 += (out[i] - ref[i]) * (out[i] - ref[i]);
			eq2 += (out[i] - ref_q[i]) * (out[i] - ref_q[i]);
			n2 += ref[i] * ref[i];
		}
		ck_assert_msg(sqrt(e2 / n2) <= tol, "%s: value sum rel err %g", name, sqrt(e2 / n2));
		ck_assert_msg(sqrt(eq2 / n2) <= 1e-5, "%s: value sum vs dequantized %g", name,
			      sqrt(eq2 / n2));
	}
}
END_TEST

START_TEST(test_hadamard_helps_outliers)
{
	uint64_t st = test_seed() ^ 0x55;
	static const char *const pairs[][2] = { { "q8_0", "q8_0+h" }, { "q4_0", "q4_0+h" } };

	for (int d = 64; d <= 128; d *= 2) {
		for (size_t p = 0; p < ARRAY_SIZE(pairs); p++) {
			KvType plain = type_ok(pairs[p][0], KV_ROLE_K, d);
			KvType rot = type_ok(pairs[p][1], KV_ROLE_K, d);
			double e_plain = 0, e_rot = 0; /* sums of relative squared errors */
			for (int it = 0; it < 300; it++) {
				float x[128], y[128];
				_Alignas(16) uint8_t stored[256];
				rand_outlier_vec(&st, d, x);
				kvquant_store(&plain, x, stored);
				kvquant_load(&plain, stored, y);
				double n2 = dot_d(x, x, d);
				for (int i = 0; i < d; i++)
					e_plain += (x[i] - y[i]) * (x[i] - y[i]) / n2;
				kvquant_store(&rot, x, stored);
				kvquant_load(&rot, stored, y);
				for (int i = 0; i < d; i++)
					e_rot += (x[i] - y[i]) * (x[i] - y[i]) / n2;
			}
			/* Outliers cost a plain block most of its resolution. */
			ck_assert_msg(e_rot < 0.5 * e_plain, "%s d %d: rotated %g, plain %g",
				      pairs[p][0], d, e_rot / 300, e_plain / 300);
		}
	}
}
END_TEST

/*
 * Presets: each name parses to its spec's plan, wherever a spec is
 * parsed; small is at most 2.67 bits per value (6x smaller than f16) on
 * the default model's shape and at head_dim 128, on the CPU and the GPU;
 * a preset is a whole spec, not a type.
 */
START_TEST(test_presets)
{
	static const int dims[] = { 64, 128 };
	for (size_t i = 0; kvspec_preset_at(i); i++) {
		const KvPreset *p = kvspec_preset_at(i);
		ck_assert_ptr_eq(kvspec_preset(p->name), p);
		for (size_t k = 0; k < ARRAY_SIZE(dims); k++) {
			_cleanup_(kvplan_freep) KvPlan *a = plan_ok(p->name, 30, 3, dims[k]);
			_cleanup_(kvplan_freep) KvPlan *b = plan_ok(p->spec, 30, 3, dims[k]);
			_cleanup_(kvplan_freep) KvPlan *g = plan_ok(p->spec_gpu, 30, 3, dims[k]);
			ck_assert_int_eq(kvplan_bytes_per_token(a), kvplan_bytes_per_token(b));
			for (int l = 0; l < 30; l++)
				ck_assert(kvtype_equal(&a->layers[l].k, &b->layers[l].k) &&
					  kvtype_equal(&a->layers[l].v, &b->layers[l].v));
			if (strcmp(p->name, "small") == 0) {
				ck_assert_msg(kvplan_bits_per_value(a) <= 2.67, "small: %g bits at %d",
					      kvplan_bits_per_value(a), dims[k]);
				ck_assert_msg(kvplan_bits_per_value(g) <= 2.67, "small (GPU): %g bits at %d",
					      kvplan_bits_per_value(g), dims[k]);
			}
		}
		/* one layer is a model too: presets carry no layer ranges */
		_cleanup_(kvplan_freep) KvPlan *one = plan_ok(p->name, 1, 1, 64);
		_cleanup_(kvplan_freep) KvPlan *one_gpu = plan_ok(p->spec_gpu, 1, 1, 64);
	}
	ck_assert_str_eq(kvspec_preset("default")->spec, KV_DEFAULT_SPEC);
	ck_assert_str_eq(kvspec_preset("default")->spec_gpu, KV_DEFAULT_SPEC_GPU);
	ck_assert_ptr_null(kvspec_preset("Small"));
	ck_assert_ptr_null(kvspec_preset("pk5:tq3.5_nc"));
	KvSpec spec;
	Error err = { 0 };
	ck_assert_int_eq(kvspec_parse("small:tq3", &spec, &err), KVTYPE_E_UNKNOWN);
	ck_assert_int_eq(kvspec_parse("small,0=f16", &spec, &err), KVTYPE_E_UNKNOWN);
	ck_assert_int_eq(kvspec_parse("exact", &spec, &err), 0);
	char buf[128];
	kvspec_name(&spec, buf, sizeof(buf));
	ck_assert_str_eq(buf, KV_EXACT_SPEC);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kvtype");
	TCase *tc = tcase_create("spec");
	tcase_add_test(tc, test_spec_uniform);
	tcase_add_test(tc, test_spec_overrides);
	tcase_add_test(tc, test_spec_name_roundtrip);
	tcase_add_test(tc, test_spec_errors);
	tcase_add_test(tc, test_presets);
	tcase_add_test(tc, test_type_roles_and_names);
	tcase_add_test(tc, test_bits_per_value);
	suite_add_tcase(s, tc);
	tc = tcase_create("quant");
	tcase_add_test(tc, test_golden_blocks);
	tcase_add_test(tc, test_dequantize_definition);
	tcase_add_test(tc, test_score_axpy_vs_dequantized);
	tcase_add_test(tc, test_hadamard_matrix);
	tcase_add_test(tc, test_hadamard_scores_and_values);
	tcase_add_test(tc, test_hadamard_helps_outliers);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
