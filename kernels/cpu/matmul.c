/*
 * matmul.c: Y (n_tok, rows) = X (n_tok, cols) @ W^T over the thread pool.
 *
 * One call quantizes all of X once into W's activation format (split
 * across threads when there is enough of it), then hands out chunks of
 * W rows to the threads through an atomic counter, so a preempted thread
 * (2 cores shared by everything) does not hold the others up. Within a
 * chunk, prefill walks tiles of MATMUL_TILE_ROWS rows (a few KiB of
 * weights, kept in L1) over all tokens, VEC_DOT_MAX_NY tokens per kernel
 * call where the type has a multi-row kernel.
 *
 * Weights the CPU backend repacked (layout X4, repack.h; which ones:
 * matmul_repack_wanted()) go through tile kernels instead: 4 rows (8 with
 * AVX-512 VNNI) x up to 16 tokens per call, the rows' blocks read as one
 * stream, decode (one token) included.
 *
 * Owns the choice of kernel (AVX-512, AVX2, NEON or reference, per call, from
 * cpu_features()); the kernels themselves live in vec_dot_*.c,
 * repack*.c and quant_act*.c.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant_act.h"
#include "kernels/cpu/repack.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/wtype.h"

#define MATMUL_TILE_ROWS 16
/* Chunks handed out per thread: enough to even out stragglers, few
 * enough that each is a long sequential weight stream. */
#define MATMUL_CHUNKS_PER_THREAD 4
/* Quantized activations up to this size live on the stack. */
#define MATMUL_STACK_SCRATCH 8192

typedef struct MatmulKernels {
	int act_type;       /* WTYPE_Q8_0 / Q8_1 / Q8_K / F32 */
	bool simd;
	VecDotFn dot;
	VecDotMultiFn multi; /* NULL: loop over dot */
	bool multi_batch_only; /* decode (one token) through dot: the AVX-512 Q6_K multi */
	RepackTileFn tile;   /* layout X4: the only kernel (dot and multi NULL) */
	RepackTileFn tile8;  /* layout X4, two groups per call where there is one */
} MatmulKernels;

/* One weight of a group and where its chunks sit in the shared count. */
typedef struct MatmulPart {
	const MatmulWeight *w;
	MatmulKernels k;
	float *y;            /* (n_tok, w->rows) */
	long first_chunk;
	long n_chunks;
} MatmulPart;

typedef struct MatmulCtx {
	MatmulPart parts[MATMUL_GROUP_MAX];
	int n_parts;
	int act_type;
	bool simd;
	int64_t cols;
	const float *x;      /* (n_tok, cols) */
	void *act;           /* n_tok rows of act_stride bytes (quantized x, or x) */
	size_t act_stride;
	float *af;           /* (n_tok, af_stride): block scales for multi kernels */
	size_t af_stride;
	int64_t n_tok;
	long chunk_rows;
	long n_chunks;       /* over all parts */
	atomic_long next_chunk;
} MatmulCtx;

/* Whether this build's SIMD kernel set may run here. */
static bool simd_usable(void)
{
	const CpuFeatures *f = cpu_features();
#if defined(CPU_KERNELS_X86)
	return f->avx2 && f->fma && f->f16c;
#elif defined(CPU_KERNELS_NEON)
	return f->neon;
#else
	(void)f;
	return false;
#endif
}

/* The SIMD kernels for weight type t (simd_usable() true); NULL where none. */
static void simd_kernels_get(uint32_t t, MatmulKernels *k)
{
#if defined(CPU_KERNELS_X86)
	const CpuFeatures *f = cpu_features();
	k->dot = vec_dot_avx2_get(t);
	/* the AVX-512 multi kernels pay their per-block setup back over
	 * several tokens only: one token (decode) stays on the AVX2 dot */
	k->multi = f->avx512 && f->avx512vnni ? vec_dot_avx512vnni_multi_get(t) : NULL;
	k->multi_batch_only = k->multi != NULL;
	if (!k->multi)
		k->multi = vec_dot_avx2_multi_get(t);
#elif defined(CPU_KERNELS_NEON)
	k->dot = vec_dot_neon_get(t, cpu_features()->dotprod);
#else
	(void)t;
	(void)k;
#endif
}

/* Two groups per call: AVX-512 VNNI only; NULL where none. */
static RepackTileFn simd_tile8_get(uint32_t t)
{
#if defined(CPU_KERNELS_X86)
	const CpuFeatures *f = cpu_features();
	return f->avx512 && f->avx512vnni ? repack_tile8_avx512_get(t) : NULL;
#else
	(void)t;
	return NULL;
#endif
}

