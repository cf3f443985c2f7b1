/*
 * kv_cuda_emul.c: a host emulation of the device side of kernels/cuda/
 * kv_cuda.h, for tests only: the device primitives (kv_cuda.cu) and the
 * append and attention launches (kv_cuda_internal.h). The host side, the
 * real kv_cuda_layer.c, is linked with it, and so are kv_cuda_cache.c and
 * kv_cuda_host.c, so that code and tests/gpu/test-gpu-kvcache.c run on
 * every CI machine without a GPU and without nvcc (tests/unit/meson.build:
 * kvcache-cuda-emulated). It proves nothing about the real kernels
 * (kv_cuda.cu, kv_cuda_append.cu): not their launch arithmetic, warps,
 * shared memory or asynchrony, nor that nvcc's -fmad=false build writes
 * the CPU's bytes. tests/gpu/ on a real GPU is the check for those.
 *
 * What it keeps of the kernels' semantics:
 *   - One device, EMUL_SMS multiprocessors (kv_cuda_layer.c's split rule
 *     reads it).
 *   - Append writes each row with kv_kernel.h's encoders, the bytes the
 *     CPU store writes (this file is C11, which does not contract to FMA).
 *   - Attend is the same three steps on the same scratch: queries
 *     prepared into the stored domain, per split of blocks an online
 *     softmax (per block, as a warp does) into (max, sum, acc) partials,
 *     then the combine and the rotation back, with the splits
 *     kv_cuda_layer.c chose. Scores and values are kv_kernel.h's, so the
 *     output equals the CPU store's to float rounding; summation order
 *     differs from the GPU's.
 *
 * Device memory is devmem_emul.c's, shared with the emulated CUDA
 * runtime (cuda_runtime_emul.c), as cudaMalloc() and cuda_alloc() share
 * a GPU's: inaccessible to host code outside the emulated calls, and
 * TKV_CUDA_EMUL_MEM_LIMIT=<bytes> caps it so that the -ENOMEM paths can
 * be tested. A pointer handed over as device memory (uploads, downloads,
 * append and attend inputs) must lie inside a live allocation, and one
 * handed over as host memory outside device memory, or the process
 * aborts with a message: a GPU would fault or fail there. Device memory
 * still allocated at exit is reported and the exit status made 1.
 *
 * Everything runs synchronously on the calling thread; cuda_sync() has
 * nothing to wait for. Not thread-safe (the tests are single-threaded).
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "kernels/cuda/kv_cuda_internal.h"
#include "tests/unit/devmem_emul.h"

#define EMUL_SMS 16  /* multiprocessors the emulated device reports */

static_assert(CUDA_KV_MAX_G == 8, "emul_split scores with kvk_tq_score_heads_8");

int cuda_device_count(void)
{
	return 1;
}

int cuda_device_info(char *name, size_t name_size, int *ret_sms, double *ret_peak_gbs)
{
	if (name && name_size)
		snprintf(name, name_size, "host emulation (kv_cuda_emul.c)");
	if (ret_sms)
		*ret_sms = EMUL_SMS;
	if (ret_peak_gbs)
		*ret_peak_gbs = 0.0; /* no device bandwidth to speak of */
	return 0;
}

/* ---- device memory: devmem_emul.c's ---- */

void *cuda_alloc(size_t bytes)
{
	return devmem_alloc(bytes); /* bytes 0: a distinct pointer, as kv_cuda.cu */
}

void cuda_free(void *p)
{
	devmem_free(p, "cuda_free");
}

int cuda_upload(void *dst, const void *src, size_t bytes)
{
	devmem_check(dst, bytes, "cuda_upload");
	devmem_check_host(src, bytes, "cuda_upload source");
	devmem_open();
	if (bytes)
		memcpy(dst, src, bytes);
	devmem_close();
	return 0;
}

int cuda_download(void *dst, const void *src, size_t bytes)
{
	devmem_check(src, bytes, "cuda_download");
	devmem_check_host(dst, bytes, "cuda_download destination");
	devmem_open();
	if (bytes)
		memcpy(dst, src, bytes);
	devmem_close();
	return 0;
}

