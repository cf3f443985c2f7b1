/*
 * kv_cuda_layer.c: the host side of a CudaKv (kv_cuda.h): argument
 * checks, the block layout, the codecs' upload, the scratch and the
 * split rule of attention. Plain C on kv_cuda_internal.h's device
 * primitives, so that the real library (kv_cuda.cu, kv_cuda_append.cu)
 * and the tests' host emulation (tests/unit/kv_cuda_emul.c) run this
 * very code and differ only in memory and kernels.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/util.h"
#include "kernels/cuda/kv_cuda_internal.h"

static void set_msg(char *msg, size_t size, const char *fmt, ...) _printf_(3, 4);
static void set_msg(char *msg, size_t size, const char *fmt, ...)
{
	if (!msg || !size)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, size, fmt, ap);
	va_end(ap);
}

static uint32_t side_row_bytes(const CudaKvSide *s, int dim)
{
	return s->format == KV_FORMAT_TQ ? s->tq[0].code_bytes : kvk_plain_row_bytes(s->format, dim);
}

static int side_check(const CudaKvSide *s, const CudaKvShape *sh, const char *what, char *msg,
		      size_t msg_size)
{
	if (s->format < KV_FORMAT_F32 || s->format > KV_FORMAT_TQ) {
		set_msg(msg, msg_size, "%s: unknown format %d", what, s->format);
		return -EINVAL;
	}
	if (s->format != KV_FORMAT_TQ) {
		if (s->hadamard && (sh->dim & (sh->dim - 1))) {
			set_msg(msg, msg_size, "%s: +h needs a power-of-two head_dim, not %d", what,
				sh->dim);
			return -EINVAL;
		}
		return 0;
	}
	if (!s->tq) {
		set_msg(msg, msg_size, "%s: TQ side without codecs", what);
		return -EINVAL;
	}
	for (int h = 0; h < sh->n_kv_heads; h++)
		if (s->tq[h].dim != sh->dim || s->tq[h].code_bytes != s->tq[0].code_bytes ||
		    s->tq[h].qjl_m != s->tq[0].qjl_m) {
			set_msg(msg, msg_size, "%s: the codec of kv-head %d does not fit the shape",
				what, h);
			return -EINVAL;
		}
	return 0;
}

CudaKv *cuda_kv_free(CudaKv *kv)
{
	if (kv) {
		cuda_free(kv->p.base);
		cuda_free(kv->d_codecs);
		cuda_free(kv->d_blobs);
		cuda_free(kv->scratch);
		free(kv);
	}
	return NULL;
}

/* The codecs in device memory: (2, n_kv_heads), K then V, blobs packed at 16-byte offsets. */
static int codecs_upload(CudaKv *kv, const CudaKvSide *k, const CudaKvSide *v)
{
	const int nk = kv->shape.n_kv_heads;
	size_t blob_total = 0;
	for (int s = 0; s < 2; s++) {
		const CudaKvSide *side = s ? v : k;
		for (int h = 0; side->format == KV_FORMAT_TQ && h < nk; h++)
			blob_total += (side->tq[h].blob_bytes + 15) & ~(size_t)15;
	}
	_cleanup_(freep) KvkCodec *host = calloc(2 * (size_t)nk, sizeof(KvkCodec));
	if (!host || !(kv->d_codecs = cuda_alloc(2 * nk * sizeof(KvkCodec))) ||
	    !(kv->d_blobs = cuda_alloc(blob_total ? blob_total : 16)))
		return -ENOMEM;
	kv->blob_bytes = blob_total;
	size_t off = 0;
	for (int s = 0; s < 2; s++) {
		const CudaKvSide *side = s ? v : k;
		for (int h = 0; side->format == KV_FORMAT_TQ && h < nk; h++) {
			KvkCodec *c = &host[s * nk + h];
			*c = side->tq[h];
			int r = cuda_upload(kv->d_blobs + off, c->blob, c->blob_bytes);
			if (r < 0)
				return r;
			c->blob = kv->d_blobs + off; /* the device copy from here on */
			off += (c->blob_bytes + 15) & ~(size_t)15;
		}
	}
	int r = cuda_upload(kv->d_codecs, host, 2 * nk * sizeof(KvkCodec));
	if (r < 0)
		return r;
	kv->p.kc = kv->d_codecs;
	kv->p.vc = kv->d_codecs + nk;
	return 0;
}

