/*
 * fdpass.c: SCM_RIGHTS send and receive, and the queue that pairs received
 * fds with the frames they came with (rule: fdpass.h). Owns no socket.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "ipc/fdpass.h"

#define FDPASS_CONTROL_BYTES CMSG_SPACE(sizeof(int) * FDPASS_MAX_FDS)

typedef struct QueuedFd {
	int fd;
	uint64_t start; /* stream range of the recvmsg() it came with */
	uint64_t end;
} QueuedFd;

struct FdQueue {
	QueuedFd *items; /* (alloc,) entries [head, len) queued, oldest first */
	size_t alloc;
	size_t head;
	size_t len;
	size_t max_queued;
	uint64_t rx;     /* stream bytes received */
};

const char *fdpass_error_name(int code)
{
	switch (code) {
	case FDPASS_E_CTRUNC:
		return "FDPASS_E_CTRUNC";
	case FDPASS_E_TOO_MANY_FDS:
		return "FDPASS_E_TOO_MANY_FDS";
	case FDPASS_E_MISSING:
		return "FDPASS_E_MISSING";
	case FDPASS_E_STRAY:
		return "FDPASS_E_STRAY";
	default:
		return NULL;
	}
}

int fdpass_send_borrow_fds(int sock, const void *data, size_t len,
			   const int *fds, size_t n_fds, size_t *ret_sent)
{
	union {
		struct cmsghdr h;
		uint8_t buf[FDPASS_CONTROL_BYTES];
	} control;
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	assert(data && len > 0);
	assert(ret_sent);
	if (n_fds > FDPASS_MAX_FDS)
		return -EINVAL;
	if (n_fds > 0) {
		struct cmsghdr *c;
		memset(&control, 0, sizeof(control));
		mh.msg_control = &control;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
	}
	n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	if (n < 0)
		return -errno;
	*ret_sent = (size_t)n;
	return 0;
}

int fd_queue_new(size_t max_queued, FdQueue **ret)
{
	FdQueue *q;

	assert(ret);
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->max_queued = max_queued ? max_queued : FDPASS_DEFAULT_QUEUED;
	*ret = q;
	return 0;
}

FdQueue *fd_queue_free(FdQueue *q)
{
	if (q) {
		for (size_t i = q->head; i < q->len; i++)
			safe_close(q->items[i].fd);
		free(q->items);
		free(q);
	}
	return NULL;
}

size_t fd_queue_size(const FdQueue *q)
{
	return q->len - q->head;
}

uint64_t fd_queue_offset(const FdQueue *q)
{
	return q->rx;
}

static void close_all(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		safe_close(fds[i]);
}

/* Room for n more entries (n <= max_queued, so bounded). */
static int queue_reserve(FdQueue *q, size_t n)
{
	QueuedFd *p;
	size_t a;

	if (q->head > 0) {
		memmove(q->items, q->items + q->head, (q->len - q->head) * sizeof(*q->items));
		q->len -= q->head;
		q->head = 0;
	}
	if (q->len + n <= q->alloc)
		return 0;
	a = MAX(q->alloc * 2, q->len + n);
	p = realloc(q->items, a * sizeof(*p));
	if (!p)
		return -ENOMEM;
	q->items = p;
	q->alloc = a;
	return 0;
}

/* Pull the fds out of a received control buffer; *ret_extra counts those that did not fit. */
static size_t collect_fds(struct msghdr *mh, int fds[FDPASS_MAX_FDS], size_t *ret_extra)
{
	size_t n = 0, extra = 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		size_t count;
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < count; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (n < FDPASS_MAX_FDS) {
				fds[n++] = fd;
			} else {
				safe_close(fd);
				extra++;
			}
		}
	}
	*ret_extra = extra;
	return n;
}

int fdpass_recv(int sock, void *buf, size_t size, FdQueue *q, size_t *ret_n)
{
	union {
		struct cmsghdr h;
		uint8_t buf[FDPASS_CONTROL_BYTES];
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = size };
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = &control,
		.msg_controllen = sizeof(control),
	};
	int fds[FDPASS_MAX_FDS];
	size_t n_fds, extra;
	ssize_t n;
	int k;

	assert(buf && size > 0);
	assert(q && ret_n);
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return -errno;
	n_fds = collect_fds(&mh, fds, &extra);
	if ((mh.msg_flags & MSG_CTRUNC) || extra > 0) {
		close_all(fds, n_fds);
		return FDPASS_E_CTRUNC;
	}
	if (n_fds > 0) {
		if (fd_queue_size(q) + n_fds > q->max_queued) {
			close_all(fds, n_fds);
			return FDPASS_E_TOO_MANY_FDS;
		}
		k = queue_reserve(q, n_fds);
		if (k < 0) {
			close_all(fds, n_fds);
			return k;
		}
		for (size_t i = 0; i < n_fds; i++)
			q->items[q->len++] = (QueuedFd){
				.fd = fds[i],
				.start = q->rx,
				.end = q->rx + (uint64_t)n,
			};
	}
	q->rx += (uint64_t)n;
	*ret_n = (size_t)n;
	return 0;
}

int fd_queue_take(FdQueue *q, uint64_t frame_offset, size_t n, int *ret_fds)
{
	bool stray = false;

	assert(q);
	assert(ret_fds || n == 0);
	if (n > FDPASS_MAX_FDS)
		return -EINVAL;
	/* fds that came wholly before this frame: an earlier frame left them */
	while (q->head < q->len && q->items[q->head].end <= frame_offset) {
		safe_close(q->items[q->head].fd);
		q->head++;
		stray = true;
	}
	if (stray)
		return FDPASS_E_STRAY;
	if (fd_queue_size(q) < n)
		return FDPASS_E_MISSING;
	for (size_t i = 0; i < n; i++) {
		const QueuedFd *e = &q->items[q->head + i];
		if (!(e->start <= frame_offset && frame_offset < e->end))
			return FDPASS_E_MISSING;
	}
	for (size_t i = 0; i < n; i++)
		ret_fds[i] = q->items[q->head + i].fd;
	q->head += n;
	return 0;
}
