/*
 * test-matmul.c: activation quantizers, dot-product kernels and matmul.
 *
 * Independent references: hand-computed ggml quantizer outputs; the
 * engine's dequantizers (kernels/wtype.c) for the meaning of every weight
 * and activation block, against which the scalar kernels are checked;
 * the scalar kernels, against which the AVX2 kernels and the threaded,
 * tiled matmul() are checked. Weights are random bytes with random finite
 * scales, so every bit pattern of the quants is exercised.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant_act.h"
#include "kernels/cpu/repack.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/cpu/vec_f32.h"
#include "kernels/wtype.h"
#include "tests/unit/testutil.h"

static const uint32_t all_types[] = {
	WTYPE_F32, WTYPE_F16, WTYPE_BF16, WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_Q5_0, WTYPE_Q5_1,
	WTYPE_Q8_0, WTYPE_Q2_K, WTYPE_Q3_K, WTYPE_Q4_K, WTYPE_Q5_K, WTYPE_Q6_K,
};
#define N_TYPES ((int)(sizeof(all_types) / sizeof(all_types[0])))

/*
 * The SIMD kernel sets this build has and this CPU may run now: x86 set 0
 * AVX2; aarch64 set 0 NEON, set 1 NEON with the dot-product extension.
 * Returns set i's name, or NULL where there is no set i (none at all with
 * TURBOKV_NO_SIMD=1; no dotprod set with TURBOKV_NO_DOTPROD=1).
 */
#define N_SIMD_SETS 2
static const char *simd_set(int i)
{
	const CpuFeatures *f = cpu_features();
#if defined(CPU_KERNELS_X86)
	return i == 0 && f->avx2 && f->fma && f->f16c ? "avx2" : NULL;
#elif defined(CPU_KERNELS_NEON)
	if (i == 0)
		return f->neon ? "neon" : NULL;
	return i == 1 && f->neon && f->dotprod ? "neon+dotprod" : NULL;
#else
	(void)f;
	(void)i;
	return NULL;
#endif
}

static bool simd_available(void)
{
	return simd_set(0) != NULL;
}

/* Set i's kernels (simd_set(i) not NULL); NULL where it has none for t. */
static VecDotFn simd_dot(int i, uint32_t t)
{
#if defined(CPU_KERNELS_X86)
	return vec_dot_avx2_get(t);
#elif defined(CPU_KERNELS_NEON)
	return vec_dot_neon_get(t, i == 1);
#else
	return NULL;
#endif
}

/* Whether set i promises the reference's floats bit for bit (the NEON
 * kernels: vec_dot_neon_impl.h); else float rounding. */
static bool simd_exact(int i)
{
#if defined(CPU_KERNELS_NEON)
	return true;
#else
	return false;
#endif
}

static VecDotMultiFn simd_multi(int i, uint32_t t)
{
#if defined(CPU_KERNELS_X86)
	return vec_dot_avx2_multi_get(t);
#else
	return NULL;
#endif
}

/*
 * The tile kernel sets (layout X4) this CPU may run now: x86 set 0 AVX2,
 * set 1 AVX-512 VNNI (gone with TURBOKV_NO_AVX512=1); aarch64 as
 * simd_set(). Returns set i's name or NULL.
 */
/* The two-group tile kernel (x86 set 1, AVX-512 VNNI); NULL where none. */
static RepackTileFn simd_tile8(uint32_t t)
{
#if defined(CPU_KERNELS_X86)
	return repack_tile8_avx512_get(t);
#else
	(void)t;
	return NULL;
#endif
}

static const char *tile_set(int i)
{
#if defined(CPU_KERNELS_X86)
	const CpuFeatures *f = cpu_features();
	if (i == 1)
		return simd_set(0) && f->avx512 && f->avx512vnni ? "avx512vnni" : NULL;
#endif
	return simd_set(i);
}

static RepackTileFn simd_tile(int i, uint32_t t)
{
#if defined(CPU_KERNELS_X86)
	return i == 1 ? repack_tile_avx512_get(t) : repack_tile_avx2_get(t);
#elif defined(CPU_KERNELS_NEON)
	return repack_tile_neon_get(t, i == 1);
#else
	return NULL;
#endif
}

static void put_half(uint8_t *p, float v)
{
	tkv_half h = f32_to_half(v);
	memcpy(p, &h, sizeof(h));
}

static float rand_scale(uint64_t *rng)
{
	return (0.002f + 0.05f * test_rand_uniform(rng)) * (test_rand_uniform(rng) < 0.2f ? -1.0f : 1.0f);
}

/*
 * rows weight rows of cols values in type t, row_stride bytes apart:
 * random bytes, then random finite half scales where the block has them.
 */
static uint8_t *weights_random(uint32_t t, int64_t rows, int64_t cols, size_t row_stride, uint64_t *rng)
{
	const WTypeInfo *info = wtype_info(t);
	size_t nb = (size_t)cols / info->block_elems;
	uint8_t *w = malloc((size_t)rows * row_stride);
	ck_assert_ptr_nonnull(w);

	for (size_t i = 0; i < (size_t)rows * row_stride; i++)
		w[i] = (uint8_t)test_rand_u64(rng);
	for (int64_t r = 0; r < rows; r++) {
		uint8_t *row = w + (size_t)r * row_stride;
		for (size_t b = 0; b < nb; b++) {
			uint8_t *blk = row + b * info->block_bytes;
			switch (t) {
			case WTYPE_F32: {
				float v = test_rand_normal(rng);
				memcpy(blk, &v, sizeof(v));
				break;
			}
			case WTYPE_F16:
				put_half(blk, test_rand_normal(rng));
				break;
			case WTYPE_BF16: {
				tkv_bf16 v = f32_to_bf16(test_rand_normal(rng));
				memcpy(blk, &v, sizeof(v));
				break;
			}
			case WTYPE_Q4_1:
			case WTYPE_Q5_1:
				put_half(blk + offsetof(BlockQ4_1, m), 4.0f * rand_scale(rng));
				/* fallthrough */
			case WTYPE_Q4_0:
			case WTYPE_Q5_0:
			case WTYPE_Q8_0:
				put_half(blk, rand_scale(rng));
				break;
			case WTYPE_Q2_K:
				put_half(blk + offsetof(BlockQ2_K, d), rand_scale(rng));
				put_half(blk + offsetof(BlockQ2_K, dmin), rand_scale(rng));
				break;
			case WTYPE_Q3_K:
				put_half(blk + offsetof(BlockQ3_K, d), rand_scale(rng));
				break;
			case WTYPE_Q4_K:
			case WTYPE_Q5_K:
				put_half(blk + offsetof(BlockQ4_K, d), rand_scale(rng));
				put_half(blk + offsetof(BlockQ4_K, dmin), rand_scale(rng));
				break;
			case WTYPE_Q6_K:
				put_half(blk + offsetof(BlockQ6_K, d), rand_scale(rng));
				break;
			default:
				ck_abort_msg("no generator for type %u", t);
			}
		}
	}
	return w;
}

/* Activations with a spread of magnitudes per block, some exact zeros. */
static float *acts_random(int64_t n, uint64_t *rng)
{
	float *x = malloc((size_t)n * sizeof(float));
	ck_assert_ptr_nonnull(x);
	for (int64_t i = 0; i < n; i++) {
		float scale = (i / 32) % 3 == 0 ? 0.1f : (i / 32) % 3 == 1 ? 1.0f : 30.0f;
		x[i] = test_rand_normal(rng) * scale;
		if (test_rand_uniform(rng) < 0.02f)
			x[i] = 0.0f;
	}
	return x;
}

/* The activation row the kernels see (quantized with the reference) and
 * what it means as floats. ret_act is malloc'd. */
static float *acts_quantize(uint32_t t, const float *x, int64_t n, void **ret_act)
{
	int at = quant_act_type_for(t);
	ck_assert_int_ge(at, 0);
	size_t bytes = at == WTYPE_F32 ? (size_t)n * sizeof(float) : wtype_row_bytes((uint32_t)at, (uint64_t)n);
	void *act = malloc(bytes);
	float *deq = malloc((size_t)n * sizeof(float));
	ck_assert_ptr_nonnull(act);
	ck_assert_ptr_nonnull(deq);
	quant_act_row((uint32_t)at, x, act, n, false);
	wtype_dequantize_row((uint32_t)at, act, deq, n);
	*ret_act = act;
	return deq;
}

