/*
 * repack_x86.h: what the AVX2 and AVX-512 tile kernels of the X4 layout
 * (repack_avx2.c, repack_avx512.c) share: the Q4_K scale/min unpacking.
 * Plain SSE2, so it compiles under either file's flags.
 */
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The 12 packed bytes as 8 scales (bytes 0..7) and 8 mins (bytes 8..15),
 * as wtype_q4k_scale_min() reads them (ggml's kmask trick). */
static inline __m128i q4k_scales_mins(const uint8_t *scales)
{
	uint32_t u[4];
	memcpy(u, scales, 12);
	u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
	uint32_t mins_lo = u[1] & 0x3f3f3f3f;
	u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
	u[2] = mins_lo;
	u[0] &= 0x3f3f3f3f;
	return _mm_loadu_si128((const __m128i *)u);
}
