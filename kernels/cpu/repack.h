/*
 * repack.h: weights regrouped once at load for the tiled CPU products.
 *
 * Layout MATMUL_LAYOUT_X4 (Q4_K, Q4_0, Q4_1, Q5_0, Q8_0; rows a multiple of 4):
 * W (rows, cols) as rows / 4 groups of 4 consecutive rows; within a group,
 * block b of its 4 rows lies together as one group-block of 4 blocks'
 * bytes, group-block after group-block:
 *
 *   group g: [group-block 0: row 4g..4g+3, block 0][group-block 1]...
 *
 * The repacked matrix has exactly the mapped one's size (it replaces it,
 * it does not add to it) and row_stride stays the bytes of one row: group
 * g starts at data + 4 g row_stride, its group-block b at
 * data + 4 g row_stride + 4 b sizeof(block). One stream of weights feeds a
 * 4-row tile, and a tile reads each activation block once for all its rows.
 *
 * Q4_K (144-byte BlockQ4_K): a group-block is the 4 rows' blocks unchanged,
 * row by row: row r's block b at data + 4 (r / 4) row_stride +
 * (4 b + r % 4) sizeof(BlockQ4_K).
 *
 * The 32-value types are regrouped field by field so that one 256-bit
 * register holds 8 quant bytes of each of the 4 rows (row i in 64-bit lane
 * i) and the 4 rows' scales load as one vector. With H the block's halves
 * (Q4_0, Q8_0: d; Q4_1: d, m; Q5_0: d and its 4 qh bytes as two 2-byte
 * fields) and Q its quant bytes (Q4_0, Q4_1, Q5_0: 16 nibble pairs; Q8_0:
 * 32 int8), a group-block of rows i = 0..3 is
 *
 *   byte 8 h + 2 i:             half h of row i, h < H (2 bytes)
 *   byte 8 H + 32 c + 8 i + k:  qs[8 c + k] of row i, chunk c < Q / 8, k < 8
 *
 *   Q4_0 (72 bytes):  [0, 8) d0 d1 d2 d3 | [8, 72) qs chunks 0, 1
 *   Q4_1 (80 bytes):  [0, 8) d0..d3 | [8, 16) m0..m3 | [16, 80) qs chunks 0, 1
 *   Q5_0 (88 bytes):  [0, 8) d0..d3 | [8, 16) qh bytes 0, 1 of rows 0..3 |
 *                     [16, 24) qh bytes 2, 3 of rows 0..3 | [24, 88) qs chunks 0, 1
 *   Q8_0 (136 bytes): [0, 8) d0..d3 | [8, 136) qs chunks 0..3
 *
 * (A nibble byte qs[j] holds value j low and value j + 16 high, as in the
 * block: chunk c's low nibbles are values 8c..8c+7, its high ones
 * 16+8c..16+8c+7.) The bytes are the 4 blocks' bytes, moved.
 *
 * Tile kernels: Y (nt tokens, 4 rows) of one group against nt <= 16
 * activation rows (Q8_K for Q4_K, Q8_1 for Q4_1, Q8_0 for Q4_0, Q5_0 and Q8_0).
 * The Q4_K reference is the row kernel (vec_dot_q4_K_ref) on each row
 * gathered back; the 32-value types' references read the layout in place
 * and compute vec_dot_*_ref's floats exactly. The AVX2 and AVX-512 VNNI
 * ones compute the same integer block sums exactly and differ in the order
 * of float accumulation (and the AVX-512 Q4_K one takes the min term in
 * float).
 */
#pragma once

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/wtype.h"

#define REPACK_GROUP 4
/* The 32-value layouts' chunk: 8 quant bytes of a row, one 64-bit lane. */
#define REPACK_CHUNK 8

/* What the 32-value layouts rely on: each block is its halves, then its
 * quant bytes, nothing else; a group-block is 4 blocks' bytes. */
static_assert(offsetof(BlockQ4_0, qs) == 2 && sizeof(BlockQ4_0) == 2 + QK4_0 / 2, "Q4_0: d, qs");
static_assert(offsetof(BlockQ4_1, m) == 2 && offsetof(BlockQ4_1, qs) == 4 && sizeof(BlockQ4_1) == 4 + QK4_1 / 2,
	      "Q4_1: d, m, qs");
