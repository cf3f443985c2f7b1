/*
 * kvropemean.h: the keys' mean before RoPE, and the center it gives each
 * block of 32 positions: what pair-coded keys (fmt_pk.c) subtract.
 *
 * Why. RoPE turns pair i of a key (channels j, j', kernels/cpu/ops.h's
 * pairing) by theta_i p at position p. A part c that the keys share
 * before RoPE is R(theta p) c after it, so block 0's mean (kvcenter.h's
 * mu) matches it near positions 0..31 only: by position 16,000 a pair
 * with theta = 1e-4 has turned 1.6 rad, and k - mu holds an offset as
 * large as c that is constant over a block, which pk's zero-mean
 * codebooks, scaled per block by the RMS, spend their levels on. Seen
 * from block b (positions 32 b .. 32 b + 31) the mean of R(theta p) c is
 *
 *   c_b = D(theta) R(theta (32 b + 15.5)) c,
 *   D(theta) = sin(16 theta) / (32 sin(theta / 2))     (D(0) = 1)
 *
 * (the Dirichlet kernel): the block-constant vector nearest to R(theta p) c
 * over the block. Fast pairs (theta ~ 1) average out (D ~ 0, as block 0's
 * mean of them is ~0 too); slow pairs follow their turn.
 *
 *   - c per rotated pair: the mean over positions 1..31 of R(-theta p) k_p
 *     (angles in double), k_p as kvcenter.h keeps block 0 (binary16), so
 *     a session file rebuilds it from block 0: nothing is stored.
 *     Channels RoPE does not turn (n_rot < head_dim) take kvcenter.h's mu.
 *   - No RoPE known (n_rot 0: shapes of tests and random fills): every
 *     c_b is mu, the centering of pk before this module, float for float.
 *   - Scores add <q, c_b> back (k = (k - c_b) + c_b): per query head,
 *     a_i = <q_i, m_i> and b_i = <q_i, J m_i> (m = D c, J a quarter turn),
 *     so <q, c_b> = sum_i a_i cos phi_i + b_i sin phi_i (+ <q, mu> over
 *     the unturned channels), phi_i = theta_i (32 b + 15.5).
 *   - The phase: cos and sin of theta_i (32 b + 15.5) as the product of
 *     table entries, one per base-32 digit of b (KVROPE_LEVELS digits) and
 *     one for the 15.5, each computed in double: coding and scoring read
 *     the same floats, and no sin or cos runs per block.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "engine/kv/kvcenter.h"
#include "kernels/cpu/ops.h"
#include "kernels/kv_format.h"

#define KVROPE_RADIX 32
#define KVROPE_LEVELS 4 /* blocks below 32^4 = 2^20, positions below 2^25 */

typedef struct KvRopeMean {
	int dim;
	int n_pairs;         /* rotated pairs (n_rot / 2), 0: no RoPE (c_b = mu) */
	int stride, partner; /* pair i: channels j = i stride and j' = j + partner */
	float *m;            /* (d,) D c on the rotated channels, mu on the others */
	float *tab;          /* (1 + LEVELS RADIX, n_pairs, 2) cos, sin; see the top */
	double *theta;       /* (n_pairs,) the angle per position, Rope.inv_freq */
} KvRopeMean;

/*
 * For keys of dim channels turned by rope (NULL or n_rot 0: none).
 * 0, -EINVAL (n_rot > dim) or -ENOMEM.
 */
int kvropemean_init(KvRopeMean *r, int dim, const Rope *rope);
void kvropemean_fini(KvRopeMean *r);
size_t kvropemean_bytes(const KvRopeMean *r);

/* m from block 0 as c keeps it (c->chosen: its mu too); zeros when not chosen. */
void kvropemean_choose(KvRopeMean *r, const KvCenter *c);

/* c_b (d,): the center of block b (0 <= b < 32^KVROPE_LEVELS). */
void kvropemean_center(const KvRopeMean *r, int64_t b, float *ret);

/* Floats of kvropemean_query()'s output per query head. */
static inline size_t kvropemean_query_floats(const KvRopeMean *r)
{
	return 2 * (size_t)r->n_pairs + 1;
}

/* prep (G, kvropemean_query_floats()) for the G query heads q (G, d), scaled by scale. */
void kvropemean_query(const KvRopeMean *r, const float *q, int G, float scale, float *prep);

/* scores (G, ld), rows 0..n-1: += scale <q_g, c_b> from prep. */
void kvropemean_add(const KvRopeMean *r, const float *prep, int G, int64_t b, int n, float *scores,
		    int ld);