/*
 * Q4_1/Q5_1 kernels use the activation block sum s, stored as a half:
 * allow for its rounding (2^-11 relative) on top of float rounding.
 */
static double min_term_slack(uint32_t t, const uint8_t *w, const void *act, int64_t n)
{
	if (t != WTYPE_Q4_1 && t != WTYPE_Q5_1)
		return 0.0;
	const WTypeInfo *info = wtype_info(t);
	const BlockQ8_1 *a = act;
	double slack = 0.0;
	for (int64_t b = 0; b < n / 32; b++) {
		tkv_half m;
		memcpy(&m, w + (size_t)b * info->block_bytes + offsetof(BlockQ4_1, m), sizeof(m));
		slack += fabs((double)half_to_f32(m) * (double)half_to_f32(a[b].s)) * 1e-3;
	}
	return slack;
}

/*
 * Every weight type's reference against the float64 dot product of the
 * dequantized rows, and each SIMD set's kernel against the reference
 * within 1e-5 of sum |terms| (float accumulation order); the largest
 * differences seen are printed (docs/benchmarks.md records them).
 */
START_TEST(test_vec_dot)
{
	uint32_t t = all_types[_i];
	uint64_t rng = test_seed() ^ (0x1000u + t);
	const WTypeInfo *info = wtype_info(t);
	VecDotFn ref = vec_dot_ref_get(t);
	VecDotFn fast[N_SIMD_SETS];
	double max_abs[N_SIMD_SETS] = { 0 }, max_rel[N_SIMD_SETS] = { 0 };
	const int64_t lens[] = { 256, 512, 1536, 2304 };

	ck_assert_ptr_nonnull(ref);
	for (int k = 0; k < N_SIMD_SETS; k++) {
		fast[k] = simd_set(k) ? simd_dot(k, t) : NULL;
		if (!fast[k] && (k == 0 || simd_set(k)))
			fprintf(stderr, "%s: no %s kernel checked\n", info->name, simd_set(k) ? simd_set(k) : "SIMD");
	}
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		int64_t n = lens[li];
		for (int rep = 0; rep < 20; rep++) {
			size_t rb = wtype_row_bytes(t, (uint64_t)n);
			uint8_t *w = weights_random(t, 1, n, rb, &rng);
			float *x = acts_random(n, &rng);
			float *wd = malloc((size_t)n * sizeof(float));
			void *act;
			float *ad = acts_quantize(t, x, n, &act);

			wtype_dequantize_row(t, w, wd, n);
			double expect = 0.0, abs_sum = 0.0;
			for (int64_t i = 0; i < n; i++) {
				expect += (double)wd[i] * (double)ad[i];
				abs_sum += fabs((double)wd[i] * (double)ad[i]);
			}
			double tol = 1e-5 * abs_sum + min_term_slack(t, w, act, n) + 1e-30;

			float s_ref = NAN;
			ref(n, &s_ref, w, act);
			ck_assert_msg(fabs(s_ref - expect) <= tol, "%s n=%ld: ref %.9g, dequantized %.9g (tol %.3g)",
				      info->name, (long)n, s_ref, expect, tol);
			for (int k = 0; k < N_SIMD_SETS; k++) {
				if (!fast[k])
					continue;
				float s_fast = NAN;
				fast[k](n, &s_fast, w, act);
				double d = fabs((double)s_fast - (double)s_ref);
				ck_assert_msg(d <= 1e-5 * abs_sum + 1e-30, "%s n=%ld: %s %.9g, ref %.9g (sum|terms| %.3g)",
					      info->name, (long)n, simd_set(k), s_fast, s_ref, abs_sum);
				if (simd_exact(k))
					ck_assert_msg(memcmp(&s_fast, &s_ref, sizeof(float)) == 0,
						      "%s n=%ld: %s %.9g is not the reference's %.9g", info->name, (long)n,
						      simd_set(k), s_fast, s_ref);
				max_abs[k] = fmax(max_abs[k], d);
				max_rel[k] = fmax(max_rel[k], d / (abs_sum + 1e-30));
			}
			free(w);
			free(x);
			free(wd);
			free(ad);
			free(act);
		}
	}
	for (int k = 0; k < N_SIMD_SETS; k++)
		if (fast[k])
			fprintf(stderr, "vec_dot %-5s %-12s vs ref: max |diff| %.3g, max |diff| / sum|terms| %.3g\n",
				info->name, simd_set(k), max_abs[k], max_rel[k]);
}
END_TEST

/* Multi-row kernels equal the reference on each row (even and odd
 * block counts: the kernels take blocks two at a time). */
static void multi_check(uint32_t t, VecDotMultiFn multi, int64_t n, uint64_t *rng)
{
	VecDotFn ref = vec_dot_ref_get(t);
	int at = quant_act_type_for(t);
	size_t ab = wtype_row_bytes((uint32_t)at, (uint64_t)n);
	uint8_t *w = weights_random(t, 1, n, wtype_row_bytes(t, (uint64_t)n), rng);
	float *x = acts_random(n * VEC_DOT_MAX_NY, rng);
	uint8_t *act = malloc(ab * VEC_DOT_MAX_NY);
	const size_t af_stride = (size_t)n / 16 + 3; /* any stride works */
	float *af = malloc(af_stride * VEC_DOT_MAX_NY * sizeof(float));

	for (int j = 0; j < VEC_DOT_MAX_NY; j++) {
		quant_act_row((uint32_t)at, x + j * n, act + j * ab, n, false);
		if (at != WTYPE_Q8_K) /* Q8_K multi kernels read the rows' own float scales */
			quant_act_scales((uint32_t)at, act + j * ab, af + j * af_stride, n);
	}
	for (int ny = 1; ny <= VEC_DOT_MAX_NY; ny++) {
		float s[2 * VEC_DOT_MAX_NY];
		for (int j = 0; j < 2 * VEC_DOT_MAX_NY; j++)
			s[j] = -1234.0f;
		multi(n, s, 2, w, act, ab, af, af_stride, ny);
		for (int j = 0; j < VEC_DOT_MAX_NY; j++) {
			ck_assert_float_eq(s[2 * j + 1], -1234.0f);
			if (j >= ny) {
				ck_assert_float_eq(s[2 * j], -1234.0f);
				continue;
			}
			float r;
			ref(n, &r, w, act + j * ab);
			ck_assert_msg(fabsf(s[2 * j] - r) <= 1e-4f * (fabsf(r) + 1.0f), "%s n=%ld ny=%d row %d: %g vs %g",
				      wtype_name(t), (long)n, ny, j, s[2 * j], r);
		}
	}
	free(w);
	free(x);
	free(act);
	free(af);
}

START_TEST(test_vec_dot_multi)
{
	uint32_t t = all_types[_i];
	uint64_t rng = test_seed() ^ (0x2000u + t);
	VecDotMultiFn multi = simd_available() ? simd_multi(0, t) : NULL;

	if (!multi)
		return;
	/* one, two and an odd number of blocks (the 32-value kernels take them in pairs) */
	int64_t be = wtype_info(t)->block_elems;
	for (int rep = 0; rep < 10; rep++) {
		multi_check(t, multi, 16 * be, &rng);
		multi_check(t, multi, 17 * be, &rng);
		multi_check(t, multi, be, &rng);
	}
}
END_TEST

/* The AVX2 Q6_K dot is its multi kernel at one token: calls with more
 * tokens give each token what a one-token call gives, bit for bit, so
 * prefill and decode agree with each other. */