int cuda_kv_new(const CudaKvShape *sh, const CudaKvSide *k, const CudaKvSide *v, CudaKv **ret,
		char *msg, size_t msg_size)
{
	if (sh->n_seqs < 1 || sh->n_seqs > CUDA_KV_MAX_SEQS || sh->n_kv_heads < 1 ||
	    sh->n_heads < sh->n_kv_heads || sh->n_heads % sh->n_kv_heads ||
	    sh->n_heads / sh->n_kv_heads > CUDA_KV_MAX_G || sh->dim < 32 || sh->dim % 32 ||
	    sh->dim > KVK_MAX_DIM || sh->capacity < 1 || sh->window < 0) {
		set_msg(msg, msg_size,
			"GPU KV cache: unsupported shape (%d heads, %d kv-heads, head_dim %d, %d "
			"sequences, capacity %lld): head_dim must be a multiple of 32 up to %d, at most "
			"%d query heads per kv-head, 1 to %d sequences", sh->n_heads, sh->n_kv_heads,
			sh->dim, sh->n_seqs, (long long)sh->capacity, KVK_MAX_DIM, CUDA_KV_MAX_G,
			CUDA_KV_MAX_SEQS);
		return -EINVAL;
	}
	int r = side_check(k, sh, "keys", msg, msg_size);
	if (r < 0 || (r = side_check(v, sh, "values", msg, msg_size)) < 0)
		return r;
	int n_sms = 0;
	if (cuda_device_info(NULL, 0, &n_sms, NULL) < 0) {
		set_msg(msg, msg_size, "no CUDA device");
		return -ENODEV;
	}

	CudaKv *kv = calloc(1, sizeof(*kv));
	if (!kv)
		return -ENOMEM;
	kv->shape = *sh;
	kv->n_sms = n_sms;
	KvcParams *p = &kv->p;
	p->n_heads = sh->n_heads;
	p->n_kv_heads = sh->n_kv_heads;
	p->dim = sh->dim;
	p->group = sh->n_heads / sh->n_kv_heads;
	p->capacity_blocks = (sh->capacity + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	p->window = sh->window;
	p->kb = side_row_bytes(k, sh->dim);
	p->vb = side_row_bytes(v, sh->dim);
	p->block_bytes = KV_BLOCK_TOKENS * (p->kb + p->vb);
	p->kfmt = k->format;
	p->vfmt = v->format;
	p->khad = k->hadamard;
	p->vhad = v->hadamard;
	p->qjl_m = k->format == KV_FORMAT_TQ && (k->tq[0].flags & KVK_FLAG_QJL) ? k->tq[0].qjl_m : 0;

	/* zeroed: attention never reads past a row's context, session files might */
	size_t bytes = cuda_kv_bytes(kv);
	if (!(p->base = cuda_alloc(bytes)) || cuda_zero(p->base, bytes) < 0) {
		set_msg(msg, msg_size, "GPU KV cache: out of device memory for %zu MiB of blocks",
			bytes >> 20);
		cuda_kv_free(kv);
		return -ENOMEM;
	}
	if ((r = codecs_upload(kv, k, v)) < 0) {
		set_msg(msg, msg_size, "GPU KV cache: %s the codecs",
			r == -ENOMEM ? "out of device memory for" : "could not upload");
		cuda_kv_free(kv);
		return r;
	}
	*ret = kv;
	return 0;
}

uint32_t cuda_kv_row_bytes(const CudaKv *kv, bool values)
{
	return values ? kv->p.vb : kv->p.kb;
}

size_t cuda_kv_block_bytes(const CudaKv *kv)
{
	return kv->p.block_bytes;
}

size_t cuda_kv_bytes(const CudaKv *kv)
{
	return (size_t)kv->shape.n_seqs * kv->shape.n_kv_heads * (size_t)kv->p.capacity_blocks *
	       kv->p.block_bytes;
}

size_t cuda_kv_memory_bytes(const CudaKv *kv)
{
	return cuda_kv_bytes(kv) + 2 * (size_t)kv->shape.n_kv_heads * sizeof(KvkCodec) + kv->blob_bytes +
	       kv->scratch_bytes;
}

void cuda_kv_set_split(CudaKv *kv, int blocks_per_split)
{
	kv->split_blocks = blocks_per_split > 0 ? blocks_per_split : 0;
}

/* The layout: (seq, kv-head, block), each block KV_BLOCK_TOKENS K rows then as many V rows. */
static uint8_t *block_ptr(const CudaKv *kv, int seq, int head, int64_t b)
{
	return kv->p.base + (((int64_t)seq * kv->p.n_kv_heads + head) * kv->p.capacity_blocks + b) *
				    kv->p.block_bytes;
}

static bool blocks_ok(const CudaKv *kv, int seq, int head, int64_t b0, int64_t n, size_t len)
{
	return seq >= 0 && seq < kv->shape.n_seqs && head >= 0 && head < kv->p.n_kv_heads &&
	       b0 >= 0 && n >= 1 && n <= kv->p.capacity_blocks - b0 &&
	       len / kv->p.block_bytes == (size_t)n && len % kv->p.block_bytes == 0;
}

int cuda_kv_blocks_read(const CudaKv *kv, int seq, int head, int64_t b0, int64_t n, void *host,
			size_t len)
{
	if (!blocks_ok(kv, seq, head, b0, n, len))
		return -EINVAL;
	return cuda_download(host, block_ptr(kv, seq, head, b0), len);
}

int cuda_kv_blocks_write(CudaKv *kv, int seq, int head, int64_t b0, int64_t n, const void *host,
			 size_t len)
{
	if (!blocks_ok(kv, seq, head, b0, n, len))
		return -EINVAL;
	return cuda_upload(block_ptr(kv, seq, head, b0), host, len);
}

int cuda_kv_copy_seq(CudaKv *kv, int dst, int src)
{
	if (dst < 0 || src < 0 || dst >= kv->shape.n_seqs || src >= kv->shape.n_seqs)
		return -EINVAL;
	if (dst == src)
		return 0;
	size_t bytes = (size_t)kv->p.n_kv_heads * kv->p.capacity_blocks * kv->p.block_bytes;
	return cuda_copy(block_ptr(kv, dst, 0, 0), block_ptr(kv, src, 0, 0), bytes);
}

int cuda_kv_append(CudaKv *kv, int seq, int64_t pos0, int64_t n_tok, const float *k,
		   const float *v)
{
	if (seq < 0 || seq >= kv->shape.n_seqs || pos0 < 0 || n_tok < 0 ||
	    pos0 + n_tok > kv->shape.capacity)
		return -EINVAL;
	return kvc_launch_append(&kv->p, seq, pos0, n_tok, k, v);
}

int cuda_kv_attend(CudaKv *kv, const int64_t *pos0, int n_seqs, int64_t n_tok, const float *q,
		   float *out)
{
	const KvcParams *p = &kv->p;
	if (n_seqs < 1 || n_seqs > kv->shape.n_seqs || n_tok < 1)
		return -EINVAL;
	int64_t max_ctx = 0;
	for (int s = 0; s < n_seqs; s++) {
		if (pos0[s] < 0 || pos0[s] + n_tok > kv->shape.capacity)
			return -EINVAL;
		max_ctx = MAX(max_ctx, pos0[s] + n_tok);
	}
	const int64_t n_rows = (int64_t)n_seqs * n_tok;
	if (n_rows > CUDA_KV_MAX_ROWS)
		return -EINVAL;
	const int64_t max_blocks = (max_ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;

	/* splits: enough thread blocks to fill the GPU about four times over */
	int bps = kv->split_blocks;
	if (!bps) {
		int64_t items = n_rows * p->n_kv_heads;
		int64_t want = MAX((4 * (int64_t)(kv->n_sms ? kv->n_sms : 100) + items - 1) / items, 1);
		bps = (int)MAX((max_blocks + want - 1) / want, KVC_WARPS);
	}
	const int n_splits = (int)((max_blocks + bps - 1) / bps);

	/* scratch: prepared queries, sketches, partials; grown, kept until cuda_kv_free() */
	const int m1 = p->qjl_m ? p->qjl_m : 1;
	size_t n_qp = (size_t)n_rows * p->n_heads * p->dim, n_sq = (size_t)n_rows * p->n_heads * m1;
	size_t n_part = (size_t)n_rows * p->n_heads * n_splits * (p->dim + 2);
	size_t need = (n_qp + n_sq + n_part) * sizeof(float);
	if (need > kv->scratch_bytes) {
		cuda_free(kv->scratch);
		kv->scratch_bytes = 0;
		if (!(kv->scratch = cuda_alloc(need)))
			return -ENOMEM;
		kv->scratch_bytes = need;
	}
	KvcAttend a = {
		.pos0 = pos0, .n_seqs = n_seqs, .n_tok = n_tok,
		.blocks_per_split = bps, .n_splits = n_splits,
		.q = q, .qp = kv->scratch, .sq = kv->scratch + n_qp, .part = kv->scratch + n_qp + n_sq,
		.out = out,
	};
	return kvc_launch_attend(p, &a);
}
