/*
 * kv_attn_pk_x86.h: what the AVX2 and AVX-512 pair-coded-key score
 * kernels share: a column of 32 b-bit codes (kernels/kv_pk_layout.h)
 * unpacked to 32 bytes with BMI2's pdep, 8 codes per 64-bit word.
 */
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kv_pk_layout.h"

/* Per b: the low b bits of every byte set, where pdep lays 8 consecutive b-bit codes. */
static const uint64_t kvpk_spread[KVPK_MAX_BITS + 1] = {
	0,
	0x0101010101010101ull, 0x0303030303030303ull, 0x0707070707070707ull, 0x0f0f0f0f0f0f0f0full,
	0x1f1f1f1f1f1f1f1full, 0x3f3f3f3f3f3f3f3full, 0x7f7f7f7f7f7f7f7full, 0xffffffffffffffffull,
};

/*
 * The 32 codes of a column of b-bit codes (1 <= b <= 8), code t in byte t
 * of the result: the same 8-byte loads as kvpk_column_unpack().
 */
static inline __attribute__((always_inline, target("avx2,bmi2"))) __m256i
kvpk_column_bytes(const uint8_t *col, int b)
{
	uint64_t w[4];
	for (int g = 0; g < 4; g++) {
		uint64_t v;
		memcpy(&v, col + g * b, 8);
		w[g] = _pdep_u64(v, kvpk_spread[b]);
	}
	/* inserted, not stored and reloaded: a 32-byte load of four 8-byte stores stalls forwarding */
	return _mm256_set_epi64x((long long)w[3], (long long)w[2], (long long)w[1], (long long)w[0]);
}

/*
 * The same 32 bytes with AVX-512 VBMI, without leaving the vector unit:
 * the column's 4 b bytes loaded (masked: nothing read past them), bytes
 * permuted so that qword g holds codes 8g..8g+7 (its b bytes from byte
 * g b), then vpmultishiftqb takes byte k of each qword from bit k b.
 */
#define KVPK_VBMI_PERM(b)                                                                       \
	{ 0, 1, 2, 3, 4, 5, 6, 7, (b), (b) + 1, (b) + 2, (b) + 3, (b) + 4, (b) + 5, (b) + 6, (b) + 7,  \
	  2 * (b), 2 * (b) + 1, 2 * (b) + 2, 2 * (b) + 3, 2 * (b) + 4, 2 * (b) + 5, 2 * (b) + 6,       \
	  2 * (b) + 7, 3 * (b), 3 * (b) + 1, 3 * (b) + 2, 3 * (b) + 3, 3 * (b) + 4, 3 * (b) + 5,       \
	  3 * (b) + 6, 3 * (b) + 7 }
#define KVPK_VBMI_SHIFT8(b) 0, (b), 2 * (b), 3 * (b), 4 * (b), 5 * (b), 6 * (b), 7 * (b)
#define KVPK_VBMI_SHIFT(b) { KVPK_VBMI_SHIFT8(b), KVPK_VBMI_SHIFT8(b), KVPK_VBMI_SHIFT8(b), KVPK_VBMI_SHIFT8(b) }
static const uint8_t kvpk_vbmi_perm[KVPK_MAX_BITS + 1][32] = {
	KVPK_VBMI_PERM(0), KVPK_VBMI_PERM(1), KVPK_VBMI_PERM(2), KVPK_VBMI_PERM(3), KVPK_VBMI_PERM(4),
	KVPK_VBMI_PERM(5), KVPK_VBMI_PERM(6), KVPK_VBMI_PERM(7), KVPK_VBMI_PERM(8),
};
static const uint8_t kvpk_vbmi_shift[KVPK_MAX_BITS + 1][32] = {
	KVPK_VBMI_SHIFT(0), KVPK_VBMI_SHIFT(1), KVPK_VBMI_SHIFT(2), KVPK_VBMI_SHIFT(3), KVPK_VBMI_SHIFT(4),
	KVPK_VBMI_SHIFT(5), KVPK_VBMI_SHIFT(6), KVPK_VBMI_SHIFT(7), KVPK_VBMI_SHIFT(8),
};
#undef KVPK_VBMI_PERM
#undef KVPK_VBMI_SHIFT8
#undef KVPK_VBMI_SHIFT

static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vbmi"))) __m256i
kvpk_column_bytes_vbmi(const uint8_t *col, int b)
{
	__m256i raw = _mm256_maskz_loadu_epi8((__mmask32)((1ull << (4 * b)) - 1), col);
	__m256i spread = _mm256_permutexvar_epi8(_mm256_loadu_si256((const __m256i *)kvpk_vbmi_perm[b]), raw);
	__m256i codes = _mm256_multishift_epi64_epi8(_mm256_loadu_si256((const __m256i *)kvpk_vbmi_shift[b]),
						     spread);
	return _mm256_and_si256(codes, _mm256_set1_epi8((char)((1u << b) - 1)));
}