int cuda_zero(void *dst, size_t bytes)
{
	devmem_check(dst, bytes, "cuda_zero");
	devmem_open();
	memset(dst, 0, bytes);
	devmem_close();
	return 0;
}

int cuda_copy(void *dst, const void *src, size_t bytes)
{
	devmem_check(dst, bytes, "cuda_copy destination");
	devmem_check(src, bytes, "cuda_copy source");
	devmem_open();
	memmove(dst, src, bytes);
	devmem_close();
	return 0;
}

int cuda_sync(char *msg, size_t msg_size)
{
	return 0;
}

/* fill_random_kernel's splitmix64 and Box-Muller, one value at a time. */
int cuda_fill_random(float *dst, size_t n, uint64_t seed, float sigma)
{
	devmem_check(dst, n * sizeof(float), "cuda_fill_random");
	devmem_open();
	for (size_t i = 0; i < n; i++) {
		uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
		uint64_t r[2];
		for (int k = 0; k < 2; k++) {
			z += 0x9e3779b97f4a7c15ull;
			uint64_t x = z;
			x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
			x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
			r[k] = x ^ (x >> 31);
		}
		float u1 = ((float)(r[0] >> 40) + 1.0f) * (1.0f / 16777216.0f);
		float u2 = (float)(r[1] >> 40) * (1.0f / 16777216.0f);
		dst[i] = sigma * sqrtf(-2.0f * logf(u1)) * (float)cos(M_PI * 2.0 * u2);
	}
	devmem_close();
	return 0;
}

/* ---- append: kvc_append_kernel, one (token, kv-head, K or V) at a time ---- */

int kvc_launch_append(const KvcParams *p, int seq, int64_t pos0, int64_t n_tok, const float *k,
		      const float *v)
{
	int64_t n = n_tok * p->n_kv_heads * 2;
	if (n <= 0)
		return 0;
	size_t in_bytes = (size_t)n_tok * p->n_kv_heads * p->dim * sizeof(float);
	devmem_check(k, in_bytes, "cuda_kv_append keys");
	devmem_check(v, in_bytes, "cuda_kv_append values");
	devmem_open();
	for (int64_t idx = 0; idx < n; idx++) {
		int role = (int)(idx & 1); /* 0 keys, 1 values */
		int head = (int)(idx / 2 % p->n_kv_heads);
		int64_t t = idx / 2 / p->n_kv_heads;
		int64_t pos = pos0 + t;
		const float *x = (role ? v : k) + (t * p->n_kv_heads + head) * p->dim;
		uint8_t *block = p->base + (((int64_t)seq * p->n_kv_heads + head) * p->capacity_blocks +
					    pos / KV_BLOCK_TOKENS) * p->block_bytes;
		int j = (int)(pos % KV_BLOCK_TOKENS);
		uint8_t *row = role ? block + KV_BLOCK_TOKENS * p->kb + (size_t)j * p->vb
				    : block + (size_t)j * p->kb;
		int fmt = role ? p->vfmt : p->kfmt;
		if (fmt == KV_FORMAT_TQ)
			kvk_tq_encode(&(role ? p->vc : p->kc)[head], x, row);
		else
			kvk_plain_store(fmt, role ? p->vhad : p->khad, p->dim, x, row);
	}
	devmem_close();
	return 0;
}

/* ---- attention: kv_cuda.cu's prepare, split and combine, one work item at a time ---- */

/* Positions of one attend call: row (s, t) attends to 0 .. pos0[s] + t. */
typedef struct EmulRows {
	const int64_t *pos0;
	int64_t n_tok;
} EmulRows;

static int64_t row_ctx(const EmulRows *r, int64_t row)
{
	return r->pos0[row / r->n_tok] + row % r->n_tok + 1;
}

