/*
 * kv_attn_pk_x86.h: what the AVX2 and AVX-512 pair-coded-key score
 * kernels share: a column of 32 b-bit codes (kernels/kv_pk_layout.h)
 * unpacked to 32 bytes with BMI2's pdep, 8 codes per 64-bit word; a
 * pair's two columns unpacked with VBMI; the quantized query (kv_attn.h).
 */
#pragma once

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kv_attn.h"
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
 * The quantized query of kv_attn.h for G heads of one block: qp (G, d)
 * int16 and f (G,), from sig (d,) (sigma_{j/2}, 0 for width-0 pairs).
 * The operations of pk_q16_query_ref() (kv_attn.c) lane by lane (products,
 * |.|, max, round-to-even conversion: each exact or correctly rounded the
 * same way in a lane as in scalar code), so the results are identical.
 * d a multiple of 4; a tail of 4 goes through the scalar path.
 */
static inline __attribute__((always_inline, target("avx2,fma,f16c,bmi2"))) void
kvpk_q16_query(const float *q, int G, int d, const float *sig, float scale, int16_t *qp, float *f)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	for (int g = 0; g < G; g++) {
		const float *qg = q + (size_t)g * d;
		int16_t *ug = qp + (size_t)g * d;
		__m256 mx = _mm256_setzero_ps();
		int j = 0;
		for (; j + 8 <= d; j += 8)
			mx = _mm256_max_ps(mx, _mm256_and_ps(absmask, _mm256_mul_ps(_mm256_loadu_ps(qg + j),
										     _mm256_loadu_ps(sig + j))));
		float t[8];
		_mm256_storeu_ps(t, mx);
		float m = 0.0f;
		for (int k = 0; k < 8; k++)
			m = t[k] > m ? t[k] : m;
		for (int k = j; k < d; k++) {
			float a = fabsf(qg[k] * sig[k]);
			m = a > m ? a : m;
		}
		float inv = m > 0.0f ? (float)KVPK_Q16_UMAX / m : 0.0f;
		__m256 vi = _mm256_set1_ps(inv);
		for (j = 0; j + 8 <= d; j += 8) {
			__m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(qg + j),
									       _mm256_loadu_ps(sig + j)), vi));
			__m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
			_mm_storeu_si128((__m128i *)(ug + j), w);
		}
		for (; j < d; j++)
			ug[j] = (int16_t)lrintf(qg[j] * sig[j] * inv);
		f[g] = (m / (float)KVPK_Q16_UMAX) * (scale * (1.0f / (float)(1 << KVPK_Q16_SHIFT)));
	}
}

/* sigma_{j/2} of every column j of a block (0 for pairs of width 0), as the quantized query reads it. */
static inline void kvpk_column_sigmas(const KvPkRows *keys, const uint8_t *sc, const uint8_t *widths, float *sig)
{
	for (int i = 0; i < keys->dim / 2; i++)
		sig[2 * i] = sig[2 * i + 1] = kvpk_width(widths, i) ? keys->sigma[sc[i]] : 0.0f;
}

/*
 * The 64 codes of a pair's two columns of b-bit codes (8 b bytes from
 * col) with AVX-512 VBMI, interleaved: byte 2t = code t of the first
 * column, byte 2t + 1 = code t of the second. The 8 b bytes are loaded
 * masked (nothing read past them); vpermb puts the (at most 4) bytes
 * holding codes 4g..4g+3 of each column into qword g, vpmultishiftqb
 * takes each code's byte from its bit offset, a mask keeps b bits.
 * Tables: qword g's bytes 0..3 are the first column's bytes from
 * floor(4 g b / 8), bytes 4..7 the second's (4 b further); code m of the
 * four sits at bit (4 g b mod 8) + m b of its half.
 */
