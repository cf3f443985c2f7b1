/*
 * kv_attn_pk_avx2.c: the AVX2 twin of kv_attn_pk_scores_ref(): scores of
 * G query heads against a block of pair-coded keys (kernels/kv_pk_layout.h).
 * Called only when kv_attn_have_avx2().
 *
 * As the reference, column by column: coordinate j's 32 codes are
 * unpacked once (pdep), looked up (a permute of 8 for widths <= 3, two and
 * a blend for 4, a gather beyond), scaled by the pair's sigma, and every
 * query head adds q_gj times them to its 32 running sums, 4 ymm each. The
 * products and sums are the reference's, in its order, with no fused
 * multiply-add, so the scores are bit for bit the same.
 */
#include <assert.h>
#include <immintrin.h>

#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/kv_attn_pk_x86.h"

#define PK2_TARGET __attribute__((target("avx2,fma,f16c,bmi2")))
#define PK2_INLINE static inline __attribute__((always_inline)) PK2_TARGET

/* Centroids c of the 8 codes in idx (dwords), b bits each. */
PK2_INLINE __m256 lookup8(const float *c, int b, __m256i idx)
{
	if (b <= 3)
		return _mm256_permutevar8x32_ps(_mm256_loadu_ps(c), idx);
	if (b == 4) { /* the tree below for one bit, spelled out */
		__m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c), idx);
		__m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c + 8), idx);
		/* bit 3 of the code into the sign bit: blendv picks hi for codes 8..15 */
		return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
	}
	if (b == 5) {
		/*
		 * 4 tables of 8 merged by a tree of blends on bits 3 and 4: a
		 * little faster than a gather of 8 (Zen 4); for 6 bits, 8 tables
		 * and 7 blends measured no better than the gather.
		 */
		__m256 t[4];
		int nt = 1 << (b - 3);
		for (int k = 0; k < nt; k++)
			t[k] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c + 8 * k), idx);
		for (int bit = 3; bit < b; bit++) {
			__m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 31 - bit));
			nt /= 2;
			for (int k = 0; k < nt; k++)
				t[k] = _mm256_blendv_ps(t[2 * k], t[2 * k + 1], sel);
		}
		return t[0];
	}
	return _mm256_i32gather_ps(c, idx, 4);
}

/* The kernel for G heads; see the AVX-512 twin for why G is made a constant. */
PK2_INLINE void pk_scores(const KvPkRows *keys, const uint8_t *blk, const float *q, const int G, int n,
			  float scale, float *scores, int ld)
{
	enum { BT = KV_BLOCK_TOKENS };
	const int d = keys->dim;
	const uint8_t *sc = kvpk_scales(blk, keys->code_bits), *widths = sc + d / 2;
	__m256 acc[KVPK_MAX_GROUP][BT / 8];
	for (int g = 0; g < G; g++)
		for (int r = 0; r < BT / 8; r++)
			acc[g][r] = _mm256_setzero_ps();
	const uint8_t *col = blk;
	for (int i = 0; i < d / 2; i++) {
		int b = kvpk_width(widths, i);
		if (b == 0)
			continue;
		__m256 s = _mm256_set1_ps(keys->sigma[sc[i]]);
		const float *c = keys->centroids[b];
		for (int j = 2 * i; j < 2 * i + 2; j++) {
			__m256i codes = kvpk_column_bytes(col, b);
			col += (size_t)BT * b / 8;
			__m256 y[BT / 8];
			__m128i lo = _mm256_castsi256_si128(codes), hi = _mm256_extracti128_si256(codes, 1);
			y[0] = _mm256_mul_ps(lookup8(c, b, _mm256_cvtepu8_epi32(lo)), s);
			y[1] = _mm256_mul_ps(lookup8(c, b, _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), s);
			y[2] = _mm256_mul_ps(lookup8(c, b, _mm256_cvtepu8_epi32(hi)), s);
			y[3] = _mm256_mul_ps(lookup8(c, b, _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), s);
			for (int g = 0; g < G; g++) {
				__m256 qj = _mm256_set1_ps(q[(size_t)g * d + j]);
				for (int r = 0; r < BT / 8; r++)
					acc[g][r] = _mm256_add_ps(acc[g][r], _mm256_mul_ps(qj, y[r]));
			}
		}
	}
	__m256 vs = _mm256_set1_ps(scale);
	for (int g = 0; g < G; g++) {
		float out[BT];
		for (int r = 0; r < BT / 8; r++)
			_mm256_storeu_ps(out + 8 * r, _mm256_mul_ps(acc[g][r], vs));
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] = out[t];
	}
}

PK2_TARGET void kv_attn_pk_scores_avx2(const KvPkRows *keys, const uint8_t *blk, const float *q, int G,
				       int n, float scale, float *scores, int ld)
{
	assert(G >= 1 && G <= KVPK_MAX_GROUP);
	switch (G) {
#define PK2_CASE(g) \
	case g: pk_scores(keys, blk, q, g, n, scale, scores, ld); return;
		PK2_CASE(1) PK2_CASE(2) PK2_CASE(3) PK2_CASE(4)
#undef PK2_CASE
	default:
		pk_scores(keys, blk, q, G, n, scale, scores, ld);
	}
}
