/*
 * vec_dot_neon.c: the NEON weight dot products (vec_dot_neon_impl.h) with
 * plain Advanced SIMD integer products (SMULL, SMULL2, pairwise SADALP),
 * for aarch64 CPUs without the dot-product extension, and the dispatch
 * between this variant and vec_dot_neon_dotprod.c's.
 */
#include <arm_neon.h>

/* Never fused, never saturating: |a b| <= 2^14 fits int16; SADALP widens to int32. */
static inline int32x4_t dot16_mull(int32x4_t acc, int8x16_t a, int8x16_t b)
{
	acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
	return vpadalq_s16(acc, vmull_high_s8(a, b));
}

#define NEON_SUFFIX neon
#define DOT16(acc, a, b) dot16_mull(acc, a, b)
#include "kernels/cpu/vec_dot_neon_impl.h"

VecDotFn vec_dot_neon_plain_get(uint32_t t)
{
	return vec_dot_get_neon(t);
}

RepackTileFn repack_tile_neon_plain_get(uint32_t t)
{
	return repack_tile_get_neon(t);
}

VecDotFn vec_dot_neon_get(uint32_t t, bool dotprod)
{
	return dotprod ? vec_dot_neon_dotprod_get(t) : vec_dot_neon_plain_get(t);
}

RepackTileFn repack_tile_neon_get(uint32_t t, bool dotprod)
{
	return dotprod ? repack_tile_neon_dotprod_get(t) : repack_tile_neon_plain_get(t);
}
