/*
 * backend_cpu.c: the CPU backend, host memory and kernels/cpu.
 *
 * Stateless: weights stay in the GGUF mapping, except those the tiled
 * kernels want repacked (kernels/cpu/repack.h, groups of 4 rows: Q4_K and
 * Q5_0, and Q4_0, Q4_1, Q8_0 with TURBOKV_REPACK_Q32=1, where this CPU has
 * their SIMD tiles: matmul_repack_wanted()), which upload_weight() copies
 * once into the interleaved layout and release_weight() frees; buffers are
 * malloc'd, and every op is a kernels/cpu function.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/kv/kvstore.h"
#include "kernels/cpu/repack.h"
#include "kernels/wtype.h"

static void cpu_free(Backend *b)
{
	(void)b; /* the one static instance */
}

static int cpu_alloc(Backend *b, size_t bytes, void **ret)
{
	void *p = malloc(bytes ? bytes : 1);
	if (!p)
		return -ENOMEM;
	*ret = p;
	return 0;
}

static void cpu_dealloc(Backend *b, void *p)
{
	free(p);
}

static int cpu_copy(Backend *b, void *dst, const void *src, size_t bytes)
{
	memcpy(dst, src, bytes);
	return 0;
}

static bool env_on(const char *name)
{
	const char *e = getenv(name);
	return e && *e && strcmp(e, "0") != 0;
}

/*
 * Repack what has a tile kernel; the rest is read in place from the mapping.
 * TURBOKV_NO_REPACK=1 keeps every weight row-major (before/after checks).
 * Q4_0, Q4_1 and Q8_0 only with TURBOKV_REPACK_Q32=1 for now: their tiles
 * pass their tests, but on the default model the repacked path moves the
 * tq4-vs-f32 check of test-kvstore (model_tq4_tracks_f32) past its bounds
 * and the golden exact-math max past 1.2 (docs/benchmarks.md, issue 20,
 * 2026-12-03), which is not explained yet. Q5_0 (Gemma 3's Q4_K_M files)
 * is on: the default model has none, and Gemma's checks pass with it.
 */
static bool repack_by_default(uint32_t t)
{
	return t == WTYPE_Q4_K || t == WTYPE_Q5_0;
}

static int cpu_upload_weight(Backend *b, MatmulWeight *w)
{
	MatmulWeight packed;
	if (!matmul_repack_wanted(w) || env_on("TURBOKV_NO_REPACK"))
		return 0;
	if (!repack_by_default(w->type) && !env_on("TURBOKV_REPACK_Q32"))
		return 0;
	int r = repack_weight(w, &packed);
	if (r < 0)
		return r;
	*w = packed;
	return 0;
}

static void cpu_release_weight(Backend *b, MatmulWeight *w)
{
	if (w->layout != MATMUL_LAYOUT_ROWS)
		free((void *)w->data);
	w->data = NULL;
}

static int cpu_upload_vector(Backend *b, const float **v, int64_t n)
{
	return 0;
}

static int cpu_embed(Backend *b, const MatmulWeight *emb, const int32_t *tokens, int64_t n, float *x)
{
	_cleanup_(freep) void *row = emb->layout == MATMUL_LAYOUT_ROWS ? NULL : malloc(emb->row_stride);
	if (emb->layout != MATMUL_LAYOUT_ROWS && !row)
		return -ENOMEM;
	for (int64_t i = 0; i < n; i++)
		wtype_dequantize_row(emb->type, repack_row(emb, tokens[i], row), x + i * emb->cols, emb->cols);
	return 0;
}

static int cpu_rmsnorm(Backend *b, float *y, const float *x, const float *w, int64_t n, int64_t dim,
		       float eps)
{
	for (int64_t i = 0; i < n; i++)
		op_rmsnorm(y + i * dim, x + i * dim, w, dim, eps);
	return 0;
}

/*
 * Products sharing one input in one dispatch; weights whose activation
 * formats differ (mixed-type files such as Q4_K_M) are rejected by
 * matmul_group with -EINVAL and run one by one instead.
 */
static int cpu_matmul(Backend *b, ThreadPool *tp, const MatmulWeight *const *ws, float *const *ys, int n_w,
		      const float *x, int64_t n)
{
	if (n_w == 1)
		return matmul(tp, ws[0], x, ys[0], n);
	int e = matmul_group(tp, ws, ys, n_w, x, n);
	if (e != -EINVAL)
		return e;
	for (int i = 0; i < n_w; i++)
		if ((e = matmul(tp, ws[i], x, ys[i], n)))
			return e;
	return 0;
}

static int cpu_add_bias(Backend *b, float *x, const float *bias, int64_t n, int64_t dim)
{
	op_add_bias(x, bias, n, dim);
	return 0;
}

static int cpu_rope_angles(Backend *b, const Rope *rope, const int64_t *pos, int64_t n, float *cs, float *sn)
{
	int half = rope->n_rot / 2;
	for (int64_t i = 0; i < n; i++)
		rope_angles(rope, pos[i], cs + i * half, sn + i * half);
	return 0;
}

static int cpu_rope(Backend *b, const Rope *rope, float *x, int64_t n, int n_heads, int head_dim,
		    const float *cs, const float *sn)
{
	int half = rope->n_rot / 2;
	for (int64_t i = 0; i < n; i++)
		rope_rotate(rope, x + i * n_heads * head_dim, n_heads, head_dim, cs + i * half, sn + i * half);
	return 0;
}

static int cpu_swiglu(Backend *b, float *gate, const float *up, int64_t n)
{
	op_swiglu(gate, up, n);
	return 0;
}

static int cpu_geglu(Backend *b, float *gate, const float *up, int64_t n)
{
	op_geglu(gate, up, n);
	return 0;
}

static int cpu_scale(Backend *b, float *x, float s, int64_t n)
{
	op_scale(x, s, n);
	return 0;
}

static int cpu_add(Backend *b, float *x, const float *y, int64_t n)
{
	op_add(x, y, n);
	return 0;
}

static int cpu_kvcache_new(Backend *b, const KvCacheShape *shape, const KvPlan *plan, uint64_t seed,
			   KvCache **ret, Error *err)
{
	return kvcache_new_host(shape, plan, seed, ret, err);
}

static int cpu_kvcache_adopt(Backend *b, KvCache *host, KvCache **ret, Error *err)
{
	if (host->ops->device)
		return error_set(err, -EINVAL, "a %s cache is not a host cache", kvcache_device(host));
	*ret = host;
	return 0;
}

static const BackendOps cpu_ops = {
	.name = "cpu",
	.free = cpu_free,
	.alloc = cpu_alloc,
	.dealloc = cpu_dealloc,
	.upload = cpu_copy,
	.download = cpu_copy,
	.upload_weight = cpu_upload_weight,
	.release_weight = cpu_release_weight,
	.upload_vector = cpu_upload_vector,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.matmul = cpu_matmul,
	.add_bias = cpu_add_bias,
	.rope_angles = cpu_rope_angles,
	.rope = cpu_rope,
	.swiglu = cpu_swiglu,
	.add = cpu_add,
	.geglu = cpu_geglu,
	.scale = cpu_scale,
	.kvcache_new = cpu_kvcache_new,
	.kvcache_adopt = cpu_kvcache_adopt,
};

static Backend cpu_backend = { .ops = &cpu_ops };

Backend *backend_cpu(void)
{
	return &cpu_backend;
}
