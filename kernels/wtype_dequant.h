/*
 * wtype_dequant.h: weight blocks dequantized 32 values at a time, by code
 * that both compilers build (the CUDA matmuls include it; the CPU unit
 * test tests/unit/test-wtype-dequant.c checks it against
 * wtype_dequantize_row(), bit for bit).
 *
 * == Chunks ==
 *
 * A quantized row is read in chunks of WDQ_CHUNK = 32 consecutive values:
 * a whole block of the 32-value types (Q4_0 .. Q8_0), one eighth of a
 * 256-value K-quant super-block. Chunk g of a row is chunk g % cpb of
 * block g / cpb (cpb: wdq_chunks_per_block()). On the GPU lane j of a warp
 * takes chunks j, j + 32, ... of its row, so a warp's loads cover one
 * contiguous stretch of the row, and a chunk's scale fields sit next to
 * its quants. Float rows (F32, F16, BF16) are read one value at a time
 * (wdq_float()); their rows need not be multiples of 32.
 *
 * == Arithmetic ==
 *
 * The float operations and their order are wtype.c's (ggml's): each
 * product goes into a named float before a min is added or subtracted, so
 * a C compiler in ISO mode does not contract it into an FMA. nvcc does
 * contract across statements unless built with -fmad=false; the matmuls
 * do not need the CPU's exact bits, only the unit test does.
 *
 * Everything here is static inline and free of host-only calls (half.h's
 * memcpy bit casts are fine on the device). Blocks are read through the
 * structs of wtype.h, so a block must be 2-byte aligned (GGUF aligns
 * tensor data to 32 bytes and every block size is even).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "base/half.h"
#include "kernels/wtype.h"

#define WDQ_CHUNK 32

/* Whether t is one of the types this header reads: wtype_is_supported()'s. */
static inline TKV_HD bool wdq_is_supported(uint32_t t)
{
	switch (t) {
	case WTYPE_F32: case WTYPE_F16: case WTYPE_BF16:
	case WTYPE_Q4_0: case WTYPE_Q4_1: case WTYPE_Q5_0: case WTYPE_Q5_1: case WTYPE_Q8_0:
	case WTYPE_Q2_K: case WTYPE_Q3_K: case WTYPE_Q4_K: case WTYPE_Q5_K: case WTYPE_Q6_K:
		return true;
	default:
		return false;
	}
}

/* Whether t is a float type, read by wdq_float() rather than in chunks. */
static inline TKV_HD bool wdq_is_float(uint32_t t)
{
	return t == WTYPE_F32 || t == WTYPE_F16 || t == WTYPE_BF16;
}

/* Bytes of one block of a quantized type t (wtype_info()->block_bytes, usable on the device). */
static inline TKV_HD int wdq_block_bytes(uint32_t t)
{
	switch (t) {
	case WTYPE_Q4_0: return (int)sizeof(BlockQ4_0);
	case WTYPE_Q4_1: return (int)sizeof(BlockQ4_1);
	case WTYPE_Q5_0: return (int)sizeof(BlockQ5_0);
	case WTYPE_Q5_1: return (int)sizeof(BlockQ5_1);
	case WTYPE_Q8_0: return (int)sizeof(BlockQ8_0);
	case WTYPE_Q2_K: return (int)sizeof(BlockQ2_K);
	case WTYPE_Q3_K: return (int)sizeof(BlockQ3_K);
	case WTYPE_Q4_K: return (int)sizeof(BlockQ4_K);
	case WTYPE_Q5_K: return (int)sizeof(BlockQ5_K);
	case WTYPE_Q6_K: return (int)sizeof(BlockQ6_K);
	default: return 0;
	}
}

/* Chunks of 32 values in a block of a quantized type t: 1, or 8 for the K-quants. */
static inline TKV_HD int wdq_chunks_per_block(uint32_t t)
{
	return t >= WTYPE_Q2_K && t <= WTYPE_Q6_K ? QK_K / WDQ_CHUNK : 1;
}

/* ---- 32-value types: y (32,) = the whole block ---- */

/* y = d * (q - 8) */
static inline TKV_HD void wdq_q4_0(const BlockQ4_0 *x, float *y)
{
	const float d = half_to_f32(x->d);
	for (int j = 0; j < 16; j++) {
		y[j] = (float)((x->qs[j] & 0xf) - 8) * d;
		y[j + 16] = (float)((x->qs[j] >> 4) - 8) * d;
	}
}

