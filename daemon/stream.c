/*
 * stream.c: UTF-8-safe, stop-string-aware text deltas (see stream.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "daemon/stream.h"

void text_stream_init(TextStream *s, uint8_t **stops, size_t *stop_lens, size_t n_stops)
{
	*s = (TextStream){ .stops = stops, .stop_lens = stop_lens, .n_stops = n_stops };
}

void text_stream_done(TextStream *s)
{
	free(s->held);
	free(s->out);
	s->held = NULL;
	s->out = NULL;
	s->n_held = s->cap = s->out_cap = 0;
}

/*
 * Length of the valid UTF-8 sequence starting at s[0..n): 1..4; 0 if it is
 * a valid start cut short by the end of the buffer; -1 if invalid.
 */
static int utf8_seq(const uint8_t *s, size_t n)
{
	uint8_t c = s[0];
	int len;
	uint8_t lo = 0x80, hi = 0xbf;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f; /* no surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
	} else
		return -1;
	for (int i = 1; i < len; i++) {
		if ((size_t)i >= n)
			return 0;
		uint8_t lim_lo = i == 1 ? lo : 0x80, lim_hi = i == 1 ? hi : 0xbf;
		if (s[i] < lim_lo || s[i] > lim_hi)
			return -1;
	}
	return len;
}

size_t utf8_complete_prefix(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		int l = utf8_seq(s + i, n - i);
		if (l == 0)
			return i;
		i += l < 0 ? 1 : (size_t)l;
	}
	return n;
}

/*
 * Copy held[0..n) into s->out, invalid bytes (and NUL) as U+FFFD, and
 * keep the rest held. s->out is reused from token to token: no
 * allocation once it has grown to the longest delta (3x a piece).
 */
static int text_stream_emit(TextStream *s, size_t n, const char **ret_delta, size_t *ret_len)
{
	const uint8_t *h = s->held;
	size_t need, o = 0;

	if (size_mul_overflows(n, 3, &need) || size_add_overflows(need, 1, &need))
		return -ENOMEM;
	if (need > s->out_cap) {
		size_t cap = MAX(need, 64u);
		char *p = realloc(s->out, cap);
		if (!p)
			return -ENOMEM;
		s->out = p;
		s->out_cap = cap;
	}
	for (size_t i = 0; i < n;) {
		int l = utf8_seq(h + i, n - i);
		if (l <= 0 || h[i] == 0) {
			memcpy(s->out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		} else {
			memcpy(s->out + o, h + i, (size_t)l);
			o += (size_t)l;
			i += (size_t)l;
		}
	}
	s->out[o] = 0;
	if (n > 0)
		memmove(s->held, s->held + n, s->n_held - n);
	s->n_held -= n;
	*ret_delta = s->out;
	*ret_len = o;
	return 0;
}

/*
 * The longest tail of held[0..n) (shorter than the stop string) that is
 * a prefix of stop: tails start at most stop_len - 1 bytes from the end.
 */
static size_t stop_prefix_tail(const uint8_t *held, size_t n, const uint8_t *stop, size_t stop_len)
{
	for (size_t j = n - MIN(n, stop_len - 1); j < n; j++)
		if (held[j] == stop[0] && memcmp(held + j, stop, n - j) == 0)
			return n - j;
	return 0;
}

/*
 * The cost per token is linear in the new bytes and the stop strings,
 * never in the output so far: what is held is at most the longest stop
 * string plus an incomplete character (everything older went out), and
 * a stop string not found before cannot start more than its length
 * before the new bytes.
 */
int text_stream_push(TextStream *s, const void *piece, size_t len, const char **ret_delta, size_t *ret_len)
{
	size_t need, old = s->n_held;
	if (s->stopped) {
		int r = text_stream_emit(s, 0, ret_delta, ret_len);
		return r < 0 ? r : 1;
	}
	if (size_add_overflows(s->n_held, len, &need))
		return -ENOMEM;
	if (need > s->cap) {
		size_t cap = MAX(need, 2 * s->cap + 16);
		uint8_t *p = realloc(s->held, cap);
		if (!p)
			return -ENOMEM;
		s->held = p;
		s->cap = cap;
	}
	if (len)
		memcpy(s->held + s->n_held, piece, len);
	s->n_held += len;

	/* The earliest stop string in the held bytes ends the stream there. */
	size_t first = SIZE_MAX;
	for (size_t i = 0; i < s->n_stops; i++) {
		size_t from = old - MIN(old, s->stop_lens[i] - 1);
		const uint8_t *p = memmem(s->held + from, s->n_held - from, s->stops[i], s->stop_lens[i]);
		if (p && (size_t)(p - s->held) < first)
			first = (size_t)(p - s->held);
	}
	if (first != SIZE_MAX) {
		s->stopped = true;
		int r = text_stream_emit(s, first, ret_delta, ret_len);
		s->n_held = 0;
		return r < 0 ? r : 1;
	}

	/* Hold back the longest tail that could still grow into a stop string. */
	size_t hold = 0;
	for (size_t i = 0; i < s->n_stops; i++)
		hold = MAX(hold, stop_prefix_tail(s->held, s->n_held, s->stops[i], s->stop_lens[i]));
	size_t n = utf8_complete_prefix(s->held, s->n_held - hold);
	return text_stream_emit(s, n, ret_delta, ret_len);
}

int text_stream_flush(TextStream *s, const char **ret_delta, size_t *ret_len)
{
	return text_stream_emit(s, s->n_held, ret_delta, ret_len);
}
