/*
 * vec_f32_neon.c: NEON f32 primitives (aarch64 builds). The dot product
 * sums in four fused lanes (order and rounding differ from the reference);
 * axpy multiplies then adds, unfused, lane by lane: the reference's floats.
 */
#include <arm_neon.h>

#include "kernels/cpu/vec_f32.h"

float vec_f32_dot_neon(int64_t n, const float *a, const float *b)
{
	float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
		acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
		acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
		acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
	}
	for (; i + 4 <= n; i += 4)
		acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
	float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

void vec_f32_axpy_neon(int64_t n, float alpha, const float *x, float *y)
{
	int64_t i = 0;
	for (; i + 4 <= n; i += 4)
		vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(vld1q_f32(x + i), alpha)));
	for (; i < n; i++)
		y[i] += alpha * x[i];
}
