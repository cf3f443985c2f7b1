/*
 * pretokenize.h: the byte-level BPE pre-tokenizers, internal to the
 * tokenizer (engine/tokenizer*.c, bpe.c).
 *
 * A pre-tokenizer splits a text fragment into the words BPE merges
 * within. llama.cpp does it with one regex per `tokenizer.ggml.pre`; here
 * each regex is hand-coded as a chain of split stages over the fragment
 * decoded to code points. Owns the pre-tokenizer names, the decoded text
 * (Cps) and the word boundaries (Spans); does not know the vocabulary.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Pre-tokenizers: which split stages run, see pre_stages() in pretokenize.c. */
typedef enum PreType {
	PRE_DEFAULT,     /* llama.cpp "default": punctuation runs, gpt2, digit runs, 3-digit groups */
	PRE_GPT2,        /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
	PRE_DIGITS_GPT2, /* \p{N} isolated one by one, then gpt2 (smollm, starcoder) */
	PRE_LLAMA3,      /* llama3 regex, \p{N}{1,3} */
	PRE_QWEN2,       /* llama3 regex with \p{N} single digits */
} PreType;

/* What a `tokenizer.ggml.pre` name selects. */
typedef struct PreInfo {
	const char *name;
	PreType pre;
	bool ignore_merges; /* a word that is a token is taken whole */
	bool add_bos;       /* default when tokenizer.ggml.add_bos_token is absent */
} PreInfo;

/* A fragment decoded to code points. */
typedef struct Cps {
	uint32_t *cp;    /* (n) code points, UNICODE_INVALID for a stray byte */
	uint8_t *fl;     /* (n) unicode_flags() */
	size_t *off;     /* (n + 1) byte offset of each code point */
	size_t n;
	size_t cap_cp, cap_fl, cap_off;
} Cps;

/* Word boundaries: end[i] is where chunk i ends (code point index); chunks tile from 0. */
typedef struct Spans {
	size_t *end;
	size_t n, cap;
} Spans;

/*
 * Scratch space of pretok_split(), reused from one fragment to the
 * next: the last fragment split and its words.
 */
typedef struct Pretok {
	Cps text;
	Spans words;     /* the result */
	Spans spare;     /* the other half of the double buffer the stages run through */
} Pretok;

/* The entry for a `tokenizer.ggml.pre` name, or NULL if we do not implement it. */
const PreInfo *pretok_find(const char *name);

/*
 * Decode n bytes of s into p->text and split them the way pre says: the
 * words end at p->words.end[0..p->words.n) (code points; see
 * pretok_word_end() for bytes). Bytes that are not UTF-8 are words of
 * their own. Returns 0 or -ENOMEM.
 */
int pretok_split(Pretok *p, PreType pre, const char *s, size_t n);

/* Frees what p holds (not p). */
void pretok_done(Pretok *p);

/* Byte offset, in the text last split, where word i ends. */
static inline size_t pretok_word_end(const Pretok *p, size_t i)
{
	return p->text.off[p->words.end[i]];
}
