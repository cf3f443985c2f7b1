/*
 * symbols.c: the symbol arrays and the bigram priority queue that BPE
 * (bpe.c) and SentencePiece (spm.c) merge a word with. Owns the queue's
 * order; what makes a pair mergeable is the callers' business.
 */
#include <errno.h>
#include <stdlib.h>

#include "engine/text/symbols.h"
#include "engine/text/tokenizer-internal.h"

int symbols_reserve(Symbols *s, size_t n)
{
	if (tok_grow(&s->sid, &s->cap_sid, n, sizeof(int32_t)) < 0 ||
	    tok_grow(&s->prev, &s->cap_prev, n, sizeof(int32_t)) < 0 ||
	    tok_grow(&s->next, &s->cap_next, n, sizeof(int32_t)) < 0 ||
	    tok_grow(&s->start, &s->cap_start, n, sizeof(size_t)) < 0 ||
	    tok_grow(&s->len, &s->cap_len, n, sizeof(size_t)) < 0)
		return -ENOMEM;
	if (n > INT32_MAX)
		return -ENOMEM;
	return 0;
}

int symbols_reserve_buf(Symbols *s, size_t n)
{
	return tok_grow(&s->buf, &s->cap_buf, n, 1);
}

void symbols_done(Symbols *s)
{
	free(s->sid);
	free(s->prev);
	free(s->next);
	free(s->start);
	free(s->len);
	free(s->heap);
	free(s->buf);
}

/* BPE: lowest rank first, then leftmost. SPM: highest score first, then leftmost. */
static bool bigram_before(const Bigram *a, const Bigram *b, bool spm)
{
	if (spm) {
		if (a->score != b->score)
			return a->score > b->score;
	} else if (a->rank != b->rank) {
		return a->rank < b->rank;
	}
	return a->left < b->left;
}

int symbols_push_bigram(Symbols *s, Bigram g, bool spm)
{
	size_t i;

	if (tok_grow(&s->heap, &s->cap_heap, s->n_heap + 1, sizeof(Bigram)) < 0)
		return -ENOMEM;
	i = s->n_heap++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!bigram_before(&g, &s->heap[p], spm))
			break;
		s->heap[i] = s->heap[p];
		i = p;
	}
	s->heap[i] = g;
	return 0;
}

Bigram symbols_pop_bigram(Symbols *s, bool spm)
{
	Bigram top = s->heap[0], last = s->heap[--s->n_heap];
	size_t i = 0, n = s->n_heap;

	for (;;) {
		size_t l = 2 * i + 1, best;
		if (l >= n)
			break;
		best = l;
		if (l + 1 < n && bigram_before(&s->heap[l + 1], &s->heap[l], spm))
			best = l + 1;
		if (!bigram_before(&s->heap[best], &last, spm))
			break;
		s->heap[i] = s->heap[best];
		i = best;
	}
	if (n > 0)
		s->heap[i] = last;
	return top;
}
