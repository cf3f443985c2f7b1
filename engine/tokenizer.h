/*
 * tokenizer.h: text <-> token ids, from the vocabulary in GGUF metadata.
 *
 * Two models, chosen by `tokenizer.ggml.model`:
 *   "gpt2"  byte-level BPE: a pre-tokenizer regex (chosen by
 *           `tokenizer.ggml.pre`: gpt2, llama-bpe/llama3, qwen2, smollm,
 *           default) splits text, bytes map to printable code points,
 *           then ranked merges from `tokenizer.ggml.merges`.
 *   "llama" SentencePiece (Llama 2, Mistral): scores from
 *           `tokenizer.ggml.scores`, spaces as U+2581, <0xNN> byte fallback.
 * Special (control / user-defined) tokens are matched verbatim in the
 * text when parse_special is set, and never produced from plain text
 * otherwise. Decoding a token yields its raw bytes: concatenating pieces
 * reproduces the encoded bytes exactly, even when a piece is not valid
 * UTF-8 on its own (byte-level tokens split multi-byte characters).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

enum {
	TOKENIZER_E_UNSUPPORTED = 1, /* model or pre-tokenizer we do not implement */
	TOKENIZER_E_INVALID,         /* malformed vocabulary metadata */
};

typedef struct Tokenizer Tokenizer;

int tokenizer_new_from_gguf(const Gguf *g, Tokenizer **ret, Error *err);
Tokenizer *tokenizer_free(Tokenizer *t);
DEFINE_FREEP(Tokenizer, tokenizer_free)

int32_t tokenizer_n_vocab(const Tokenizer *t);
int32_t tokenizer_bos(const Tokenizer *t);   /* -1 if none */
int32_t tokenizer_eos(const Tokenizer *t);   /* -1 if none */
bool tokenizer_add_bos(const Tokenizer *t);  /* whether prompts start with BOS */

/* True for tokens that end a generation (eos, eot, <|im_end|>, <|eot_id|>...). */
bool tokenizer_is_eog(const Tokenizer *t, int32_t id);

/* Token id of an exact piece (e.g. "<|im_end|>"), or -1. */
int32_t tokenizer_find(const Tokenizer *t, const char *piece);

/*
 * Encode len bytes of text (need not be valid UTF-8: invalid bytes are
 * encoded as byte tokens). Does not add BOS. *ret_ids is malloc'd.
 * Returns 0 or -ENOMEM.
 */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool parse_special,
		     int32_t **ret_ids, size_t *ret_n);

/*
 * The raw bytes of token id (byte-level decoded; SentencePiece U+2581 as
 * a space, <0xNN> as that byte). Valid while t lives; NULL, len 0 for ids
 * out of range.
 */
const char *tokenizer_piece(const Tokenizer *t, int32_t id, size_t *ret_len);
