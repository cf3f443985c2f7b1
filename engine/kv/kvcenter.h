/*
 * kvcenter.h: centered keys, shared by the formats that store k - mu
 * (fmt_centered.c for "+c" on any key format, fmt_pk.c always).
 *
 * The keys of one (layer, kv-head) share a large common part, and softmax
 * ignores a constant added to all scores of a query:
 *   <q, k_p - mu> = <q, k_p> - <q, mu>      (the same for every p),
 * so a centered side stores k - mu and adds <q, mu> back to its scores,
 * which stay in the frame of the exact keys (kvtype.h, "+c").
 *   - Block 0 (positions 0..31) is kept here, rounded to binary16
 *     (kvformat_round_f16(): exact to 11 bits, as an f16 cache holds
 *     it; position 0 is the attention sink, short and pointing away
 *     from mu), so that a session record holds it in 2 bytes a value.
 *   - mu is the mean (in f32) of the kept keys at positions 1..31,
 *     chosen whenever position 31 is appended (again after a rewind
 *     below it): a fixed set of positions, so what is stored does not
 *     depend on how a prompt is split into appends, and a file rebuilds
 *     mu from block 0 instead of storing it.
 *
 * == Record (2 d min(n_kv, 32) bytes, little-endian; part of the formats' records) ==
 *
 *   offset  size              field
 *   0       2 d min(n_kv, 32) the keys of positions 0 .. min(n_kv, 32) - 1,
 *                             binary16, all finite
 *
 *   On load mu is the mean of positions 1..31 when n_kv >= 32 (chosen),
 *   else zeros (not chosen: it is chosen when position 31 comes).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

typedef struct KvCenter {
	int dim;
	float *mu;    /* (d,) zeros until chosen */
	float *first; /* (32, d) the keys of block 0, binary16-rounded */
	bool chosen;
} KvCenter;

/* 0 or -ENOMEM. */
int kvcenter_init(KvCenter *c, int dim);
void kvcenter_fini(KvCenter *c);
size_t kvcenter_bytes(const KvCenter *c);

/*
 * Keys x (n, stride floats apart) of positions pos0..: those of block 0
 * into the kept copy (binary16-rounded), then mu when position 31 is
 * among them. 0 or -EINVAL (the mean is not finite; nothing chosen).
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

/* The record above for n_kv tokens: its size, write it at *p (moving *p), read it back. */
size_t kvcenter_record_bytes(int dim, int64_t n_kv);
void kvcenter_record_save(const KvCenter *c, int64_t n_kv, uint8_t **p);
/* 0 or KVFORMAT_E_CORRUPT with err (a key or the mean not finite). */
int kvcenter_record_load(KvCenter *c, int64_t n_kv, const uint8_t **p, Error *err);
