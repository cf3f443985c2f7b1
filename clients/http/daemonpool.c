/*
 * daemonpool.c: turbokv-http's idle daemon connections (daemonpool.h).
 *
 * A stack (most recently used on top, so that a sequential client keeps
 * using one connection and the others age out) under one mutex; a
 * connection is never used by two threads at once: take removes it.
 * Expiry is checked at take and give, so there is no timer thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "base/util.h"
#include "clients/http/daemonpool.h"

#define DAEMONPOOL_MAX_IDLE 64u

typedef struct Idle {
	TkvClient *client;
	double since_s;  /* CLOCK_MONOTONIC when given back */
} Idle;

struct DaemonPool {
	const char *socket_path;
	const char *client_name;
	unsigned max_idle, max_idle_s;
	pthread_mutex_t lock;
	Idle idle[DAEMONPOOL_MAX_IDLE];  /* (n_idle,), oldest first */
	unsigned n_idle;                 /* under lock */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int daemonpool_new(const char *socket_path, const char *client_name, unsigned max_idle,
		   unsigned max_idle_s, DaemonPool **ret)
{
	DaemonPool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->socket_path = socket_path;
	p->client_name = client_name;
	p->max_idle = MIN(max_idle, DAEMONPOOL_MAX_IDLE);
	p->max_idle_s = max_idle_s;
	pthread_mutex_init(&p->lock, NULL);
	*ret = p;
	return 0;
}

DaemonPool *daemonpool_free(DaemonPool *p)
{
	if (!p)
		return NULL;
	for (unsigned i = 0; i < p->n_idle; i++)
		tkv_client_free(p->idle[i].client);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return NULL;
}

/* With p->lock held: move the connections idle too long (the oldest, at the bottom) to out. */
static unsigned pool_expire_locked(DaemonPool *p, double now, TkvClient **out)
{
	unsigned n = 0;
	while (n < p->n_idle && now - p->idle[n].since_s > p->max_idle_s) {
		out[n] = p->idle[n].client;
		n++;
	}
	for (unsigned i = n; i < p->n_idle; i++)
		p->idle[i - n] = p->idle[i];
	p->n_idle -= n;
	return n;
}

static void free_all(TkvClient **cs, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		tkv_client_free(cs[i]);
}

int daemonpool_connect(DaemonPool *p, TkvClient **ret_client, TkvError *err)
{
	return tkv_client_connect(p->socket_path, p->client_name, ret_client, err);
}

int daemonpool_take(DaemonPool *p, TkvClient **ret_client, bool *ret_reused, TkvError *err)
{
	TkvClient *expired[DAEMONPOOL_MAX_IDLE], *c = NULL;

	pthread_mutex_lock(&p->lock);
	unsigned n_expired = pool_expire_locked(p, now_s(), expired);
	if (p->n_idle > 0)
		c = p->idle[--p->n_idle].client;
	pthread_mutex_unlock(&p->lock);
	free_all(expired, n_expired); /* outside the lock: a close may take a moment */
	if (c) {
		*ret_client = c;
		*ret_reused = true;
		return 0;
	}
	int r = daemonpool_connect(p, &c, err);
	if (r != 0)
		return r;
	*ret_client = c;
	*ret_reused = false;
	return 0;
}

TkvClient *daemonpool_give(DaemonPool *p, TkvClient *c, bool reusable)
{
	TkvClient *expired[DAEMONPOOL_MAX_IDLE];
	unsigned n_expired = 0;

	if (!c)
		return NULL;
	if (reusable) {
		double now = now_s();
		pthread_mutex_lock(&p->lock);
		n_expired = pool_expire_locked(p, now, expired);
		if (p->n_idle < p->max_idle) {
			p->idle[p->n_idle++] = (Idle){ .client = c, .since_s = now };
			c = NULL;
		}
		pthread_mutex_unlock(&p->lock);
	}
	free_all(expired, n_expired);
	tkv_client_free(c);
	return NULL;
}

unsigned daemonpool_n_idle(DaemonPool *p)
{
	pthread_mutex_lock(&p->lock);
	unsigned n = p->n_idle;
	pthread_mutex_unlock(&p->lock);
	return n;
}
