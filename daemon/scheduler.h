/*
 * scheduler.h: who gets the model next.
 *
 * Work runs in rounds. A round is planned on the event loop (from a
 * defer event source at idle priority) and its model work runs on the
 * worker thread (worker.h) as one job; when the job is back, its results
 * are streamed and the next round is planned. The loop stays free the
 * whole time: Hello, Status, Cancel and other clients' I/O are answered
 * while a prefill chunk or a decode round runs. A round:
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
/*
 * r leaves its connection (finished, cancelled, disconnected): forget it,
 * free its slot. Returns false: the caller frees r now; true: the job in
 * flight still uses r, so the scheduler keeps it (r->conn is set to NULL,
 * nothing more is sent for it) and frees it when the job is back.
 */
bool scheduler_remove(Scheduler *s, Request *r);

/* c is going away (its requests were removed one by one): forget c. */
void scheduler_forget(Scheduler *s, Connection *c);

/* Counts for StatusReply. */
unsigned scheduler_n_active(const Scheduler *s);
unsigned scheduler_n_queued(const Scheduler *s);
