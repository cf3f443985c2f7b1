/*
 * test-gpu-backend.c: each op of the CUDA backend (kernels/cuda/
 * backend_cuda.c) against a plain host computation, for every weight type:
 *
 *   matmul   random weights of each type (random bytes, finite scales),
 *            batches of 1, 2, 3, 5 and 8 tokens (the matrix-vector kernel,
 *            every token count it instantiates) and 9 and 40 (cuBLAS on
 *            dequantized halves), rows not a multiple of the 8 rows of a
 *            block, rows longer than one activation tile, a padded row
 *            stride, a group of three weights, and one matrix large enough
 *            to be dequantized in several row tiles; against a double
 *            product of wtype_dequantize_row()'s values. Tolerance per
 *            output: relative to sum |w x| of its row, 1e-5 with float
 *            activations, 4e-3 with f16 ones.
 *   embed    rows of every type, equal up to FMA rounding (1e-6 of the
 *            row's largest value);
 *   the rest rope_angles equal to the CPU's (computed by it), rope (both
 *            styles, n_rot < head_dim), rmsnorm (in place too), add_bias,
 *            swiglu, add, geglu and scale against the CPU backend, 1e-5
 *            relative (scale 1e-6).
 *   memory   an uploaded weight handed in again stays as it is; new host
 *            bytes at an address uploaded before get their own copy (a
 *            freed model's memory is reused by the next); an allocation
 *            larger than the device fails with -ENOMEM and the backend
 *            goes on; dealloc; free with buffers live.
 *
 * Exits 77 without a GPU (printing why backend_cuda_new() refused), 1 if
 * a check fails. Plain C without Check, like the other tests/gpu programs.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "kernels/wtype.h"

static uint64_t rng = 0x5eed2026ull;
static int failures, checks;

static uint64_t rand_u64(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dull;
}

static float rand_uniform(void) /* [-1, 1) */
{
	return (float)(rand_u64() >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
	checks++;
	if (ok)
		return;
	failures++;
	va_list ap;
	va_start(ap, fmt);
	printf("FAIL: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		perror("malloc");
		exit(1);
	}
	return p;
}

/* ---- device buffers ---- */

static void *dev_from(Backend *g, const void *src, size_t bytes)
{
	void *p;
	if (g->ops->alloc(g, bytes, &p) || g->ops->upload(g, p, src, bytes)) {
		printf("cannot allocate or upload %zu bytes\n", bytes);
		exit(1);
	}
	return p;
}

static void to_host(Backend *g, void *dst, const void *src, size_t bytes)
{
	int r = g->ops->download(g, dst, src, bytes);
	if (r) {
		printf("download failed: %s\n", strerror(-r));
		exit(1);
	}
}

/* ---- random weights ---- */

static const uint32_t weight_types[] = {
	WTYPE_F32,  WTYPE_F16,  WTYPE_BF16, WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_Q5_0, WTYPE_Q5_1,
	WTYPE_Q8_0, WTYPE_Q2_K, WTYPE_Q3_K, WTYPE_Q4_K, WTYPE_Q5_K, WTYPE_Q6_K,
};

/* Offsets of the half scale fields of a block of t, -1 terminated. */
static const int *half_fields(uint32_t t)
{
	static const int d0[] = { 0, -1 }, d0m2[] = { 0, 2, -1 };
	static const int q2_k[] = { 80, 82, -1 }, q3_k[] = { 108, -1 }, q6_k[] = { 208, -1 };
	switch (t) {
	case WTYPE_Q4_1: case WTYPE_Q5_1: case WTYPE_Q4_K: case WTYPE_Q5_K: return d0m2;
	case WTYPE_Q2_K: return q2_k;
	case WTYPE_Q3_K: return q3_k;
	case WTYPE_Q6_K: return q6_k;
	default: return d0;
	}
}

/* rows of type t, cols values, stride bytes apart: random codes, scales near 1/64 */
static uint8_t *random_weight(uint32_t t, int64_t rows, int64_t cols, size_t stride)
{
	size_t row_bytes = wtype_row_bytes(t, (uint64_t)cols);
	uint8_t *w = xmalloc((size_t)rows * stride);
	for (size_t i = 0; i < (size_t)rows * stride; i++)
		w[i] = (uint8_t)rand_u64();
	for (int64_t r = 0; r < rows; r++) {
		uint8_t *row = w + (size_t)r * stride;
		if (t == WTYPE_F32 || t == WTYPE_F16 || t == WTYPE_BF16) {
			for (int64_t i = 0; i < cols; i++) {
				float v = rand_uniform() * 0.1f;
				if (t == WTYPE_F32)
					memcpy(row + 4 * i, &v, 4);
				else if (t == WTYPE_F16) {
					tkv_half h = f32_to_half(v);
					memcpy(row + 2 * i, &h, 2);
				} else {
					tkv_bf16 h = f32_to_bf16(v);
					memcpy(row + 2 * i, &h, 2);
				}
			}
			continue;
		}
		const WTypeInfo *info = wtype_info(t);
		for (size_t b = 0; b < row_bytes / info->block_bytes; b++)
			for (const int *f = half_fields(t); *f >= 0; f++) {
				tkv_half h = f32_to_half(rand_uniform() / 64.0f);
				memcpy(row + b * info->block_bytes + *f, &h, 2);
			}
	}
	return w;
}

/* ---- matmul ---- */

/* Compare y (n, rows) with the double product of W's dequantized rows and x; tol relative to sum |w x|. */
static int compare_matmul(const char *what, const uint8_t *w, uint32_t t, int64_t rows, int64_t cols,
			  size_t stride, const float *x, int64_t n, const float *y, double tol)
{
	float *wr = xmalloc((size_t)cols * sizeof(float));
	int bad = 0;
	double worst = 0;
	for (int64_t r = 0; r < rows; r++) {
		wtype_dequantize_row(t, w + (size_t)r * stride, wr, cols);
		for (int64_t i = 0; i < n; i++) {
			double s = 0, a = 0;
			for (int64_t c = 0; c < cols; c++) {
				s += (double)wr[c] * x[i * cols + c];
				a += fabs((double)wr[c] * x[i * cols + c]);
			}
			double err = fabs(y[i * rows + r] - s) / (a > 0 ? a : 1);
			if (!(err <= tol) && bad++ < 3)
				printf("  %s: row %lld token %lld: got %.7g want %.7g\n", what, (long long)r,
				       (long long)i, y[i * rows + r], s);
			worst = err > worst || isnan(err) ? err : worst;
		}
	}
	free(wr);
	check(!bad, "%s: %d outputs off, worst relative error %.3g (tol %.1g)", what, bad, worst, tol);
	return bad;
}

static const double tol_float = 1e-5, tol_half = 4e-3;

/* One weight of type t, shape (rows, cols), row stride padded by pad bytes, batches of n tokens. */
static void test_matmul_one(Backend *g, uint32_t t, int64_t rows, int64_t cols, size_t pad, int64_t n)
{
	size_t stride = wtype_row_bytes(t, (uint64_t)cols) + pad;
	uint8_t *w = random_weight(t, rows, cols, stride);
	MatmulWeight mw = { .data = w, .type = t, .rows = rows, .cols = cols, .row_stride = stride };
	int r = g->ops->upload_weight(g, &mw);
	check(r == 0, "upload_weight %s (%lld, %lld): %d", wtype_name(t), (long long)rows, (long long)cols, r);
	if (r) {
		free(w);
		return;
	}
	float *x = xmalloc((size_t)(n * cols) * sizeof(float));
	for (int64_t i = 0; i < n * cols; i++)
		x[i] = rand_uniform();
	float *dx = dev_from(g, x, (size_t)(n * cols) * sizeof(float));
	float *dy;
	float *y = xmalloc((size_t)(n * rows) * sizeof(float));
	if (g->ops->alloc(g, (size_t)(n * rows) * sizeof(float), (void **)&dy))
		exit(1);
	const MatmulWeight *ws[1] = { &mw };
	float *ys[1] = { dy };
	r = g->ops->matmul(g, NULL, ws, ys, 1, dx, n);
	char what[128];
	snprintf(what, sizeof(what), "matmul %s (%lld, %lld)%s n=%lld", wtype_name(t), (long long)rows,
		 (long long)cols, pad ? " padded" : "", (long long)n);
	check(r == 0, "%s: returned %d", what, r);
	if (r == 0) {
		to_host(g, y, dy, (size_t)(n * rows) * sizeof(float));
		compare_matmul(what, w, t, rows, cols, stride, x, n, y, n > 8 ? tol_half : tol_float);
	}
	g->ops->dealloc(g, dx);
	g->ops->dealloc(g, dy);
	free(x);
	free(y);
	free(w); /* the backend keeps its device copy until it is freed */
}

/* Three weights of one input in one call (q/k/v), decode and prefill. */
static void test_matmul_group(Backend *g, uint32_t t, int64_t n)
{
	const int64_t cols = 512, rows[3] = { 512, 128, 72 };
	uint8_t *w[3];
	MatmulWeight mw[3];
	const MatmulWeight *ws[3];
	float *dy[3], *ys[3];
	float *x = xmalloc((size_t)(n * cols) * sizeof(float));
	for (int64_t i = 0; i < n * cols; i++)
		x[i] = rand_uniform();
	float *dx = dev_from(g, x, (size_t)(n * cols) * sizeof(float));
	for (int k = 0; k < 3; k++) {
		size_t stride = wtype_row_bytes(t, cols);
		w[k] = random_weight(t, rows[k], cols, stride);
		mw[k] = (MatmulWeight){ .data = w[k], .type = t, .rows = rows[k], .cols = cols, .row_stride = stride };
		if (g->ops->upload_weight(g, &mw[k]) ||
		    g->ops->alloc(g, (size_t)(n * rows[k]) * sizeof(float), (void **)&dy[k]))
			exit(1);
		ws[k] = &mw[k];
		ys[k] = dy[k];
	}
	int r = g->ops->matmul(g, NULL, ws, ys, 3, dx, n);
	check(r == 0, "matmul group %s n=%lld: %d", wtype_name(t), (long long)n, r);
	for (int k = 0; k < 3 && r == 0; k++) {
		float *y = xmalloc((size_t)(n * rows[k]) * sizeof(float));
		char what[128];
		snprintf(what, sizeof(what), "matmul group %s n=%lld weight %d", wtype_name(t), (long long)n, k);
		to_host(g, y, dy[k], (size_t)(n * rows[k]) * sizeof(float));
		compare_matmul(what, w[k], t, rows[k], cols, wtype_row_bytes(t, cols), x, n, y,
			       n > 8 ? tol_half : tol_float);
		free(y);
	}
	for (int k = 0; k < 3; k++) {
		g->ops->dealloc(g, dy[k]);
		free(w[k]);
	}
	g->ops->dealloc(g, dx);
	free(x);
}

static void test_matmul(Backend *g)
{
	static const int64_t ns[] = { 1, 2, 3, 5, 8, 9, 40 };
	for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++) {
		uint32_t t = weight_types[i];
		bool fl = t == WTYPE_F32 || t == WTYPE_F16 || t == WTYPE_BF16;
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
			test_matmul_one(g, t, 67, 2304, 0, ns[k]);
		/* longer than the 8192-float activation tile of one token; a padded stride */
		test_matmul_one(g, t, 19, 8448, 0, 1);
		test_matmul_one(g, t, 33, 1024, fl ? 8 : 64, 3);
		test_matmul_one(g, t, 33, 1024, fl ? 8 : 64, 17);
		if (fl) /* rows of a length that is not a multiple of 32 */
			test_matmul_one(g, t, 40, 1000, 0, 4);
		test_matmul_group(g, t, 1);
		test_matmul_group(g, t, 12);
	}
	/* 34000 x 2048 halves exceed one 128 MiB row tile: several GEMMs into one Y */
	test_matmul_one(g, WTYPE_Q4_0, 34000, 2048, 0, 10);
}

