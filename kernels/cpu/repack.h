/*
 * repack.h: weights regrouped once at load for the tiled CPU products.
 *
 * Layout MATMUL_LAYOUT_X4 (Q4_K only, rows a multiple of 4): W (rows, cols)
 * as rows / 4 groups of 4 consecutive rows; within a group, super-block b
 * of its 4 rows lies together, row by row:
 *
 *   group g: [row 4g blk 0][4g+1 blk 0][4g+2 blk 0][4g+3 blk 0][4g blk 1]...
 *
 * Each block is an unchanged BlockQ4_K (144 bytes), so the repacked matrix
 * has exactly the mapped one's size (it replaces it, it does not add to it)
 * and row_stride stays the bytes of one row: group g starts at
 * data + 4 g row_stride, row r's block b at
 * data + 4 (r / 4) row_stride + (4 b + r % 4) sizeof(BlockQ4_K).
 * One stream of weights feeds a 4-row tile, and a tile reads each
 * activation block once for all its rows.
 *
 * Tile kernels: Y (nt tokens, 4 rows) of one group against nt <= 16 Q8_K
 * activation rows. The reference is the row kernel (vec_dot_q4_K_ref) on
 * each row gathered back; the AVX2 and AVX-512 VNNI ones compute the same
 * integer sub-block sums exactly and differ in the order of float
 * accumulation (and the AVX-512 one takes the min term in float).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/wtype.h"

#define REPACK_GROUP 4
/* Tokens per tile call: the AVX-512 8-row kernel's tile (16); the others split it. */
#define REPACK_MAX_NT 16

/*
 * y[t * y_stride + i] = dot(row i of group, activation row t) for i < 4,
 * t < nt (1..REPACK_MAX_NT); act rows a_stride bytes apart; n = cols.
 */
typedef void (*RepackTileFn)(int64_t n, const void *group, const void *act, size_t a_stride, int nt,
			     float *y, size_t y_stride);

/* Whether w (row-major) can be repacked: a type with a tile kernel, rows a
 * multiple of 4, rows packed tight (row_stride == the row's bytes). */
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