/* 1. qp (rows, n_heads, dim), sq (rows, n_heads, qjl_m): queries in the keys' stored domain / sqrt(dim). */
static void emul_prepare(const KvcParams *p, int64_t n_rows, const float *q, float *qp, float *sq)
{
	const float scale = 1.0f / sqrtf((float)p->dim);
	for (int64_t idx = 0; idx < n_rows * p->n_heads; idx++) {
		int head = (int)(idx % p->n_heads);
		const float *qi = q + idx * p->dim;
		float *qo = qp + idx * p->dim;
		float *so = sq + idx * (p->qjl_m ? p->qjl_m : 1);
		if (p->kfmt == KV_FORMAT_TQ) {
			kvk_tq_query_prepare(&p->kc[head / p->group], qi, qo, so);
			for (int i = 0; i < p->qjl_m; i++)
				so[i] *= scale;
		} else {
			memcpy(qo, qi, (size_t)p->dim * sizeof(float));
			if (p->khad)
				kvk_hadamard(qo, p->dim);
		}
		for (int i = 0; i < p->dim; i++)
			qo[i] *= scale;
	}
}

static float value_at(const KvcParams *p, const KvkCodec *vc, const uint8_t *row, int i)
{
	return p->vfmt == KV_FORMAT_TQ ? kvk_tq_value(vc, row, i) : kvk_plain_value(p->vfmt, row, i);
}

/*
 * 2. One (split, kv-head, row): an online softmax over the split's
 * blocks, rescaled once per block as a warp does, into the partials of
 * the G query heads: part (rows, n_heads, n_splits, dim + 2) = (max, sum, acc).
 */