/* ---- embed ---- */

static void test_embed(Backend *g)
{
	const int64_t rows = 300, cols = 512;
	const int32_t tokens[] = { 0, 299, 17, 17, 150 };
	const int64_t n = sizeof(tokens) / sizeof(tokens[0]);
	for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++) {
		uint32_t t = weight_types[i];
		size_t stride = wtype_row_bytes(t, cols);
		uint8_t *w = random_weight(t, rows, cols, stride);
		MatmulWeight mw = { .data = w, .type = t, .rows = rows, .cols = cols, .row_stride = stride };
		float *dx, *x = xmalloc((size_t)(n * cols) * sizeof(float)), *want = xmalloc(cols * sizeof(float));
		if (g->ops->upload_weight(g, &mw) || g->ops->alloc(g, (size_t)(n * cols) * sizeof(float), (void **)&dx))
			exit(1);
		int r = g->ops->embed(g, &mw, tokens, n, dx);
		check(r == 0, "embed %s: %d", wtype_name(t), r);
		if (r == 0) {
			to_host(g, x, dx, (size_t)(n * cols) * sizeof(float));
			int bad = 0;
			for (int64_t k = 0; k < n; k++) {
				/* nvcc fuses d * q - m into one FMA: within an ulp of the row's largest term */
				wtype_dequantize_row(t, w + (size_t)tokens[k] * stride, want, cols);
				float big = 0;
				for (int64_t c = 0; c < cols; c++)
					big = fmaxf(big, fabsf(want[c]));
				for (int64_t c = 0; c < cols; c++)
					bad += !(fabsf(x[k * cols + c] - want[c]) <= 1e-6f * big);
			}
			check(!bad, "embed %s: %d values off", wtype_name(t), bad);
		}
		const int32_t out_of_range[] = { 3, (int32_t)rows };
		check(g->ops->embed(g, &mw, out_of_range, 2, dx) == -EINVAL, "embed %s: token out of range",
		      wtype_name(t));
		g->ops->dealloc(g, dx);
		free(x);
		free(want);
		free(w);
	}
}

