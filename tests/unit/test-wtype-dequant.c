/*
 * test-wtype-dequant.c: kernels/wtype_dequant.h, the chunked dequantizers
 * the CUDA matmuls run, against the scalar reference
 * wtype_dequantize_row().
 *
 * Rows of random blocks (random bytes, then every half-precision scale
 * field set to a finite value: normal, subnormal or zero, either sign)
 * for every weight type; every chunk (or float value) of the row must
 * equal the reference bit for bit, since both do the same float
 * operations in the same order and C11 does not contract them.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/wtype.h"
#include "kernels/wtype_dequant.h"
#include "tests/unit/testutil.h"

#define ROW_VALUES 2048 /* 8 K-quant super-blocks, 64 32-value blocks */
#define TRIALS 200

static const uint32_t weight_types[] = {
	WTYPE_F32,  WTYPE_F16,  WTYPE_BF16, WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_Q5_0, WTYPE_Q5_1,
	WTYPE_Q8_0, WTYPE_Q2_K, WTYPE_Q3_K, WTYPE_Q4_K, WTYPE_Q5_K, WTYPE_Q6_K,
};

START_TEST(test_dequant_table)
{
	int n = 0;
	for (uint32_t t = 0; t < WTYPE_COUNT_ + 10; t++) {
		ck_assert_msg(wdq_is_supported(t) == wtype_is_supported(t), "type %u", t);
		if (!wtype_is_supported(t))
			continue;
		n++;
		const WTypeInfo *info = wtype_info(t);
		ck_assert_int_eq(wdq_is_float(t), info->block_elems == 1);
		if (wdq_is_float(t))
			continue;
		ck_assert_int_eq(wdq_block_bytes(t), (int)info->block_bytes);
		ck_assert_int_eq(wdq_chunks_per_block(t) * WDQ_CHUNK, (int)info->block_elems);
	}
	ck_assert_int_eq(n, (int)(sizeof(weight_types) / sizeof(weight_types[0])));
}
END_TEST

/* A finite half: mostly normal with a spread of exponents, sometimes subnormal or zero. */
static tkv_half random_half(uint64_t *rng)
{
	uint64_t r = test_rand_u64(rng);
	switch (r % 16) {
	case 0: return (tkv_half)(r >> 8 & 0x8000);          /* +-0 */
	case 1: return (tkv_half)(r >> 8 & 0x83ff);          /* subnormal */
	default: {
		float v = test_rand_normal(rng) * (float)(1 << (r >> 4 & 7)) / 256.0f;
		return f32_to_half(v);
	}
	}
}

static void set_half(uint8_t *p, tkv_half h)
{
	memcpy(p, &h, sizeof(h));
}

/* Offsets of the half fields of a block of t, -1 terminated. */
static const int *half_fields(uint32_t t)
{
	static const int q4_0[] = { offsetof(BlockQ4_0, d), -1 };
	static const int q4_1[] = { offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m), -1 };
	static const int q5_0[] = { offsetof(BlockQ5_0, d), -1 };
	static const int q5_1[] = { offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m), -1 };
	static const int q8_0[] = { offsetof(BlockQ8_0, d), -1 };
	static const int q2_k[] = { offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin), -1 };
	static const int q3_k[] = { offsetof(BlockQ3_K, d), -1 };
	static const int q4_k[] = { offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin), -1 };
	static const int q5_k[] = { offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin), -1 };
	static const int q6_k[] = { offsetof(BlockQ6_K, d), -1 };
	switch (t) {
	case WTYPE_Q4_0: return q4_0;
	case WTYPE_Q4_1: return q4_1;
	case WTYPE_Q5_0: return q5_0;
	case WTYPE_Q5_1: return q5_1;
	case WTYPE_Q8_0: return q8_0;
	case WTYPE_Q2_K: return q2_k;
	case WTYPE_Q3_K: return q3_k;
	case WTYPE_Q4_K: return q4_k;
	case WTYPE_Q5_K: return q5_k;
	case WTYPE_Q6_K: return q6_k;
	default: return NULL;
	}
}

/* A row of ROW_VALUES values of type t: random bytes, finite scales and floats. */
static void random_row(uint32_t t, uint8_t *row, size_t bytes, uint64_t *rng)
{
	for (size_t i = 0; i < bytes; i++)
		row[i] = (uint8_t)test_rand_u64(rng);
	switch (t) {
	case WTYPE_F32:
		for (int i = 0; i < ROW_VALUES; i++) {
			float v = test_rand_normal(rng);
			memcpy(row + 4 * i, &v, 4);
		}
		return;
	case WTYPE_F16:
		for (int i = 0; i < ROW_VALUES; i++)
			set_half(row + 2 * i, random_half(rng));
		return;
	case WTYPE_BF16:
		for (int i = 0; i < ROW_VALUES; i++) {
			tkv_bf16 b = f32_to_bf16(test_rand_normal(rng) * 100.0f);
			memcpy(row + 2 * i, &b, 2);
		}
		return;
	default: {
		const WTypeInfo *info = wtype_info(t);
		for (size_t b = 0; b < bytes / info->block_bytes; b++)
			for (const int *f = half_fields(t); *f >= 0; f++)
				set_half(row + b * info->block_bytes + (size_t)*f, random_half(rng));
	}
	}
}

START_TEST(test_dequant_random)
{
	uint64_t rng = test_seed() ^ 0xd0e9a47ull;
	uint32_t t = weight_types[_i];
	size_t bytes = wtype_row_bytes(t, ROW_VALUES);
	ck_assert_uint_gt(bytes, 0);
	uint8_t *row = malloc(bytes);
	float want[ROW_VALUES], got[ROW_VALUES];
	ck_assert_ptr_nonnull(row);

	for (int trial = 0; trial < TRIALS; trial++) {
		random_row(t, row, bytes, &rng);
		wtype_dequantize_row(t, row, want, ROW_VALUES);
		if (wdq_is_float(t)) {
			for (int i = 0; i < ROW_VALUES; i++)
				got[i] = wdq_float(t, row, i);
		} else {
			for (int g = 0; g < ROW_VALUES / WDQ_CHUNK; g++)
				wdq_row_chunk(t, row, g, got + g * WDQ_CHUNK);
		}
		for (int i = 0; i < ROW_VALUES; i++) {
			uint32_t a = tkv_f32_to_bits(got[i]), b = tkv_f32_to_bits(want[i]);
			ck_assert_msg(a == b, "%s trial %d value %d: got %.9g (0x%08x) want %.9g (0x%08x)",
				      wtype_name(t), trial, i, got[i], a, want[i], b);
		}
	}
	free(row);
}
END_TEST

static Suite *wtype_dequant_suite(void)
{
	Suite *s = suite_create("wtype-dequant");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_dequant_table);
	tcase_add_loop_test(tc, test_dequant_random, 0,
			    (int)(sizeof(weight_types) / sizeof(weight_types[0])));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(wtype_dequant_suite());
}
