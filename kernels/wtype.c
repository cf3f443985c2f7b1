/*
 * wtype.c: the weight type table and scalar reference dequantization.
 *
 * Owns: names and block sizes of the ggml types we read, row sizes, and
 * the plain-C dequantizers every fast kernel is tested against. Does not
 * own quantization (kernels/cpu/quant_act.c quantizes activations) or dot
 * products.
 *
 * The math and the order of float operations follow ggml's scalar
 * dequantize_row_*() exactly, so results are bit-identical to ggml. Each
 * product is stored in a named float before a min is subtracted: C only
 * contracts a*b - c into an FMA within one expression, and an FMA would
 * round differently.
 */
#include <assert.h>
#include <string.h>

#include "base/util.h"
#include "kernels/wtype.h"

#define TYPE(t, n, e, b) [t] = { .name = (n), .block_elems = (e), .block_bytes = (b) }

static const WTypeInfo wtype_table[WTYPE_COUNT_] = {
	TYPE(WTYPE_F32, "F32", 1, 4),
	TYPE(WTYPE_F16, "F16", 1, 2),
	TYPE(WTYPE_BF16, "BF16", 1, 2),
	TYPE(WTYPE_Q4_0, "Q4_0", QK4_0, sizeof(BlockQ4_0)),
	TYPE(WTYPE_Q4_1, "Q4_1", QK4_1, sizeof(BlockQ4_1)),
	TYPE(WTYPE_Q5_0, "Q5_0", QK5_0, sizeof(BlockQ5_0)),
	TYPE(WTYPE_Q5_1, "Q5_1", QK5_1, sizeof(BlockQ5_1)),
	TYPE(WTYPE_Q8_0, "Q8_0", QK8_0, sizeof(BlockQ8_0)),
	TYPE(WTYPE_Q8_1, "Q8_1", QK8_1, sizeof(BlockQ8_1)),
	TYPE(WTYPE_Q2_K, "Q2_K", QK_K, sizeof(BlockQ2_K)),
	TYPE(WTYPE_Q3_K, "Q3_K", QK_K, sizeof(BlockQ3_K)),
	TYPE(WTYPE_Q4_K, "Q4_K", QK_K, sizeof(BlockQ4_K)),
	TYPE(WTYPE_Q5_K, "Q5_K", QK_K, sizeof(BlockQ5_K)),
	TYPE(WTYPE_Q6_K, "Q6_K", QK_K, sizeof(BlockQ6_K)),
	TYPE(WTYPE_Q8_K, "Q8_K", QK_K, sizeof(BlockQ8_K)),
};

#undef TYPE

const WTypeInfo *wtype_info(uint32_t t)
{
	if (t >= ARRAY_SIZE(wtype_table) || !wtype_table[t].name)
		return NULL;
	return &wtype_table[t];
}

bool wtype_is_supported(uint32_t t)
{
	/* Q8_1 and Q8_K only ever hold quantized activations. */
	return wtype_info(t) && t != WTYPE_Q8_1 && t != WTYPE_Q8_K;
}

const char *wtype_name(uint32_t t)
{
	const WTypeInfo *info = wtype_info(t);
	return info ? info->name : "unknown";
}

size_t wtype_row_bytes(uint32_t t, uint64_t n)
{
	const WTypeInfo *info = wtype_info(t);
	if (!info || n % info->block_elems != 0)
		return 0;
	uint64_t blocks = n / info->block_elems;
	if (blocks > SIZE_MAX / info->block_bytes)
		return 0;
	return (size_t)blocks * info->block_bytes;
}

/* Little-endian 32-bit load, independent of host byte order. */
static uint32_t load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* x (nb, 32) -> y (nb * 32): y = d * (q - 8) */
static void dequant_q4_0(const BlockQ4_0 *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, y += QK4_0) {
		const float d = half_to_f32(x[i].d);
		for (int j = 0; j < QK4_0 / 2; j++) {
			y[j] = (float)((x[i].qs[j] & 0xf) - 8) * d;
			y[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
		}
	}
}

/* y = d * q + m */
static void dequant_q4_1(const BlockQ4_1 *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, y += QK4_1) {
		const float d = half_to_f32(x[i].d);
		const float m = half_to_f32(x[i].m);
		for (int j = 0; j < QK4_1 / 2; j++) {
			const float p0 = (float)(x[i].qs[j] & 0xf) * d;
			const float p1 = (float)(x[i].qs[j] >> 4) * d;
			y[j] = p0 + m;
			y[j + QK4_1 / 2] = p1 + m;
		}
	}
}

