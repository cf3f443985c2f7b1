/*
 * cpu_features.h: which SIMD paths this CPU can run (checked once, at run
 * time), and which kernel sets this build has.
 *
 * The build compiles one SIMD kernel set per CPU family (kernels/meson.build,
 * from host_machine.cpu_family()): the x86 one (*_avx2.c, *_avx512.c) or the
 * aarch64 one (*_neon.c); the scalar references everywhere. The dispatchers
 * say which set they may call with CPU_KERNELS_X86 / CPU_KERNELS_NEON, which
 * follow the compiler's target exactly as meson's choice of files does.
 */
#pragma once

#include <stdbool.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_KERNELS_X86 1
#elif defined(__aarch64__)
#define CPU_KERNELS_NEON 1
#endif

typedef struct CpuFeatures {
	/* x86 */
	bool avx2;
	bool fma;
	bool f16c;
	bool avx512; /* F, DQ, BW and VL, with the ZMM state saved by the OS */
	bool avx512vbmi; /* VBMI (byte permutes, multishift), only with avx512 */
	bool avx512vnni; /* VNNI (int8 / int16 dot products, vpdpwssd), only with avx512 */
	/* aarch64 */
	bool neon;    /* Advanced SIMD (every aarch64 CPU; false only when disabled) */
	bool dotprod; /* the dot-product extension (SDOT, vdotq_s32): HWCAP_ASIMDDP */
} CpuFeatures;

const CpuFeatures *cpu_features(void);

/* Force the scalar reference paths (tests, and TURBOKV_NO_SIMD=1); false
 * restores what the environment set, never more. */
void cpu_features_disable_simd(bool disable);

/*
 * Leave AVX-512 out, keep AVX2 (tests and benchmarks compare the two;
 * TURBOKV_NO_AVX512=1 does the same for a whole process).
 */
void cpu_features_disable_avx512(bool disable);

/*
 * Leave the dot-product extension out, keep plain NEON (tests compare
 * scalar, NEON and NEON+dotprod; TURBOKV_NO_DOTPROD=1 does the same for a
 * whole process). A no-op on x86.
 */
void cpu_features_disable_dotprod(bool disable);
