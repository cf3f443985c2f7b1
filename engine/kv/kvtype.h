/*
 * kvtype.h: what the KV cache stores per head vector, and where: the KV
 * types of product.md (`--kv K[:V]`), per-layer overrides, and their exact
 * storage cost (turboquant.md section 6).
 *
 * Owns: the KvType value, the KvSpec grammar and its resolution into a
 * per-layer (K type, V type) table (KvPlan), bits per value. Each type's
 * name, equality and bytes per head vector come from its KV format
 * (kvformat.h: fmt_plain.c, fmt_tq.c, fmt_centered.c, fmt_pk.c), which also
 * stores and attends; this module asks the registry. Not here: the
 * codecs (kvquant.h, tq.h, kvpk.h), the KV store (kvstore.h).
 *
 * == Types (one head vector x (d,) of one layer, kv-head and token) ==
 *
 *   name      stored bytes per head vector           bits/value (d = 64)
 *   f32       4 d                                    32
 *   f16       2 d (IEEE binary16)                    16
 *   q8_0      d / 32 ggml block_q8_0 (34 bytes)      8.5
 *   q4_0      d / 32 ggml block_q4_0 (18 bytes)      4.5
 *   <b>+h     as <b>; x rotated first (below)        as <b>
 *   <b>+s     values: as <b>; block 0 kept exact     as <b>
 *             beside the rows (below)
 *   tq...     tq.h's coded vector, tq_code_bytes()   tq4 4.25, tq3 3.25 ...
 *   pk<B>     B d / 8 code bytes + ceil(3 d / 128)   pk4 4.25, pk2.5 2.75
 *             of per-block side data (kvpk.h)
 *   pq...     PolarQuant rows (kvpq.h, fmt_pq.c)     pq 3.875, pq4f 3.25,
 *                                                    pq3f 2.25
 *
 * q8_0 and q4_0 need d a multiple of 32 (the ggml block size); +h needs d
 * a power of two. TQ names are tq.h's (tq_desc_from_name): tq1..tq8,
 * tq<B>.5 (half the coordinates at B+1 bits), tq<B>h<n>, an "o" suffix
 * (outlier channels), "+qjl" / "+sqjl" (turboquant.md section 3; on
 * values the unbiased residual estimate of v, fmt_tq.c, CPU only) and "_nc". A TQ type's TqDesc has
 * tq.c's default seeds; the KV store derives per (layer, kv-head, K/V)
 * seeds from it and records them with the codes.
 *
 * == The +h variants (what llama.cpp does for quantized caches) ==
 *
 * Before block quantization the head vector is multiplied by the
 * normalised Sylvester Hadamard matrix R = H / sqrt(d) (H[i][j] =
 * (-1)^popcount(i & j)): y = R x, computed as fwht() then a scale by
 * 1 / sqrt(d). R is symmetric and orthogonal, so R^-1 = R^T = R. The
 * rotation spreads outlier channels over the whole vector, so a block's
 * absmax scale is not spent on one channel. Attention never un-rotates
 * the cache:
 *   keys:   <q, k> = <R q, R k>: rotate each query once (per head, per
 *           token), then score it against the stored (rotated) keys;
 *   values: sum_j p_j v_j = R (sum_j p_j R v_j): accumulate the stored
 *           (rotated) values, then rotate the output once per head.
 * kvquant.h has both steps (kvquant_query_prepare, kvquant_output_finish).
 * f32+h and f16+h are accepted too (nearly lossless; they exercise that
 * path without quantization error).
 *
 * == +c: centered keys (keys only; any format: "tq4_nc+c", "q4_0+h+c") ==
 *
 * The keys of one (layer, kv-head) share a large common part (on
 * SmolLM2-135M the mean key carries about half of their energy), and a
 * quantizer's error grows with the norm of what it stores. Softmax
 * ignores a constant added to all scores of a query, and
 *   <q, k_p - mu> = <q, k_p> - <q, mu>      (the same constant for every p),
 * so a +c side stores k_p - mu instead of k_p: attention is unchanged but
 * for the smaller error. Scores are <q, k~_p - mu> + <q, mu>, the frame of
 * the exact keys, so that they do not depend on when mu was chosen.
 *   - Block 0 (positions 0..31) is kept exact: its keys are stored as f32
 *     beside the blocks and scored as <q, k_p> in f32 (their rows hold
 *     codes of zero vectors, never read). Position 0 is the attention
 *     sink, a key unlike the rest (short, pointing away from mu) that many
 *     heads attend to most: centering would lengthen it.
 *   - mu (d floats) is the mean of the keys at positions 1..31, chosen
 *     when position 31 is stored and kept from then on (rewinds
 *     included). A fixed set of positions, so the stored bytes do not
 *     depend on how a prompt is split into appends.
 * Cost: 33 d floats per (layer, kv-head) per cache, not per token (8.4 KB
 * at d = 64); bits per value count tokens and are those without +c.
 *
 * == +s: the sink's values kept exact (values only; plain or TQ formats:
 *    "tq2.5_nc+s", "q4_0+h+s") ==
 *
 * The values of block 0 (positions 0..31) are kept beside the rows,
 * binary16-rounded, as +c keeps block 0's keys, and read from there: the
 * rows of block 0 hold codes of zero vectors, never read. Position 0 is
 * the attention sink: on SmolLM2-135M the f32 attention of layers 12-29
 * puts 24 to 56 % of its weight on block 0 (docs/benchmarks.md, issue 25),
 * so the error of its coded values passes into the output nearly whole,
 * where the errors of many weakly weighted rows average out. Cost: 32 d
 * binary16 values per (layer, kv-head) per cache (4 KB at d = 64), nothing
 * per token. Values are not centered: a mean from positions 1..31
 * measured worse than none in layers 3-9 of that model (same section).
 *
 * == pk<B>: pair-coded keys (keys only; always centered as +c) ==
 *
 * kvpk.h's format: each block of 32 keys (past block 0) stores, per RoPE
 * pair of channels, a scale and a bit width chosen by reverse water
 * filling on w_i sigma_i^2, where w_i is the energy of the queries in
 * that pair (positions 1..31, fixed like mu) and sigma_i the block's own
 * spread; B bits per coordinate on average (B d a multiple of 8: pk4,
 * pk2.5, pk4.125 at d = 64). It spends the bits where query and key
 * energy meet, which a rotation cannot (TurboQuant gives every
 * coordinate the same bits). Costs: the keys of a block wait in f32 until
 * the block is whole, and those of the last coded block stay too (at most
 * 63 per (layer, kv-head) between batches, plus a prompt chunk); a query
 * reads its own block exact, so scores do not depend on how a prompt was
 * split. The query energies are shown to the cache before the keys
 * (kvcache_observe()), never learnt in attention. fmt_pk.c has the rest
 * (rewinds, the session record). No GPU kernels yet.
 *
 * == Spec grammar (`--kv SPEC`) ==
 *
 *   spec     := pair ( ',' override )*
 *   override := layers '=' pair
 *   pair     := type [ ':' type ]         K type, V type; one type means both
 *   layers   := index [ '-' index ]       an inclusive range
 *   index    := [ '-' ] digits            negative: from the end (-1 = last)
 *
 * The first pair applies to every layer; overrides apply left to right,
 * later ones winning. Examples (30 layers):
 *   "tq4"                         tq4 keys and values everywhere
 *   "q8_0:q4_0"                   q8_0 keys, q4_0 values
 *   "tq3.5:tq3,0-1=q8_0,-2--1=q8_0"
 *                                 layers 0, 1, 28, 29 at q8_0, the rest
 *                                 tq3.5 keys and tq3 values
 *   "tq4+qjl:tq4,5=f16:q8_0"      layer 5 only: f16 keys, q8_0 values
 *   "tq4_nc+c:tq3_nc"             centered tq4_nc keys, tq3_nc values
 *   "pk2.25:tq2.5_nc+s"           pair-coded keys, tq2.5_nc values with
 *                                 block 0 (the sink) kept exact
 * No spaces. Ranges are checked against the layer count at resolve time
 * (a range that is out of range or empty there is an error, never
 * clamped). Type names are case-sensitive (lower case).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "engine/codec/tq.h"
#include "kernels/kv_format.h"
#include "kernels/kv_pq_layout.h"

#define KVTYPE_NAME_MAX 32    /* longest type name, with NUL */
#define KVSPEC_MAX_RULES 32   /* the default pair plus overrides */
#define KVSPEC_MAX_LAYERS 4096
#define KVSPEC_MAX_LEN 1024   /* longest spec string */