/* ---- the small ops, against the CPU backend ---- */

static int compare(const char *what, const float *got, const float *want, int64_t n, double tol)
{
	double scale = 0;
	for (int64_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(want[i]));
	int bad = 0;
	for (int64_t i = 0; i < n; i++)
		if (!(fabs(got[i] - want[i]) <= tol * (scale > 0 ? scale : 1)) && bad++ < 3)
			printf("  %s [%lld]: got %.7g want %.7g\n", what, (long long)i, got[i], want[i]);
	check(!bad, "%s: %d values off (tol %.1g)", what, bad, tol);
	return bad;
}

static float *random_floats(int64_t n, float scale)
{
	float *v = xmalloc((size_t)n * sizeof(float));
	for (int64_t i = 0; i < n; i++)
		v[i] = rand_uniform() * scale;
	return v;
}

static void test_rope(Backend *g, RopeStyle style, int n_rot)
{
	Backend *cpu = backend_cpu();
	const int64_t n = 7;
	const int n_heads = 5, head_dim = 64, half = n_rot / 2;
	const int64_t pos[7] = { 0, 1, 2, 100, 4097, 65000, 131071 };
	Rope rope;
	rope_init(&rope, style, n_rot, 500000.0f, 1.0f, NULL);

	size_t ab = (size_t)(n * half) * sizeof(float), xb = (size_t)(n * n_heads * head_dim) * sizeof(float);
	float *cs = xmalloc(ab), *sn = xmalloc(ab), *gcs = xmalloc(ab), *gsn = xmalloc(ab);
	float *x = random_floats(n * n_heads * head_dim, 2.0f), *gx = xmalloc(xb);
	float *dcs, *dsn;
	if (g->ops->alloc(g, ab, (void **)&dcs) || g->ops->alloc(g, ab, (void **)&dsn))
		exit(1);
	float *dx = dev_from(g, x, xb);
	cpu->ops->rope_angles(cpu, &rope, pos, n, cs, sn);
	check(g->ops->rope_angles(g, &rope, pos, n, dcs, dsn) == 0, "rope_angles");
	to_host(g, gcs, dcs, ab);
	to_host(g, gsn, dsn, ab);
	check(!memcmp(cs, gcs, ab) && !memcmp(sn, gsn, ab), "rope_angles: not the CPU's values");

	cpu->ops->rope(cpu, &rope, x, n, n_heads, head_dim, cs, sn);
	check(g->ops->rope(g, &rope, dx, n, n_heads, head_dim, dcs, dsn) == 0, "rope");
	to_host(g, gx, dx, xb);
	char what[64];
	snprintf(what, sizeof(what), "rope %s n_rot=%d", style == ROPE_STYLE_NEOX ? "neox" : "norm", n_rot);
	compare(what, gx, x, n * n_heads * head_dim, 1e-5);
	g->ops->dealloc(g, dcs);
	g->ops->dealloc(g, dsn);
	g->ops->dealloc(g, dx);
	free(cs);
	free(sn);
	free(gcs);
	free(gsn);
	free(x);
	free(gx);
}

