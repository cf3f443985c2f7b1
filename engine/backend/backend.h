/*
 * backend.h: where the model's arithmetic runs (CPU or CUDA).
 *
 * model.c writes the forward pass once, as calls on a Backend. Weights,
 * activations and KV caches live in the backend's memory; the model holds
 * pointers into it but never reads or writes through them, so the same
 * code drives host memory (the CPU backend) and device memory (CUDA).
 * Only the token ids going in, the positions and the logits coming out
 * cross between host and backend.
 *
 * A backend is a BackendOps table. The CPU backend (backend_cpu.c) calls
 * kernels/cpu directly and has no state: its memory is host memory; its
 * weights stay in the GGUF mapping, except the types it repacks at upload
 * (kernels/cpu/repack.h), whose copies replace the mapped pages. The CUDA backend
 * (engine/backend/backend_cuda.c) uploads each weight once and runs every op
 * on the device's stream; its KV caches are kernels/cuda's CudaKv.
 *
 * All ops return 0 or a negative errno (-ENOMEM for device memory, -EIO
 * for a failed launch); they may run asynchronously, and download()
 * waits for everything queued before it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "engine/kv/kvcache.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"

typedef struct KvPlan KvPlan; /* kvtype.h */

typedef enum DeviceChoice {
	DEVICE_AUTO, /* CUDA when it is built and a GPU is there, else the CPU */
	DEVICE_CPU,
	DEVICE_CUDA,
} DeviceChoice;

/* "auto", "cpu", "cuda" to a DeviceChoice; -EINVAL for anything else. */
int device_choice_from_name(const char *name, DeviceChoice *ret);
const char *device_choice_name(DeviceChoice d);

typedef struct Backend Backend;

typedef struct BackendOps {
	const char *name; /* "cpu", "cuda" */
	void (*free)(Backend *b);
	/* Optional: what the last failed op met ("CUDA rmsnorm: an illegal memory access ..."). */
	const char *(*last_error)(Backend *b);

	/* ---- memory ---- */
	/* bytes of backend memory (uninitialized); -ENOMEM when there is none left */
	int (*alloc)(Backend *b, size_t bytes, void **ret);
	void (*dealloc)(Backend *b, void *p);
	int (*upload)(Backend *b, void *dst, const void *src, size_t bytes);
	/* waits for all queued work, then copies */
	int (*download)(Backend *b, void *dst, const void *src, size_t bytes);
	/*
	 * Make a weight usable by matmul() and embed(): w->data is host
	 * memory (the GGUF mapping) on entry and backend memory, owned by the
	 * backend until it is freed, on return. The CPU leaves it as is.
	 */
	int (*upload_weight)(Backend *b, MatmulWeight *w);
	/*
	 * Optional: give back what upload_weight() made of w, when the
	 * backend frees weights one by one (the CPU's repacked copies);
	 * model_free() calls it once per uploaded weight.
	 */
	void (*release_weight)(Backend *b, MatmulWeight *w);
	/* The same for a vector of n floats (norm weights, biases). */
	int (*upload_vector)(Backend *b, const float **v, int64_t n);

	/* ---- operators: pointers are backend memory unless said otherwise ---- */
	/* x (n, emb->cols) = rows tokens[i] of emb, dequantized; tokens is a host array */
	int (*embed)(Backend *b, const MatmulWeight *emb, const int32_t *tokens, int64_t n, float *x);
	/* y (n, dim) = rmsnorm of each row of x times w (dim,); y may alias x */
	int (*rmsnorm)(Backend *b, float *y, const float *x, const float *w, int64_t n, int64_t dim,
		       float eps);
	/*
	 * ys[i] (n, ws[i]->rows) = x (n, cols) @ ws[i]^T for i < n_w, all
	 * ws sharing cols (1 <= n_w <= MATMUL_GROUP_MAX). tp: the host
	 * threads of the run (CPU only).
	 */
	int (*matmul)(Backend *b, ThreadPool *tp, const MatmulWeight *const *ws, float *const *ys,
		      int n_w, const float *x, int64_t n);
	/* x (n, dim) += bias (dim,) per row */
	int (*add_bias)(Backend *b, float *x, const float *bias, int64_t n, int64_t dim);
	/*
	 * cos and sin of every rotation angle for the n positions pos (a
	 * host array): cs, sn (n, rope->n_rot / 2). Once per batch.
	 */
	int (*rope_angles)(Backend *b, const Rope *rope, const int64_t *pos, int64_t n, float *cs,
			   float *sn);
	/* rotate x (n, n_heads * head_dim): row i by the angles of row i of cs, sn */
	int (*rope)(Backend *b, const Rope *rope, float *x, int64_t n, int n_heads, int head_dim,
		    const float *cs, const float *sn);
	/* gate (n,) = silu(gate) * up */
	int (*swiglu)(Backend *b, float *gate, const float *up, int64_t n);
	/* x (n,) += y (n,) */
	int (*add)(Backend *b, float *x, const float *y, int64_t n);
	/*
	 * Optional (gemma3 needs them; a model that needs one refuses to load
	 * on a backend without it): gate (n,) = gelu_tanh(gate) * up, and
	 * x (n,) *= s.
	 */
	int (*geglu)(Backend *b, float *gate, const float *up, int64_t n);
	int (*scale)(Backend *b, float *x, float s, int64_t n);

	/* ---- KV caches in this backend's memory ---- */
	/*
	 * A cache for shape: the exact f32 cache when plan is NULL or all
	 * f32 (kvplan_is_f32), else plan's compressed types with codec seeds
	 * from seed (kvstore.h). Returns 0, -ENOMEM, or kvstore.h codes with
	 * err set.
	 */
	int (*kvcache_new)(Backend *b, const KvCacheShape *shape, const KvPlan *plan, uint64_t seed,
			   KvCache **ret, Error *err);
	/*
	 * A cache of this backend holding what host, a host cache (session
	 * restore: kvcache_new_f32 or kvcache_new_quant), holds. On success
	 * host is consumed (*ret may be host itself); on error it is left to
	 * the caller.
	 */
	int (*kvcache_adopt)(Backend *b, KvCache *host, KvCache **ret, Error *err);
} BackendOps;

struct Backend {
	const BackendOps *ops;
};

/* The CPU backend: stateless, one shared instance; freeing it does nothing. */
Backend *backend_cpu(void);

/*
 * The CUDA backend on device 0, or -ENODEV (no GPU, no driver: err
 * says which) / -EOPNOTSUPP (this build has no CUDA) / -ENOMEM.
 * kernels/cuda provides it when CUDA is built, engine/backend/backend_nocuda.c
 * otherwise.
 */
int backend_cuda_new(Backend **ret, Error *err);

/*
 * The backend for choice: DEVICE_AUTO takes CUDA when backend_cuda_new()
 * succeeds and the CPU otherwise (*ret_fallback, if non-NULL, then says
 * why: the first failure's message). DEVICE_CUDA fails with its error.
 */
int backend_open(DeviceChoice choice, Backend **ret, char *ret_fallback, size_t fallback_size,
		 Error *err);

Backend *backend_free(Backend *b);
DEFINE_FREEP(Backend, backend_free)

static inline const char *backend_name(const Backend *b)
{
	return b->ops->name;
}

/* The message of b's last failure, "" if it keeps none. */
static inline const char *backend_last_error(Backend *b)
{
	const char *msg = b->ops->last_error ? b->ops->last_error(b) : NULL;
	return msg ? msg : "";
}

/* Whether b computes in host memory (then pointers may be read directly). */
static inline bool backend_is_host(const Backend *b)
{
	return b == backend_cpu();
}
