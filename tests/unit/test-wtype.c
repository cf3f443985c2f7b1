/*
 * test-wtype.c: the weight type table and wtype_dequantize_row().
 *
 * Golden data: tests/data/wtype/golden.txt (scripts/gen-wtype-golden.py),
 * rows of random blocks (finite scales) and of gguf-py-quantized data with
 * gguf-py's dequantized values, for every type. gguf-py does the same
 * float32 operations in the same order as ggml (products, then one add or
 * subtract, no FMA), so the comparison is bit-exact: tolerance 0 ulp (NaN
 * only has to match NaN). Besides that, hand-made blocks whose values are
 * worked out in the comments.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/wtype.h"
#include "tests/unit/testutil.h"

START_TEST(test_wtype_table)
{
	/* ggml's type_traits: name, blck_size, type_size */
	static const struct {
		uint32_t t;
		const char *name;
		uint32_t elems, bytes;
		bool weight;
	} want[] = {
		{ 0, "F32", 1, 4, true },      { 1, "F16", 1, 2, true },
		{ 2, "Q4_0", 32, 18, true },   { 3, "Q4_1", 32, 20, true },
		{ 6, "Q5_0", 32, 22, true },   { 7, "Q5_1", 32, 24, true },
		{ 8, "Q8_0", 32, 34, true },   { 9, "Q8_1", 32, 36, false },
		{ 10, "Q2_K", 256, 84, true }, { 11, "Q3_K", 256, 110, true },
		{ 12, "Q4_K", 256, 144, true }, { 13, "Q5_K", 256, 176, true },
		{ 14, "Q6_K", 256, 210, true }, { 15, "Q8_K", 256, 292, false },
		{ 30, "BF16", 1, 2, true },
	};
	int known = 0;
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const WTypeInfo *info = wtype_info(want[i].t);
		ck_assert_msg(info, "type %u missing", want[i].t);
		ck_assert_str_eq(info->name, want[i].name);
		ck_assert_str_eq(wtype_name(want[i].t), want[i].name);
		ck_assert_uint_eq(info->block_elems, want[i].elems);
		ck_assert_uint_eq(info->block_bytes, want[i].bytes);
		ck_assert_int_eq(wtype_is_supported(want[i].t), want[i].weight);
	}
	for (uint32_t t = 0; t < 100; t++)
		known += wtype_info(t) != NULL;
	ck_assert_int_eq(known, 15);
	uint32_t unknown[] = { 4, 5, 16, 20, 29, 31, 39, 40, 41, 1000, UINT32_MAX };
	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		ck_assert_ptr_null(wtype_info(unknown[i]));
		ck_assert(!wtype_is_supported(unknown[i]));
		ck_assert_str_eq(wtype_name(unknown[i]), "unknown");
		ck_assert_uint_eq(wtype_row_bytes(unknown[i], 256), 0);
	}
}
END_TEST

START_TEST(test_wtype_row_bytes)
{
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q4_K, 256), 144);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q4_K, 512), 288);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q4_K, 255), 0);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q4_K, 576), 0);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q4_1, 576), 18 * 20); /* SmolLM row */
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q8_0, 576), 18 * 34);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_F32, 3), 12);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_BF16, 3), 6);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q6_K, 0), 0);
	/* sizes that do not fit size_t */
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_F32, (uint64_t)1 << 62), 0);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q8_K, UINT64_MAX / 256 * 256), 0);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_Q4_0, UINT64_MAX / 32 * 32), (UINT64_MAX / 32) * 18);
	ck_assert_uint_eq(wtype_row_bytes(WTYPE_F32, (uint64_t)1 << 61), (size_t)1 << 63);
}
END_TEST

static void check_values(const char *what, const float *got, const float *want, int n)
{
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == want[i], "%s value %d: got %.9g want %.9g",
			      what, i, got[i], want[i]);
}

START_TEST(test_wtype_q4_0_known)
{
	/* d = 0x3800 = 0.5; qs[j] = j | (15 - j) << 4 */
	BlockQ4_0 b = { .d = 0x3800 };
	for (int j = 0; j < 16; j++)
		b.qs[j] = (uint8_t)(j | (15 - j) << 4);
	/* values 0..15: 0.5 * (j - 8); values 16..31: 0.5 * ((15 - j) - 8) */
	static const float want[32] = {
		-4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5,
		3.5, 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5, -1, -1.5, -2, -2.5, -3, -3.5, -4,
	};
	float y[32];
	wtype_dequantize_row(WTYPE_Q4_0, &b, y, 32);
	check_values("q4_0", y, want, 32);
}
END_TEST

