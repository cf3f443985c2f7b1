/*
 * stream.c: UTF-8-safe, stop-string-aware text deltas (see stream.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"
#include "stream.h"

void text_stream_init(TextStream *s, uint8_t **stops, size_t *stop_lens, size_t n_stops)
{
	*s = (TextStream){ .stops = stops, .stop_lens = stop_lens, .n_stops = n_stops };
}

void text_stream_done(TextStream *s)
{
	free(s->held);
	s->held = NULL;
	s->n_held = s->cap = 0;
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

/* Copy s[0..n) to a new string, invalid bytes (and NUL) as U+FFFD; n must be a complete prefix unless `all`. */
static int text_sanitize(const uint8_t *s, size_t n, char **ret, size_t *ret_len)
{
	size_t cap;
	if (size_mul_overflows(n, 3, &cap) || size_add_overflows(cap, 1, &cap))
		return -ENOMEM;
	char *out = malloc(cap);
	size_t o = 0;
	if (!out)
		return -ENOMEM;
	for (size_t i = 0; i < n;) {
		int l = utf8_seq(s + i, n - i);
		if (l <= 0 || s[i] == 0) {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		} else {
			memcpy(out + o, s + i, (size_t)l);
			o += (size_t)l;
			i += (size_t)l;
		}
	}
	out[o] = 0;
	*ret = out;
	*ret_len = o;
	return 0;
}

/* Emit held[0..n) and keep the rest. */
static int text_stream_emit(TextStream *s, size_t n, char **ret_delta, size_t *ret_len)
{
	int r = text_sanitize(s->held, n, ret_delta, ret_len);
	if (r < 0)
		return r;
	memmove(s->held, s->held + n, s->n_held - n);
	s->n_held -= n;
	return 0;
}

static bool ends_with_prefix_of(const uint8_t *buf, size_t n, const uint8_t *stop, size_t stop_len, size_t k)
{
	/* Whether buf's last k bytes equal stop's first k bytes. */
	return k <= n && k < stop_len && memcmp(buf + n - k, stop, k) == 0;
}

int text_stream_push(TextStream *s, const void *piece, size_t len, char **ret_delta, size_t *ret_len)
{
	size_t need;
	if (s->stopped)
		return text_sanitize(NULL, 0, ret_delta, ret_len) < 0 ? -ENOMEM : 1;
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
	memcpy(s->held + s->n_held, piece, len);
	s->n_held += len;

	/* The earliest stop string in the held bytes ends the stream there. */
	size_t first = SIZE_MAX;
	for (size_t i = 0; i < s->n_stops; i++) {
		const uint8_t *p = memmem(s->held, s->n_held, s->stops[i], s->stop_lens[i]);
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
		for (size_t k = MIN(s->n_held, s->stop_lens[i] - 1); k > hold; k--)
			if (ends_with_prefix_of(s->held, s->n_held, s->stops[i], s->stop_lens[i], k)) {
				hold = k;
				break;
			}
	size_t n = utf8_complete_prefix(s->held, s->n_held - hold);
	return text_stream_emit(s, n, ret_delta, ret_len);
}

int text_stream_flush(TextStream *s, char **ret_delta, size_t *ret_len)
{
	return text_stream_emit(s, s->n_held, ret_delta, ret_len);
}
