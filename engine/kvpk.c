/*
 * kvpk.c: pair-coded keys (kvpk.h): per-block pair scales, the water-
 * filling allocation, encode, and the scalar reference read and score.
 */
#include "kvpk.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "codebook.h"

#define BT KVPK_BLOCK
/* A coordinate of a uniform point on the sphere in this many dimensions is normal to 1e-5. */
#define KVPK_NORMAL_DIM 65536

int kvpk_init(KvPk *pk, int dim, int code_bits, size_t row_bytes)
{
	static float cent[KVPK_MAX_BITS + 1][1 << KVPK_MAX_BITS];
	static float bound[KVPK_MAX_BITS + 1][1 << KVPK_MAX_BITS];
	static double mse[KVPK_MAX_BITS + 1];
	static int ready; /* written once under codebook_get's lock in practice; idempotent */

	if (dim < 4 || dim % 4 || code_bits % 8 || code_bits < 8 || code_bits > KVPK_MAX_BITS * dim ||
	    row_bytes * BT < (size_t)BT * code_bits / 8 + (size_t)dim / 2 + (size_t)dim / 4)
		return -EINVAL;
	if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
		float s = sqrtf((float)KVPK_NORMAL_DIM);
		mse[0] = 1.0;
		cent[0][0] = 0.0f;
		for (int b = 1; b <= KVPK_MAX_BITS; b++) {
			const Codebook *cb;
			int r = codebook_get(KVPK_NORMAL_DIM, b, &cb);
			if (r)
				return r;
			for (int i = 0; i < cb->n_levels; i++)
				cent[b][i] = cb->centroids[i] * s;
			for (int i = 0; i + 1 < cb->n_levels; i++)
				bound[b][i] = cb->boundaries[i] * s;
			mse[b] = cb->mse_coord * KVPK_NORMAL_DIM;
		}
		__atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
	}
	*pk = (KvPk){ .dim = dim, .code_bits = code_bits, .row_bytes = row_bytes };
	for (int b = 0; b <= KVPK_MAX_BITS; b++) {
		pk->centroids[b] = cent[b];
		pk->bounds[b] = bound[b];
		pk->mse[b] = mse[b];
	}
	return 0;
}

static size_t code_bytes(const KvPk *pk)
{
	return (size_t)pk->code_bits / 8;
}

static const uint8_t *side_data(const KvPk *pk, const uint8_t *blk)
{
	return blk + BT * code_bytes(pk);
}

static float scale_of(uint8_t s)
{
	return s ? exp2f((float)((int)s - 128) * 0.125f) : 0.0f;
}

static int bits_of(const uint8_t *nibbles, int pair)
{
	return (nibbles[pair / 2] >> (4 * (pair & 1))) & 0xf;
}

static uint8_t quantize(const float *bounds, int bits, float t)
{
	unsigned idx = 0;
	for (unsigned step = (1u << bits) >> 1; step > 0; step >>= 1)
		idx += (t >= bounds[idx + step - 1]) ? step : 0;
	return (uint8_t)idx;
}

void kvpk_encode_block(const KvPk *pk, const float *x, int n, const float *w, uint8_t *blk)
{
	const int d = pk->dim, P = d / 2;
	uint8_t *scales = blk + BT * code_bytes(pk), *nib = scales + P;
	float sigma[512];
	int bits[512];

	memset(blk, 0, (size_t)BT * pk->row_bytes);
	/* per pair: the RMS over the block's rows and both channels, on a 1/8-octave grid */
	for (int i = 0; i < P; i++) {
		double e = 0;
		for (int t = 0; t < n; t++)
			e += (double)x[t * d + 2 * i] * x[t * d + 2 * i] +
			     (double)x[t * d + 2 * i + 1] * x[t * d + 2 * i + 1];
		double rms = n > 0 ? sqrt(e / (2.0 * n)) : 0.0;
		long s = rms > 0 && isfinite(rms) ? lround(log2(rms) * 8.0) + 128 : 0;
		scales[i] = rms > 0 ? (uint8_t)(s < 1 ? 1 : s > 255 ? 255 : s) : 0;
		sigma[i] = scale_of(scales[i]);
		bits[i] = 0;
	}
	/* reverse water filling, one bit at a time */
	for (int u = 0; u < pk->code_bits / 2; u++) {
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
	/* codes */
	for (int t = 0; t < n; t++) {
		uint8_t *row = blk + (size_t)t * code_bytes(pk);
		unsigned acc = 0, have = 0;
		size_t at = 0;
		for (int j = 0; j < d; j++) {
			int b = bits[j / 2];
			if (b == 0)
				continue;
			float s = sigma[j / 2]; /* 0: an all-zero pair, any code reads as 0 */
			unsigned idx = s > 0.0f ? quantize(pk->bounds[b], b, x[t * d + j] / s) : 0;
			acc |= idx << have;
			have += (unsigned)b;
			while (have >= 8) {
				row[at++] = (uint8_t)acc;
				acc >>= 8;
				have -= 8;
			}
		}
		if (have)
			row[at] = (uint8_t)acc;
	}
}

bool kvpk_block_coded(const KvPk *pk, const uint8_t *blk)
{
	const uint8_t *nib = side_data(pk, blk) + pk->dim / 2;
	int sum = 0;
	for (int i = 0; i < pk->dim / 2; i++) {
		int b = bits_of(nib, i);
		if (b > KVPK_MAX_BITS)
			return false;
		sum += b;
	}
	return sum == pk->code_bits / 2;
}

/* The block's per-coordinate scale and width, then row t's values. */
static void block_prepare(const KvPk *pk, const uint8_t *blk, float *sigma, int *bits)
{
	const uint8_t *scales = side_data(pk, blk), *nib = scales + pk->dim / 2;
	for (int i = 0; i < pk->dim / 2; i++) {
		sigma[i] = scale_of(scales[i]);
		bits[i] = bits_of(nib, i);
	}
}

static void row_read(const KvPk *pk, const uint8_t *blk, int t, const float *sigma, const int *bits,
		     float *y)
{
	const uint8_t *row = blk + (size_t)t * code_bytes(pk);
	unsigned acc = 0, have = 0;
	size_t at = 0;
	for (int j = 0; j < pk->dim; j++) {
		int b = bits[j / 2];
		if (b == 0) {
			y[j] = 0.0f;
			continue;
		}
		while (have < (unsigned)b) {
			acc |= (unsigned)row[at++] << have;
			have += 8;
		}
		unsigned idx = acc & ((1u << b) - 1);
		acc >>= b;
		have -= (unsigned)b;
		y[j] = sigma[j / 2] * pk->centroids[b][idx];
	}
}

void kvpk_decode_row(const KvPk *pk, const uint8_t *blk, int t, float *y)
{
	float sigma[512];
	int bits[512];
	block_prepare(pk, blk, sigma, bits);
	row_read(pk, blk, t, sigma, bits, y);
}

void kvpk_scores(const KvPk *pk, const uint8_t *blk, const float *q, int G, int nj, float scale,
		 float *scores, int stride)
{
	const int d = pk->dim;
	float sigma[512], y[1024];
	int bits[512];
	block_prepare(pk, blk, sigma, bits);
	for (int t = 0; t < nj; t++) {
		row_read(pk, blk, t, sigma, bits, y);
		for (int g = 0; g < G; g++) {
			float sum = 0.0f;
			for (int j = 0; j < d; j++)
				sum += q[(size_t)g * d + j] * y[j];
			scores[(size_t)g * stride + t] = sum * scale;
		}
	}
}