START_TEST(test_vec_dot_q6k_multi_equals_dot)
{
#if defined(CPU_KERNELS_X86)
	uint64_t rng = test_seed() ^ 0x2600u;
	const int64_t n = 2304;
	VecDotMultiFn multi = simd_available() ? vec_dot_avx2_multi_get(WTYPE_Q6_K) : NULL;
	VecDotFn dot = simd_available() ? vec_dot_avx2_get(WTYPE_Q6_K) : NULL;
	if (!multi || !dot)
		return;
	size_t ab = wtype_row_bytes(WTYPE_Q8_K, (uint64_t)n);
	uint8_t *w = weights_random(WTYPE_Q6_K, 1, n, wtype_row_bytes(WTYPE_Q6_K, (uint64_t)n), &rng);
	float *x = acts_random(n * VEC_DOT_MAX_NY, &rng);
	uint8_t *act = malloc(ab * VEC_DOT_MAX_NY);
	ck_assert_ptr_nonnull(act);
	for (int j = 0; j < VEC_DOT_MAX_NY; j++)
		quant_act_row(WTYPE_Q8_K, x + j * n, act + j * ab, n, false);
	for (int ny = 1; ny <= VEC_DOT_MAX_NY; ny++) {
		float s[VEC_DOT_MAX_NY], r;
		multi(n, s, 1, w, act, ab, NULL, 0, ny);
		for (int j = 0; j < ny; j++) {
			dot(n, &r, w, act + j * ab);
			ck_assert_msg(memcmp(&s[j], &r, sizeof(r)) == 0, "ny=%d row %d: %.9g vs the dot's %.9g", ny, j,
				      s[j], r);
		}
	}
	free(w);
	free(x);
	free(act);
#endif
}
END_TEST

/* The AVX-512 VNNI multi kernels (Q6_K) against the reference, as above;
 * matmul() runs them in test_matmul where the CPU has them. */
START_TEST(test_vec_dot_multi_avx512)
{
	uint64_t rng = test_seed() ^ 0x2700u;
	const CpuFeatures *f = cpu_features();
	VecDotMultiFn multi = NULL;
#if defined(CPU_KERNELS_X86)
	if (simd_available() && f->avx512 && f->avx512vnni)
		multi = vec_dot_avx512vnni_multi_get(WTYPE_Q6_K);
#endif
	(void)f;
	if (!multi) {
		fprintf(stderr, "Q6_K avx512vnni multi: not checked\n");
		return;
	}
	for (int rep = 0; rep < 10; rep++) {
		multi_check(WTYPE_Q6_K, multi, 256, &rng);
		multi_check(WTYPE_Q6_K, multi, 512, &rng);
		multi_check(WTYPE_Q6_K, multi, 2304, &rng);
	}
}
END_TEST

/* sum_i |w[r, i] * a[tok, i]| for tolerances, from dequantized data. */
static double *abs_sums(uint32_t t, const uint8_t *w, size_t stride, int64_t rows, int64_t cols,
			const float *x, int64_t n_tok)
{
	double *s = calloc((size_t)(rows * n_tok), sizeof(double));
	float *wd = malloc((size_t)cols * sizeof(float));
	for (int64_t tok = 0; tok < n_tok; tok++) {
		void *act;
		float *ad = acts_quantize(t, x + tok * cols, cols, &act);
		for (int64_t r = 0; r < rows; r++) {
			wtype_dequantize_row(t, w + (size_t)r * stride, wd, cols);
			for (int64_t i = 0; i < cols; i++)
				s[tok * rows + r] += fabs((double)wd[i] * (double)ad[i]);
		}
		free(ad);
		free(act);
	}
	free(wd);
	return s;
}

START_TEST(test_matmul_threads)
{
	uint32_t t = all_types[_i];
	uint64_t rng = test_seed() ^ (0x3000u + t);
	const int64_t rows_list[] = { 37, 5, 64 };
	const int64_t toks[] = { 1, 3, 17 };
	/* An odd number of 32-value blocks where the type allows. */
	const int64_t cols = wtype_info(t)->block_elems == QK_K ? 512 : 544;

	for (size_t ri = 0; ri < 3; ri++) {
		int64_t rows = rows_list[ri];
		size_t stride = wtype_row_bytes(t, (uint64_t)cols) + (ri == 1 ? 48 : 0);
		uint8_t *w = weights_random(t, rows, cols, stride, &rng);
		MatmulWeight mw = { .data = w, .type = t, .rows = rows, .cols = cols, .row_stride = stride };
		for (size_t ti = 0; ti < 3; ti++) {
			int64_t n_tok = toks[ti];
			float *x = acts_random(n_tok * cols, &rng);
			float *yr = malloc((size_t)(n_tok * rows) * sizeof(float));
			float *y = malloc((size_t)(n_tok * rows) * sizeof(float));
			double *abs_sum = abs_sums(t, w, stride, rows, cols, x, n_tok);

			ck_assert_int_eq(matmul_ref(&mw, x, yr, n_tok), 0);
			for (int nth = 1; nth <= 3; nth++) {
				ThreadPool *tp = NULL;
				ck_assert_int_eq(threadpool_new(nth, &tp), 0);
				for (int64_t i = 0; i < n_tok * rows; i++)
					y[i] = NAN;
				ck_assert_int_eq(matmul(tp, &mw, x, y, n_tok), 0);
				for (int64_t i = 0; i < n_tok * rows; i++)
					ck_assert_msg(fabs(y[i] - yr[i]) <= 1e-5 * abs_sum[i] + 1e-30,
						      "%s rows=%ld n_tok=%ld nth=%d out %ld: %.9g vs ref %.9g",
						      wtype_name(t), (long)rows, (long)n_tok, nth, (long)i, y[i], yr[i]);
				/* Scalar paths in matmul() are the reference, bit for bit. */
				cpu_features_disable_simd(true);
				ck_assert_int_eq(matmul(tp, &mw, x, y, n_tok), 0);
				cpu_features_disable_simd(false);
				ck_assert_mem_eq(y, yr, (size_t)(n_tok * rows) * sizeof(float));
				threadpool_free(tp);
			}
			for (int64_t r = 0; r < rows; r += 7) {
				float s = matmul_row_dot(&mw, r, x);
				ck_assert_msg(fabs(s - yr[r]) <= 1e-5 * abs_sum[r] + 1e-30, "%s row_dot %ld: %g vs %g",
					      wtype_name(t), (long)r, s, yr[r]);
			}
			free(x);
			free(y);
			free(yr);
			free(abs_sum);
		}
		free(w);
	}
}
END_TEST

/* A group (q/k/v-like: one input, three weights of different rows and
 * types sharing an activation format) equals the separate products. */
START_TEST(test_matmul_group)
{
	static const uint32_t groups[][3] = {
		{ WTYPE_Q4_1, WTYPE_Q4_1, WTYPE_Q5_1 },
		{ WTYPE_Q4_0, WTYPE_Q8_0, WTYPE_Q5_0 },
		{ WTYPE_Q4_K, WTYPE_Q6_K, WTYPE_Q4_K },
		{ WTYPE_F32, WTYPE_F16, WTYPE_BF16 },
	};
	const int64_t rows[3] = { 37, 12, 64 }, cols = 512;
	uint64_t rng = test_seed() ^ 0x5000u;

	for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++)
		for (int64_t n_tok = 1; n_tok <= 9; n_tok += 8)
			for (int nth = 1; nth <= 3; nth += 2) {
				MatmulWeight mw[3];
				const MatmulWeight *ws[3];
				float *ys[3], *yr[3];
				float *x = acts_random(n_tok * cols, &rng);
				ThreadPool *tp = NULL;
				ck_assert_int_eq(threadpool_new(nth, &tp), 0);
				for (int i = 0; i < 3; i++) {
					uint32_t t = groups[g][i];
					size_t stride = wtype_row_bytes(t, cols);
					mw[i] = (MatmulWeight){ .data = weights_random(t, rows[i], cols, stride, &rng),
								.type = t, .rows = rows[i], .cols = cols,
								.row_stride = stride };
					ws[i] = &mw[i];
					ys[i] = malloc((size_t)(n_tok * rows[i]) * sizeof(float));
					yr[i] = malloc((size_t)(n_tok * rows[i]) * sizeof(float));
					ck_assert_int_eq(matmul(tp, &mw[i], x, yr[i], n_tok), 0);
				}
				ck_assert_int_eq(matmul_group(tp, ws, ys, 3, x, n_tok), 0);
				for (int i = 0; i < 3; i++) {
					/* Same kernels, same activations: identical results. */
					ck_assert_mem_eq(ys[i], yr[i], (size_t)(n_tok * rows[i]) * sizeof(float));
					free((void *)mw[i].data);
					free(ys[i]);
					free(yr[i]);
				}
				threadpool_free(tp);
				free(x);
			}
}
END_TEST