static const uint8_t kvpk_pair_perm[KVPK_MAX_BITS + 1][64] __attribute__((aligned(64))) = {
	{ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 },
	{ 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 6, 7, 8, 9, 10 },
	{ 0, 1, 2, 3, 8, 9, 10, 11, 1, 2, 3, 4, 9, 10, 11, 12, 2, 3, 4, 5, 10, 11, 12, 13, 3, 4, 5, 6, 11, 12, 13, 14, 4, 5, 6, 7, 12, 13, 14, 15, 5, 6, 7, 8, 13, 14, 15, 16, 6, 7, 8, 9, 14, 15, 16, 17, 7, 8, 9, 10, 15, 16, 17, 18 },
	{ 0, 1, 2, 3, 12, 13, 14, 15, 1, 2, 3, 4, 13, 14, 15, 16, 3, 4, 5, 6, 15, 16, 17, 18, 4, 5, 6, 7, 16, 17, 18, 19, 6, 7, 8, 9, 18, 19, 20, 21, 7, 8, 9, 10, 19, 20, 21, 22, 9, 10, 11, 12, 21, 22, 23, 24, 10, 11, 12, 13, 22, 23, 24, 25 },
	{ 0, 1, 2, 3, 16, 17, 18, 19, 2, 3, 4, 5, 18, 19, 20, 21, 4, 5, 6, 7, 20, 21, 22, 23, 6, 7, 8, 9, 22, 23, 24, 25, 8, 9, 10, 11, 24, 25, 26, 27, 10, 11, 12, 13, 26, 27, 28, 29, 12, 13, 14, 15, 28, 29, 30, 31, 14, 15, 16, 17, 30, 31, 32, 33 },
	{ 0, 1, 2, 3, 20, 21, 22, 23, 2, 3, 4, 5, 22, 23, 24, 25, 5, 6, 7, 8, 25, 26, 27, 28, 7, 8, 9, 10, 27, 28, 29, 30, 10, 11, 12, 13, 30, 31, 32, 33, 12, 13, 14, 15, 32, 33, 34, 35, 15, 16, 17, 18, 35, 36, 37, 38, 17, 18, 19, 20, 37, 38, 39, 40 },
	{ 0, 1, 2, 3, 24, 25, 26, 27, 3, 4, 5, 6, 27, 28, 29, 30, 6, 7, 8, 9, 30, 31, 32, 33, 9, 10, 11, 12, 33, 34, 35, 36, 12, 13, 14, 15, 36, 37, 38, 39, 15, 16, 17, 18, 39, 40, 41, 42, 18, 19, 20, 21, 42, 43, 44, 45, 21, 22, 23, 24, 45, 46, 47, 48 },
	{ 0, 1, 2, 3, 28, 29, 30, 31, 3, 4, 5, 6, 31, 32, 33, 34, 7, 8, 9, 10, 35, 36, 37, 38, 10, 11, 12, 13, 38, 39, 40, 41, 14, 15, 16, 17, 42, 43, 44, 45, 17, 18, 19, 20, 45, 46, 47, 48, 21, 22, 23, 24, 49, 50, 51, 52, 24, 25, 26, 27, 52, 53, 54, 55 },
	{ 0, 1, 2, 3, 32, 33, 34, 35, 4, 5, 6, 7, 36, 37, 38, 39, 8, 9, 10, 11, 40, 41, 42, 43, 12, 13, 14, 15, 44, 45, 46, 47, 16, 17, 18, 19, 48, 49, 50, 51, 20, 21, 22, 23, 52, 53, 54, 55, 24, 25, 26, 27, 56, 57, 58, 59, 28, 29, 30, 31, 60, 61, 62, 63 },
};
static const uint8_t kvpk_pair_shift[KVPK_MAX_BITS + 1][64] __attribute__((aligned(64))) = {
	{ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 },
	{ 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39 },
	{ 0, 32, 2, 34, 4, 36, 6, 38, 0, 32, 2, 34, 4, 36, 6, 38, 0, 32, 2, 34, 4, 36, 6, 38, 0, 32, 2, 34, 4, 36, 6, 38, 0, 32, 2, 34, 4, 36, 6, 38, 0, 32, 2, 34, 4, 36, 6, 38, 0, 32, 2, 34, 4, 36, 6, 38, 0, 32, 2, 34, 4, 36, 6, 38 },
	{ 0, 32, 3, 35, 6, 38, 9, 41, 4, 36, 7, 39, 10, 42, 13, 45, 0, 32, 3, 35, 6, 38, 9, 41, 4, 36, 7, 39, 10, 42, 13, 45, 0, 32, 3, 35, 6, 38, 9, 41, 4, 36, 7, 39, 10, 42, 13, 45, 0, 32, 3, 35, 6, 38, 9, 41, 4, 36, 7, 39, 10, 42, 13, 45 },
	{ 0, 32, 4, 36, 8, 40, 12, 44, 0, 32, 4, 36, 8, 40, 12, 44, 0, 32, 4, 36, 8, 40, 12, 44, 0, 32, 4, 36, 8, 40, 12, 44, 0, 32, 4, 36, 8, 40, 12, 44, 0, 32, 4, 36, 8, 40, 12, 44, 0, 32, 4, 36, 8, 40, 12, 44, 0, 32, 4, 36, 8, 40, 12, 44 },
	{ 0, 32, 5, 37, 10, 42, 15, 47, 4, 36, 9, 41, 14, 46, 19, 51, 0, 32, 5, 37, 10, 42, 15, 47, 4, 36, 9, 41, 14, 46, 19, 51, 0, 32, 5, 37, 10, 42, 15, 47, 4, 36, 9, 41, 14, 46, 19, 51, 0, 32, 5, 37, 10, 42, 15, 47, 4, 36, 9, 41, 14, 46, 19, 51 },
	{ 0, 32, 6, 38, 12, 44, 18, 50, 0, 32, 6, 38, 12, 44, 18, 50, 0, 32, 6, 38, 12, 44, 18, 50, 0, 32, 6, 38, 12, 44, 18, 50, 0, 32, 6, 38, 12, 44, 18, 50, 0, 32, 6, 38, 12, 44, 18, 50, 0, 32, 6, 38, 12, 44, 18, 50, 0, 32, 6, 38, 12, 44, 18, 50 },
	{ 0, 32, 7, 39, 14, 46, 21, 53, 4, 36, 11, 43, 18, 50, 25, 57, 0, 32, 7, 39, 14, 46, 21, 53, 4, 36, 11, 43, 18, 50, 25, 57, 0, 32, 7, 39, 14, 46, 21, 53, 4, 36, 11, 43, 18, 50, 25, 57, 0, 32, 7, 39, 14, 46, 21, 53, 4, 36, 11, 43, 18, 50, 25, 57 },
	{ 0, 32, 8, 40, 16, 48, 24, 56, 0, 32, 8, 40, 16, 48, 24, 56, 0, 32, 8, 40, 16, 48, 24, 56, 0, 32, 8, 40, 16, 48, 24, 56, 0, 32, 8, 40, 16, 48, 24, 56, 0, 32, 8, 40, 16, 48, 24, 56, 0, 32, 8, 40, 16, 48, 24, 56, 0, 32, 8, 40, 16, 48, 24, 56 },
};

static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vbmi"))) __m512i
kvpk_pair_codes_vbmi(const uint8_t *col, int b)
{
	__m512i raw = _mm512_maskz_loadu_epi8((__mmask64)(~0ull >> (64 - 8 * b)), col);
	__m512i spread = _mm512_permutexvar_epi8(_mm512_load_si512((const void *)kvpk_pair_perm[b]), raw);
	__m512i codes = _mm512_multishift_epi64_epi8(_mm512_load_si512((const void *)kvpk_pair_shift[b]), spread);
	return _mm512_and_si512(codes, _mm512_set1_epi8((char)((1u << b) - 1)));
}
