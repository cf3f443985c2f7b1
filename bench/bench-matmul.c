/*
 * bench-matmul.c: microbenchmark for the CPU matmul kernels and pool.
 *
 * Measures (1) threadpool_run() dispatch latency, (2) plain streaming
 * read bandwidth as a roofline, (3) single-matrix GB/s of weight reads at
 * the default model's shapes, (4) a whole decode token's matmuls (30
 * layers of Q4_1 + the 49152 x 576 Q8_0 output head, every layer its own
 * weights so nothing is cache-hot that would not be), and (5) prefill
 * tokens/s over the 30 layers. Weights are repacked where the CPU backend
 * would repack them (matmul_repack_wanted(); TURBOKV_NO_REPACK=1 keeps
 * them row-major, for before/after). Not a test: numbers only.
 *
 * Each case reports its best time over repeated runs: on a shared
 * machine the minimum is the stable number.
 *
 *   bench-matmul [max_threads] [seconds_per_case]
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/repack.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/wtype.h"

#define MIN_D(a, b) ((a) < (b) ? (a) : (b))

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* Random quants with a sane half scale (0.01) in the first field(s). */
static MatmulWeight weight_new(uint32_t t, int64_t rows, int64_t cols)
{
	const WTypeInfo *info = wtype_info(t);
	size_t rb = wtype_row_bytes(t, (uint64_t)cols);
	uint8_t *w = aligned_alloc(64, (rb * (size_t)rows + 63) / 64 * 64);
	for (size_t i = 0; i < rb * (size_t)rows; i += 8) {
		uint64_t v = rng_next();
		memcpy(w + i, &v, rb * (size_t)rows - i < 8 ? rb * (size_t)rows - i : 8);
	}
	tkv_half d = f32_to_half(0.01f);
	for (size_t b = 0; b < rb * (size_t)rows / info->block_bytes; b++) {
		memcpy(w + b * info->block_bytes, &d, 2);
		if (t == WTYPE_Q4_1)
			memcpy(w + b * info->block_bytes + 2, &d, 2);
	}
	MatmulWeight mw = { .data = w, .type = t, .rows = rows, .cols = cols, .row_stride = rb }, px;
	/* repacked as the CPU backend would (TURBOKV_NO_REPACK=1: row-major) */
	const char *e = getenv("TURBOKV_NO_REPACK");
	if (matmul_repack_wanted(&mw) && !(e && *e && strcmp(e, "0") != 0) && repack_weight(&mw, &px) == 0) {
		free(w);
		return px;
	}
	return mw;
}

static float *floats_new(size_t n)
{
	float *x = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((int64_t)(rng_next() >> 40) - (1 << 23)) / (float)(1 << 23);
	return x;
}

static size_t weight_bytes(const MatmulWeight *w)
{
	return w->row_stride * (size_t)w->rows;
}

static void nop_task(void *ctx, int ith, int nth)
{
	(void)ctx;
	(void)ith;
	(void)nth;
}

typedef struct ReadCtx {
	const uint8_t *buf;
	size_t len;
	atomic_llong sink;
} ReadCtx;

static void read_task(void *p, int ith, int nth)
{
	ReadCtx *c = p;
	long b, e;
	threadpool_split((long)(c->len / 64), ith, nth, &b, &e);
	__m256i acc = _mm256_setzero_si256();
	for (long i = b; i < e; i++) {
		__m256i v0 = _mm256_load_si256((const __m256i *)(c->buf + 64 * i));
		__m256i v1 = _mm256_load_si256((const __m256i *)(c->buf + 64 * i + 32));
		acc = _mm256_add_epi64(acc, _mm256_xor_si256(v0, v1));
	}
	atomic_fetch_add(&c->sink, _mm256_extract_epi64(acc, 0));
}

typedef struct Layer {
	MatmulWeight q, k, v, o, gate, up, down;
} Layer;

#define N_LAYERS 30
#define DIM 576
#define KV_DIM 192
#define FF 1536
#define VOCAB 49152

