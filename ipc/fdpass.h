/*
 * fdpass.h: file descriptors passed beside frames on an AF_UNIX SOCK_STREAM
 * socket (SCM_RIGHTS), and the pairing of received fds with frames.
 *
 * The pairing rule (a stream has no message boundaries, fds do):
 * - Sender: the fds of a frame go in the control data of the sendmsg()
 *   whose data starts with the first byte of that frame's length prefix,
 *   and of no other sendmsg(). Linux attaches them to the first skb of that
 *   call, so the fds arrive with the first byte of the frame. (A sendmsg()
 *   that is cut short has still sent all its fds: the rest of the bytes go
 *   without them.) At most FDPASS_MAX_FDS fds per frame.
 * - Kernel: one recvmsg() returns the fds of at most one sendmsg(), and
 *   returns them together with that call's first byte (a read stops after
 *   the first skb that carries fds).
 * - Receiver: every fd received goes into a FIFO FdQueue, tagged with the
 *   stream range [start, end) of the bytes of the recvmsg() it came with.
 *   When the frame decoder has a complete frame at stream offset s whose
 *   message claims n fds, fd_queue_take() hands over the n oldest fds, and
 *   checks that each of them arrived with the frame's first byte
 *   (start <= s < end); fds that arrived wholly before s and were claimed
 *   by no earlier frame are stray. Every frame calls fd_queue_take(), also
 *   with n == 0, so that stray fds are noticed at the first frame after
 *   them. Any FDPASS_E_* code means the peer broke the rule: drop it.
 *
 * Every fd received is close-on-exec (MSG_CMSG_CLOEXEC). Error paths close
 * whatever arrived; nothing leaks.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define FDPASS_MAX_FDS 16          /* per frame, and per recvmsg() */
#define FDPASS_DEFAULT_QUEUED 64   /* default bound on fds held by a queue */

/* Positive error codes of this module (0 is success, negative is -errno). */
enum {
	FDPASS_E_CTRUNC = 1,       /* control data truncated: fds were lost */
	FDPASS_E_TOO_MANY_FDS = 2, /* more fds than the queue may hold */
	FDPASS_E_MISSING = 3,      /* a frame claims fds that did not come with it */
	FDPASS_E_STRAY = 4,        /* fds that came with no frame that claimed them */
};

/* Name of an FDPASS_E_* code, or NULL. */
const char *fdpass_error_name(int code);

/*
 * One sendmsg() of len bytes (len > 0) with n_fds fds (borrowed: the caller
 * still owns and closes them; the kernel holds its own references once this
 * returns 0). MSG_NOSIGNAL. Returns 0 and *ret_sent (1..len), or -errno
 * (-EAGAIN on a full non-blocking socket, -EINVAL for n_fds >
 * FDPASS_MAX_FDS).
 */
int fdpass_send_borrow_fds(int sock, const void *data, size_t len,
			   const int *fds, size_t n_fds, size_t *ret_sent);

typedef struct FdQueue FdQueue;

/*
 * A queue holding at most max_queued fds (0: FDPASS_DEFAULT_QUEUED) that
 * also counts the stream bytes received through it. Returns 0 or -ENOMEM.
 */
int fd_queue_new(size_t max_queued, FdQueue **ret);
/* Closes every fd still queued. */
FdQueue *fd_queue_free(FdQueue *q);
DEFINE_FREEP(FdQueue, fd_queue_free)

/* Number of fds queued. */
size_t fd_queue_size(const FdQueue *q);
/* Stream bytes received so far (offset of the next byte). */
uint64_t fd_queue_offset(const FdQueue *q);

/*
 * One recvmsg() of up to size bytes into buf, with MSG_CMSG_CLOEXEC; fds
 * that came with the bytes are appended to q. Returns 0 and *ret_n (0 at
 * EOF), -errno (-EAGAIN, ...), FDPASS_E_CTRUNC (more fds than
 * FDPASS_MAX_FDS were sent with one call: the ones that arrived are closed)
 * or FDPASS_E_TOO_MANY_FDS (q would exceed its bound: the new fds are
 * closed). After an FDPASS_E_* code the bytes read are lost: drop the peer.
 */
int fdpass_recv(int sock, void *buf, size_t size, FdQueue *q, size_t *ret_n);

/*
 * Hand over the n fds (n <= FDPASS_MAX_FDS) of the frame at stream offset
 * frame_offset into ret_fds (the caller owns them then). Returns 0,
 * FDPASS_E_STRAY (unclaimed fds from before the frame: they are closed),
 * FDPASS_E_MISSING (fewer than n fds came with the frame; the queue is left
 * as it was), or -EINVAL for n > FDPASS_MAX_FDS.
 */
int fd_queue_take(FdQueue *q, uint64_t frame_offset, size_t n, int *ret_fds);
