/*
 * scheduler.c: rounds of model work, fairly shared (see scheduler.h).
 *
 * Requests live in their connections; the scheduler holds pointers: the
 * active requests (a KV cache each, admission order) and a ring of the
 * connections that have queued requests, taking turns for free slots.
 * Nothing in a round walks the connection list: a round costs
 * O(active requests) besides the model work.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/connection.h"
#include "daemon/log.h"
#include "daemon/request.h"
#include "daemon/prefixcache.h"
#include "daemon/scheduler.h"
#include "daemon/sessions.h"
#include "daemon/worker.h"

/* The one job in flight: a decode batch (Scheduler.batch..logits) and a prefill chunk. */
typedef struct SchedulerJob {
	WorkerJob job;
	struct Scheduler *s;
	int n_eval;                   /* requests in the decode batch */
	int k_batch;                  /* model_eval_batch()'s return */
	uint64_t decode_ns;
	Request *prefill;             /* NULL: no prefill in this job */
	KvCache *prefill_kv;
	const int32_t *prefill_tokens; /* (n_prefill,) */
	size_t n_prefill;
	float *prefill_logits;        /* (n_vocab,) the request's */
	int k_prefill;                /* model_eval()'s return */
	uint64_t prefill_ns;
} SchedulerJob;

struct Scheduler {
	Manager *manager;
	sd_event_source *defer;
	bool woken;       /* scheduler_wake() since the round started */
	bool job_running; /* job is with the worker */
	SchedulerJob job;
	Request *orphans[MANAGER_MAX_ACTIVE_REQUESTS]; /* left their connection during the job: freed after it */
	unsigned n_orphans;

	Request *active[MANAGER_MAX_ACTIVE_REQUESTS]; /* PREFILL or DECODE, admission order */
	unsigned n_active;
	unsigned n_queued;
	size_t prefill_rr; /* index in active[] where the next prefill turn starts */

	/* Connections with queued requests, each once, in turn order (a ring buffer). */
	Connection *waiting[MANAGER_MAX_CONNECTIONS];
	unsigned wait_head, n_waiting;

	/* One decode round: the requests, their caches, tokens and logits (MAX_ACTIVE, n_vocab). */
	Request *batch[MANAGER_MAX_ACTIVE_REQUESTS];
	KvCache *kvs[MANAGER_MAX_ACTIVE_REQUESTS];
	int32_t tokens[MANAGER_MAX_ACTIVE_REQUESTS];
	int status[MANAGER_MAX_ACTIVE_REQUESTS]; /* model_eval_batch()'s, per request */
	float *logits;

	/* For sizing prefill chunks next to decoders (see scheduler.h). */
	uint64_t decode_round_ns;    /* the last decode round */
	uint64_t prefill_ns_per_tok; /* running estimate, 0 until a chunk ran */
};

unsigned scheduler_n_active(const Scheduler *s)
{
	return s ? s->n_active : 0;
}

unsigned scheduler_n_queued(const Scheduler *s)
{
	return s ? s->n_queued : 0;
}

static bool waiting_has(const Scheduler *s, const Connection *c)
{
	for (unsigned i = 0; i < s->n_waiting; i++)
		if (s->waiting[(s->wait_head + i) % MANAGER_MAX_CONNECTIONS] == c)
			return true;
	return false;
}

static void waiting_push(Scheduler *s, Connection *c)
{
	assert(s->n_waiting < MANAGER_MAX_CONNECTIONS);
	s->waiting[(s->wait_head + s->n_waiting++) % MANAGER_MAX_CONNECTIONS] = c;
}

static Connection *waiting_pop(Scheduler *s)
{
	Connection *c = s->waiting[s->wait_head];
	s->wait_head = (s->wait_head + 1) % MANAGER_MAX_CONNECTIONS;
	s->n_waiting--;
	return c;
}

static void waiting_remove(Scheduler *s, const Connection *c)
{
	unsigned n = s->n_waiting;
	for (unsigned i = 0; i < n; i++) {
		Connection *x = waiting_pop(s);
		if (x != c)
			waiting_push(s, x);
	}
}

/* c's oldest queued request, or NULL (a connection holds at most a handful). */
static Request *connection_oldest_queued(const Connection *c)
{
	for (size_t i = 0; i < c->n_requests; i++)
		if (c->requests[i]->state == REQUEST_QUEUED)
			return c->requests[i];
	return NULL;
}

