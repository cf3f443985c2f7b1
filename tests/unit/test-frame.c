/*
 * test-frame.c: ipc/frame.h, the reader and the writer, on real sockets.
 *
 * Expected streams are built here byte by byte from the layout in frame.h
 * (little-endian length, payload), not with frame_header_encode(), and
 * compared frame by frame (payload bytes and stream offset) with what the
 * reader pops: for every split of a stream into two reads, byte by byte,
 * random chunks and the whole stream at once. Oversized lengths must be
 * rejected as soon as their fourth prefix byte arrives. The writer runs on
 * a non-blocking socketpair with a small send buffer, so partial writes
 * really happen, and every byte must arrive in order.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/frame.h"
#include "tests/unit/testutil.h"

typedef struct Expected {
	size_t n;
	size_t len[64];
	uint64_t offset[64];
	uint8_t *stream; /* (total,) */
	size_t total;
} Expected;

/* Append one frame to the expected stream, prefix written by hand. */
static void expected_add(Expected *e, const uint8_t *payload, size_t len)
{
	ck_assert_uint_lt(e->n, 64);
	e->stream = realloc(e->stream, e->total + 4 + len);
	ck_assert_ptr_nonnull(e->stream);
	e->stream[e->total + 0] = (uint8_t)(len & 0xff);
	e->stream[e->total + 1] = (uint8_t)((len >> 8) & 0xff);
	e->stream[e->total + 2] = (uint8_t)((len >> 16) & 0xff);
	e->stream[e->total + 3] = (uint8_t)((len >> 24) & 0xff);
	if (len)
		memcpy(e->stream + e->total + 4, payload, len);
	e->len[e->n] = len;
	e->offset[e->n] = e->total;
	e->n++;
	e->total += 4 + len;
}

/* A stream of frames of awkward lengths (0, 1, 3, 4, 5, ...) with random bytes. */
static void expected_build(Expected *e, uint64_t *rng)
{
	static const size_t lens[] = { 0, 1, 3, 4, 5, 0, 17, 255, 256, 2, 0, 100 };
	uint8_t buf[256];

	memset(e, 0, sizeof(*e));
	for (size_t i = 0; i < ARRAY_SIZE(lens); i++) {
		for (size_t k = 0; k < lens[i]; k++)
			buf[k] = (uint8_t)test_rand_u64(rng);
		expected_add(e, buf, lens[i]);
	}
}

/* Pop every complete frame and compare with e from index *next on. */
static void pop_and_check(FrameReader *r, const Expected *e, size_t *next)
{
	Frame f;
	int k;

	while ((k = frame_reader_pop(r, &f)) == 0) {
		size_t i = (*next)++;
		ck_assert_uint_lt(i, e->n);
		ck_assert_uint_eq(f.len, e->len[i]);
		ck_assert_uint_eq(f.offset, e->offset[i]);
		ck_assert(memcmp(f.data, e->stream + e->offset[i] + 4, f.len) == 0);
	}
	ck_assert_int_eq(k, -EAGAIN);
}

START_TEST(test_header_layout)
{
	uint8_t b[4];
	const uint8_t want[4] = { 0x78, 0x56, 0x34, 0x12 };

	frame_header_encode(b, 0x12345678u);
	ck_assert(memcmp(b, want, 4) == 0);
	ck_assert_uint_eq(frame_header_decode(want), 0x12345678u);
	ck_assert_uint_eq(frame_header_decode((const uint8_t[]){ 0xff, 0xff, 0xff, 0xff }), 0xffffffffu);
}
END_TEST

START_TEST(test_split_everywhere)
{
	uint64_t rng = test_seed();
	Expected e;

	expected_build(&e, &rng);
	for (size_t cut = 0; cut <= e.total; cut++) {
		_cleanup_(frame_reader_freep) FrameReader *r = NULL;
		size_t next = 0;

		ck_assert_int_eq(frame_reader_new(0, &r), 0);
		ck_assert_int_eq(frame_reader_feed(r, e.stream, cut, NULL), 0);
		pop_and_check(r, &e, &next);
		ck_assert_int_eq(frame_reader_finish(r, NULL) == 0,
				 next < e.n ? cut == e.offset[next] : 1);
		ck_assert_int_eq(frame_reader_feed(r, e.stream + cut, e.total - cut, NULL), 0);
		pop_and_check(r, &e, &next);
		ck_assert_uint_eq(next, e.n);
		ck_assert_uint_eq(frame_reader_buffered(r), 0);
		ck_assert_uint_eq(frame_reader_offset(r), e.total);
		ck_assert_int_eq(frame_reader_finish(r, NULL), 0);
	}
	free(e.stream);
}
END_TEST

