/*
 * bpe.c: byte-level BPE: GPT-2's byte <-> code point mapping, the ranked
 * merge table, and merging each pre-tokenized word (llama.cpp's
 * llm_tokenizer_bpe). Owns t->merges, t->byte_sym and, for "gpt2"
 * vocabularies, t->byte_token. Does not split text into words
 * (pretokenize.c) nor match special tokens (tokenizer.c).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/bpe.h"
#include "engine/text/unicode.h"

struct MergeSlot {
	uint64_t key;    /* left id << 32 | right id; MERGE_EMPTY if free */
	int32_t rank;
	int32_t result;  /* id of left + right */
};

#define MERGE_EMPTY UINT64_MAX

/* ---- GPT-2 byte <-> code point mapping ---------------------------------- */

/*
 * bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other
 * 68 bytes to U+0100.. in byte order, so every byte is one visible code
 * point (' ' is U+0120 'Ġ', '\n' is U+010A 'Ċ').
 */
void bpe_byte_map_init(ByteMap *m)
{
	uint32_t extra = 256;

	for (size_t i = 0; i < BYTE_CP_MAX; i++)
		m->c2b[i] = -1;
	for (uint32_t b = 0; b < 256; b++) {
		bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) ||
				 (b >= 0xae && b <= 0xff);
		m->b2c[b] = printable ? b : extra++;
		m->c2b[m->b2c[b]] = (int16_t)b;
	}
	assert(extra == BYTE_CP_MAX);
}

void bpe_build_bytes(Tokenizer *t)
{
	ByteMap map;

	bpe_byte_map_init(&map);
	for (int b = 0; b < 256; b++) {
		char u[4];
		size_t n = unicode_encode_utf8(map.b2c[b], u);

		assert(n <= 2);
		memcpy(t->byte_sym[b], u, n);
		t->byte_sym_len[b] = (uint8_t)n;
		t->byte_token[b] = tokenizer_lookup(t, u, n);
	}
}

size_t bpe_piece_from_text(const ByteMap *m, const char *s, size_t n, char *out)
{
	size_t off = 0;

	/* Each mapped code point is one byte; others stay as they are. */
	for (size_t i = 0; i < n;) {
		size_t k;
		uint32_t cp = unicode_decode_utf8(s + i, n - i, &k);
		if (cp < BYTE_CP_MAX && m->c2b[cp] >= 0) {
			out[off++] = (char)m->c2b[cp];
		} else {
			memcpy(out + off, s + i, k);
			off += k;
		}
		i += k;
	}
	return off;
}

/* ---- the merge table ---------------------------------------------------- */

static uint64_t hash_u64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return k;
}

static const MergeSlot *merge_find(const Tokenizer *t, int32_t a, int32_t b)
{
	if (a < 0 || b < 0)
		return NULL;
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t i = hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		if (t->merges[i].key == key)
			return &t->merges[i];
		if (t->merges[i].key == MERGE_EMPTY)
			return NULL;
	}
}

/* Earlier (lower-rank) duplicates win, as with llama.cpp's bpe_ranks.emplace(). */
static void merge_insert(Tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t result)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t i = hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		if (t->merges[i].key == key)
			return;
		if (t->merges[i].key == MERGE_EMPTY) {
			t->merges[i] = (MergeSlot){ .key = key, .rank = rank, .result = result };
			return;
		}
	}
}

int bpe_build_merges(Tokenizer *t, const TokenizerVocab *v, Error *err)
{
	_cleanup_(freep) char *buf = NULL;
	size_t cap = 0;

	if (v->n_merges > INT32_MAX)
		return error_set(err, TOKENIZER_E_INVALID, "too many merges: %zu", v->n_merges);
	t->merge_mask = pow2_at_least(v->n_merges * 2) - 1;
	t->merges = malloc_array(t->merge_mask + 1, sizeof(MergeSlot));
	if (!t->merges)
		return -ENOMEM;
	for (size_t i = 0; i <= t->merge_mask; i++)
		t->merges[i].key = MERGE_EMPTY;

	for (size_t r = 0; r < v->n_merges; r++) {
		const char *s = v->merges[r].ptr;
		size_t n = v->merges[r].len;
		const char *sp;
		int32_t a, b, m;

		/* The separator is the first space after the first byte. */
		if (n < 3 || !s || !(sp = memchr(s + 1, ' ', n - 1)))
			return error_set(err, TOKENIZER_E_INVALID, "merge %zu is not \"left right\"", r);
		a = tokenizer_lookup(t, s, (size_t)(sp - s));
		b = tokenizer_lookup(t, sp + 1, n - (size_t)(sp - s) - 1);
		if (n > cap) {
			free(buf);
			cap = n;
			buf = malloc(cap);
			if (!buf)
				return -ENOMEM;
		}
		memcpy(buf, s, (size_t)(sp - s));
		memcpy(buf + (sp - s), sp + 1, n - (size_t)(sp - s) - 1);
		m = tokenizer_lookup(t, buf, n - 1);
		/* A merge whose parts or result are not tokens can never apply. */
		if (a >= 0 && b >= 0 && m >= 0)
			merge_insert(t, a, b, (int32_t)r, m);
	}
	return 0;
}

