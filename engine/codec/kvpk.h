/*
 * kvpk.h: the codec of pair-coded keys, the `pk<B>` key type (kvtype.h):
 * one block of KV_BLOCK_TOKENS centered keys of one (layer, kv-head) at a
 * time, each RoPE pair (channels 2i, 2i+1) with its own scale and bit
 * width. Scoring on the codes is a kernel (kernels/cpu/kv_attn.h).
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
 * The block layout is kernels/kv_pk_layout.h's (codes column by column,
 * then a scale byte per pair, then the widths); this module chooses what
 * goes in it.
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

#include "kernels/cpu/kv_attn.h"
#include "kernels/kv_pk_layout.h"

typedef struct KvPk {
	KvPkRows rows;                        /* dim, code_bits, centroids: the kernels' view */
	size_t row_bytes;                     /* kvpk_row_bytes() */
	const float *bounds[KVPK_MAX_BITS + 1];
	double mse[KVPK_MAX_BITS + 1];        /* D(b) */
} KvPk;

/*
 * The codec for head_dim dim (16..KVPK_MAX_DIM, a multiple of 4) and
 * code_bits bits per row (a multiple of 8). 0 or -EINVAL / -ENOMEM.
 */
int kvpk_init(KvPk *pk, int dim, int code_bits);

/*
 * Encode n keys x (n, dim) minus mu (dim,; NULL: x is centered already)
 * with query pair energies w (dim / 2,) into blk (32 row_bytes); n <= 32,
 * rows past n are zero.
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

