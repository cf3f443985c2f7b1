/*
 * cpu_features.c: run-time detection of the SIMD extensions our fast
 * kernels use, checked once: AVX2, FMA, F16C, AVX-512 with cpuid/xgetbv
 * on x86; NEON (always there) and the dot-product extension with
 * getauxval(AT_HWCAP) on aarch64.
 *
 * Owns the answer to "may the *_avx2.c (*_avx512.c, *_neon.c) kernels run
 * here";
 * does not own the dispatch itself (matmul.c and friends ask per call,
 * so tests can flip cpu_features_disable_simd() at any time).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20) /* linux/arch/arm64/include/uapi/asm/hwcap.h */
#endif
#endif

#include "kernels/cpu/cpu_features.h"

static CpuFeatures detected, detected_avx2_only, detected_no_dotprod, detected_base;
static const CpuFeatures none;
static atomic_int detect_state; /* 0: not yet, 1: running, 2: done */
static atomic_bool simd_disabled, avx512_disabled, dotprod_disabled;
/* What the environment asked for: the toggles below never undo it, so a test
 * that disables a level and then re-enables it stays within TURBOKV_NO_*. */
static bool env_no_simd, env_no_avx512, env_no_dotprod;

#if defined(__x86_64__) || defined(__i386__)
static unsigned long long xgetbv0(void)
{
	unsigned eax, edx;
	__asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
	return ((unsigned long long)edx << 32) | eax;
}

static void features_detect(CpuFeatures *f)
{
	unsigned a, b, c, d;

	memset(f, 0, sizeof(*f));
	if (!__get_cpuid(1, &a, &b, &c, &d))
		return;
	bool osxsave = c & (1u << 27);
	bool avx = c & (1u << 28);
	/* The OS must save the YMM state (XCR0 bits 1 and 2) for AVX to be usable. */
	if (!osxsave || !avx)
		return;
	unsigned long long xcr0 = xgetbv0();
	if ((xcr0 & 0x6) != 0x6)
		return;
	f->fma = c & (1u << 12);
	f->f16c = c & (1u << 29);
	if (__get_cpuid_max(0, NULL) >= 7) {
		__cpuid_count(7, 0, a, b, c, d);
		f->avx2 = b & (1u << 5);
		/* F (16), DQ (17), BW (30), VL (31); XCR0 5..7: opmask and ZMM state */
		unsigned need = 1u << 16 | 1u << 17 | 1u << 30 | 1u << 31;
		f->avx512 = (b & need) == need && (xcr0 & 0xe6) == 0xe6;
		f->avx512vbmi = f->avx512 && (c & (1u << 1));
		f->avx512vnni = f->avx512 && (c & (1u << 11));
	}
}
#elif defined(__aarch64__)
static void features_detect(CpuFeatures *f)
{
	memset(f, 0, sizeof(*f));
	/* Advanced SIMD is part of the aarch64 base architecture (the ABI passes vectors in it) */
	f->neon = true;
	f->dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}
#else
static void features_detect(CpuFeatures *f)
{
	memset(f, 0, sizeof(*f));
}
#endif

static bool env_set(const char *name)
{
	const char *e = getenv(name);
	return e && *e && strcmp(e, "0") != 0;
}

static void features_init(void)
{
	int expected = 0;
	if (atomic_compare_exchange_strong(&detect_state, &expected, 1)) {
		env_no_simd = env_set("TURBOKV_NO_SIMD");
		env_no_avx512 = env_set("TURBOKV_NO_AVX512");
		env_no_dotprod = env_set("TURBOKV_NO_DOTPROD");
		atomic_store(&simd_disabled, env_no_simd);
		atomic_store(&avx512_disabled, env_no_avx512);
		atomic_store(&dotprod_disabled, env_no_dotprod);
		features_detect(&detected);
		detected_avx2_only = detected;
		detected_avx2_only.avx512 = false;
		detected_avx2_only.avx512vbmi = false;
		detected_avx2_only.avx512vnni = false;
		detected_no_dotprod = detected;
		detected_no_dotprod.dotprod = false;
		detected_base = detected_avx2_only;
		detected_base.dotprod = false;
		atomic_store_explicit(&detect_state, 2, memory_order_release);
		return;
	}
	/* Another thread is detecting: cpuid takes microseconds. */
	while (atomic_load_explicit(&detect_state, memory_order_acquire) != 2)
		;
}

/* The features the kernels may use: all false when SIMD is disabled. */
const CpuFeatures *cpu_features(void)
{
	if (__builtin_expect(atomic_load_explicit(&detect_state, memory_order_acquire) != 2, 0))
		features_init();
	if (atomic_load_explicit(&simd_disabled, memory_order_relaxed))
		return &none;
	bool no512 = atomic_load_explicit(&avx512_disabled, memory_order_relaxed);
	bool nodp = atomic_load_explicit(&dotprod_disabled, memory_order_relaxed);
	if (no512 && nodp)
		return &detected_base;
	if (no512)
		return &detected_avx2_only;
	if (nodp)
		return &detected_no_dotprod;
	return &detected;
}

void cpu_features_disable_simd(bool disable)
{
	if (atomic_load_explicit(&detect_state, memory_order_acquire) != 2)
		features_init();
	atomic_store(&simd_disabled, disable || env_no_simd);
}

void cpu_features_disable_avx512(bool disable)
{
	if (atomic_load_explicit(&detect_state, memory_order_acquire) != 2)
		features_init();
	atomic_store(&avx512_disabled, disable || env_no_avx512);
}

void cpu_features_disable_dotprod(bool disable)
{
	if (atomic_load_explicit(&detect_state, memory_order_acquire) != 2)
		features_init();
	atomic_store(&dotprod_disabled, disable || env_no_dotprod);
}
