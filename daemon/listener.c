/*
 * listener.c: the listening socket and accepting clients (see listener.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/connection.h"
#include "daemon/listener.h"
#include "daemon/log.h"
#include "ipc/peercred.h"

struct Listener {
	Manager *manager;
	int fd;
	sd_event_source *io;
	char *path;      /* our own socket file, unlinked at the end; NULL when activated */
	int reserve_fd;  /* /dev/null, given up to accept (and refuse) a client on EMFILE */
	sd_event_source *resume; /* re-enables accepting after a back-off */
	unsigned backoff_ms;
	dev_t dev;       /* of path as we bound it: only that file is ours to unlink */
	ino_t ino;
	bool activated;
};

/* Stop accepting for a while (the descriptor table is full): no busy loop on EMFILE. */
static void listener_back_off(Listener *l)
{
	l->backoff_ms = l->backoff_ms ? MIN(l->backoff_ms * 2, MANAGER_ACCEPT_BACKOFF_MAX_MS) : MANAGER_ACCEPT_BACKOFF_MS;
	(void)sd_event_source_set_enabled(l->io, SD_EVENT_OFF);
	(void)sd_event_source_set_time_relative(l->resume, (uint64_t)l->backoff_ms * 1000);
	(void)sd_event_source_set_enabled(l->resume, SD_EVENT_ONESHOT);
}

static int listener_on_resume(sd_event_source *s, uint64_t usec, void *userdata)
{
	Listener *l = userdata;
	if (l->io)
		(void)sd_event_source_set_enabled(l->io, SD_EVENT_ON);
	return 0;
}

/*
 * Out of descriptors: give up the reserve to take the waiting client,
 * tell it BUSY, close it, take the reserve back, pause accepting.
 */
static void listener_shed(Listener *l, int fd, int err)
{
	log_warning_ratelimited("accept failed: %s; refusing clients for %u ms", strerror(err),
				MIN(l->backoff_ms ? l->backoff_ms * 2 : MANAGER_ACCEPT_BACKOFF_MS,
				    MANAGER_ACCEPT_BACKOFF_MAX_MS));
	l->reserve_fd = safe_close(l->reserve_fd);
	int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (cfd >= 0)
		connection_refuse_consume_fd(cfd, PROTOCOL_E_BUSY, "the daemon is out of file descriptors; retry later");
	l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	listener_back_off(l);
}

/* A client the caps leave no room for: BUSY, naming the cap. */
static bool listener_admit(Listener *l, int cfd)
{
	Manager *m = l->manager;
	char msg[160];
	PeerCred cred;

	if (m->n_connections >= MANAGER_MAX_CONNECTIONS) {
		snprintf(msg, sizeof(msg), "the daemon serves %u connections, its most; retry later", m->n_connections);
		log_warning_ratelimited("refusing a client: %u connections already", m->n_connections);
		connection_refuse_consume_fd(cfd, PROTOCOL_E_BUSY, msg);
		return false;
	}
	if (peercred_get(cfd, &cred) < 0)
		return true; /* connection_new_consume_fd() reports it */
	unsigned n = connection_uid_usage(m, cred.uid).connections;
	if (n >= m->config->connections_per_user) {
		snprintf(msg, sizeof(msg), "you hold %u connections, the most one user may (connections-per-user)", n);
		log_warning_ratelimited("refusing a client of uid %u: it holds %u connections", (unsigned)cred.uid, n);
		connection_refuse_consume_fd(cfd, PROTOCOL_E_BUSY, msg);
		return false;
	}
	return true;
}

static int listener_on_accept(sd_event_source *s, int fd, uint32_t revents, void *userdata)
{
	Listener *l = userdata;
	Manager *m = l->manager;

	for (int i = 0; i < 16; i++) {
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (cfd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				listener_shed(l, fd, errno);
			else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warning_ratelimited("accept failed: %m");
			return 0;
		}
		l->backoff_ms = 0;
		if (!listener_admit(l, cfd))
			continue;
		Connection *c;
		int r = connection_new_consume_fd(m, cfd, &c);
		if (r < 0)
			log_warning_errno(r, "cannot set up a client: %m");
	}
	return 0;
}

