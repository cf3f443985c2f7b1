/*
 * vec_dot_ref.c: scalar reference dot products, one per weight type.
 *
 * These define what the fast kernels must compute: for quantized types
 * the exact integer sum of weight quants times activation quants per
 * (sub-)block, scaled by the block scales in float, as ggml's generic
 * kernels do. K-quant blocks are decoded to plain integers first
 * (k_decode_*), so the bit layouts are spelled out once, readably.
 */
#include <string.h>

#include "kernels/cpu/vec_dot.h"

void vec_dot_f32_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const float *w = vw, *a = va;
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)w[i] * (double)a[i];
	*s = (float)sum;
}

void vec_dot_f16_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const tkv_half *w = vw;
	const float *a = va;
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)half_to_f32(w[i]) * (double)a[i];
	*s = (float)sum;
}

void vec_dot_bf16_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const tkv_bf16 *w = vw;
	const float *a = va;
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)bf16_to_f32(w[i]) * (double)a[i];
	*s = (float)sum;
}

/* Q4_0 (x = d * (q - 8)) . Q8_0 */
void vec_dot_q4_0_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ4_0 *w = vw;
	const BlockQ8_0 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK4_0; b++) {
		int isum = 0;
		for (int j = 0; j < QK4_0 / 2; j++) {
			isum += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j];
			isum += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
		}
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum;
	}
	*s = sum;
}

/* Q4_1 (x = d * q + m) . Q8_1: the m term uses the block sum s = d_a * sum(q_a). */
void vec_dot_q4_1_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ4_1 *w = vw;
	const BlockQ8_1 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK4_1; b++) {
		int isum = 0;
		for (int j = 0; j < QK4_1 / 2; j++) {
			isum += (w[b].qs[j] & 0xF) * a[b].qs[j];
			isum += (w[b].qs[j] >> 4) * a[b].qs[j + 16];
		}
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum +
		       half_to_f32(w[b].m) * half_to_f32(a[b].s);
	}
	*s = sum;
}

/* The 5-bit quants of a Q5 block: nibble plus bit j of qh as bit 4. */
static inline int q5_value(const uint8_t *qs, uint32_t qh, int j)
{
	int nib = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
	return nib | (int)(((qh >> j) & 1) << 4);
}

void vec_dot_q5_0_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ5_0 *w = vw;
	const BlockQ8_0 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK5_0; b++) {
		uint32_t qh;
		memcpy(&qh, w[b].qh, sizeof(qh));
		int isum = 0;
		for (int j = 0; j < QK5_0; j++)
			isum += (q5_value(w[b].qs, qh, j) - 16) * a[b].qs[j];
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum;
	}
	*s = sum;
}

void vec_dot_q5_1_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ5_1 *w = vw;
	const BlockQ8_1 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK5_1; b++) {
		uint32_t qh;
		memcpy(&qh, w[b].qh, sizeof(qh));
		int isum = 0;
		for (int j = 0; j < QK5_1; j++)
			isum += q5_value(w[b].qs, qh, j) * a[b].qs[j];
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum +
		       half_to_f32(w[b].m) * half_to_f32(a[b].s);
	}
	*s = sum;
}

void vec_dot_q8_0_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ8_0 *w = vw;
	const BlockQ8_0 *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK8_0; b++) {
		int isum = 0;
		for (int j = 0; j < QK8_0; j++)
			isum += w[b].qs[j] * a[b].qs[j];
		sum += half_to_f32(w[b].d) * half_to_f32(a[b].d) * (float)isum;
	}
	*s = sum;
}

/* sum_j q[j] * a[j] over 16 or 32 values. */
static inline int isum_range(const int8_t *q, const int8_t *a, int len)
{
	int isum = 0;
	for (int j = 0; j < len; j++)
		isum += q[j] * a[j];
	return isum;
}

/* Q2_K: value 128n + 32k + l is bits 2k..2k+1 of qs[32n + l]. */
static void k_decode_q2(const BlockQ2_K *w, int8_t q[QK_K])
{
	for (int v = 0; v < QK_K; v++) {
		int nn = v / 128, k = (v % 128) / 32, l = v % 32;
		q[v] = (int8_t)((w->qs[32 * nn + l] >> (2 * k)) & 3);
	}
}

/* Q3_K: low bits as Q2_K; bit 4n + k of hmask[l] set means +0, clear -4. */
static void k_decode_q3(const BlockQ3_K *w, int8_t q[QK_K])
{
	for (int v = 0; v < QK_K; v++) {
		int nn = v / 128, k = (v % 128) / 32, l = v % 32;
		int lo = (w->qs[32 * nn + l] >> (2 * k)) & 3;
		int hi = (w->hmask[l] >> (4 * nn + k)) & 1;
		q[v] = (int8_t)(lo - (hi ? 0 : 4));
	}
}

/* Q4_K/Q5_K: value 64n + l is the low nibble of qs[32n + l], 64n + 32 + l
 * the high one; Q5_K's fifth bit of value 64n + 32h + l is bit 2n + h of
 * qh[l]. */