/* Module error codes (positive; -errno for system errors). */
enum {
	KVTYPE_E_UNKNOWN = 1, /* not a KV type name */
	KVTYPE_E_ROLE,        /* a key-only type (+c, pk) given for values */
	KVTYPE_E_DIM,         /* the type cannot store vectors of this head_dim */
	KVTYPE_E_SYNTAX,      /* the spec does not follow the grammar */
	KVTYPE_E_RANGE,       /* a layer range outside the model, or empty */
};

/*
 * The daemon's default KV type, chosen by measurement (docs/benchmarks.md,
 * "Issue 5: fidelity", "Centered keys" and "Pair-coded keys"): pair-coded
 * keys at 5 bits (kvpk.h, centered like +c) and TurboQuant values at 3.5
 * bits, norm-corrected, 4.5 bits per value like q4_0+h. Keys get the bits
 * because their errors pass through the softmax.
 * KV_DEFAULT_SPEC_GPU is the default where the cache lives on a GPU:
 * TurboQuant keys without +c, since the CUDA kernels have neither pk nor +c
 * yet.
 */
#define KV_DEFAULT_SPEC "pk5:tq3.5_nc"
#define KV_DEFAULT_SPEC_GPU "tq5_nc:tq3.5_nc"

/*
 * `--kv small`: the best measured at <= 2.67 bits per value on
 * SmolLM2-135M (docs/benchmarks.md, "Issue 25": mean KLD 0.091 at ctx
 * 2048 against pk2.75:tq2_nc's 0.099; values got the bit). It misses the
 * issue's goal (KLD under q4_0's, every needle f32 finds). One pair for
 * every layer, so that it fits every model (a layer range would not).
 * KV_SMALL_SPEC_GPU: TurboQuant only (no pk kernels on the GPU), not
 * measured for lack of a GPU.
 */
