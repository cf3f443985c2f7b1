/*
 * half.h: IEEE binary16 and bfloat16 conversions.
 *
 * Plain C, no intrinsics, so the same code runs in host code, in CUDA
 * (where it is compiled __host__ __device__) and in tests. Fast paths
 * (F16C) live in the kernels that need them.
 */
#pragma once

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TKV_HD __host__ __device__
#else
#define TKV_HD
#endif

typedef uint16_t tkv_half; /* IEEE 754 binary16 bits */
typedef uint16_t tkv_bf16; /* upper 16 bits of a binary32 */

static inline TKV_HD float tkv_bits_to_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline TKV_HD uint32_t tkv_f32_to_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline TKV_HD float half_to_f32(tkv_half h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t mant = h & 0x3ff;

	if (exp == 0x1f) /* inf / nan */
		return tkv_bits_to_f32(sign | 0x7f800000u | (mant << 13));
	if (exp == 0) {
		if (mant == 0)
			return tkv_bits_to_f32(sign);
		/* subnormal: value = mant * 2^-24 */
		float v = (float)mant * (1.0f / 16777216.0f);
		return sign ? -v : v;
	}
	return tkv_bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Round to nearest even, as ggml (and F16C) do. */
static inline TKV_HD tkv_half f32_to_half(float f)
{
	uint32_t x = tkv_f32_to_bits(f);
	uint32_t sign = (x >> 16) & 0x8000;
	uint32_t absx = x & 0x7fffffffu;

	if (absx >= 0x7f800000u) /* inf or nan */
		return (tkv_half)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
	if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
		return (tkv_half)(sign | 0x7c00);
	if (absx < 0x38800000u) { /* below 2^-14: subnormal or zero */
		if (absx < 0x33000000u) /* below 2^-25: rounds to zero */
			return (tkv_half)sign;
		uint32_t e = absx >> 23;
		uint32_t m = (absx & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e; /* 14..24 */
		uint32_t r = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return (tkv_half)(sign | r);
	}
	uint32_t r = absx - 0x38000000u; /* rebias exponent 127 -> 15 */
	uint32_t mant = r >> 13;
	uint32_t rem = r & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (mant & 1)))
		mant++;
	return (tkv_half)(sign | mant);
}

static inline TKV_HD float bf16_to_f32(tkv_bf16 b)
{
	return tkv_bits_to_f32((uint32_t)b << 16);
}

static inline TKV_HD tkv_bf16 f32_to_bf16(float f)
{
	uint32_t x = tkv_f32_to_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u) /* nan: keep it quiet */
		return (tkv_bf16)((x >> 16) | 64);
	return (tkv_bf16)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}
