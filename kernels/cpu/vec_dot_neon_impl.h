/*
 * vec_dot_neon_impl.h: the NEON dot products of the weight types, written
 * once against a one-word vocabulary and compiled twice:
 *
 *   vec_dot_neon.c          DOT16 = SMULL/SMULL2 + SADALP (any aarch64)
 *   vec_dot_neon_dotprod.c  DOT16 = SDOT (vdotq_s32, -march=...+dotprod)
 *
 * The including file defines NEON_SUFFIX (the functions' name ending) and
 * DOT16(acc, a, b): acc (int32x4) plus the 16 products a[i] * b[i] of two
 * int8x16, summed in some grouping (both are exact: |a b| <= 2^14), then
 * defines its vec_dot_neon_*_get() and repack_tile_neon_*_get() from
 * vec_dot_get_SUFFIX() and repack_tile_get_SUFFIX().
 *
 * Each kernel decodes a block's quants to int8 lanes exactly as
 * vec_dot_ref.c spells the layouts, forms the same integer (sub-)block sums
 * in the vector unit, and then scales and accumulates in float one block at
 * a time with the reference's very expression and order (no fused
 * multiply-adds: -ffp-contract=off). So every kernel here returns the
 * reference's float bit for bit (test-matmul checks it), and dispatching
 * them changes no output.
 *
 * Shapes: n values (a multiple of the block size); vw n / block weight
 * blocks, va the matching activation blocks (vec_dot.h).
 */
#include <arm_neon.h>
#include <string.h>

#include "kernels/cpu/repack.h"
#include "kernels/cpu/vec_dot.h"

/* The two variants' tables, for vec_dot_neon.c's dispatch. */
VecDotFn vec_dot_neon_plain_get(uint32_t t);
VecDotFn vec_dot_neon_dotprod_get(uint32_t t);
RepackTileFn repack_tile_neon_plain_get(uint32_t t);
RepackTileFn repack_tile_neon_dotprod_get(uint32_t t);

#define NEON_CAT2(a, b) a##b
#define NEON_CAT(a, b) NEON_CAT2(a, b)
#define NEON_FN(name) NEON_CAT(name, NEON_SUFFIX)

/* The integer sum of 32 int8 products, a (w0, w1) and b (a0, a1). */
static inline int dot32(int8x16_t w0, int8x16_t w1, int8x16_t a0, int8x16_t a1)
{
	int32x4_t acc = DOT16(vdupq_n_s32(0), w0, a0);
	acc = DOT16(acc, w1, a1);
	return vaddvq_s32(acc);
}

static inline int dot16(int8x16_t w, int8x16_t a)
{
	return vaddvq_s32(DOT16(vdupq_n_s32(0), w, a));
}

/* Bits 0..15 of m as 16 lanes holding `bit` where set, 0 where clear. */
static inline uint8x16_t bits16(uint32_t m, uint8_t bit)
{
	static const uint8_t sel[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
	uint8x16_t x = vcombine_u8(vdup_n_u8((uint8_t)(m & 0xff)), vdup_n_u8((uint8_t)(m >> 8 & 0xff)));
	return vandq_u8(vtstq_u8(x, vld1q_u8(sel)), vdupq_n_u8(bit));
}

/* Q4_0 (q - 8) . Q8_0: low nibbles are values 0..15, high ones 16..31. */
static void NEON_FN(vec_dot_q4_0_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ4_0 *w = vw;
	const BlockQ8_0 *a = va;
	const uint8x16_t m4 = vdupq_n_u8(0xf);
	const int8x16_t k8 = vdupq_n_s8(8);
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK4_0; b++) {
		uint8x16_t q = vld1q_u8(w[b].qs);
		int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, m4)), k8);
		int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), k8);
		int isum = dot32(lo, hi, vld1q_s8(a[b].qs), vld1q_s8(a[b].qs + 16));
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum;
	}
	*s = sum;
}

static void NEON_FN(vec_dot_q4_1_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ4_1 *w = vw;
	const BlockQ8_1 *a = va;
	const uint8x16_t m4 = vdupq_n_u8(0xf);
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK4_1; b++) {
		uint8x16_t q = vld1q_u8(w[b].qs);
		int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(q, m4));
		int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
		int isum = dot32(lo, hi, vld1q_s8(a[b].qs), vld1q_s8(a[b].qs + 16));
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum +
		       half_to_f32(w[b].m) * half_to_f32(a[b].s);
	}
	*s = sum;
}

