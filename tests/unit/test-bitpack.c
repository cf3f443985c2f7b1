/*
 * test-bitpack.c: base/bitpack.h against its documented byte layout.
 *
 * Hand-written byte examples for B = 1, 2, 3, 4, 5 pin the layout; a
 * bit-at-a-time reference packer written here from the layout text (code
 * i's bit k is stream bit i*B + k, stream bit s is bit s % 8 of byte
 * s / 8) checks every width 1..8 at many sizes, with canaries around the
 * output to catch writes past the end and padding bits that are not zero.
 */
#include <stdlib.h>
#include <string.h>

#include "base/bitpack.h"
#include "base/util.h"
#include "tests/unit/testutil.h"

static const size_t sizes[] = { 0, 1, 2, 3, 5, 7, 8, 9, 31, 33, 64, 127, 128, 1000 };

#define MAX_N 1000
#define CANARY 0xa5

static void ref_pack(const uint8_t *codes, size_t n, int bits, uint8_t *out)
{
	memset(out, 0, (n * (size_t)bits + 7) / 8);
	for (size_t i = 0; i < n; i++)
		for (int k = 0; k < bits; k++) {
			size_t s = i * (size_t)bits + (size_t)k;
			if ((codes[i] >> k) & 1)
				out[s / 8] |= (uint8_t)(1u << (s % 8));
		}
}

static void check_bytes(const uint8_t *codes, size_t n, int bits, const uint8_t *want, size_t nwant)
{
	uint8_t out[16];
	ck_assert_uint_eq(bitpack_bytes(bits, n), nwant);
	memset(out, CANARY, sizeof(out));
	bitpack_pack(codes, n, bits, out);
	for (size_t i = 0; i < nwant; i++)
		ck_assert_msg(out[i] == want[i], "B=%d byte %zu: 0x%02x, expected 0x%02x", bits, i,
			      out[i], want[i]);
	ck_assert_uint_eq(out[nwant], CANARY);
	uint8_t back[16];
	bitpack_unpack(want, n, bits, back);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(back[i], codes[i]);
}

START_TEST(layout_examples)
{
	/* B=4: code 2j in the low nibble of byte j */
	check_bytes((const uint8_t[]){ 1, 2, 3 }, 3, 4, (const uint8_t[]){ 0x21, 0x03 }, 2);
	check_bytes((const uint8_t[]){ 0xf, 0x0, 0xa, 0x5 }, 4, 4, (const uint8_t[]){ 0x0f, 0x5a }, 2);
	/* B=3: codes 0..7 as sum c_i << 3i = 0xfac688, little-endian */
	check_bytes((const uint8_t[]){ 0, 1, 2, 3, 4, 5, 6, 7 }, 8, 3,
		    (const uint8_t[]){ 0x88, 0xc6, 0xfa }, 3);
	/* B=3: one code crossing the byte boundary (code 2 is bits 6..8) */
	check_bytes((const uint8_t[]){ 0, 0, 7 }, 3, 3, (const uint8_t[]){ 0xc0, 0x01 }, 2);
	/* B=1: code 8j in bit 0 of byte j */
	check_bytes((const uint8_t[]){ 1, 0, 1, 1, 0, 0, 0, 0, 1 }, 9, 1,
		    (const uint8_t[]){ 0x0d, 0x01 }, 2);
	/* B=2: four per byte, code 4j in bits 0-1 */
	check_bytes((const uint8_t[]){ 3, 0, 1, 2, 3 }, 5, 2, (const uint8_t[]){ 0x93, 0x03 }, 2);
	/* B=5: 31, 1, 2 -> 0b0_10_00001_11111 */
	check_bytes((const uint8_t[]){ 31, 1, 2 }, 3, 5, (const uint8_t[]){ 0x3f, 0x08 }, 2);
	/* B=8: bytes as they are */
	check_bytes((const uint8_t[]){ 0x12, 0xff, 0x00 }, 3, 8, (const uint8_t[]){ 0x12, 0xff, 0x00 }, 3);
}
END_TEST