/* The layers as the engine could run them: q/k/v and gate/up grouped. */
static void decode_token_grouped(ThreadPool *tp, Layer *L, const float *x, float *y, int64_t n_tok)
{
	for (int l = 0; l < N_LAYERS; l++) {
		const MatmulWeight *qkv[] = { &L[l].q, &L[l].k, &L[l].v };
		const MatmulWeight *gu[] = { &L[l].gate, &L[l].up };
		float *y3[] = { y, y + DIM * n_tok, y + (DIM + KV_DIM) * n_tok };
		float *y2[] = { y, y + FF * n_tok };
		matmul_group(tp, qkv, y3, 3, x, n_tok);
		matmul(tp, &L[l].o, x, y, n_tok);
		matmul_group(tp, gu, y2, 2, x, n_tok);
		matmul(tp, &L[l].down, x, y, n_tok);
	}
}

static void decode_token(ThreadPool *tp, Layer *L, const MatmulWeight *out, const float *x, float *y,
			 int64_t n_tok)
{
	for (int l = 0; l < N_LAYERS; l++) {
		matmul(tp, &L[l].q, x, y, n_tok);
		matmul(tp, &L[l].k, x, y, n_tok);
		matmul(tp, &L[l].v, x, y, n_tok);
		matmul(tp, &L[l].o, x, y, n_tok);
		matmul(tp, &L[l].gate, x, y, n_tok);
		matmul(tp, &L[l].up, x, y, n_tok);
		matmul(tp, &L[l].down, x, y, n_tok);
	}
	if (out)
		matmul(tp, out, x, y, 1);
}

/* One benchmark case: run(ctx) repeated for about secs; the best
 * (minimum) time per run, since the machine is shared and noisy. */
typedef struct Case {
	ThreadPool *tp;
	Layer *L;
	const MatmulWeight *w;
	const float *x;
	float *y;
	int64_t n_tok;
} Case;

static double time_best(void (*run)(Case *), Case *c, double secs)
{
	double best = 1e30, start = now_s(), t;
	do {
		double t0 = now_s();
		run(c);
		t = now_s();
		if (t - t0 < best)
			best = t - t0;
	} while (t - start < secs);
	return best;
}

static void run_dispatch(Case *c)
{
	for (int i = 0; i < 100; i++)
		threadpool_run(c->tp, nop_task, NULL);
}

static void run_matmul(Case *c)
{
	matmul(c->tp, c->w, c->x, c->y, c->n_tok);
}

static void run_layers(Case *c)
{
	decode_token(c->tp, c->L, NULL, c->x, c->y, c->n_tok);
}

static void run_layers_grouped(Case *c)
{
	decode_token_grouped(c->tp, c->L, c->x, c->y, c->n_tok);
}

