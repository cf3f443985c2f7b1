/*
 * frame.c: the frame reader (bytes in any chunks -> complete frames) and the
 * frame writer (queued frames -> a socket that may take them piecewise).
 * Byte layout and rules: frame.h. Fds beside frames: fdpass.h.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "ipc/fdpass.h"
#include "ipc/frame.h"

#define READER_MIN_ALLOC 4096
#define READER_IDLE_ALLOC (64u * 1024) /* shrink back to this when mostly empty */

const char *frame_error_name(int code)
{
	switch (code) {
	case FRAME_E_TOO_LARGE:
		return "FRAME_E_TOO_LARGE";
	case FRAME_E_TRUNCATED:
		return "FRAME_E_TRUNCATED";
	default:
		return NULL;
	}
}

void frame_header_encode(uint8_t out[FRAME_HEADER_BYTES], uint32_t len)
{
	out[0] = (uint8_t)len;
	out[1] = (uint8_t)(len >> 8);
	out[2] = (uint8_t)(len >> 16);
	out[3] = (uint8_t)(len >> 24);
}

uint32_t frame_header_decode(const uint8_t in[FRAME_HEADER_BYTES])
{
	return (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 |
	       (uint32_t)in[3] << 24;
}

/* ---- reader ---- */

struct FrameReader {
	size_t cap;          /* payload cap */
	uint8_t *buf;        /* (alloc,) bytes [0, len) fed, [head, len) not popped */
	size_t alloc;
	size_t head;
	size_t len;
	size_t scan;         /* buf offset of the next prefix not yet checked; may be > len */
	uint64_t base;       /* stream offset of buf[0] */
	int poison;          /* 0 or the FRAME_E_* code that ended the stream */
	uint32_t bad_len;    /* the offending length, for messages */
	uint64_t bad_offset; /* its frame's stream offset */
};

int frame_reader_new(size_t cap, FrameReader **ret)
{
	FrameReader *r;

	assert(ret);
	if (cap == 0)
		cap = FRAME_MAX_BYTES;
	if (cap > FRAME_CAP_LIMIT)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->cap = cap;
	*ret = r;
	return 0;
}

FrameReader *frame_reader_free(FrameReader *r)
{
	if (r) {
		free(r->buf);
		free(r);
	}
	return NULL;
}

static int reader_poison_error(const FrameReader *r, Error *err)
{
	return error_set(err, r->poison, "frame at stream offset %llu: length %u exceeds the cap of %zu bytes",
			 (unsigned long long)r->bad_offset, (unsigned)r->bad_len, r->cap);
}

/* Drop popped bytes from the front, shrink an idle large buffer. */
static void reader_compact(FrameReader *r)
{
	if (r->head > 0) {
		memmove(r->buf, r->buf + r->head, r->len - r->head);
		r->len -= r->head;
		r->scan -= r->head;
		r->base += r->head;
		r->head = 0;
	}
	if (r->alloc > 4 * READER_IDLE_ALLOC && r->len <= READER_IDLE_ALLOC / 2) {
		uint8_t *p = realloc(r->buf, READER_IDLE_ALLOC);
		if (p) {
			r->buf = p;
			r->alloc = READER_IDLE_ALLOC;
		}
	}
}

/* Room for n more bytes. The size grows with what was fed, never with a prefix. */
static int reader_reserve(FrameReader *r, size_t n)
{
	size_t need, a;
	uint8_t *p;

	if (size_add_overflows(r->len, n, &need))
		return -ENOMEM;
	if (need <= r->alloc)
		return 0;
	a = MAX(r->alloc, (size_t)READER_MIN_ALLOC);
	while (a < need)
		a = a > SIZE_MAX / 2 ? need : a * 2;
	p = realloc(r->buf, a);
	if (!p)
		return -ENOMEM;
	r->buf = p;
	r->alloc = a;
	return 0;
}

int frame_reader_feed(FrameReader *r, const void *data, size_t n, Error *err)
{
	int k;

	assert(r);
	assert(data || n == 0);
	if (r->poison)
		return reader_poison_error(r, err);
	if (n == 0)
		return 0;
	reader_compact(r);
	k = reader_reserve(r, n);
	if (k < 0)
		return error_set(err, k, "out of memory buffering %zu frame bytes", n);
	memcpy(r->buf + r->len, data, n);
	r->len += n;

	/* Check every prefix these bytes completed, before anything is popped. */
	while (r->scan <= r->len && r->len - r->scan >= FRAME_HEADER_BYTES) {
		uint32_t l = frame_header_decode(r->buf + r->scan);
		if (l > r->cap) {
			r->poison = FRAME_E_TOO_LARGE;
			r->bad_len = l;
			r->bad_offset = r->base + r->scan;
			return reader_poison_error(r, err);
		}
		/* scan stays below len + 4 + cap: no overflow */
		r->scan += FRAME_HEADER_BYTES + (size_t)l;
	}
	return 0;
}

int frame_reader_pop(FrameReader *r, Frame *ret)
{
	size_t avail;
	uint32_t l;

	assert(r && ret);
	if (r->poison)
		return r->poison;
	avail = r->len - r->head;
	if (avail < FRAME_HEADER_BYTES)
		return -EAGAIN;
	l = frame_header_decode(r->buf + r->head);
	assert(l <= r->cap); /* feed() checked it */
	if (avail - FRAME_HEADER_BYTES < l)
		return -EAGAIN;
	*ret = (Frame){
		.data = r->buf + r->head + FRAME_HEADER_BYTES,
		.len = l,
		.offset = r->base + r->head,
	};
	r->head += FRAME_HEADER_BYTES + (size_t)l;
	return 0;
}

int frame_reader_finish(FrameReader *r, Error *err)
{
	assert(r);
	if (r->poison)
		return reader_poison_error(r, err);
	/* scan is the end of the last frame that started: past len means cut off */
	if (r->scan != r->len)
		return error_set(err, FRAME_E_TRUNCATED, "stream ended inside a frame, after %llu bytes",
				 (unsigned long long)(r->base + r->len));
	return 0;
}

size_t frame_reader_buffered(const FrameReader *r)
{
	return r->len - r->head;
}

uint64_t frame_reader_offset(const FrameReader *r)
{
	return r->base + r->len;
}

int frame_reader_poisoned(const FrameReader *r)
{
	return r->poison;
}

/* ---- writer ---- */

typedef struct WriterFds {
	uint64_t offset; /* stream offset of the frame they go with */
	size_t n;
	int fds[FDPASS_MAX_FDS];
} WriterFds;

struct FrameWriter {
	size_t cap;
	uint8_t *buf;     /* (alloc,) bytes [head, len) not yet sent */
	size_t alloc;
	size_t head;
	size_t len;
	uint64_t base;    /* stream offset of buf[0] */
	WriterFds *fdq;   /* (fdq_alloc,) records [fdq_head, fdq_len) pending, in stream order */
	size_t fdq_alloc;
	size_t fdq_head;
	size_t fdq_len;
};

int frame_writer_new(size_t cap, FrameWriter **ret)
{
	FrameWriter *w;

	assert(ret);
	if (cap == 0)
		cap = FRAME_MAX_BYTES;
	if (cap > FRAME_CAP_LIMIT)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->cap = cap;
	*ret = w;
	return 0;
}

static void writer_fds_close(WriterFds *f)
{
	for (size_t i = 0; i < f->n; i++)
		f->fds[i] = safe_close(f->fds[i]);
	f->n = 0;
}

FrameWriter *frame_writer_free(FrameWriter *w)
{
	if (w) {
		for (size_t i = w->fdq_head; i < w->fdq_len; i++)
			writer_fds_close(&w->fdq[i]);
		free(w->fdq);
		free(w->buf);
		free(w);
	}
	return NULL;
}

static int writer_reserve(FrameWriter *w, size_t n)
{
	size_t need, a;
	uint8_t *p;

	if (w->head == w->len) {
		w->base += w->len;
		w->head = w->len = 0;
	} else if (w->head >= w->len - w->head) {
		/* more dead bytes than live ones: move the live ones down */
		memmove(w->buf, w->buf + w->head, w->len - w->head);
		w->base += w->head;
		w->len -= w->head;
		w->head = 0;
	}
	if (size_add_overflows(w->len, n, &need))
		return -ENOMEM;
	if (need <= w->alloc)
		return 0;
	a = MAX(w->alloc, (size_t)READER_MIN_ALLOC);
	while (a < need)
		a = a > SIZE_MAX / 2 ? need : a * 2;
	p = realloc(w->buf, a);
	if (!p)
		return -ENOMEM;
	w->buf = p;
	w->alloc = a;
	return 0;
}

static int writer_fdq_reserve(FrameWriter *w)
{
	WriterFds *p;
	size_t a;

	if (w->fdq_head == w->fdq_len)
		w->fdq_head = w->fdq_len = 0;
	if (w->fdq_len < w->fdq_alloc)
		return 0;
	if (w->fdq_head > 0) {
		memmove(w->fdq, w->fdq + w->fdq_head, (w->fdq_len - w->fdq_head) * sizeof(*w->fdq));
		w->fdq_len -= w->fdq_head;
		w->fdq_head = 0;
		return 0;
	}
	a = w->fdq_alloc ? w->fdq_alloc * 2 : 4;
	p = realloc(w->fdq, a * sizeof(*p));
	if (!p)
		return -ENOMEM;
	w->fdq = p;
	w->fdq_alloc = a;
	return 0;
}

int frame_writer_push_dup_fds(FrameWriter *w, const void *payload, size_t len,
			      const int *fds, size_t n_fds, Error *err)
{
	WriterFds rec = { 0 };
	int k;

	assert(w);
	assert(payload || len == 0);
	assert(fds || n_fds == 0);
	if (len > w->cap)
		return error_set(err, FRAME_E_TOO_LARGE, "payload of %zu bytes exceeds the frame cap of %zu",
				 len, w->cap);
	if (n_fds > FDPASS_MAX_FDS)
		return error_set(err, -EINVAL, "%zu fds exceed the limit of %d per frame", n_fds,
				 FDPASS_MAX_FDS);
	if (n_fds > 0 && (k = writer_fdq_reserve(w)) < 0)
		return error_set(err, k, "out of memory queueing fds");
	k = writer_reserve(w, FRAME_HEADER_BYTES + len);
	if (k < 0)
		return error_set(err, k, "out of memory queueing a frame of %zu bytes", len);

	for (size_t i = 0; i < n_fds; i++) {
		int fd = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
		if (fd < 0) {
			k = -errno;
			writer_fds_close(&rec);
			return error_set(err, k, "cannot duplicate fd %d: %s", fds[i], strerror(-k));
		}
		rec.fds[rec.n++] = fd;
	}
	if (n_fds > 0) {
		rec.offset = w->base + w->len;
		w->fdq[w->fdq_len++] = rec;
	}
	frame_header_encode(w->buf + w->len, (uint32_t)len);
	if (len > 0)
		memcpy(w->buf + w->len + FRAME_HEADER_BYTES, payload, len);
	w->len += FRAME_HEADER_BYTES + len;
	return 0;
}

int frame_writer_flush(FrameWriter *w, int sock)
{
	assert(w);
	while (w->head < w->len) {
		uint64_t pos = w->base + w->head;
		WriterFds *rec = w->fdq_head < w->fdq_len ? &w->fdq[w->fdq_head] : NULL;
		WriterFds *next = NULL;
		size_t end = w->len, sent;
		int k;

		if (rec && rec->offset == pos) {
			/* fds go with this frame's first byte, bytes up to the next fds */
			if (w->fdq_head + 1 < w->fdq_len)
				next = &w->fdq[w->fdq_head + 1];
		} else {
			next = rec;
			rec = NULL;
		}
		if (next) {
			assert(next->offset > pos);
			end = (size_t)(next->offset - w->base);
		}
		k = fdpass_send_borrow_fds(sock, w->buf + w->head, end - w->head,
					   rec ? rec->fds : NULL, rec ? rec->n : 0, &sent);
		if (k == -EINTR)
			continue;
		if (k < 0)
			return k;
		if (rec) {
			/* the kernel holds its own references now */
			writer_fds_close(rec);
			w->fdq_head++;
		}
		w->head += sent;
	}
	return 0;
}

size_t frame_writer_pending(const FrameWriter *w)
{
	return w->len - w->head;
}
