/*
 * pretokenize.c: the byte-level BPE pre-tokenizers (gpt2, llama3, qwen2,
 * smollm and llama.cpp's "default"), hand-coded from their regexes.
 *
 * Owns the `tokenizer.ggml.pre` name table, decoding a fragment to code
 * points with their Unicode classes, and the split stages. Does not know
 * the vocabulary or the merges (bpe.c) nor special tokens (tokenizer.c):
 * it sees plain text only.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/pretokenize.h"
#include "engine/text/tokenizer-internal.h"
#include "engine/text/unicode.h"

static const PreInfo pre_names[] = {
	{ "default", PRE_DEFAULT, false, false },
	{ "gpt2", PRE_GPT2, false, false },
	{ "gpt-2", PRE_GPT2, false, false },
	{ "phi-2", PRE_GPT2, false, false },
	{ "mpt", PRE_GPT2, false, false },
	{ "olmo", PRE_GPT2, false, false },
	{ "smollm", PRE_DIGITS_GPT2, false, false },
	{ "starcoder", PRE_DIGITS_GPT2, false, false },
	{ "refact", PRE_DIGITS_GPT2, false, false },
	{ "command-r", PRE_DIGITS_GPT2, false, false },
	{ "codeshell", PRE_DIGITS_GPT2, false, false },
	{ "llama3", PRE_LLAMA3, true, true },
	{ "llama-v3", PRE_LLAMA3, true, true },
	{ "llama-bpe", PRE_LLAMA3, true, true },
	{ "falcon3", PRE_LLAMA3, true, true },
	{ "dbrx", PRE_LLAMA3, false, false },
	{ "smaug-bpe", PRE_LLAMA3, false, false },
	{ "qwen2", PRE_QWEN2, false, false },
	{ "deepseek-r1-qwen", PRE_QWEN2, false, false },
	{ "stablelm2", PRE_QWEN2, false, false },
};

const PreInfo *pretok_find(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(pre_names); i++)
		if (strcmp(name, pre_names[i].name) == 0)
			return &pre_names[i];
	return NULL;
}

/* ---- decoded text and word boundaries ----------------------------------- */

static int spans_emit(Spans *s, size_t end)
{
	if (s->n > 0 && end <= s->end[s->n - 1])
		return 0;
	if (s->n == 0 && end == 0)
		return 0;
	if (s->n == s->cap && tok_grow(&s->end, &s->cap, s->n + 1, sizeof(size_t)) < 0)
		return -ENOMEM;
	s->end[s->n++] = end;
	return 0;
}

static int cps_decode(Cps *c, const char *s, size_t n)
{
	size_t i = 0, k = 0;

	if (tok_grow(&c->cp, &c->cap_cp, n, sizeof(uint32_t)) < 0 ||
	    tok_grow(&c->fl, &c->cap_fl, n, 1) < 0 ||
	    tok_grow(&c->off, &c->cap_off, n + 1, sizeof(size_t)) < 0)
		return -ENOMEM;
	while (i < n) {
		size_t len;
		uint32_t cp = unicode_decode_utf8(s + i, n - i, &len);
		c->cp[k] = cp;
		c->fl[k] = (uint8_t)unicode_flags(cp);
		c->off[k] = i;
		i += len;
		k++;
	}
	c->off[k] = n;
	c->n = k;
	return 0;
}

void pretok_done(Pretok *p)
{
	free(p->text.cp);
	free(p->text.fl);
	free(p->text.off);
	free(p->words.end);
	free(p->spare.end);
}

/* ---- split stages -------------------------------------------------------- */

/*
 * Each stage splits the chunk [b, e) of code points further, emitting the
 * end of every piece. Lookups past e see no code point (flags 0), so
 * lookaheads stop at chunk boundaries as the regexes do on each piece.
 */
typedef int (*SplitStage)(const Cps *c, size_t b, size_t e, Spans *o);

static unsigned fl_at(const Cps *c, size_t e, size_t i)
{
	return i < e ? c->fl[i] : 0;
}

static uint32_t cp_lower_ascii(uint32_t cp)
{
	return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
}