int main(int argc, char **argv)
{
	int max_threads = argc > 1 ? atoi(argv[1]) : 2;
	double secs = argc > 2 ? atof(argv[2]) : 1.0;
	const CpuFeatures *f = cpu_features();

	printf("cpu: avx2=%d fma=%d f16c=%d; best of %.1f s per case\n", f->avx2, f->fma, f->f16c, secs);

	Layer *L = calloc(N_LAYERS, sizeof(Layer));
	size_t layer_bytes = 0;
	for (int l = 0; l < N_LAYERS; l++) {
		L[l].q = weight_new(WTYPE_Q4_1, DIM, DIM);
		L[l].k = weight_new(WTYPE_Q4_1, KV_DIM, DIM);
		L[l].v = weight_new(WTYPE_Q4_1, KV_DIM, DIM);
		L[l].o = weight_new(WTYPE_Q4_1, DIM, DIM);
		L[l].gate = weight_new(WTYPE_Q4_1, FF, DIM);
		L[l].up = weight_new(WTYPE_Q4_1, FF, DIM);
		L[l].down = weight_new(WTYPE_Q4_1, DIM, FF);
		layer_bytes += weight_bytes(&L[l].q) + weight_bytes(&L[l].k) + weight_bytes(&L[l].v) +
			       weight_bytes(&L[l].o) + weight_bytes(&L[l].gate) + weight_bytes(&L[l].up) +
			       weight_bytes(&L[l].down);
	}
	MatmulWeight out = weight_new(WTYPE_Q8_0, VOCAB, DIM);
	const int64_t max_tok = 128;
	float *x = floats_new((size_t)max_tok * FF);
	float *y = floats_new((size_t)max_tok * VOCAB);
	size_t big = 96ull << 20;
	uint8_t *buf = aligned_alloc(64, big);
	memset(buf, 1, big);

	for (int nth = 1; nth <= max_threads; nth++) {
		Case c = { .L = L, .x = x, .y = y, .n_tok = 1 };
		double t;
		if (threadpool_new(nth, &c.tp) < 0)
			return 1;
		printf("\n== %d thread(s) ==\n", nth);

		t = time_best(run_dispatch, &c, secs);
		printf("dispatch: %.2f us per threadpool_run\n", t / 100 * 1e6);

		ReadCtx rc = { .buf = buf, .len = big };
		double start = now_s(), best = 1e30;
		do {
			double t0 = now_s();
			threadpool_run(c.tp, read_task, &rc);
			best = MIN_D(best, now_s() - t0);
		} while (now_s() - start < secs);
		printf("read roofline (%zu MiB buffer): %.1f GB/s\n", big >> 20, (double)big / best / 1e9);

		const MatmulWeight *shapes[] = { &L[0].q, &L[0].k, &L[0].gate, &L[0].down, &out };
		const char *names[] = { "Q4_1 576x576", "Q4_1 192x576", "Q4_1 1536x576", "Q4_1 576x1536",
					"Q8_0 49152x576" };
		for (int s = 0; s < 5; s++) {
			c.w = shapes[s];
			t = time_best(run_matmul, &c, secs / 2);
			printf("%-16s decode (cache-warm): %8.1f us  %6.1f GB/s\n", names[s], t * 1e6,
			       (double)weight_bytes(shapes[s]) / t / 1e9);
		}

		double tl = time_best(run_layers, &c, 2 * secs);
		printf("decode, 30 layers Q4_1 (%.1f MB, 210 matmuls): %.2f ms  %.1f GB/s\n",
		       (double)layer_bytes / 1e6, tl * 1e3, (double)layer_bytes / tl / 1e9);
		double tg = time_best(run_layers_grouped, &c, 2 * secs);
		printf("decode, 30 layers, q/k/v and gate/up grouped (120 matmuls): %.2f ms  %.1f GB/s\n", tg * 1e3,
		       (double)layer_bytes / tg / 1e9);
		c.w = &out;
		double th = time_best(run_matmul, &c, secs);
		printf("decode, Q8_0 head (%.1f MB): %.2f ms  %.1f GB/s\n", (double)weight_bytes(&out) / 1e6,
		       th * 1e3, (double)weight_bytes(&out) / th / 1e9);
		printf("decode token (layers + head): %.2f ms  %.1f GB/s  %.0f tok/s\n", (tl + th) * 1e3,
		       (double)(layer_bytes + weight_bytes(&out)) / (tl + th) / 1e9, 1.0 / (tl + th));

		const int64_t toks[] = { 16, 64, 128 };
		for (int k = 0; k < 3; k++) {
			c.n_tok = toks[k];
			t = time_best(run_layers, &c, 2 * secs);
			/* 2 flops per weight; Q4_1 is 20 bytes per 32 weights */
			double flops = 2.0 * (double)layer_bytes / 20.0 * 32.0 * (double)toks[k];
			printf("prefill %3ld tokens (30 layers): %7.2f ms  %5.0f tok/s  %5.1f GFLOP/s\n",
			       (long)toks[k], t * 1e3, (double)toks[k] / t, flops / t / 1e9);
		}
		threadpool_free(c.tp);
	}
	free(buf);
	return 0;
}
