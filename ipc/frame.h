/*
 * frame.h: length-prefixed frames on a byte stream (the daemon socket).
 *
 * Wire layout of one frame (all frames, both directions):
 *
 *   offset  size  field
 *   0       4     L: payload length in bytes, unsigned 32-bit little-endian
 *   4       L     payload: one protobuf message (turbokv.v1), opaque here
 *
 * Frames follow each other with no padding or separator. The stream offset
 * of a frame is the offset of the first byte of its length prefix, counted
 * from the first byte ever sent on the connection.
 *
 * Rules:
 * - 0 <= L <= cap. The cap is per reader/writer (FRAME_MAX_BYTES by default,
 *   at most FRAME_CAP_LIMIT). A length over the cap is FRAME_E_TOO_LARGE:
 *   the reader is poisoned (every later call returns the same code) and the
 *   connection must be dropped, because the stream can no longer be
 *   resynchronised. The oversized length is never allocated: it is rejected
 *   as soon as its 4 prefix bytes have been fed.
 * - L == 0 is allowed: it is the encoding of a protobuf message with every
 *   field at its default. Whether such a message means anything is for the
 *   protocol layer above to decide.
 * - EOF in the middle of a frame (inside the prefix or the payload) is
 *   FRAME_E_TRUNCATED (frame_reader_finish()).
 * - File descriptors travel beside frames (SCM_RIGHTS): see fdpass.h for how
 *   they are paired with the frame they belong to. A FrameWriter sends a
 *   frame's fds with the sendmsg() that carries the frame's first byte.
 *
 * This module owns the byte layout, the incremental reader (bytes in
 * arbitrary chunks in, complete frames out) and the outgoing queue (partial
 * writes, bytes pending for backpressure). It does not own the socket, the
 * event loop, or the meaning of payloads.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define FRAME_HEADER_BYTES 4
#define FRAME_MAX_BYTES (4u * 1024 * 1024)    /* default payload cap */
#define FRAME_CAP_LIMIT (256u * 1024 * 1024)  /* largest cap a reader or writer accepts */

/* Positive error codes of this module (0 is success, negative is -errno). */
enum {
	FRAME_E_TOO_LARGE = 1, /* a length prefix (or a payload pushed) over the cap */
	FRAME_E_TRUNCATED = 2, /* EOF inside a frame */
};

/* Name of a FRAME_E_* code, or NULL. */
const char *frame_error_name(int code);

/* Write the 4-byte prefix for a payload of len bytes (len <= UINT32_MAX). */
void frame_header_encode(uint8_t out[FRAME_HEADER_BYTES], uint32_t len);
uint32_t frame_header_decode(const uint8_t in[FRAME_HEADER_BYTES]);

/*
 * One frame popped from a reader. data points into the reader's buffer and
 * stays valid until the next frame_reader_feed() or frame_reader_pop().
 */
typedef struct Frame {
	const uint8_t *data; /* (len,) payload */
	size_t len;
	uint64_t offset;     /* stream offset of the frame's length prefix */
} Frame;

typedef struct FrameReader FrameReader;

/*
 * New reader with payload cap `cap` (0 means FRAME_MAX_BYTES). Returns 0,
 * -EINVAL for a cap over FRAME_CAP_LIMIT, or -ENOMEM.
 */
int frame_reader_new(size_t cap, FrameReader **ret);
FrameReader *frame_reader_free(FrameReader *r);
DEFINE_FREEP(FrameReader, frame_reader_free)

/*
 * Append n bytes just read from the stream (any split: one byte, half a
 * prefix, many frames). Every length prefix completed by these bytes is
 * checked against the cap at once. Returns 0, -ENOMEM, or FRAME_E_TOO_LARGE
 * (now or earlier: the reader is poisoned; err says which length).
 * The reader buffers at most the bytes fed and not yet popped: feed, then
 * pop until -EAGAIN, before feeding again.
 */
int frame_reader_feed(FrameReader *r, const void *data, size_t n, Error *err);

/*
 * Take the next complete frame. Returns 0 and fills *ret, -EAGAIN if no
 * complete frame is buffered, or the poison code.
 */
int frame_reader_pop(FrameReader *r, Frame *ret);

/*
 * The stream ended (read() returned 0). Returns 0 if the buffered bytes
 * are whole frames (they can still be popped), FRAME_E_TRUNCATED if the
 * last one is partial, or the poison code.
 */
int frame_reader_finish(FrameReader *r, Error *err);

/* Bytes fed and not yet popped as frames. */
size_t frame_reader_buffered(const FrameReader *r);
/* Total bytes fed since creation (the stream offset of the next byte). */
uint64_t frame_reader_offset(const FrameReader *r);
/* 0, or the code that poisoned the reader. */
int frame_reader_poisoned(const FrameReader *r);

typedef struct FrameWriter FrameWriter;

/*
 * Outgoing queue of frames on one connection. cap as for the reader: a
 * payload over it is refused when pushed. Returns 0, -EINVAL, -ENOMEM.
 */
int frame_writer_new(size_t cap, FrameWriter **ret);
/* Frees the queue and closes any fds still queued. */
FrameWriter *frame_writer_free(FrameWriter *w);
DEFINE_FREEP(FrameWriter, frame_writer_free)

/*
 * Queue one frame (copies the payload). With n_fds > 0 the fds (at most
 * FDPASS_MAX_FDS) are duplicated (F_DUPFD_CLOEXEC) and sent with the frame's
 * first byte; the caller keeps its own. Returns 0, FRAME_E_TOO_LARGE,
 * -EINVAL (too many fds), -ENOMEM, or -errno from dup.
 */
int frame_writer_push_dup_fds(FrameWriter *w, const void *payload, size_t len,
			      const int *fds, size_t n_fds, Error *err);
static inline int frame_writer_push(FrameWriter *w, const void *payload, size_t len, Error *err)
{
	return frame_writer_push_dup_fds(w, payload, len, NULL, 0, err);
}

/*
 * Write as much of the queue to sock as it takes (sendmsg, MSG_NOSIGNAL;
 * blocking or not as the socket is). Returns 0 when the queue is empty,
 * -EAGAIN when the socket is full and bytes remain (wait for POLLOUT), or
 * another -errno (EPIPE, ECONNRESET, ...): the connection is gone.
 */
int frame_writer_flush(FrameWriter *w, int sock);

/* Bytes queued and not yet accepted by the socket (for backpressure). */
size_t frame_writer_pending(const FrameWriter *w);