START_TEST(test_wtype_q4_1_known)
{
	/* d = 0x3400 = 0.25, m = 0xbc00 = -1; low nibble j, high nibble 3j mod 16 */
	BlockQ4_1 b = { .d = 0x3400, .m = 0xbc00 };
	for (int j = 0; j < 16; j++)
		b.qs[j] = (uint8_t)(j | ((3 * j) & 15) << 4);
	/* 0.25 * q - 1; high nibbles 0 3 6 9 12 15 2 5 8 11 14 1 4 7 10 13 */
	static const float want[32] = {
		-1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75,
		1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75,
		-1, -0.25, 0.5, 1.25, 2, 2.75, -0.5, 0.25,
		1, 1.75, 2.5, -0.75, 0, 0.75, 1.5, 2.25,
	};
	float y[32];
	wtype_dequantize_row(WTYPE_Q4_1, &b, y, 32);
	check_values("q4_1", y, want, 32);
}
END_TEST

START_TEST(test_wtype_q8_0_known)
{
	/* d = 0xc000 = -2; qs[j] = 8j - 128 for j < 31, qs[31] = 127 */
	BlockQ8_0 b[2] = { { .d = 0xc000 }, { .d = 0x0001 } };
	for (int j = 0; j < 32; j++)
		b[0].qs[j] = (int8_t)(8 * j - 128);
	b[0].qs[31] = 127;
	/* second block: d = 2^-24 (smallest subnormal half), qs = -1 */
	memset(b[1].qs, 0xff, sizeof(b[1].qs));
	float want[64], y[64];
	for (int j = 0; j < 31; j++)
		want[j] = (float)(256 - 16 * j); /* -2 * (8j - 128) */
	want[31] = -254;
	for (int j = 32; j < 64; j++)
		want[j] = -0x1p-24f;
	wtype_dequantize_row(WTYPE_Q8_0, b, y, 64);
	check_values("q8_0", y, want, 64);
}
END_TEST

START_TEST(test_wtype_q4_k_known)
{
	/*
	 * d = 0x3c00 = 1, dmin = 0x3800 = 0.5. Scale bytes:
	 *   0: 0x41 -> sc0 = 1,  top bits 01 -> bits 4..5 of sc4
	 *   1: 0xc2 -> sc1 = 2,  top bits 11 -> bits 4..5 of sc5
	 *   2: 0x03 -> sc2 = 3;  3: 0x04 -> sc3 = 4
	 *   4: 0x82 -> m0 = 2,   top bits 10 -> bits 4..5 of m4
	 *   5..7: 0 -> m1..m3 = 0
	 *   8: 0x35 -> sc4 = 5 | 1 << 4 = 21, m4 = 3 | 2 << 4 = 35
	 *   9: 0x00 -> sc5 = 0 | 3 << 4 = 48, m5 = 0
	 *  10: 0x00 -> sc6 = 0, m6 = 0
	 *  11: 0xc7 -> sc7 = 7, m7 = 12
	 * So sc = 1 2 3 4 21 48 0 7 and dmin * m = 1 0 0 0 17.5 0 0 6.
	 * qs[32c + l] = (l % 16) | (15 - l % 16) << 4: sub-block 2c (low
	 * nibbles) has q = l % 16, sub-block 2c + 1 has q = 15 - l % 16.
	 */
	BlockQ4_K b = { .d = 0x3c00, .dmin = 0x3800,
			.scales = { 0x41, 0xc2, 0x03, 0x04, 0x82, 0, 0, 0, 0x35, 0, 0, 0xc7 } };
	for (int i = 0; i < 128; i++)
		b.qs[i] = (uint8_t)((i % 16) | (15 - i % 16) << 4);
	static const float dsc[8] = { 1, 2, 3, 4, 21, 48, 0, 7 };
	static const float dm[8] = { 1, 0, 0, 0, 17.5, 0, 0, 6 };
	float want[256], y[256];
	for (int e = 0; e < 256; e++) {
		int j = e / 32, l = e % 32;
		int q = j % 2 ? 15 - l % 16 : l % 16;
		want[e] = dsc[j] * (float)q - dm[j];
	}
	/* spot checks written out: */
	ck_assert(want[0] == -1 && want[33] == 28 && want[130] == 24.5f && want[255] == -6);
	wtype_dequantize_row(WTYPE_Q4_K, &b, y, 256);
	check_values("q4_k", y, want, 256);

	uint8_t sc, m;
	wtype_q4k_scale_min(b.scales, 4, &sc, &m);
	ck_assert_uint_eq(sc, 21);
	ck_assert_uint_eq(m, 35);
}
END_TEST

