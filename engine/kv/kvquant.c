/*
 * kvquant.c: scalar references for the f32, f16, q8_0 and q4_0 KV types
 * and their +h variants (see kvquant.h). The quantizers follow ggml's
 * reference quantizers operation for operation (x * (1 / s), not x / s;
 * roundf; the int8 truncation of q4_0), which is what makes the blocks
 * byte-identical; the build uses ISO C (no FP contraction).
 */
#include "engine/kv/kvquant.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "engine/codec/rotation.h"
#include "kernels/cpu/quant_act.h"
#include "kernels/cpu/vec_f32.h"
#include "kernels/wtype.h"

#define KVQUANT_MAX_DIM TQ_MAX_DIM

/*
 * (int)v truncated toward zero, clamped to [lo, hi]; NaN gives 0. Inside
 * the range this is ggml's cast; outside it ggml's cast is undefined
 * (a scale that underflows makes 1 / s infinite), ours saturates.
 */
static int clamp_trunc(float v, float lo, float hi)
{
	if (v >= hi)
		return (int)hi;
	if (v <= lo)
		return (int)lo;
	return v == v ? (int)v : 0;
}

/* ---- q8_0 ---- */

/* ggml's q8_0 reference quantizer: the one activations use (kernels/cpu/quant_act.h). */
void kvquant_quantize_q8_0(const float *x, int d, BlockQ8_0 *ret)
{
	assert(d % QK8_0 == 0);
	quant_act_q8_0_ref(x, ret, d);
}

void kvquant_dequantize_q8_0(const BlockQ8_0 *blk, int d, float *ret)
{
	wtype_dequantize_row(WTYPE_Q8_0, blk, ret, d);
}

float kvquant_score_q8_0(const float *q, const BlockQ8_0 *k, int d)
{
	float sum = 0.0f;
	for (int b = 0; b < d / QK8_0; b++) {
		const float *qb = q + b * QK8_0;
		float acc = 0.0f;
		for (int j = 0; j < QK8_0; j++)
			acc += qb[j] * (float)k[b].qs[j];
		sum += half_to_f32(k[b].d) * acc;
	}
	return sum;
}

void kvquant_axpy_q8_0(float a, const BlockQ8_0 *v, int d, float *acc)
{
	for (int b = 0; b < d / QK8_0; b++) {
		const float as = a * half_to_f32(v[b].d);
		float *ab = acc + b * QK8_0;
		for (int j = 0; j < QK8_0; j++)
			ab[j] += as * (float)v[b].qs[j];
	}
}

/* ---- q4_0 ---- */

void kvquant_quantize_q4_0(const float *x, int d, BlockQ4_0 *ret)
{
	assert(d % QK4_0 == 0);
	for (int b = 0; b < d / QK4_0; b++) {
		const float *xb = x + b * QK4_0;
		float amax = 0.0f, max = 0.0f;
		for (int j = 0; j < QK4_0; j++) {
			if (amax < fabsf(xb[j])) { /* strict: the first on ties */
				amax = fabsf(xb[j]);
				max = xb[j];
			}
		}
		const float s = max / -8.0f;
		const float inv = s != 0.0f ? 1.0f / s : 0.0f;
		ret[b].d = f32_to_half(s);
		for (int j = 0; j < QK4_0 / 2; j++) {
			const float x0 = xb[j] * inv;
			const float x1 = xb[j + QK4_0 / 2] * inv;
			const uint8_t q0 = (uint8_t)clamp_trunc(x0 + 8.5f, 0.0f, 15.0f);
			const uint8_t q1 = (uint8_t)clamp_trunc(x1 + 8.5f, 0.0f, 15.0f);
			ret[b].qs[j] = (uint8_t)(q0 | q1 << 4);
		}
	}
}

void kvquant_dequantize_q4_0(const BlockQ4_0 *blk, int d, float *ret)
{
	wtype_dequantize_row(WTYPE_Q4_0, blk, ret, d);
}

float kvquant_score_q4_0(const float *q, const BlockQ4_0 *k, int d)
{
	float sum = 0.0f;
	for (int b = 0; b < d / QK4_0; b++) {
		const float *qb = q + b * QK4_0;
		float acc = 0.0f;
		for (int j = 0; j < QK4_0 / 2; j++) {
			acc += qb[j] * (float)((k[b].qs[j] & 0x0f) - 8);
			acc += qb[j + QK4_0 / 2] * (float)((k[b].qs[j] >> 4) - 8);
		}
		sum += half_to_f32(k[b].d) * acc;
	}
	return sum;
}

void kvquant_axpy_q4_0(float a, const BlockQ4_0 *v, int d, float *acc)
{
	for (int b = 0; b < d / QK4_0; b++) {
		const float as = a * half_to_f32(v[b].d);
		float *ab = acc + b * QK4_0;
		for (int j = 0; j < QK4_0 / 2; j++) {
			ab[j] += as * (float)((v[b].qs[j] & 0x0f) - 8);
			ab[j + QK4_0 / 2] += as * (float)((v[b].qs[j] >> 4) - 8);
		}
	}
}

/* ---- f16, f32 ---- */

void kvquant_quantize_f16(const float *x, int d, tkv_half *ret)
{
	for (int i = 0; i < d; i++)
		ret[i] = f32_to_half(x[i]);
}

