/*
 * manager.c: the daemon's startup and shutdown story (see manager.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/connection.h"
#include "daemon/listener.h"
#include "daemon/log.h"
#include "daemon/manager.h"
#include "daemon/prefixcache.h"
#include "daemon/prefixspill.h"
#include "daemon/scheduler.h"
#include "daemon/sessions.h"
#include "daemon/worker.h"
#include "engine/kv/kvstore.h"
#include "ipc/utf8.h"

#define MANAGER_SHUTDOWN_FLUSH_USEC (2 * 1000 * 1000ull) /* how long replies may take to drain */

int manager_new(const Config *config, Manager **ret)
{
	Manager *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->config = config;
	m->start_ns = now_ns();
	*ret = m;
	return 0;
}

Manager *manager_free(Manager *m)
{
	if (!m)
		return NULL;
	m->worker = worker_free(m->worker); /* finishes the job in flight while its requests exist */
	m->io_worker = worker_free(m->io_worker); /* and the saves, while their sessions exist */
	sd_event_source_disable_unref(m->watchdog);
	sd_event_source_disable_unref(m->sweep);
	while (m->connections)
		connection_free(m->connections);
	prefixcache_spill_all(m->prefixes); /* what the requests gave back last; needs the sessions' folders */
	m->prefixes = prefixcache_free(m->prefixes);
	m->sessions = sessions_free(m->sessions); /* after the requests gave their sessions back */
	m->scheduler = scheduler_free(m->scheduler);
	m->listener = listener_free(m->listener);
	model_run_free(m->run);
	threadpool_free(m->threads);
	kvplan_free(m->kv_plan);
	free(m->default_system);
	tokenizer_free(m->tokenizer);
	model_free(m->model);
	backend_free(m->backend); /* after everything that holds its memory */
	sd_event_unref(m->event);
	free(m);
	return NULL;
}

uint64_t manager_uptime_ms(const Manager *m)
{
	return (now_ns() - m->start_ns) / 1000000;
}

void manager_gc(Manager *m)
{
	Connection *c = m->n_dead > 0 ? m->connections : NULL;
	while (c) {
		Connection *next = c->next;
		if (c->dead) {
			log_debug("client %llu gone", (unsigned long long)c->id);
			connection_free(c);
		}
		c = next;
	}
	if (m->stopping && !m->connections)
		(void)sd_event_exit(m->event, 0);
}

static int manager_on_flush_timeout(sd_event_source *s, uint64_t usec, void *userdata)
{
	Manager *m = userdata;
	log_warning("%u clients did not read their last replies in time; closing them", m->n_connections);
	return sd_event_exit(m->event, 0);
}

/*
 * SIGTERM/SIGINT: stop accepting, end every request with a final message,
 * and exit once the replies are written (or after a short grace period).
 * A second signal exits at once.
 */
static int manager_on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata)
{
	Manager *m = userdata;

	if (m->stopping)
		return sd_event_exit(m->event, 0);
	log_info("received %s; stopping", strsignal((int)si->ssi_signo));
	m->stopping = true;
	(void)sd_notify(false, "STOPPING=1\nSTATUS=Stopping: cancelling requests in flight");
	listener_stop(m->listener);
	for (Connection *c = m->connections; c; c = c->next)
		connection_shutdown(c);
	(void)sd_event_add_time_relative(m->event, NULL, CLOCK_MONOTONIC, MANAGER_SHUTDOWN_FLUSH_USEC, 0,
					 manager_on_flush_timeout, m);
	manager_gc(m);
	return 0;
}

/* SIGUSR1: one line of state in the log. */
static int manager_on_usr1(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata)
{
	Manager *m = userdata;
	log_info("status: %u connections, %u requests active, %u queued, %u sessions in memory (%llu bytes), "
		 "%llu tokens generated, up %llu s", m->n_connections, scheduler_n_active(m->scheduler),
		 scheduler_n_queued(m->scheduler), sessions_n_in_memory(m->sessions),
		 (unsigned long long)sessions_memory_bytes(m->sessions), (unsigned long long)m->tokens_generated,
		 (unsigned long long)(manager_uptime_ms(m) / 1000));
	return 0;
}

