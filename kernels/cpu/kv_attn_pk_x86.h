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
