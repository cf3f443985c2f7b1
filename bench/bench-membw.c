/*
 * bench-membw.c: the machine's read bandwidth, the ceiling for decode.
 *
 * Each of T threads streams through its own slice of one large buffer
 * (default 1 GiB, far beyond any cache) with 256-bit loads summed into
 * registers, as a memory-bound matrix-vector product reads its weights;
 * the best of R passes is reported in GB/s (10^9 bytes), for 1..T threads.
 *
 * Usage: bench-membw [THREADS (2)] [MIB (1024)] [PASSES (5)]
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct Slice {
	const __m256i *p;
	size_t n; /* 32-byte vectors */
	long long sink;
} Slice;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *slice_read(void *arg)
{
	Slice *s = arg;
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
	for (size_t i = 0; i + 4 <= s->n; i += 4) {
		a0 = _mm256_add_epi64(a0, _mm256_load_si256(s->p + i));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256(s->p + i + 1));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256(s->p + i + 2));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256(s->p + i + 3));
	}
	a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
	long long v[4];
	memcpy(v, &a0, sizeof(v));
	s->sink = v[0] + v[1] + v[2] + v[3];
	return NULL;
}

int main(int argc, char **argv)
{
	int max_threads = argc > 1 ? atoi(argv[1]) : 2;
	size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
	int passes = argc > 3 ? atoi(argv[3]) : 5;
	if (max_threads < 1 || max_threads > 256 || mib < 1 || passes < 1) {
		fprintf(stderr, "usage: bench-membw [THREADS] [MIB] [PASSES]\n");
		return 2;
	}
	size_t bytes = mib << 20;
	__m256i *buf = aligned_alloc(64, bytes);
	if (!buf) {
		fprintf(stderr, "bench-membw: cannot allocate %zu MiB\n", mib);
		return 1;
	}
	memset(buf, 1, bytes); /* fault every page in before timing */
	size_t n = bytes / sizeof(__m256i);

	for (int t = 1; t <= max_threads; t++) {
		double best = 0;
		long long sink = 0;
		for (int pass = 0; pass < passes; pass++) {
			Slice sl[256];
			pthread_t th[256];
			double t0 = now_s();
			for (int i = 0; i < t; i++) {
				size_t a = n * i / t & ~(size_t)3, b = n * (i + 1) / t & ~(size_t)3;
				sl[i] = (Slice){ .p = buf + a, .n = b - a };
				if (pthread_create(&th[i], NULL, slice_read, &sl[i]) != 0) {
					fprintf(stderr, "bench-membw: pthread_create failed\n");
					return 1;
				}
			}
			for (int i = 0; i < t; i++) {
				pthread_join(th[i], NULL);
				sink += sl[i].sink;
			}
			double gbs = (double)bytes / (now_s() - t0) / 1e9;
			if (gbs > best)
				best = gbs;
		}
		printf("read bandwidth, %d thread%s: %.1f GB/s (best of %d passes over %zu MiB; sink %lld)\n", t,
		       t > 1 ? "s" : "", best, passes, mib, sink & 1);
	}
	free(buf);
	return 0;
}