static RepackTileFn simd_tile_get(uint32_t t)
{
#if defined(CPU_KERNELS_X86)
	const CpuFeatures *f = cpu_features();
	RepackTileFn fn = f->avx512 && f->avx512vnni ? repack_tile_avx512_get(t) : NULL;
	if (!fn)
		fn = repack_tile_avx2_get(t);
	return fn ? fn : repack_tile_q32_avx2_get(t);
#elif defined(CPU_KERNELS_NEON)
	return repack_tile_neon_get(t, cpu_features()->dotprod);
#else
	(void)t;
	return NULL;
#endif
}

bool matmul_repack_wanted(const MatmulWeight *w)
{
	if (!repack_supported(w))
		return false;
	return w->type == WTYPE_Q4_K || (simd_usable() && simd_tile_get(w->type) != NULL);
}

/* Returns 0 or -EINVAL if w's type or shape has no kernel. */
static int kernels_pick(const MatmulWeight *w, bool allow_simd, MatmulKernels *ret)
{
	const WTypeInfo *info = wtype_info(w->type);
	int act = quant_act_type_for(w->type);

	if (!info || act < 0 || w->cols <= 0 || w->rows < 0 || w->cols % info->block_elems != 0 ||
	    w->cols > INT32_MAX)
		return -EINVAL;
	if (act != WTYPE_F32 && w->cols % wtype_info((uint32_t)act)->block_elems != 0)
		return -EINVAL;
	if (w->row_stride < wtype_row_bytes(w->type, (uint64_t)w->cols))
		return -EINVAL;

	*ret = (MatmulKernels){ .act_type = act, .simd = allow_simd && simd_usable() };
	if (w->layout == MATMUL_LAYOUT_X4) {
		if (w->rows % REPACK_GROUP != 0)
			return -EINVAL;
		ret->tile = ret->simd ? simd_tile_get(w->type) : NULL;
		ret->tile8 = ret->simd ? simd_tile8_get(w->type) : NULL;
		if (!ret->tile)
			ret->tile = repack_tile_ref_get(w->type);
		return ret->tile ? 0 : -EINVAL;
	}
	if (w->layout != MATMUL_LAYOUT_ROWS)
		return -EINVAL;
	if (ret->simd)
		simd_kernels_get(w->type, ret);
	if (!ret->dot)
		ret->dot = vec_dot_ref_get(w->type);
	return 0;
}

static inline const void *weight_row(const MatmulWeight *w, int64_t r)
{
	return (const char *)w->data + (size_t)r * w->row_stride;
}

/* Rows [r0, r1) (multiples of 4) of a repacked W against all tokens:
 * MATMUL_TILE_ROWS rows stay in cache while every token goes past. */
static void matmul_rows_tiled(const MatmulCtx *c, const MatmulPart *p, int64_t r0, int64_t r1)
{
	const MatmulWeight *w = p->w;
	const char *act = c->act;
	int64_t rows = w->rows;
	size_t group_bytes = REPACK_GROUP * w->row_stride;

	for (int64_t t0 = r0; t0 < r1; t0 += MATMUL_TILE_ROWS) {
		int64_t t1 = MIN(t0 + MATMUL_TILE_ROWS, r1);
		for (int64_t tok = 0; tok < c->n_tok; tok += REPACK_MAX_NT) {
			int nt = (int)MIN((int64_t)REPACK_MAX_NT, c->n_tok - tok);
			for (int64_t r = t0; r < t1;) {
				bool two = p->k.tile8 && r + 2 * REPACK_GROUP <= t1;
				(two ? p->k.tile8 : p->k.tile)(w->cols,
							       (const char *)w->data + (size_t)(r / REPACK_GROUP) * group_bytes,
							       act + (size_t)tok * c->act_stride, c->act_stride, nt,
							       p->y + tok * rows + r, (size_t)rows);
				r += two ? 2 * REPACK_GROUP : REPACK_GROUP;
			}
		}
	}
}

