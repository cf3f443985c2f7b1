/*
 * kvformat.h: one KV format as the store sees it. A format is what one
 * side (K or V) of one (layer, kv-head) of a compressed cache stores per
 * head vector, how attention reads it, and what it keeps besides the rows
 * (a codec, a first block kept as binary16, query energies). Each format is one
 * KvFormatOps table in its own file:
 *
 *   fmt_plain.c     f32, f16, q8_0, q4_0, each optionally +h
 *   fmt_tq.c        TurboQuant (tq.h): .5 splits, +qjl/+sqjl, outlier
 *                   channels ("o"), _nc, _r1
 *   fmt_centered.c  +c: any key format above, storing k - mu; +s: plain
 *                   or TurboQuant values with block 0 kept exact
 *   fmt_pk.c        pair-coded keys (kvpk.h), centered by themselves
 *   fmt_pq.c        PolarQuant (kvpq.h), keys and values
 *
 * and one line of the registry (kvformat.c). The store (kvstore.c) owns
 * blocks, splitting, combining and memory accounting and calls these
 * operations; kvtype.c asks them for names and sizes; the session file
 * container (session.c) writes and reads their records without knowing
 * what is in them. docs/architecture.md says how to add a format.
 *
 * == Calls, in the order a model makes them ==
 *
 * For each layer of a batch at positions pos0 .. pos0 + n - 1:
 *   observe(q)   keys only, optional: the batch's queries, before its
 *                keys are appended: what a format learns from queries
 *                (pk's query energies) it learns here, so the bytes it
 *                stores depend on the tokens, never on how attention ran;
 *   append(x)    the batch's rows; blocks of those positions exist;
 *   query, scores / values, finish: attention, which only reads.
 * A rewind (kvcache_set_n_tokens() to fewer tokens) shows as an append
 * at a pos0 below the positions appended before.
 *
 * Return codes: 0, -errno, or the KVFORMAT_E_* below.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/half.h"
#include "base/util.h"
#include "engine/kv/kvcache.h"
#include "engine/kv/kvtype.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/kv_format.h"

/* Codes of the operations (positive; -errno for system errors). */
enum {
	KVFORMAT_E_UNSUPPORTED = 1, /* this type cannot be kept here (device, role, shape) */
	KVFORMAT_E_OTHER_TYPE,      /* a session record of another type: recompute, not corrupt */
	KVFORMAT_E_CORRUPT,         /* a session record (or block) that cannot be what was saved */
};

/* Where a cache keeps its rows: what supports() is asked about. */
typedef enum KvDevice {
	KV_DEVICE_CPU,
	KV_DEVICE_CUDA,
} KvDevice;

/*
 * The rows of one side in the store's blocks. Block b of the side's
 * (layer, kv-head) is blocks[b] (NULL: never written); its region for
 * this side starts at offset (0 for keys, 32 times the key row bytes for
 * values) and holds 32 rows of row_bytes. Blocks below first were dropped
 * by a sliding-window layer (kvcache.h): no query will read them.
 */
typedef struct KvSideRows {
	uint8_t *const *blocks; /* (n_blocks,) */
	int64_t n_blocks;
	int64_t first;
	size_t offset;
	size_t row_bytes;
} KvSideRows;

/* The side's region of block b (the block must exist). */
static inline uint8_t *kv_side_region(const KvSideRows *r, int64_t b)
{
	return r->blocks[b] + r->offset;
}

/* The stored row of position pos (its block must exist). */
static inline uint8_t *kv_side_row(const KvSideRows *r, int64_t pos)
{
	return kv_side_region(r, pos / KV_BLOCK_TOKENS) + (size_t)(pos % KV_BLOCK_TOKENS) * r->row_bytes;
}

/* What a side is made for. */
typedef struct KvSideSetup {
	KvType type;       /* as planned (TQ: tq.c's default seeds) */
	KvRole role;
	int layer, head;
	uint64_t seed;     /* the cache's: formats with random codecs derive theirs from it */
	int group;         /* query heads per kv-head */
	const Rope *rope;  /* the keys' RoPE (kvcache_layer_rope()), NULL: unknown; read during init only */
} KvSideSetup;

typedef struct KvFormatOps KvFormatOps;
struct KvFormatOps {
	const char *name;
	/* Tag of the session records (four ASCII bytes, little-endian u32). */
	uint32_t tag;
	/* Keys stored minus their mean by the format itself: +c is not applied on top. */
	bool centers;