START_TEST(byte_counts)
{
	ck_assert_uint_eq(bitpack_bytes(4, 128), 64);
	ck_assert_uint_eq(bitpack_bytes(3, 128), 48);
	ck_assert_uint_eq(bitpack_bytes(3, 9), 4);
	ck_assert_uint_eq(bitpack_bytes(1, 0), 0);
	ck_assert_uint_eq(bitpack_bytes(1, 1), 1);
	ck_assert_uint_eq(bitpack_bytes(7, 8), 7);
	ck_assert_uint_eq(bitpack_bytes(5, 1000), 625);
}
END_TEST

/* Every width, every size: same bytes as the reference, zero padding, no overrun, round trip. */
START_TEST(round_trip_all_widths)
{
	uint64_t st = test_seed() ^ 0xb17;
	static uint8_t codes[MAX_N], back[MAX_N + 1], out[MAX_N + 2], ref[MAX_N + 1];
	for (int bits = 1; bits <= 8; bits++) {
		for (size_t si = 0; si < ARRAY_SIZE(sizes); si++) {
			size_t n = sizes[si], nb = bitpack_bytes(bits, n);
			ck_assert_uint_eq(nb, (n * (size_t)bits + 7) / 8);
			for (size_t i = 0; i < n; i++)
				codes[i] = (uint8_t)(test_rand_u64(&st) & ((1u << bits) - 1));
			if (n > 0) {
				/* the extremes of the range appear at least once */
				codes[0] = (uint8_t)((1u << bits) - 1);
				codes[n - 1] = (uint8_t)((1u << bits) - 1);
			}
			memset(out, CANARY, sizeof(out));
			bitpack_pack(codes, n, bits, out);
			ref_pack(codes, n, bits, ref);
			ck_assert_msg(memcmp(out, ref, nb) == 0, "B=%d n=%zu: bytes differ from reference",
				      bits, n);
			ck_assert_msg(out[nb] == CANARY, "B=%d n=%zu: wrote past the end", bits, n);
			size_t used = n * (size_t)bits;
			if (used % 8)
				ck_assert_msg((out[nb - 1] >> (used % 8)) == 0, "B=%d n=%zu: padding not zero",
					      bits, n);
			memset(back, 0xee, sizeof(back));
			bitpack_unpack(out, n, bits, back);
			for (size_t i = 0; i < n; i++) {
				ck_assert_msg(back[i] == codes[i], "B=%d n=%zu code %zu: %u, expected %u", bits,
					      n, i, back[i], codes[i]);
				ck_assert_uint_eq(bitpack_get(out, bits, i), codes[i]);
			}
			ck_assert_uint_eq(back[n], 0xee);
		}
	}
}
END_TEST

/* bitpack_get reads only the bytes that hold the code: the last code of a tight buffer. */
START_TEST(get_reads_only_own_bytes)
{
	for (int bits = 1; bits <= 8; bits++)
		for (size_t n = 1; n <= 17; n++) {
			uint8_t codes[17];
			for (size_t i = 0; i < n; i++)
				codes[i] = (uint8_t)((i * 5 + 3) & ((1u << bits) - 1));
			size_t nb = bitpack_bytes(bits, n);
			uint8_t *buf = malloc(nb); /* exact size: ASan flags any overread */
			ck_assert_ptr_nonnull(buf);
			bitpack_pack(codes, n, bits, buf);
			ck_assert_uint_eq(bitpack_get(buf, bits, n - 1), codes[n - 1]);
			free(buf);
		}
}
END_TEST

START_TEST(high_bits_ignored)
{
	uint8_t codes[8], masked[8], a[8], b[8];
	for (int bits = 1; bits < 8; bits++) {
		for (int i = 0; i < 8; i++) {
			codes[i] = (uint8_t)(0xf0 | (i * 37));
			masked[i] = (uint8_t)(codes[i] & ((1u << bits) - 1));
		}
		bitpack_pack(codes, 8, bits, a);
		bitpack_pack(masked, 8, bits, b);
		ck_assert_mem_eq(a, b, bitpack_bytes(bits, 8));
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("bitpack");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, layout_examples);
	tcase_add_test(tc, byte_counts);
	tcase_add_test(tc, round_trip_all_widths);
	tcase_add_test(tc, get_reads_only_own_bytes);
	tcase_add_test(tc, high_bits_ignored);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