#define KV_SMALL_SPEC "pk2.25:tq2.5_nc"

/*
 * `--kv exact`: tq8 (8.25 bits per value) measures on the f16 noise floor
 * (KLD 0.0034 against f16's 0.0034 at ctx 4096, docs/benchmarks.md
 * "Issue 5"), on the CPU and the GPU.
 */
#define KV_EXACT_SPEC "tq8"
#define KV_SMALL_SPEC_GPU "tq2.5_nc:tq2_nc"

/*
 * Named presets, so users need not learn the grammar: `--kv NAME` is the
 * spec of the preset (kvspec_parse() takes the names wherever a spec is
 * read), or its GPU spec where the cache lives on a GPU (the daemon).
 *   default   KV_DEFAULT_SPEC, 4.5 bits per value
 *   small     the best configuration measured at <= 2.67 bits per value
 *             (6x smaller than f16; docs/benchmarks.md, "Issue 25")
 *   exact     KV_EXACT_SPEC: f16-level fidelity at half f16's size
 */
typedef struct KvPreset {
	const char *name;
	const char *spec;     /* on the CPU */
	const char *spec_gpu; /* where the cache is on a GPU (no pk, no +c there yet) */
	const char *what;     /* one line for --help */
} KvPreset;

/* The preset called name, or NULL. */
const KvPreset *kvspec_preset(const char *name);
/* The presets in order, NULL past the last. */
const KvPreset *kvspec_preset_at(size_t i);

typedef enum KvRole {
	KV_ROLE_K = 0,
	KV_ROLE_V = 1,
} KvRole;

/* A type resolved for one head dimension. A plain value: copy freely. */
typedef struct KvType {
	KvFormat format;
	bool hadamard; /* +h: stored vectors are R x (not for TQ) */
	bool centered; /* +c (keys only): stored vectors are x - mu, position 0 kept exact */
	bool sink;     /* +s (values only): block 0 (positions 0..31) kept exact beside the rows */
	int dim;       /* head_dim d */
	TqDesc tq;     /* KV_FORMAT_TQ only (tq.c's default seeds) */
	int code_bits; /* formats with a bit budget per head vector (pk: B d) */
	KvPqShape pq;  /* KV_FORMAT_PQ only: levels and bits per level */
} KvType;

/* One layer of a resolved spec. */
typedef struct KvLayerTypes {
	KvType k;
	KvType v;
} KvLayerTypes;

