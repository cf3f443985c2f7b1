/*
 * kv_attn_pk_avx512.c: the AVX-512 twin of kv_attn_pk_scores_ref():
 * scores of G query heads against a block of pair-coded keys
 * (kernels/kv_pk_layout.h). Called only when kv_attn_have_avx512().
 *
 * As the AVX2 twin, with 16 rows per register: a codebook of up to 16
 * levels is one vpermps (_mm512_permutexvar_ps), up to 32 one vpermi2ps,
 * wider ones a gather; the running sums of up to 8 heads stay in
 * registers. No fused multiply-add: the scores are the reference's bit
 * for bit (fused, measured no faster: the lookups bound this kernel).
 */
#include <assert.h>
#include <immintrin.h>

#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/kv_attn_pk_x86.h"

#define PK5_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c,bmi2")))
#define PK5_INLINE static inline __attribute__((always_inline)) PK5_TARGET

/* Centroids c of the 16 codes in idx (dwords), b bits each. */
PK5_INLINE __m512 lookup16(const float *c, int b, __m512i idx)
{
	/*
	 * One permute for every width to 5 (the tables are zero beyond 2^b):
	 * widths change pair by pair, and a branch per width mispredicts.
	 */
	if (b <= 5)
		return _mm512_permutex2var_ps(_mm512_loadu_ps(c), idx, _mm512_loadu_ps(c + 16));
	return _mm512_i32gather_ps(idx, c, 4);
}

/*
 * The kernel for G heads. Inlined with G a constant for the common groups,
 * so the 2 G running sums live in registers rather than in a stack array
 * read and written for every coordinate.
 */
PK5_INLINE void pk_scores(const KvPkRows *keys, const uint8_t *blk, const float *q, const int G, int n,
			  float scale, float *scores, int ld)
{
	enum { BT = KV_BLOCK_TOKENS };
	const int d = keys->dim;
	const uint8_t *sc = kvpk_scales(blk, keys->code_bits), *widths = sc + d / 2;
	__m512 acc[KVPK_MAX_GROUP][BT / 16];
	for (int g = 0; g < G; g++)
		acc[g][0] = acc[g][1] = _mm512_setzero_ps();
	const uint8_t *col = blk;
	/* pair by pair (one width, one sigma), then its two coordinates' columns */
	for (int i = 0; i < d / 2; i++) {
		int b = kvpk_width(widths, i);
		if (b == 0)
			continue;
		__m512 s = _mm512_set1_ps(keys->sigma[sc[i]]);
		const float *c = keys->centroids[b];
		for (int j = 2 * i; j < 2 * i + 2; j++) {
			__m256i codes = kvpk_column_bytes(col, b);
			col += (size_t)BT * b / 8;
			__m512 y0 = _mm512_mul_ps(lookup16(c, b, _mm512_cvtepu8_epi32(_mm256_castsi256_si128(codes))), s);
			__m512 y1 = _mm512_mul_ps(lookup16(c, b, _mm512_cvtepu8_epi32(_mm256_extracti128_si256(codes, 1))), s);
			for (int g = 0; g < G; g++) {
				__m512 qj = _mm512_set1_ps(q[(size_t)g * d + j]);
				acc[g][0] = _mm512_add_ps(acc[g][0], _mm512_mul_ps(qj, y0));
				acc[g][1] = _mm512_add_ps(acc[g][1], _mm512_mul_ps(qj, y1));
			}
		}
	}
	__m512 vs = _mm512_set1_ps(scale);
	for (int g = 0; g < G; g++) {
		float out[BT];
		_mm512_storeu_ps(out, _mm512_mul_ps(acc[g][0], vs));
		_mm512_storeu_ps(out + 16, _mm512_mul_ps(acc[g][1], vs));
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] = out[t];
	}
}

PK5_TARGET void kv_attn_pk_scores_avx512(const KvPkRows *keys, const uint8_t *blk, const float *q,
					 int G, int n, float scale, float *scores, int ld)
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
