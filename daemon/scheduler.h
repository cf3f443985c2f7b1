/*
 * scheduler.h: who gets the model next.
 *
 * One step of work runs per event-loop iteration, from a defer event
 * source at idle priority, so socket I/O (higher priority) is always
 * handled between two steps. A step is one prefill chunk
 * (MANAGER_PREFILL_CHUNK tokens) or one decode token of one request.
 *
 * Fairness: connections take turns (round-robin in list order), and
 * within a connection its active requests take turns, so a client with
 * eight requests does not slow another client's one request down eight
 * times. At most MANAGER_MAX_ACTIVE_REQUESTS requests hold a KV cache at
 * once; the others wait queued and are admitted round-robin between
 * connections, oldest first within one. Requests of a connection that is
 * behind on reading (connection_writable() false) are skipped.
 */
#pragma once

#include "manager.h"

int scheduler_new(Manager *m, Scheduler **ret);
Scheduler *scheduler_free(Scheduler *s);

/* There may be work: make sure a step runs soon. */
void scheduler_wake(Scheduler *s);

/* c is going away: forget any pointer to it. */
void scheduler_forget(Scheduler *s, Connection *c);

/* Counts for StatusReply. */
unsigned scheduler_n_active(const Scheduler *s);
unsigned scheduler_n_queued(const Scheduler *s);
