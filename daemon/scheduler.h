/*
 * scheduler.h: who gets the model next.
 *
 * Work runs in rounds, one per event-loop iteration, from a defer event
 * source at idle priority, so socket I/O (higher priority) is always
 * handled between two rounds. A round:
 *
 *   1. admits queued requests while fewer than MANAGER_MAX_ACTIVE_REQUESTS
 *      hold a KV cache: connections take turns (round-robin), oldest
 *      request first within one, so a client with eight requests does
 *      not push another client's one request back eight places;
 *   2. decodes one token for every active request in DECODE at once, in
 *      one model_eval_batch() (the weights are read once per round, not
 *      once per request); sampling, streaming and stop strings stay per
 *      request;
 *   3. runs one prefill chunk of one request in PREFILL (those take
 *      turns). With nobody decoding the chunk is MANAGER_PREFILL_CHUNK
 *      tokens; next to decoders it is sized to take about as long as the
 *      decode round did (at least SCHEDULER_PREFILL_MIN tokens), so a
 *      long prompt slows the decoders to no less than about half speed,
 *      and they cannot starve it either.
 *
 * Requests of a connection that is behind on reading (connection_writable()
 * false) are skipped until it catches up (backpressure, connection.h).
 * A round costs O(active requests) besides the model work: the scheduler
 * keeps the active requests and the connections with queued requests
 * itself and never walks the connection list.
 *
 * A manager may run without a scheduler (Manager.scheduler NULL: no
 * model, as tests/fuzz/fuzz-daemon.c drives connections): then every
 * function below that takes one is a no-op, requests stay queued and
 * the counts are 0.
 */
#pragma once

#include "daemon/manager.h"

typedef struct Request Request;

#define SCHEDULER_PREFILL_MIN 16 /* prompt tokens per chunk next to decoders, at least */

int scheduler_new(Manager *m, Scheduler **ret);
Scheduler *scheduler_free(Scheduler *s);

/* There may be work: make sure a round runs soon. */
void scheduler_wake(Scheduler *s);

/* A new request (QUEUED) of r->conn waits for a slot. */
void scheduler_add(Scheduler *s, Request *r);
/* r is about to be freed (finished, cancelled): forget it, free its slot. */
void scheduler_remove(Scheduler *s, Request *r);

/* c is going away with its requests: forget them and c. */
void scheduler_forget(Scheduler *s, Connection *c);

/* Counts for StatusReply. */
unsigned scheduler_n_active(const Scheduler *s);
unsigned scheduler_n_queued(const Scheduler *s);