/* The 32 five-bit quants of a Q5 block (nibble | bit j of qh << 4), minus off. */
static inline void q5_decode(const uint8_t *qs, const uint8_t *qh4, int8_t off, int8x16_t *ret_lo,
			     int8x16_t *ret_hi)
{
	uint32_t qh;
	memcpy(&qh, qh4, sizeof(qh));
	uint8x16_t q = vld1q_u8(qs);
	uint8x16_t lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0xf)), bits16(qh, 16));
	uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), bits16(qh >> 16, 16));
	*ret_lo = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(off));
	*ret_hi = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(off));
}

static void NEON_FN(vec_dot_q5_0_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ5_0 *w = vw;
	const BlockQ8_0 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK5_0; b++) {
		int8x16_t lo, hi;
		q5_decode(w[b].qs, w[b].qh, 16, &lo, &hi);
		int isum = dot32(lo, hi, vld1q_s8(a[b].qs), vld1q_s8(a[b].qs + 16));
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum;
	}
	*s = sum;
}

static void NEON_FN(vec_dot_q5_1_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ5_1 *w = vw;
	const BlockQ8_1 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK5_1; b++) {
		int8x16_t lo, hi;
		q5_decode(w[b].qs, w[b].qh, 0, &lo, &hi);
		int isum = dot32(lo, hi, vld1q_s8(a[b].qs), vld1q_s8(a[b].qs + 16));
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum +
		       half_to_f32(w[b].m) * half_to_f32(a[b].s);
	}
	*s = sum;
}

static void NEON_FN(vec_dot_q8_0_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ8_0 *w = vw;
	const BlockQ8_0 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK8_0; b++) {
		int isum = dot32(vld1q_s8(w[b].qs), vld1q_s8(w[b].qs + 16), vld1q_s8(a[b].qs),
				 vld1q_s8(a[b].qs + 16));
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum;
	}
	*s = sum;
}

/*
 * Q4_K / Q5_K (qh NULL for Q4_K): sub-block 2nn is the low nibbles of
 * qs[32nn .. 32nn + 31], 2nn + 1 the high ones; Q5_K's fifth bit of
 * sub-block 2nn + h is bit 2nn + h of qh[l]. Returns the block's term.
 */
static inline float k45_block(tkv_half d, tkv_half dmin, const uint8_t *scales, const uint8_t *qs,
			      const uint8_t *qh, const BlockQ8_K *a)
{
	const uint8x16_t m4 = vdupq_n_u8(0xf);
	uint8x16_t h0 = vdupq_n_u8(0), h1 = h0;
	if (qh) {
		h0 = vld1q_u8(qh);
		h1 = vld1q_u8(qh + 16);
	}
	int isum = 0, msum = 0;
	for (int nn = 0; nn < 4; nn++) {
		uint8x16_t q0 = vld1q_u8(qs + 32 * nn), q1 = vld1q_u8(qs + 32 * nn + 16);
		uint8x16_t l0 = vandq_u8(q0, m4), l1 = vandq_u8(q1, m4);
		uint8x16_t u0 = vshrq_n_u8(q0, 4), u1 = vshrq_n_u8(q1, 4);
		if (qh) {
			uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * nn))), bu = vdupq_n_u8((uint8_t)(2u << (2 * nn)));
			l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(h0, bl), vdupq_n_u8(16)));
			l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(h1, bl), vdupq_n_u8(16)));
			u0 = vorrq_u8(u0, vandq_u8(vtstq_u8(h0, bu), vdupq_n_u8(16)));
			u1 = vorrq_u8(u1, vandq_u8(vtstq_u8(h1, bu), vdupq_n_u8(16)));
		}
		const int8_t *aq = a->qs + 64 * nn;
		int slo = dot32(vreinterpretq_s8_u8(l0), vreinterpretq_s8_u8(l1), vld1q_s8(aq), vld1q_s8(aq + 16));
		int shi = dot32(vreinterpretq_s8_u8(u0), vreinterpretq_s8_u8(u1), vld1q_s8(aq + 32),
				vld1q_s8(aq + 48));
		uint8_t sc, m;
		wtype_q4k_scale_min(scales, 2 * nn, &sc, &m);
		isum += sc * slo;
		msum += m * (a->bsums[4 * nn] + a->bsums[4 * nn + 1]);
		wtype_q4k_scale_min(scales, 2 * nn + 1, &sc, &m);
		isum += sc * shi;
		msum += m * (a->bsums[4 * nn + 2] + a->bsums[4 * nn + 3]);
	}
	return a->d * (half_to_f32(d) * (float)isum - half_to_f32(dmin) * (float)msum);
}

static void NEON_FN(vec_dot_q4_K_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ4_K *w = vw;
	const BlockQ8_K *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++)
		sum += k45_block(w[b].d, w[b].dmin, w[b].scales, w[b].qs, NULL, &a[b]);
	*s = sum;
}

