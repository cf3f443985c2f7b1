/*
 * wtype.h: GGUF/ggml weight types, their block layouts and dequantization.
 *
 * Type ids are the ggml_type numbers stored in GGUF tensor infos. Block
 * layouts are bit-identical to ggml-common.h: each block covers
 * wtype_block_elems() consecutive values of one row, little-endian, no
 * padding. Half-precision fields are IEEE binary16 (tkv_half).
 *
 *   type   elems bytes  layout
 *   F32        1     4  float
 *   F16        1     2  half
 *   BF16       1     2  bfloat16
 *   Q4_0      32    18  d; qs[16]        x = d * (q - 8), q in 0..15
 *   Q4_1      32    20  d, m; qs[16]     x = d * q + m
 *   Q5_0      32    22  d; qh[4]; qs[16] x = d * (q - 16), q 5 bits
 *   Q5_1      32    24  d, m; qh[4]; qs[16]
 *   Q8_0      32    34  d; qs[32]        x = d * q, q int8
 *   Q8_1      32    36  d, s; qs[32]     s = d * sum(q) (activations)
 *   Q2_K     256    84  scales[16]; qs[64]; d, dmin
 *   Q3_K     256   110  hmask[32]; qs[64]; scales[12]; d
 *   Q4_K     256   144  d, dmin; scales[12]; qs[128]
 *   Q5_K     256   176  d, dmin; scales[12]; qh[32]; qs[128]
 *   Q6_K     256   210  ql[128]; qh[64]; scales[16] (int8); d
 *   Q8_K     256   292  float d; qs[256]; int16 bsums[16] (activations)
 *
 * In the 32-value formats, qs[j] holds value j in its low nibble and value
 * j + 16 in its high nibble; Q5 high bits: bit j of qh is value j's fifth
 * bit, bit j + 16 that of value j + 16.
 */
#pragma once

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/half.h"

typedef enum WType {
	WTYPE_F32 = 0,
	WTYPE_F16 = 1,
	WTYPE_Q4_0 = 2,
	WTYPE_Q4_1 = 3,
	WTYPE_Q5_0 = 6,
	WTYPE_Q5_1 = 7,
	WTYPE_Q8_0 = 8,
	WTYPE_Q8_1 = 9,
	WTYPE_Q2_K = 10,
	WTYPE_Q3_K = 11,
	WTYPE_Q4_K = 12,
	WTYPE_Q5_K = 13,
	WTYPE_Q6_K = 14,
	WTYPE_Q8_K = 15,
	WTYPE_BF16 = 30,
	WTYPE_COUNT_ = 40, /* bound for lookup tables; not a type */
} WType;

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct {
	tkv_half d;
	uint8_t qs[QK4_0 / 2];
} BlockQ4_0;
static_assert(sizeof(BlockQ4_0) == 18, "BlockQ4_0 must match ggml block_q4_0");

typedef struct {
	tkv_half d;
	tkv_half m;
	uint8_t qs[QK4_1 / 2];
} BlockQ4_1;
static_assert(sizeof(BlockQ4_1) == 20, "BlockQ4_1 must match ggml block_q4_1");

typedef struct {
	tkv_half d;
	uint8_t qh[4];
	uint8_t qs[QK5_0 / 2];
} BlockQ5_0;
static_assert(sizeof(BlockQ5_0) == 22, "BlockQ5_0 must match ggml block_q5_0");

typedef struct {
	tkv_half d;
	tkv_half m;
	uint8_t qh[4];
	uint8_t qs[QK5_1 / 2];
} BlockQ5_1;
static_assert(sizeof(BlockQ5_1) == 24, "BlockQ5_1 must match ggml block_q5_1");

typedef struct {
	tkv_half d;
	int8_t qs[QK8_0];
} BlockQ8_0;
static_assert(sizeof(BlockQ8_0) == 34, "BlockQ8_0 must match ggml block_q8_0");

typedef struct {
	tkv_half d;
	tkv_half s; /* d * sum(qs) */
	int8_t qs[QK8_1];
} BlockQ8_1;
static_assert(sizeof(BlockQ8_1) == 36, "BlockQ8_1 must match ggml block_q8_1");

typedef struct {
	uint8_t scales[QK_K / 16]; /* 4-bit scale (low) and min (high) per 16 */
	uint8_t qs[QK_K / 4];      /* 2-bit quants */
	tkv_half d;
	tkv_half dmin;
} BlockQ2_K;
static_assert(sizeof(BlockQ2_K) == 84, "BlockQ2_K must match ggml block_q2_K");

typedef struct {
	uint8_t hmask[QK_K / 8]; /* high bit of each 3-bit quant */
	uint8_t qs[QK_K / 4];    /* low 2 bits */
	uint8_t scales[12];      /* 16 6-bit scales */
	tkv_half d;
} BlockQ3_K;
static_assert(sizeof(BlockQ3_K) == 110, "BlockQ3_K must match ggml block_q3_K");

typedef struct {
	tkv_half d;
	tkv_half dmin;
	uint8_t scales[K_SCALE_SIZE]; /* 8 6-bit scales and 8 6-bit mins */
	uint8_t qs[QK_K / 2];
} BlockQ4_K;
static_assert(sizeof(BlockQ4_K) == 144, "BlockQ4_K must match ggml block_q4_K");