	/* ---- types (kvtype.c) ---- */
	/*
	 * The type called name (without a "+c" suffix) for vectors of dim
	 * values stored as role. 0, -ENOENT (not a name of this format: no
	 * message) or KVTYPE_E_UNKNOWN / _ROLE / _DIM with err set.
	 */
	int (*parse)(const char *name, KvRole role, int dim, KvType *ret, Error *err);
	/* The canonical name of t (without "+c") into buf. */
	void (*type_name)(const KvType *t, char *buf, size_t size);
	/* Whether a and b (of this format, same dim and flags) store the same bytes. */
	bool (*type_equal)(const KvType *a, const KvType *b);
	/* Bytes stored per head vector: codes, norms, scales, everything. */
	size_t (*vec_bytes)(const KvType *t);
	/*
	 * Whether a side of type t can be kept on dev for shape (any role
	 * limit included). 0 or KVFORMAT_E_UNSUPPORTED with err naming why.
	 */
	int (*supports)(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
			Error *err);

	/* ---- a side's life ---- */
	/* A side's state into *ret_state. 0, -ENOMEM, or a codec's code with err. */
	int (*init)(const KvSideSetup *setup, void **ret_state, Error *err);
	void (*free)(void *st);
	/* Bytes the state holds (codec, exact rows, stage): memory accounting. */
	size_t (*state_bytes)(const void *st);
	/* Optional: the format this one wraps (+c's inner format) and its state. */
	const void *(*inner)(const void *st, const KvFormatOps **ret_ops);

	/*
	 * Optional: fix what the format chooses from the first rows it is
	 * shown, x (n, stride floats apart), storing nothing (TQ's outlier
	 * masks; append() does it too). For caches that store the rows
	 * elsewhere (a GPU). 0, -ENOMEM or -EINVAL (rows not finite).
	 */
	int (*fix)(void *st, const float *x, int64_t n, size_t stride);
	/* Optional, keys: the G query heads (G, d) of each of n tokens, stride floats apart. */
	void (*observe)(void *st, int64_t pos0, int64_t n, const float *q, size_t stride);
	/* Rows x (n, stride floats apart) of positions pos0.. into rows. 0, -ENOMEM, -EINVAL. */
	int (*append)(void *st, const KvSideRows *rows, int64_t pos0, int64_t n, const float *x,
		      size_t stride);

	/* ---- attention (reads only) ---- */
	/* Keys: bytes of the prepared form of G query heads. */
	size_t (*query_bytes)(const void *st, int G);
	/* Keys: the G query heads q (G, d) of one token into prep. */
	void (*query)(const void *st, const float *q, int G, void *prep);
	/*
	 * Keys: scores (G, ld) = scale * <q_g, k_t> for the n rows of block
	 * b, in the frame of the exact keys (a format that stores k - mu adds
	 * <q, mu> back). own is the block of the querying token's position
	 * (a format may read it exact). q is as given, prep as query() made it.
	 */
	void (*scores)(const void *st, const KvSideRows *rows, const float *q, const void *prep,
		       int G, int64_t b, int64_t own, int n, float scale, float *scores, int ld);
	/*
	 * Values: acc (G, acc_ld) += p (G, ld) times the n rows of region (block
	 * b's), in the stored domain.
	 */
	void (*values)(const void *st, const uint8_t *region, int64_t b, const float *p, int ld, int G,
		       int n, float *acc, int acc_ld);
	/*
	 * Optional, values: x (d,) into the stored domain, ret (d,), so that
	 * finish() of sum_j p_j to_stored(x_j) is sum_j p_j x_j (TurboQuant:
	 * P x; +h: R x; plain: x). What a wrapper (+c values) needs to add
	 * rows it keeps exact to the accumulator.
	 */
	void (*to_stored)(const void *st, const float *x, float *ret);
	/* Values: out (d,) = acc (d,) back in the original domain. */
	void (*finish)(const void *st, const float *acc, float *out);
	/* The stored row of position pos, read back in the original domain (tests, kvstats). */
	void (*load_row)(const void *st, const KvSideRows *rows, int64_t pos, float *ret);

	/* ---- session records (documented byte by byte in the format's file) ---- */
	/* Bytes of the side's record in a file of n_kv tokens. */
	size_t (*record_bytes)(const void *st, int64_t n_kv);
	/* The record into out (record_bytes()); 0 or -EINVAL (a state the record cannot hold). */
	int (*record_save)(const void *st, const KvSideRows *rows, int64_t n_kv, uint8_t *out);
	/*
	 * Restore from a record (record_bytes(n_kv) bytes, checksummed by the
	 * container but otherwise untrusted) after the blocks of positions
	 * 0 .. n_kv - 1 are in. 0, KVFORMAT_E_OTHER_TYPE, KVFORMAT_E_CORRUPT
	 * (err says what) or -ENOMEM.
	 */
	int (*record_load)(void *st, const KvSideRows *rows, int64_t n_kv, const uint8_t *in,
			   Error *err);
	/*
	 * Optional: bytes of block b's region in a file of n_kv tokens, n of
	 * its rows below n_kv (1..32), a prefix of the region (what a format
	 * keeps elsewhere, in its record, takes none). NULL: n rows.
	 */
	size_t (*region_file_bytes)(const void *st, int64_t b, int n);
	/*
	 * Optional: those bytes of block b's region into out. NULL: the
	 * region's first region_file_bytes() bytes. On load the rest of the
	 * region is zeros.
	 */
	void (*region_save)(const void *st, const uint8_t *region, int64_t b, int n, uint8_t *out);
};

