/*
 * fmt_tq.h: what the TurboQuant format (fmt_tq.c) says about its sides to
 * code that needs the codec itself: the GPU bridge (it flattens the same
 * codecs for the device), kvstats and tests.
 */
#pragma once

#include <stdint.h>

#include "engine/codec/tq.h"
#include "engine/kv/kvcache.h"
#include "engine/kv/kvtype.h"

/*
 * The codec seeds of (layer, head, role) under cache seed:
 *
 *   key   = l << 32 | h << 1 | r                          (uint64)
 *   state = seed ^ (0x6b7673746f726531 + key * 0x9e3779b97f4a7c15)
 *   rng_init(state) (rotation.h: four splitmix64 outputs), then
 *   rot_seed = rng_next(); qjl_seed = the next rng_next() that is not 0,
 *   rot_seed or tq_seed_mix(rot_seed).
 */
void kvtq_derive_seeds(uint64_t seed, int layer, int head, KvRole role, uint64_t *ret_rot_seed,
		       uint64_t *ret_qjl_seed);

/*
 * The complete descriptor (seeds, outlier mask) of the TQ side (layer,
 * head, role) of a compressed cache into *ret. Returns 0 or -ENOENT (not
 * a TQ side, not a compressed cache, or an outlier mask not chosen yet:
 * it is chosen by the layer's first append).
 */
int kvtq_side_desc(const KvCache *kv, int layer, int head, KvRole role, TqDesc *ret);
