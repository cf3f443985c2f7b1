/*
 * vec_dot_avx512.c: AVX-512 VNNI multi-row dot kernels (vec_dot.h) for the
 * row-major weights the CPU backend does not repack. Built with the
 * repack tiles' flags (-mavx512vnni); called only when cpu_features() has
 * avx512 and avx512vnni.
 *
 * Q6_K (the output head and some attn_v / ffn_down of Q4_K_M files): one
 * weight row against up to VEC_DOT_MAX_NY Q8_K rows. Per super-block the
 * 6-bit values q (0..63, the stored value plus 32) are assembled once into
 * four zmm of unsigned bytes, elements 64 k .. 64 k + 63 each, then per
 * token
 *
 *   p   = vpdpbusd(0, q, act)          16 x int32, 4 products each,
 *                                      |p| <= 4 * 63 * 128 < 2^15
 *   si  = vpdpwssd(.., packs(p, p'), sc words)   the int8 sub-block scales
 *   si += vpdpwssd(bsums, -32 sc)      the -32 offset, 16 values a sub-block
 *
 * all exact in int32; one float fma per (token, super-block). Agrees with
 * vec_dot_q6_K_ref to float rounding (test-matmul).
 */
#include <immintrin.h>

#include "kernels/cpu/vec_dot.h"

/* Scale word of each int16 lane of packs(p_lo, p_hi) for the first 128
 * values (add 8 for the second): 128-bit lane k holds p_lo's sub-block k
 * (words 0..3) and p_hi's sub-block 4 + k (words 4..7). */
static const short Q6_SC_IDX[32] = {
	0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7,
};

static inline __attribute__((always_inline)) void q6k_multi(int64_t n, float *s, size_t s_stride, const void *vw,
							     const void *va, size_t a_stride, const int NY)
{
	const BlockQ6_K *w = vw;
	const __m512i m4 = _mm512_set1_epi8(0xF), m3 = _mm512_set1_epi8(3), zero = _mm512_setzero_si512();
	/* qh shifts per 256-bit half: (0, 2) for the low nibbles' values, (4, 6) for the high */
	const __m512i sh02 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
	const __m512i sh46 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
	const __m512i idx0 = _mm512_loadu_si512(Q6_SC_IDX), idx1 = _mm512_add_epi16(idx0, _mm512_set1_epi16(8));
	__m512 acc[VEC_DOT_MAX_NY];

	for (int t = 0; t < NY; t++)
		acc[t] = _mm512_setzero_ps();
	for (int64_t b = 0; b < n / QK_K; b++) {
		const BlockQ6_K *x = &w[b];
		_mm_prefetch((const char *)(x + 2), _MM_HINT_T0);
		_mm_prefetch((const char *)(x + 2) + 64, _MM_HINT_T0);
		_mm_prefetch((const char *)(x + 2) + 128, _MM_HINT_T0);
		_mm_prefetch((const char *)(x + 2) + 192, _MM_HINT_T0);
		__m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
		__m512i scw = _mm512_zextsi256_si512(sc16);
		__m512i sc0 = _mm512_permutexvar_epi16(idx0, scw), sc1 = _mm512_permutexvar_epi16(idx1, scw);
		__m512i off = _mm512_zextsi256_si512(_mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
		__m512i q[4];
		for (int nn = 0; nn < 2; nn++) {
			__m512i l = _mm512_loadu_si512(x->ql + 64 * nn);
			__m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * nn)));
			q[2 * nn] = _mm512_or_si512(_mm512_and_si512(l, m4),
						    _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, sh02), m3), 4));
			q[2 * nn + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
							_mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, sh46), m3), 4));
		}
		float d = _cvtsh_ss(x->d);
		for (int t = 0; t < NY; t++) {
			const BlockQ8_K *a = (const BlockQ8_K *)((const char *)va + (size_t)t * a_stride) + b;
			__m512i p0 = _mm512_dpbusd_epi32(zero, q[0], _mm512_loadu_si512(a->qs));
			__m512i p1 = _mm512_dpbusd_epi32(zero, q[1], _mm512_loadu_si512(a->qs + 64));
			__m512i p2 = _mm512_dpbusd_epi32(zero, q[2], _mm512_loadu_si512(a->qs + 128));
			__m512i p3 = _mm512_dpbusd_epi32(zero, q[3], _mm512_loadu_si512(a->qs + 192));
			__m512i si = _mm512_dpwssd_epi32(zero, _mm512_packs_epi32(p0, p1), sc0);
			si = _mm512_dpwssd_epi32(si, _mm512_packs_epi32(p2, p3), sc1);
			si = _mm512_dpwssd_epi32(si, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)a->bsums)),
						 off);
			acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(d * a->d), acc[t]);
		}
	}
	for (int t = 0; t < NY; t++)
		s[(size_t)t * s_stride] = _mm512_reduce_add_ps(acc[t]);
}

/* af is not used: Q8_K rows carry float scales already. */
static void vec_dot_q6_K_multi_avx512vnni(int64_t n, float *s, size_t s_stride, const void *vw, const void *va,
					  size_t a_stride, const float *af, size_t af_stride, int ny)
{
	(void)af;
	(void)af_stride;
	switch (ny) {
	case 1: q6k_multi(n, s, s_stride, vw, va, a_stride, 1); break;
	case 2: q6k_multi(n, s, s_stride, vw, va, a_stride, 2); break;
	case 3: q6k_multi(n, s, s_stride, vw, va, a_stride, 3); break;
	default: q6k_multi(n, s, s_stride, vw, va, a_stride, 4); break;
	}
}

VecDotMultiFn vec_dot_avx512vnni_multi_get(uint32_t t)
{
	return t == WTYPE_Q6_K ? vec_dot_q6_K_multi_avx512vnni : NULL;
}
