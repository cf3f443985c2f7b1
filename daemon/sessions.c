/*
 * sessions.c: the daemon's session table, budget, spilling, saving,
 * restoring, quotas and quarantine (see sessions.h).
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/connection.h"
#include "daemon/log.h"
#include "daemon/scheduler.h"
#include "daemon/sessions.h"
#include "daemon/worker.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kvstore.h"

#define SESSION_FILE_SUFFIX ".tkvs"

struct Session {
	uid_t uid;
	char name[PROTOCOL_MAX_SESSION_NAME + 1];
	SessionState *state;    /* NULL: on disk only (or new and empty) */
	bool on_disk;           /* a file exists */
	bool busy;              /* a request holds it */
	bool dirty;             /* memory is newer than the file */
	bool kv_taken;          /* the request holds its cache */
	bool saving;            /* a save of its state is in flight (SaveJob) */
	uint32_t n_tokens;      /* known while spilled too */
	uint64_t bytes_on_disk;
	int64_t last_used_unix_ms;
	uint64_t last_used_ns;  /* monotonic, for LRU */
	size_t mem_bytes;       /* counted in Sessions.mem_bytes */
};

struct Sessions {
	Manager *m;
	int lock_fd;            /* <state-dir>/turbokvd.lock, flock()ed while we run */
	int root_fd;            /* <state-dir>/sessions */
	Session **all;          /* (n,) every known session, all uids */
	size_t n, cap;
	uid_t *scanned;         /* uids whose directory was read */
	size_t n_scanned;
	size_t mem_bytes;
	size_t spilling_bytes;  /* of sessions whose spill (save, then drop) is in flight */
	unsigned save_failures; /* saves that failed, ever */
	uint64_t budget;
	unsigned max_per_uid;
	uint64_t max_bytes_per_uid;
	unsigned idle_save_ms;
	SessionSaveHooks hooks;
	SessionExpect expect;
	sd_event_source *idle_timer;
};

static int64_t unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	char *end;
	if (!v || !*v)
		return def;
	unsigned long long x = strtoull(v, &end, 10);
	return *end ? def : (uint64_t)x;
}

/* ---- directories ---- */