typedef struct {
	tkv_half d;
	tkv_half dmin;
	uint8_t scales[K_SCALE_SIZE];
	uint8_t qh[QK_K / 8];
	uint8_t qs[QK_K / 2];
} BlockQ5_K;
static_assert(sizeof(BlockQ5_K) == 176, "BlockQ5_K must match ggml block_q5_K");

typedef struct {
	uint8_t ql[QK_K / 2];      /* low 4 bits */
	uint8_t qh[QK_K / 4];      /* high 2 bits */
	int8_t scales[QK_K / 16];  /* 8-bit scales per 16 */
	tkv_half d;
} BlockQ6_K;
static_assert(sizeof(BlockQ6_K) == 210, "BlockQ6_K must match ggml block_q6_K");

typedef struct {
	float d;
	int8_t qs[QK_K];
	int16_t bsums[QK_K / 16]; /* sums of qs in groups of 16 */
} BlockQ8_K;
static_assert(sizeof(BlockQ8_K) == 292, "BlockQ8_K must match ggml block_q8_K");

/*
 * K-quant scale unpacking, shared by the scalar reference and the CPU and
 * CUDA kernels (hence plain C, TKV_HD).
 *
 * Q4_K/Q5_K pack 8 6-bit scales sc0..7 and 8 6-bit mins m0..7 in 12 bytes:
 *   bytes 0..3:  sc0..3 in bits 0..5, bits 4..5 of sc4..7 in bits 6..7
 *   bytes 4..7:  m0..3 in bits 0..5,  bits 4..5 of m4..7 in bits 6..7
 *   bytes 8..11: bits 0..3 of sc4..7 (low nibble), of m4..7 (high nibble)
 * Sub-block j (0..7) covers values 32j .. 32j+31 of the super-block.
 */
static inline TKV_HD void wtype_q4k_scale_min(const uint8_t *scales, int j,
					      uint8_t *ret_sc, uint8_t *ret_m)
{
	if (j < 4) {
		*ret_sc = scales[j] & 63;
		*ret_m = scales[j + 4] & 63;
	} else {
		*ret_sc = (uint8_t)((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
		*ret_m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
	}
}

/*
 * Q3_K packs 16 6-bit scales (stored biased by 32) in 12 bytes: the low 4
 * bits of scale j are the low nibble of byte j (j < 8) or the high nibble
 * of byte j - 8; its two high bits are bits 2*(j/4) .. 2*(j/4)+1 of byte
 * 8 + j%4.
 * Returns the signed scale of sub-block j (0..15, values 16j .. 16j+15),
 * in -32..31.
 */
static inline TKV_HD int wtype_q3k_scale(const uint8_t *scales, int j)
{
	int lo = j < 8 ? (scales[j] & 0xf) : (scales[j - 8] >> 4);
	int hi = (scales[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
	return (lo | (hi << 4)) - 32;
}

typedef struct WTypeInfo {
	const char *name;    /* "Q4_K", as ggml and GGUF tools print it */
	uint32_t block_elems; /* values per block */
	uint32_t block_bytes; /* bytes per block */
} WTypeInfo;

/* Layout of type t, or NULL if t is not a type we read. */
const WTypeInfo *wtype_info(uint32_t t);

/* True for the types a GGUF weight tensor may have in our engine. */
bool wtype_is_supported(uint32_t t);

/* "Q4_K" etc., or "unknown" for a type we do not read. */
const char *wtype_name(uint32_t t);

/*
 * Bytes of one row of n values, or 0 if n is not a multiple of the block
 * size (or the type is unknown). Callers check for 0.
 */
size_t wtype_row_bytes(uint32_t t, uint64_t n);

/*
 * Scalar reference: dequantize n values (a multiple of the block size) of
 * a known type t (wtype_info() != NULL; Q8_1 and Q8_K included). Same math
 * and float operation order as ggml's dequantize_row_*(), so results are
 * bit-identical to ggml's scalar code (no FMA contraction).
 */
void wtype_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n);

/* How a MatmulWeight's rows are laid out in memory. */
enum {
	MATMUL_LAYOUT_ROWS = 0, /* row-major, as in GGUF */
	MATMUL_LAYOUT_X4 = 1,   /* groups of 4 rows, blocks interleaved (kernels/cpu/repack.h) */
};

/*
 * A weight matrix as every backend's matmul reads it: W (rows, cols) of
 * type, row-major, row r at data + r * row_stride (wtype_row_bytes(type,
 * cols) bytes), unless layout says otherwise (the CPU backend's repacked
 * copies). data is host memory (the GGUF mapping) or, after a backend's
 * upload_weight(), that backend's memory.
 */
typedef struct MatmulWeight {
	const void *data;
	uint32_t type;        /* WType */
	int64_t rows;         /* output features */
	int64_t cols;         /* input features (multiple of the block size) */
	size_t row_stride;    /* bytes between rows */
	uint32_t layout;      /* MATMUL_LAYOUT_*: ROWS unless a backend repacked it */
} MatmulWeight;
