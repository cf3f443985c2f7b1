/*
 * kvpk.c: pair-coded keys (kvpk.h): per-block pair scales, the water-
 * filling allocation, encode, and the scalar reference read.
 */
#include "engine/codec/kvpk.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "engine/codec/codebook.h"

#define BT KV_BLOCK_TOKENS
/* A coordinate of a uniform point on the sphere in this many dimensions is normal to 1e-5. */
#define KVPK_NORMAL_DIM 65536

/* The normal codebooks, solved once per process (codebook_get() caches them too). */
static float normal_centroids[KVPK_MAX_BITS + 1][1 << KVPK_MAX_BITS];
static float normal_bounds[KVPK_MAX_BITS + 1][1 << KVPK_MAX_BITS];
static double normal_mse[KVPK_MAX_BITS + 1];
static float scale_sigma[256];
static int16_t normal_c16[KVPK_MAX_BITS + 1][KVPK_Q16_TABLE]; /* kv_attn_pk_q16_tables() of the centroids */
static uint8_t normal_c16_planes[KVPK_MAX_BITS + 1][2 * 256];
static int normal_error;
static pthread_once_t normal_once = PTHREAD_ONCE_INIT;

static void normal_codebooks(void)
{
	float s = sqrtf((float)KVPK_NORMAL_DIM);
	for (int i = 0; i < 256; i++)
		scale_sigma[i] = kvpk_scale_of((uint8_t)i);
	normal_mse[0] = 1.0; /* 0 bits: the value reads as 0 */
	for (int b = 1; b <= KVPK_MAX_BITS; b++) {
		const Codebook *cb;
		if ((normal_error = codebook_get(KVPK_NORMAL_DIM, b, &cb)) != 0)
			return;
		for (int i = 0; i < cb->n_levels; i++)
			normal_centroids[b][i] = cb->centroids[i] * s;
		for (int i = 0; i + 1 < cb->n_levels; i++)
			normal_bounds[b][i] = cb->boundaries[i] * s;
		normal_mse[b] = cb->mse_coord * KVPK_NORMAL_DIM;
		/* every |c| < 8 (the 8-bit codebook reaches about 4): -ERANGE would say otherwise */
		if ((normal_error = kv_attn_pk_q16_tables(normal_centroids[b], b, normal_c16[b],
							  normal_c16_planes[b])) != 0)
			return;
	}
}

int kvpk_init(KvPk *pk, int dim, int code_bits)
{
	if (dim < 16 || dim > KVPK_MAX_DIM || dim % 4 || code_bits % 8 || code_bits < 8 ||
	    code_bits > KVPK_MAX_BITS * dim)
		return -EINVAL;
	pthread_once(&normal_once, normal_codebooks);
	if (normal_error)
		return normal_error;
	*pk = (KvPk){ .rows = { .dim = dim, .code_bits = code_bits, .sigma = scale_sigma },
		      .row_bytes = kvpk_row_bytes(dim, code_bits) };
	for (int b = 0; b <= KVPK_MAX_BITS; b++) {
		pk->rows.centroids[b] = normal_centroids[b];
		pk->bounds[b] = normal_bounds[b];
		pk->mse[b] = normal_mse[b];
		if (b >= 1) {
			pk->rows.c16[b] = normal_c16[b];
			pk->rows.c16_planes[b] = normal_c16_planes[b];
		}
	}
	return 0;
}

static size_t code_bytes(const KvPk *pk)
{
	return (size_t)pk->rows.code_bits / 8;
}

static uint8_t quantize(const float *bounds, int bits, float t)
{
	unsigned idx = 0;
	for (unsigned step = (1u << bits) >> 1; step > 0; step >>= 1)
		idx += (t >= bounds[idx + step - 1]) ? step : 0;
	return (uint8_t)idx;
}

/* Row t's coordinate j as coded: x - mu. */
static float centered(const float *x, const float *mu, int d, int t, int j)
{
	return mu ? x[t * d + j] - mu[j] : x[t * d + j];
}