/* The directory of uid, created 0700 if missing. Returns an fd or -errno. */
static int uid_dir_open(Sessions *ss, uid_t uid, bool create)
{
	char name[32];
	snprintf(name, sizeof(name), "%u", (unsigned)uid);
	if (create && mkdirat(ss->root_fd, name, 0700) < 0 && errno != EEXIST)
		return -errno;
	int fd = openat(ss->root_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	(void)fchmod(fd, 0700);
	return fd;
}

static void file_name(const Session *s, char *buf, size_t size)
{
	snprintf(buf, size, "%s" SESSION_FILE_SUFFIX, s->name);
}

/*
 * Move a file that failed its checks aside, untouched, into the uid's
 * quarantine/ (created 0700). Everything is relative to the uid's
 * directory fd and quarantine/ is opened O_NOFOLLOW | O_DIRECTORY: a
 * symlink (or a file) planted there does not send the file elsewhere.
 */
static bool quarantine(Sessions *ss, Session *s, int dir_fd)
{
	bool moved = false;
	char from[128], to[160];
	file_name(s, from, sizeof(from));
	snprintf(to, sizeof(to), "%s.%lld", from, (long long)unix_ms());
	if (mkdirat(dir_fd, "quarantine", 0700) < 0 && errno != EEXIST)
		log_error("uid %u: cannot create the quarantine folder: %m", (unsigned)s->uid);
	int qfd = openat(dir_fd, "quarantine", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (qfd < 0) {
		log_error("uid %u: %s/sessions/%u/quarantine is not a folder we can use (%m); session file %s left "
			  "in place", (unsigned)s->uid, ss->m->config->state_dir, (unsigned)s->uid, from);
		return false;
	}
	if (renameat(dir_fd, from, qfd, to) < 0)
		log_error("uid %u: cannot quarantine session file %s: %m", (unsigned)s->uid, from);
	else {
		log_warning("uid %u: session '%s' moved to %s/sessions/%u/quarantine/%s", (unsigned)s->uid, s->name,
			    ss->m->config->state_dir, (unsigned)s->uid, to);
		moved = true;
	}
	safe_close(qfd);
	return moved;
}

/* ---- the table ---- */

static Session *sessions_find(Sessions *ss, uid_t uid, const char *name, size_t *ret_index)
{
	for (size_t i = 0; i < ss->n; i++)
		if (ss->all[i]->uid == uid && strcmp(ss->all[i]->name, name) == 0) {
			if (ret_index)
				*ret_index = i;
			return ss->all[i];
		}
	return NULL;
}

static size_t sessions_count_uid(const Sessions *ss, uid_t uid, uint64_t *ret_bytes)
{
	size_t n = 0;
	uint64_t bytes = 0;
	for (size_t i = 0; i < ss->n; i++)
		if (ss->all[i]->uid == uid) {
			n++;
			bytes += ss->all[i]->bytes_on_disk;
		}
	if (ret_bytes)
		*ret_bytes = bytes;
	return n;
}

static Session *sessions_add(Sessions *ss, uid_t uid, const char *name)
{
	if (ss->n == ss->cap) {
		size_t cap = ss->cap ? 2 * ss->cap : 16;
		Session **p = realloc(ss->all, cap * sizeof(*p));
		if (!p)
			return NULL;
		ss->all = p;
		ss->cap = cap;
	}
	Session *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->uid = uid;
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->last_used_unix_ms = unix_ms();
	s->last_used_ns = now_ns();
	ss->all[ss->n++] = s;
	return s;
}

static size_t state_mem_bytes(const SessionState *st)
{
	if (!st)
		return 0;
	size_t n = st->n_tokens * sizeof(int32_t);
	for (size_t i = 0; i < st->n_messages; i++)
		n += st->messages[i].len;
	/* every byte the cache holds: blocks, scratch, format state, a GPU cache's device memory and host shadow */
	return st->kv ? n + kvcache_memory_bytes(st->kv) : n;
}

static void session_set_state(Sessions *ss, Session *s, SessionState *st)
{
	ss->mem_bytes -= s->mem_bytes;
	session_state_free(s->state);
	s->state = st;
	s->mem_bytes = state_mem_bytes(st);
	ss->mem_bytes += s->mem_bytes;
	if (st)
		s->n_tokens = (uint32_t)MIN(st->n_tokens, UINT32_MAX);
}

static void sessions_remove(Sessions *ss, size_t i)
{
	Session *s = ss->all[i];
	session_set_state(ss, s, NULL);
	free(s);
	ss->all[i] = ss->all[--ss->n];
}

/* Read uid's directory once: every <name>.tkvs becomes a spilled session. */
static void sessions_scan_uid(Sessions *ss, uid_t uid)
{
	for (size_t i = 0; i < ss->n_scanned; i++)
		if (ss->scanned[i] == uid)
			return;
	uid_t *p = realloc(ss->scanned, (ss->n_scanned + 1) * sizeof(*p));
	if (!p)
		return;
	ss->scanned = p;
	ss->scanned[ss->n_scanned++] = uid;

	int fd = uid_dir_open(ss, uid, false);
	if (fd < 0)
		return;
	DIR *d = fdopendir(fd);
	if (!d) {
		safe_close(fd);
		return;
	}
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name), sl = strlen(SESSION_FILE_SUFFIX);
		struct stat st;
		char name[PROTOCOL_MAX_SESSION_NAME + 1];
		if (len >= 9 && strcmp(de->d_name + len - 9, ".tkvs.tmp") == 0) {
			(void)unlinkat(dirfd(d), de->d_name, 0); /* a save that never finished */
			continue;
		}
		if (len <= sl || strcmp(de->d_name + len - sl, SESSION_FILE_SUFFIX) != 0 ||
		    len - sl > PROTOCOL_MAX_SESSION_NAME)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)(len - sl), de->d_name);
		if (!protocol_session_name_valid(name) || sessions_find(ss, uid, name, NULL) ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
		    ss->n >= SESSIONS_MAX_TOTAL)
			continue;
		Session *s = sessions_add(ss, uid, name);
		if (!s)
			break;
		s->on_disk = true;
		s->bytes_on_disk = (uint64_t)st.st_size;
		s->last_used_unix_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
		s->last_used_ns = 0; /* older than anything used since startup */
		uint8_t h[SESSION_HEADER_BYTES];
		SessionHeader hd;
		/* O_NONBLOCK and a type check on the fd: what was a file a moment ago may be a FIFO now */
		int hfd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
		if (hfd >= 0) {
			if (fstat(hfd, &st) == 0 && S_ISREG(st.st_mode) && read(hfd, h, sizeof(h)) == (ssize_t)sizeof(h) &&
			    session_peek(h, sizeof(h), &hd, NULL) == 0)
				s->n_tokens = hd.n_tokens;
			safe_close(hfd);
		}
	}
	closedir(d);
}

/* ---- saving and spilling ---- */

/*
 * A save runs on the I/O worker (worker.h) when the daemon has one: the
 * loop never writes or fsyncs a session file. Meanwhile the session is
 * `saving`: its state is only read (by the save and by requests building
 * their prompts), never changed; a request waits for the save before it
 * takes the cache (sessions_ready()), delete and SessionSave answer BUSY.
 */
typedef struct SaveJob {
	WorkerJob job;
	Sessions *ss;
	Session *s;
	bool spill;             /* drop the state from memory once saved, if still idle */
	uint64_t reply_conn;    /* a SessionSave to answer: the connection's id, 0 for none */
	uint64_t reply_id;
	int dir_fd;             /* for the worker: the uid's directory, the file, the state */
	char file[128];
	const SessionState *state;
	int r;                  /* the worker's results */
	uint64_t bytes, ns;
	Error err;
} SaveJob;

