/*
 * kv_cuda_cache.h: a KvCache (engine/kv/kvcache.h) in GPU memory, the KV
 * cache of the CUDA backend. append() and attend() take device pointers.
 *
 * Owns: one CudaKv (kv_cuda.h, one sequence) per layer, and a host
 * "shadow" cache of the same type: kvcache_new_quant() with the same plan
 * and seed, or kvcache_new_f32(). The GPU's append kernel writes exactly
 * the bytes the shadow would, so the shadow serves two purposes:
 *
 *   - Outlier masks. An outlier-channel TQ side (the "o" types: tq3h16o,
 *     tq3.5o ...) chooses its channel mask from the rows of its layer's
 *     first append, on the CPU. A layer with such a side gets its CudaKv
 *     at that first append: the batch is downloaded, the shadow chooses
 *     the masks from it (kvstore_fix(), as its own first
 *     append would), the CudaKv is built from the shadow's codecs and the
 *     device rows are appended to it. Until then the layer's device
 *     memory is reserved (allocated and held), so running out of it shows
 *     at creation, not mid-prompt. Every other layer (f32, plain formats,
 *     TQ types without "o", the default among them) gets its CudaKv at
 *     creation.
 *   - Sessions. to_host() copies every block of positions 0 .. n_tokens-1
 *     from the device into the shadow and returns it; adopt() builds a
 *     cache around a restored host cache and uploads its blocks.
 *
 * A failed attend (a launch error, device memory for scratch, a layer
 * attended before its first append) returns its error; a failure of the
 * kernels themselves shows at the next synchronising call (the model's
 * logits download). Kernels run on the legacy default stream.
 *
 * Not here: the kernels (kv_cuda.cu, kv_cuda_append.cu), the model and
 * its backend (engine/backend/backend.h), session files (engine/session/session.h).
 */
#pragma once

#include <stdint.h>

#include "base/util.h"
#include "engine/kv/kvcache.h"
#include "engine/kv/kvtype.h"

/*
 * A cache of shape in device memory: f32 when plan is NULL, else the
 * types of plan with codec seeds derived from seed exactly as
 * kvcache_new_quant(shape, plan, seed) derives them. Every layer's block
 * memory (capacity tokens) is allocated or reserved here. Returns 0,
 * -EINVAL (a shape or type the GPU cannot take: head_dim not a multiple
 * of 32 or above 256, more than 8 query heads per kv-head, QJL rows above
 * 256, centered keys "+c"),
 * -ENODEV, -ENOMEM (device memory: err says how much) or a kvstore.h /
 * tq.h code, with err set. *ret written only on success.
 */
int cuda_kvcache_new(const KvCacheShape *shape, const KvPlan *plan, uint64_t seed, KvCache **ret,
		     Error *err);

/*
 * A device cache holding what host holds (session restore): host is an
 * f32 cache or a kvstore cache; its blocks of positions 0 .. n_tokens-1
 * are uploaded. On success host is consumed (it becomes the new cache's
 * shadow); on error it is left to the caller, unchanged. Returns 0 or the
 * codes of cuda_kvcache_new(), with err set.
 */
int cuda_kvcache_adopt(KvCache *host, KvCache **ret, Error *err);

/* Whether kv was made by cuda_kvcache_new() or cuda_kvcache_adopt(). */
bool cuda_kvcache_is(const KvCache *kv);