/* Give free slots to queued requests, connections taking turns. */
static void scheduler_admit(Scheduler *s)
{
	Manager *m = s->manager;

	/*
	 * A request whose session is being saved waits (sessions_ready()), and
	 * one without a session while a spilled prefix cache of its uid loads
	 * (prefixcache_prepare() starts that); its connection keeps its turn.
	 */
	for (unsigned skipped = 0; s->n_active < MANAGER_MAX_ACTIVE_REQUESTS && s->n_waiting > skipped;) {
		Connection *c = waiting_pop(s);
		Request *r = c->dead ? NULL : connection_oldest_queued(c);
		if (!r)
			continue;
		if ((r->session && !sessions_ready(r->session)) ||
		    (!r->session && prefixcache_prepare(m->prefixes, r->uid, r->tokens, r->n_prompt))) {
			waiting_push(s, c);
			skipped++;
			continue;
		}
		s->n_queued--;
		int k = request_activate(r, m);
		if (k != 0) {
			log_error("cannot start request %llu of client %llu: %s", (unsigned long long)r->id,
				  (unsigned long long)c->id, k < 0 ? strerror(-k) : "KV cache setup failed");
			connection_send_error(c, r->id, PROTOCOL_E_INTERNAL, "cannot allocate the request's KV cache");
			connection_request_done(c, r);
		} else {
			s->active[s->n_active++] = r;
		}
		if (connection_oldest_queued(c))
			waiting_push(s, c);
	}
}

void scheduler_add(Scheduler *s, Request *r)
{
	assert(r->state == REQUEST_QUEUED);
	if (!s)
		return; /* no model (fuzz-daemon): the request stays queued */
	s->n_queued++;
	if (!waiting_has(s, r->conn))
		waiting_push(s, r->conn);
	scheduler_wake(s);
}

bool scheduler_remove(Scheduler *s, Request *r)
{
	if (!s)
		return false;
	if (r->state == REQUEST_QUEUED) {
		/* The ring may still name its connection: admission skips it then. */
		assert(s->n_queued > 0);
		s->n_queued--;
		return false;
	}
	for (unsigned i = 0; i < s->n_active; i++)
		if (s->active[i] == r) {
			memmove(s->active + i, s->active + i + 1, (s->n_active - i - 1) * sizeof(Request *));
			s->n_active--;
			if (s->prefill_rr > i)
				s->prefill_rr--;
			/* A slot is free: let the queue in. */
			scheduler_wake(s);
			break;
		}
	if (!r->in_job)
		return false;
	/* The worker still evaluates it: keep it (its cache, its buffers) until the job is back. */
	assert(s->n_orphans < MANAGER_MAX_ACTIVE_REQUESTS);
	r->orphaned = true;
	r->conn = NULL;
	s->orphans[s->n_orphans++] = r;
	return true;
}

/*
 * The decode part of the next job: one token for every decoding request
 * whose client keeps up. Requests whose cache is full finish here and
 * drop out. Returns how many go into the batch.
 */
static int scheduler_plan_decode(Scheduler *s)
{
	int n = 0;
	for (unsigned i = 0; i < s->n_active; i++) {
		Request *r = s->active[i];
		if (r->state == REQUEST_DECODE && connection_writable(r->conn))
			s->batch[n++] = r;
	}
	int n_eval = 0;
	for (int i = 0; i < n; i++) {
		Request *r = s->batch[i];
		if (request_decode_input(r, &s->tokens[n_eval]) != 0) {
			connection_request_done(r->conn, r);
			continue;
		}
		s->batch[n_eval] = r;
		s->kvs[n_eval++] = r->kv;
	}
	return n_eval;
}

/*
 * Prompt tokens for one prefill chunk: all of MANAGER_PREFILL_CHUNK when
 * nobody decodes; next to decoders about as long as their last round took
 * (at least SCHEDULER_PREFILL_MIN), so a long prompt neither stalls them
 * nor is starved by them.
 */
static size_t scheduler_prefill_budget(const Scheduler *s, bool decoders)
{
	if (!decoders)
		return MANAGER_PREFILL_CHUNK;
	if (s->prefill_ns_per_tok == 0)
		return SCHEDULER_PREFILL_MIN;
	uint64_t n = s->decode_round_ns / s->prefill_ns_per_tok;
	return (size_t)MAX((uint64_t)SCHEDULER_PREFILL_MIN, MIN(n, (uint64_t)MANAGER_PREFILL_CHUNK));
}

/* The prefill part of the next job: the next prefilling request (round-robin), or NULL. */
static Request *scheduler_plan_prefill(Scheduler *s)
{
	for (unsigned k = 0; k < s->n_active; k++) {
		size_t i = (s->prefill_rr + k) % s->n_active;
		if (s->active[i]->state == REQUEST_PREFILL && connection_writable(s->active[i]->conn)) {
			s->prefill_rr = i + 1;
			return s->active[i];
		}
	}
	return NULL;
}

