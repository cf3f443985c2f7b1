/*
 * kv_pq_layout.h: one PolarQuant row (the `pq` KV type, engine/codec/kvpq.h)
 * byte by byte, and the shape every reader of it shares.
 *
 * Owns: KvPqShape (dim, levels, bits per level), the row layout below and
 * its inline offsets. Not here: the angle codebooks and encoding
 * (engine/codec/kvpq.h), scoring on the codes (kernels/cpu/kv_attn.h).
 *
 * == The polar transform this layout stores (y = P x, d = dim, L levels) ==
 *
 *   level 0:  s_0 = y                                   (d values)
 *   level l:  n_l = d / 2^l pairs; pair p joins entries p and p + n_l of
 *             level l - 1:
 *               r_l[p]   = sqrt(s_{l-1}[p]^2 + s_{l-1}[p + n_l]^2)
 *               psi_l[p] = atan2(s_{l-1}[p + n_l], s_{l-1}[p])
 *             in [0, 2 pi) at level 1 (coordinates have signs), in
 *             [0, pi/2] above (radii do not); s_l = r_l.
 * Pairing p with p + n_l rather than 2p with 2p + 1 is the same transform
 * of a permuted vector (P is random, so nothing is lost) and keeps every
 * level's reads contiguous for the SIMD kernels. Reading back:
 *   s_{l-1}[p] = cos(psi_l[p]) s_l[p],  s_{l-1}[p + n_l] = sin(psi_l[p]) s_l[p].
 *
 * == Row (kvpq_row_bytes()) ==
 *
 *   2 n_L       the level-L radii r_L[0 .. n_L - 1], n_L = d >> L,
 *               IEEE binary16, little-endian
 *   ceil(A/8)   one bitpack.h stream (LSB first) of every angle code,
 *               level 1's n_1 codes of bits[0] bits, then level 2's n_2
 *               codes of bits[1] bits, ... (A bits in all); level l's code
 *               p is the cell of psi_l[p] in level l's codebook
 *               (engine/codec/kvpq.h); the last byte zero-padded
 *
 * d must be a multiple of 2^L. Levels whose codes start at a whole byte
 * (all of them while n_l b_l is a multiple of 8) can be unpacked 8 at a
 * time by SIMD code.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define KVPQ_MAX_LEVELS 10 /* log2 of the largest head_dim (tq_layout.h's TQ_MAX_DIM) */
#define KVPQ_MAX_BITS 8    /* per angle */

/* What a pq type stores: a plain value. */
typedef struct KvPqShape {
	int dim;                         /* d, a multiple of 2^levels */
	int levels;                      /* L, 1 .. KVPQ_MAX_LEVELS */
	uint8_t bits[KVPQ_MAX_LEVELS];   /* bits[l - 1]: bits per angle of level l (1..8) */
} KvPqShape;

/* n_l: angles (pairs) of level l (1..L); n_0 = d, n_L the stored radii. */
static inline int kvpq_level_n(const KvPqShape *s, int l)
{
	return s->dim >> l;
}

/* Bit offset of level l's first code in the code stream. */
static inline size_t kvpq_level_bit(const KvPqShape *s, int l)
{
	size_t bit = 0;
	for (int k = 1; k < l; k++)
		bit += (size_t)kvpq_level_n(s, k) * s->bits[k - 1];
	return bit;
}

/* Bits of all angle codes (A above). */
static inline size_t kvpq_code_bits(const KvPqShape *s)
{
	return kvpq_level_bit(s, s->levels + 1);
}

/* Bytes of the radii that open a row. */
static inline size_t kvpq_radii_bytes(const KvPqShape *s)
{
	return 2 * (size_t)kvpq_level_n(s, s->levels);
}

/* Bytes of one stored row. */
static inline size_t kvpq_row_bytes(const KvPqShape *s)
{
	return kvpq_radii_bytes(s) + (kvpq_code_bits(s) + 7) / 8;
}