/* Fifth bit of value j: bit j of qh. */
static int q5_high(uint32_t qh, int j)
{
	return (int)((qh >> j) & 1) << 4;
}

/* y = d * (q - 16) */
static void dequant_q5_0(const BlockQ5_0 *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, y += QK5_0) {
		const float d = half_to_f32(x[i].d);
		const uint32_t qh = load_le32(x[i].qh);
		for (int j = 0; j < QK5_0 / 2; j++) {
			const int q0 = (x[i].qs[j] & 0xf) | q5_high(qh, j);
			const int q1 = (x[i].qs[j] >> 4) | q5_high(qh, j + QK5_0 / 2);
			y[j] = (float)(q0 - 16) * d;
			y[j + QK5_0 / 2] = (float)(q1 - 16) * d;
		}
	}
}

/* y = d * q + m */
static void dequant_q5_1(const BlockQ5_1 *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, y += QK5_1) {
		const float d = half_to_f32(x[i].d);
		const float m = half_to_f32(x[i].m);
		const uint32_t qh = load_le32(x[i].qh);
		for (int j = 0; j < QK5_1 / 2; j++) {
			const int q0 = (x[i].qs[j] & 0xf) | q5_high(qh, j);
			const int q1 = (x[i].qs[j] >> 4) | q5_high(qh, j + QK5_1 / 2);
			const float p0 = (float)q0 * d;
			const float p1 = (float)q1 * d;
			y[j] = p0 + m;
			y[j + QK5_1 / 2] = p1 + m;
		}
	}
}

/* y = d * q */
static void dequant_q8_0(const BlockQ8_0 *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, y += QK8_0) {
		const float d = half_to_f32(x[i].d);
		for (int j = 0; j < QK8_0; j++)
			y[j] = (float)x[i].qs[j] * d;
	}
}

/* y = d * q; s is redundant for dequantization. ggml has no such function. */
static void dequant_q8_1(const BlockQ8_1 *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++, y += QK8_1) {
		const float d = half_to_f32(x[i].d);
		for (int j = 0; j < QK8_1; j++)
			y[j] = (float)x[i].qs[j] * d;
	}
}

/*
 * Q2_K: value e (0..255) of a super-block is 2-bit field e/32 % 4 of byte
 * 32 * (e/128) + e%32; its 16-value sub-block e/16 has scale byte
 * scales[e/16] (low nibble: scale, high nibble: min).
 * y = d * sc * q - dmin * m
 */
static void dequant_q2_k(const BlockQ2_K *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++) {
		const float d = half_to_f32(x[i].d);
		const float dmin = half_to_f32(x[i].dmin);
		for (int e = 0; e < QK_K; e += 16) {
			const uint8_t sc = x[i].scales[e / 16];
			const float dl = d * (float)(sc & 0xf);
			const float ml = dmin * (float)(sc >> 4);
			const uint8_t *q = x[i].qs + 32 * (e / 128) + e % 32;
			const int shift = 2 * (e % 128 / 32);
			for (int l = 0; l < 16; l++) {
				const float p = dl * (float)((q[l] >> shift) & 3);
				*y++ = p - ml;
			}
		}
	}
}

/*
 * Q3_K: the low two bits of value e are laid out as in Q2_K; its third bit
 * is bit e/32 of hmask[e%32], and a clear bit means q - 4.
 * y = d * sc * q, q in -4..3
 */
static void dequant_q3_k(const BlockQ3_K *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++) {
		const float d = half_to_f32(x[i].d);
		for (int e = 0; e < QK_K; e += 16) {
			const float dl = d * (float)wtype_q3k_scale(x[i].scales, e / 16);
			const uint8_t *q = x[i].qs + 32 * (e / 128) + e % 32;
			const uint8_t *hm = x[i].hmask + e % 32;
			const int shift = 2 * (e % 128 / 32);
			const uint8_t mask = (uint8_t)(1u << (e / 32));
			for (int l = 0; l < 16; l++) {
				const int v = ((q[l] >> shift) & 3) - ((hm[l] & mask) ? 0 : 4);
				*y++ = dl * (float)v;
			}
		}
	}
}

/*
 * Q4_K: sub-block j (32 values) takes the low nibbles of qs[32 * (j/2) ..]
 * for even j, the high nibbles for odd j.
 * y = d * sc * q - dmin * m
 */
