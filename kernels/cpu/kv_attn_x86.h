/*
 * kv_attn_x86.h: the x86 vocabulary shared by the AVX2 and AVX-512 KV
 * attention kernels (kv_attn_avx2.c, kv_attn_avx512.c): loads of stored
 * f16 values and little-endian code words, and the unpacking of packed
 * TQ code streams (bitpack.h: LSB first) to one byte per code.
 *
 * Every function is compiled for AVX2/FMA/F16C/BMI2 and always inlined,
 * so it serves both files (a function with a superset target may inline
 * it); include only from files whose callers check the CPU first.
 */
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define KVX_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c,bmi2")))

/* The 8 horizontal sums of v[0..7], in order. */
KVX_INLINE __m256 hsum8(const __m256 *v)
{
	__m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
	__m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
	__m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
	return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

KVX_INLINE float load_f16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

KVX_INLINE uint64_t load16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

KVX_INLINE uint64_t load32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

/*
 * nbytes (1..8) little-endian bytes, each read with one load of its own
 * size (no partial stores to reload: those stall store forwarding).
 */
KVX_INLINE uint64_t load_le(const uint8_t *p, int nbytes)
{
	uint64_t v;
	switch (nbytes) {
	case 1: return p[0];
	case 2: return load16(p);
	case 3: return load16(p) | (uint64_t)p[2] << 16;
	case 4: return load32(p);
	case 5: return load32(p) | (uint64_t)p[4] << 32;
	case 6: return load32(p) | load16(p + 4) << 32;
	case 7: return load32(p) | load16(p + 4) << 32 | (uint64_t)p[6] << 48;
	default: memcpy(&v, p, 8); return v;
	}
}

static const uint64_t pdep_mask[9] = {
	0, 0x0101010101010101ull, 0x0303030303030303ull, 0x0707070707070707ull,
	0x0f0f0f0f0f0f0f0full, 0x1f1f1f1f1f1f1f1full, 0x3f3f3f3f3f3f3f3full,
	0x7f7f7f7f7f7f7f7full, 0xffffffffffffffffull,
};

/*
 * Codes i .. i+7 (i a multiple of 8) of a packed stream of n codes
 * (bitpack.h: LSB first; 8 codes are exactly `bits` bytes), one per byte;
 * codes at n and beyond read as 0. Reads only the stream's bytes.
 */
KVX_INLINE uint64_t codes8(const uint8_t *p, int bits, int n, int i)
{
	if (i >= n)
		return 0;
	int nb = n - i >= 8 ? bits : ((n - i) * bits + 7) / 8;
	uint64_t w = load_le(p + (size_t)i / 8 * (size_t)bits, nb);
	if (n - i < 8)
		w &= ~0ull >> (64 - (n - i) * bits);
	return bits == 8 ? w : _pdep_u64(w, pdep_mask[bits]);
}

/*
 * Codes 0..31 of a 1..3-bit stream from its 4 * bits bytes: word j of
 * the 16-bit lanes takes the two bytes holding code j (pshufb), a multiply
 * by 2^(8 - (j bits) % 8) and a shift by 8 move the code to the low byte.
 * Generated: byte = j b / 8, index pair (byte, byte + 1), mult 2^(8 - j b % 8).
 */
static const uint8_t win_idx[4][64] = {
	{ 0 },
	{ 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4 },
	{ 0, 1, 0, 1, 0, 1, 0, 1, 1, 2, 1, 2, 1, 2, 1, 2, 2, 3, 2, 3, 2, 3, 2, 3, 3, 4, 3, 4, 3, 4, 3, 4, 4, 5, 4, 5, 4, 5, 4, 5, 5, 6, 5, 6, 5, 6, 5, 6, 6, 7, 6, 7, 6, 7, 6, 7, 7, 8, 7, 8, 7, 8, 7, 8 },
	{ 0, 1, 0, 1, 0, 1, 1, 2, 1, 2, 1, 2, 2, 3, 2, 3, 3, 4, 3, 4, 3, 4, 4, 5, 4, 5, 4, 5, 5, 6, 5, 6, 6, 7, 6, 7, 6, 7, 7, 8, 7, 8, 7, 8, 8, 9, 8, 9, 9, 10, 9, 10, 9, 10, 10, 11, 10, 11, 10, 11, 11, 12, 11, 12 },
};
static const uint16_t win_mul[4][32] = {
	{ 0 },
	{ 256, 128, 64, 32, 16, 8, 4, 2, 256, 128, 64, 32, 16, 8, 4, 2, 256, 128, 64, 32, 16, 8, 4, 2, 256, 128, 64, 32, 16, 8, 4, 2 },
	{ 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4 },
	{ 256, 32, 4, 128, 16, 2, 64, 8, 256, 32, 4, 128, 16, 2, 64, 8, 256, 32, 4, 128, 16, 2, 64, 8, 256, 32, 4, 128, 16, 2, 64, 8 },
};
/* The 32 codes from the 4 * bits (<= 12) bytes at p, bits 1..3. */
KVX_INLINE __m256i codes32_window(const uint8_t *p, int bits)
{
	__m128i x;
	if (bits == 1)
		x = _mm_cvtsi32_si128((int)load32(p));
	else if (bits == 2)
		x = _mm_loadl_epi64((const __m128i *)p);
	else
		x = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)p), (int)load32(p + 8), 2);
	__m256i xx = _mm256_set_m128i(x, x);
	const __m256i *ix = (const __m256i *)win_idx[bits], *mu = (const __m256i *)win_mul[bits];
	__m256i y0 = _mm256_mullo_epi16(_mm256_shuffle_epi8(xx, _mm256_loadu_si256(ix)), _mm256_loadu_si256(mu));
	__m256i y1 = _mm256_mullo_epi16(_mm256_shuffle_epi8(xx, _mm256_loadu_si256(ix + 1)),
					_mm256_loadu_si256(mu + 1));
	/* codes in the high bytes; words of y0 are codes 0..7 | 8..15, y1 16..23 | 24..31 */
	__m256i c = _mm256_packus_epi16(_mm256_srli_epi16(y0, 8), _mm256_srli_epi16(y1, 8));
	c = _mm256_permute4x64_epi64(c, 0xd8);
	return _mm256_and_si256(c, _mm256_set1_epi8((char)((1 << bits) - 1)));
}

/* Codes i .. i+31 as 32 bytes (the same order as codes8: natural). */
KVX_INLINE __m256i codes32(const uint8_t *p, int bits, int n, int i)
{
	if (bits <= 3 && i + 32 <= n)
		return codes32_window(p + (size_t)i / 8 * (size_t)bits, bits);
	return _mm256_set_epi64x((long long)codes8(p, bits, n, i + 24), (long long)codes8(p, bits, n, i + 16),
				 (long long)codes8(p, bits, n, i + 8), (long long)codes8(p, bits, n, i));
}

/* Codes i .. i+31 in natural order (4-bit full chunks: nibble split and interleave). */
KVX_INLINE __m256i codes32_nat(const uint8_t *p, int bits, int n, int i)
{
	if (bits == 4 && i + 32 <= n) {
		__m128i x = _mm_loadu_si128((const __m128i *)(p + i / 2));
		__m128i m = _mm_set1_epi8(0x0f);
		__m128i lo = _mm_and_si128(x, m), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
		return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
	}
	return codes32(p, bits, n, i);
}
