/*
 * test-threadpool.c: the worker pool runs every job on every thread
 * exactly once, publishes the caller's writes to the workers and theirs
 * back, survives dispatches at any gap (spinning, falling asleep, asleep),
 * and uses no CPU while idle.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/threadpool.h"
#include "tests/unit/testutil.h"

#define MAX_THREADS 8

typedef struct Job {
	int nth_expected;
	long id;                    /* written by the caller before each run */
	long input[MAX_THREADS];    /* plain data the workers read */
	long output[MAX_THREADS];   /* plain data the workers write */
	atomic_long runs[MAX_THREADS];
	atomic_int bad_nth;
	atomic_int bad_order;
} Job;

static void job_fn(void *p, int ith, int nth)
{
	Job *j = p;
	if (nth != j->nth_expected || ith < 0 || ith >= nth)
		atomic_fetch_add(&j->bad_nth, 1);
	/* Exactly once per job: the counter before this run equals the id. */
	if (atomic_fetch_add(&j->runs[ith], 1) != j->id)
		atomic_fetch_add(&j->bad_order, 1);
	if (j->input[ith] != j->id * 7 + ith)
		atomic_fetch_add(&j->bad_order, 1);
	j->output[ith] = j->id * 3 + ith;
}

static void job_run_many(ThreadPool *tp, Job *j, long n, long gap_every)
{
	int nth = threadpool_n_threads(tp);
	for (long k = 0; k < n; k++) {
		j->id++;
		for (int i = 0; i < nth; i++)
			j->input[i] = j->id * 7 + i;
		threadpool_run(tp, job_fn, j);
		for (int i = 0; i < nth; i++) {
			ck_assert_int_eq(atomic_load(&j->runs[i]), j->id + 1);
			ck_assert_int_eq(j->output[i], j->id * 3 + i);
		}
		if (gap_every && k % gap_every == 0) {
			/* Gaps around the spin window: 0..250 us. */
			struct timespec ts = { 0, (k / gap_every % 6) * 50000 };
			nanosleep(&ts, NULL);
		}
	}
	ck_assert_int_eq(atomic_load(&j->bad_nth), 0);
	ck_assert_int_eq(atomic_load(&j->bad_order), 0);
}

static void job_init(Job *j, int nth)
{
	*j = (Job){ .nth_expected = nth, .id = -1 };
	for (int i = 0; i < MAX_THREADS; i++)
		atomic_init(&j->runs[i], 0);
}

START_TEST(test_dispatch_many)
{
	int nth = _i;
	ThreadPool *tp = NULL;
	Job j;

	ck_assert_int_eq(threadpool_new(nth, &tp), 0);
	ck_assert_int_eq(threadpool_n_threads(tp), nth);
	job_init(&j, nth);
	/* The machine has 2 cores: more threads than that dispatch slowly. */
	job_run_many(tp, &j, nth <= 2 ? 100000 : 20000, 0);
	threadpool_free(tp);
}
END_TEST

START_TEST(test_dispatch_with_gaps)
{
	int nth = _i;
	ThreadPool *tp = NULL;
	Job j;

	ck_assert_int_eq(threadpool_new(nth, &tp), 0);
	job_init(&j, nth);
	job_run_many(tp, &j, 1200, 1);
	threadpool_free(tp);
}
END_TEST

static double cpu_seconds(void)
{
	struct rusage ru;
	ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

START_TEST(test_idle_sleeps)
{
	ThreadPool *tp = NULL;
	Job j;
	struct timespec settle = { 0, 50 * 1000000 }, idle = { 0, 200 * 1000000 };

	ck_assert_int_eq(threadpool_new(4, &tp), 0);
	job_init(&j, 4);
	job_run_many(tp, &j, 100, 0);

	nanosleep(&settle, NULL); /* past the spin window */
	double t0 = cpu_seconds();
	nanosleep(&idle, NULL);
	double used = cpu_seconds() - t0;
	ck_assert_msg(used < 0.01, "idle pool used %.3f s of CPU in 0.2 s", used);

	/* Asleep workers still wake for the next jobs. */
	job_run_many(tp, &j, 100, 0);
	threadpool_free(tp);
}
END_TEST

static void count_fn(void *p, int ith, int nth)
{
	int *c = p;
	ck_assert_int_eq(ith, 0);
	ck_assert_int_eq(nth, 1);
	(*c)++;
}

START_TEST(test_null_pool)
{
	int c = 0;
	threadpool_run(NULL, count_fn, &c);
	ck_assert_int_eq(c, 1);
	ck_assert_int_eq(threadpool_n_threads(NULL), 1);
	ck_assert_ptr_null(threadpool_free(NULL));

	ThreadPool *tp = NULL;
	ck_assert_int_lt(threadpool_new(0, &tp), 0);
	ck_assert_ptr_null(tp);
}
END_TEST

START_TEST(test_split_covers)
{
	for (long n = 0; n < 40; n++)
		for (int nth = 1; nth <= 7; nth++) {
			long next = 0;
			for (int i = 0; i < nth; i++) {
				long b, e;
				threadpool_split(n, i, nth, &b, &e);
				ck_assert_int_eq(b, next);
				ck_assert_int_le(b, e);
				next = e;
			}
			ck_assert_int_eq(next, n);
		}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("threadpool");
	TCase *tc = tcase_create("threadpool");

	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_dispatch_many, 1, 5);
	tcase_add_loop_test(tc, test_dispatch_with_gaps, 2, 4);
	tcase_add_test(tc, test_idle_sleeps);
	tcase_add_test(tc, test_null_pool);
	tcase_add_test(tc, test_split_covers);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
