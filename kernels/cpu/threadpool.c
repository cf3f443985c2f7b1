/*
 * threadpool.c: the worker pool behind every data-parallel kernel.
 *
 * A job is published by bumping a sequence number; workers spin on it
 * for a short while after each job (a decode step dispatches a few
 * hundred small kernels back to back, and a futex wake costs more than
 * most of them), then park on a condition variable so that an idle
 * daemon uses no CPU. The caller runs share 0 of every job itself.
 *
 * Ordering: fn/ctx are written before the sequence bump (seq_cst) and
 * read after a worker observes it (acquire); each worker's writes are
 * released by its decrement of `pending`, acquired by the caller when it
 * sees zero. Sleeping uses a Dekker pair: the dispatcher stores seq then
 * reads n_sleeping, a worker increments n_sleeping then reads seq, all
 * seq_cst, so at least one side sees the other and no wakeup is lost.
 *
 * One dispatcher at a time: threadpool_run() is not reentrant and must
 * not be called concurrently on the same pool.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "base/util.h"
#include "kernels/cpu/threadpool.h"

/* How long a worker keeps polling for the next job before it sleeps. */
#define SPIN_NS 100000ull
/* After this long, polls alternate with sched_yield() so that on an
 * oversubscribed machine the threads we wait for get to run. */
#define YIELD_AFTER_NS 20000ull
/* Polls between clock reads. */
#define SPIN_CHECK_EVERY 32

#define CACHE_LINE 64

typedef struct Worker {
	ThreadPool *tp;
	pthread_t thread;
	int ith;
	bool started;
} Worker;

struct ThreadPool {
	int n_threads;
	Worker *workers; /* [n_threads - 1], worker i runs share i + 1 */

	/* Written by the dispatcher only, before seq is bumped. */
	ThreadTask fn;
	void *ctx;

	_Alignas(CACHE_LINE) atomic_uint_fast64_t seq;
	atomic_bool stop;
	_Alignas(CACHE_LINE) atomic_int pending; /* workers yet to finish the job */
	_Alignas(CACHE_LINE) atomic_int n_sleeping;
	pthread_mutex_t lock;
	pthread_cond_t wake;
};

static uint64_t clock_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Wait until tp->seq differs from last; returns the new value. */
static uint_fast64_t worker_wait(ThreadPool *tp, uint_fast64_t last)
{
	uint_fast64_t s;
	uint64_t start = 0;
	bool yield = false;

	for (unsigned i = 1;; i++) {
		s = atomic_load_explicit(&tp->seq, memory_order_acquire);
		if (s != last)
			return s;
		if (yield)
			sched_yield();
		else
			cpu_relax();
		if (i % SPIN_CHECK_EVERY == 0) {
			uint64_t now = clock_ns();
			if (!start)
				start = now;
			else if (now - start >= SPIN_NS)
				break;
			yield = now - start >= YIELD_AFTER_NS;
		}
	}

	pthread_mutex_lock(&tp->lock);
	atomic_fetch_add(&tp->n_sleeping, 1);
	while ((s = atomic_load(&tp->seq)) == last)
		pthread_cond_wait(&tp->wake, &tp->lock);
	atomic_fetch_sub(&tp->n_sleeping, 1);
	pthread_mutex_unlock(&tp->lock);
	return s;
}

static void *worker_main(void *arg)
{
	Worker *w = arg;
	ThreadPool *tp = w->tp;
	uint_fast64_t seq = 0;

	for (;;) {
		seq = worker_wait(tp, seq);
		if (atomic_load_explicit(&tp->stop, memory_order_relaxed))
			break;
		tp->fn(tp->ctx, w->ith, tp->n_threads);
		atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_release);
	}
	return NULL;
}

/* Publish a new sequence number and wake sleepers; fn/ctx/stop set before. */
static void pool_publish(ThreadPool *tp)
{
	atomic_fetch_add(&tp->seq, 1);
	if (atomic_load(&tp->n_sleeping) > 0) {
		pthread_mutex_lock(&tp->lock);
		pthread_cond_broadcast(&tp->wake);
		pthread_mutex_unlock(&tp->lock);
	}
}

ThreadPool *threadpool_free(ThreadPool *tp)
{
	if (!tp)
		return NULL;
	atomic_store(&tp->stop, true);
	pool_publish(tp);
	for (int i = 0; i < tp->n_threads - 1; i++)
		if (tp->workers[i].started)
			pthread_join(tp->workers[i].thread, NULL);
	pthread_cond_destroy(&tp->wake);
	pthread_mutex_destroy(&tp->lock);
	free(tp->workers);
	free(tp);
	return NULL;
}

/* Returns 0, -EINVAL for n_threads < 1 or absurdly large, or -errno. */
int threadpool_new(int n_threads, ThreadPool **ret)
{
	ThreadPool *tp;
	int r;

	if (n_threads < 1 || n_threads > 1024)
		return -EINVAL;
	tp = aligned_alloc(CACHE_LINE, (sizeof(*tp) + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE);
	if (!tp)
		return -ENOMEM;
	*tp = (ThreadPool){ .n_threads = n_threads };
	atomic_init(&tp->seq, 0);
	atomic_init(&tp->stop, false);
	atomic_init(&tp->pending, 0);
	atomic_init(&tp->n_sleeping, 0);
	pthread_mutex_init(&tp->lock, NULL);
	pthread_cond_init(&tp->wake, NULL);

	tp->workers = calloc_array((size_t)n_threads, sizeof(Worker));
	if (!tp->workers) {
		threadpool_free(tp);
		return -ENOMEM;
	}
	for (int i = 0; i < n_threads - 1; i++) {
		Worker *w = &tp->workers[i];
		w->tp = tp;
		w->ith = i + 1;
		r = pthread_create(&w->thread, NULL, worker_main, w);
		if (r != 0) {
			threadpool_free(tp);
			return -r;
		}
		w->started = true;
	}
	*ret = tp;
	return 0;
}

int threadpool_n_threads(const ThreadPool *tp)
{
	return tp ? tp->n_threads : 1;
}

void threadpool_run(ThreadPool *tp, ThreadTask fn, void *ctx)
{
	if (!tp || tp->n_threads == 1) {
		fn(ctx, 0, 1);
		return;
	}

	tp->fn = fn;
	tp->ctx = ctx;
	atomic_store_explicit(&tp->pending, tp->n_threads - 1, memory_order_relaxed);
	pool_publish(tp);

	fn(ctx, 0, tp->n_threads);

	/* Jobs are short: poll, yielding now and then in case a worker was
	 * preempted and needs this core to finish. */
	for (unsigned i = 1; atomic_load_explicit(&tp->pending, memory_order_acquire) != 0; i++) {
		if (i % 256)
			cpu_relax();
		else
			sched_yield();
	}
}