START_TEST(test_byte_by_byte_and_chunks)
{
	uint64_t rng = test_seed() ^ 0x1234;
	Expected e;

	expected_build(&e, &rng);
	/* one byte per read */
	{
		_cleanup_(frame_reader_freep) FrameReader *r = NULL;
		size_t next = 0;
		ck_assert_int_eq(frame_reader_new(0, &r), 0);
		for (size_t i = 0; i < e.total; i++) {
			ck_assert_int_eq(frame_reader_feed(r, e.stream + i, 1, NULL), 0);
			pop_and_check(r, &e, &next);
		}
		ck_assert_uint_eq(next, e.n);
	}
	/* many frames in one read (coalesced) */
	{
		_cleanup_(frame_reader_freep) FrameReader *r = NULL;
		size_t next = 0;
		ck_assert_int_eq(frame_reader_new(0, &r), 0);
		ck_assert_int_eq(frame_reader_feed(r, e.stream, e.total, NULL), 0);
		ck_assert_uint_eq(frame_reader_buffered(r), e.total);
		pop_and_check(r, &e, &next);
		ck_assert_uint_eq(next, e.n);
	}
	/* random chunks, and feeding without popping in between */
	for (int round = 0; round < 200; round++) {
		_cleanup_(frame_reader_freep) FrameReader *r = NULL;
		size_t next = 0, at = 0;
		ck_assert_int_eq(frame_reader_new(0, &r), 0);
		while (at < e.total) {
			size_t n = 1 + test_rand_u64(&rng) % 40;
			n = MIN(n, e.total - at);
			ck_assert_int_eq(frame_reader_feed(r, e.stream + at, n, NULL), 0);
			at += n;
			if (test_rand_u64(&rng) & 1)
				pop_and_check(r, &e, &next);
		}
		pop_and_check(r, &e, &next);
		ck_assert_uint_eq(next, e.n);
		ck_assert_int_eq(frame_reader_finish(r, NULL), 0);
	}
	free(e.stream);
}
END_TEST

START_TEST(test_cap)
{
	_cleanup_(frame_reader_freep) FrameReader *r = NULL;
	const uint8_t ok[] = { 100, 0, 0, 0 };   /* exactly the cap */
	const uint8_t big[] = { 101, 0, 0, 0 };  /* one over */
	uint8_t payload[100] = { 0 };
	Error err = { 0 };
	Frame f;

	ck_assert_int_eq(frame_reader_new(FRAME_CAP_LIMIT + 1, &r), -EINVAL);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(frame_reader_new(100, &r), 0);
	ck_assert_int_eq(frame_reader_feed(r, ok, 4, NULL), 0);
	ck_assert_int_eq(frame_reader_feed(r, payload, 100, NULL), 0);
	ck_assert_int_eq(frame_reader_pop(r, &f), 0);
	ck_assert_uint_eq(f.len, 100);

	/* the over-cap prefix, split 1 + 3: rejected at the fourth byte */
	ck_assert_int_eq(frame_reader_feed(r, big, 1, NULL), 0);
	ck_assert_int_eq(frame_reader_feed(r, big + 1, 3, &err), FRAME_E_TOO_LARGE);
	ck_assert_int_eq(err.code, FRAME_E_TOO_LARGE);
	ck_assert_ptr_nonnull(strstr(err.msg, "101"));
	ck_assert_int_eq(frame_reader_poisoned(r), FRAME_E_TOO_LARGE);
	/* poisoned: everything after says the same, nothing pops */
	ck_assert_int_eq(frame_reader_feed(r, payload, 10, NULL), FRAME_E_TOO_LARGE);
	ck_assert_int_eq(frame_reader_pop(r, &f), FRAME_E_TOO_LARGE);
	ck_assert_int_eq(frame_reader_finish(r, NULL), FRAME_E_TOO_LARGE);
}
END_TEST