START_TEST(test_matmul_rejects)
{
	float x[64] = { 0 }, y[4];
	uint8_t w[4 * 36] = { 0 };
	MatmulWeight bad_cols = { .data = w, .type = WTYPE_Q4_0, .rows = 2, .cols = 48, .row_stride = 36 };
	MatmulWeight bad_type = { .data = w, .type = WTYPE_Q8_K, .rows = 2, .cols = 256, .row_stride = 292 };
	MatmulWeight bad_stride = { .data = w, .type = WTYPE_Q4_0, .rows = 2, .cols = 64, .row_stride = 20 };
	ck_assert_int_eq(matmul(NULL, &bad_cols, x, y, 1), -EINVAL);
	ck_assert_int_eq(matmul(NULL, &bad_type, x, y, 1), -EINVAL);
	ck_assert_int_eq(matmul_ref(&bad_stride, x, y, 1), -EINVAL);
	ck_assert(isnan(matmul_row_dot(&bad_type, 0, x)));

	/* Groups must share cols and activation format. */
	uint8_t w2[2 * 144] = { 0 };
	float y2[8];
	MatmulWeight a = { .data = w, .type = WTYPE_Q4_0, .rows = 2, .cols = 64, .row_stride = 36 };
	MatmulWeight b = { .data = w, .type = WTYPE_Q4_1, .rows = 1, .cols = 64, .row_stride = 40 };
	MatmulWeight c = { .data = w2, .type = WTYPE_Q4_K, .rows = 1, .cols = 256, .row_stride = 144 };
	MatmulWeight d = { .data = w, .type = WTYPE_Q8_0, .rows = 2, .cols = 32, .row_stride = 34 };
	const MatmulWeight *ab[] = { &a, &b }, *ac[] = { &a, &c }, *ad[] = { &a, &d };
	float *ys[] = { y, y2 };
	ck_assert_int_eq(matmul_group(NULL, ab, ys, 2, x, 1), -EINVAL);
	ck_assert_int_eq(matmul_group(NULL, ac, ys, 2, x, 1), -EINVAL);
	ck_assert_int_eq(matmul_group(NULL, ad, ys, 2, x, 1), -EINVAL);
	ck_assert_int_eq(matmul_group(NULL, ab, ys, 0, x, 1), -EINVAL);
}
END_TEST

/* ---- activation quantizers ------------------------------------------ */

/* One Q8_0/Q8_1 block worked by hand: amax 127 gives d = 1, so q is
 * roundf(x): ties go away from zero. The second block has amax 1: d =
 * 1/127 rounds to half 0x2008, q = roundf(x * 127.00000x). */
START_TEST(test_quant_q8_0_hand)
{
	float x[64] = { 0 };
	static const float head[] = { 127.0f, 2.5f, -2.5f, 0.5f, -0.49f, 1.5f, -127.0f, 63.5f, -0.5f };
	static const int8_t want_head[] = { 127, 3, -3, 1, 0, 2, -127, 64, -1 };
	memcpy(x, head, sizeof(head));
	x[32] = 1.0f;
	x[33] = -0.5f;  /* -63.5 -> -64 */
	x[34] = 0.25f;  /* 31.75 -> 32 */

	BlockQ8_0 b0[2], b0s[2];
	BlockQ8_1 b1[2], b1s[2];
	quant_act_q8_0_ref(x, b0, 64);
	quant_act_q8_1_ref(x, b1, 64);
	ck_assert_uint_eq(b0[0].d, 0x3C00);
	ck_assert_uint_eq(b1[0].d, 0x3C00);
	for (int j = 0; j < 32; j++) {
		int8_t want = j < 9 ? want_head[j] : 0;
		ck_assert_int_eq(b0[0].qs[j], want);
		ck_assert_int_eq(b1[0].qs[j], want);
	}
	/* s = d * sum(q) = 127 + 3 - 3 + 1 + 0 + 2 - 127 + 64 - 1 = 66 */
	ck_assert_uint_eq(b1[0].s, 0x5420);
	ck_assert_uint_eq(b0[1].d, 0x2008);
	ck_assert_int_eq(b0[1].qs[0], 127);
	ck_assert_int_eq(b0[1].qs[1], -64);
	ck_assert_int_eq(b0[1].qs[2], 32);
	ck_assert_int_eq(b0[1].qs[3], 0);
	/* s = (127 - 64 + 32) / 127 = 0.748..., half 0x39FC */
	ck_assert_uint_eq(b1[1].s, f32_to_half(95.0f * (1.0f / 127.0f)));
	ck_assert_uint_eq(b1[1].s, 0x39FC);

	if (simd_available()) {
		quant_act_row(WTYPE_Q8_0, x, b0s, 64, true);
		quant_act_row(WTYPE_Q8_1, x, b1s, 64, true);
		ck_assert_mem_eq(b0s, b0, sizeof(b0));
		ck_assert_mem_eq(b1s, b1, sizeof(b1));
	}
}
END_TEST

/* Q8_K: the signed value of largest magnitude sets iscale = -127 / max
 * (first one wins), d = 1 / iscale; rounding is half to even. */
START_TEST(test_quant_q8_K_hand)
{
	float x[512] = { 0 };
	static const float head[] = { -127.0f, 2.5f, -2.5f, 0.5f, 1.5f, 3.5f, -0.75f, 100.2f, 0, 127.0f };
	static const int8_t want_head[] = { -127, 2, -2, 0, 2, 4, -1, 100, 0, 127 };
	memcpy(x, head, sizeof(head));
	x[16] = 5.0f;
	x[31] = -6.0f;
	/* Second block: max +127 -> iscale -1, d = -1, q = -x. */
	x[256] = 10.0f;
	x[300] = 127.0f;
	x[301] = -127.0f;
	x[302] = 0.5f;

	BlockQ8_K b[2], bs[2];
	quant_act_q8_K_ref(x, b, 512);
	ck_assert_float_eq(b[0].d, 1.0f);
	for (int j = 0; j < 10; j++)
		ck_assert_int_eq(b[0].qs[j], want_head[j]);
	ck_assert_int_eq(b[0].qs[16], 5);
	ck_assert_int_eq(b[0].qs[31], -6);
	ck_assert_int_eq(b[0].bsums[0], -127 + 2 - 2 + 0 + 2 + 4 - 1 + 100 + 0 + 127);
	ck_assert_int_eq(b[0].bsums[1], -1);
	for (int g = 2; g < 16; g++)
		ck_assert_int_eq(b[0].bsums[g], 0);

	ck_assert_float_eq(b[1].d, -1.0f);
	ck_assert_int_eq(b[1].qs[0], -10);
	ck_assert_int_eq(b[1].qs[44], -127);
	ck_assert_int_eq(b[1].qs[45], 127);
	ck_assert_int_eq(b[1].qs[46], 0);
	ck_assert_int_eq(b[1].bsums[0], -10);
	ck_assert_int_eq(b[1].bsums[2], 0);

	if (simd_available()) {
		quant_act_row(WTYPE_Q8_K, x, bs, 512, true);
		ck_assert_mem_eq(bs, b, sizeof(b));
	}
}
END_TEST

START_TEST(test_quant_zero_block)
{
	float x[256] = { 0 };
	BlockQ8_K k;
	BlockQ8_0 q;
	memset(&k, 0x55, sizeof(k));
	quant_act_q8_K_ref(x, &k, 256);
	ck_assert_float_eq(k.d, 0.0f);
	for (int j = 0; j < 16; j++)
		ck_assert_int_eq(k.bsums[j], 0);
	quant_act_q8_0_ref(x, &q, 32);
	ck_assert_uint_eq(q.d, 0);
	for (int j = 0; j < 32; j++)
		ck_assert_int_eq(q.qs[j], 0);
}
END_TEST

