/*
 * kv_attn_pk_avx512.c: the AVX-512 (F/BW/VL + VBMI + VNNI) twin of
 * kv_attn_pk_scores_q16_ref(): the quantized scores (kv_attn.h) of G query
 * heads against a block of pair-coded keys (kernels/kv_pk_layout.h).
 * Called only when kv_attn_have_avx512vnni() (Ice Lake, Zen 4 and later);
 * other AVX-512 CPUs run the AVX2 twin.
 *
 * Pair by pair: the pair's 8 b code bytes become 64 interleaved code bytes
 * in four instructions (kvpk_pair_codes_vbmi: byte 2t, 2t + 1 = key t's
 * two codes), the low and high bytes of their int16 centroids are one
 * vpermb each (vpermi2b for 7 bits, two and a blend for 8), two byte
 * unpacks make one dword per key (its two centroids), and every head adds
 * one vpdpwssd per 16 keys with its broadcast (u16_2i, u16_2i+1). Integer
 * sums are exact, the float steps the reference's: bit for bit its scores.
 */
#include <assert.h>
#include <immintrin.h>

#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/kv_attn_pk_x86.h"

#define PK5_TARGET \
	__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c,bmi2")))
#define PK5_INLINE static inline __attribute__((always_inline)) PK5_TARGET

/*
 * Lanes: dword lane 4k + m (k the 128-bit lane) of the first register of
 * a pair is key 8k + m, of the second key 8k + 4 + m (in-lane unpacks);
 * the scores are put back in key order once per block.
 */

/* plane[code] for the 64 codes (bytes) of x, b bits each. */
PK5_INLINE __m512i plane_lookup(const uint8_t *plane, int b, __m512i x)
{
	if (b <= 6)
		return _mm512_permutexvar_epi8(x, _mm512_loadu_si512((const void *)plane));
	__m512i t = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)plane), x,
					     _mm512_loadu_si512((const void *)(plane + 64)));
	if (b == 7)
		return t;
	__m512i u = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(plane + 128)), x,
					     _mm512_loadu_si512((const void *)(plane + 192)));
	return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), t, u);
}

PK5_INLINE void pk_scores(const KvPkRows *keys, const uint8_t *blk, const float *q, const int G, int n,
			  float scale, float *scores, int ld)
{
	enum { BT = KV_BLOCK_TOKENS };
	const int d = keys->dim;
	const uint8_t *sc = kvpk_scales(blk, keys->code_bits), *widths = sc + d / 2;
	float sig[KVPK_MAX_DIM], f[KVPK_MAX_GROUP];
	int16_t qp[KVPK_MAX_GROUP * KVPK_MAX_DIM] __attribute__((aligned(64)));
	kvpk_column_sigmas(keys, sc, widths, sig);
	kvpk_q16_query(q, G, d, sig, scale, qp, f);
	__m512 out[KVPK_MAX_GROUP][2];
	for (int g = 0; g < G; g++)
		out[g][0] = out[g][1] = _mm512_setzero_ps();
	const uint8_t *col = blk;
	for (int i0 = 0; i0 < d / 2; i0 += KVPK_Q16_CHUNK / 2) {
		__m512i acc[KVPK_MAX_GROUP][2];
		for (int g = 0; g < G; g++)
			acc[g][0] = acc[g][1] = _mm512_setzero_si512();
		for (int i = i0; i < d / 2 && i < i0 + KVPK_Q16_CHUNK / 2; i++) {
			int b = kvpk_width(widths, i);
			if (b == 0)
				continue;
			__m512i x = kvpk_pair_codes_vbmi(col, b);
			col += (size_t)8 * b;
			const uint8_t *lo = keys->c16_planes[b];
			__m512i l = plane_lookup(lo, b, x), h = plane_lookup(lo + 256, b, x);
			__m512i y0 = _mm512_unpacklo_epi8(l, h), y1 = _mm512_unpackhi_epi8(l, h);
			for (int g = 0; g < G; g++) {
				int32_t w;
				memcpy(&w, qp + (size_t)g * d + 2 * i, 4);
				__m512i u = _mm512_set1_epi32(w);
				acc[g][0] = _mm512_dpwssd_epi32(acc[g][0], y0, u);
				acc[g][1] = _mm512_dpwssd_epi32(acc[g][1], y1, u);
			}
		}
		for (int g = 0; g < G; g++) {
			__m512 vf = _mm512_set1_ps(f[g]);
			out[g][0] = _mm512_add_ps(out[g][0], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[g][0]), vf));
			out[g][1] = _mm512_add_ps(out[g][1], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[g][1]), vf));
		}
	}
	/* key 8k + r: lane 4k + r of the first register (r < 4), else lane 4k + r - 4 of the second */
	const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
	const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
	__mmask16 m0 = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
	__mmask16 m1 = (__mmask16)(n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1);
	for (int g = 0; g < G; g++) {
		float *s = scores + (size_t)g * ld;
		_mm512_mask_storeu_ps(s, m0, _mm512_permutex2var_ps(out[g][0], i0, out[g][1]));
		_mm512_mask_storeu_ps(s + 16, m1, _mm512_permutex2var_ps(out[g][0], i1, out[g][1]));
	}
}

PK5_TARGET void kv_attn_pk_scores_q16_avx512(const KvPkRows *keys, const uint8_t *blk, const float *q, int G,
					     int n, float scale, float *scores, int ld)
{
	assert(G >= 1 && G <= KVPK_MAX_GROUP);
	switch (G) {
#define PK5_CASE(g) \
	case g: pk_scores(keys, blk, q, g, n, scale, scores, ld); return;
		PK5_CASE(1) PK5_CASE(2) PK5_CASE(3) PK5_CASE(4) PK5_CASE(5) PK5_CASE(6) PK5_CASE(7) PK5_CASE(8)
#undef PK5_CASE
	default:
		pk_scores(keys, blk, q, G, n, scale, scores, ld);
	}
}
