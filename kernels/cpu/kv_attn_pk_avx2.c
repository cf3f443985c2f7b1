/*
 * kv_attn_pk_avx2.c: the AVX2 twin of kv_attn_pk_scores_q16_ref(): the
 * quantized scores (kv_attn.h) of G query heads against a block of
 * pair-coded keys (kernels/kv_pk_layout.h). Called only when
 * kv_attn_have_avx2(); on AVX-512 CPUs without VBMI and VNNI too.
 *
 * Pair by pair (one width, one sigma folded into the query): the two
 * columns' 32 codes each unpacked to bytes (pdep) and interleaved, so
 * that byte 2t, 2t + 1 are key t's two codes; the int16 centroids looked
 * up by byte plane (pshufb on 16-entry tables, blends on code bits 4 and
 * 5; widths 7 and 8 by 32-bit gathers of the int16 table), the low and
 * high planes interleaved into one dword per key (its two centroids),
 * and every head adds vpmaddwd of them with its broadcast (u16_2i,
 * u16_2i+1) to 4 ymm of int32 sums. Integer sums are exact, the float
 * steps are the reference's: the scores are its own bit for bit.
 */
#include <assert.h>
#include <immintrin.h>

#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/kv_attn_pk_x86.h"

#define PK2_TARGET __attribute__((target("avx2,fma,f16c,bmi2")))
#define PK2_INLINE static inline __attribute__((always_inline)) PK2_TARGET

/*
 * Lanes: ymm r of a pair holds the dwords of keys 4r..4r+3 (low half) and
 * 16+4r..16+4r+3 (high half), the order in-lane byte unpacks leave; the
 * scores are put back in key order once per block.
 */

/* The 16-byte table k of a 256-byte plane, in both lanes. */
PK2_INLINE __m256i plane_tab(const uint8_t *plane, int k)
{
	return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(plane + 16 * k)));
}

/*
 * plane[code] for the 32 codes (bytes < 64) of c, b <= 6: pshufb reads
 * the low 4 bits, blends on bits 4 and 5 (sel4 / sel5: moved to bit 7)
 * pick among the 16-entry tables.
 */
PK2_INLINE __m256i plane_lookup(const uint8_t *plane, int b, __m256i c, __m256i sel4, __m256i sel5)
{
	__m256i t0 = _mm256_shuffle_epi8(plane_tab(plane, 0), c);
	if (b <= 4)
		return t0;
	__m256i t01 = _mm256_blendv_epi8(t0, _mm256_shuffle_epi8(plane_tab(plane, 1), c), sel4);
	if (b == 5)
		return t01;
	__m256i t23 = _mm256_blendv_epi8(_mm256_shuffle_epi8(plane_tab(plane, 2), c),
					 _mm256_shuffle_epi8(plane_tab(plane, 3), c), sel4);
	return _mm256_blendv_epi8(t01, t23, sel5);
}

/* The dwords (c16 of the first column, c16 of the second) of a pair's keys, lanes as above. */
PK2_INLINE void pair_words(const KvPkRows *keys, int b, __m256i a, __m256i c, __m256i y[4])
{
	if (b <= 6) {
		const uint8_t *lo = keys->c16_planes[b], *hi = lo + 256;
		/* byte pairs (a_t, c_t): t = 0..7 | 16..23, and 8..15 | 24..31 */
		__m256i x0 = _mm256_unpacklo_epi8(a, c), x1 = _mm256_unpackhi_epi8(a, c);
		__m256i s40 = _mm256_slli_epi16(x0, 3), s50 = _mm256_slli_epi16(x0, 2);
		__m256i s41 = _mm256_slli_epi16(x1, 3), s51 = _mm256_slli_epi16(x1, 2);
		__m256i l0 = plane_lookup(lo, b, x0, s40, s50), h0 = plane_lookup(hi, b, x0, s40, s50);
		__m256i l1 = plane_lookup(lo, b, x1, s41, s51), h1 = plane_lookup(hi, b, x1, s41, s51);
		y[0] = _mm256_unpacklo_epi8(l0, h0);
		y[1] = _mm256_unpackhi_epi8(l0, h0);
		y[2] = _mm256_unpacklo_epi8(l1, h1);
		y[3] = _mm256_unpackhi_epi8(l1, h1);
		return;
	}
	/* dwords of codes 4r..4r+3, 16+4r..: qword r holds ymm r's 8 codes */
	const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	__m256i pa = _mm256_permutevar8x32_epi32(a, perm), pc = _mm256_permutevar8x32_epi32(c, perm);
	const int *t = (const int *)(const void *)keys->c16[b]; /* 4-byte reads at 2-byte steps: low word is entry k */
	for (int r = 0; r < 4; r++) {
		__m128i ha = r < 2 ? _mm256_castsi256_si128(pa) : _mm256_extracti128_si256(pa, 1);
		__m128i hc = r < 2 ? _mm256_castsi256_si128(pc) : _mm256_extracti128_si256(pc, 1);
		if (r & 1) {
			ha = _mm_srli_si128(ha, 8);
			hc = _mm_srli_si128(hc, 8);
		}
		__m256i ga = _mm256_i32gather_epi32(t, _mm256_cvtepu8_epi32(ha), 2);
		__m256i gc = _mm256_i32gather_epi32(t, _mm256_cvtepu8_epi32(hc), 2);
		y[r] = _mm256_blend_epi16(ga, _mm256_slli_epi32(gc, 16), 0xaa);
	}
}

