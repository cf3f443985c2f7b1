/*
 * bpe.h: byte-level BPE ("gpt2" vocabularies), internal to the tokenizer.
 *
 * GPT-2's bytes_to_unicode() maps every byte to one printable code point,
 * so that token texts are valid UTF-8; merges from
 * `tokenizer.ggml.merges` ("left right", rank = index) then join adjacent
 * symbols of a pre-tokenized word, lowest rank first, ties to the
 * leftmost pair.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "engine/text/pretokenize.h"
#include "engine/text/symbols.h"
#include "engine/text/tokenizer-internal.h"

/* Code points bytes_to_unicode() uses are all below this. */
#define BYTE_CP_MAX 0x144

/* bytes_to_unicode(), both ways. */
typedef struct ByteMap {
	uint32_t b2c[256];          /* byte -> code point */
	int16_t c2b[BYTE_CP_MAX];   /* code point -> byte, -1 for none */
} ByteMap;

void bpe_byte_map_init(ByteMap *m);

/*
 * Build t->merges from v->merges, t's vocabulary already indexed.
 * Returns 0, -ENOMEM or TOKENIZER_E_INVALID.
 */
int bpe_build_merges(Tokenizer *t, const TokenizerVocab *v, Error *err);

/* Fill t->byte_sym, t->byte_sym_len and t->byte_token. */
void bpe_build_bytes(Tokenizer *t);

/*
 * The raw bytes of the n bytes of byte-level token text s, written to out
 * (room for n bytes: never longer). Code points outside the map stay as
 * they are. Returns the length written.
 */
size_t bpe_piece_from_text(const ByteMap *m, const char *s, size_t n, char *out);

/*
 * Pre-tokenize n bytes of plain text s and append the ids of each word's
 * merges to out. p and sym are scratch. Returns 0 or -ENOMEM.
 */
int bpe_encode(const Tokenizer *t, const char *s, size_t n, Pretok *p, Symbols *sym,
	       IdVec *out);
