/*
 * kv_pk_layout.h: one block of pair-coded keys (the `pk<B>` key type,
 * engine/codec/kvpk.h) byte by byte, and the reads every kernel shares:
 * a pair's scale and width, a column's codes.
 *
 * Owns: the block layout below and its inline readers. Not here: choosing
 * scales and widths, encoding, the normal codebooks (engine/codec/kvpk.h),
 * scoring (kernels/cpu/kv_attn.h).
 *
 * == One block's key region (KV_BLOCK_TOKENS rows, d = head_dim) ==
 *
 *   32 * code_bits / 8   codes, column by column: coordinate j's 32
 *                        codes of b = width[j / 2] bits each (4 b bytes;
 *                        row t at bit t b, LSB first, bitpack.h's order),
 *                        after the columns of coordinates 0..j-1; a code
 *                        is the cell of x_j / sigma_{j/2} in the
 *                        Lloyd-Max codebook of a standard normal with
 *                        2^b levels. Columns, because every row of a
 *                        column has the same width and attention reads
 *                        all 32 rows
 *   d / 2                scale bytes: s_i = round(8 log2 rms_i) + 128
 *                        clamped to 1..255, rms_i over the block's rows
 *                        and both channels of pair i; sigma_i =
 *                        2^((s_i - 128) / 8); s_i = 0 for a pair that
 *                        is all zero
 *   d / 4                bit widths, two per byte (low nibble first),
 *                        0..8, summing to code_bits / 2
 *   rest                 zero, up to 32 * kvpk_row_bytes(d, code_bits)
 *
 * code_bits (bits per key) is B d for pk<B>, a multiple of 8. The side
 * data costs KVPK_SIDE_BYTES(d) per row: pk4 at d = 64 is 4.25 bits per
 * value, as tq4.
 */
#pragma once

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kv_format.h"

#define KVPK_MAX_BITS 8    /* per coordinate */
#define KVPK_MAX_DIM 1024
#define KVPK_MAX_GROUP 64  /* query heads per kv-head the score kernels take */

static_assert(KV_BLOCK_TOKENS % 8 == 0,
	      "a column of 32 codes of b bits is a whole number of bytes for every b");

/* Per-row bytes of per-block side data (pair scales, pair bit widths). */
#define KVPK_SIDE_BYTES(d) (((d) / 2 + (d) / 4 + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS)

/* Bytes per row of a block of keys of dimension d at code_bits bits each. */
static inline size_t kvpk_row_bytes(int d, int code_bits)
{
	return (size_t)code_bits / 8 + KVPK_SIDE_BYTES(d);
}

/* The scale bytes of a block (d / 2), after its codes. */
static inline const uint8_t *kvpk_scales(const uint8_t *blk, int code_bits)
{
	return blk + (size_t)KV_BLOCK_TOKENS * code_bits / 8;
}

/* sigma of scale byte s (0 for a zero pair). */
static inline float kvpk_scale_of(uint8_t s)
{
	return s ? exp2f((float)((int)s - 128) * 0.125f) : 0.0f;
}

/* The width of pair i from the width nibbles (after the d / 2 scale bytes). */
static inline int kvpk_width(const uint8_t *widths, int pair)
{
	return (widths[pair / 2] >> (4 * (pair & 1))) & 0xf;
}

/* Code t of a column of b-bit codes. */
static inline unsigned kvpk_column_code(const uint8_t *col, int b, int t)
{
	unsigned at = (unsigned)t * (unsigned)b;
	unsigned v = col[at / 8] >> (at % 8);
	if (at % 8 + (unsigned)b > 8)
		v |= (unsigned)col[at / 8 + 1] << (8 - at % 8);
	return v & ((1u << b) - 1);
}

/*
 * The 32 codes of a column of b-bit codes into idx, 8 at a time: 8 codes
 * are b bytes, one little-endian load (b <= 8; the side data behind the
 * codes keeps the 8-byte read inside the block).
 */
static inline void kvpk_column_unpack(const uint8_t *col, int b, uint8_t *idx)
{
	uint64_t mask = (1u << b) - 1;
	for (int g = 0; g < KV_BLOCK_TOKENS / 8; g++) {
		uint64_t v;
		memcpy(&v, col + g * b, 8);
		for (int k = 0; k < 8; k++)
			idx[g * 8 + k] = (uint8_t)((v >> (k * b)) & mask);
	}
}
