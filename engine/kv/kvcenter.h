/*
 * kvcenter.h: centered keys, shared by the formats that store k - mu
 * (fmt_centered.c for "+c" on any key format, fmt_pk.c always).
 *
 * The keys of one (layer, kv-head) share a large common part, and softmax
 * ignores a constant added to all scores of a query:
 *   <q, k_p - mu> = <q, k_p> - <q, mu>      (the same for every p),
 * so a centered side stores k - mu and adds <q, mu> back to its scores,
 * which stay in the frame of the exact keys (kvtype.h, "+c").
 *   - Block 0 (positions 0..31) is kept exact, here, in f32: position 0
 *     is the attention sink, short and pointing away from mu.
 *   - mu is the mean of the keys at positions 1..31, chosen when position
 *     31 is appended and kept from then on (rewinds included): a fixed set
 *     of positions, so what is stored does not depend on how a prompt is
 *     split into appends.
 *
 * == Record (8 + 132 d bytes, little-endian; part of the formats' records) ==
 *
 *   offset  size    field
 *   0       4       1 if mu is chosen, else 0 (1 whenever n_kv > 32)
 *   4       4       0
 *   8       4 d     mu (f32; all zero while not chosen)
 *   8 + 4d  128 d   the keys of positions 0..31 (f32; rows not appended
 *                   are whatever the side held); all finite
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

typedef struct KvCenter {
	int dim;
	float *mu;    /* (d,) zeros until chosen */
	float *first; /* (32, d) the keys of block 0, exact */
	bool chosen;
} KvCenter;

/* 0 or -ENOMEM. */
int kvcenter_init(KvCenter *c, int dim);
void kvcenter_fini(KvCenter *c);
size_t kvcenter_bytes(const KvCenter *c);

/*
 * Keys x (n, stride floats apart) of positions pos0..: those of block 0
 * into the exact copy, then mu once position 31 is there. 0 or -EINVAL
 * (the mean is not finite; nothing chosen).
 */
int kvcenter_keep(KvCenter *c, int64_t pos0, int64_t n, const float *x, size_t stride);

/* Key x of position pos as stored: x - mu, or zeros in block 0 (kept exact here). */
void kvcenter_center(const KvCenter *c, int64_t pos, const float *x, float *ret);

/* qmu (G,) = <q_g, mu> * scale for the G query heads q (G, d). */
void kvcenter_qmu(const KvCenter *c, const float *q, int G, float scale, float *qmu);

/*
 * The centered side's scores (G, ld) of block b into the exact frame:
 * block 0 from the exact keys (overwritten), later blocks += qmu[g].
 */
void kvcenter_scores(const KvCenter *c, const float *q, int G, int64_t b, int n, float scale,
		     const float *qmu, float *scores, int ld);

/* The record above: its size, write it at *p (moving *p), read it back. */
size_t kvcenter_record_bytes(int dim);
void kvcenter_record_save(const KvCenter *c, uint8_t **p);
/* 0 or KVFORMAT_E_CORRUPT with err (a state, a mean before one was chosen, a value not finite). */
int kvcenter_record_load(KvCenter *c, int64_t n_kv, const uint8_t **p, Error *err);
