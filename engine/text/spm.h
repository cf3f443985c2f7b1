/*
 * spm.h: SentencePiece ("llama" vocabularies: Llama 2, Mistral), internal
 * to the tokenizer.
 *
 * Spaces are spelled U+2581; adjacent symbols merge into the
 * best-scoring piece first (`tokenizer.ggml.scores`), ties to the
 * leftmost pair; what no piece covers falls back to <0xNN> byte tokens,
 * then to the unknown token.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "engine/text/symbols.h"
#include "engine/text/tokenizer-internal.h"

/* Fill t->byte_token: the <0xNN> token of each byte, else the byte alone. */
void spm_build_bytes(Tokenizer *t);

/*
 * The raw bytes of the n bytes of piece text s (U+2581 read as a space),
 * written to out (room for n bytes: never longer). Returns the length
 * written.
 */
size_t spm_piece_from_text(const char *s, size_t n, char *out);

/*
 * Append the ids of n bytes of plain text s to out, with a space in front
 * when prefix is set. sym is scratch. Returns 0 or -ENOMEM.
 */
int spm_encode(const Tokenizer *t, const char *s, size_t n, bool prefix, Symbols *sym,
	       IdVec *out);