/* The kernel for G heads, G a constant for the common groups (sums in registers). */
PK2_INLINE void pk_scores(const KvPkRows *keys, const uint8_t *blk, const float *q, const int G, int n,
			  float scale, float *scores, int ld)
{
	enum { BT = KV_BLOCK_TOKENS };
	const int d = keys->dim;
	const uint8_t *sc = kvpk_scales(blk, keys->code_bits), *widths = sc + d / 2;
	float sig[KVPK_MAX_DIM], f[KVPK_MAX_GROUP];
	int16_t qp[KVPK_MAX_GROUP * KVPK_MAX_DIM] __attribute__((aligned(32)));
	kvpk_column_sigmas(keys, sc, widths, sig);
	kvpk_q16_query(q, G, d, sig, scale, qp, f);
	__m256 out[KVPK_MAX_GROUP][BT / 8];
	for (int g = 0; g < G; g++)
		for (int r = 0; r < BT / 8; r++)
			out[g][r] = _mm256_setzero_ps();
	const uint8_t *col = blk;
	for (int i0 = 0; i0 < d / 2; i0 += KVPK_Q16_CHUNK / 2) {
		__m256i acc[KVPK_MAX_GROUP][BT / 8];
		for (int g = 0; g < G; g++)
			for (int r = 0; r < BT / 8; r++)
				acc[g][r] = _mm256_setzero_si256();
		for (int i = i0; i < d / 2 && i < i0 + KVPK_Q16_CHUNK / 2; i++) {
			int b = kvpk_width(widths, i);
			if (b == 0)
				continue;
			__m256i y[BT / 8];
			pair_words(keys, b, kvpk_column_bytes(col, b), kvpk_column_bytes(col + 4 * b, b), y);
			col += (size_t)8 * b;
			for (int g = 0; g < G; g++) {
				int32_t w;
				memcpy(&w, qp + (size_t)g * d + 2 * i, 4);
				__m256i u = _mm256_set1_epi32(w);
				for (int r = 0; r < BT / 8; r++)
					acc[g][r] = _mm256_add_epi32(acc[g][r], _mm256_madd_epi16(y[r], u));
			}
		}
		for (int g = 0; g < G; g++) {
			__m256 vf = _mm256_set1_ps(f[g]);
			for (int r = 0; r < BT / 8; r++)
				out[g][r] = _mm256_add_ps(out[g][r], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[g][r]), vf));
		}
	}
	for (int g = 0; g < G; g++) {
		float o[BT];
		for (int r = 0; r < BT / 8; r++) {
			_mm_storeu_ps(o + 4 * r, _mm256_castps256_ps128(out[g][r]));
			_mm_storeu_ps(o + 16 + 4 * r, _mm256_extractf128_ps(out[g][r], 1));
		}
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] = o[t];
	}
}

PK2_TARGET void kv_attn_pk_scores_q16_avx2(const KvPkRows *keys, const uint8_t *blk, const float *q, int G,
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
