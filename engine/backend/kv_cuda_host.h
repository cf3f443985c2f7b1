/*
 * kv_cuda_host.h: a GPU layer cache (kernels/cuda/kv_cuda.h) made to match
 * one layer of a CPU cache: the same K and V types and the same codecs.
 *
 * Owns: the bridge from the engine's codecs (engine/codec/tq.h, flattened
 * by tq_codec_kernel()) to a CudaKv. Not here: the device side
 * (kernels/cuda), the KvCache of the CUDA backend (kv_cuda_cache.h).
 */
#pragma once

#include <stdint.h>

#include "base/util.h"
#include "engine/kv/kvcache.h"
#include "kernels/cuda/kv_cuda.h"

/*
 * A CudaKv for layer of a CPU cache made by kvcache_new_quant(): the same
 * K and V types, the same TQ codecs (seeds, outlier masks: an outlier
 * side must have had its first append on the CPU), n_seqs sequences of
 * capacity tokens. Returns 0, -EINVAL (shape the GPU cannot take, with
 * err), -ENODEV, -ENOMEM, or a kvstore.h / tq.h code.
 */
int cuda_kv_new_like(const KvCache *cpu, int layer, int n_seqs, int64_t capacity, CudaKv **ret,
		     Error *err);