/* The SIMD quantizers (AVX2, NEON) produce the reference's bytes, ties included. */
START_TEST(test_quant_simd_identical)
{
	uint64_t rng = test_seed() ^ 0x4000u;
	const int64_t n = 4096;

	if (!simd_available())
		return;
	float *x = malloc(n * sizeof(float));
	void *a = malloc(wtype_row_bytes(WTYPE_Q8_K, n)), *b = malloc(wtype_row_bytes(WTYPE_Q8_K, n));
	for (int rep = 0; rep < 200; rep++) {
		for (int64_t i = 0; i < n; i++) {
			float v = test_rand_normal(&rng) * (rep % 5 == 0 ? 1e-3f : 3.0f);
			/* Half-integer multiples of the scale make ties likely. */
			if (rep % 3 == 1)
				v = (float)((int)(v * 8.0f)) * 0.5f;
			if (rep % 7 == 2 && i < 300)
				v = 0.0f;
			x[i] = v;
		}
		const uint32_t ts[] = { WTYPE_Q8_0, WTYPE_Q8_1, WTYPE_Q8_K };
		for (int k = 0; k < 3; k++) {
			size_t bytes = wtype_row_bytes(ts[k], n);
			quant_act_row(ts[k], x, a, n, false);
			quant_act_row(ts[k], x, b, n, true);
			ck_assert_msg(memcmp(a, b, bytes) == 0, "%s rep %d differs", wtype_name(ts[k]), rep);
		}
	}
	free(x);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_act_types)
{
	ck_assert_int_eq(quant_act_type_for(WTYPE_Q4_0), WTYPE_Q8_0);
	ck_assert_int_eq(quant_act_type_for(WTYPE_Q4_1), WTYPE_Q8_1);
	ck_assert_int_eq(quant_act_type_for(WTYPE_Q5_1), WTYPE_Q8_1);
	ck_assert_int_eq(quant_act_type_for(WTYPE_Q8_0), WTYPE_Q8_0);
	ck_assert_int_eq(quant_act_type_for(WTYPE_Q6_K), WTYPE_Q8_K);
	ck_assert_int_eq(quant_act_type_for(WTYPE_BF16), WTYPE_F32);
	ck_assert_int_eq(quant_act_type_for(WTYPE_Q8_K), -1);
}
END_TEST

/*
 * Repacked Q4_K (layout X4): the layout holds the same rows (gathered back
 * byte for byte), the SIMD tile kernels (AVX2 and AVX-512 VNNI on x86,
 * the latter's two-group kernel too) equal the reference tile within
 * float rounding for 1..16 tokens and
 * K up to 18 super-blocks (the AVX-512 kernel's passes of 16), and
 * matmul() over the repacked copy equals matmul_ref() over the row-major
 * original for 1..3 threads, with and without AVX-512 (the scalar path
 * bit for bit).
 */
START_TEST(test_repack_q4_K)
{
	uint32_t t = WTYPE_Q4_K;
	uint64_t rng = test_seed() ^ 0x5000u;
	const int64_t rows_list[] = { 4, 12, 40, 8 };
	const int64_t cols_list[] = { 256, 2304, 2048, 4608 };
	const int64_t toks[] = { 1, 3, 4, 6, 9, 17 };
	RepackTileFn ref = repack_tile_ref_get(t), fast[N_SIMD_SETS];

	ck_assert_ptr_nonnull(ref);
	for (int k = 0; k < N_SIMD_SETS; k++) {
		fast[k] = tile_set(k) ? simd_tile(k, t) : NULL;
		fprintf(stderr, "repack Q4_K: tile set %d %s\n", k, fast[k] ? tile_set(k) : "not checked");
	}
	for (size_t ri = 0; ri < 4; ri++) {
		int64_t rows = rows_list[ri], cols = cols_list[ri];
		size_t stride = wtype_row_bytes(t, (uint64_t)cols);
		uint8_t *w = weights_random(t, rows, cols, stride, &rng);
		MatmulWeight mw = { .data = w, .type = t, .rows = rows, .cols = cols, .row_stride = stride }, px;
		ck_assert(repack_supported(&mw));
		ck_assert_int_eq(repack_weight(&mw, &px), 0);
		ck_assert_int_eq(px.layout, MATMUL_LAYOUT_X4);
		ck_assert(!repack_supported(&px));
		uint8_t *row = malloc(stride);
		for (int64_t r = 0; r < rows; r++)
			ck_assert_mem_eq(repack_row(&px, r, row), w + (size_t)r * stride, stride);
		free(row);

		for (size_t ti = 0; ti < sizeof(toks) / sizeof(toks[0]); ti++) {
			int64_t n_tok = toks[ti];
			float *x = acts_random(n_tok * cols, &rng);
			float *yr = malloc((size_t)(n_tok * rows) * sizeof(float));
			float *y = malloc((size_t)(n_tok * rows) * sizeof(float));
			double *abs_sum = abs_sums(t, w, stride, rows, cols, x, n_tok);
			ck_assert_int_eq(matmul_ref(&mw, x, yr, n_tok), 0);

			/* the tile kernels on the first group, every token count up to
			 * min(n_tok, 16): the AVX2 kernel's direct (1..3) and stack-copy
			 * paths, its passes of 8 and their remainders */
			size_t as = wtype_row_bytes(WTYPE_Q8_K, (uint64_t)cols);
			int nt_max = (int)(n_tok < REPACK_MAX_NT ? n_tok : REPACK_MAX_NT);
			uint8_t *act = malloc(as * (size_t)nt_max);
			for (int j = 0; j < nt_max; j++)
				quant_act_row(WTYPE_Q8_K, x + j * cols, act + (size_t)j * as, cols, false);
			float tr[REPACK_MAX_NT * REPACK_GROUP], tf[REPACK_MAX_NT * REPACK_GROUP];
			for (int nt = 1; nt <= nt_max; nt++) {
				ref(cols, px.data, act, as, nt, tr, REPACK_GROUP);
				for (int j = 0; j < nt; j++)
					for (int i = 0; i < REPACK_GROUP; i++)
						ck_assert_mem_eq(&tr[j * REPACK_GROUP + i], &yr[j * rows + i], sizeof(float));
				for (int k = 0; k < N_SIMD_SETS; k++) {
					if (!fast[k])
						continue;
					fast[k](cols, px.data, act, as, nt, tf, REPACK_GROUP);
					for (int j = 0; j < nt; j++)
						for (int i = 0; i < REPACK_GROUP; i++)
							ck_assert_msg(fabs(tf[j * REPACK_GROUP + i] - tr[j * REPACK_GROUP + i]) <=
									      1e-5 * abs_sum[j * rows + i] + 1e-30,
								      "tile cols=%ld nt=%d row %d tok %d: %s %.9g ref %.9g",
								      (long)cols, nt, i, j, tile_set(k), tf[j * REPACK_GROUP + i],
								      tr[j * REPACK_GROUP + i]);
					if (simd_exact(k))
						for (int j = 0; j < nt; j++)
							ck_assert_mem_eq(&tf[j * REPACK_GROUP], &tr[j * REPACK_GROUP],
									 REPACK_GROUP * sizeof(float));
				}
			}
			int nt = nt_max;
			/* the two-group kernel on the first two groups against the reference on each */
			RepackTileFn fast8 = tile_set(1) ? simd_tile8(t) : NULL;
			if (fast8 && rows >= 2 * REPACK_GROUP) {
				float t8[REPACK_MAX_NT * 2 * REPACK_GROUP], r8[REPACK_MAX_NT * 2 * REPACK_GROUP];
				size_t gb = REPACK_GROUP * stride;
				ref(cols, px.data, act, as, nt, r8, 2 * REPACK_GROUP);
				ref(cols, (const uint8_t *)px.data + gb, act, as, nt, r8 + REPACK_GROUP, 2 * REPACK_GROUP);
				fast8(cols, px.data, act, as, nt, t8, 2 * REPACK_GROUP);
				for (int j = 0; j < nt; j++)
					for (int i = 0; i < 2 * REPACK_GROUP; i++)
						ck_assert_msg(fabs(t8[j * 2 * REPACK_GROUP + i] - r8[j * 2 * REPACK_GROUP + i]) <=
								      1e-5 * abs_sum[j * rows + i] + 1e-30,
							      "tile8 cols=%ld nt=%d row %d tok %d: %.9g ref %.9g", (long)cols,
							      nt, i, j, t8[j * 2 * REPACK_GROUP + i], r8[j * 2 * REPACK_GROUP + i]);
			}
			free(act);

			for (int nth = 1; nth <= 3; nth++) {
				ThreadPool *tp = NULL;
				ck_assert_int_eq(threadpool_new(nth, &tp), 0);
				for (int64_t i = 0; i < n_tok * rows; i++)
					y[i] = NAN;
				ck_assert_int_eq(matmul(tp, &px, x, y, n_tok), 0);
				for (int64_t i = 0; i < n_tok * rows; i++)
					ck_assert_msg(fabs(y[i] - yr[i]) <= 1e-5 * abs_sum[i] + 1e-30,
						      "repacked rows=%ld n_tok=%ld nth=%d out %ld: %.9g vs ref %.9g",
						      (long)rows, (long)n_tok, nth, (long)i, y[i], yr[i]);
				/* the AVX2 tiles on a CPU that has AVX-512 */
				cpu_features_disable_avx512(true);
				ck_assert_int_eq(matmul(tp, &px, x, y, n_tok), 0);
				cpu_features_disable_avx512(false);
				for (int64_t i = 0; i < n_tok * rows; i++)
					ck_assert_msg(fabs(y[i] - yr[i]) <= 1e-5 * abs_sum[i] + 1e-30,
						      "repacked, no avx512, rows=%ld n_tok=%ld nth=%d out %ld: %.9g vs %.9g",
						      (long)rows, (long)n_tok, nth, (long)i, y[i], yr[i]);
				cpu_features_disable_simd(true);
				ck_assert_int_eq(matmul(tp, &px, x, y, n_tok), 0);
				cpu_features_disable_simd(false);
				ck_assert_mem_eq(y, yr, (size_t)(n_tok * rows) * sizeof(float));
				threadpool_free(tp);
			}
			for (int64_t r = 0; r < rows; r += 3) {
				float s = matmul_row_dot(&px, r, x);
				ck_assert_msg(fabs(s - yr[r]) <= 1e-5 * abs_sum[r] + 1e-30, "row_dot %ld: %g vs %g",
					      (long)r, s, yr[r]);
			}
			float *y2 = malloc((size_t)(n_tok * rows) * sizeof(float));
			ck_assert_int_eq(matmul_ref(&px, x, y2, n_tok), 0);
			ck_assert_mem_eq(y2, yr, (size_t)(n_tok * rows) * sizeof(float));
			free(y2);
			free(x);
			free(y);
			free(yr);
			free(abs_sum);
		}
		free((void *)px.data);
		free(w);
	}
	/* the int16 bound of the AVX2 kernel's sub-block sums: every nibble 15,
	 * every scale and min 63, every activation -128, 1..16 tokens */
	{
		enum { EX_COLS = 512, EX_NB = EX_COLS / QK_K };
		static BlockQ4_K wx[REPACK_GROUP * EX_NB];
		static BlockQ8_K ax[REPACK_MAX_NT * EX_NB];
		for (size_t i = 0; i < sizeof(wx) / sizeof(wx[0]); i++) {
			wx[i].d = f32_to_half(1.0f);
			wx[i].dmin = f32_to_half(0.5f);
			memset(wx[i].scales, 0xFF, sizeof(wx[i].scales));
			memset(wx[i].qs, 0xFF, sizeof(wx[i].qs));
		}
		for (size_t i = 0; i < sizeof(ax) / sizeof(ax[0]); i++) {
			ax[i].d = 1.0f;
			memset(ax[i].qs, 0x80, sizeof(ax[i].qs));
			for (int j = 0; j < QK_K / 16; j++)
				ax[i].bsums[j] = -128 * 16;
		}
		float er[REPACK_MAX_NT * REPACK_GROUP], ef[REPACK_MAX_NT * REPACK_GROUP];
		for (int nt = 1; nt <= REPACK_MAX_NT; nt++) {
			ref(EX_COLS, wx, ax, sizeof(BlockQ8_K) * EX_NB, nt, er, REPACK_GROUP);
			for (int k = 0; k < N_SIMD_SETS; k++) {
				if (!fast[k])
					continue;
				fast[k](EX_COLS, wx, ax, sizeof(BlockQ8_K) * EX_NB, nt, ef, REPACK_GROUP);
				for (int i = 0; i < nt * REPACK_GROUP; i++)
					ck_assert_msg(fabs(ef[i] - er[i]) <= 1e-6 * fabs(er[i]), "extreme nt=%d out %d: %s %.9g ref %.9g",
						      nt, i, tile_set(k), ef[i], er[i]);
			}
		}
	}
	/* what is not repacked */
	uint8_t blk[2 * 144] = { 0 };
	MatmulWeight odd = { .data = blk, .type = t, .rows = 2, .cols = 256, .row_stride = 144 }, out;
	ck_assert(!repack_supported(&odd));
	ck_assert_int_eq(repack_weight(&odd, &out), -EINVAL);
	MatmulWeight q5 = { .data = blk, .type = WTYPE_Q5_1, .rows = 4, .cols = 32, .row_stride = 24 };
	ck_assert(!repack_supported(&q5));
}
END_TEST