/* The format that keeps type t (+c on a format that does not center: fmt_centered). */
const KvFormatOps *kvformat_of(const KvType *t);

/* The formats of the registry, for name lookups: NULL past the last. */
const KvFormatOps *kvformat_at(size_t i);

/*
 * supports() of t's format: 0 or KVFORMAT_E_UNSUPPORTED with err set. The
 * one capability table: the store asks it for KV_DEVICE_CPU, the CUDA
 * cache for KV_DEVICE_CUDA.
 */
int kvformat_supports(const KvType *t, KvRole role, const KvCacheShape *shape, KvDevice dev,
		      Error *err);

/* ---- helpers the formats share ---- */

/*
 * Rows read by kernels/cpu/kv_attn.h's row kernels (plain and TurboQuant),
 * with the kernels chosen at run time. A format whose state begins with
 * one uses kvformat_row_scores() / kvformat_row_values() as its ops.
 */
typedef struct KvRowKernels {
	KvAttnRows rows;
	KvAttnScoresFn scores;
	KvAttnValuesFn values;
} KvRowKernels;

/* rk->rows is set up by the format; this picks the kernels. */
void kvformat_row_kernels_init(KvRowKernels *rk);
void kvformat_row_scores(const void *st, const KvSideRows *rows, const float *q, const void *prep,
			 int G, int64_t b, int64_t own, int n, float scale, float *scores, int ld);
void kvformat_row_values(const void *st, const uint8_t *region, int64_t b, const float *p, int ld,
			 int G, int n, float *acc, int acc_ld);

/* scores[g * ld + t] = scale * <q_g, x_t> over exact rows x (n, d), n <= 32, in f32 (kv_attn_exact_scores_get()). */
void kvformat_exact_scores(const float *x, int d, const float *q, int G, int n, float scale,
			   float *scores, int ld);

/* Little-endian record fields; the cursor moves past them. */
static inline void kvrec_put_u32(uint8_t **p, uint32_t v)
{
	put_le(*p, v, 4);
	*p += 4;
}

static inline uint32_t kvrec_get_u32(const uint8_t **p)
{
	uint32_t v = (uint32_t)get_le(*p, 4);
	*p += 4;
	return v;
}

/* n floats as their IEEE bits, little-endian. */
void kvrec_put_floats(uint8_t **p, const float *x, size_t n);
/* n floats back; false if one is not finite (nothing else is checked). */
bool kvrec_get_floats(const uint8_t **p, float *x, size_t n);

/*
 * x rounded to the nearest binary16 value, saturating at +-65504 (NaN
 * stays NaN): what a format keeps exact keeps at this precision, so that
 * its session record holds it in 2 bytes and restores it bit for bit.
 */
static inline float kvformat_round_f16(float x)
{
	if (x > 65504.0f)
		x = 65504.0f;
	else if (x < -65504.0f)
		x = -65504.0f;
	return half_to_f32(f32_to_half(x));
}

/*
 * The same for bfloat16 (values whose range f16 does not cover: energies),
 * saturating at the largest finite bfloat16; NaN becomes that too.
 */
static inline float kvformat_round_bf16(float x)
{
	const float max = 3.38953139e38f; /* 0x7f7f */
	if (!(x <= max))
		x = x < 0 ? -max : max;
	else if (x < -max)
		x = -max;
	return bf16_to_f32(f32_to_bf16(x));
}

/* n floats (each binary16-exact: kvformat_round_f16()) as binary16, little-endian. */
void kvrec_put_f16(uint8_t **p, const float *x, size_t n);
/* n binary16 values back; false if one is not finite. */
bool kvrec_get_f16(const uint8_t **p, float *x, size_t n);
/* n floats (each bfloat16-exact) as bfloat16, little-endian. */
void kvrec_put_bf16(uint8_t **p, const float *x, size_t n);
/* n bfloat16 values back; false if one is not finite. */
bool kvrec_get_bf16(const uint8_t **p, float *x, size_t n);

/* A four-character record tag as the u32 the file holds. */
#define KVREC_TAG(a, b, c, d) \
	((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)

/* The formats of the registry (each defined in its own file). */
extern const KvFormatOps kvfmt_plain;
extern const KvFormatOps kvfmt_tq;
extern const KvFormatOps kvfmt_centered;
extern const KvFormatOps kvfmt_pk;
extern const KvFormatOps kvfmt_pq;