START_TEST(test_huge_length_not_allocated)
{
	/*
	 * 4 GiB - 1 announced with the largest cap allowed and with the
	 * default: rejected after the 4 prefix bytes, with nothing else fed
	 * (were it allocated, ASan's allocator would refuse or the test would
	 * take gigabytes).
	 */
	const uint8_t huge[] = { 0xff, 0xff, 0xff, 0xff };
	const size_t caps[] = { 0, FRAME_CAP_LIMIT };

	for (size_t i = 0; i < ARRAY_SIZE(caps); i++) {
		_cleanup_(frame_reader_freep) FrameReader *r = NULL;
		ck_assert_int_eq(frame_reader_new(caps[i], &r), 0);
		ck_assert_int_eq(frame_reader_feed(r, huge, 4, NULL), FRAME_E_TOO_LARGE);
	}
	/* a bad prefix behind good frames in the same read */
	{
		_cleanup_(frame_reader_freep) FrameReader *r = NULL;
		const uint8_t s[] = { 1, 0, 0, 0, 'x', 0, 0, 0, 0, 0, 0, 0, 0x80 };
		ck_assert_int_eq(frame_reader_new(1000, &r), 0);
		ck_assert_int_eq(frame_reader_feed(r, s, sizeof(s), NULL), FRAME_E_TOO_LARGE);
	}
}
END_TEST

START_TEST(test_eof)
{
	const uint8_t stream[] = { 0, 0, 0, 0, 3, 0, 0, 0, 'a', 'b', 'c' };
	Frame f;

	/* every prefix of the stream: clean EOF only at frame boundaries */
	for (size_t n = 0; n <= sizeof(stream); n++) {
		_cleanup_(frame_reader_freep) FrameReader *r = NULL;
		Error err = { 0 };
		bool boundary = n == 0 || n == 4 || n == sizeof(stream);
		ck_assert_int_eq(frame_reader_new(0, &r), 0);
		ck_assert_int_eq(frame_reader_feed(r, stream, n, NULL), 0);
		ck_assert_int_eq(frame_reader_finish(r, &err), boundary ? 0 : FRAME_E_TRUNCATED);
		if (!boundary)
			ck_assert(err.msg[0] != 0);
		/* whole frames are still there after finish() */
		if (n >= 4) {
			ck_assert_int_eq(frame_reader_pop(r, &f), 0);
			ck_assert_uint_eq(f.len, 0);
			ck_assert_uint_eq(f.offset, 0);
		}
		if (n == sizeof(stream)) {
			ck_assert_int_eq(frame_reader_pop(r, &f), 0);
			ck_assert_uint_eq(f.len, 3);
			ck_assert_uint_eq(f.offset, 4);
			ck_assert(memcmp(f.data, "abc", 3) == 0);
		}
		ck_assert_int_eq(frame_reader_pop(r, &f), -EAGAIN);
	}
}
END_TEST

/* Read what is there (non-blocking) from sock into r; pop into the check. */
static size_t drain_some(int sock, FrameReader *r, size_t max, const uint8_t *sent,
			 uint64_t *checked_to, size_t *frames)
{
	uint8_t buf[3000];
	ssize_t n = read(sock, buf, MIN(max, sizeof(buf)));
	Frame f;

	if (n < 0) {
		ck_assert_int_eq(errno, EAGAIN);
		return 0;
	}
	ck_assert_int_gt(n, 0);
	ck_assert_int_eq(frame_reader_feed(r, buf, (size_t)n, NULL), 0);
	while (frame_reader_pop(r, &f) == 0) {
		/* every frame is at the next offset and carries the bytes sent there */
		ck_assert_uint_eq(f.offset, *checked_to);
		ck_assert(memcmp(f.data, sent + f.offset + 4, f.len) == 0);
		ck_assert_uint_eq(sent[f.offset] | sent[f.offset + 1] << 8, f.len);
		*checked_to += 4 + f.len;
		(*frames)++;
	}
	return (size_t)n;
}

