/*
 * kv_attn_neon.c: NEON KV attention kernels (kv_attn.h; aarch64 builds,
 * called when kv_attn_have_neon()).
 *
 * One stored row at a time is decoded to floats in the stored domain once
 * (F32 copied, F16 widened with FCVTL, TQ codes unpacked to bytes and
 * looked up: streams of <= 4 bits by TBL over the 16 centroids as 64
 * bytes, wider ones one by one), then used by every query head:
 *
 *   scores  a 4-lane fused dot product per head and stream, combined with
 *           the stream scales and the QJL term exactly as the reference
 *           does: equal to it to float rounding (summation order)
 *   values  acc += a v~ lane by lane, multiply then add, unfused, with the
 *           reference's scalar factors: its floats bit for bit
 *
 * Q8_0 and Q4_0 rows go to the references (not the default or tq4/f16
 * types). The pair-coded key scores do the reference's products and sums
 * in its order, unfused, 4 tokens per lane group: bit for bit. Exact f32
 * key scores: one fused 4-lane dot product per head and row.
 */
#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "kernels/cpu/kv_attn.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kv_attn_neon.c reads packed little-endian code words with memcpy"
#endif

#define ROW_PAD 16 /* decoded rows and code bytes run on to a multiple of 16 */

/* Codes 0..n-1 of a packed stream (bitpack.h: LSB first), one per byte. */
static void codes_unpack(const uint8_t *p, int bits, int n, uint8_t *out)
{
	int i = 0;
	if (bits == 4)
		for (; i + 32 <= n; i += 32) {
			uint8x16_t x = vld1q_u8(p + i / 2);
			uint8x16x2_t z = vzipq_u8(vandq_u8(x, vdupq_n_u8(0xf)), vshrq_n_u8(x, 4));
			vst1q_u8(out + i, z.val[0]);
			vst1q_u8(out + i + 16, z.val[1]);
		}
	/* 8 codes are `bits` bytes: read only the stream's own bytes */
	uint64_t mask = (1u << bits) - 1;
	for (; i < n; i += 8) {
		int m = n - i < 8 ? n - i : 8;
		uint64_t w = 0;
		memcpy(&w, p + (size_t)i / 8 * (size_t)bits, (size_t)(m * bits + 7) / 8);
		for (int k = 0; k < m; k++)
			out[i + k] = (uint8_t)(w >> (k * bits) & mask);
	}
}

/* out[i] = cb[c[i]] for i < n (and on to a multiple of 16 for <= 4 bits: c padded). */
static void codes_lookup(const uint8_t *c, int bits, const float *cb, const float *cb16, int n, float *out)
{
	if (bits > 4) {
		for (int i = 0; i < n; i++)
			out[i] = cb[c[i]];
		return;
	}
	/* float k of the table is bytes 4k .. 4k+3: index bytes 4 c + (0, 1, 2, 3) */
	const uint8_t *tb = (const uint8_t *)cb16;
	uint8x16x4_t tab = { { vld1q_u8(tb), vld1q_u8(tb + 16), vld1q_u8(tb + 32), vld1q_u8(tb + 48) } };
	static const uint8_t spread[4][16] = {
		{ 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3 },
		{ 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7 },
		{ 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11 },
		{ 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15 },
	};
	static const uint8_t byte_of[16] = { 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3 };
	const uint8x16_t off = vld1q_u8(byte_of);
	for (int i = 0; i < n; i += 16) {
		uint8x16_t c4 = vshlq_n_u8(vld1q_u8(c + i), 2);
		for (int k = 0; k < 4; k++) {
			uint8x16_t idx = vaddq_u8(vqtbl1q_u8(c4, vld1q_u8(spread[k])), off);
			vst1q_f32(out + i + 4 * k, vreinterpretq_f32_u8(vqtbl4q_u8(tab, idx)));
		}
	}
}

/*
 * Row v of a supported format as floats in the stored domain (y holds
 * dim + ROW_PAD): F32, F16, TQ (stream scales not applied).
 */