/* SIGUSR2: save every dirty session now (a checkpoint before a backup, say). */
static int manager_on_usr2(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata)
{
	Manager *m = userdata;
	log_info("received SIGUSR2; saving sessions");
	sessions_save_all_async(m->sessions);
	return 0;
}

/*
 * Signals: SIGTERM, SIGINT and SIGHUP stop the daemon cleanly (sessions
 * saved, the socket file removed); SIGUSR1 logs a status line, SIGUSR2
 * saves sessions; SIGPIPE is ignored (a client or a stderr pipe that went
 * away is an error return, not our death). All are taken through the
 * event loop (signalfd), blocked in every thread.
 */
static int manager_setup_events(Manager *m)
{
	static const int stop[] = { SIGTERM, SIGINT, SIGHUP };
	sigset_t mask;
	int r;

	if ((r = sd_event_default(&m->event)) < 0)
		return log_error_errno(r, "cannot create the event loop: %m");
	if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
		return log_error_errno(-errno, "cannot ignore SIGPIPE: %m");
	sigemptyset(&mask);
	for (size_t i = 0; i < ARRAY_SIZE(stop); i++)
		sigaddset(&mask, stop[i]);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGUSR2);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
		return log_error_errno(-errno, "cannot block signals: %m");
	for (size_t i = 0; i < ARRAY_SIZE(stop); i++)
		if ((r = sd_event_add_signal(m->event, NULL, stop[i], manager_on_signal, m)) < 0)
			return log_error_errno(r, "cannot watch signals: %m");
	if ((r = sd_event_add_signal(m->event, NULL, SIGUSR1, manager_on_usr1, m)) < 0 ||
	    (r = sd_event_add_signal(m->event, NULL, SIGUSR2, manager_on_usr2, m)) < 0)
		return log_error_errno(r, "cannot watch signals: %m");
	return 0;
}

/* WATCHDOG=1 only while the worker is idle or makes progress (manager.h). */
static int manager_on_watchdog(sd_event_source *s, uint64_t usec, void *userdata)
{
	Manager *m = userdata;
	uint64_t since = worker_busy_since(m->worker), progress = m->run ? model_run_progress(m->run) : 0;
	uint64_t io_since = worker_busy_since(m->io_worker);
	bool alive = since == 0 || progress != m->watchdog_progress ||
		     now_ns() - since < m->watchdog_usec * 1000 / 2;
	/* a save may take long on a slow disk; one that never ends is stuck */
	if (io_since && now_ns() - io_since > (uint64_t)MANAGER_IO_STUCK_S * 1000000000ull)
		alive = false;
	m->watchdog_progress = progress;
	if (alive)
		(void)sd_notify(false, "WATCHDOG=1");
	else
		log_warning("the worker has made no progress for %.1f s; not feeding the watchdog",
			    (now_ns() - since) / 1e9);
	(void)sd_event_source_set_time_relative(s, m->watchdog_usec / 4);
	return 0;
}

/* Every second: Hello, idle and close timeouts of every connection. */
static int manager_on_sweep(sd_event_source *s, uint64_t usec, void *userdata)
{
	Manager *m = userdata;
	uint64_t now = now_ns();
	for (Connection *c = m->connections; c; c = c->next)
		connection_check_timeouts(c, now);
	manager_gc(m);
	(void)sd_event_source_set_time_relative(s, 1000 * 1000);
	return 0;
}

/*
 * Descriptors: the soft RLIMIT_NOFILE up to the hard one (clients and
 * their attachments need them; bounds.h says what happens when they run
 * out anyway), and the sweep of connection timeouts.
 */
static int manager_setup_limits(Manager *m)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rlim_t want = rl.rlim_max == RLIM_INFINITY ? 65536 : rl.rlim_max;
		rl.rlim_cur = MAX(rl.rlim_cur, want);
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			log_warning("cannot raise the descriptor limit to %llu: %m", (unsigned long long)rl.rlim_cur);
	}
	int r = sd_event_add_time_relative(m->event, &m->sweep, CLOCK_MONOTONIC, 1000 * 1000, 0, manager_on_sweep, m);
	if (r < 0)
		return log_error_errno(r, "cannot set up the connection timeouts: %m");
	(void)sd_event_source_set_enabled(m->sweep, SD_EVENT_ON);
	(void)sd_event_source_set_description(m->sweep, "timeouts");
	return 0;
}

