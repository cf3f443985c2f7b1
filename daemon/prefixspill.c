/*
 * prefixspill.c: the anonymous prefix caches' files (see prefixspill.h):
 * save and load jobs on the I/O worker, deletion and listing on the loop
 * (an unlink or a readdir of a small folder, as sessions.c does).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/prefixcache.h"
#include "daemon/prefixspill.h"
#include "daemon/scheduler.h"
#include "daemon/sessions.h"
#include "daemon/worker.h"

/* The memory the prefix caches may hold now: what the sessions leave of --session-memory. */
static uint64_t prefix_budget(Manager *m)
{
	uint64_t used = sessions_memory_bytes(m->sessions);
	return m->config->session_memory > used ? m->config->session_memory - used : 0;
}

typedef struct SpillJob {
	WorkerJob job;
	Manager *m;
	uid_t uid;
	char name[PREFIXCACHE_NAME_MAX];
	int dir_fd;
	SessionState st;        /* save: the cache and tokens (owned); load: the result */
	SessionState *loaded;
	int r;
	uint64_t bytes, t0;
	Error err;
} SpillJob;

static void save_run(WorkerJob *wj)
{
	SpillJob *j = (SpillJob *)wj;
	j->r = session_save_at(j->dir_fd, j->name, &j->st, sessions_expect(j->m->sessions)->fingerprint,
			       j->m->kv_spec, NULL, &j->bytes, &j->err);
}

static void save_done(WorkerJob *wj)
{
	SpillJob *j = (SpillJob *)wj;
	safe_close(j->dir_fd);
	kvcache_free(j->st.kv);
	free(j->st.tokens);
	if (j->r != 0)
		log_warning("uid %u: cannot spill a prefix cache of %zu tokens: %s; it is dropped", (unsigned)j->uid,
			    j->st.n_tokens, j->err.msg);
	else
		log_debug("uid %u: prefix cache of %zu tokens spilled to " PREFIXSPILL_DIR "/%s (%llu bytes) in %.1f ms",
			  (unsigned)j->uid, j->st.n_tokens, j->name, (unsigned long long)j->bytes,
			  (now_ns() - j->t0) / 1e6);
	prefixcache_saved(j->m->prefixes, j->uid, j->name, j->r, j->bytes);
	scheduler_wake(j->m->scheduler); /* a request may wait for this file to load it */
	free(j);
}

static void spill_save(void *userdata, uid_t uid, const char *name, KvCache *kv, int32_t *tokens, size_t n_tokens,
		       bool now)
{
	Manager *m = userdata;
	SpillJob *j = calloc(1, sizeof(*j));
	int fd = j ? sessions_dir_open(m->sessions, uid, PREFIXSPILL_DIR, true) : -ENOMEM;
	if (fd < 0) {
		log_warning("uid %u: cannot spill a prefix cache: %s", (unsigned)uid, strerror(-fd));
		kvcache_free(kv);
		free(tokens);
		free(j);
		prefixcache_saved(m->prefixes, uid, name, fd, 0);
		return;
	}
	*j = (SpillJob){ .job = { .run = save_run, .done = save_done }, .m = m, .uid = uid, .dir_fd = fd,
			 .st = { .kind = SESSION_KIND_RAW, .tokens = tokens, .n_tokens = n_tokens, .kv = kv },
			 .t0 = now_ns() };
	snprintf(j->name, sizeof(j->name), "%s", name);
	if (!now && m->io_worker) {
		worker_submit(m->io_worker, &j->job);
		return;
	}
	save_run(&j->job);
	save_done(&j->job);
}

static void load_run(WorkerJob *wj)
{
	SpillJob *j = (SpillJob *)wj;
	j->r = session_load_at(j->dir_fd, j->name, sessions_expect(j->m->sessions), &j->loaded, &j->err);
	if (j->r == 0 && (j->loaded->kind != SESSION_KIND_RAW || j->loaded->n_messages != 0 || !j->loaded->kv)) {
		j->r = SESSION_E_MESSAGES; /* a prefix file holds a raw conversation and its cache, nothing else */
		error_set(&j->err, SESSION_E_MESSAGES, "not a prefix cache (a conversation with messages)");
	}
}

