/*
 * kvpk.h: pair-coded keys, the `pk<B>` key type (kvtype.h): one block of
 * KVPK_BLOCK (= KVSTORE_BLOCK_TOKENS) centered keys of one (layer,
 * kv-head) at a time, each RoPE pair (channels 2i, 2i+1) with its own
 * scale and bit width.
 *
 * Why. Attention needs <q, k>, and its error for a key error e is
 * <q, e>: coordinates where queries are large count most. TurboQuant's
 * rotation gives every coordinate the same bits; but on real models the
 * queries' energy per RoPE pair, and the keys' spread per pair, differ by
 * orders of magnitude. Spending bits by w_i * sigma_i^2 (reverse water
 * filling) lowers the mean squared score error at equal bits.
 *   - w_i (query energy of pair i) is stable along a sequence: it is
 *     measured on the queries at positions 1..31 (kvstore.c) and fixed.
 *   - sigma_i (the keys' spread) is not: low-frequency pairs drift with
 *     position. So each block carries its own sigma_i, measured on its 32
 *     keys, and its allocation follows from (w, sigma) (stored too).
 *
 * == One block's key region (BT rows; kvtype_vec_bytes() per row) ==
 *
 *   BT * (pk_bits / 8)   codes, column by column: coordinate j's BT
 *                        codes of b = bits[j / 2] bits each (4 b bytes;
 *                        row t at bit t b, LSB first, bitpack.h's order),
 *                        after the columns of coordinates 0..j-1; a code
 *                        is the cell of x_j / sigma_{j/2} in the
 *                        Lloyd-Max codebook of a standard normal. Columns,
 *                        because every row of a column has the same width
 *                        and attention reads all 32 rows
 *   d / 2                scale bytes: s_i = round(8 log2 rms_i) + 128
 *                        clamped to 1..255, rms_i over the block's rows
 *                        and both channels of pair i; sigma_i =
 *                        2^((s_i - 128) / 8); s_i = 0 for a pair that
 *                        is all zero
 *   d / 4                bit widths, two per byte (low nibble first),
 *                        0..8, summing to pk_bits / 2
 *   rest                 zero
 *
 * Allocation: starting from 0 bits everywhere, pk_bits / 2 times give
 * one more bit to the pair with the largest w_i sigma_i^2 (D(b) -
 * D(b+1)), D the normal codebook's MSE (D(0) = 1); ties to the lower
 * pair. A pair at 0 bits reads back as zero.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVPK_MAX_BITS 8
#define KVPK_MAX_DIM 1024
#define KVPK_MAX_GROUP 64 /* query heads per kv-head that kvpk_scores() takes */
#define KVPK_BLOCK 32 /* rows per block: KVSTORE_BLOCK_TOKENS */

typedef struct KvPk {
	int dim;
	int code_bits;                        /* per row */
	size_t row_bytes;                     /* kvtype_vec_bytes() */
	const float *centroids[KVPK_MAX_BITS + 1]; /* [b]: 2^b, standard-normal units */
	const float *bounds[KVPK_MAX_BITS + 1];
	double mse[KVPK_MAX_BITS + 1];        /* D(b) */
} KvPk;

/*
 * The codec for head_dim dim (16..KVPK_MAX_DIM, a multiple of 4) and
 * code_bits bits per row. 0 or -EINVAL / -ENOMEM.
 */
int kvpk_init(KvPk *pk, int dim, int code_bits, size_t row_bytes);

/*
 * Encode n keys x (n, dim) minus mu (dim,; NULL: x is centered already)
 * with query pair energies w (dim / 2,) into blk (BT * row_bytes); n <=
 * BT, rows past n are zero.
 */
void kvpk_encode_block(const KvPk *pk, const float *x, int n, const float *mu, const float *w,
		       uint8_t *blk);

/*
 * Whether blk holds a coded block: every bit width <= 8, adding up to
 * code_bits / 2 (so reading a row stays inside it). Session files are
 * checked with it.
 */
bool kvpk_block_coded(const KvPk *pk, const uint8_t *blk);

/* Row t of blk read back into y (dim,). The scalar reference. */
void kvpk_decode_row(const KvPk *pk, const uint8_t *blk, int t, float *y);

/*
 * scores[g * stride + t] = <q_g, x~_t> * scale for the G query heads q (G,
 * dim; G <= KVPK_MAX_GROUP) and rows t < nj of blk.
 */
void kvpk_scores(const KvPk *pk, const uint8_t *blk, const float *q, int G, int nj, float scale,
		 float *scores, int stride);