static int manager_setup_watchdog(Manager *m)
{
	uint64_t usec = 0;
	int r = sd_watchdog_enabled(false, &usec);
	if (r < 0)
		return log_error_errno(r, "cannot read WATCHDOG_USEC: %m");
	if (r == 0 || usec == 0)
		return 0;
	m->watchdog_usec = usec;
	r = sd_event_add_time_relative(m->event, &m->watchdog, CLOCK_MONOTONIC, usec / 4, 0, manager_on_watchdog, m);
	if (r < 0)
		return log_error_errno(r, "cannot set up the watchdog: %m");
	(void)sd_event_source_set_enabled(m->watchdog, SD_EVENT_ON);
	(void)sd_event_source_set_description(m->watchdog, "watchdog");
	log_info("watchdog enabled");
	return 0;
}

/* --device: auto says on which device it settled, and why not the GPU. */
static int manager_open_backend(Manager *m)
{
	const Config *cfg = m->config;
	char why_not_gpu[256];
	Error err = { 0 };
	int r = backend_open(cfg->device, &m->backend, why_not_gpu, sizeof(why_not_gpu), &err);
	if (r != 0) {
		log_error("--device %s: %s", device_choice_name(cfg->device), err.msg);
		return r < 0 ? r : -EINVAL;
	}
	m->device_name = backend_name(m->backend);
	if (cfg->device == DEVICE_AUTO && why_not_gpu[0])
		log_info("--device auto: running on the CPU (%s)", why_not_gpu);
	return 0;
}

static int manager_load_model(Manager *m)
{
	const Config *cfg = m->config;
	Error err = { 0 };
	GgufStr name;
	int r;

	(void)sd_notifyf(false, "STATUS=Loading model %s", cfg->model_path);
	r = model_load_on(cfg->model_path, m->backend, &m->model, &err);
	if (r != 0) {
		log_error("cannot load model %s on %s: %s", cfg->model_path, m->device_name,
			  err.msg[0] ? err.msg : strerror(-r));
		if (r == -ENOENT)
			log_error("run scripts/setup.sh to fetch the default model, or pass --model");
		return r < 0 ? r : -EINVAL;
	}
	if ((r = tokenizer_new_from_gguf(m->model->gguf, &m->tokenizer, &err)) != 0) {
		log_error("model %s: tokenizer: %s", cfg->model_path, err.msg[0] ? err.msg : strerror(-r));
		return r < 0 ? r : -EINVAL;
	}
	if (chat_template_from_gguf(m->model->gguf, &m->chat_template, &err) != 0) {
		log_warning("model %s: %s; chat messages will be concatenated without a template",
			    cfg->model_path, err.msg);
		m->chat_template = CHAT_TEMPLATE_RAW;
	}
	m->default_system = chat_default_system_from_gguf(m->model->gguf);

	if (gguf_get_str(m->model->gguf, "general.name", &name) == 0 && name.len > 0)
		snprintf(m->model_name, sizeof(m->model_name), "%.*s", (int)MIN(name.len, 255), name.ptr);
	else {
		const char *base = strrchr(cfg->model_path, '/');
		snprintf(m->model_name, sizeof(m->model_name), "%s", base ? base + 1 : cfg->model_path);
	}
	/* Clients get it as a protobuf string: cut it before any invalid (or truncated) UTF-8. */
	size_t bad;
	if (!utf8_validate(m->model_name, strlen(m->model_name), &bad))
		m->model_name[bad] = 0;
	/* Metadata and tensor table, not the weights: session files are checked against it. */
	snprintf(m->fingerprint, sizeof(m->fingerprint), "%016llx",
		 (unsigned long long)gguf_fingerprint(m->model->gguf));

	/* bytes / max_piece_bytes is a lower bound on a text's token count. */
	m->max_piece_bytes = 1;
	for (int32_t id = 0; id < tokenizer_n_vocab(m->tokenizer); id++) {
		size_t len;
		tokenizer_piece(m->tokenizer, id, &len);
		m->max_piece_bytes = MAX(m->max_piece_bytes, len);
	}

	m->n_ctx = cfg->ctx ? cfg->ctx : MIN(m->model->cfg.n_ctx_train, 8192);
	if (m->n_ctx > m->model->cfg.n_ctx_train)
		log_warning("--ctx %lld is more than the %d tokens the model was trained for",
			    (long long)m->n_ctx, m->model->cfg.n_ctx_train);
	return 0;
}