static void dequant_q4_k(const BlockQ4_K *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++) {
		const float d = half_to_f32(x[i].d);
		const float dmin = half_to_f32(x[i].dmin);
		for (int j = 0; j < QK_K / 32; j++) {
			uint8_t sc, m;
			wtype_q4k_scale_min(x[i].scales, j, &sc, &m);
			const float dl = d * (float)sc;
			const float ml = dmin * (float)m;
			const uint8_t *q = x[i].qs + 32 * (j / 2);
			const int shift = 4 * (j % 2);
			for (int l = 0; l < 32; l++) {
				const float p = dl * (float)((q[l] >> shift) & 0xf);
				*y++ = p - ml;
			}
		}
	}
}

/* Q5_K: as Q4_K, with the fifth bit of value 32j + l in bit j of qh[l]. */
static void dequant_q5_k(const BlockQ5_K *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++) {
		const float d = half_to_f32(x[i].d);
		const float dmin = half_to_f32(x[i].dmin);
		for (int j = 0; j < QK_K / 32; j++) {
			uint8_t sc, m;
			wtype_q4k_scale_min(x[i].scales, j, &sc, &m);
			const float dl = d * (float)sc;
			const float ml = dmin * (float)m;
			const uint8_t *q = x[i].qs + 32 * (j / 2);
			const int shift = 4 * (j % 2);
			for (int l = 0; l < 32; l++) {
				const int v = ((q[l] >> shift) & 0xf) | (((x[i].qh[l] >> j) & 1) << 4);
				const float p = dl * (float)v;
				*y++ = p - ml;
			}
		}
	}
}

/*
 * Q6_K: in each 128-value half h, value 32k + l (k 0..3, l 0..31) has its
 * low nibble in ql[64h + l + 32 * (k%2)] (low nibble for k < 2, high for
 * k >= 2) and its two high bits at bits 2k of qh[32h + l].
 * y = d * sc * (q - 32), sc int8 per 16 values.
 */
static void dequant_q6_k(const BlockQ6_K *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++) {
		const float d = half_to_f32(x[i].d);
		for (int e = 0; e < QK_K; e += 16) {
			const int h = e / 128, k = e % 128 / 32;
			const uint8_t *ql = x[i].ql + 64 * h + 32 * (k % 2) + e % 32;
			const uint8_t *qh = x[i].qh + 32 * h + e % 32;
			const int lshift = 4 * (k / 2), hshift = 2 * k;
			const float dl = d * (float)x[i].scales[e / 16];
			for (int l = 0; l < 16; l++) {
				const int v = ((ql[l] >> lshift) & 0xf) | (((qh[l] >> hshift) & 3) << 4);
				*y++ = dl * (float)(v - 32);
			}
		}
	}
}

/* y = d * q, d a float */
static void dequant_q8_k(const BlockQ8_K *x, float *y, int64_t nb)
{
	for (int64_t i = 0; i < nb; i++)
		for (int j = 0; j < QK_K; j++)
			*y++ = x[i].d * (float)x[i].qs[j];
}

void wtype_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n)
{
	const WTypeInfo *info = wtype_info(t);
	assert(info);
	assert(n >= 0 && n % info->block_elems == 0);
	const int64_t nb = n / info->block_elems;

	switch (t) {
	case WTYPE_F32:
		memcpy(dst, src, (size_t)n * sizeof(float));
		break;
	case WTYPE_F16: {
		const tkv_half *h = src;
		for (int64_t i = 0; i < n; i++)
			dst[i] = half_to_f32(h[i]);
		break;
	}
	case WTYPE_BF16: {
		const tkv_bf16 *b = src;
		for (int64_t i = 0; i < n; i++)
			dst[i] = bf16_to_f32(b[i]);
		break;
	}
	case WTYPE_Q4_0: dequant_q4_0(src, dst, nb); break;
	case WTYPE_Q4_1: dequant_q4_1(src, dst, nb); break;
	case WTYPE_Q5_0: dequant_q5_0(src, dst, nb); break;
	case WTYPE_Q5_1: dequant_q5_1(src, dst, nb); break;
	case WTYPE_Q8_0: dequant_q8_0(src, dst, nb); break;
	case WTYPE_Q8_1: dequant_q8_1(src, dst, nb); break;
	case WTYPE_Q2_K: dequant_q2_k(src, dst, nb); break;
	case WTYPE_Q3_K: dequant_q3_k(src, dst, nb); break;
	case WTYPE_Q4_K: dequant_q4_k(src, dst, nb); break;
	case WTYPE_Q5_K: dequant_q5_k(src, dst, nb); break;
	case WTYPE_Q6_K: dequant_q6_k(src, dst, nb); break;
	case WTYPE_Q8_K: dequant_q8_k(src, dst, nb); break;
	default:
		assert(!"wtype_dequantize_row: type in table but not handled");
	}
}