/* Create the directories above path (the last one with mode 0755). */
static int mkdir_parents(const char *path)
{
	char buf[PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", path);
	char *dir = dirname(buf);
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/*
 * A socket file at path that nobody listens on is left over from a run
 * that did not clean up: remove it. Returns 0 (gone or never there),
 * -EADDRINUSE (a live daemon), -ENOTSOCK (something else is there).
 */
static int remove_stale_socket(const char *path, const struct sockaddr_un *sa)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -ENOTSOCK;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
	int e = errno;
	safe_close(fd);
	if (r == 0)
		return -EADDRINUSE;
	if (e != ECONNREFUSED)
		return -e;
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	log_info("removed stale socket %s", path);
	return 0;
}

static int listener_bind(Listener *l, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	bool root = geteuid() == 0;
	int r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return log_error_errno(-ENAMETOOLONG, "socket path %s is too long", path);
	memcpy(sa.sun_path, path, strlen(path));
	if ((r = mkdir_parents(path)) < 0)
		return log_error_errno(r, "cannot create the directory of %s: %m", path);
	r = remove_stale_socket(path, &sa);
	if (r == -EADDRINUSE)
		return log_error_errno(r, "another daemon is already listening on %s", path);
	if (r < 0)
		return log_error_errno(r, "cannot replace %s: %m", path);

	l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0)
		return log_error_errno(-errno, "cannot create a socket: %m");
	/* Bind with the final mode already: no window in which others could connect. */
	mode_t old = umask(root ? 0117 : 0177);
	r = bind(l->fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	umask(old);
	if (r < 0)
		return log_error_errno(-e, "cannot bind %s: %m", path);
	if (!(l->path = strdup(path)))
		return -ENOMEM;
	if (chmod(path, root ? 0660 : 0600) < 0)
		return log_error_errno(-errno, "cannot set the mode of %s: %m", path);
	struct stat st;
	if (lstat(path, &st) < 0)
		return log_error_errno(-errno, "cannot stat %s: %m", path);
	l->dev = st.st_dev;
	l->ino = st.st_ino;
	if (listen(l->fd, SOMAXCONN) < 0)
		return log_error_errno(-errno, "cannot listen on %s: %m", path);
	log_info("listening on %s (mode %s)", path, root ? "0660" : "0600");
	return 0;
}

static int listener_adopt(Listener *l, int n)
{
	if (n != 1)
		return log_error_errno(-EINVAL, "socket activation passed %d sockets; expected one", n);
	if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) <= 0)
		return log_error_errno(-EINVAL, "the socket passed by systemd is not a listening AF_UNIX stream socket");
	l->fd = SD_LISTEN_FDS_START;
	l->activated = true;
	int flags = fcntl(l->fd, F_GETFL);
	if (flags < 0 || fcntl(l->fd, F_SETFL, flags | O_NONBLOCK) < 0 || fcntl(l->fd, F_SETFD, FD_CLOEXEC) < 0)
		return log_error_errno(-errno, "cannot configure the activated socket: %m");
	log_info("using the socket passed by systemd");
	return 0;
}

int listener_new(Manager *m, const char *path, Listener **ret)
{
	Listener *l = calloc(1, sizeof(*l));
	int r, n;

	if (!l)
		return -ENOMEM;
	l->manager = m;
	l->fd = -1;
	l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	n = sd_listen_fds(1);
	if (n < 0)
		r = log_error_errno(n, "cannot read the sockets passed by systemd: %m");
	else if (n > 0)
		r = listener_adopt(l, n);
	else
		r = listener_bind(l, path);
	if (r == 0 && (r = sd_event_add_io(m->event, &l->io, l->fd, EPOLLIN, listener_on_accept, l)) < 0)
		log_error_errno(r, "cannot watch the socket: %m");
	if (r == 0 && (r = sd_event_add_time_relative(m->event, &l->resume, CLOCK_MONOTONIC, 1000, 0,
						      listener_on_resume, l)) < 0)
		log_error_errno(r, "cannot set up the accept back-off: %m");
	if (r == 0)
		(void)sd_event_source_set_enabled(l->resume, SD_EVENT_OFF);
	if (r < 0) {
		listener_free(l);
		return r;
	}
	(void)sd_event_source_set_description(l->io, "listener");
	*ret = l;
	return 0;
}

void listener_stop(Listener *l)
{
	if (l && l->io)
		l->io = sd_event_source_disable_unref(l->io);
	if (l && l->resume)
		l->resume = sd_event_source_disable_unref(l->resume);
}

bool listener_activated(const Listener *l)
{
	return l->activated;
}

Listener *listener_free(Listener *l)
{
	if (!l)
		return NULL;
	sd_event_source_disable_unref(l->io);
	sd_event_source_disable_unref(l->resume);
	safe_close(l->reserve_fd);
	safe_close(l->fd);
	if (l->path) {
		/* Only the file we bound: a daemon started after us may have replaced it. */
		struct stat st;
		if (lstat(l->path, &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino)
			(void)unlink(l->path);
		free(l->path);
	}
	free(l);
	return NULL;
}