/* Rows [r0, r1) of one part's W against all tokens. */
static void matmul_rows(const MatmulCtx *c, const MatmulPart *p, int64_t r0, int64_t r1)
{
	const MatmulWeight *w = p->w;
	const char *act = c->act;
	int64_t rows = w->rows, n = w->cols;

	if (p->k.tile) {
		matmul_rows_tiled(c, p, r0, r1);
		return;
	}

	if (c->n_tok == 1) {
		if (p->k.multi && !p->k.multi_batch_only)
			for (int64_t r = r0; r < r1; r++)
				p->k.multi(n, &p->y[r], 1, weight_row(w, r), act, c->act_stride, c->af, 0, 1);
		else
			for (int64_t r = r0; r < r1; r++)
				p->k.dot(n, &p->y[r], weight_row(w, r), act);
		return;
	}

	for (int64_t t0 = r0; t0 < r1; t0 += MATMUL_TILE_ROWS) {
		int64_t t1 = MIN(t0 + MATMUL_TILE_ROWS, r1);
		for (int64_t tok = 0; tok < c->n_tok; tok += VEC_DOT_MAX_NY) {
			int ny = (int)MIN((int64_t)VEC_DOT_MAX_NY, c->n_tok - tok);
			const char *a = act + (size_t)tok * c->act_stride;
			float *y = p->y + tok * rows;
			for (int64_t r = t0; r < t1; r++) {
				if (p->k.multi) {
					p->k.multi(n, y + r, (size_t)rows, weight_row(w, r), a, c->act_stride,
						   c->af ? c->af + (size_t)tok * c->af_stride : NULL, c->af_stride, ny);
					continue;
				}
				for (int j = 0; j < ny; j++)
					p->k.dot(n, y + j * rows + r, weight_row(w, r), a + (size_t)j * c->act_stride);
			}
		}
	}
}

static void matmul_task(void *ctx, int ith, int nth)
{
	MatmulCtx *c = ctx;
	long chunk;

	(void)ith;
	(void)nth;
	while ((chunk = atomic_fetch_add_explicit(&c->next_chunk, 1, memory_order_relaxed)) < c->n_chunks) {
		const MatmulPart *p = &c->parts[0];
		while (chunk >= p->first_chunk + p->n_chunks)
			p++;
		int64_t r0 = (int64_t)(chunk - p->first_chunk) * c->chunk_rows;
		matmul_rows(c, p, r0, MIN(r0 + c->chunk_rows, p->w->rows));
	}
}

static void quant_task(void *ctx, int ith, int nth)
{
	MatmulCtx *c = ctx;
	long t0, t1;

	threadpool_split((long)c->n_tok, ith, nth, &t0, &t1);
	for (long t = t0; t < t1; t++) {
		void *row = (char *)c->act + (size_t)t * c->act_stride;
		quant_act_row((uint32_t)c->act_type, c->x + t * c->cols, row, c->cols, c->simd);
		if (c->af)
			quant_act_scales((uint32_t)c->act_type, row, c->af + (size_t)t * c->af_stride, c->cols);
	}
}

/* Rows per chunk: about MATMUL_CHUNKS_PER_THREAD chunks per thread over
 * the whole group, whole tiles when tiling; no chunk spans two parts. */
static void chunks_plan(MatmulCtx *c, int nth)
{
	int64_t rows = 0;
	for (int i = 0; i < c->n_parts; i++)
		rows += c->parts[i].w->rows;
	int64_t want = (int64_t)nth * (nth > 1 ? MATMUL_CHUNKS_PER_THREAD : 1);
	int64_t per = (rows + want - 1) / want;
	int64_t unit = c->n_tok > 1 ? MATMUL_TILE_ROWS : 4;

	per = (per + unit - 1) / unit * unit;
	if (per < unit)
		per = unit;
	c->chunk_rows = (long)per;
	c->n_chunks = 0;
	for (int i = 0; i < c->n_parts; i++) {
		c->parts[i].first_chunk = c->n_chunks;
		c->parts[i].n_chunks = (long)((c->parts[i].w->rows + per - 1) / per);
		c->n_chunks += c->parts[i].n_chunks;
	}
	atomic_init(&c->next_chunk, 0);
}

/* Returns 0, -EINVAL (a type or shape without a kernel, or a group whose
 * members differ in cols or activation format) or -ENOMEM. */
