/*
 * gpu-test-util.h: what the KV-cache GPU checks share: seeded random rows
 * shaped like real keys, uploads that exit on failure, relative error.
 * Static functions: each test program includes it once.
 */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/kv_cuda.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rand_normal(void)
{
	double u[2];
	for (int k = 0; k < 2; k++) {
		rng ^= rng >> 12;
		rng ^= rng << 25;
		rng ^= rng >> 27;
		u[k] = (double)((rng * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53;
	}
	return (float)(sqrt(-2.0 * log(u[0] + 0x1p-60)) * cos(6.283185307179586 * u[1]));
}

/* n (rows, width) floats with a few loud channels, as real keys have. */
static float *rand_rows(int64_t rows, int width)
{
	float *x = malloc((size_t)rows * width * sizeof(float));
	for (int64_t i = 0; i < rows * width; i++)
		x[i] = rand_normal() * (i % width % 29 == 3 ? 8.0f : 1.0f);
	return x;
}

static void *upload(const void *src, size_t bytes)
{
	void *d = cuda_alloc(bytes);
	if (!d || cuda_upload(d, src, bytes)) {
		fprintf(stderr, "device upload of %zu bytes failed\n", bytes);
		exit(1);
	}
	return d;
}

/* max |a - b| / max |b| over n values. */
static double rel_err(const float *a, const float *b, size_t n)
{
	double diff = 0.0, mag = 1e-30;
	for (size_t i = 0; i < n; i++) {
		diff = fmax(diff, fabs((double)a[i] - b[i]));
		mag = fmax(mag, fabs((double)b[i]));
	}
	return isfinite(diff) ? diff / mag : INFINITY;
}