static void row_decode(const KvAttnRows *r, const uint8_t *v, float *y)
{
	int d = r->dim, i = 0;
	switch (r->format) {
	case KV_FORMAT_F32:
		memcpy(y, v, (size_t)d * sizeof(float));
		return;
	case KV_FORMAT_F16:
		for (; i + 4 <= d; i += 4)
			vst1q_f32(y + i, vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(v + 2 * i))));
		for (; i < d; i++)
			y[i] = half_to_f32((tkv_half)(v[2 * i] | v[2 * i + 1] << 8));
		return;
	default:
		break;
	}
	const TqLayout *L = &r->tq;
	uint8_t c[TQ_MAX_DIM + ROW_PAD];
	if (L->n_hi > 0) {
		codes_unpack(v + L->off_hi, L->bits_hi, L->n_hi, c);
		memset(c + L->n_hi, 0, ROW_PAD);
		codes_lookup(c, L->bits_hi, r->cb[0], r->cb32[0], L->n_hi, y);
	}
	if (L->n_hi < d) {
		int n = d - L->n_hi;
		codes_unpack(v + L->off_lo, L->bits_lo, n, c);
		memset(c + n, 0, ROW_PAD);
		/* the lo stream's lookup may write past y + d: y has the room, and the
		 * hi part is already in place before it */
		codes_lookup(c, L->bits_lo, r->cb[1], r->cb32[1], n, y + L->n_hi);
	}
}

static bool neon_format(KvFormat f)
{
	return f == KV_FORMAT_F32 || f == KV_FORMAT_F16 || f == KV_FORMAT_TQ;
}

/* sum_i x[i] y[i], four fused lanes then a tail. */
static float dot_f32(const float *x, const float *y, int n)
{
	float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		a0 = vfmaq_f32(a0, vld1q_f32(x + i), vld1q_f32(y + i));
		a1 = vfmaq_f32(a1, vld1q_f32(x + i + 4), vld1q_f32(y + i + 4));
	}
	for (; i + 4 <= n; i += 4)
		a0 = vfmaq_f32(a0, vld1q_f32(x + i), vld1q_f32(y + i));
	float s = vaddvq_f32(vaddq_f32(a0, a1));
	for (; i < n; i++)
		s += x[i] * y[i];
	return s;
}

/* acc[i] += a * y[i], unfused (the reference's rounding). */
static void axpy_f32(float a, const float *y, int n, float *acc)
{
	int i = 0;
	for (; i + 4 <= n; i += 4)
		vst1q_f32(acc + i, vaddq_f32(vld1q_f32(acc + i), vmulq_n_f32(vld1q_f32(y + i), a)));
	for (; i < n; i++)
		acc[i] += a * y[i];
}

void kv_attn_scores_neon(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
			 int n, float scale, float *scores, int ld)
{
	if (!neon_format(keys->format)) {
		kv_attn_scores_ref(keys, q, G, k, n, scale, scores, ld);
		return;
	}
	float y[TQ_MAX_DIM + ROW_PAD];
	const int d = keys->dim;
	const TqLayout *L = &keys->tq;
	for (int j = 0; j < n; j++) {
		const uint8_t *row = k + (size_t)j * keys->row_bytes;
		row_decode(keys, row, y);
		if (keys->format != KV_FORMAT_TQ) {
			for (int g = 0; g < G; g++)
				scores[g * ld + j] = scale * dot_f32(q[g].q, y, d);
			continue;
		}
		float s_hi = L->n_hi > 0 ? tq_load_f16(row + L->off_scale[0]) : 0.0f;
		float s_lo = L->n_hi < d ? tq_load_f16(row + L->off_scale[L->n_scales - 1]) : 0.0f;
		float gamma = L->qjl_m > 0 ? tq_load_f16(row + L->off_gamma) : 0.0f;
		for (int g = 0; g < G; g++) {
			float mse = 0.0f, qjl = 0.0f;
			if (L->n_hi > 0)
				mse += s_hi * dot_f32(q[g].q, y, L->n_hi);
			if (L->n_hi < d)
				mse += s_lo * dot_f32(q[g].q + L->n_hi, y + L->n_hi, d - L->n_hi);
			if (L->qjl_m > 0)
				qjl = gamma * tq_dot_signs(q[g].sq, row + L->off_signs, L->qjl_m);
			scores[g * ld + j] = scale * (mse + keys->qjl_const * qjl);
		}
	}
}

