/*
 * worker.c: one thread, a queue of jobs in, an outbox of finished jobs
 * out, an eventfd that wakes the loop (see worker.h).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/util.h"
#include "daemon/worker.h"

struct Worker {
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t wake;     /* the thread: work queued, or stop */
	pthread_cond_t finished; /* worker_drain(): a job reached the outbox */
	WorkerJob *queue, **queue_tail;   /* to run, guarded by lock */
	WorkerJob *outbox, **outbox_tail; /* run, done() not called yet, guarded by lock */
	bool stop;
	_Atomic uint64_t busy_since;
	unsigned pending;        /* loop thread only */
	int efd;
	sd_event_source *io;
};

static void *worker_main(void *userdata)
{
	Worker *w = userdata;

	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->queue && !w->stop)
			pthread_cond_wait(&w->wake, &w->lock);
		if (!w->queue)
			break; /* stop, and nothing left to run */
		WorkerJob *j = w->queue;
		w->queue = j->next;
		if (!w->queue)
			w->queue_tail = &w->queue;
		pthread_mutex_unlock(&w->lock);

		atomic_store(&w->busy_since, now_ns());
		j->run(j);
		atomic_store(&w->busy_since, 0);

		pthread_mutex_lock(&w->lock);
		j->next = NULL;
		*w->outbox_tail = j;
		w->outbox_tail = &j->next;
		pthread_cond_broadcast(&w->finished);
		uint64_t one = 1;
		(void)!write(w->efd, &one, sizeof(one)); /* cannot overflow: the loop reads it */
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* Call done() of every finished job, in order (loop thread). */
static void worker_dispatch(Worker *w)
{
	pthread_mutex_lock(&w->lock);
	WorkerJob *j = w->outbox;
	w->outbox = NULL;
	w->outbox_tail = &w->outbox;
	pthread_mutex_unlock(&w->lock);
	while (j) {
		WorkerJob *next = j->next;
		w->pending--;
		j->done(j); /* may free j */
		j = next;
	}
}

static int worker_on_event(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	Worker *w = userdata;
	uint64_t n;
	(void)!read(w->efd, &n, sizeof(n));
	worker_dispatch(w);
	return 0;
}

int worker_new(sd_event *e, Worker **ret)
{
	Worker *w = calloc(1, sizeof(*w));
	sigset_t all, old;
	int r;

	if (!w)
		return -ENOMEM;
	w->efd = -1;
	w->queue_tail = &w->queue;
	w->outbox_tail = &w->outbox;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->wake, NULL);
	pthread_cond_init(&w->finished, NULL);
	w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->efd < 0) {
		r = -errno;
		goto fail;
	}
	if ((r = sd_event_add_io(e, &w->io, w->efd, EPOLLIN, worker_on_event, w)) < 0)
		goto fail;
	(void)sd_event_source_set_description(w->io, "worker");
	/* Signals are the loop's (signalfd): the thread blocks them all. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	r = -pthread_create(&w->thread, NULL, worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0)
		goto fail;
	w->started = true;
	*ret = w;
	return 0;
fail:
	worker_free(w);
	return r;
}

void worker_drain(Worker *w)
{
	if (!w)
		return;
	while (w->pending > 0) {
		pthread_mutex_lock(&w->lock);
		while (!w->outbox)
			pthread_cond_wait(&w->finished, &w->lock);
		pthread_mutex_unlock(&w->lock);
		worker_dispatch(w);
	}
}

Worker *worker_free(Worker *w)
{
	if (!w)
		return NULL;
	if (w->started) {
		worker_drain(w);
		pthread_mutex_lock(&w->lock);
		w->stop = true;
		pthread_cond_signal(&w->wake);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
	}
	sd_event_source_disable_unref(w->io);
	safe_close(w->efd);
	pthread_cond_destroy(&w->finished);
	pthread_cond_destroy(&w->wake);
	pthread_mutex_destroy(&w->lock);
	free(w);
	return NULL;
}

void worker_submit(Worker *w, WorkerJob *j)
{
	j->next = NULL;
	w->pending++;
	pthread_mutex_lock(&w->lock);
	*w->queue_tail = j;
	w->queue_tail = &j->next;
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->lock);
}

unsigned worker_pending(const Worker *w)
{
	return w ? w->pending : 0;
}

uint64_t worker_busy_since(Worker *w)
{
	return w ? atomic_load(&w->busy_since) : 0;
}