void kvpk_encode_block(const KvPk *pk, const float *x, int n, const float *mu, const float *w,
		       uint8_t *blk)
{
	const int d = pk->rows.dim, P = d / 2;
	uint8_t *scales = blk + BT * code_bytes(pk), *nib = scales + P;
	float sigma[KVPK_MAX_DIM / 2];
	int bits[KVPK_MAX_DIM / 2];

	memset(blk, 0, (size_t)BT * pk->row_bytes);
	/* per pair: the RMS over the block's rows and both channels, on a 1/8-octave grid */
	for (int i = 0; i < P; i++) {
		double e = 0;
		for (int t = 0; t < n; t++) {
			double a = centered(x, mu, d, t, 2 * i), b = centered(x, mu, d, t, 2 * i + 1);
			e += a * a + b * b;
		}
		double rms = n > 0 ? sqrt(e / (2.0 * n)) : 0.0;
		long s = rms > 0 && isfinite(rms) ? lround(log2(rms) * 8.0) + 128 : 0;
		scales[i] = rms > 0 ? (uint8_t)(s < 1 ? 1 : s > 255 ? 255 : s) : 0;
		sigma[i] = kvpk_scale_of(scales[i]);
		bits[i] = 0;
	}
	/* reverse water filling, one bit at a time */
	for (int u = 0; u < pk->rows.code_bits / 2; u++) {
		int best = -1;
		double gain = -1.0;
		for (int i = 0; i < P; i++) {
			if (bits[i] >= KVPK_MAX_BITS)
				continue;
			double g = (double)w[i] * sigma[i] * sigma[i] * (pk->mse[bits[i]] - pk->mse[bits[i] + 1]);
			if (g > gain) {
				gain = g;
				best = i;
			}
		}
		bits[best]++;
	}
	for (int i = 0; i < P; i++)
		nib[i / 2] |= (uint8_t)(bits[i] << (4 * (i & 1)));
	/* codes, column by column: coordinate j's 32 codes of bits[j/2] bits each */
	uint8_t *col = blk;
	for (int j = 0; j < d; j++) {
		int b = bits[j / 2];
		float s = sigma[j / 2]; /* 0: an all-zero pair, any code reads as 0 */
		for (int t = 0; t < n && b > 0; t++) {
			unsigned idx = s > 0.0f ? quantize(pk->bounds[b], b, centered(x, mu, d, t, j) / s) : 0;
			unsigned at = (unsigned)t * (unsigned)b;
			col[at / 8] |= (uint8_t)(idx << (at % 8));
			if (at % 8 + (unsigned)b > 8)
				col[at / 8 + 1] |= (uint8_t)(idx >> (8 - at % 8));
		}
		col += (size_t)BT * b / 8;
	}
}

bool kvpk_block_coded(const KvPk *pk, const uint8_t *blk)
{
	const uint8_t *nib = kvpk_scales(blk, pk->rows.code_bits) + pk->rows.dim / 2;
	int sum = 0;
	for (int i = 0; i < pk->rows.dim / 2; i++) {
		int b = kvpk_width(nib, i);
		if (b > KVPK_MAX_BITS)
			return false;
		sum += b;
	}
	return sum == pk->rows.code_bits / 2;
}

/* The block's per-coordinate scale and width, then row t's values. */
void kvpk_decode_row(const KvPk *pk, const uint8_t *blk, int t, float *y)
{
	const uint8_t *scales = kvpk_scales(blk, pk->rows.code_bits), *nib = scales + pk->rows.dim / 2;
	const uint8_t *col = blk;
	for (int j = 0; j < pk->rows.dim; j++) {
		int b = kvpk_width(nib, j / 2);
		y[j] = b ? kvpk_scale_of(scales[j / 2]) * pk->rows.centroids[b][kvpk_column_code(col, b, t)]
			 : 0.0f;
		col += (size_t)BT * b / 8;
	}
}