static void load_done(WorkerJob *wj)
{
	SpillJob *j = (SpillJob *)wj;
	Manager *m = j->m;
	KvCache *kv = NULL;
	int32_t *tokens = NULL;
	size_t n = 0;
	int r = j->r;

	safe_close(j->dir_fd);
	if (r == 0) {
		Error e = { 0 };
		/* files hold host caches; a GPU daemon moves the cache to the device */
		if ((r = model_kvcache_adopt(m->model, j->loaded->kv, &kv, &e)) != 0) {
			log_warning("uid %u: prefix cache %s: %s", (unsigned)j->uid, j->name, e.msg);
			r = r < 0 ? r : -EIO;
		} else {
			j->loaded->kv = NULL; /* adopted: kv is the cache now (the same one on a CPU) */
			tokens = TAKE_PTR(j->loaded->tokens);
			n = j->loaded->n_tokens;
			log_info("uid %u: restored a prefix cache of %zu tokens in %.1f ms", (unsigned)j->uid, n,
				 (now_ns() - j->t0) / 1e6);
		}
	} else if (r > 0)
		log_warning("uid %u: prefix cache file %s/sessions/%u/" PREFIXSPILL_DIR "/%s cannot be loaded: %s (%s); "
			    "it is deleted and the prompt computed again", (unsigned)j->uid, m->config->state_dir,
			    (unsigned)j->uid, j->name, session_error_name(r), j->err.msg);
	else
		log_warning("uid %u: cannot read prefix cache file %s: %s", (unsigned)j->uid, j->name, j->err.msg);
	session_state_free(j->loaded);
	prefixcache_loaded(m->prefixes, j->uid, j->name, r, kv, tokens, n, prefix_budget(m));
	free(j);
	scheduler_wake(m->scheduler); /* the uid's requests waited for this */
}

static void spill_load(void *userdata, uid_t uid, const char *name)
{
	Manager *m = userdata;
	SpillJob *j = calloc(1, sizeof(*j));
	int fd = j ? sessions_dir_open(m->sessions, uid, PREFIXSPILL_DIR, false) : -ENOMEM;
	if (!j) {
		prefixcache_loaded(m->prefixes, uid, name, -ENOMEM, NULL, NULL, 0, 0);
		return;
	}
	*j = (SpillJob){ .job = { .run = load_run, .done = load_done }, .m = m, .uid = uid, .dir_fd = fd,
			 .t0 = now_ns() };
	snprintf(j->name, sizeof(j->name), "%s", name);
	if (fd < 0) {
		j->r = fd;
		error_set(&j->err, fd, "cannot open the folder: %s", strerror(-fd));
	} else if (m->io_worker) {
		worker_submit(m->io_worker, &j->job);
		return;
	} else
		load_run(&j->job);
	load_done(&j->job);
}

static void spill_remove(void *userdata, uid_t uid, const char *name)
{
	Manager *m = userdata;
	int fd = sessions_dir_open(m->sessions, uid, PREFIXSPILL_DIR, false);
	if (fd < 0)
		return;
	if (unlinkat(fd, name, 0) < 0 && errno != ENOENT)
		log_warning("uid %u: cannot delete prefix cache file %s: %m", (unsigned)uid, name);
	safe_close(fd);
}

static void spill_scan(void *userdata, uid_t uid)
{
	Manager *m = userdata;
	int fd = sessions_dir_open(m->sessions, uid, PREFIXSPILL_DIR, false);
	if (fd < 0)
		return;
	DIR *d = fdopendir(fd);
	if (!d) {
		safe_close(fd);
		return;
	}
	struct dirent *de;
	unsigned n = 0;
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		struct stat st;
		if (de->d_name[0] == '.')
			continue;
		if (len > 4 && strcmp(de->d_name + len - 4, ".tmp") == 0) {
			(void)unlinkat(dirfd(d), de->d_name, 0); /* a write that never finished */
			continue;
		}
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue;
		if (prefixcache_found(m->prefixes, uid, de->d_name, (uint64_t)st.st_size))
			n++;
		else
			log_debug("uid %u: " PREFIXSPILL_DIR "/%s is not a prefix cache file; left alone", (unsigned)uid,
				  de->d_name);
	}
	closedir(d);
	if (n)
		log_debug("uid %u: %u spilled prefix caches", (unsigned)uid, n);
}

void prefixspill_attach(Manager *m)
{
	const Config *cfg = m->config;
	const PrefixCacheIO io = { .userdata = m, .save = spill_save, .load = spill_load, .remove = spill_remove,
				   .scan = spill_scan };
	uint64_t disk = cfg->session_disk ? cfg->session_disk : SESSIONS_MAX_BYTES_PER_UID;
	if (!m->prefixes || cfg->prefix_spill == 0)
		return;
	prefixcache_set_io(m->prefixes, &io, cfg->prefix_spill, disk / 8);
}