/* Length of a contraction 's 't 're 've 'm 'll 'd at pos, or 0. */
static size_t match_contraction(const Cps *c, size_t pos, size_t e, bool icase)
{
	uint32_t c1, c2;

	if (c->cp[pos] != '\'' || pos + 1 >= e)
		return 0;
	c1 = icase ? cp_lower_ascii(c->cp[pos + 1]) : c->cp[pos + 1];
	if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
		return 2;
	if (pos + 2 >= e)
		return 0;
	c2 = icase ? cp_lower_ascii(c->cp[pos + 2]) : c->cp[pos + 2];
	if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
		return 3;
	return 0;
}

/* Shared tail of both regexes: \s+(?!\S)|\s+ over the whitespace run at pos. */
static size_t match_space_run(const Cps *c, size_t pos, size_t e)
{
	size_t n = 0;

	while (fl_at(c, e, pos + n) & UNICODE_SPACE)
		n++;
	if (n > 1 && pos + n < e)
		return n - 1;  /* leave the last space to prefix the next word */
	return n;
}

#define LNS (UNICODE_LETTER | UNICODE_NUMBER | UNICODE_SPACE)

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int split_gpt2(const Cps *c, size_t b, size_t e, Spans *o)
{
	size_t pos = b;

	while (pos < e) {
		uint32_t cp = c->cp[pos];
		unsigned f = c->fl[pos];
		unsigned f2 = cp == ' ' ? fl_at(c, e, pos + 1) : f;
		size_t n;

		if ((n = match_contraction(c, pos, e, false))) {
			pos += n;
		} else if (f2 & (UNICODE_LETTER | UNICODE_NUMBER)) {
			unsigned cls = f2 & (UNICODE_LETTER | UNICODE_NUMBER);
			pos += cp == ' ';
			while (fl_at(c, e, pos) & cls)
				pos++;
		} else if (f2 && !(f2 & LNS)) {
			pos += cp == ' ';
			for (unsigned g = fl_at(c, e, pos); g && !(g & LNS); g = fl_at(c, e, pos))
				pos++;
		} else if ((n = match_space_run(c, pos, e))) {
			pos += n;
		} else {
			pos++;
		}
		if (spans_emit(o, pos) < 0)
			return -ENOMEM;
	}
	return 0;
}

/*
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 */
static int split_llama3_digits(const Cps *c, size_t b, size_t e, Spans *o, size_t max_digits)
{
	size_t pos = b;

	while (pos < e) {
		uint32_t cp = c->cp[pos];
		unsigned f = c->fl[pos];
		unsigned f2 = cp == ' ' ? fl_at(c, e, pos + 1) : f;
		bool crlf = cp == '\r' || cp == '\n';
		size_t n;

		if ((n = match_contraction(c, pos, e, true))) {
			pos += n;
		} else if (!crlf && !(f & UNICODE_NUMBER) && f &&
			   ((f & UNICODE_LETTER) || (fl_at(c, e, pos + 1) & UNICODE_LETTER))) {
			pos++;
			while (fl_at(c, e, pos) & UNICODE_LETTER)
				pos++;
		} else if (f & UNICODE_NUMBER) {
			size_t start = pos;
			while ((fl_at(c, e, pos) & UNICODE_NUMBER) && pos - start < max_digits)
				pos++;
		} else if (f2 && !(f2 & LNS)) {
			pos += cp == ' ';
			for (unsigned g = fl_at(c, e, pos); g && !(g & LNS); g = fl_at(c, e, pos))
				pos++;
			while (pos < e && (c->cp[pos] == '\r' || c->cp[pos] == '\n'))
				pos++;
		} else {
			/* \s*[\r\n]+ ends after the run's last CR/LF, if it has one. */
			size_t run = 0, last_crlf = 0;
			while (fl_at(c, e, pos + run) & UNICODE_SPACE) {
				if (c->cp[pos + run] == '\r' || c->cp[pos + run] == '\n')
					last_crlf = run + 1;
				run++;
			}
			if (last_crlf)
				pos += last_crlf;
			else if ((n = match_space_run(c, pos, e)))
				pos += n;
			else
				pos++;
		}
		if (spans_emit(o, pos) < 0)
			return -ENOMEM;
	}
	return 0;
}

static int split_llama3(const Cps *c, size_t b, size_t e, Spans *o)
{
	return split_llama3_digits(c, b, e, o, 3);
}

static int split_qwen2(const Cps *c, size_t b, size_t e, Spans *o)
{
	return split_llama3_digits(c, b, e, o, 1);
}

