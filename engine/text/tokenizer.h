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
 * Special tokens are matched verbatim in the text, longest first (as
 * llama.cpp does): control and unknown tokens only when parse_special is
 * set, user-defined tokens always (HF tokenizers and llama.cpp split
 * added tokens out before pre-tokenizing, whatever parse_special says).
 * Decoding a token yields its raw bytes: concatenating pieces reproduces
 * the encoded bytes exactly (SentencePiece: with the prefix space it adds),
 * even when a piece is not valid UTF-8 on its own (byte-level tokens split
 * multi-byte characters). Bytes that are not
 * valid UTF-8 are encoded each as its own byte token (llama.cpp would
 * substitute U+FFFD and lose them). A byte the vocabulary has no token for
 * (SmolLM2 lacks 21, e.g. 0xff and 0x04) is dropped, as llama.cpp does;
 * SentencePiece falls back to the unknown token instead.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/gguf/gguf.h"

enum {
	TOKENIZER_E_UNSUPPORTED = 1, /* model or pre-tokenizer we do not implement */
	TOKENIZER_E_INVALID,         /* malformed vocabulary metadata */
};

typedef struct Tokenizer Tokenizer;

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
	TOKEN_TYPE_NORMAL = 1,
	TOKEN_TYPE_UNKNOWN = 2,
	TOKEN_TYPE_CONTROL = 3,
	TOKEN_TYPE_USER_DEFINED = 4,
	TOKEN_TYPE_UNUSED = 5,
	TOKEN_TYPE_BYTE = 6,
};

/*
 * A vocabulary as plain arrays: what tokenizer_new_from_gguf() reads from
 * the tokenizer.ggml.* keys, and what tests build by hand. Borrowed: the
 * tokenizer copies what it keeps.
 */
typedef struct TokenizerVocab {
	const char *model;        /* "gpt2" (byte-level BPE) or "llama" (SentencePiece) */
	const char *pre;          /* gpt2 pre-tokenizer name; NULL means "default" */
	size_t n_tokens;
	const GgufStr *tokens;    /* (n_tokens) token texts as stored */
	const int32_t *types;     /* (n_tokens) TOKEN_TYPE_*, or NULL: all normal */
	const float *scores;      /* (n_tokens) merge scores; required for "llama" */
	size_t n_merges;
	const GgufStr *merges;    /* (n_merges) "left right", rank = index; gpt2 */
	int32_t bos, eos, eot, eom, unk;  /* ids, -1 for none */
	int add_bos;              /* 1, 0, or -1 for the model's default */
	int add_space_prefix;     /* 1, 0, or -1 for the model's default (llama: yes) */
} TokenizerVocab;

/* Returns 0, -ENOMEM, TOKENIZER_E_UNSUPPORTED or TOKENIZER_E_INVALID. */
int tokenizer_new(const TokenizerVocab *v, Tokenizer **ret, Error *err);
int tokenizer_new_from_gguf(const Gguf *g, Tokenizer **ret, Error *err);
Tokenizer *tokenizer_free(Tokenizer *t);
DEFINE_FREEP(Tokenizer, tokenizer_free)

int32_t tokenizer_n_vocab(const Tokenizer *t);
int32_t tokenizer_bos(const Tokenizer *t);   /* -1 if none */
int32_t tokenizer_eos(const Tokenizer *t);   /* -1 if none */
int32_t tokenizer_token_type(const Tokenizer *t, int32_t id);  /* TOKEN_TYPE_*, 0 if out of range */
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
 * Encode a rendered chat prompt: special tokens are parsed only in the
 * template's markup, never in bytes whose is_content[i] is set (from
 * chat_render_marked()), so a user cannot forge turns. Elsewhere the same
 * as tokenizer_encode(..., parse_special = true, ...).
 */
int tokenizer_encode_marked(const Tokenizer *t, const char *text, size_t len,
			    const uint8_t *is_content, int32_t **ret_ids, size_t *ret_n);

/*
 * The raw bytes of token id (byte-level decoded; SentencePiece U+2581 as
 * a space, <0xNN> as that byte). Valid while t lives; NULL, len 0 for ids
 * out of range.
 */
const char *tokenizer_piece(const Tokenizer *t, int32_t id, size_t *ret_len);

/*
 * The pre-tokenizer alone, for tests: splits len bytes of plain text (no
 * special-token matching) into the words BPE merges within.
 * *ret_ends (malloc'd) holds the end offset of each word; the last is
 * len. SentencePiece models have no pre-tokenizer: one word. Returns 0 or
 * -ENOMEM.
 */
int tokenizer_split(const Tokenizer *t, const char *text, size_t len, size_t **ret_ends,
		    size_t *ret_n);