static void NEON_FN(vec_dot_q5_K_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ5_K *w = vw;
	const BlockQ8_K *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++)
		sum += k45_block(w[b].d, w[b].dmin, w[b].scales, w[b].qs, w[b].qh, &a[b]);
	*s = sum;
}

/*
 * Q6_K: value 128nn + 32k + l is the low (k < 2) or high (k >= 2) nibble
 * of ql[64nn + l + 32 (k & 1)], with bits 2k..2k+1 of qh[32nn + l] on top,
 * minus 32; 16 sub-blocks of 16 values with int8 scales.
 */
static void NEON_FN(vec_dot_q6_K_)(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ6_K *w = vw;
	const BlockQ8_K *a = va;
	const uint8x16_t m4 = vdupq_n_u8(0xf), m2 = vdupq_n_u8(0x30);
	const int8x16_t k32 = vdupq_n_s8(32);
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		int isum = 0;
		for (int nn = 0; nn < 2; nn++) {
			const uint8_t *ql = w[b].ql + 64 * nn, *qh = w[b].qh + 32 * nn;
			uint8x16_t h[2] = { vld1q_u8(qh), vld1q_u8(qh + 16) };
			for (int k = 0; k < 4; k++)
				for (int half = 0; half < 2; half++) {
					uint8x16_t lb = vld1q_u8(ql + 32 * (k & 1) + 16 * half);
					uint8x16_t lo = k < 2 ? vandq_u8(lb, m4) : vshrq_n_u8(lb, 4);
					/* bits 2k..2k+1 of qh moved to bits 4..5 */
					uint8x16_t hi;
					switch (k) {
					case 0: hi = vshlq_n_u8(h[half], 4); break;
					case 1: hi = vshlq_n_u8(h[half], 2); break;
					case 2: hi = h[half]; break;
					default: hi = vshrq_n_u8(h[half], 2); break;
					}
					int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(hi, m2))), k32);
					int j = 8 * nn + 2 * k + half; /* sub-block of 16: values 16 j .. 16 j + 15 */
					isum += w[b].scales[j] * dot16(q, vld1q_s8(a[b].qs + 16 * j));
				}
		}
		sum += a[b].d * half_to_f32(w[b].d) * (float)isum;
	}
	*s = sum;
}

/* The kernels of this variant; NULL for types without one (F32, F16, BF16, Q2_K, Q3_K). */
static VecDotFn NEON_FN(vec_dot_get_)(uint32_t t)
{
	switch (t) {
	case WTYPE_Q4_0: return NEON_FN(vec_dot_q4_0_);
	case WTYPE_Q4_1: return NEON_FN(vec_dot_q4_1_);
	case WTYPE_Q5_0: return NEON_FN(vec_dot_q5_0_);
	case WTYPE_Q5_1: return NEON_FN(vec_dot_q5_1_);
	case WTYPE_Q8_0: return NEON_FN(vec_dot_q8_0_);
	case WTYPE_Q4_K: return NEON_FN(vec_dot_q4_K_);
	case WTYPE_Q5_K: return NEON_FN(vec_dot_q5_K_);
	case WTYPE_Q6_K: return NEON_FN(vec_dot_q6_K_);
	default: return NULL;
	}
}

/*
 * Repacked Q4_K (layout X4, repack.h): each row's blocks read in place
 * (row i's block b at group[4 b + i]), summed in chunks of 64 blocks as
 * repack_tile_q4_K_ref's row kernel calls sum them: its floats exactly.
 */
static void NEON_FN(repack_tile_q4_K_)(int64_t n, const void *group, const void *act, size_t a_stride, int nt,
				       float *y, size_t y_stride)
{
	const BlockQ4_K *g = group;
	int64_t nb = n / QK_K;

	for (int i = 0; i < REPACK_GROUP; i++)
		for (int t = 0; t < nt; t++) {
			const BlockQ8_K *a = (const BlockQ8_K *)((const char *)act + (size_t)t * a_stride);
			float *out = &y[(size_t)t * y_stride + (size_t)i];
			for (int64_t b0 = 0; b0 < nb; b0 += 64) {
				int64_t k = nb - b0 < 64 ? nb - b0 : 64;
				float sum = 0.0f;
				for (int64_t b = b0; b < b0 + k; b++) {
					const BlockQ4_K *w = &g[b * REPACK_GROUP + i];
					sum += k45_block(w->d, w->dmin, w->scales, w->qs, NULL, &a[b]);
				}
				*out = b0 ? *out + sum : sum;
			}
		}
}

static RepackTileFn NEON_FN(repack_tile_get_)(uint32_t t)
{
	return t == WTYPE_Q4_K ? NEON_FN(repack_tile_q4_K_) : NULL;
}