void kvquant_dequantize_f16(const tkv_half *h, int d, float *ret)
{
	wtype_dequantize_row(WTYPE_F16, h, ret, d);
}

float kvquant_score_f16(const float *q, const tkv_half *k, int d)
{
	float acc = 0.0f;
	for (int i = 0; i < d; i++)
		acc += q[i] * half_to_f32(k[i]);
	return acc;
}

void kvquant_axpy_f16(float a, const tkv_half *v, int d, float *acc)
{
	for (int i = 0; i < d; i++)
		acc[i] += a * half_to_f32(v[i]);
}

/* f32 rows use the dispatched (AVX2 where available) vector primitives. */
float kvquant_score_f32(const float *q, const float *k, int d)
{
	return vec_f32_dot(d, q, k);
}

void kvquant_axpy_f32(float a, const float *v, int d, float *acc)
{
	vec_f32_axpy(d, a, v, acc);
}

/* ---- +h ---- */

void kvquant_hadamard(float *x, int d)
{
	assert(d > 0 && (d & (d - 1)) == 0);
	fwht(x, d);
	const float scale = (float)(1.0 / sqrt((double)d));
	for (int i = 0; i < d; i++)
		x[i] *= scale;
}

/* ---- by KvType ---- */

bool kvquant_supports(const KvType *t)
{
	return t->format != KV_FORMAT_TQ && t->format != KV_FORMAT_PK && t->format != KV_FORMAT_PQ;
}

/* x (dim,) -> stored, no rotation. */
static void store_plain(const KvType *t, const float *x, void *ret)
{
	switch (t->format) {
	case KV_FORMAT_F32:
		memcpy(ret, x, (size_t)t->dim * sizeof(float));
		return;
	case KV_FORMAT_F16:
		kvquant_quantize_f16(x, t->dim, ret);
		return;
	case KV_FORMAT_Q8_0:
		kvquant_quantize_q8_0(x, t->dim, ret);
		return;
	case KV_FORMAT_Q4_0:
		kvquant_quantize_q4_0(x, t->dim, ret);
		return;
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK:
	case KV_FORMAT_PQ:
		break;
	}
	assert(!"kvquant: not a block type");
}

void kvquant_store(const KvType *t, const float *x, void *ret)
{
	float tmp[KVQUANT_MAX_DIM];

	assert(kvquant_supports(t) && t->dim <= KVQUANT_MAX_DIM);
	if (!t->hadamard) {
		store_plain(t, x, ret);
		return;
	}
	memcpy(tmp, x, (size_t)t->dim * sizeof(float));
	kvquant_hadamard(tmp, t->dim);
	store_plain(t, tmp, ret);
}

void kvquant_load(const KvType *t, const void *stored, float *ret)
{
	assert(kvquant_supports(t));
	switch (t->format) {
	case KV_FORMAT_F32:
		memcpy(ret, stored, (size_t)t->dim * sizeof(float));
		break;
	case KV_FORMAT_F16:
		kvquant_dequantize_f16(stored, t->dim, ret);
		break;
	case KV_FORMAT_Q8_0:
		kvquant_dequantize_q8_0(stored, t->dim, ret);
		break;
	case KV_FORMAT_Q4_0:
		kvquant_dequantize_q4_0(stored, t->dim, ret);
		break;
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK:
	case KV_FORMAT_PQ:
		return;
	}
	if (t->hadamard)
		kvquant_hadamard(ret, t->dim);
}

void kvquant_query_prepare(const KvType *t, const float *q, float *ret)
{
	if (ret != q)
		memmove(ret, q, (size_t)t->dim * sizeof(float));
	if (t->hadamard)
		kvquant_hadamard(ret, t->dim);
}

float kvquant_score(const KvType *t, const float *q_prepared, const void *k)
{
	switch (t->format) {
	case KV_FORMAT_F32:
		return kvquant_score_f32(q_prepared, k, t->dim);
	case KV_FORMAT_F16:
		return kvquant_score_f16(q_prepared, k, t->dim);
	case KV_FORMAT_Q8_0:
		return kvquant_score_q8_0(q_prepared, k, t->dim);
	case KV_FORMAT_Q4_0:
		return kvquant_score_q4_0(q_prepared, k, t->dim);
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK:
	case KV_FORMAT_PQ:
		break;
	}
	assert(!"kvquant: not a block type");
	return 0.0f;
}

void kvquant_axpy(const KvType *t, float a, const void *v, float *acc)
{
	switch (t->format) {
	case KV_FORMAT_F32:
		kvquant_axpy_f32(a, v, t->dim, acc);
		return;
	case KV_FORMAT_F16:
		kvquant_axpy_f16(a, v, t->dim, acc);
		return;
	case KV_FORMAT_Q8_0:
		kvquant_axpy_q8_0(a, v, t->dim, acc);
		return;
	case KV_FORMAT_Q4_0:
		kvquant_axpy_q4_0(a, v, t->dim, acc);
		return;
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK:
	case KV_FORMAT_PQ:
		break;
	}
	assert(!"kvquant: not a block type");
}

void kvquant_output_finish(const KvType *t, float *acc)
{
	if (t->hadamard)
		kvquant_hadamard(acc, t->dim);
}