static void k_decode_q45(const uint8_t *qs, const uint8_t *qh, int8_t q[QK_K])
{
	for (int v = 0; v < QK_K; v++) {
		int nn = v / 64, h = (v % 64) / 32, l = v % 32;
		int x = h ? qs[32 * nn + l] >> 4 : qs[32 * nn + l] & 0xF;
		if (qh)
			x |= ((qh[l] >> (2 * nn + h)) & 1) << 4;
		q[v] = (int8_t)x;
	}
}

/* Q6_K: value 128n + 32k + l: low nibble of ql[64n + l + 32 (k & 1)] (high
 * nibble for k >= 2), bits 2k..2k+1 of qh[32n + l] on top, minus 32. */
static void k_decode_q6(const BlockQ6_K *w, int8_t q[QK_K])
{
	for (int v = 0; v < QK_K; v++) {
		int nn = v / 128, k = (v % 128) / 32, l = v % 32;
		uint8_t lb = w->ql[64 * nn + l + 32 * (k & 1)];
		int lo = k < 2 ? lb & 0xF : lb >> 4;
		int hi = (w->qh[32 * nn + l] >> (2 * k)) & 3;
		q[v] = (int8_t)((lo | (hi << 4)) - 32);
	}
}

void vec_dot_q2_K_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ2_K *w = vw;
	const BlockQ8_K *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		int8_t q[QK_K];
		int isum = 0, msum = 0;
		k_decode_q2(&w[b], q);
		for (int j = 0; j < QK_K / 16; j++) {
			isum += (w[b].scales[j] & 0xF) * isum_range(q + 16 * j, a[b].qs + 16 * j, 16);
			msum += (w[b].scales[j] >> 4) * a[b].bsums[j];
		}
		sum += a[b].d * (half_to_f32(w[b].d) * (float)isum - half_to_f32(w[b].dmin) * (float)msum);
	}
	*s = sum;
}

void vec_dot_q3_K_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ3_K *w = vw;
	const BlockQ8_K *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		int8_t q[QK_K], sc[16];
		int isum = 0;
		k_decode_q3(&w[b], q);
		vec_dot_k3_scales(w[b].scales, sc);
		for (int j = 0; j < QK_K / 16; j++)
			isum += sc[j] * isum_range(q + 16 * j, a[b].qs + 16 * j, 16);
		sum += a[b].d * half_to_f32(w[b].d) * (float)isum;
	}
	*s = sum;
}

/* Q4_K and Q5_K share scales and mins: 8 sub-blocks of 32. */
static float k_dot_q45(tkv_half d, tkv_half dmin, const uint8_t *scales, const int8_t *q,
		       const BlockQ8_K *a)
{
	int isum = 0, msum = 0;
	for (int j = 0; j < QK_K / 32; j++) {
		uint8_t sc, m;
		wtype_q4k_scale_min(scales, j, &sc, &m);
		isum += sc * isum_range(q + 32 * j, a->qs + 32 * j, 32);
		msum += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
	}
	return a->d * (half_to_f32(d) * (float)isum - half_to_f32(dmin) * (float)msum);
}

void vec_dot_q4_K_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ4_K *w = vw;
	const BlockQ8_K *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		int8_t q[QK_K];
		k_decode_q45(w[b].qs, NULL, q);
		sum += k_dot_q45(w[b].d, w[b].dmin, w[b].scales, q, &a[b]);
	}
	*s = sum;
}

void vec_dot_q5_K_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ5_K *w = vw;
	const BlockQ8_K *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		int8_t q[QK_K];
		k_decode_q45(w[b].qs, w[b].qh, q);
		sum += k_dot_q45(w[b].d, w[b].dmin, w[b].scales, q, &a[b]);
	}
	*s = sum;
}

void vec_dot_q6_K_ref(int64_t n, float *s, const void *vw, const void *va)
{
	const BlockQ6_K *w = vw;
	const BlockQ8_K *a = va;
	float sum = 0.0f;
	for (int64_t b = 0; b < n / QK_K; b++) {
		int8_t q[QK_K];
		int isum = 0;
		k_decode_q6(&w[b], q);
		for (int j = 0; j < QK_K / 16; j++)
			isum += w[b].scales[j] * isum_range(q + 16 * j, a[b].qs + 16 * j, 16);
		sum += a[b].d * half_to_f32(w[b].d) * (float)isum;
	}
	*s = sum;
}

VecDotFn vec_dot_ref_get(uint32_t t)
{
	switch (t) {
	case WTYPE_F32: return vec_dot_f32_ref;
	case WTYPE_F16: return vec_dot_f16_ref;
	case WTYPE_BF16: return vec_dot_bf16_ref;
	case WTYPE_Q4_0: return vec_dot_q4_0_ref;
	case WTYPE_Q4_1: return vec_dot_q4_1_ref;
	case WTYPE_Q5_0: return vec_dot_q5_0_ref;
	case WTYPE_Q5_1: return vec_dot_q5_1_ref;
	case WTYPE_Q8_0: return vec_dot_q8_0_ref;
	case WTYPE_Q2_K: return vec_dot_q2_K_ref;
	case WTYPE_Q3_K: return vec_dot_q3_K_ref;
	case WTYPE_Q4_K: return vec_dot_q4_K_ref;
	case WTYPE_Q5_K: return vec_dot_q5_K_ref;
	case WTYPE_Q6_K: return vec_dot_q6_K_ref;
	default: return NULL;
	}
}