static void save_job_run(WorkerJob *wj)
{
	SaveJob *j = (SaveJob *)wj;
	uint64_t t0 = now_ns();
	j->r = session_save_at(j->dir_fd, j->file, j->state, j->ss->expect.fingerprint, j->ss->m->kv_spec,
			       &j->ss->hooks, &j->bytes, &j->err);
	j->ns = now_ns() - t0;
}

static void sessions_enforce_budget(Sessions *ss);

static Connection *connection_by_id(Manager *m, uint64_t id)
{
	for (Connection *c = m->connections; c; c = c->next)
		if (c->id == id && !c->dead)
			return c;
	return NULL;
}

/* Back on the loop (or inline without a worker): record the result, spill, answer. */
static void save_job_done(WorkerJob *wj)
{
	SaveJob *j = (SaveJob *)wj;
	Sessions *ss = j->ss;
	Session *s = j->s;

	safe_close(j->dir_fd);
	s->saving = false;
	if (j->spill)
		ss->spilling_bytes -= s->mem_bytes;
	if (j->r != 0) {
		log_error("uid %u: cannot save session '%s': %s", (unsigned)s->uid, s->name, j->err.msg);
		ss->save_failures++;
	} else {
		s->dirty = false;
		s->on_disk = true;
		s->bytes_on_disk = j->bytes;
		log_info("uid %u: saved session '%s' (%u tokens, %llu bytes) in %.1f ms", (unsigned)s->uid, s->name,
			 s->n_tokens, (unsigned long long)j->bytes, j->ns / 1e6);
		if (j->spill && !s->busy) {
			log_debug("uid %u: session '%s' spilled to disk", (unsigned)s->uid, s->name);
			session_set_state(ss, s, NULL);
		}
	}
	Connection *c = j->reply_conn ? connection_by_id(ss->m, j->reply_conn) : NULL;
	if (c && j->r != 0)
		connection_send_error(c, j->reply_id, PROTOCOL_E_INTERNAL,
				      "cannot save session '%s' (the previous file is intact): %s", s->name, j->err.msg);
	else if (c)
		sessions_show(ss, s->uid, s->name, c, j->reply_id);
	bool ok = j->r == 0;
	free(j);
	scheduler_wake(ss->m->scheduler); /* a request may wait for this session */
	if (ok)
		sessions_enforce_budget(ss);
}

/*
 * Save s if it is dirty: on the I/O worker when async and there is one,
 * else now. Returns 0 (nothing to save; a spill happens at once), 1 (the
 * save ran or runs: its end logs, spills, answers reply_conn's SessionSave
 * and counts a failure in Sessions.save_failures) or -errno when it could
 * not even start (logged; nothing answered).
 */
static int session_save(Sessions *ss, Session *s, bool async, bool spill, uint64_t reply_conn, uint64_t reply_id)
{
	Manager *m = ss->m;

	assert(!s->saving);
	if (!s->dirty || !s->state || !s->state->kv) {
		if (spill && s->state && !s->dirty)
			session_set_state(ss, s, NULL);
		return 0;
	}
	SaveJob *j = calloc(1, sizeof(*j));
	if (!j)
		return log_error_errno(-ENOMEM, "uid %u: cannot save session '%s': out of memory", (unsigned)s->uid,
				       s->name);
	int fd = uid_dir_open(ss, s->uid, true);
	if (fd < 0) {
		free(j);
		return log_error_errno(fd, "uid %u: cannot open the session directory: %m", (unsigned)s->uid);
	}
	*j = (SaveJob){ .job = { .run = save_job_run, .done = save_job_done }, .ss = ss, .s = s, .spill = spill,
			.reply_conn = reply_conn, .reply_id = reply_id, .dir_fd = fd, .state = s->state };
	file_name(s, j->file, sizeof(j->file));
	s->saving = true;
	if (spill)
		ss->spilling_bytes += s->mem_bytes;
	if (async && m->io_worker) {
		worker_submit(m->io_worker, &j->job);
		return 1;
	}
	save_job_run(&j->job);
	save_job_done(&j->job);
	return 1;
}

/* Spill least-recently-used idle sessions until the budget holds (saves in flight count as gone). */
static void sessions_enforce_budget(Sessions *ss)
{
	while (ss->mem_bytes - ss->spilling_bytes > ss->budget) {
		Session *lru = NULL;
		for (size_t i = 0; i < ss->n; i++) {
			Session *s = ss->all[i];
			if (s->state && !s->busy && !s->saving && (!lru || s->last_used_ns < lru->last_used_ns))
				lru = s;
		}
		if (!lru)
			return;
		if (session_save(ss, lru, true, true, 0, 0) < 0)
			return; /* keep it rather than lose it; the budget is exceeded for now */
	}
}

