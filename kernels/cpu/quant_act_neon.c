/*
 * quant_act_neon.c: NEON activation quantizers (aarch64 builds; NEON is in
 * every aarch64 CPU). They write the references' bytes (quant_act.c):
 *
 *   amax     FMAXNM over |x|: like fmaxf, a NaN lane is ignored (max is
 *            exact in any order)
 *   roundf   FCVTAS (nearest, ties away from zero; NaN -> 0, saturating),
 *            then the reference's clamp to +-127
 *   ties-to-even (Q8_K) FCVTNS, which is ggml's nearest_int for |v| < 2^22
 *            (a NaN input gives 0; the reference's bit trick gives a value
 *            that depends on the NaN's payload)
 *   scales   the references' scalar float expressions, unchanged
 *
 * x (n,) -> y (n / 32 or n / 256 blocks), as quant_act.h states.
 */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/quant_act.h"

/* max |x[i]| over 32 values (NaN ignored unless all are NaN). */
static inline float amax32(const float *x)
{
	float32x4_t m = vabsq_f32(vld1q_f32(x));
	for (int j = 4; j < 32; j += 4)
		m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
	return vmaxnmvq_f32(m);
}

/* x[0..31] * id rounded as the references do, as 32 int8. clamp: to +-127 (Q8_0) or not (Q8_1). */
static inline void round32(const float *x, float id, bool clamp, int8_t *q)
{
	for (int j = 0; j < 32; j += 8) {
		int32x4_t a = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + j), id));
		int32x4_t b = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4), id));
		if (clamp) {
			a = vmaxq_s32(vminq_s32(a, vdupq_n_s32(127)), vdupq_n_s32(-127));
			b = vmaxq_s32(vminq_s32(b, vdupq_n_s32(127)), vdupq_n_s32(-127));
		}
		/* truncating narrows, as the C cast to int8_t of the reference does */
		int16x8_t h = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
		vst1_s8(q + j, vmovn_s16(h));
	}
}

void quant_act_q8_0_neon(const float *x, BlockQ8_0 *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
		float amax = fmaxf(0.0f, amax32(x));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = f32_to_half(d);
		round32(x, id, true, y[i].qs);
	}
}

void quant_act_q8_1_neon(const float *x, BlockQ8_1 *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
		float amax = fmaxf(0.0f, amax32(x));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = f32_to_half(d);
		round32(x, id, false, y[i].qs);
		int sum = vaddlvq_s8(vld1q_s8(y[i].qs)) + vaddlvq_s8(vld1q_s8(y[i].qs + 16));
		y[i].s = f32_to_half((float)sum * d);
	}
}

void quant_act_q8_K_neon(const float *x, BlockQ8_K *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float32x4_t m = vabsq_f32(vld1q_f32(x));
		for (int j = 4; j < QK_K; j += 4)
			m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
		float amax = vmaxnmvq_f32(m);
		/* the reference keeps amax 0 when no |x| exceeds it (all zero or NaN) */
		if (!(amax > 0.0f)) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		/* the first value of that magnitude sets the sign, as in the reference */
		float max = 0.0f;
		for (int j = 0; j < QK_K; j++)
			if (fabsf(x[j]) == amax) {
				max = x[j];
				break;
			}
		float iscale = -127.0f / max;
		for (int j = 0; j < QK_K; j += 8) {
			int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j), iscale));
			int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4), iscale));
			a = vminq_s32(a, vdupq_n_s32(127));
			b = vminq_s32(b, vdupq_n_s32(127));
			vst1_s8(y[i].qs + j, vmovn_s16(vcombine_s16(vmovn_s32(a), vmovn_s32(b))));
		}
		for (int j = 0; j < QK_K / 16; j++)
			y[i].bsums[j] = (int16_t)vaddlvq_s8(vld1q_s8(y[i].qs + 16 * j));
		y[i].d = 1.0f / iscale;
	}
}