/* On the worker thread: only the model, the batch's caches and buffers, the job's fields. */
static void scheduler_job_run(WorkerJob *wj)
{
	SchedulerJob *j = (SchedulerJob *)wj;
	Scheduler *s = j->s;
	const Manager *m = s->manager;

	if (j->n_eval > 0) {
		uint64_t t0 = now_ns();
		j->k_batch = model_eval_batch(m->model, m->run, s->kvs, s->tokens, j->n_eval, s->logits, s->status);
		j->decode_ns = now_ns() - t0;
	}
	if (j->n_prefill > 0) {
		uint64_t t0 = now_ns();
		j->k_prefill = model_eval(m->model, m->run, j->prefill_kv, j->prefill_tokens, (int64_t)j->n_prefill,
					  j->prefill_logits, NULL);
		j->prefill_ns = now_ns() - t0;
	}
}

/* Back on the loop: stream what the job computed, free requests that went away meanwhile. */
static void scheduler_job_done(WorkerJob *wj)
{
	SchedulerJob *j = (SchedulerJob *)wj;
	Scheduler *s = j->s;
	Manager *m = s->manager;
	size_t n_vocab = (size_t)m->model->cfg.n_vocab;

	s->job_running = false;
	for (int i = 0; i < j->n_eval; i++)
		s->batch[i]->in_job = false;
	if (j->prefill)
		j->prefill->in_job = false;

	if (j->n_eval > 0)
		s->decode_round_ns = j->decode_ns;
	for (int i = 0; i < j->n_eval; i++) {
		Request *r = s->batch[i];
		if (r->orphaned)
			continue;
		/* a failing cache fails its own request; the round's other requests go on */
		int e = j->k_batch ? j->k_batch : s->status[i];
		int done = e ? request_decode_fail(r, e)
			     : request_decode_output(r, m, s->logits + (size_t)i * n_vocab, j->decode_ns);
		if (done)
			connection_request_done(r->conn, r);
	}
	if (j->prefill && j->n_prefill > 0) {
		uint64_t per = j->prefill_ns / j->n_prefill;
		/* A short chunk costs more per token than a long one: lean on the newest. */
		s->prefill_ns_per_tok = s->prefill_ns_per_tok ? (s->prefill_ns_per_tok + per) / 2 : per;
		Request *r = j->prefill;
		if (!r->orphaned && request_prefill_output(r, m, j->n_prefill, j->k_prefill, j->prefill_ns))
			connection_request_done(r->conn, r);
	}
	/* Requests cancelled or disconnected while the job held them. */
	for (unsigned i = 0; i < s->n_orphans; i++)
		request_free(s->orphans[i]);
	s->n_orphans = 0;
	scheduler_wake(s);
	manager_gc(m);
}

/*
 * Plan one job: admit, a decode token for everyone decoding, one prefill
 * chunk; hand it to the worker. Returns whether there was any work.
 */
static bool scheduler_round(Scheduler *s)
{
	SchedulerJob *j = &s->job;

	scheduler_admit(s);
	*j = (SchedulerJob){ .job = { .run = scheduler_job_run, .done = scheduler_job_done }, .s = s };
	j->n_eval = scheduler_plan_decode(s);
	Request *r = scheduler_plan_prefill(s);
	if (r) {
		size_t n = MIN(scheduler_prefill_budget(s, j->n_eval > 0), r->n_prompt - r->n_prefilled);
		j->prefill = r;
		j->n_prefill = n;
		j->prefill_kv = r->kv;
		j->prefill_tokens = r->tokens + r->n_prefilled;
		j->prefill_logits = r->logits;
	}
	if (j->n_eval == 0 && !j->prefill)
		return false;
	for (int i = 0; i < j->n_eval; i++)
		s->batch[i]->in_job = true;
	if (r)
		r->in_job = true;
	s->job_running = true;
	worker_submit(s->manager->worker, &j->job);
	return true;
}

static int scheduler_on_defer(sd_event_source *source, void *userdata)
{
	Scheduler *s = userdata;
	s->woken = false;
	if (!s->job_running)
		(void)scheduler_round(s);
	/* One job at a time: its done() wakes us again; a wake during the round asks for another. */
	if (s->job_running || !s->woken)
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
	s->logits = malloc_array((size_t)MANAGER_MAX_ACTIVE_REQUESTS * (size_t)m->model->cfg.n_vocab,
				 sizeof(float));
	if (!s->logits) {
		free(s);
		return -ENOMEM;
	}
	r = sd_event_add_defer(m->event, &s->defer, scheduler_on_defer, s);
	if (r < 0) {
		free(s->logits);
		free(s);
		return r;
	}
	/* Below every I/O source: sockets are served between any two rounds. */
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
	assert(!s->job_running); /* the manager drains the worker first */
	sd_event_source_disable_unref(s->defer);
	free(s->logits);
	free(s);
	return NULL;
}

void scheduler_wake(Scheduler *s)
{
	if (!s)
		return;
	s->woken = true;
	if (s->defer)
		(void)sd_event_source_set_enabled(s->defer, SD_EVENT_ON);
}

void scheduler_forget(Scheduler *s, Connection *c)
{
	if (s)
		waiting_remove(s, c);
}
