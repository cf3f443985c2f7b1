/*
 * bench-codec.c: single-thread throughput of the scalar reference
 * TurboQuant codec (engine/codec/tq.h): quantize (tq_encode), dequantize
 * (tq_decode) and the inner product on codes (tq_inner_product, what a
 * key score costs) per mode at head dims 64 and 128. Not a test: numbers
 * only, printed as a markdown table.
 *
 * Each case runs over a fixed set of random vectors for at least
 * seconds_per_case / 3 per operation and reports the best of three runs
 * (on a shared machine the minimum time is the stable number).
 *
 *   bench-codec [seconds_per_case]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/codec/tq.h"

enum { N_VEC = 1024 };

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rand_normal(void)
{
	double u[2];
	for (int i = 0; i < 2; i++) {
		uint64_t x = rng_state;
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		rng_state = x;
		u[i] = ((double)((x * 0x2545f4914f6cdd1dull) >> 11) + 1) * 0x1.0p-53;
	}
	return (float)(sqrt(-2 * log(u[0])) * cos(2 * M_PI * u[1]));
}

typedef enum Op { OP_ENCODE, OP_DECODE, OP_SCORE } Op;

static volatile float sink;

/* One pass over the N_VEC vectors. */
static void run_pass(const TqCodec *c, Op op, const float *x, uint8_t *codes, float *out,
		     const TqQuery *query)
{
	int d = tq_codec_desc(c)->dim;
	size_t cb = tq_code_bytes(c);
	float acc = 0.0f;
	for (int k = 0; k < N_VEC; k++) {
		switch (op) {
		case OP_ENCODE:
			tq_encode(c, x + (size_t)k * d, codes + k * cb);
			break;
		case OP_DECODE:
			tq_decode(c, codes + k * cb, out);
			acc += out[0];
			break;
		case OP_SCORE:
			acc += tq_inner_product(c, query, codes + k * cb);
			break;
		}
	}
	sink = acc;
}

/* Vectors per second, best of three runs of at least `seconds` each. */
static double measure(const TqCodec *c, Op op, const float *x, uint8_t *codes, float *out,
		      const TqQuery *query, double seconds)
{
	double best = 0.0;
	for (int rep = 0; rep < 3; rep++) {
		long n = 0;
		double t0 = now_s(), t;
		do {
			run_pass(c, op, x, codes, out, query);
			n += N_VEC;
			t = now_s() - t0;
		} while (t < seconds);
		if (n / t > best)
			best = n / t;
	}
	return best;
}

int main(int argc, char **argv)
{
	static const char *modes[] = { "tq1", "tq2", "tq3", "tq4", "tq5", "tq6", "tq7", "tq8",
				       "tq2.5", "tq3.5", "tq4.5", "tq3+qjl", "tq4+qjl", "tq3+sqjl",
				       "tq4+sqjl" };
	static const int dims[] = { 64, 128 };
	double seconds = argc > 1 ? atof(argv[1]) / 3 : 0.1;
	float *x = malloc(sizeof(float) * N_VEC * TQ_MAX_DIM);
	uint8_t *codes = malloc((size_t)N_VEC * TQ_MAX_CODE_BYTES);
	float out[TQ_MAX_DIM], q[TQ_MAX_DIM];
	TqQuery *query = malloc(sizeof(*query));
	if (!x || !codes || !query)
		return 1;

	printf("Scalar reference codec, one thread, %d random vectors per pass, best of 3.\n\n", N_VEC);
	printf("| mode | d | bits/value | quantize (vec/s) | dequantize (vec/s) | score on codes (vec/s) |\n");
	printf("|---|---|---|---|---|---|\n");
	for (size_t j = 0; j < sizeof(dims) / sizeof(dims[0]); j++) {
		int d = dims[j];
		for (size_t i = 0; i < (size_t)N_VEC * d; i++)
			x[i] = rand_normal();
		for (int i = 0; i < d; i++)
			q[i] = rand_normal();
		for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
			TqDesc desc;
			TqCodec *c = NULL;
			Error err = { 0 };
			if (tq_desc_from_name(modes[k], d, &desc, &err) < 0 ||
			    tq_codec_new(&desc, &c, &err) != 0) {
				fprintf(stderr, "%s: %s\n", modes[k], err.msg);
				return 1;
			}
			tq_query_prepare(c, q, query);
			double enc = measure(c, OP_ENCODE, x, codes, out, query, seconds);
			double dec = measure(c, OP_DECODE, x, codes, out, query, seconds);
			double score = measure(c, OP_SCORE, x, codes, out, query, seconds);
			printf("| %s | %d | %.3f | %.3g | %.3g | %.3g |\n", modes[k], d, tq_bits_per_value(c),
			       enc, dec, score);
			fflush(stdout);
			tq_codec_free(c);
		}
	}
	free(x);
	free(codes);
	free(query);
	return 0;
}