static void emul_split(const KvcParams *p, const EmulRows *rows, int bps, int n_splits, int split,
		       int kvh, int64_t row, const float *qp, const float *sq, float *part)
{
	const int G = p->group, dim = p->dim, m = p->qjl_m, stride = dim + 2;
	const KvkCodec *kc = &p->kc[kvh], *vc = &p->vc[kvh];
	const float *qs = qp + (row * p->n_heads + kvh * G) * dim;        /* (G, dim) */
	const float *sqs = sq + (row * p->n_heads + kvh * G) * (m ? m : 1); /* (G, m) */
	const float *cbh = NULL, *cbl = NULL;
	if (p->kfmt == KV_FORMAT_TQ) {
		cbh = kc->cb_hi >= 0 ? kvk_floats(kc, kc->cb_hi) : NULL;
		cbl = kc->cb_lo >= 0 ? kvk_floats(kc, kc->cb_lo) : NULL;
	}

	const int64_t ctx = row_ctx(rows, row);
	/* kv_cuda.cu's row_lo(): a windowed layer's row sees ctx - W .. */
	const int64_t lo = p->window > 0 && ctx > p->window ? ctx - p->window : 0;
	const int64_t n_blk = (ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	const int64_t b0 = MAX((int64_t)split * bps, lo / KV_BLOCK_TOKENS), b1 = MIN((int64_t)split * bps + bps, n_blk);
	const int seq = (int)(row / rows->n_tok);
	const uint8_t *head_base =
		p->base + ((int64_t)seq * p->n_kv_heads + kvh) * p->capacity_blocks * p->block_bytes;

	float mx[CUDA_KV_MAX_G], l[CUDA_KV_MAX_G], acc[CUDA_KV_MAX_G][KVK_MAX_DIM];
	for (int g = 0; g < G; g++) {
		mx[g] = -INFINITY;
		l[g] = 0.0f;
		memset(acc[g], 0, (size_t)dim * sizeof(float));
	}
	for (int64_t b = b0; b < b1; b++) {
		const uint8_t *blk = head_base + b * p->block_bytes;
		const int n_valid = (int)MIN((int64_t)KV_BLOCK_TOKENS, ctx - b * KV_BLOCK_TOKENS);
		const int j0 = (int)MAX((int64_t)0, lo - b * KV_BLOCK_TOKENS); /* rows below: outside */
		float s[KV_BLOCK_TOKENS][CUDA_KV_MAX_G];
		for (int j = j0; j < n_valid; j++) {
			const uint8_t *key = blk + (size_t)j * p->kb;
			if (p->kfmt == KV_FORMAT_TQ)
				kvk_tq_score_heads_8(kc, cbh, cbl, qs, sqs, G, key, s[j]);
			else
				for (int g = 0; g < G; g++)
					s[j][g] = kvk_plain_score(p->kfmt, dim, qs + g * dim, key);
		}
		const uint8_t *vrows = blk + KV_BLOCK_TOKENS * (size_t)p->kb;
		for (int g = 0; g < G; g++) {
			float bm = -INFINITY, sum = 0.0f;
			for (int j = j0; j < n_valid; j++)
				bm = fmaxf(bm, s[j][g]);
			float nm = fmaxf(mx[g], bm);
			for (int j = j0; j < n_valid; j++) {
				s[j][g] = expf(s[j][g] - nm);
				sum += s[j][g];
			}
			float corr = mx[g] == -INFINITY ? 0.0f : expf(mx[g] - nm);
			l[g] = l[g] * corr + sum;
			mx[g] = nm;
			for (int i = 0; i < dim; i++)
				acc[g][i] *= corr;
			for (int j = j0; j < n_valid; j++) {
				const uint8_t *vr = vrows + (size_t)j * p->vb;
				for (int i = 0; i < dim; i++)
					acc[g][i] += s[j][g] * value_at(p, vc, vr, i);
			}
		}
	}
	for (int g = 0; g < G; g++) {
		float *dst = part + ((row * p->n_heads + kvh * G + g) * n_splits + split) * stride;
		dst[0] = mx[g];
		dst[1] = l[g];
		memcpy(dst + 2, acc[g], (size_t)dim * sizeof(float));
	}
}

/* 3. One (row, head): the splits merged, normalised and rotated back into out. */
static void emul_combine(const KvcParams *p, const EmulRows *rows, int bps, int n_splits,
			 int64_t rh, const float *part, float *out)
{
	const int head = (int)(rh % p->n_heads), dim = p->dim, stride = dim + 2;
	const int64_t row = rh / p->n_heads;
	const int64_t n_blk = (row_ctx(rows, row) + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	const int used = (int)MIN((int64_t)n_splits, (n_blk + bps - 1) / bps);
	const float *src = part + rh * n_splits * stride;
	float a[KVK_MAX_DIM];

	float M = -INFINITY;
	for (int s = 0; s < used; s++)
		M = fmaxf(M, src[s * stride]);
	for (int i = 0; i < dim; i++) {
		float L = 0.0f, A = 0.0f;
		for (int s = 0; s < used; s++) {
			const float *ps = src + s * stride;
			if (ps[0] == -INFINITY)
				continue;
			float e = expf(ps[0] - M);
			L += ps[1] * e;
			A += ps[2 + i] * e;
		}
		a[i] = L > 0.0f ? A / L : 0.0f;
	}
	float *o = out + rh * dim;
	if (p->vfmt == KV_FORMAT_TQ) {
		kvk_tq_output_finish(&p->vc[head / p->group], a, o);
	} else {
		memcpy(o, a, (size_t)dim * sizeof(float));
		if (p->vhad)
			kvk_hadamard(o, dim);
	}
}

int kvc_launch_attend(const KvcParams *p, const KvcAttend *a)
{
	const int64_t n_rows = (int64_t)a->n_seqs * a->n_tok;
	const size_t io_bytes = (size_t)n_rows * p->n_heads * p->dim * sizeof(float);
	devmem_check(a->q, io_bytes, "cuda_kv_attend queries");
	devmem_check(a->out, io_bytes, "cuda_kv_attend output");
	devmem_check_host(a->pos0, a->n_seqs * sizeof(int64_t), "cuda_kv_attend positions");

	EmulRows rows = { .pos0 = a->pos0, .n_tok = a->n_tok };
	const int bps = a->blocks_per_split, n_splits = a->n_splits;
	devmem_open();
	emul_prepare(p, n_rows, a->q, a->qp, a->sq);
	for (int64_t row = 0; row < n_rows; row++)
		for (int kvh = 0; kvh < p->n_kv_heads; kvh++)
			for (int split = 0; split < n_splits; split++)
				emul_split(p, &rows, bps, n_splits, split, kvh, row, a->qp, a->sq,
					   a->part);
	for (int64_t rh = 0; rh < n_rows * p->n_heads; rh++)
		emul_combine(p, &rows, bps, n_splits, rh, a->part, a->out);
	devmem_close();
	return 0;
}