int matmul_group(ThreadPool *tp, const MatmulWeight *const *ws, float *const *ys, int n_w, const float *x,
		 int64_t n_tok)
{
	_Alignas(64) char stack_scratch[MATMUL_STACK_SCRATCH];
	_cleanup_(freep) void *heap = NULL;
	MatmulCtx c = { .x = x, .n_tok = n_tok, .n_parts = n_w };
	bool any_multi = false;
	int nth = threadpool_n_threads(tp);
	int r;

	if (n_w < 1 || n_w > MATMUL_GROUP_MAX)
		return -EINVAL;
	for (int i = 0; i < n_w; i++) {
		MatmulPart *p = &c.parts[i];
		r = kernels_pick(ws[i], true, &p->k);
		if (r < 0)
			return r;
		if (i > 0 && (ws[i]->cols != ws[0]->cols || p->k.act_type != c.parts[0].k.act_type))
			return -EINVAL;
		p->w = ws[i];
		p->y = ys[i];
		/* Q8_K rows carry float scales: no af for their multi kernels */
		any_multi |= p->k.multi != NULL && p->k.act_type != WTYPE_Q8_K;
	}
	c.act_type = c.parts[0].k.act_type;
	c.simd = c.parts[0].k.simd;
	c.cols = ws[0]->cols;
	if (n_tok <= 0)
		return 0;

	if (c.act_type == WTYPE_F32) {
		c.act = (void *)x;
		c.act_stride = (size_t)c.cols * sizeof(float);
	} else {
		/* Scratch: n_tok quantized rows, then (multi kernels) their
		 * float block scales, 32-byte aligned. */
		size_t q_bytes, f_bytes = 0, total;
		c.act_stride = wtype_row_bytes((uint32_t)c.act_type, (uint64_t)c.cols);
		if (size_mul_overflows(c.act_stride, (size_t)n_tok, &q_bytes))
			return -ENOMEM;
		q_bytes = (q_bytes + 31) & ~(size_t)31;
		if (any_multi) {
			c.af_stride = (size_t)c.cols / 16;
			if (size_mul_overflows(c.af_stride * sizeof(float), (size_t)n_tok, &f_bytes))
				return -ENOMEM;
		}
		if (size_add_overflows(q_bytes, f_bytes, &total) || total > SIZE_MAX - 64)
			return -ENOMEM;
		if (total <= sizeof(stack_scratch)) {
			c.act = stack_scratch;
		} else {
			heap = aligned_alloc(64, (total + 63) & ~(size_t)63);
			if (!heap)
				return -ENOMEM;
			c.act = heap;
		}
		if (any_multi)
			c.af = (float *)((char *)c.act + q_bytes);
		/* Decode-sized inputs are cheaper to quantize than to dispatch. */
		if (nth > 1 && n_tok >= 4 * nth)
			threadpool_run(tp, quant_task, &c);
		else
			quant_task(&c, 0, 1);
	}

	chunks_plan(&c, nth);
	if (c.n_chunks > 0)
		threadpool_run(tp, matmul_task, &c);
	return 0;
}

/* Returns 0, -EINVAL (type or shape without a kernel) or -ENOMEM. */
int matmul(ThreadPool *tp, const MatmulWeight *w, const float *x, float *y, int64_t n_tok)
{
	return matmul_group(tp, &w, &y, 1, x, n_tok);
}

int matmul_ref(const MatmulWeight *w, const float *x, float *y, int64_t n_tok)
{
	MatmulKernels k;
	int r = kernels_pick(w, false, &k);
	if (r < 0)
		return r;

	size_t stride = k.act_type == WTYPE_F32 ? (size_t)w->cols * sizeof(float)
						: wtype_row_bytes((uint32_t)k.act_type, (uint64_t)w->cols);
	_cleanup_(freep) void *act = malloc(stride);
	_cleanup_(freep) void *row = malloc(w->row_stride);
	if (!act || !row)
		return -ENOMEM;
	if (!k.dot)
		k.dot = vec_dot_ref_get(w->type); /* a repacked W: its rows gathered back */
	for (int64_t t = 0; t < n_tok; t++) {
		quant_act_row((uint32_t)k.act_type, x + t * w->cols, act, w->cols, false);
		for (int64_t r0 = 0; r0 < w->rows; r0++)
			k.dot(w->cols, &y[t * w->rows + r0], repack_row(w, r0, row), act);
	}
	return 0;
}

/* Returns the dot product, or NAN if w has no kernel or memory ran out. */
float matmul_row_dot(const MatmulWeight *w, int64_t row, const float *x)
{
	MatmulKernels k;
	float s;

	if (kernels_pick(w, true, &k) < 0)
		return __builtin_nanf("");
	size_t stride = k.act_type == WTYPE_F32 ? (size_t)w->cols * sizeof(float)
						: wtype_row_bytes((uint32_t)k.act_type, (uint64_t)w->cols);
	_cleanup_(freep) void *act = malloc(stride);
	if (!act)
		return __builtin_nanf("");
	quant_act_row((uint32_t)k.act_type, x, act, w->cols, k.simd);
	if (k.tile) {
		float y4[REPACK_GROUP];
		size_t group_bytes = REPACK_GROUP * w->row_stride;
		k.tile(w->cols, (const char *)w->data + (size_t)(row / REPACK_GROUP) * group_bytes, act, stride, 1,
		       y4, REPACK_GROUP);
		return y4[row % REPACK_GROUP];
	}
	k.dot(w->cols, &s, weight_row(w, row), act);
	return s;
}
