/*
 * worker.h: the thread that does the daemon's slow work, off the event loop.
 *
 * The event loop does I/O, protocol and bookkeeping; everything that can
 * take long (a prefill chunk, a batched decode round, loading or saving a
 * session file with its fsync) is a WorkerJob. The handoff:
 *
 *   loop                                  worker thread
 *   worker_submit(w, job) --- queue --->  job->run(job)   (touches only what
 *                                                          the job owns)
 *   job->done(job)  <--- outbox + eventfd -----'
 *
 * Jobs run one at a time, in submission order. While a job is queued or
 * running, the loop must not touch what the job's run() reads or writes
 * (its KV caches, its buffers); done() runs on the loop thread, in a later
 * event-loop iteration, and may free the job. A job is never dropped:
 * worker_free() waits for the queue to empty and runs each done() before
 * it returns, so whatever a job holds is given back.
 *
 * Not here: what a job does (scheduler.c, sessions.c).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

typedef struct Worker Worker;
typedef struct WorkerJob WorkerJob;

struct WorkerJob {
	void (*run)(WorkerJob *j);  /* on the worker thread */
	void (*done)(WorkerJob *j); /* on the loop thread, after run() */
	WorkerJob *next;            /* the worker's, while queued */
};

/* Start the thread and watch its eventfd on e. Returns 0 or -errno. */
int worker_new(sd_event *e, Worker **ret);
/* Finish every job (run() and done()), stop the thread. Returns NULL. */
Worker *worker_free(Worker *w);

/* Queue j; its done() runs later on the loop thread. */
void worker_submit(Worker *w, WorkerJob *j);

/* Block until every job submitted so far has run and its done() was called (shutdown). */
void worker_drain(Worker *w);

/* Jobs submitted whose done() has not run yet. */
unsigned worker_pending(const Worker *w);

/*
 * When the job now running started (CLOCK_MONOTONIC ns), 0 when the
 * thread waits for work: for the watchdog, with model_run_progress().
 */
uint64_t worker_busy_since(Worker *w);
