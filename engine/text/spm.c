/*
 * spm.c: SentencePiece encoding as llama.cpp's llm_tokenizer_spm does it:
 * spaces become U+2581 (with one in front when asked), symbols start as
 * characters, and the adjacent pair whose concatenation is the
 * best-scoring piece merges first. Symbols that are no piece fall back to
 * <0xNN> byte tokens. Owns t->byte_token for "llama" vocabularies; does
 * not match special tokens nor decide where the prefix space goes
 * (tokenizer.c).
 */
#include <errno.h>
#include <string.h>

#include "engine/text/spm.h"
#include "engine/text/unicode.h"

#define SPM_SPACE "\xe2\x96\x81"  /* U+2581, as UTF-8 */

void spm_build_bytes(Tokenizer *t)
{
	static const char hex[] = "0123456789ABCDEF";

	for (int b = 0; b < 256; b++) {
		char name[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
		char u[1] = { (char)b };
		int32_t id = tokenizer_lookup(t, name, sizeof(name));

		if (id < 0)
			id = tokenizer_lookup(t, u, 1);
		t->byte_token[b] = id;
	}
}

size_t spm_piece_from_text(const char *s, size_t n, char *out)
{
	size_t off = 0;

	for (size_t i = 0; i < n; i++) {
		if (i + 3 <= n && memcmp(s + i, SPM_SPACE, 3) == 0) {
			out[off++] = ' ';
			i += 2;
		} else {
			out[off++] = s[i];
		}
	}
	return off;
}

/* SentencePiece merges may only form ordinary pieces, never control or byte tokens. */
static int32_t spm_lookup(const Tokenizer *t, const char *s, size_t n)
{
	int32_t id = tokenizer_lookup(t, s, n);
	if (id < 0)
		return -1;
	switch (t->type[id]) {
	case TOKEN_TYPE_CONTROL:
	case TOKEN_TYPE_UNKNOWN:
	case TOKEN_TYPE_BYTE:
		return -1;
	default:
		return id;
	}
}

static int spm_add_bigram(const Tokenizer *t, Symbols *sym, int32_t l, int32_t r)
{
	size_t size;
	int32_t id;

	if (l < 0 || r < 0)
		return 0;
	size = sym->len[l] + sym->len[r];
	id = spm_lookup(t, sym->buf + sym->start[l], size);
	if (id < 0)
		return 0;
	return symbols_push_bigram(sym,
				   (Bigram){ .score = t->score[id], .left = l, .right = r,
					     .size = size },
				   true);
}

/* s with spaces as U+2581 (one more in front if prefix) into sym->buf; *ret_len its length. */
static int spm_escape(const char *s, size_t n, bool prefix, Symbols *sym, size_t *ret_len)
{
	size_t m = 0, cap;

	if (size_mul_overflows(n, 3, &cap) || size_add_overflows(cap, 3, &cap) ||
	    symbols_reserve_buf(sym, cap) < 0)
		return -ENOMEM;
	if (prefix) {
		memcpy(sym->buf, SPM_SPACE, 3);
		m = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(sym->buf + m, SPM_SPACE, 3);
			m += 3;
		} else {
			sym->buf[m++] = s[i];
		}
	}
	*ret_len = m;
	return 0;
}

/* One symbol per UTF-8 character of the m > 0 bytes in sym->buf; returns how many. */
static size_t spm_split_chars(Symbols *sym, size_t m)
{
	size_t n_sym = 0;

	for (size_t i = 0; i < m;) {
		size_t k;
		unicode_decode_utf8(sym->buf + i, m - i, &k);
		sym->start[n_sym] = i;
		sym->len[n_sym] = k;
		sym->prev[n_sym] = (int32_t)n_sym - 1;
		sym->next[n_sym] = (int32_t)n_sym + 1;
		n_sym++;
		i += k;
	}
	sym->next[n_sym - 1] = -1;
	return n_sym;
}

/* Merge the n_sym symbols, best score first, until no pair is a piece. */
static int spm_merge(const Tokenizer *t, Symbols *sym, size_t n_sym)
{
	sym->n_heap = 0;
	for (size_t i = 1; i < n_sym; i++)
		if (spm_add_bigram(t, sym, (int32_t)i - 1, (int32_t)i) < 0)
			return -ENOMEM;
	while (sym->n_heap > 0) {
		Bigram g = symbols_pop_bigram(sym, true);
		int32_t l = g.left, r = g.right;

		if (sym->len[l] == 0 || sym->len[r] == 0 || sym->len[l] + sym->len[r] != g.size)
			continue;
		sym->len[l] += sym->len[r];
		sym->len[r] = 0;
		sym->next[l] = sym->next[r];
		if (sym->next[r] >= 0)
			sym->prev[sym->next[r]] = l;
		if (spm_add_bigram(t, sym, sym->prev[l], l) < 0 ||
		    spm_add_bigram(t, sym, l, sym->next[l]) < 0)
			return -ENOMEM;
	}
	return 0;
}

/* Each remaining symbol as its piece, else as byte tokens, else as unknown. */
static int spm_emit(const Tokenizer *t, const Symbols *sym, IdVec *out)
{
	for (int32_t i = 0; i >= 0; i = sym->next[i]) {
		int32_t id = spm_lookup(t, sym->buf + sym->start[i], sym->len[i]);
		if (id >= 0) {
			if (idvec_push(out, id) < 0)
				return -ENOMEM;
			continue;
		}
		for (size_t k = 0; k < sym->len[i]; k++) {
			int32_t b = t->byte_token[(uint8_t)sym->buf[sym->start[i] + k]];
			if (b < 0)
				b = t->unk;
			if (b >= 0 && idvec_push(out, b) < 0)
				return -ENOMEM;
		}
	}
	return 0;
}

int spm_encode(const Tokenizer *t, const char *s, size_t n, bool prefix, Symbols *sym,
	       IdVec *out)
{
	size_t m, n_sym;

	if (spm_escape(s, n, prefix, sym, &m) < 0)
		return -ENOMEM;
	if (m == 0)
		return 0;
	if (symbols_reserve(sym, m) < 0)
		return -ENOMEM;
	n_sym = spm_split_chars(sym, m);
	if (spm_merge(t, sym, n_sym) < 0)
		return -ENOMEM;
	return spm_emit(t, sym, out);
}
