/* cpu_features.h: which SIMD paths this CPU can run (checked once, at run time). */
#pragma once

#include <stdbool.h>

typedef struct CpuFeatures {
	bool avx2;
	bool fma;
	bool f16c;
} CpuFeatures;

const CpuFeatures *cpu_features(void);

/* Force the scalar reference paths (tests, and TURBOKV_NO_SIMD=1). */
void cpu_features_disable_simd(bool disable);