/*
 * Sum over blocks of one row-major weight row (type t: Q4_0, Q4_1, Q5_0, Q8_0)
 * times one quantized activation row, from the blocks' fields: in double
 * (*ret_abs: the sum of |terms|, d_w d_a q_j a_j and m_w s_a, which bounds
 * float rounding), independent of every kernel.
 */
static double q32_dot(uint32_t t, const uint8_t *row, const uint8_t *act, int64_t nb, double *ret_abs)
{
	double sum = 0.0, abs = 0.0;
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *wb = row + (size_t)b * wtype_info(t)->block_bytes;
		const uint8_t *ab = act + (size_t)b * (t == WTYPE_Q4_1 ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0));
		const int8_t *aq = (const int8_t *)ab + (t == WTYPE_Q4_1 ? 4 : 2);
		tkv_half h;
		memcpy(&h, wb, 2);
		double dw = half_to_f32(h);
		memcpy(&h, ab, 2);
		double da = half_to_f32(h);
		long isum = 0, iabs = 0;
		size_t qoff = t == WTYPE_Q4_1 ? 4 : t == WTYPE_Q5_0 ? 6 : 2;
		for (int j = 0; j < 32; j++) {
			int q = t == WTYPE_Q8_0 ? (int8_t)wb[2 + j] : j < 16 ? wb[qoff + j] & 0xF : wb[qoff + j - 16] >> 4;
			if (t == WTYPE_Q5_0) /* the fifth bit: bit j of the 4 qh bytes, little-endian */
				q = (q | ((wb[2 + j / 8] >> (j % 8)) & 1) << 4) - 16;
			isum += (long)(t == WTYPE_Q4_0 ? q - 8 : q) * aq[j];
			iabs += labs((long)(t == WTYPE_Q4_0 ? q - 8 : q) * aq[j]);
		}
		sum += dw * da * (double)isum;
		/* |terms| of the products, not of their sum: a kernel may split a
		 * block's sum across lanes, each scaled and rounded on its own */
		abs += fabs(dw * da) * (double)iabs;
		if (t == WTYPE_Q4_1) {
			memcpy(&h, wb + 2, 2);
			double mw = half_to_f32(h);
			memcpy(&h, ab + 2, 2);
			sum += mw * half_to_f32(h);
			abs += fabs(mw * half_to_f32(h));
		}
	}
	*ret_abs = abs;
	return sum;
}

/*
 * Activation rows made directly as blocks (not through the quantizer):
 * random int8 quants, all of a token's block scales 2^-(4 + tok % 2) when
 * pow2 (else random), Q8_1's s = d * sum(q) as a half.
 */
