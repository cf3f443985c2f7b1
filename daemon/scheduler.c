/*
 * scheduler.c: one step of model work per event-loop iteration, fairly
 * shared (see scheduler.h). Holds no requests itself: they live in their
 * connections; the scheduler holds the round-robin cursors.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "connection.h"
#include "log.h"
#include "request.h"
#include "scheduler.h"

struct Scheduler {
	Manager *manager;
	sd_event_source *defer;
	Connection *next_step;  /* connection whose turn it is to step */
	Connection *next_admit; /* connection whose turn it is to get a slot */
};

static unsigned count_state(const Manager *m, bool active)
{
	unsigned n = 0;
	for (const Connection *c = m->connections; c; c = c->next)
		for (size_t i = 0; i < c->n_requests; i++)
			n += (c->requests[i]->state != REQUEST_QUEUED) == active;
	return n;
}

unsigned scheduler_n_active(const Scheduler *s)
{
	return count_state(s->manager, true);
}

unsigned scheduler_n_queued(const Scheduler *s)
{
	return count_state(s->manager, false);
}

/* The connection after c in the ring (the list, wrapping around). */
static Connection *ring_next(Manager *m, Connection *c)
{
	return c && c->next ? c->next : m->connections;
}

/* Give free slots to queued requests, connections taking turns. */
static void scheduler_admit(Scheduler *s)
{
	Manager *m = s->manager;
	unsigned active = scheduler_n_active(s);

	while (active < MANAGER_MAX_ACTIVE_REQUESTS) {
		Connection *start = s->next_admit ? s->next_admit : m->connections, *c = start;
		Request *r = NULL;
		if (!c)
			return;
		do {
			for (size_t i = 0; !c->dead && i < c->n_requests && !r; i++)
				if (c->requests[i]->state == REQUEST_QUEUED)
					r = c->requests[i];
			if (!r)
				c = ring_next(m, c);
		} while (!r && c != start);
		if (!r)
			return;
		s->next_admit = ring_next(m, c);
		int k = request_activate(r, m);
		if (k != 0) {
			log_error("cannot start request %llu of client %llu: %s", (unsigned long long)r->id,
				  (unsigned long long)c->id, k < 0 ? strerror(-k) : "KV cache setup failed");
			connection_send_error(c, r->id, PROTOCOL_E_INTERNAL, "cannot allocate the request's KV cache");
			connection_request_done(c, r);
			continue;
		}
		active++;
	}
}

/* The next active request of c whose turn it is, or NULL. */
static Request *connection_next_runnable(Connection *c)
{
	if (!connection_writable(c))
		return NULL;
	for (size_t k = 0; k < c->n_requests; k++) {
		size_t i = (c->rr + k) % c->n_requests;
		if (c->requests[i]->state != REQUEST_QUEUED) {
			c->rr = (i + 1) % c->n_requests;
			return c->requests[i];
		}
	}
	return NULL;
}

/* One unit of work. Returns whether there was any. */
static bool scheduler_step(Scheduler *s)
{
	Manager *m = s->manager;
	Connection *start, *c;
	Request *r = NULL;

	scheduler_admit(s);
	start = s->next_step ? s->next_step : m->connections;
	if (!(c = start))
		return false;
	do {
		if ((r = connection_next_runnable(c)))
			break;
		c = ring_next(m, c);
	} while (c != start);
	if (!r)
		return false;
	s->next_step = ring_next(m, c);
	if (request_step(r, m) != 0)
		connection_request_done(c, r);
	return true;
}

static int scheduler_on_defer(sd_event_source *source, void *userdata)
{
	Scheduler *s = userdata;
	if (!scheduler_step(s))
		(void)sd_event_source_set_enabled(s->defer, SD_EVENT_OFF);
	manager_gc(s->manager);
	return 0;
}

int scheduler_new(Manager *m, Scheduler **ret)
{
	Scheduler *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->manager = m;
	r = sd_event_add_defer(m->event, &s->defer, scheduler_on_defer, s);
	if (r < 0) {
		free(s);
		return r;
	}
	/* Below every I/O source: sockets are served between any two steps. */
	(void)sd_event_source_set_priority(s->defer, SD_EVENT_PRIORITY_IDLE);
	(void)sd_event_source_set_description(s->defer, "scheduler");
	(void)sd_event_source_set_enabled(s->defer, SD_EVENT_OFF);
	*ret = s;
	return 0;
}

Scheduler *scheduler_free(Scheduler *s)
{
	if (!s)
		return NULL;
	sd_event_source_disable_unref(s->defer);
	free(s);
	return NULL;
}

void scheduler_wake(Scheduler *s)
{
	if (s && s->defer)
		(void)sd_event_source_set_enabled(s->defer, SD_EVENT_ON);
}

void scheduler_forget(Scheduler *s, Connection *c)
{
	if (s->next_step == c)
		s->next_step = c->next;
	if (s->next_admit == c)
		s->next_admit = c->next;
}
