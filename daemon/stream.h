/*
 * stream.h: turning a request's token pieces into the text deltas the
 * client sees.
 *
 * Two things are held back from the client until they are settled:
 * - the bytes of a UTF-8 character whose remaining bytes have not been
 *   generated yet (byte-level tokens split characters), so a delta never
 *   ends inside a character;
 * - a tail of the output that is a prefix of a stop string, since the
 *   next token may complete the stop string, which is never streamed.
 * Bytes that can never become valid UTF-8 (the model can emit them) are
 * replaced by U+FFFD, so every delta is valid UTF-8 as the protocol
 * promises.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct TextStream {
	uint8_t **stops;   /* (n_stops,) borrowed */
	size_t *stop_lens; /* (n_stops,) */
	size_t n_stops;
	uint8_t *held;     /* bytes generated, not yet emitted */
	size_t n_held, cap;
	char *out;         /* the last delta, NUL-terminated (reused) */
	size_t out_cap;
	bool stopped;      /* a stop string was seen: nothing more is accepted */
} TextStream;

/* Start a stream watching for n_stops stop strings (borrowed, each non-empty). */
void text_stream_init(TextStream *s, uint8_t **stops, size_t *stop_lens, size_t n_stops);
void text_stream_done(TextStream *s);

/*
 * Add one token's bytes. Points *ret_delta at the text that may be sent
 * now (owned by the stream, valid until its next call; may be empty,
 * NUL-terminated) and writes its length. Costs O(len + stop strings),
 * not O(output so far), and allocates nothing once warmed up. Returns 0,
 * 1 if a stop string was completed (the delta holds the text before it;
 * the stream is finished), or -ENOMEM.
 */
int text_stream_push(TextStream *s, const void *piece, size_t len, const char **ret_delta, size_t *ret_len);

/*
 * The stream ends for another reason: everything held goes out, an
 * incomplete character as U+FFFD. Same outputs as text_stream_push().
 */
int text_stream_flush(TextStream *s, const char **ret_delta, size_t *ret_len);

/*
 * Length of the longest prefix of s[0..n) that does not end inside a
 * UTF-8 sequence that could still be completed (for tests).
 */
size_t utf8_complete_prefix(const uint8_t *s, size_t n);