static void sessions_save_dirty(Sessions *ss, bool async)
{
	unsigned n = 0;
	if (!ss)
		return;
	unsigned failed = ss->save_failures;
	for (size_t i = 0; i < ss->n; i++) {
		Session *s = ss->all[i];
		if (!s->dirty || s->busy || s->saving)
			continue;
		n++;
		if (session_save(ss, s, async, false, 0, 0) < 0)
			ss->save_failures++;
	}
	failed = ss->save_failures - failed;
	if (!async && failed)
		log_warning("%u of %u sessions could not be saved", failed, n);
}

void sessions_save_all(Sessions *ss)
{
	sessions_save_dirty(ss, false);
}

void sessions_save_all_async(Sessions *ss)
{
	sessions_save_dirty(ss, true);
}

bool sessions_ready(const Session *s)
{
	return !s->saving;
}

static int sessions_on_idle(sd_event_source *src, uint64_t usec, void *userdata)
{
	Sessions *ss = userdata;
	sessions_save_all_async(ss);
	return 0;
}

static void sessions_arm_idle(Sessions *ss)
{
	if (!ss->idle_timer)
		return;
	(void)sd_event_source_set_time_relative(ss->idle_timer, (uint64_t)ss->idle_save_ms * 1000);
	(void)sd_event_source_set_enabled(ss->idle_timer, SD_EVENT_ONESHOT);
}

/* ---- setup ---- */

/* mkdir -p path: missing parents and path itself are created 0700. Returns 0 or -errno. */
static int mkdir_parents(const char *path)
{
	_cleanup_(freep) char *p = strdup(path);
	if (!p)
		return -ENOMEM;
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0700) < 0 && errno != EEXIST)
			return -errno;
		*s = '/';
	}
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/*
 * One daemon per state directory: an exclusive flock() on
 * <state-dir>/turbokvd.lock (holding the pid of its owner), kept until
 * exit. The kernel drops it when the process dies, however it dies.
 * Returns 0, or -EBUSY (logged, naming the holder) or -errno.
 */
static int state_dir_lock(Sessions *ss, int dfd, const char *dir)
{
	int fd = openat(dfd, SESSIONS_LOCK_FILE, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0600);
	struct stat st;
	if (fd < 0)
		return log_error_errno(-errno, "cannot open %s/" SESSIONS_LOCK_FILE ": %m", dir);
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		safe_close(fd);
		return log_error_errno(-EINVAL, "%s/" SESSIONS_LOCK_FILE " is not a regular file", dir);
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		char pid[32] = "";
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = 0;
		pid[strcspn(pid, "\n")] = 0;
		safe_close(fd);
		if (e == EWOULDBLOCK)
			return log_error_errno(-EBUSY, "the state directory %s is in use by another turbokvd (pid %s); "
					       "give each daemon its own --state-dir", dir, pid[0] ? pid : "unknown");
		return log_error_errno(-e, "cannot lock %s/" SESSIONS_LOCK_FILE ": %m", dir);
	}
	char pid[32];
	int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len)
		log_warning("cannot write our pid into %s/" SESSIONS_LOCK_FILE ": %m", dir);
	ss->lock_fd = fd;
	return 0;
}

