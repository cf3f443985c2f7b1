/*
 * tokenizer-internal.h: what the tokenizer's modules share and nothing
 * outside them may use: the Tokenizer struct (built by tokenizer.c, read
 * by bpe.c and spm.c), the vocabulary lookup, and the growable arrays
 * every encode step fills.
 *
 * Module map: tokenizer.c owns the Tokenizer object, vocabulary loading,
 * special tokens and the public API; pretokenize.c the pre-tokenizer
 * splits; symbols.c the merge queue; bpe.c the byte-level mapping and
 * ranked merges; spm.c SentencePiece.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/util.h"
#include "engine/text/pretokenize.h"
#include "engine/text/tokenizer.h"

typedef enum TokModel {
	MODEL_BPE,
	MODEL_SPM,
} TokModel;

/* One BPE merge in the open-addressing table (bpe.c). */
typedef struct MergeSlot MergeSlot;

struct Tokenizer {
	TokModel model;
	PreType pre;
	bool ignore_merges;
	bool add_bos;
	bool add_space_prefix;
	int32_t n_vocab;
	int32_t bos, eos, eot, eom, unk;

	char *text;           /* token texts as stored, concatenated */
	size_t *text_off;     /* (n_vocab + 1) */
	char *piece;          /* decoded pieces, concatenated */
	size_t *piece_off;    /* (n_vocab + 1) */
	uint8_t *type;        /* (n_vocab) TOKEN_TYPE_*, 0 for unknown values */
	uint8_t *eog;         /* (n_vocab) 1 if the token ends a generation */
	float *score;         /* (n_vocab) SentencePiece scores, NULL for BPE */

	int32_t *slots;       /* (slot_mask + 1) text -> id hash, -1 free */
	size_t slot_mask;
	MergeSlot *merges;    /* (merge_mask + 1) BPE merges, NULL for SPM */
	size_t merge_mask;
	int32_t byte_token[256]; /* id encoding each byte alone, -1 if none */
	char byte_sym[256][2];   /* BPE: UTF-8 of each byte's code point */
	uint8_t byte_sym_len[256];

	int32_t *special;     /* (n_special) ids matched verbatim, longest text first */
	size_t n_special;
};

/* The text of token id as stored in the vocabulary (not NUL-terminated). */
static inline const char *tok_text(const Tokenizer *t, int32_t id, size_t *ret_len)
{
	*ret_len = t->text_off[id + 1] - t->text_off[id];
	return t->text + t->text_off[id];
}

/* The id whose stored text is exactly the n bytes at s, or -1. */
int32_t tokenizer_lookup(const Tokenizer *t, const char *s, size_t n);

/* Hash table sizes: the smallest power of two >= n, at least 16. */
static inline size_t pow2_at_least(size_t n)
{
	size_t p = 16;
	while (p < n)
		p <<= 1;
	return p;
}

/* Grow the array *pp (capacity *cap) to hold at least n elements of size sz. */
static inline int tok_grow(void *pp, size_t *cap, size_t n, size_t sz)
{
	void **p = pp;
	size_t c, bytes;
	void *q;

	if (n <= *cap)
		return 0;
	c = MAX(n, *cap * 2);
	if (size_mul_overflows(c, sz, &bytes))
		return -ENOMEM;
	q = realloc(*p, bytes);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = c;
	return 0;
}

/* The ids an encode call produces. */
typedef struct IdVec {
	int32_t *v;
	size_t n, cap;
} IdVec;

static inline int idvec_push(IdVec *a, int32_t id)
{
	if (a->n == a->cap && tok_grow(&a->v, &a->cap, a->n + 1, sizeof(int32_t)) < 0)
		return -ENOMEM;
	a->v[a->n++] = id;
	return 0;
}