static_assert(offsetof(BlockQ8_0, qs) == 2 && sizeof(BlockQ8_0) == 2 + QK8_0, "Q8_0: d, qs");
static_assert(offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6 && sizeof(BlockQ5_0) == 6 + QK5_0 / 2,
	      "Q5_0: d, qh (two 2-byte fields), qs");
static_assert(REPACK_GROUP * sizeof(BlockQ4_0) == 72 && REPACK_GROUP * sizeof(BlockQ4_1) == 80 &&
		      REPACK_GROUP * sizeof(BlockQ5_0) == 88 && REPACK_GROUP * sizeof(BlockQ8_0) == 136,
	      "group-block sizes as documented");
static_assert(REPACK_GROUP * REPACK_CHUNK == 32, "one chunk of 4 rows is one 256-bit register");
/* Tokens per tile call: the AVX-512 8-row kernel's tile (16); the others split it. */
#define REPACK_MAX_NT 16

/*
 * y[t * y_stride + i] = dot(row i of group, activation row t) for i < 4,
 * t < nt (1..REPACK_MAX_NT); act rows a_stride bytes apart; n = cols.
 */
typedef void (*RepackTileFn)(int64_t n, const void *group, const void *act, size_t a_stride, int nt,
			     float *y, size_t y_stride);

/* Whether w (row-major) can be repacked: a type with an X4 layout (and so
 * a reference tile kernel), rows a multiple of 4, rows packed tight
 * (row_stride == the row's bytes). Whether it is worth it on this CPU is
 * matmul_repack_wanted()'s question (matmul.h). */
bool repack_supported(const MatmulWeight *w);

/*
 * The repacked copy of w in new memory (aligned_alloc, the caller frees
 * ret->data): *ret is w with layout MATMUL_LAYOUT_X4. Returns 0, -EINVAL
 * (not repack_supported) or -ENOMEM.
 */
int repack_weight(const MatmulWeight *w, MatmulWeight *ret);

/* Row r of w (any layout) as consecutive blocks: a pointer into w when the
 * layout is row-major, else buf (wtype_row_bytes(type, cols) bytes) filled. */
const void *repack_row(const MatmulWeight *w, int64_t r, void *buf);

/* The tile kernel for layout X4 of type t: reference, or AVX2 (call only
 * when cpu_features() has avx2, fma and f16c); NULL if none. */
RepackTileFn repack_tile_ref_get(uint32_t t);
RepackTileFn repack_tile_avx2_get(uint32_t t);
/* AVX-512 with VNNI (call only when cpu_features() has avx512 and
 * avx512vnni, and what repack_tile_avx2_get needs); NULL if none. */
RepackTileFn repack_tile_avx512_get(uint32_t t);
/*
 * The same for two consecutive groups (8 rows: y[t * y_stride + i], i < 8;
 * the second group 4 rows of packed-tight row bytes after the first); the
 * reference is repack_tile_ref_get()'s kernel on each group. NULL if none.
 */
RepackTileFn repack_tile8_avx512_get(uint32_t t);
/* NEON (aarch64 builds; dotprod only where cpu_features() has it): the NEON
 * row kernel on each row's blocks in place, no gather. */
RepackTileFn repack_tile_neon_get(uint32_t t, bool dotprod);

void repack_tile_q4_K_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride);
void repack_tile_q4_K_avx2(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			   size_t y_stride);
void repack_tile_q4_K_avx512vnni(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
				 size_t y_stride);
void repack_tile8_q4_K_avx512vnni(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
				  size_t y_stride);

/* The 32-value types (layouts above): references, and AVX2 (call only when
 * cpu_features() has avx2, fma and f16c; repack_q32_avx2.c). There are no
 * AVX-512 or NEON tiles for them: AVX-512 CPUs run the AVX2 ones, and
 * matmul_repack_wanted() keeps them row-major where no SIMD tile exists. */
void repack_tile_q4_0_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride);
void repack_tile_q4_1_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride);
void repack_tile_q5_0_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride);
void repack_tile_q8_0_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride);
void repack_tile_q4_0_avx2(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			   size_t y_stride);
void repack_tile_q4_1_avx2(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			   size_t y_stride);
void repack_tile_q5_0_avx2(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			   size_t y_stride);
void repack_tile_q8_0_avx2(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			   size_t y_stride);
/* The AVX2 tile of a 32-value type (same conditions); NULL for the others. */
RepackTileFn repack_tile_q32_avx2_get(uint32_t t);