static uint8_t *q32_acts(uint32_t t, int64_t nb, int nt, bool pow2, uint64_t *rng)
{
	size_t ab = t == WTYPE_Q4_1 ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0), qoff = t == WTYPE_Q4_1 ? 4 : 2;
	uint8_t *act = malloc(ab * (size_t)(nb * nt));
	ck_assert_ptr_nonnull(act);
	for (int tok = 0; tok < nt; tok++)
		for (int64_t b = 0; b < nb; b++) {
			uint8_t *blk = act + ab * (size_t)(tok * nb + b);
			float d = pow2 ? ldexpf(1.0f, -(4 + tok % 2)) : fabsf(rand_scale(rng));
			int s = 0;
			for (int j = 0; j < 32; j++) {
				int q = (int)(test_rand_u64(rng) % 255) - 127;
				blk[qoff + j] = (uint8_t)(int8_t)q;
				s += q;
			}
			put_half(blk, d);
			if (t == WTYPE_Q4_1)
				put_half(blk + 2, d * (float)s);
		}
	return act;
}

/*
 * Repacked Q4_0, Q4_1, Q5_0 and Q8_0 (layout X4, the 32-value types):
 * - the bytes sit where repack.h says, and every row gathers back byte
 *   for byte;
 * - on each group of the matrix, for 1..16 tokens (odd counts, and 16),
 *   the reference tile and the AVX2 one equal the sum computed here from
 *   the row-major blocks exactly when scales are powers of two (all
 *   integer sums then exact and the float ones too: each row's terms are
 *   multiples of one power of two below 2^24 of them), and within 1e-5 of
 *   the sum of |terms| for random scales;
 * - matmul() over the repacked copy equals matmul_ref() over the original
 *   within float rounding for 1..3 threads, bit for bit with SIMD off,
 *   and matmul_row_dot() and matmul_ref() over the copy agree;
 * - matmul_repack_wanted() asks for them only where their SIMD tile runs.
 */
START_TEST(test_repack_q32)
{
	static const uint32_t types[] = { WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_Q5_0, WTYPE_Q8_0 };
	uint32_t t = types[_i];
	uint64_t rng = test_seed() ^ (0x7000u + t);
	const int64_t rows_list[] = { 4, 12, 16 };
	const int64_t cols_list[] = { 32, 576, 2080 };
	const int nts[] = { 1, 3, 5, 7, 9, 11, 13, 15, 16 };
	const int64_t toks[] = { 1, 5, 17 };
	int halves = t == WTYPE_Q4_1 ? 2 : t == WTYPE_Q5_0 ? 3 : 1; /* Q5_0: d, and qh as two */
	size_t qbytes = t == WTYPE_Q8_0 ? 32 : 16;
	RepackTileFn ref = repack_tile_ref_get(t), fast = simd_available() ? simd_tile(0, t) : NULL;
#if defined(CPU_KERNELS_X86)
	RepackTileFn q32 = simd_available() ? repack_tile_q32_avx2_get(t) : NULL;
	ck_assert(q32 == fast || !fast);
	fast = q32;
#endif
	ck_assert_ptr_nonnull(ref);
	fprintf(stderr, "repack %s: tile %s\n", wtype_name(t), fast ? tile_set(0) : "reference only");

	for (size_t ri = 0; ri < 3; ri++) {
		int64_t rows = rows_list[ri], cols = cols_list[ri], nb = cols / 32;
		size_t stride = wtype_row_bytes(t, (uint64_t)cols), bb = wtype_info(t)->block_bytes;
		uint8_t *w = weights_random(t, rows, cols, stride, &rng);
		MatmulWeight mw = { .data = w, .type = t, .rows = rows, .cols = cols, .row_stride = stride }, px;
		ck_assert(repack_supported(&mw));
		ck_assert_int_eq(matmul_repack_wanted(&mw), fast != NULL);
		ck_assert_int_eq(repack_weight(&mw, &px), 0);
		ck_assert_int_eq(px.layout, MATMUL_LAYOUT_X4);
		ck_assert(!repack_supported(&px));
		/* the documented positions, then the gather */
		const uint8_t *pd = px.data;
		for (int64_t r = 0; r < rows; r++)
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *gb = pd + (size_t)(r / 4) * 4 * stride + (size_t)b * 4 * bb;
				const uint8_t *blk = w + (size_t)r * stride + (size_t)b * bb;
				int i = (int)(r % 4);
				for (int h = 0; h < halves; h++)
					ck_assert_mem_eq(gb + 8 * h + 2 * i, blk + 2 * h, 2);
				for (size_t c = 0; c < qbytes / 8; c++)
					ck_assert_mem_eq(gb + 8 * halves + 32 * c + 8 * (size_t)i, blk + 2 * halves + 8 * c, 8);
			}
		uint8_t *row = malloc(stride);
		for (int64_t r = 0; r < rows; r++)
			ck_assert_mem_eq(repack_row(&px, r, row), w + (size_t)r * stride, stride);
		free(row);

		/* the tiles on every group: power-of-two scales (exact), then random ones */
		for (int pow2 = 1; pow2 >= 0; pow2--) {
			uint8_t *wt = w;
			MatmulWeight pt = px;
			if (pow2) {
				wt = malloc((size_t)rows * stride);
				memcpy(wt, w, (size_t)rows * stride);
				for (int64_t r = 0; r < rows; r++)
					for (int64_t b = 0; b < nb; b++) {
						uint8_t *blk = wt + (size_t)r * stride + (size_t)b * bb;
						put_half(blk, ldexpf(1.0f, -(3 + (int)(r % 3))));
						if (halves == 2)
							put_half(blk + 2, ldexpf(r % 2 ? -1.0f : 1.0f, -(2 + (int)(r % 4))));
					}
				MatmulWeight m2 = mw;
				m2.data = wt;
				ck_assert_int_eq(repack_weight(&m2, &pt), 0);
			}
			size_t as = t == WTYPE_Q4_1 ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
			for (size_t ni = 0; ni < sizeof(nts) / sizeof(nts[0]); ni++) {
				int nt = nts[ni];
				uint8_t *act = q32_acts(t, nb, nt, pow2, &rng);
				for (int64_t g = 0; g < rows / 4; g++) {
					const uint8_t *grp = (const uint8_t *)pt.data + (size_t)g * 4 * stride;
					float tr[REPACK_MAX_NT * REPACK_GROUP], tf[REPACK_MAX_NT * REPACK_GROUP];
					ref(cols, grp, act, as * (size_t)nb, nt, tr, REPACK_GROUP);
					if (fast)
						fast(cols, grp, act, as * (size_t)nb, nt, tf, REPACK_GROUP);
					for (int j = 0; j < nt; j++)
						for (int i = 0; i < REPACK_GROUP; i++) {
							double abs, want = q32_dot(t, wt + (size_t)(4 * g + i) * stride,
										   act + as * (size_t)(j * nb), nb, &abs);
							double tol = pow2 ? 0.0 : 1e-5 * abs + 1e-30;
							float r = tr[j * REPACK_GROUP + i];
							ck_assert_msg(fabs(r - want) <= tol, "%s ref tile cols=%ld nt=%d g=%ld row %d tok %d: %.9g want %.9g",
								      wtype_name(t), (long)cols, nt, (long)g, i, j, r, want);
							if (!fast)
								continue;
							float f = tf[j * REPACK_GROUP + i];
							ck_assert_msg(fabs(f - want) <= tol, "%s %s tile cols=%ld nt=%d g=%ld row %d tok %d: %.9g want %.9g",
								      wtype_name(t), tile_set(0), (long)cols, nt, (long)g, i, j, f, want);
						}
				}
				free(act);
			}
			if (pow2) {
				free((void *)pt.data);
				free(wt);
			}
		}

		/* matmul over the copy against matmul_ref over the original */
		for (size_t ti = 0; ti < sizeof(toks) / sizeof(toks[0]); ti++) {
			int64_t n_tok = toks[ti];
			float *x = acts_random(n_tok * cols, &rng);
			float *yr = malloc((size_t)(n_tok * rows) * sizeof(float));
			float *y = malloc((size_t)(n_tok * rows) * sizeof(float));
			double *abs_sum = abs_sums(t, w, stride, rows, cols, x, n_tok);
			ck_assert_int_eq(matmul_ref(&mw, x, yr, n_tok), 0);
			/* Q4_1: d q and m terms may cancel; bound by the terms */
			double slack = t == WTYPE_Q4_1 ? 16.0 : 1.0;
			for (int nth = 1; nth <= 3; nth++) {
				ThreadPool *tp = NULL;
				ck_assert_int_eq(threadpool_new(nth, &tp), 0);
				for (int64_t i = 0; i < n_tok * rows; i++)
					y[i] = NAN;
				ck_assert_int_eq(matmul(tp, &px, x, y, n_tok), 0);
				for (int64_t i = 0; i < n_tok * rows; i++)
					ck_assert_msg(fabs(y[i] - yr[i]) <= slack * 1e-5 * abs_sum[i] + 1e-30,
						      "%s repacked rows=%ld n_tok=%ld nth=%d out %ld: %.9g vs ref %.9g",
						      wtype_name(t), (long)rows, (long)n_tok, nth, (long)i, y[i], yr[i]);
				cpu_features_disable_simd(true);
				ck_assert_int_eq(matmul(tp, &px, x, y, n_tok), 0);
				cpu_features_disable_simd(false);
				ck_assert_mem_eq(y, yr, (size_t)(n_tok * rows) * sizeof(float));
				threadpool_free(tp);
			}
			for (int64_t r = 0; r < rows; r += 3) {
				float s = matmul_row_dot(&px, r, x);
				ck_assert_msg(fabs(s - yr[r]) <= slack * 1e-5 * abs_sum[r] + 1e-30, "row_dot %ld: %g vs %g",
					      (long)r, s, yr[r]);
			}
			float *y2 = malloc((size_t)(n_tok * rows) * sizeof(float));
			ck_assert_int_eq(matmul_ref(&px, x, y2, n_tok), 0);
			ck_assert_mem_eq(y2, yr, (size_t)(n_tok * rows) * sizeof(float));
			free(y2);
			free(x);
			free(y);
			free(yr);
			free(abs_sum);
		}
		cpu_features_disable_simd(true);
		ck_assert(!matmul_repack_wanted(&mw));
		cpu_features_disable_simd(false);
		free((void *)px.data);
		free(w);
	}
}
END_TEST