/*
 * Q3_K scale packing, written from gguf-py's layout table (0: IIIIAAAA ...
 * 8: MMIIEEAA ... 11: PPLLHHDD, A..P = scales 0..15, stored + 32).
 */
START_TEST(test_wtype_q3k_scale)
{
	uint64_t st = test_seed() ^ 0x3c;
	for (int iter = 0; iter < 1000; iter++) {
		int s[16];
		uint8_t p[12] = { 0 };
		for (int j = 0; j < 16; j++) {
			s[j] = (int)(test_rand_u64(&st) % 64) - 32;
			unsigned u = (unsigned)(s[j] + 32);
			if (j < 8)
				p[j] |= (uint8_t)(u & 15);
			else
				p[j - 8] |= (uint8_t)((u & 15) << 4);
			p[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
		}
		for (int j = 0; j < 16; j++)
			ck_assert_int_eq(wtype_q3k_scale(p, j), s[j]);
	}
}
END_TEST

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Check one golden record; returns the number of mismatching values. */
static int golden_check(const char *name, uint32_t t, long n, const char *hex, const char *vals)
{
	const WTypeInfo *info = wtype_info(t);
	ck_assert_msg(info, "golden type %s (%u) unknown", name, t);
	ck_assert_str_eq(info->name, name);
	size_t len = strlen(hex);
	ck_assert_uint_eq(len % 2, 0);
	ck_assert_uint_eq(len / 2, wtype_row_bytes(t, (uint64_t)n));

	uint8_t *src = malloc(len / 2);
	float *want = malloc((size_t)n * sizeof(float));
	float *got = malloc((size_t)n * sizeof(float));
	ck_assert(src && want && got);
	for (size_t i = 0; i < len / 2; i++) {
		int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
		ck_assert(hi >= 0 && lo >= 0);
		src[i] = (uint8_t)(hi << 4 | lo);
	}
	const char *p = vals;
	for (long i = 0; i < n; i++) {
		char *end;
		want[i] = strtof(p, &end);
		ck_assert_msg(end != p, "%s: only %ld of %ld values", name, i, n);
		p = end;
	}
	while (*p == ' ')
		p++;
	ck_assert_msg(*p == 0, "%s: more than %ld values", name, n);

	wtype_dequantize_row(t, src, got, n);
	int bad = 0;
	for (long i = 0; i < n; i++) {
		bool ok = isnan(want[i]) ? isnan(got[i]) : memcmp(&got[i], &want[i], sizeof(float)) == 0;
		if (!ok && bad++ < 5)
			fprintf(stderr, "%s value %ld (block %ld): got %.9g want %.9g\n",
				name, i, i / info->block_elems, got[i], want[i]);
	}
	free(src);
	free(want);
	free(got);
	return bad;
}

START_TEST(test_wtype_golden)
{
	const char *path = test_data_path("wtype/golden.txt");
	char *text = test_read_file(path, NULL);
	ck_assert_msg(text, "cannot read %s", path);

	char name[16] = "";
	unsigned t = 0;
	long n = 0;
	const char *hex = NULL;
	bool seen[WTYPE_COUNT_] = { false };
	int records = 0, bad = 0;
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (line[0] == '#')
			continue;
		if (strncmp(line, "type ", 5) == 0) {
			ck_assert_int_eq(sscanf(line, "type %15s %u %ld", name, &t, &n), 3);
			ck_assert(t < WTYPE_COUNT_ && !seen[t]);
			seen[t] = true;
			hex = NULL;
		} else if (strncmp(line, "bytes ", 6) == 0) {
			hex = line + 6;
		} else if (strncmp(line, "values ", 7) == 0) {
			ck_assert_msg(hex, "values without bytes for %s", name);
			bad += golden_check(name, t, n, hex, line + 7);
			records++;
		} else {
			ck_abort_msg("bad golden line: %.40s", line);
		}
	}
	free(text);
	ck_assert_int_eq(bad, 0);
	/* every type in the table has a record */
	ck_assert_int_eq(records, 15);
	for (uint32_t i = 0; i < WTYPE_COUNT_; i++)
		ck_assert_int_eq(seen[i], wtype_info(i) != NULL);
}
END_TEST

static Suite *wtype_suite(void)
{
	Suite *s = suite_create("wtype");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_wtype_table);
	tcase_add_test(tc, test_wtype_row_bytes);
	tcase_add_test(tc, test_wtype_q4_0_known);
	tcase_add_test(tc, test_wtype_q4_1_known);
	tcase_add_test(tc, test_wtype_q8_0_known);
	tcase_add_test(tc, test_wtype_q4_k_known);
	tcase_add_test(tc, test_wtype_q3k_scale);
	tcase_add_test(tc, test_wtype_golden);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(wtype_suite());
}