/* Last-token logits of a few fixed tokens on m with a fresh f32 cache into logits; 0 or an error. */
static int probe_logits(const Model *model, const int32_t *tokens, int n, float *logits, Error *err)
{
	_cleanup_(kvcache_freep) KvCache *kv = NULL;
	_cleanup_(model_run_freep) ModelRun *run = NULL;
	int r;
	if ((r = model_kvcache_new(model, NULL, 0, n, &kv, err)) != 0)
		return r;
	if ((r = model_run_new(model, n, NULL, &run)) != 0)
		return error_set(err, r, "cannot allocate activations");
	if ((r = model_eval(model, run, kv, tokens, n, logits, NULL)) != 0)
		return error_set(err, r, "evaluation failed: %s", backend_last_error(model->backend));
	return 0;
}

/*
 * A GPU backend must agree with the CPU before it serves: a few tokens
 * through both, the last logits compared by model_logits_agree(). On
 * disagreement `auto` goes on with the CPU model just loaded and `cuda`
 * refuses to start: a wrong answer is worse than a slow one. Costs one
 * CPU forward pass of 8 tokens at start-up.
 */
static int manager_check_backend(Manager *m)
{
	if (backend_is_host(m->backend))
		return 0;
	const Config *cfg = m->config;
	_cleanup_(model_freep) Model *cpu = NULL;
	Error err = { 0 };
	int r = model_load(cfg->model_path, &cpu, &err);
	if (r != 0)
		return log_error_errno(r < 0 ? r : -EINVAL, "cannot load %s on the CPU for the device check: %s",
				       cfg->model_path, err.msg);
	int n_vocab = cpu->cfg.n_vocab;
	int32_t tokens[8];
	for (int i = 0; i < 8; i++)
		tokens[i] = (int32_t)((1 + 7919 * i) % n_vocab);
	_cleanup_(freep) float *ref = malloc_array(n_vocab, sizeof(float));
	_cleanup_(freep) float *got = malloc_array(n_vocab, sizeof(float));
	if (!ref || !got)
		return log_error_errno(-ENOMEM, "device check: out of memory");
	if ((r = probe_logits(cpu, tokens, 8, ref, &err)) != 0)
		return log_error_errno(r < 0 ? r : -EINVAL, "device check: the CPU pass failed: %s", err.msg);
	int rg = probe_logits(m->model, tokens, 8, got, &err);
	LogitsDiff d = rg == 0 ? model_logits_diff(got, ref, n_vocab) : (LogitsDiff){ .max_rel = INFINITY };
	if (rg == 0 && model_logits_agree(&d)) {
		log_info("%s agrees with the CPU (logits max rel %.4f, mean rel %.5f)", m->device_name, d.max_rel,
			 d.mean_rel);
		return 0;
	}
	if (rg != 0)
		log_error("device check: the %s pass failed: %s", m->device_name, err.msg);
	else
		log_error("device check: %s disagrees with the CPU (logits max rel %.4f, mean rel %.5f, top-1 %d "
			  "against %d)", m->device_name, d.max_rel, d.mean_rel, d.top_got, d.top_ref);
	if (cfg->device == DEVICE_CUDA)
		return -EIO;
	log_warning("--device auto: running on the CPU instead");
	model_free(m->model);
	m->model = TAKE_PTR(cpu);
	m->backend = backend_free(m->backend);
	m->backend = backend_cpu();
	m->device_name = backend_name(m->backend);
	return 0;
}