/* One rule of a parsed spec: layers first..last (as written) get (k, v). */
typedef struct KvSpecRule {
	bool all;    /* the default pair: every layer */
	int first;   /* negative: from the end */
	int last;
	char k[KVTYPE_NAME_MAX]; /* type names as written */
	char v[KVTYPE_NAME_MAX];
} KvSpecRule;

/* A parsed spec, independent of the model. A plain value. */
typedef struct KvSpec {
	int n_rules; /* rules[0] is the default pair */
	KvSpecRule rules[KVSPEC_MAX_RULES];
} KvSpec;

/* A spec resolved for a model: one (K, V) type pair per layer. */
typedef struct KvPlan {
	int n_layers;
	int n_kv_heads;
	int head_dim;
	KvLayerTypes *layers; /* (n_layers,) */
} KvPlan;

/* ---- types ---- */

/*
 * The type called name, for vectors of dim values stored as role.
 * Returns 0, KVTYPE_E_UNKNOWN (also for a malformed TQ name),
 * KVTYPE_E_ROLE (+c or pk for values, +s for keys) or KVTYPE_E_DIM; err names
 * the token. *ret written only on success.
 */
int kvtype_from_name(const char *name, KvRole role, int dim, KvType *ret, Error *err);

/*
 * The canonical name of t into buf ("q4_0+h", "tq3.5", "tq4+qjl"); it
 * parses back to an equal type. Truncated to size.
 */
void kvtype_name(const KvType *t, char *buf, size_t size);

/* Whether a and b store the same bytes (TQ: tq_desc_equal). */
bool kvtype_equal(const KvType *a, const KvType *b);

/*
 * Bytes stored for one head vector of one token (codes, scales, norms,
 * gammas: everything).
 */
size_t kvtype_vec_bytes(const KvType *t);

/* kvtype_vec_bytes() * 8 / dim. */
double kvtype_bits_per_value(const KvType *t);

/* ---- specs ---- */

/*
 * Parse text by the grammar above, or the spec of the preset text names.
 * Checks every type name (TQ names
 * against the largest head_dim, so names that need a particular dim are
 * only fully checked by kvspec_resolve) and the role of the V side.
 * Returns 0, KVTYPE_E_SYNTAX, KVTYPE_E_UNKNOWN or KVTYPE_E_ROLE with a
 * message quoting the offending token. *ret written only on success.
 */
int kvspec_parse(const char *text, KvSpec *ret, Error *err);

/*
 * The spec in canonical form ("tq3.5:tq3,0-1=q8_0,-2--1=q8_0"; a pair
 * with K = V printed once). Parses back to an equal spec. Truncated to
 * size.
 */
void kvspec_name(const KvSpec *spec, char *buf, size_t size);

/*
 * The per-layer table of spec for a model with n_layers layers of
 * n_kv_heads heads of head_dim values. Returns 0, -EINVAL (a dimension
 * out of range), -ENOMEM, KVTYPE_E_RANGE (a range outside
 * [0, n_layers) or empty), KVTYPE_E_DIM or KVTYPE_E_UNKNOWN (a type
 * that cannot store head_dim values); err names the token.
 */
int kvspec_resolve(const KvSpec *spec, int n_layers, int n_kv_heads, int head_dim,
		   KvPlan **ret, Error *err);

/* Parse then resolve. Same returns as the two. */
int kvplan_from_text(const char *text, int n_layers, int n_kv_heads, int head_dim,
		     KvPlan **ret, Error *err);

KvPlan *kvplan_free(KvPlan *plan);
DEFINE_FREEP(KvPlan, kvplan_free)

/* Bytes stored per token: every layer, K and V, every kv-head. */
size_t kvplan_bytes_per_token(const KvPlan *plan);

/*
 * turboquant.md section 6: kvplan_bytes_per_token() * 8 /
 * (2 * n_layers * n_kv_heads * head_dim), i.e. the mean over layers of
 * the K and V types' bits per value.
 */
double kvplan_bits_per_value(const KvPlan *plan);

/* Whether every layer has the same K type and the same V type. */
bool kvplan_is_uniform(const KvPlan *plan);

/*
 * Whether every layer keeps f32 keys and values without +h: such a plan
 * is the exact f32 cache wherever a cache is made (kvcache_new_host()).
 */
bool kvplan_is_f32(const KvPlan *plan);
