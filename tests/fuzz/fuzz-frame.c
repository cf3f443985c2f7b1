/*
 * fuzz-frame.c: libFuzzer target for the frame reader (ipc/frame.c).
 *
 * Input layout: byte 0 is the payload cap less one (1..256, small so that both
 * accepted and oversized lengths are common), bytes 1..4 are chunk sizes
 * (1 + b % 32, used in turn), the rest is the byte stream, fed chunk by
 * chunk with every complete frame popped after each feed.
 *
 * Promises checked against an independent walk of the stream (prefix by
 * prefix, as frame.h documents the layout):
 * - frames pop in order, each at the stream offset the walk says, with
 *   len <= cap and exactly the payload bytes of the stream;
 * - popped bytes + buffered bytes == bytes fed, at every step;
 * - the first length over the cap is FRAME_E_TOO_LARGE exactly in the feed
 *   that completes its prefix, no frame at or after it pops, and from then
 *   on every call returns FRAME_E_TOO_LARGE (poisoned);
 * - every whole frame before an oversized prefix pops;
 * - at the end, finish() is 0 iff the stream ends on a frame boundary.
 */
#include <errno.h>
#include <string.h>

#include "ipc/frame.h"

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FrameReader *r = NULL;
	const uint8_t *s;
	size_t n, cap, fed = 0, popped = 0, chunk_i = 0;
	size_t bad_at = SIZE_MAX; /* stream offset of the first oversized prefix */
	size_t walk_end = 0;      /* end of the last frame the walk saw start */
	size_t walk_whole = 0;    /* end of the last frame wholly in the stream */
	uint64_t next_offset = 0;
	int poison = 0;

	if (size < 5)
		return 0;
	cap = 1 + (size_t)data[0];
	s = data + 5;
	n = size - 5;

	/* the independent walk */
	while (walk_end + 4 <= n) {
		size_t l = (size_t)s[walk_end] | (size_t)s[walk_end + 1] << 8 |
			   (size_t)s[walk_end + 2] << 16 | (size_t)s[walk_end + 3] << 24;
		if (l > cap) {
			bad_at = walk_end;
			break;
		}
		walk_end += 4 + l;
		if (walk_end <= n)
			walk_whole = walk_end;
	}

	CHECK(frame_reader_new(cap, &r) == 0);

	while (fed < n) {
		size_t c = 1 + data[1 + chunk_i++ % 4] % 32;
		Frame f;
		int k;

		c = c < n - fed ? c : n - fed;
		k = frame_reader_feed(r, s + fed, c, NULL);
		fed += c;
		if (poison) {
			CHECK(k == poison);
		} else if (k != 0) {
			CHECK(k == FRAME_E_TOO_LARGE);
			/* the prefix of the bad frame was completed by this chunk */
			CHECK(bad_at != SIZE_MAX && bad_at + 4 <= fed && bad_at + 4 > fed - c);
			poison = k;
		} else {
			CHECK(bad_at == SIZE_MAX || bad_at + 4 > fed);
		}
		while ((k = frame_reader_pop(r, &f)) == 0) {
			CHECK(!poison);
			CHECK(f.len <= cap);
			CHECK(f.offset == next_offset);
			CHECK(f.offset + 4 + f.len <= fed);
			CHECK(f.offset < bad_at);
			CHECK(memcmp(f.data, s + f.offset + 4, f.len) == 0);
			next_offset += 4 + f.len;
			popped += 4 + f.len;
		}
		CHECK(k == (poison ? poison : -EAGAIN));
		CHECK(frame_reader_poisoned(r) == poison);
		if (!poison) {
			CHECK(popped + frame_reader_buffered(r) == fed);
			CHECK(frame_reader_offset(r) == fed);
		}
	}
	CHECK(poison == (bad_at != SIZE_MAX ? FRAME_E_TOO_LARGE : 0));
	if (!poison)
		CHECK(next_offset == walk_whole); /* every whole frame popped */
	if (poison)
		CHECK(frame_reader_finish(r, NULL) == poison);
	else
		CHECK(frame_reader_finish(r, NULL) == (walk_end == n ? 0 : FRAME_E_TRUNCATED));
	frame_reader_free(r);
	return 0;
}