/* Bytes that are not UTF-8 become words of their own: they are never merged. */
static int split_invalid(const Cps *c, size_t b, size_t e, Spans *o)
{
	for (size_t i = b; i < e; i++)
		if (c->cp[i] == UNICODE_INVALID && (spans_emit(o, i) < 0 || spans_emit(o, i + 1) < 0))
			return -ENOMEM;
	return spans_emit(o, e);
}

/* \p{N}: each number character alone. */
static int split_each_number(const Cps *c, size_t b, size_t e, Spans *o)
{
	for (size_t i = b; i < e; i++)
		if ((c->fl[i] & UNICODE_NUMBER) && (spans_emit(o, i) < 0 || spans_emit(o, i + 1) < 0))
			return -ENOMEM;
	return spans_emit(o, e);
}

static bool is_default_punct(const Cps *c, size_t i)
{
	uint32_t cp = c->cp[i];

	return (c->fl[i] & UNICODE_PUNCT) || cp == '$' || cp == '+' || cp == '<' || cp == '=' ||
	       cp == '>' || cp == '^' || cp == '~' || cp == '|';
}

/* [\p{P}\$\+<=>\^~\|]+ and \p{N}+: runs isolated from what surrounds them. */
static int split_runs(const Cps *c, size_t b, size_t e, Spans *o, bool punct)
{
	for (size_t i = b; i < e;) {
		bool in = punct ? is_default_punct(c, i) : (c->fl[i] & UNICODE_NUMBER);
		if (!in) {
			i++;
			continue;
		}
		if (spans_emit(o, i) < 0)
			return -ENOMEM;
		while (i < e && (punct ? is_default_punct(c, i) : (c->fl[i] & UNICODE_NUMBER)))
			i++;
		if (spans_emit(o, i) < 0)
			return -ENOMEM;
	}
	return spans_emit(o, e);
}

static int split_punct_runs(const Cps *c, size_t b, size_t e, Spans *o)
{
	return split_runs(c, b, e, o, true);
}

static int split_number_runs(const Cps *c, size_t b, size_t e, Spans *o)
{
	return split_runs(c, b, e, o, false);
}

/* [0-9][0-9][0-9], leftmost matches. */
static int split_digit_triples(const Cps *c, size_t b, size_t e, Spans *o)
{
#define D(i) (c->cp[i] >= '0' && c->cp[i] <= '9')
	for (size_t i = b; i + 3 <= e;) {
		if (D(i) && D(i + 1) && D(i + 2)) {
			if (spans_emit(o, i) < 0 || spans_emit(o, i + 3) < 0)
				return -ENOMEM;
			i += 3;
		} else {
			i++;
		}
	}
#undef D
	return spans_emit(o, e);
}

static size_t pre_stages(PreType pre, SplitStage stages[5])
{
	size_t n = 0;

	stages[n++] = split_invalid;
	switch (pre) {
	case PRE_DEFAULT:
		stages[n++] = split_punct_runs;
		stages[n++] = split_gpt2;
		stages[n++] = split_number_runs;
		stages[n++] = split_digit_triples;
		break;
	case PRE_GPT2:
		stages[n++] = split_gpt2;
		break;
	case PRE_DIGITS_GPT2:
		stages[n++] = split_each_number;
		stages[n++] = split_gpt2;
		break;
	case PRE_LLAMA3:
		stages[n++] = split_llama3;
		break;
	case PRE_QWEN2:
		stages[n++] = split_qwen2;
		break;
	}
	return n;
}

/* ---- the pipeline ------------------------------------------------------- */

int pretok_split(Pretok *p, PreType pre, const char *s, size_t n)
{
	SplitStage stages[5];
	size_t n_stages = pre_stages(pre, stages);

	if (cps_decode(&p->text, s, n) < 0)
		return -ENOMEM;
	p->words.n = 0;
	if (spans_emit(&p->words, p->text.n) < 0)
		return -ENOMEM;
	for (size_t k = 0; k < n_stages; k++) {
		size_t b = 0;
		Spans tmp;

		p->spare.n = 0;
		for (size_t i = 0; i < p->words.n; i++) {
			if (stages[k](&p->text, b, p->words.end[i], &p->spare) < 0)
				return -ENOMEM;
			b = p->words.end[i];
		}
		tmp = p->words;
		p->words = p->spare;
		p->spare = tmp;
	}
	return 0;
}
