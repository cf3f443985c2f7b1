/*
 * quant_act.c: scalar reference activation quantizers (ggml's _ref
 * semantics, see quant_act.h) and the per-row dispatcher.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quant_act.h"

/*
 * roundf(v) as int8, as ggml casts it; saturating where ggml's cast is
 * undefined (NaN, or |v| > 127 when a subnormal scale makes 1/d huge), so
 * a stray value in a KV row cannot invoke UB.
 */
static int8_t q8_round(float v)
{
	if (!(v == v))
		return 0;
	v = roundf(v);
	return (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
}

void quant_act_q8_0_ref(const float *x, BlockQ8_0 *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
		float amax = 0.0f;
		for (int j = 0; j < QK8_0; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = f32_to_half(d);
		for (int j = 0; j < QK8_0; j++)
			y[i].qs[j] = q8_round(x[j] * id);
	}
}

void quant_act_q8_1_ref(const float *x, BlockQ8_1 *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
		float amax = 0.0f;
		for (int j = 0; j < QK8_1; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		int sum = 0;
		y[i].d = f32_to_half(d);
		for (int j = 0; j < QK8_1; j++) {
			y[i].qs[j] = (int8_t)roundf(x[j] * id);
			sum += y[i].qs[j];
		}
		y[i].s = f32_to_half((float)sum * d);
	}
}

/* Round to nearest, ties to even, for |v| < 2^22 (ggml's nearest_int). */
static inline int round_even(float v)
{
	float t = v + 12582912.0f; /* 1.5 * 2^23: the integer lands in the mantissa */
	int32_t i;
	memcpy(&i, &t, sizeof(i));
	return (i & 0x007fffff) - 0x00400000;
}

void quant_act_q8_K_ref(const float *x, BlockQ8_K *y, int64_t n)
{
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float max = 0.0f, amax = 0.0f;
		for (int j = 0; j < QK_K; j++) {
			float ax = fabsf(x[j]);
			if (ax > amax) {
				amax = ax;
				max = x[j];
			}
		}
		if (amax == 0.0f) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		float iscale = -127.0f / max;
		for (int j = 0; j < QK_K; j++) {
			int v = round_even(iscale * x[j]);
			y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
		}
		for (int j = 0; j < QK_K / 16; j++) {
			int sum = 0;
			for (int k = 0; k < 16; k++)
				sum += y[i].qs[16 * j + k];
			y[i].bsums[j] = (int16_t)sum;
		}
		y[i].d = 1.0f / iscale;
	}
}

int quant_act_type_for(uint32_t wtype)
{
	switch (wtype) {
	case WTYPE_F32:
	case WTYPE_F16:
	case WTYPE_BF16:
		return WTYPE_F32;
	case WTYPE_Q4_0:
	case WTYPE_Q5_0:
	case WTYPE_Q8_0:
		return WTYPE_Q8_0;
	case WTYPE_Q4_1:
	case WTYPE_Q5_1:
		return WTYPE_Q8_1;
	case WTYPE_Q2_K:
	case WTYPE_Q3_K:
	case WTYPE_Q4_K:
	case WTYPE_Q5_K:
	case WTYPE_Q6_K:
		return WTYPE_Q8_K;
	default:
		return -1;
	}
}

void quant_act_scales(uint32_t act_type, const void *y, float *ret_scales, int64_t n)
{
	if (act_type == WTYPE_Q8_1) {
		const BlockQ8_1 *b = y;
		for (int64_t i = 0; i < n / QK8_1; i++) {
			ret_scales[2 * i] = half_to_f32(b[i].d);
			ret_scales[2 * i + 1] = half_to_f32(b[i].s);
		}
	} else {
		const BlockQ8_0 *b = y;
		assert(act_type == WTYPE_Q8_0);
		for (int64_t i = 0; i < n / QK8_0; i++) {
			int sum = 0;
			for (int j = 0; j < QK8_0; j++)
				sum += b[i].qs[j];
			ret_scales[2 * i] = half_to_f32(b[i].d);
			ret_scales[2 * i + 1] = half_to_f32(b[i].d) * (float)sum;
		}
	}
}

/* The SIMD quantizers of this build's kernel set (none: the references). */
#if defined(CPU_KERNELS_X86)
#define QUANT_SIMD(name) quant_act_##name##_avx2
#elif defined(CPU_KERNELS_NEON)
#define QUANT_SIMD(name) quant_act_##name##_neon
#else
#define QUANT_SIMD(name) quant_act_##name##_ref
#endif

void quant_act_row(uint32_t act_type, const float *x, void *y, int64_t n, bool simd)
{
	switch (act_type) {
	case WTYPE_F32:
		memcpy(y, x, (size_t)n * sizeof(float));
		break;
	case WTYPE_Q8_0:
		if (simd)
			QUANT_SIMD(q8_0)(x, y, n);
		else
			quant_act_q8_0_ref(x, y, n);
		break;
	case WTYPE_Q8_1:
		if (simd)
			QUANT_SIMD(q8_1)(x, y, n);
		else
			quant_act_q8_1_ref(x, y, n);
		break;
	case WTYPE_Q8_K:
		if (simd)
			QUANT_SIMD(q8_K)(x, y, n);
		else
			quant_act_q8_K_ref(x, y, n);
		break;
	default:
		assert(!"quant_act_row: not an activation type");
	}
}