START_TEST(test_writer_partial)
{
	_cleanup_(frame_writer_freep) FrameWriter *w = NULL;
	_cleanup_(frame_reader_freep) FrameReader *r = NULL;
	uint64_t rng = test_seed() ^ 0xabcd;
	int sv[2], sndbuf = 4096;
	const size_t n_frames = 300;
	uint8_t *sent = NULL;
	size_t total = 0, frames = 0, eagain = 0;
	uint64_t checked_to = 0;
	int k;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
	ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
	ck_assert_int_eq(frame_writer_new(0, &w), 0);
	ck_assert_int_eq(frame_reader_new(0, &r), 0);

	/* our own copy of the stream, laid out by hand */
	for (size_t i = 0; i < n_frames; i++) {
		size_t len = test_rand_u64(&rng) % 20000;
		uint8_t *p;
		if (i % 7 == 0)
			len = 0;
		sent = realloc(sent, total + 4 + len);
		ck_assert_ptr_nonnull(sent);
		p = sent + total;
		p[0] = (uint8_t)len;
		p[1] = (uint8_t)(len >> 8);
		p[2] = (uint8_t)(len >> 16);
		p[3] = 0;
		for (size_t j = 0; j < len; j++)
			p[4 + j] = (uint8_t)test_rand_u64(&rng);
		ck_assert_int_eq(frame_writer_push(w, p + 4, len, NULL), 0);
		total += 4 + len;
	}
	ck_assert_uint_eq(frame_writer_pending(w), total);

	/* flush until done, reading small random amounts whenever the socket is full */
	while ((k = frame_writer_flush(w, sv[0])) == -EAGAIN) {
		size_t before = frame_writer_pending(w);
		eagain++;
		ck_assert_uint_gt(before, 0);
		ck_assert_uint_le(before, total);
		drain_some(sv[1], r, 1 + test_rand_u64(&rng) % 3000, sent, &checked_to, &frames);
		/* a push while data is pending lands behind it */
		if (eagain == 5) {
			uint8_t *p;
			sent = realloc(sent, total + 4 + 3);
			ck_assert_ptr_nonnull(sent);
			p = sent + total;
			memcpy(p, "\x03\0\0\0xyz", 7);
			ck_assert_int_eq(frame_writer_push(w, "xyz", 3, NULL), 0);
			total += 7;
		}
	}
	ck_assert_int_eq(k, 0);
	ck_assert_uint_eq(frame_writer_pending(w), 0);
	ck_assert_uint_gt(eagain, 10); /* partial writes really happened */
	while (checked_to < total)
		drain_some(sv[1], r, 3000, sent, &checked_to, &frames);
	ck_assert_uint_eq(frames, n_frames + 1);
	ck_assert_uint_eq(frame_reader_offset(r), total);
	free(sent);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

START_TEST(test_writer_errors)
{
	_cleanup_(frame_writer_freep) FrameWriter *w = NULL;
	uint8_t big[101] = { 0 };
	Error err = { 0 };
	int sv[2];

	ck_assert_int_eq(frame_writer_new(FRAME_CAP_LIMIT + 1, &w), -EINVAL);
	ck_assert_int_eq(frame_writer_new(100, &w), 0);
	ck_assert_int_eq(frame_writer_push(w, big, 101, &err), FRAME_E_TOO_LARGE);
	ck_assert(err.msg[0] != 0);
	ck_assert_uint_eq(frame_writer_pending(w), 0);
	ck_assert_int_eq(frame_writer_push(w, big, 100, NULL), 0);
	ck_assert_uint_eq(frame_writer_pending(w), 104);
	ck_assert_int_eq(frame_writer_flush(w, -1), -EBADF);
	ck_assert_uint_eq(frame_writer_pending(w), 104);

	/* peer gone: EPIPE as a value, no SIGPIPE */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	close(sv[1]);
	ck_assert_int_eq(frame_writer_flush(w, sv[0]), -EPIPE);
	close(sv[0]);
	ck_assert_str_eq(frame_error_name(FRAME_E_TOO_LARGE), "FRAME_E_TOO_LARGE");
	ck_assert_str_eq(frame_error_name(FRAME_E_TRUNCATED), "FRAME_E_TRUNCATED");
	ck_assert_ptr_null(frame_error_name(0));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("frame");

	tcase_add_test(tc, test_header_layout);
	tcase_add_test(tc, test_split_everywhere);
	tcase_add_test(tc, test_byte_by_byte_and_chunks);
	tcase_add_test(tc, test_cap);
	tcase_add_test(tc, test_huge_length_not_allocated);
	tcase_add_test(tc, test_eof);
	tcase_add_test(tc, test_writer_partial);
	tcase_add_test(tc, test_writer_errors);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