void kv_attn_values_neon(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			 int n, float *acc, int acc_ld)
{
	if (!neon_format(vals->format)) {
		kv_attn_values_ref(vals, p, ld, G, v, n, acc, acc_ld);
		return;
	}
	float y[TQ_MAX_DIM + ROW_PAD];
	const int d = vals->dim;
	const TqLayout *L = &vals->tq;
	for (int j = 0; j < n; j++) {
		const uint8_t *row = v + (size_t)j * vals->row_bytes;
		row_decode(vals, row, y);
		if (vals->format != KV_FORMAT_TQ) {
			for (int g = 0; g < G; g++)
				axpy_f32(p[g * ld + j], y, d, acc + (size_t)g * acc_ld);
			continue;
		}
		float s_hi = L->n_hi > 0 ? tq_load_f16(row + L->off_scale[0]) : 0.0f;
		float s_lo = L->n_hi < d ? tq_load_f16(row + L->off_scale[L->n_scales - 1]) : 0.0f;
		for (int g = 0; g < G; g++) {
			float a = p[g * ld + j], *ag = acc + (size_t)g * acc_ld;
			if (L->n_hi > 0)
				axpy_f32(a * s_hi, y, L->n_hi, ag);
			if (L->n_hi < d)
				axpy_f32(a * s_lo, y + L->n_hi, d - L->n_hi, ag + L->n_hi);
		}
	}
}

/* The 32 centroids c[idx[t]] of a pk column (b <= 5 by TBL over c's first 32 floats). */
static void pk_lookup(const float *c, int b, const uint8_t *idx, float *y)
{
	if (b > 5) {
		for (int t = 0; t < KV_BLOCK_TOKENS; t++)
			y[t] = c[idx[t]];
		return;
	}
	const uint8_t *tb = (const uint8_t *)c;
	uint8x16x4_t lo = { { vld1q_u8(tb), vld1q_u8(tb + 16), vld1q_u8(tb + 32), vld1q_u8(tb + 48) } };
	uint8x16x4_t hi = { { vld1q_u8(tb + 64), vld1q_u8(tb + 80), vld1q_u8(tb + 96), vld1q_u8(tb + 112) } };
	static const uint8_t byte_of[16] = { 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3 };
	static const uint8_t spread[4][16] = {
		{ 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3 },
		{ 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7 },
		{ 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11 },
		{ 12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15 },
	};
	const uint8x16_t off = vld1q_u8(byte_of), k64 = vdupq_n_u8(64);
	for (int t = 0; t < KV_BLOCK_TOKENS; t += 16) {
		/* 4 c: bytes 0..127 of the 32-float table; 64.. from the second half (TBX keeps the first's) */
		uint8x16_t c4 = vshlq_n_u8(vld1q_u8(idx + t), 2);
		for (int k = 0; k < 4; k++) {
			uint8x16_t ix = vaddq_u8(vqtbl1q_u8(c4, vld1q_u8(spread[k])), off);
			uint8x16_t r = vqtbl4q_u8(lo, ix);
			if (b == 5)
				r = vqtbx4q_u8(r, hi, vsubq_u8(ix, k64));
			vst1q_f32(y + t + 4 * k, vreinterpretq_f32_u8(r));
		}
	}
}

void kv_attn_pk_scores_neon(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			    float scale, float *scores, int ld)
{
	enum { BT = KV_BLOCK_TOKENS };
	const int d = keys->dim;
	const uint8_t *sc = kvpk_scales(blk, keys->code_bits), *widths = sc + d / 2;
	float acc[KVPK_MAX_GROUP][BT], y[BT];
	uint8_t idx[BT];
	assert(G <= KVPK_MAX_GROUP);
	memset(acc, 0, sizeof(acc[0]) * (size_t)G);
	const uint8_t *col = blk;
	for (int j = 0; j < d; j++) {
		int b = kvpk_width(widths, j / 2);
		if (b == 0)
			continue;
		kvpk_column_unpack(col, b, idx);
		col += (size_t)BT * b / 8;
		pk_lookup(keys->centroids[b], b, idx, y);
		float s = keys->sigma[sc[j / 2]];
		float32x4_t yv[BT / 4];
		for (int t = 0; t < BT / 4; t++)
			yv[t] = vmulq_n_f32(vld1q_f32(y + 4 * t), s);
		for (int g = 0; g < G; g++) {
			float qj = q[(size_t)g * d + j];
			for (int t = 0; t < BT / 4; t++)
				vst1q_f32(acc[g] + 4 * t, vaddq_f32(vld1q_f32(acc[g] + 4 * t), vmulq_n_f32(yv[t], qj)));
		}
	}
	for (int g = 0; g < G; g++)
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] = acc[g][t] * scale;
}

void kv_attn_exact_scores_neon(const float *x, int d, const float *q, int G, int n, float scale,
			       float *scores, int ld)
{
	for (int g = 0; g < G; g++)
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] = dot_f32(q + (size_t)g * d, x + (size_t)t * d, d) * scale;
}