static void test_small_ops(Backend *g)
{
	Backend *cpu = backend_cpu();
	const int64_t n = 5, dim = 896, len = n * dim;
	const size_t bytes = (size_t)len * sizeof(float);
	float *x = random_floats(len, 3.0f), *y = random_floats(len, 3.0f), *got = xmalloc(bytes);
	float *w = random_floats(dim, 1.0f), *out = xmalloc(bytes);
	float *dx = dev_from(g, x, bytes), *dy = dev_from(g, y, bytes), *dout;
	if (g->ops->alloc(g, bytes, (void **)&dout))
		exit(1);
	const float *dw = w;
	check(g->ops->upload_vector(g, &dw, dim) == 0 && dw != w, "upload_vector");

	/* rmsnorm out of place, then in place */
	cpu->ops->rmsnorm(cpu, out, x, w, n, dim, 1e-6f);
	check(g->ops->rmsnorm(g, dout, dx, dw, n, dim, 1e-6f) == 0, "rmsnorm");
	to_host(g, got, dout, bytes);
	compare("rmsnorm", got, out, len, 1e-5);
	check(g->ops->rmsnorm(g, dx, dx, dw, n, dim, 1e-6f) == 0, "rmsnorm in place");
	to_host(g, got, dx, bytes);
	compare("rmsnorm in place", got, out, len, 1e-5);
	memcpy(x, out, bytes); /* both sides now hold the normed rows */

	cpu->ops->add_bias(cpu, x, w, n, dim);
	check(g->ops->add_bias(g, dx, dw, n, dim) == 0, "add_bias");
	to_host(g, got, dx, bytes);
	compare("add_bias", got, x, len, 1e-6);

	cpu->ops->swiglu(cpu, x, y, len);
	check(g->ops->swiglu(g, dx, dy, len) == 0, "swiglu");
	to_host(g, got, dx, bytes);
	compare("swiglu", got, x, len, 1e-5);

	cpu->ops->add(cpu, x, y, len);
	check(g->ops->add(g, dx, dy, len) == 0, "add");
	to_host(g, got, dx, bytes);
	compare("add", got, x, len, 1e-5);

	/* gemma3's: GELU-tanh gating and a scale (embeddings by sqrt(dim), queries) */
	cpu->ops->geglu(cpu, x, y, len);
	check(g->ops->geglu(g, dx, dy, len) == 0, "geglu");
	to_host(g, got, dx, bytes);
	compare("geglu", got, x, len, 1e-5);

	cpu->ops->scale(cpu, x, 0.37f, len);
	check(g->ops->scale(g, dx, 0.37f, len) == 0, "scale");
	to_host(g, got, dx, bytes);
	compare("scale", got, x, len, 1e-6);

	test_rope(g, ROPE_STYLE_NORM, 64);
	test_rope(g, ROPE_STYLE_NEOX, 64);
	test_rope(g, ROPE_STYLE_NORM, 32);
	test_rope(g, ROPE_STYLE_NEOX, 48);

	/* dx, dy, dout and dw stay allocated: free() must release them */
	free(x);
	free(y);
	free(w);
	free(got);
	free(out);
}