int sessions_new(Manager *m, Sessions **ret)
{
	const Config *cfg = m->config;
	_cleanup_(sessions_freep) Sessions *ss = calloc(1, sizeof(*ss));
	int r;

	if (!ss)
		return -ENOMEM;
	ss->m = m;
	ss->lock_fd = -1;
	ss->root_fd = -1;
	ss->budget = cfg->session_memory;
	ss->max_per_uid = cfg->session_max ? cfg->session_max : SESSIONS_MAX_PER_UID;
	ss->max_bytes_per_uid = cfg->session_disk ? cfg->session_disk : SESSIONS_MAX_BYTES_PER_UID;
	ss->idle_save_ms = (unsigned)env_u64("TURBOKV_SESSION_IDLE_SAVE_MS", SESSIONS_IDLE_SAVE_MS);
	ss->hooks.fail_after_bytes = env_u64("TURBOKV_TEST_SESSION_FAIL_WRITE_AFTER", 0);
	ss->hooks.pause_ms = (unsigned)env_u64("TURBOKV_TEST_SESSION_SAVE_PAUSE_MS", 0);
	ss->hooks.pause_after_bytes = ss->hooks.pause_ms ? 4096 : 0;
	ss->expect = (SessionExpect){
		.fingerprint = gguf_fingerprint(m->model->gguf),
		.shape = model_kv_shape(m->model, m->n_ctx),
		.n_vocab = m->model->cfg.n_vocab,
		.plan = m->kv_plan,
	};

	if ((r = mkdir_parents(cfg->state_dir)) < 0)
		return log_error_errno(r, "cannot create the state directory %s: %m", cfg->state_dir);
	int dfd = open(cfg->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return log_error_errno(-errno, "cannot open the state directory %s: %m", cfg->state_dir);
	if ((r = state_dir_lock(ss, dfd, cfg->state_dir)) < 0) {
		safe_close(dfd);
		return r;
	}
	if (mkdirat(dfd, "sessions", 0700) < 0 && errno != EEXIST) {
		r = -errno;
		safe_close(dfd);
		return log_error_errno(r, "cannot create %s/sessions: %m", cfg->state_dir);
	}
	ss->root_fd = openat(dfd, "sessions", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	r = -errno;
	safe_close(dfd);
	if (ss->root_fd < 0)
		return log_error_errno(r, "cannot open %s/sessions: %m", cfg->state_dir);
	(void)fchmod(ss->root_fd, 0700);

	r = sd_event_add_time_relative(m->event, &ss->idle_timer, CLOCK_MONOTONIC,
				       (uint64_t)ss->idle_save_ms * 1000, 0, sessions_on_idle, ss);
	if (r < 0)
		return log_error_errno(r, "cannot set up the session save timer: %m");
	(void)sd_event_source_set_enabled(ss->idle_timer, SD_EVENT_OFF);
	(void)sd_event_source_set_description(ss->idle_timer, "session-save");
	if (ss->hooks.fail_after_bytes || ss->hooks.pause_ms)
		log_warning("session save test hooks are on (fail after %llu bytes, pause %u ms)",
			    (unsigned long long)ss->hooks.fail_after_bytes, ss->hooks.pause_ms);
	*ret = TAKE_PTR(ss);
	return 0;
}

Sessions *sessions_free(Sessions *ss)
{
	if (!ss)
		return NULL;
	sessions_save_all(ss);
	while (ss->n > 0)
		sessions_remove(ss, ss->n - 1);
	free(ss->all);
	free(ss->scanned);
	sd_event_source_disable_unref(ss->idle_timer);
	safe_close(ss->root_fd);
	safe_close(ss->lock_fd); /* last: the files are written */
	free(ss);
	return NULL;
}

/* ---- use ---- */

/*
 * Loading a spilled session: the file is read and checked on the I/O
 * worker (LoadJob), the result applied on the loop. The session is busy
 * meanwhile, so nothing else touches it; the connection that asked waits
 * with its Generate parked (connection_session_loaded()).
 */
typedef struct LoadJob {
	WorkerJob job;
	Sessions *ss;
	Session *s;
	uint64_t conn_id;       /* whose Generate waits for it, 0 for none */
	int dir_fd;
	char file[128];
	int r;                  /* results: session_load_at()'s (or the conversation's) */
	bool other_kv_type;     /* only the conversation was read: its KV is computed again */
	SessionState *st;
	Error e;
	uint64_t t0;
} LoadJob;

static void load_job_run(WorkerJob *wj)
{
	LoadJob *j = (LoadJob *)wj;
	j->r = session_load_at(j->dir_fd, j->file, &j->ss->expect, &j->st, &j->e);
	if (j->r == SESSION_E_KV_TYPE) {
		/*
		 * Saved with another KV type (--kv changed, or a new default):
		 * keep the conversation and compute its prompt again on next use;
		 * the file is rewritten with this daemon's type after that.
		 */
		Error e2 = { 0 };
		j->r = session_load_conversation_at(j->dir_fd, j->file, &j->ss->expect, &j->st, &e2);
		if (j->r == 0)
			j->other_kv_type = true;
		else
			j->e = e2; /* damaged besides: say what */
	}
}

/* The loop's half: quarantine, forget or keep what was read. Returns 0 or what to tell the client. */
static int session_load_apply(Sessions *ss, LoadJob *j, Error *err)
{
	Session *s = j->s;
	size_t index = 0;
	int r = j->r;
	SessionState *st = TAKE_PTR(j->st);

	if (!sessions_find(ss, s->uid, s->name, &index)) {
		session_state_free(st);
		return error_set(err, PROTOCOL_E_INTERNAL, "session '%s' went away", s->name);
	}
	if (r == 0 && j->other_kv_type) {
		log_warning("uid %u: session '%s' was saved with another KV type (%s); its conversation "
			    "is kept and its %zu tokens are computed again on next use",
			    (unsigned)s->uid, s->name, j->e.msg, st->n_tokens);
		session_set_state(ss, s, st);
		return 0;
	}
	if (r > 0) {
		log_warning("uid %u: session '%s' cannot be loaded: %s (%s)", (unsigned)s->uid, s->name,
			    session_error_name(r), j->e.msg);
		bool moved = quarantine(ss, s, j->dir_fd);
		error_set(err, PROTOCOL_E_SESSION_CORRUPT, "session '%s': %s: %s; %s", s->name, session_error_name(r),
			  j->e.msg, moved ? "the file was moved to quarantine" : "quarantine/ is unusable, the file stays");
		sessions_remove(ss, index);
		return PROTOCOL_E_SESSION_CORRUPT;
	}
	if (r == -ENOENT) {
		/* deleted behind our back: the session is gone */
		sessions_remove(ss, index);
		return error_set(err, PROTOCOL_E_SESSION_NOT_FOUND, "session '%s': its file is gone", s->name);
	}
	if (r < 0)
		return error_set(err, r == -ENOMEM ? -ENOMEM : PROTOCOL_E_INTERNAL, "session '%s': %s", s->name,
				 j->e.msg);
	/* Files hold host caches; a GPU daemon moves the cache to the device (the file stays as it is). */
	KvCache *kv;
	Error e = { 0 };
	if ((r = model_kvcache_adopt(ss->m->model, st->kv, &kv, &e)) != 0) {
		session_state_free(st);
		return error_set(err, r == -ENOMEM ? -ENOMEM : PROTOCOL_E_INTERNAL, "session '%s': %s", s->name,
				 e.msg);
	}
	st->kv = kv;
	session_set_state(ss, s, st);
	log_info("uid %u: restored session '%s' (%u tokens) in %.1f ms", (unsigned)s->uid, s->name, s->n_tokens,
		 (now_ns() - j->t0) / 1e6);
	return 0;
}

static void load_job_done(WorkerJob *wj)
{
	LoadJob *j = (LoadJob *)wj;
	Sessions *ss = j->ss;
	Error err = { 0 };

	j->s->busy = false; /* held for the load; the parked Generate acquires it again */
	int r = session_load_apply(ss, j, &err);
	safe_close(j->dir_fd);
	uint64_t conn_id = j->conn_id;
	free(j);
	if (conn_id)
		connection_session_loaded(ss->m, conn_id, r, err.msg);
}

/* A LoadJob for s (on disk only), or NULL with err set. */
static LoadJob *load_job_new(Sessions *ss, Session *s, uint64_t conn_id, Error *err)
{
	LoadJob *j = calloc(1, sizeof(*j));
	if (!j) {
		error_set(err, -ENOMEM, "out of memory");
		return NULL;
	}
	*j = (LoadJob){ .job = { .run = load_job_run, .done = load_job_done }, .ss = ss, .s = s, .conn_id = conn_id,
			.t0 = now_ns() };
	j->dir_fd = uid_dir_open(ss, s->uid, true);
	if (j->dir_fd < 0) {
		error_set(err, PROTOCOL_E_INTERNAL, "session '%s': cannot open the session directory: %s", s->name,
			  strerror(-j->dir_fd));
		free(j);
		return NULL;
	}
	file_name(s, j->file, sizeof(j->file));
	return j;
}

/* Load a spilled session now, on this thread (no I/O worker). */
static int session_load(Sessions *ss, Session *s, Error *err)
{
	LoadJob *j = load_job_new(ss, s, 0, err);
	if (!j)
		return err->code;
	load_job_run(&j->job);
	int r = session_load_apply(ss, j, err);
	session_state_free(j->st);
	safe_close(j->dir_fd);
	free(j);
	return r;
}

int sessions_prepare(Sessions *ss, uid_t uid, const char *name, uint64_t conn_id, Error *err)
{
	sessions_scan_uid(ss, uid);
	Session *s = sessions_find(ss, uid, name, NULL);
	if (!s || s->busy || s->state || !s->on_disk || !ss->m->io_worker)
		return 0; /* sessions_acquire() decides (and loads inline without a worker) */
	LoadJob *j = load_job_new(ss, s, conn_id, err);
	if (!j)
		return err->code;
	s->busy = true;
	worker_submit(ss->m->io_worker, &j->job);
	return SESSIONS_LOADING;
}

int sessions_acquire(Sessions *ss, uid_t uid, const char *name, Session **ret, Error *err)
{
	size_t index = 0;
	uint64_t bytes;
	int r;

	sessions_scan_uid(ss, uid);
	Session *s = sessions_find(ss, uid, name, &index);
	if (s && s->busy)
		return error_set(err, PROTOCOL_E_SESSION_BUSY, "session '%s' is in use by another request", name);
	size_t n = sessions_count_uid(ss, uid, &bytes);
	if (bytes > ss->max_bytes_per_uid)
		return error_set(err, PROTOCOL_E_SESSION_QUOTA,
				 "your session files take %llu bytes, more than the quota of %llu; delete some",
				 (unsigned long long)bytes, (unsigned long long)ss->max_bytes_per_uid);
	if (!s) {
		if (n >= ss->max_per_uid || ss->n >= SESSIONS_MAX_TOTAL)
			return error_set(err, PROTOCOL_E_SESSION_QUOTA, "you have %zu sessions, the quota is %u; delete some",
					 n, ss->max_per_uid);
		if (!(s = sessions_add(ss, uid, name)))
			return error_set(err, -ENOMEM, "out of memory");
	} else if (!s->state && s->on_disk && (r = session_load(ss, s, err)) != 0)
		return r;
	s->busy = true;
	s->kv_taken = false;
	s->last_used_ns = now_ns();
	s->last_used_unix_ms = unix_ms();
	*ret = s;
	return 0;
}

const SessionState *session_state(const Session *s)
{
	return s->state;
}

KvCache *session_take_kv(Session *s)
{
	if (!s->state)
		return NULL;
	s->kv_taken = true;
	return TAKE_PTR(s->state->kv);
}

/* Append turns (consumed) to the state's messages. */
static int state_append_turns(SessionState *st, SessionMessage *turns, size_t n_turns)
{
	if (n_turns == 0)
		return 0;
	SessionMessage *p = realloc(st->messages, (st->n_messages + n_turns) * sizeof(*p));
	if (!p)
		return -ENOMEM;
	st->messages = p;
	memcpy(st->messages + st->n_messages, turns, n_turns * sizeof(*turns));
	st->n_messages += n_turns;
	return 0;
}

static void turns_free(SessionMessage *turns, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(turns[i].text);
	free(turns);
}

/* Remove the messages drop marks (drop covers the first n_drop messages). */
static void state_drop_messages(SessionState *st, const uint8_t *drop, size_t n_drop)
{
	size_t j = 0;
	for (size_t i = 0; i < st->n_messages; i++) {
		if (i < n_drop && drop[i]) {
			free(st->messages[i].text);
			continue;
		}
		st->messages[j++] = st->messages[i];
	}
	st->n_messages = j;
}

void sessions_release(Sessions *ss, Session *s, KvCache *kv, const int32_t *tokens, size_t n_tokens,
		      SessionKind kind, SessionMessage *turns, size_t n_turns, const SessionRelease *how)
{
	size_t index = 0;
	assert(s->busy);
	s->busy = false;
	s->last_used_ns = now_ns();
	s->last_used_unix_ms = unix_ms();
	if (!sessions_find(ss, s->uid, s->name, &index)) {
		assert(false); /* busy sessions are never removed */
		kvcache_free(kv);
		turns_free(turns, n_turns);
		return;
	}

	if (!kv) {
		turns_free(turns, n_turns);
		if (s->kv_taken) {
			/* the cache was taken but not returned: what is left is no longer consistent */
			session_set_state(ss, s, NULL);
			s->dirty = false;
		}
		if (!s->state && !s->on_disk)
			sessions_remove(ss, index);
		return;
	}

	SessionState *st = s->state;
	if (!st && !(st = calloc(1, sizeof(*st))))
		goto fail;
	s->state = NULL;
	int32_t *t = malloc_array(n_tokens ? n_tokens : 1, sizeof(int32_t));
	if (t && how && how->drop)
		state_drop_messages(st, how->drop, MIN(how->n_drop, st->n_messages));
	if (how && how->policy != SESSION_POLICY_NONE)
		st->policy = how->policy;
	if (!t || state_append_turns(st, turns, n_turns) < 0) {
		free(t);
		session_state_free(st);
		goto fail;
	}
	free(turns); /* the texts moved into st->messages */
	turns = NULL;
	memcpy(t, tokens, n_tokens * sizeof(int32_t));
	free(st->tokens);
	st->tokens = t;
	st->n_tokens = n_tokens;
	st->kind = kind;
	kvcache_free(st->kv);
	st->kv = kv;
	ss->mem_bytes -= s->mem_bytes;
	s->mem_bytes = 0;
	session_set_state(ss, s, st);
	s->dirty = true;
	s->kv_taken = false;
	sessions_enforce_budget(ss);
	sessions_arm_idle(ss);
	return;
fail:
	log_error("uid %u: out of memory keeping session '%s'; its last turn is lost", (unsigned)s->uid, s->name);
	kvcache_free(kv);
	turns_free(turns, n_turns);
	session_set_state(ss, s, NULL);
	s->dirty = false;
	if (!s->on_disk)
		sessions_remove(ss, index);
}

/* ---- list, show, delete ---- */

static void info_fill(const Session *s, uint64_t request_id, Turbokv__V1__SessionInfo *ret)
{
	turbokv__v1__session_info__init(ret);
	ret->request_id = request_id;
	ret->name = (char *)s->name;
	ret->tokens = s->n_tokens;
	ret->bytes_on_disk = s->on_disk ? s->bytes_on_disk : 0;
	ret->last_used_unix_ms = s->last_used_unix_ms;
	ret->in_memory = s->state != NULL;
}

static int info_cmp(const void *a, const void *b)
{
	const Session *x = *(Session *const *)a, *y = *(Session *const *)b;
	return x->last_used_unix_ms < y->last_used_unix_ms ? 1 : x->last_used_unix_ms > y->last_used_unix_ms ? -1
											    : strcmp(x->name, y->name);
}

void sessions_list(Sessions *ss, uid_t uid, Connection *c, uint64_t request_id)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__SessionListReply l = TURBOKV__V1__SESSION_LIST_REPLY__INIT;
	sessions_scan_uid(ss, uid);
	size_t n = sessions_count_uid(ss, uid, NULL), k = 0;
	_cleanup_(freep) Session **mine = calloc_array(n, sizeof(Session *));
	_cleanup_(freep) Turbokv__V1__SessionInfo *infos = calloc_array(n, sizeof(*infos));
	_cleanup_(freep) Turbokv__V1__SessionInfo **ptrs = calloc_array(n, sizeof(*ptrs));
	if (!mine || !infos || !ptrs) {
		connection_send_error(c, request_id, PROTOCOL_E_INTERNAL, "out of memory");
		return;
	}
	for (size_t i = 0; i < ss->n; i++)
		if (ss->all[i]->uid == uid)
			mine[k++] = ss->all[i];
	qsort(mine, n, sizeof(*mine), info_cmp);
	for (size_t i = 0; i < n; i++) {
		info_fill(mine[i], 0, &infos[i]);
		ptrs[i] = &infos[i];
	}
	l.request_id = request_id;
	l.n_sessions = n;
	l.sessions = ptrs;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_LIST_REPLY;
	msg.session_list_reply = &l;
	connection_send(c, &msg);
}

void sessions_show(Sessions *ss, uid_t uid, const char *name, Connection *c, uint64_t request_id)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__SessionInfo info;
	sessions_scan_uid(ss, uid);
	Session *s = sessions_find(ss, uid, name, NULL);
	if (!s) {
		connection_send_error(c, request_id, PROTOCOL_E_SESSION_NOT_FOUND, "no session named '%s'", name);
		return;
	}
	info_fill(s, request_id, &info);
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_INFO;
	msg.session_info = &info;
	connection_send(c, &msg);
}

