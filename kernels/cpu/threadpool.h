/*
 * threadpool.h: a fixed pool of worker threads for data-parallel kernels.
 *
 * threadpool_run() runs fn(ctx, ith, nth) on every thread (the caller is
 * thread 0) and returns when all are done. Workers spin briefly between
 * jobs, since a decode step dispatches hundreds of small kernels, then
 * sleep on a futex-like condition so an idle daemon burns no CPU.
 */
#pragma once

typedef struct ThreadPool ThreadPool;

typedef void (*ThreadTask)(void *ctx, int ith, int nth);

/* n_threads >= 1 (1: no extra threads). Returns 0 or -errno. */
int threadpool_new(int n_threads, ThreadPool **ret);
ThreadPool *threadpool_free(ThreadPool *tp);

int threadpool_n_threads(const ThreadPool *tp);

/* Run fn on all threads and wait. tp may be NULL: runs fn(ctx, 0, 1). */
void threadpool_run(ThreadPool *tp, ThreadTask fn, void *ctx);

/* Split [0, n) into nth near-equal chunks; the range of thread ith. */
static inline void threadpool_split(long n, int ith, int nth, long *ret_begin, long *ret_end)
{
	long per = (n + nth - 1) / nth;
	long b = per * ith;
	long e = b + per;
	*ret_begin = b < n ? b : n;
	*ret_end = e < n ? e : n;
}
