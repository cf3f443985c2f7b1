/* cpu_features.h: which SIMD paths this CPU can run (checked once, at run time). */
#pragma once

#include <stdbool.h>

typedef struct CpuFeatures {
	bool avx2;
	bool fma;
	bool f16c;
	bool avx512; /* F, DQ, BW and VL, with the ZMM state saved by the OS */
	bool avx512vbmi; /* VBMI (byte permutes, multishift), only with avx512 */
} CpuFeatures;

const CpuFeatures *cpu_features(void);

/* Force the scalar reference paths (tests, and TURBOKV_NO_SIMD=1). */
void cpu_features_disable_simd(bool disable);

/*
 * Leave AVX-512 out, keep AVX2 (tests and benchmarks compare the two;
 * TURBOKV_NO_AVX512=1 does the same for a whole process).
 */
void cpu_features_disable_avx512(bool disable);
