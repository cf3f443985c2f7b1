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

/*
 * Compiled twice: as itself, unpacking codes with BMI2's pdep, and from
 * kv_attn_pk_avx512vbmi.c with PK5_VBMI set, unpacking them in the vector
 * unit (vpmultishiftqb), for the CPUs that have VBMI.
 */
#ifndef PK5_VBMI
#define PK5_VBMI 0
#endif
#if PK5_VBMI
#define PK5_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c,bmi2")))
#define PK5_NAME kv_attn_pk_scores_avx512vbmi
#define PK5_COLUMN kvpk_column_bytes_vbmi
#else
#define PK5_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c,bmi2")))
#define PK5_NAME kv_attn_pk_scores_avx512
#define PK5_COLUMN kvpk_column_bytes
#endif
#define PK5_INLINE static inline __attribute__((always_inline)) PK5_TARGET

/* Centroids c of the 16 codes in idx (dwords), b bits each. */
PK5_INLINE __m512 lookup16(const float *c, int b, __m512i idx)
{
	/*
	 * Permutes of 32 floats where the table is short enough (tables are
	 * zero beyond 2^b, so every width to 5 takes one): a gather of 16
	 * is far slower than two permutes and a blend.
	 */
	if (b <= 5)
		return _mm512_permutex2var_ps(_mm512_loadu_ps(c), idx, _mm512_loadu_ps(c + 16));
	if (b <= 7) { /* 2 or 4 tables of 32, picked by the code's bits above the fifth */
		__m512i hi = _mm512_srli_epi32(idx, 5);
		__m512 y = _mm512_permutex2var_ps(_mm512_loadu_ps(c), idx, _mm512_loadu_ps(c + 16));
		for (int k = 1; k < 1 << (b - 5); k++) {
			__m512 t = _mm512_permutex2var_ps(_mm512_loadu_ps(c + 32 * k), idx, _mm512_loadu_ps(c + 32 * k + 16));
			y = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(hi, _mm512_set1_epi32(k)), y, t);
		}
		return y;
	}
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
			__m256i codes = PK5_COLUMN(col, b);
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

PK5_TARGET void PK5_NAME(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			 float scale, float *scores, int ld)
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