void sessions_save_request(Sessions *ss, uid_t uid, const char *name, Connection *c, uint64_t request_id)
{
	sessions_scan_uid(ss, uid);
	Session *s = sessions_find(ss, uid, name, NULL);
	if (!s) {
		connection_send_error(c, request_id, PROTOCOL_E_SESSION_NOT_FOUND, "no session named '%s'", name);
		return;
	}
	if (s->busy || s->saving) {
		connection_send_error(c, request_id, PROTOCOL_E_SESSION_BUSY, "session '%s' is %s", name,
				      s->busy ? "in use" : "being saved");
		return;
	}
	/* the save's end answers; with nothing to save the file is current */
	int r = session_save(ss, s, true, false, c->id, request_id);
	if (r < 0)
		connection_send_error(c, request_id, PROTOCOL_E_INTERNAL,
				      "cannot save session '%s' (the previous file is intact): %s", name, strerror(-r));
	else if (r == 0)
		sessions_show(ss, uid, name, c, request_id);
}

void sessions_delete(Sessions *ss, uid_t uid, const char *name, Connection *c, uint64_t request_id)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__SessionDeleted d = TURBOKV__V1__SESSION_DELETED__INIT;
	size_t index;
	sessions_scan_uid(ss, uid);
	Session *s = sessions_find(ss, uid, name, &index);
	if (!s) {
		connection_send_error(c, request_id, PROTOCOL_E_SESSION_NOT_FOUND, "no session named '%s'", name);
		return;
	}
	if (s->busy || s->saving) {
		connection_send_error(c, request_id, PROTOCOL_E_SESSION_BUSY, "session '%s' is %s", name,
				      s->busy ? "in use" : "being saved");
		return;
	}
	if (s->on_disk) {
		char file[128];
		int fd = uid_dir_open(ss, uid, false);
		file_name(s, file, sizeof(file));
		if (fd >= 0 && unlinkat(fd, file, 0) < 0 && errno != ENOENT) {
			int e = errno;
			safe_close(fd);
			connection_send_error(c, request_id, PROTOCOL_E_INTERNAL, "cannot delete session '%s': %s", name,
					      strerror(e));
			return;
		}
		if (fd >= 0)
			(void)fsync(fd);
		safe_close(fd);
	}
	sessions_remove(ss, index);
	d.request_id = request_id;
	d.name = (char *)name;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_SESSION_DELETED;
	msg.session_deleted = &d;
	connection_send(c, &msg);
}

int sessions_dir_open(Sessions *ss, uid_t uid, const char *sub, bool create)
{
	int dfd = uid_dir_open(ss, uid, create);
	if (dfd < 0)
		return dfd;
	if (create && mkdirat(dfd, sub, 0700) < 0 && errno != EEXIST) {
		int r = -errno;
		safe_close(dfd);
		return r;
	}
	int fd = openat(dfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	int r = -errno;
	safe_close(dfd);
	if (fd < 0)
		return r;
	(void)fchmod(fd, 0700);
	return fd;
}

const SessionExpect *sessions_expect(const Sessions *ss)
{
	return &ss->expect;
}

unsigned sessions_n_in_memory(const Sessions *ss)
{
	unsigned n = 0;
	for (size_t i = 0; ss && i < ss->n; i++)
		n += ss->all[i]->state != NULL;
	return n;
}

uint64_t sessions_memory_bytes(const Sessions *ss)
{
	return ss ? ss->mem_bytes : 0;
}
