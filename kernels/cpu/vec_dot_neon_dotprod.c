/*
 * vec_dot_neon_dotprod.c: the NEON weight dot products
 * (vec_dot_neon_impl.h) with the dot-product extension's SDOT
 * (vdotq_s32: four int8 products per int32 lane in one instruction).
 * Compiled with +dotprod (kernels/meson.build); called only where
 * cpu_features()->dotprod (HWCAP_ASIMDDP) says the CPU has it.
 */
#include <arm_neon.h>

#define NEON_SUFFIX neon_dotprod
#define DOT16(acc, a, b) vdotq_s32(acc, a, b)
#include "kernels/cpu/vec_dot_neon_impl.h"

VecDotFn vec_dot_neon_dotprod_get(uint32_t t)
{
	return vec_dot_get_neon_dotprod(t);
}

RepackTileFn repack_tile_neon_dotprod_get(uint32_t t)
{
	return repack_tile_get_neon_dotprod(t);
}
