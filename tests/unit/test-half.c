/*
 * test-half.c: base/half.h against numpy and an independent reference.
 *
 * Golden data: tests/data/wtype/half.txt (scripts/gen-wtype-golden.py):
 * a hash of numpy's float16 -> float32 for all 65536 halfs, and numpy's
 * float16 and gguf-py's (= ggml's) bfloat16 for a sweep of floats around
 * every rounding boundary. Besides that, every half and a few million
 * floats are checked against a reference written here from the IEEE 754
 * definitions in double arithmetic (values via ldexp, rounding by
 * comparing distances to the two neighbours), sharing no code with half.h.
 *
 * NaN: half.h turns a float NaN into the quiet NaN 0x7e00 with its sign,
 * as ggml does; numpy keeps payload bits. Only NaN-ness and sign are
 * compared for NaN inputs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "tests/unit/testutil.h"

/* Value of half bits h (0x7c00 taken as 65536 so rounding can reach it). */
static double ref_half_value_ext(uint16_t h)
{
	int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
	double v;
	if (exp == 0)
		v = ldexp(mant, -24);
	else if (exp == 31 && mant == 0)
		v = 65536.0;
	else if (exp == 31)
		v = NAN;
	else
		v = ldexp(1024 + mant, exp - 25);
	return sign ? -v : v;
}

/* Value of half bits h as IEEE says, inf included. */
static double ref_half_value(uint16_t h)
{
	if ((h & 0x7fff) == 0x7c00)
		return (h & 0x8000) ? -INFINITY : INFINITY;
	return ref_half_value_ext(h);
}

/* Round to nearest, ties to even, by distances: x not NaN. */
static uint16_t ref_f32_to_half(float x)
{
	double a = fabs((double)x);
	uint16_t sign = signbit(x) ? 0x8000 : 0;
	if (a >= 65536.0)
		return sign | 0x7c00;
	/* largest lo in [0, 0x7bff] with value(lo) <= a */
	uint16_t lo = 0, hi = 0x7bff;
	while (lo < hi) {
		uint16_t m = (uint16_t)((lo + hi + 1) / 2);
		if (ref_half_value_ext(m) <= a)
			lo = m;
		else
			hi = (uint16_t)(m - 1);
	}
	double dlo = a - ref_half_value_ext(lo);
	double dhi = ref_half_value_ext((uint16_t)(lo + 1)) - a;
	uint16_t r;
	if (dlo < dhi)
		r = lo;
	else if (dhi < dlo)
		r = (uint16_t)(lo + 1);
	else
		r = (lo & 1) ? (uint16_t)(lo + 1) : lo;
	return sign | r;
}

static double ref_bf16_value(uint16_t b)
{
	int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
	double v;
	if (exp == 0)
		v = ldexp(mant, -133);
	else if (exp == 255)
		v = mant ? NAN : (double)INFINITY;
	else
		v = ldexp(128 + mant, exp - 134);
	return sign ? -v : v;
}