/* y = d * q + m */
static inline TKV_HD void wdq_q4_1(const BlockQ4_1 *x, float *y)
{
	const float d = half_to_f32(x->d);
	const float m = half_to_f32(x->m);
	for (int j = 0; j < 16; j++) {
		const float p0 = (float)(x->qs[j] & 0xf) * d;
		const float p1 = (float)(x->qs[j] >> 4) * d;
		y[j] = p0 + m;
		y[j + 16] = p1 + m;
	}
}

/* qh as the little-endian 32-bit word of the block */
static inline TKV_HD uint32_t wdq_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* y = d * (q - 16), q's fifth bit j in bit j of qh */
static inline TKV_HD void wdq_q5_0(const BlockQ5_0 *x, float *y)
{
	const float d = half_to_f32(x->d);
	const uint32_t qh = wdq_le32(x->qh);
	for (int j = 0; j < 16; j++) {
		const int q0 = (x->qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
		const int q1 = (x->qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
		y[j] = (float)(q0 - 16) * d;
		y[j + 16] = (float)(q1 - 16) * d;
	}
}

/* y = d * q + m */
static inline TKV_HD void wdq_q5_1(const BlockQ5_1 *x, float *y)
{
	const float d = half_to_f32(x->d);
	const float m = half_to_f32(x->m);
	const uint32_t qh = wdq_le32(x->qh);
	for (int j = 0; j < 16; j++) {
		const int q0 = (x->qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
		const int q1 = (x->qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
		const float p0 = (float)q0 * d;
		const float p1 = (float)q1 * d;
		y[j] = p0 + m;
		y[j + 16] = p1 + m;
	}
}

/* y = d * q */
static inline TKV_HD void wdq_q8_0(const BlockQ8_0 *x, float *y)
{
	const float d = half_to_f32(x->d);
	for (int j = 0; j < 32; j++)
		y[j] = (float)x->qs[j] * d;
}

/* ---- K-quants: y (32,) = values 32c .. 32c+31 of the super-block, c in 0..7 ---- */

/*
 * Q2_K: chunk c's 2-bit quants are field c % 4 (bits 2(c%4)) of bytes
 * qs[32 * (c/4) ..], its two 16-value sub-blocks have scale bytes
 * scales[2c], scales[2c + 1] (low nibble scale, high nibble min).
 * y = d * sc * q - dmin * m
 */
static inline TKV_HD void wdq_q2_k(const BlockQ2_K *x, int c, float *y)
{
	const float d = half_to_f32(x->d);
	const float dmin = half_to_f32(x->dmin);
	const uint8_t *q = x->qs + 32 * (c / 4);
	const int shift = 2 * (c % 4);
	for (int s = 0; s < 2; s++) {
		const uint8_t sc = x->scales[2 * c + s];
		const float dl = d * (float)(sc & 0xf);
		const float ml = dmin * (float)(sc >> 4);
		for (int l = 16 * s; l < 16 * s + 16; l++) {
			const float p = dl * (float)((q[l] >> shift) & 3);
			y[l] = p - ml;
		}
	}
}

/*
 * Q3_K: low bits as Q2_K; the third bit of value 32c + l is bit c of
 * hmask[l], clear meaning q - 4. y = d * sc * q, sc signed per 16 values.
 */
static inline TKV_HD void wdq_q3_k(const BlockQ3_K *x, int c, float *y)
{
	const float d = half_to_f32(x->d);
	const uint8_t *q = x->qs + 32 * (c / 4);
	const int shift = 2 * (c % 4);
	const uint8_t mask = (uint8_t)(1u << c);
	for (int s = 0; s < 2; s++) {
		const float dl = d * (float)wtype_q3k_scale(x->scales, 2 * c + s);
		for (int l = 16 * s; l < 16 * s + 16; l++) {
			const int v = ((q[l] >> shift) & 3) - ((x->hmask[l] & mask) ? 0 : 4);
			y[l] = dl * (float)v;
		}
	}
}

/* Q4_K: chunk c is the low (even c) or high (odd c) nibbles of qs[32 * (c/2) ..]. */
static inline TKV_HD void wdq_q4_k(const BlockQ4_K *x, int c, float *y)
{
	const float d = half_to_f32(x->d);
	const float dmin = half_to_f32(x->dmin);
	uint8_t sc, m;
	wtype_q4k_scale_min(x->scales, c, &sc, &m);
	const float dl = d * (float)sc;
	const float ml = dmin * (float)m;
	const uint8_t *q = x->qs + 32 * (c / 2);
	const int shift = 4 * (c % 2);
	for (int l = 0; l < 32; l++) {
		const float p = dl * (float)((q[l] >> shift) & 0xf);
		y[l] = p - ml;
	}
}

/* Q5_K: as Q4_K, the fifth bit of value 32c + l in bit c of qh[l]. */
static inline TKV_HD void wdq_q5_k(const BlockQ5_K *x, int c, float *y)
{
	const float d = half_to_f32(x->d);
	const float dmin = half_to_f32(x->dmin);
	uint8_t sc, m;
	wtype_q4k_scale_min(x->scales, c, &sc, &m);
	const float dl = d * (float)sc;
	const float ml = dmin * (float)m;
	const uint8_t *q = x->qs + 32 * (c / 2);
	const int shift = 4 * (c % 2);
	for (int l = 0; l < 32; l++) {
		const int v = ((q[l] >> shift) & 0xf) | (((x->qh[l] >> c) & 1) << 4);
		const float p = dl * (float)v;
		y[l] = p - ml;
	}
}

/*
 * Q6_K: chunk c = 4h + k (half h, k 0..3): low nibbles in
 * ql[64h + 32(k%2) ..] (low for k < 2, high for k >= 2), high two bits at
 * bits 2k of qh[32h ..]. y = d * sc * (q - 32), sc int8 per 16 values.
 */
static inline TKV_HD void wdq_q6_k(const BlockQ6_K *x, int c, float *y)
{
	const float d = half_to_f32(x->d);
	const int h = c / 4, k = c % 4;
	const uint8_t *ql = x->ql + 64 * h + 32 * (k % 2);
	const uint8_t *qh = x->qh + 32 * h;
	const int lshift = 4 * (k / 2), hshift = 2 * k;
	for (int s = 0; s < 2; s++) {
		const float dl = d * (float)x->scales[2 * c + s];
		for (int l = 16 * s; l < 16 * s + 16; l++) {
			const int v = ((ql[l] >> lshift) & 0xf) | (((qh[l] >> hshift) & 3) << 4);
			y[l] = dl * (float)(v - 32);
		}
	}
}

/*
 * y (32,) = chunk c of the block at blk, a quantized type t
 * (wdq_is_supported() && !wdq_is_float()). With t a compile-time
 * constant (the CUDA kernels are templates on it) the switch folds away.
 */
static inline TKV_HD void wdq_block_chunk(uint32_t t, const void *blk, int c, float *y)
{
	switch (t) {
	case WTYPE_Q4_0: wdq_q4_0((const BlockQ4_0 *)blk, y); break;
	case WTYPE_Q4_1: wdq_q4_1((const BlockQ4_1 *)blk, y); break;
	case WTYPE_Q5_0: wdq_q5_0((const BlockQ5_0 *)blk, y); break;
	case WTYPE_Q5_1: wdq_q5_1((const BlockQ5_1 *)blk, y); break;
	case WTYPE_Q8_0: wdq_q8_0((const BlockQ8_0 *)blk, y); break;
	case WTYPE_Q2_K: wdq_q2_k((const BlockQ2_K *)blk, c, y); break;
	case WTYPE_Q3_K: wdq_q3_k((const BlockQ3_K *)blk, c, y); break;
	case WTYPE_Q4_K: wdq_q4_k((const BlockQ4_K *)blk, c, y); break;
	case WTYPE_Q5_K: wdq_q5_k((const BlockQ5_K *)blk, c, y); break;
	case WTYPE_Q6_K: wdq_q6_k((const BlockQ6_K *)blk, c, y); break;
	default: break;
	}
}

/* y (32,) = values 32g .. 32g+31 of a quantized row of type t starting at row. */
static inline TKV_HD void wdq_row_chunk(uint32_t t, const void *row, int64_t g, float *y)
{
	const int cpb = wdq_chunks_per_block(t);
	const uint8_t *blk = (const uint8_t *)row + (g / cpb) * wdq_block_bytes(t);
	wdq_block_chunk(t, blk, (int)(g % cpb), y);
}

/* Value i of a float row (F32, F16 or BF16) starting at row. */
static inline TKV_HD float wdq_float(uint32_t t, const void *row, int64_t i)
{
	if (t == WTYPE_F16)
		return half_to_f32(((const tkv_half *)row)[i]);
	if (t == WTYPE_BF16)
		return bf16_to_f32(((const tkv_bf16 *)row)[i]);
	return ((const float *)row)[i];
}