/* The KV type's plan: f32 everywhere is the exact f32 cache, anything else the store (kvcache_new_host). */
static int manager_setup_kv(Manager *m)
{
	const ModelConfig *mc = &m->model->cfg;
	_cleanup_(kvplan_freep) KvPlan *plan = NULL;
	Error err = { 0 };
	int r;

	/*
	 * A preset (--kv small, or no --kv: default) is its spec, or its GPU
	 * spec on a GPU (the GPU kernels lack pk and centered keys so far);
	 * the spec in use is what the daemon reports and saves.
	 */
	const KvPreset *preset = kvspec_preset(m->config->kv_spec_default ? "default" : m->config->kv_spec);
	m->kv_spec = m->config->kv_spec;
	if (preset)
		m->kv_spec = backend_is_host(m->backend) ? preset->spec : preset->spec_gpu;
	if (preset && !m->config->kv_spec_default)
		log_info("--kv %s: %s", preset->name, m->kv_spec);
	r = kvplan_from_text(m->kv_spec, mc->n_layers, mc->n_kv_heads, mc->head_dim, &plan, &err);
	if (r != 0) {
		log_error("--kv %s: %s", m->kv_spec, err.msg[0] ? err.msg : strerror(-r));
		return r < 0 ? r : -EINVAL;
	}
	m->kv_bits_per_value = kvplan_bits_per_value(plan);

	/*
	 * Try the plan once now, so a spec the store (or the GPU) cannot hold
	 * fails at startup, not per request.
	 */
	KvCache *probe = NULL;
	r = model_kvcache_new(m->model, plan, 0, KV_BLOCK_TOKENS, &probe, &err);
	if (r != 0) {
		log_error("--kv %s: %s", m->kv_spec, err.msg[0] ? err.msg : strerror(r < 0 ? -r : EINVAL));
		return r < 0 ? r : -EINVAL;
	}
	kvcache_free(probe);
	m->kv_plan = TAKE_PTR(plan);
	return 0;
}

int manager_startup(Manager *m)
{
	const Config *cfg = m->config;
	int r;

	if ((r = manager_setup_events(m)) < 0 || (r = manager_open_backend(m)) < 0 ||
	    (r = manager_load_model(m)) < 0 || (r = manager_check_backend(m)) < 0 ||
	    (r = manager_setup_kv(m)) < 0)
		return r;
	if ((r = threadpool_new(cfg->threads, &m->threads)) < 0)
		return log_error_errno(r, "cannot start %d threads: %m", cfg->threads);
	if ((r = model_run_new(m->model, MANAGER_PREFILL_CHUNK, m->threads, &m->run)) != 0)
		return log_error_errno(r < 0 ? r : -ENOMEM, "cannot allocate activations: %m");
	if ((r = worker_new(m->event, &m->worker)) < 0 || (r = worker_new(m->event, &m->io_worker)) < 0)
		return log_error_errno(r, "cannot start the worker threads: %m");
	if ((r = manager_setup_watchdog(m)) < 0 || (r = manager_setup_limits(m)) < 0)
		return r;
	if ((r = scheduler_new(m, &m->scheduler)) < 0)
		return log_error_errno(r, "cannot set up the scheduler: %m");
	if ((r = prefixcache_new(cfg->prefix_cache, &m->prefixes)) < 0)
		return log_error_errno(r, "out of memory");
	if ((r = sessions_new(m, &m->sessions)) < 0)
		return r;
	prefixspill_attach(m);
	if ((r = listener_new(m, cfg->socket_path, &m->listener)) < 0)
		return r;

	char desc[256];
	model_describe(m->model, desc, sizeof(desc));
	log_info("model %s (%s), kv %s, context %lld, %d threads on %s", m->model_name, desc, m->kv_spec,
		 (long long)m->n_ctx, cfg->threads, m->device_name);
	(void)sd_notifyf(false, "READY=1\nSTATUS=Serving %s (kv %s, context %lld)", m->model_name, m->kv_spec,
			 (long long)m->n_ctx);
	return 0;
}

int manager_run(Manager *m)
{
	int r = sd_event_loop(m->event);
	if (r < 0)
		return log_error_errno(r, "event loop failed: %m");
	return 0;
}

void manager_shutdown(Manager *m)
{
	if (!m->stopping)
		(void)sd_notify(false, "STOPPING=1");
	(void)sd_notify(false, "STATUS=Stopped");
	worker_drain(m->worker); /* the job in flight gives its sessions back */
	prefixcache_spill_all(m->prefixes); /* written now, on this thread, as the sessions are */
	worker_drain(m->io_worker);
	sessions_save_all(m->sessions);
}