/* ---- merging a word ----------------------------------------------------- */

static int bpe_add_bigram(const Tokenizer *t, Symbols *sym, int32_t l, int32_t r)
{
	const MergeSlot *m;

	if (l < 0 || r < 0 || !(m = merge_find(t, sym->sid[l], sym->sid[r])))
		return 0;
	return symbols_push_bigram(sym,
				   (Bigram){ .rank = m->rank, .left = l, .right = r,
					     .result = m->result },
				   false);
}

/*
 * ignore_merges: a word whose byte-level spelling is a token is taken
 * whole. *ret_id is that token, or -1. Returns 0 or -ENOMEM.
 */
static int bpe_whole_word(const Tokenizer *t, const char *s, size_t n, Symbols *sym,
			  int32_t *ret_id)
{
	size_t m = 0;
	int32_t id;

	if (symbols_reserve_buf(sym, 2 * n) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		uint8_t b = (uint8_t)s[i];
		memcpy(sym->buf + m, t->byte_sym[b], t->byte_sym_len[b]);
		m += t->byte_sym_len[b];
	}
	id = tokenizer_lookup(t, sym->buf, m);
	/*
	 * Only the BPE model's own tokens: a control or unknown token
	 * spelled as one word ("<|>") must not come out of plain text
	 * (HF keeps those among the added tokens, outside the model's
	 * vocab; llama.cpp would emit it here).
	 */
	if (id >= 0 && (t->type[id] == TOKEN_TYPE_CONTROL || t->type[id] == TOKEN_TYPE_UNKNOWN))
		id = -1;
	*ret_id = id;
	return 0;
}

/* Merge the n byte symbols in sym, lowest rank first, until no merge applies. */
static int bpe_merge(const Tokenizer *t, Symbols *sym, size_t n)
{
	sym->n_heap = 0;
	for (size_t i = 1; i < n; i++)
		if (bpe_add_bigram(t, sym, (int32_t)i - 1, (int32_t)i) < 0)
			return -ENOMEM;

	while (sym->n_heap > 0) {
		Bigram g = symbols_pop_bigram(sym, false);
		const MergeSlot *m;
		int32_t l = g.left, r = g.right;

		/* Stale if either side was merged since the pair was queued. */
		if (sym->next[l] != r || sym->sid[r] < 0 ||
		    !(m = merge_find(t, sym->sid[l], sym->sid[r])) || m->result != g.result)
			continue;
		sym->sid[l] = g.result;
		sym->sid[r] = -1;
		sym->next[l] = sym->next[r];
		if (sym->next[r] >= 0)
			sym->prev[sym->next[r]] = l;
		if (bpe_add_bigram(t, sym, sym->prev[l], l) < 0 ||
		    bpe_add_bigram(t, sym, l, sym->next[l]) < 0)
			return -ENOMEM;
	}
	return 0;
}

/* Encode one pre-tokenized word of n bytes with ranked merges. */
static int bpe_word(const Tokenizer *t, const char *s, size_t n, Symbols *sym, IdVec *out)
{
	if (t->ignore_merges && n > 1) {
		int32_t id;

		if (bpe_whole_word(t, s, n, sym, &id) < 0)
			return -ENOMEM;
		if (id >= 0)
			return idvec_push(out, id);
	}

	if (symbols_reserve(sym, n) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		sym->sid[i] = t->byte_token[(uint8_t)s[i]];
		sym->prev[i] = (int32_t)i - 1;
		sym->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
	}
	if (bpe_merge(t, sym, n) < 0)
		return -ENOMEM;

	for (int32_t i = 0; i >= 0; i = sym->next[i])
		if (sym->sid[i] >= 0 && idvec_push(out, sym->sid[i]) < 0)
			return -ENOMEM;
	return 0;
}

int bpe_encode(const Tokenizer *t, const char *s, size_t n, Pretok *p, Symbols *sym,
	       IdVec *out)
{
	size_t b = 0;

	if (pretok_split(p, t->pre, s, n) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < p->words.n; i++) {
		size_t e = pretok_word_end(p, i);
		if (bpe_word(t, s + b, e - b, sym, out) < 0)
			return -ENOMEM;
		b = e;
	}
	return 0;
}