/* bfloat16 round to nearest even by distances; x not NaN. */
static uint16_t ref_f32_to_bf16(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof(u));
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	uint16_t lo = (uint16_t)((u >> 16) & 0x7fff); /* truncation toward zero */
	if (lo == 0x7f80)
		return sign | lo; /* inf */
	uint16_t hi = (uint16_t)(lo + 1);
	double a = fabs((double)x);
	double vhi = hi == 0x7f80 ? ldexp(1.0, 128) : ref_bf16_value(hi);
	double dlo = a - ref_bf16_value(lo), dhi = vhi - a;
	uint16_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
	return sign | r;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static int is_nan_half(uint16_t h)
{
	return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

START_TEST(test_half_to_f32_all)
{
	int bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = half_to_f32((tkv_half)h);
		double ref = ref_half_value((uint16_t)h);
		int ok;
		if (isnan(ref))
			ok = isnan(f) && !!signbit(f) == !!(h & 0x8000) &&
			     (f32_bits(f) & 0x7fffff) == (h & 0x3ffu) << 13;
		else
			ok = (double)f == ref && !!signbit(f) == !!(h & 0x8000);
		if (!ok && bad++ < 5)
			fprintf(stderr, "half %04x -> %a (bits %08x), want %a\n", h, f, f32_bits(f), ref);
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(test_half_round_trip)
{
	for (uint32_t h = 0; h < 65536; h++) {
		tkv_half r = f32_to_half(half_to_f32((tkv_half)h));
		if (is_nan_half((uint16_t)h)) {
			ck_assert_msg(is_nan_half(r) && (r & 0x8000) == (h & 0x8000),
				      "nan %04x -> %04x", h, r);
			continue;
		}
		ck_assert_msg(r == h, "half %04x round trip gives %04x", h, r);
	}
}
END_TEST

/* Every half, the midpoints to its neighbour (ties) and the floats next to them. */
START_TEST(test_f32_to_half_boundaries)
{
	int bad = 0;
	long checked = 0;
	for (uint32_t h = 0; h < 0x7c00; h++) {
		double v = ref_half_value_ext((uint16_t)h);
		double mid = (v + ref_half_value_ext((uint16_t)(h + 1))) / 2;
		float pts[5] = {
			(float)v, (float)mid, nextafterf((float)mid, 0.0f),
			nextafterf((float)mid, INFINITY), nextafterf((float)v, INFINITY),
		};
		ck_assert((double)(float)mid == mid); /* the tie is a float */
		for (int k = 0; k < 5; k++) {
			for (int s = 0; s < 2; s++) {
				float x = s ? -pts[k] : pts[k];
				tkv_half got = f32_to_half(x), want = ref_f32_to_half(x);
				checked++;
				if (got != want && bad++ < 5)
					fprintf(stderr, "f32 %a (%08x): got %04x want %04x\n",
						x, f32_bits(x), got, want);
			}
		}
	}
	ck_assert_int_eq(bad, 0);
	ck_assert_int_gt(checked, 300000);
}
END_TEST

START_TEST(test_f32_to_half_random)
{
	uint64_t st = test_seed() ^ 0x4a1f;
	int bad = 0;
	for (int i = 0; i < 1000000; i++) {
		uint32_t u = (uint32_t)test_rand_u64(&st);
		if (i & 1) /* half of them in the range where halfs live */
			u = (0x32800000u + u % (0x47900000u - 0x32800000u)) | (u & 0x80000000u);
		float x = bits_f32(u);
		tkv_half got = f32_to_half(x);
		if (isnan(x)) {
			if (!is_nan_half(got) || (got & 0x8000) != ((u >> 16) & 0x8000))
				bad++;
			continue;
		}
		tkv_half want = ref_f32_to_half(x);
		if (got != want && bad++ < 5)
			fprintf(stderr, "f32 %08x: got %04x want %04x\n", u, got, want);
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(test_half_special)
{
	/* written out by hand from the binary16 encoding */
	ck_assert_uint_eq(f32_to_half(1.0f), 0x3c00);
	ck_assert_uint_eq(f32_to_half(-2.0f), 0xc000);
	ck_assert_uint_eq(f32_to_half(65504.0f), 0x7bff);
	ck_assert_uint_eq(f32_to_half(65519.99f), 0x7bff);
	ck_assert_uint_eq(f32_to_half(65520.0f), 0x7c00);
	ck_assert_uint_eq(f32_to_half(1e10f), 0x7c00);
	ck_assert_uint_eq(f32_to_half(-INFINITY), 0xfc00);
	ck_assert_uint_eq(f32_to_half(0x1p-24f), 0x0001);
	ck_assert_uint_eq(f32_to_half(0x1p-25f), 0x0000);     /* tie to even 0 */
	ck_assert_uint_eq(f32_to_half(0x1.8p-24f), 0x0002);   /* tie to even 2 */
	ck_assert_uint_eq(f32_to_half(0x1.4p-23f), 0x0002);   /* 2.5 ulp: tie to 2 */
	ck_assert_uint_eq(f32_to_half(0x1p-14f), 0x0400);
	ck_assert_uint_eq(f32_to_half(0x1.ff8p-15f), 0x03ff); /* largest subnormal */
	ck_assert_uint_eq(f32_to_half(0x1.ffcp-15f), 0x0400); /* tie up to even */
	ck_assert_uint_eq(f32_to_half(1.0f + 0x1p-11f), 0x3c00); /* tie down */
	ck_assert_uint_eq(f32_to_half(1.0f + 0x3p-11f), 0x3c02); /* tie up */
	ck_assert_uint_eq(f32_to_half(-0.0f), 0x8000);
	ck_assert_uint_eq(f32_to_half(NAN) & 0x7e00, 0x7e00);
	ck_assert(half_to_f32(0x7c00) == INFINITY);
	ck_assert(half_to_f32(0x0001) == 0x1p-24f);
	ck_assert(half_to_f32(0x3555) == 0x1.554p-2f);
	ck_assert(isnan(half_to_f32(0x7e00)));
}
END_TEST

/* Golden data from numpy and gguf-py: see the top of this file. */
START_TEST(test_half_golden)
{
	char *text = test_read_file(test_data_path("wtype/half.txt"), NULL);
	ck_assert_msg(text, "cannot read %s", test_data_path("wtype/half.txt"));

	uint64_t want_hash = 0;
	int lines = 0, bad = 0;
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned long long hh;
		unsigned f, h, b;
		if (sscanf(line, "h2f_fnv1a %llx", &hh) == 1) {
			want_hash = hh;
		} else if (sscanf(line, "f2h %x %x %x", &f, &h, &b) == 3) {
			float x = bits_f32(f);
			tkv_half got = f32_to_half(x);
			tkv_bf16 gotb = f32_to_bf16(x);
			int ok;
			if (isnan(x))
				ok = is_nan_half(got) && is_nan_half((uint16_t)h) &&
				     (got & 0x8000) == (h & 0x8000);
			else
				ok = got == h;
			ok = ok && gotb == b;
			if (!ok && bad++ < 5)
				fprintf(stderr, "f32 %08x: half %04x want %04x, bf16 %04x want %04x\n",
					f, got, h, gotb, b);
			lines++;
		}
	}
	free(text);
	ck_assert_int_eq(bad, 0);
	ck_assert_int_gt(lines, 1000);

	uint64_t hash = 0xcbf29ce484222325ull;
	for (uint32_t i = 0; i < 65536; i++) {
		uint32_t u = f32_bits(half_to_f32((tkv_half)i));
		for (int k = 0; k < 4; k++) {
			hash ^= (u >> (8 * k)) & 0xff;
			hash *= 0x100000001b3ull;
		}
	}
	ck_assert_msg(want_hash != 0, "no h2f_fnv1a line");
	ck_assert_msg(hash == want_hash, "half->f32 hash %016llx, numpy %016llx",
		      (unsigned long long)hash, (unsigned long long)want_hash);
}
END_TEST

START_TEST(test_bf16_all)
{
	for (uint32_t b = 0; b < 65536; b++) {
		float f = bf16_to_f32((tkv_bf16)b);
		double ref = ref_bf16_value((uint16_t)b);
		if (isnan(ref)) {
			ck_assert(isnan(f));
			ck_assert_uint_eq(f32_bits(f), b << 16);
			/* quiet stays quiet, signalling gets the quiet bit */
			ck_assert_uint_eq(f32_to_bf16(f), b | 0x40);
			continue;
		}
		ck_assert_msg((double)f == ref && !!signbit(f) == !!(b & 0x8000),
			      "bf16 %04x -> %a want %a", b, f, ref);
		ck_assert_uint_eq(f32_to_bf16(f), b);
	}
}
END_TEST

START_TEST(test_bf16_random)
{
	uint64_t st = test_seed() ^ 0xbf16;
	int bad = 0;
	for (int i = 0; i < 1000000; i++) {
		uint32_t u = (uint32_t)test_rand_u64(&st);
		if (i % 4 == 0) /* exact ties and their neighbours */
			u = (u & 0xffff0000u) | 0x8000u;
		if (i % 4 == 1)
			u = (u & 0xffff0000u) | (0x8000u + (uint32_t)(i % 3) - 1u);
		float x = bits_f32(u);
		if (isnan(x))
			continue;
		tkv_bf16 got = f32_to_bf16(x), want = ref_f32_to_bf16(x);
		if (got != want && bad++ < 5)
			fprintf(stderr, "f32 %08x: bf16 %04x want %04x\n", u, got, want);
	}
	ck_assert_int_eq(bad, 0);
	ck_assert_uint_eq(f32_to_bf16(0x1.ff8p+127f), 0x7f80); /* rounds to inf */
	ck_assert_uint_eq(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie down */
	ck_assert_uint_eq(f32_to_bf16(1.0f + 0x3p-8f), 0x3f82); /* tie up */
}
END_TEST

static Suite *half_suite(void)
{
	Suite *s = suite_create("half");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_half_to_f32_all);
	tcase_add_test(tc, test_half_round_trip);
	tcase_add_test(tc, test_f32_to_half_boundaries);
	tcase_add_test(tc, test_f32_to_half_random);
	tcase_add_test(tc, test_half_special);
	tcase_add_test(tc, test_half_golden);
	tcase_add_test(tc, test_bf16_all);
	tcase_add_test(tc, test_bf16_random);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(half_suite());
}
