/*
 * kv_attn_pk_avx2.c: the AVX2 twin of kv_attn_pk_scores_ref(): scores of
 * G query heads against a block of pair-coded keys (kernels/kv_pk_layout.h).
 * Called only when kv_attn_have_avx2().
 *
 * As the reference, column by column: coordinate j's 32 codes are
 * unpacked once (pdep), looked up (widths <= 6: byte shuffles of the
 * centroids' 4 byte planes, blended on code bits 4 and 5, the bytes
 * unpacked back into the exact floats; 7 and 8: gathers), scaled by the
 * pair's sigma, and every query head adds q_gj times them to its 32
 * running sums, 4 ymm each. The products and sums are the
 * reference's, in its order, with no fused multiply-add, so the scores
 * are bit for bit the same (a fused form, sigma folded into q_gj, measured
 * slower on Zen 3: the FMAs share ports with the shuffles).
 */
#include <assert.h>
#include <immintrin.h>

#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/kv_attn_pk_x86.h"

#define PK2_TARGET __attribute__((target("avx2,fma,f16c,bmi2")))
#define PK2_INLINE static inline __attribute__((always_inline)) PK2_TARGET

/*
 * Lanes of the 4 ymm of one column: ymm r holds the values of keys
 * 4r..4r+3 (low half) and 16+4r..16+4r+3 (high half), the order in
 * which in-lane byte unpacks leave 32 byte-plane lookups. Every lookup
 * path yields this order; the scores are put back in key order once.
 */

/* The 16-byte table k of plane p of width b, in both lanes. */
PK2_INLINE __m256i plane_tab(const uint8_t *planes, int p, int k)
{
	return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(planes + 64 * p + 16 * k)));
}

/*
 * Plane p of the centroids of the 32 codes (bytes) of a column of width
 * b <= KVPK_PLANE_BITS: pshufb reads the low 4 bits of each code (bit 7
 * is clear: codes < 64), blends on bits 4 and 5 pick among the 16-entry
 * tables (sel4 / sel5: those bits moved to bit 7 of each byte). Spelled
 * out per width: a loop over a table count known only at run time
 * measured slower. 7 bits (8 tables, 7 blends per plane) measured no
 * faster than the gather.
 */
PK2_INLINE __m256i plane_lookup(const uint8_t *planes, int b, int p, __m256i codes, __m256i sel4, __m256i sel5)
{
	__m256i t0 = _mm256_shuffle_epi8(plane_tab(planes, p, 0), codes);
	if (b <= 4)
		return t0;
	__m256i t01 = _mm256_blendv_epi8(t0, _mm256_shuffle_epi8(plane_tab(planes, p, 1), codes), sel4);
	if (b == 5)
		return t01;
	__m256i t23 = _mm256_blendv_epi8(_mm256_shuffle_epi8(plane_tab(planes, p, 2), codes),
					 _mm256_shuffle_epi8(plane_tab(planes, p, 3), codes), sel4);
	return _mm256_blendv_epi8(t01, t23, sel5);
}

/* The centroids of a column's 32 codes, in the lane order above. */
PK2_INLINE void lookup32(const KvPkRows *keys, int b, __m256i codes, __m256 y[4])
{
	if (b <= KVPK_PLANE_BITS) {
		const uint8_t *planes = keys->planes[b];
		/* bit 4 (5) of each byte to its bit 7; 16-bit shifts: what crosses bytes lands below bit 7 */
		__m256i sel4 = _mm256_slli_epi16(codes, 3), sel5 = _mm256_slli_epi16(codes, 2);
		__m256i p0 = plane_lookup(planes, b, 0, codes, sel4, sel5);
		__m256i p1 = plane_lookup(planes, b, 1, codes, sel4, sel5);
		__m256i p2 = plane_lookup(planes, b, 2, codes, sel4, sel5);
		__m256i p3 = plane_lookup(planes, b, 3, codes, sel4, sel5);
		__m256i lo01 = _mm256_unpacklo_epi8(p0, p1), hi01 = _mm256_unpackhi_epi8(p0, p1);
		__m256i lo23 = _mm256_unpacklo_epi8(p2, p3), hi23 = _mm256_unpackhi_epi8(p2, p3);
		y[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(lo01, lo23));
		y[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(lo01, lo23));
		y[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(hi01, hi23));
		y[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(hi01, hi23));
		return;
	}
	/* dwords (codes 4r..4r+3, 16+4r..): qword r holds ymm r's 8 codes */
	__m256i perm = _mm256_permutevar8x32_epi32(codes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	__m128i lo = _mm256_castsi256_si128(perm), hi = _mm256_extracti128_si256(perm, 1);
	const float *c = keys->centroids[b];
	y[0] = _mm256_i32gather_ps(c, _mm256_cvtepu8_epi32(lo), 4);
	y[1] = _mm256_i32gather_ps(c, _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), 4);
	y[2] = _mm256_i32gather_ps(c, _mm256_cvtepu8_epi32(hi), 4);
	y[3] = _mm256_i32gather_ps(c, _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), 4);
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
		for (int j = 2 * i; j < 2 * i + 2; j++) {
			__m256i codes = kvpk_column_bytes(col, b);
			col += (size_t)BT * b / 8;
			__m256 y[BT / 8];
			lookup32(keys, b, codes, y);
			for (int r = 0; r < BT / 8; r++)
				y[r] = _mm256_mul_ps(y[r], s);
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
		for (int r = 0; r < BT / 8; r++) {
			__m256 v = _mm256_mul_ps(acc[g][r], vs);
			_mm_storeu_ps(out + 4 * r, _mm256_castps256_ps128(v));
			_mm_storeu_ps(out + 16 + 4 * r, _mm256_extractf128_ps(v, 1));
		}
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
