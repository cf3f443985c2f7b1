/*
 * manager.h: the daemon as a whole, and the story of its life.
 *
 *   manager_new()      settings in, nothing opened yet
 *   manager_startup()  event loop, signals, model, tokenizer, KV plan,
 *                      threads, listening socket; then READY=1
 *   manager_run()      sd_event_loop() until SIGTERM/SIGINT
 *   manager_shutdown() STOPPING=1; stop accepting; every request in flight
 *                      ends with Done(CANCELLED) or Error(SHUTTING_DOWN);
 *                      queued replies are flushed (briefly); connections close
 *   manager_free()
 *
 * The manager owns what every part shares: the model, the tokenizer, the
 * chat template, the thread pool, the worker thread (worker.h), the one
 * ModelRun (activation scratch: all model work runs on the worker, one
 * job at a time, so requests share it; each request owns its KvCache and
 * Sampler), the list of connections and the scheduler.
 *
 * The watchdog (WatchdogSec=): WATCHDOG=1 is sent every quarter of the
 * period while the worker is idle or its model evaluation advances
 * (model_run_progress()), or its job started less than half a period
 * ago; a worker stuck in one place stops the pings and systemd restarts
 * the daemon, a busy one keeps them coming.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "daemon/config.h"
#include "daemon/bounds.h"
#include "engine/kv/kvtype.h"
#include "engine/model/model.h"
#include "engine/text/chat.h"
#include "engine/text/tokenizer.h"
#include "kernels/cpu/threadpool.h"

typedef struct Connection Connection;
typedef struct Listener Listener;
typedef struct Scheduler Scheduler;
typedef struct Sessions Sessions;
typedef struct Worker Worker;

typedef struct Manager {
	const Config *config;   /* borrowed */
	sd_event *event;
	Listener *listener;
	Scheduler *scheduler;
	Sessions *sessions;     /* named sessions (sessions.h) */
	struct PrefixCache *prefixes; /* anonymous requests' caches per uid (prefixcache.h) */
	Worker *worker;         /* model work, off the loop (worker.h) */
	Worker *io_worker;      /* session file saves, off the loop */
	sd_event_source *watchdog;
	sd_event_source *sweep;  /* every second: connection timeouts (bounds.h) */
	uint64_t watchdog_usec;
	uint64_t watchdog_progress; /* model_run_progress() at the last tick */

	Backend *backend;       /* where the model runs (--device) */
	Model *model;
	Tokenizer *tokenizer;
	ChatTemplate chat_template;
	char *default_system;   /* the template's default system prompt, or NULL */
	const char *kv_spec;    /* the spec in use: config's, or the built-in default for the device */
	KvPlan *kv_plan;        /* the --kv spec for the model (model_kvcache_new) */
	double kv_bits_per_value;
	ThreadPool *threads;
	ModelRun *run;          /* shared activation scratch, see above */
	int64_t n_ctx;
	size_t max_piece_bytes; /* longest token text: bytes / this bounds a text's tokens from below */
	char model_name[256];
	char fingerprint[17];   /* gguf_fingerprint() of the model, hex */
	const char *device_name; /* backend_name(backend) */

	Connection *connections; /* doubly linked, newest first */
	unsigned n_connections;
	unsigned n_dead;         /* connections marked dead, not yet freed: manager_gc() has work */
	uint64_t next_connection_id;

	uint64_t start_ns;
	uint64_t tokens_generated;
	bool stopping;
} Manager;

int manager_new(const Config *config, Manager **ret);
Manager *manager_free(Manager *m);
DEFINE_FREEP(Manager, manager_free)

/* Everything up to READY=1. Returns 0 or a negative errno (logged). */
int manager_startup(Manager *m);
/* The event loop; returns when a signal asked us to stop. */
int manager_run(Manager *m);
/* Cancel and tell everyone, then let the replies drain. */
void manager_shutdown(Manager *m);

/* Free connections marked dead (called after each event that may have killed some). */
void manager_gc(Manager *m);

/* Milliseconds since start. */
uint64_t manager_uptime_ms(const Manager *m);