/*
 * Uploads. An address says nothing about contents: host memory is freed
 * and reused (the next model's mapping, the next test buffer), so new
 * bytes at an address uploaded before must reach the device. Tied
 * embeddings are one upload because model.c uploads them once.
 */
static void test_uploads(Backend *g)
{
	const int64_t rows = 64, cols = 256;
	size_t stride = wtype_row_bytes(WTYPE_Q8_0, cols), bytes = (size_t)rows * stride;
	uint8_t *w = random_weight(WTYPE_Q8_0, rows, cols, stride), *back = xmalloc(bytes);
	MatmulWeight a = { .data = w, .type = WTYPE_Q8_0, .rows = rows, .cols = cols, .row_stride = stride };
	check(g->ops->upload_weight(g, &a) == 0 && a.data != w, "upload");
	MatmulWeight c = a;
	check(g->ops->upload_weight(g, &c) == 0 && c.data == a.data, "upload of an uploaded weight");

	uint8_t *w2 = random_weight(WTYPE_Q8_0, rows, cols, stride);
	memcpy(w, w2, bytes); /* other contents at the same address */
	MatmulWeight b = { .data = w, .type = WTYPE_Q8_0, .rows = rows, .cols = cols, .row_stride = stride };
	check(g->ops->upload_weight(g, &b) == 0 && b.data != w, "upload at a reused address");
	to_host(g, back, b.data, bytes);
	check(!memcmp(back, w2, bytes), "upload at a reused address: the device holds the old contents");

	MatmulWeight bad = { .data = w, .type = WTYPE_Q8_K, .rows = rows, .cols = cols, .row_stride = stride };
	check(g->ops->upload_weight(g, &bad) == -EINVAL, "Q8_K weight refused");

	/* more than any device has: -ENOMEM, a message, and the next ops unaffected */
	void *huge = NULL, *small = NULL;
	int r = g->ops->alloc(g, (size_t)1 << 52, &huge);
	check(r == -ENOMEM && strstr(backend_last_error(g), "allocate"), "4 PiB allocation: %d (%s)", r,
	      backend_last_error(g));
	check(g->ops->alloc(g, 4096, &small) == 0, "allocation after a failed one");
	g->ops->dealloc(g, small);
	free(w);
	free(w2);
	free(back);
}

int main(void)
{
	Backend *g = NULL;
	Error err = { 0 };
	int r = backend_cuda_new(&g, &err);
	if (r != 0) {
		/* only a missing GPU is a skip; anything else is this test's failure */
		printf("no CUDA backend (%s, %s)%s\n", strerror(-r), err.msg,
		       r == -ENODEV ? ": skipped" : "");
		return r == -ENODEV ? 77 : 1;
	}
	check(strcmp(backend_name(g), "cuda") == 0 && !backend_is_host(g), "backend name");
	test_uploads(g);
	test_small_ops(g);
	test_embed(g);
	test_matmul(g);
	backend_free(g);
	printf("%d of %d CUDA backend checks failed\n", failures, checks);
	return failures ? 1 : 0;
}