/*
 * The f32 primitives (vec_f32.h): the dispatched dot product against the
 * reference within float rounding of sum |a_i b_i|, axpy within one
 * rounding per element (the AVX2 one fuses; the NEON one is the
 * reference's floats), with the scalar path the reference bit for bit.
 */
START_TEST(test_vec_f32)
{
	uint64_t rng = test_seed() ^ 0x6000u;
	const int64_t lens[] = { 1, 3, 4, 7, 8, 15, 16, 17, 64, 100, 1000 };
	double max_rel = 0.0;
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		int64_t n = lens[li];
		float *a = acts_random(n, &rng), *b = acts_random(n, &rng);
		float *y0 = acts_random(n, &rng), *y1 = malloc((size_t)n * sizeof(float)),
		      *y2 = malloc((size_t)n * sizeof(float));
		double abs_sum = 0.0;
		for (int64_t i = 0; i < n; i++)
			abs_sum += fabs((double)a[i] * b[i]);
		float r = vec_f32_dot_ref(n, a, b), f = vec_f32_dot(n, a, b);
		ck_assert_msg(fabs((double)f - r) <= 1e-6 * abs_sum + 1e-30, "dot n=%ld: %.9g vs ref %.9g", (long)n, f, r);
		max_rel = fmax(max_rel, fabs((double)f - r) / (abs_sum + 1e-30));
		memcpy(y1, y0, (size_t)n * sizeof(float));
		memcpy(y2, y0, (size_t)n * sizeof(float));
		vec_f32_axpy_ref(n, 0.37f, a, y1);
		vec_f32_axpy(n, 0.37f, a, y2);
		for (int64_t i = 0; i < n; i++)
			ck_assert_msg(fabsf(y2[i] - y1[i]) <= 2e-7f * (fabsf(y0[i]) + fabsf(0.37f * a[i])) + 1e-30f,
				      "axpy n=%ld [%ld]: %.9g vs ref %.9g", (long)n, (long)i, y2[i], y1[i]);
#if defined(CPU_KERNELS_NEON)
		if (simd_available())
			ck_assert_mem_eq(y2, y1, (size_t)n * sizeof(float));
#endif
		cpu_features_disable_simd(true);
		float s = vec_f32_dot(n, a, b);
		memcpy(y2, y0, (size_t)n * sizeof(float));
		vec_f32_axpy(n, 0.37f, a, y2);
		cpu_features_disable_simd(false);
		ck_assert_mem_eq(&s, &r, sizeof(float));
		ck_assert_mem_eq(y2, y1, (size_t)n * sizeof(float));
		free(a);
		free(b);
		free(y0);
		free(y1);
		free(y2);
	}
	fprintf(stderr, "vec_f32_dot %s vs ref: max |diff| / sum|terms| %.3g\n", simd_set(0) ? simd_set(0) : "scalar",
		max_rel);
}
END_TEST

/* TURBOKV_NO_SIMD=1 turns the fast paths off from the first query on;
 * needs a fresh process, so only under Check's default fork mode. */
START_TEST(test_no_simd_env)
{
	const char *fork_mode = getenv("CK_FORK");
	if (fork_mode && strcmp(fork_mode, "no") == 0)
		return;
	setenv("TURBOKV_NO_SIMD", "1", 1);
	const CpuFeatures *f = cpu_features();
	ck_assert(!f->avx2 && !f->fma && !f->f16c && !f->neon && !f->dotprod);
	cpu_features_disable_simd(false);
	unsetenv("TURBOKV_NO_SIMD");
}
END_TEST

/* TURBOKV_NO_DOTPROD=1 leaves the dot-product extension out and keeps
 * NEON (and x86's features as they are); fork mode only, as above. */
START_TEST(test_no_dotprod_env)
{
	const char *fork_mode = getenv("CK_FORK");
	if (fork_mode && strcmp(fork_mode, "no") == 0)
		return;
	setenv("TURBOKV_NO_DOTPROD", "1", 1);
	const CpuFeatures *f = cpu_features();
	ck_assert(!f->dotprod);
#if defined(CPU_KERNELS_NEON)
	ck_assert(f->neon);
	ck_assert_ptr_null(simd_set(1));
	cpu_features_disable_dotprod(false);
	/* where the CPU has SDOT (qemu's default CPU does), it comes back */
	fprintf(stderr, "cpu: neon %d, dotprod %d (HWCAP_ASIMDDP)\n", cpu_features()->neon, cpu_features()->dotprod);
#endif
	cpu_features_disable_dotprod(false);
	unsetenv("TURBOKV_NO_DOTPROD");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("matmul");
	TCase *tq = tcase_create("quant_act");
	TCase *tv = tcase_create("vec_dot");
	TCase *tm = tcase_create("matmul");

	tcase_add_test(tq, test_quant_q8_0_hand);
	tcase_add_test(tq, test_quant_q8_K_hand);
	tcase_add_test(tq, test_quant_zero_block);
	tcase_add_test(tq, test_quant_simd_identical);
	tcase_add_test(tq, test_act_types);
	tcase_add_test(tq, test_no_simd_env);
	tcase_add_test(tq, test_no_dotprod_env);
	tcase_add_loop_test(tv, test_vec_dot, 0, N_TYPES);
	tcase_add_loop_test(tv, test_vec_dot_multi, 0, N_TYPES);
	tcase_add_test(tv, test_vec_dot_multi_avx512);
	tcase_add_test(tv, test_vec_dot_q6k_multi_equals_dot);
	tcase_add_test(tv, test_vec_f32);
	tcase_set_timeout(tm, 120);
	tcase_add_loop_test(tm, test_matmul_threads, 0, N_TYPES);
	tcase_add_test(tm, test_matmul_group);
	tcase_add_test(tm, test_matmul_rejects);
	tcase_add_test(tm, test_repack_q4_K);
	tcase_add_loop_test(tm, test_repack_q32, 0, 4);
	suite_add_tcase(s, tq);
	suite_add_tcase(s, tv);
	suite_add_tcase(s, tm);
	return test_run_suite(s);
}
