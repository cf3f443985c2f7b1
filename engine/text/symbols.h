/*
 * symbols.h: the working state both merge algorithms (bpe.c, spm.c) run
 * on, internal to the tokenizer.
 *
 * A word being merged is a doubly linked list of symbols; the candidate
 * merges of adjacent symbols wait in a priority queue of Bigrams (BPE:
 * lowest merge rank first; SentencePiece: highest score first; ties to
 * the leftmost pair, as in llama.cpp). Queued pairs may go stale when a
 * neighbour merges first: the merge loop checks them when popped. Owns
 * the arrays and the queue order, not what a symbol means.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Bigram {
	int32_t rank;    /* BPE merge rank */
	float score;     /* SentencePiece score */
	int32_t left, right;
	int32_t result;  /* BPE: merged id */
	size_t size;     /* SPM: merged length in bytes */
} Bigram;

/*
 * Scratch space reused from word to word. Symbol i: sid (BPE: token id,
 * -1 once merged away), start and len (SPM: its bytes in buf, len 0 once
 * merged away), prev and next (list links, -1 at the ends).
 */
typedef struct Symbols {
	int32_t *sid, *prev, *next;  /* (n) */
	size_t *start, *len;         /* (n) */
	size_t cap_sid, cap_prev, cap_next, cap_start, cap_len;
	Bigram *heap;                /* (n_heap) the queue, a binary heap */
	size_t n_heap, cap_heap;
	char *buf;                   /* the word's bytes, as the model spells them */
	size_t cap_buf;
} Symbols;

/* Room for n symbols (n <= INT32_MAX). Returns 0 or -ENOMEM. */
int symbols_reserve(Symbols *s, size_t n);

/* Room for n bytes in s->buf. Returns 0 or -ENOMEM. */
int symbols_reserve_buf(Symbols *s, size_t n);

/* Queue g; spm selects the order (see above). Returns 0 or -ENOMEM. */
int symbols_push_bigram(Symbols *s, Bigram g, bool spm);

/* Take the first pair off the queue; s->n_heap must be > 0. */
Bigram symbols_pop_bigram(Symbols *s, bool spm);

/* Frees what s holds (not s). */
void symbols_done(Symbols *s);
