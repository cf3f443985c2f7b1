/*
 * fuzz-tokenizer.c: libFuzzer target for the tokenizer (engine/text/tokenizer.c,
 * engine/text/unicode.c).
 *
 * Builds, once, eight small self-contained vocabularies with
 * tokenizer_new(): byte-level BPE vocabularies (all 256 byte symbols in
 * GPT-2's byte-to-unicode form, merges, control, user-defined and unknown
 * tokens) for each pre-tokenizer family (default, gpt2, llama-bpe, qwen2,
 * smollm), one smollm vocabulary missing two byte tokens (as SmolLM2's
 * is), and two SentencePiece vocabularies (<0x00>..<0xFF> byte fallback,
 * scored pieces, <unk> <s> </s>), with and without the prefix space.
 *
 * Input: byte 0 picks the vocabulary (bits 0-2) and parse_special (bit 3);
 * the rest is the text. Promises checked, a broken one aborts:
 *   - encode returns 0 or -ENOMEM, every id is in the vocabulary, and
 *     control/unknown tokens appear only when parse_special is set;
 *   - byte-level BPE: the pieces concatenate to the text exactly (minus
 *     the bytes the vocabulary has no token for), whatever parse_special;
 *   - SentencePiece: each text fragment between special tokens decodes to
 *     itself with U+2581 read as a space, after one space when the prefix
 *     applies (every fragment starts the text or follows a special token);
 *   - the pre-tokenizer's words tile the text on code-point boundaries.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"

#include "tests/fuzz/fuzz.h"

/* ---- building vocabularies ---------------------------------------------- */

/* A vocabulary under construction: texts, types and scores by id. */
typedef struct VocabBuilder {
	GgufStr *tokens;
	int32_t *types;
	float *scores;
	size_t n, cap;
	GgufStr *merges;
	size_t n_merges, cap_merges;
} VocabBuilder;

static void *xrealloc(void *p, size_t n, size_t size)
{
	size_t bytes;
	void *q;

	CHECK(!__builtin_mul_overflow(n, size, &bytes));
	q = realloc(p, bytes ? bytes : 1);
	CHECK(q);
	return q;
}

static GgufStr str_dup(const char *s, size_t n)
{
	char *p = xrealloc(NULL, n + 1, 1);
	memcpy(p, s, n);
	p[n] = 0;
	return (GgufStr){ .ptr = p, .len = n };
}

static int32_t vb_find(const VocabBuilder *vb, const char *s, size_t n)
{
	for (size_t i = 0; i < vb->n; i++)
		if (vb->tokens[i].len == n && memcmp(vb->tokens[i].ptr, s, n) == 0)
			return (int32_t)i;
	return -1;
}

static int32_t vb_add(VocabBuilder *vb, const char *s, size_t n, int32_t type, float score)
{
	if (vb->n == vb->cap) {
		vb->cap = vb->cap ? 2 * vb->cap : 512;
		vb->tokens = xrealloc(vb->tokens, vb->cap, sizeof(GgufStr));
		vb->types = xrealloc(vb->types, vb->cap, sizeof(int32_t));
		vb->scores = xrealloc(vb->scores, vb->cap, sizeof(float));
	}
	vb->tokens[vb->n] = str_dup(s, n);
	vb->types[vb->n] = type;
	vb->scores[vb->n] = score;
	return (int32_t)vb->n++;
}

static void vb_add_merge(VocabBuilder *vb, const char *s, size_t n)
{
	if (vb->n_merges == vb->cap_merges) {
		vb->cap_merges = vb->cap_merges ? 2 * vb->cap_merges : 64;
		vb->merges = xrealloc(vb->merges, vb->cap_merges, sizeof(GgufStr));
	}
	vb->merges[vb->n_merges++] = str_dup(s, n);
}

/*
 * GPT-2's bytes_to_unicode(), written out independently of the tokenizer:
 * the printable Latin-1 bytes stand for themselves, the 68 others for
 * U+0100.. in byte order. Writes the UTF-8 of b's symbol, returns its length.
 */
static size_t byte_symbol(unsigned b, char out[2])
{
	unsigned cp = b, extra = 0;

	if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
		for (unsigned x = 0; x < b; x++)
			if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) ||
			      (x >= 0xae && x <= 0xff)))
				extra++;
		cp = 0x100 + extra;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xc0 | cp >> 6);
	out[1] = (char)(0x80 | (cp & 0x3f));
	return 2;
}

/* Raw bytes -> their byte-level text, appended to out (room for 2 * n). */
static size_t to_byte_level(const char *s, size_t n, char *out)
{
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		m += byte_symbol((uint8_t)s[i], out + m);
	return m;
}

/* BPE merges as raw byte strings; each result becomes a token. */
static const char *const bpe_merges[][2] = {
	{ " ", "t" }, { "h", "e" }, { " ", "a" }, { "i", "n" }, { " t", "he" },
	{ "r", "e" }, { "o", "n" }, { "e", "r" }, { " ", "s" }, { "e", "d" },
	{ "a", "n" }, { "o", "r" }, { "e", "n" }, { "a", "t" }, { "i", "s" },
	{ "in", "g" }, { " ", "w" }, { "o", "u" }, { "l", "l" }, { "t", "h" },
	{ " ", " " }, { "  ", " " }, { "  ", "  " }, { "\n", "\n" }, { " ", "\n" },
	{ "1", "2" }, { "12", "3" }, { "0", "0" }, { "'", "s" }, { "'", "t" },
	{ "\xc3", "\xa9" }, { "\xe4", "\xb8" }, { "\xe4\xb8", "\xad" },
	{ "\xf0", "\x9f" }, { "\xf0\x9f", "\x98" }, { "\xf0\x9f\x98", "\x80" },
	{ " w", "or" }, { " wor", "ld" }, { "l", "d" }, { " ", "the" },
	{ "h", "e" },   /* duplicate: the earlier rank wins */
	{ " ", "(" }, { "(", ")" }, { "{", "}" }, { ".", "." }, { "..", "." },
	{ "<", "|" }, { "|", ">" }, { " ", "<" },
};

/* Whole-word tokens no merge forms: only ignore_merges (llama-bpe) finds them. */
static const char *const bpe_words[] = {
	" hello", "world", "123", "   ", "\xe4\xb8\xad\xe6\x96\x87", "\r\n", "!!!",
};

typedef struct Special {
	const char *text;
	int32_t type;
} Special;

/* Matched verbatim; "<|im" overlaps "<|im_start|>", which is longer and wins. */
static const Special bpe_specials[] = {
	{ "<|im_start|>", TOKEN_TYPE_CONTROL },
	{ "<|im_end|>", TOKEN_TYPE_CONTROL },
	{ "<|endoftext|>", TOKEN_TYPE_CONTROL },
	{ "<|>", TOKEN_TYPE_CONTROL },  /* one pre-tokenizer word on its own */
	{ "<unk>", TOKEN_TYPE_UNKNOWN },
	{ "<tool>", TOKEN_TYPE_USER_DEFINED },
	{ "<|im", TOKEN_TYPE_USER_DEFINED },
};

static void add_merge(VocabBuilder *vb, const char *l, const char *r)
{
	char a[64], b[64], line[130];
	size_t na = to_byte_level(l, strlen(l), a);
	size_t nb = to_byte_level(r, strlen(r), b);

	memcpy(line, a, na);
	line[na] = ' ';
	memcpy(line + na + 1, b, nb);
	vb_add_merge(vb, line, na + 1 + nb);
	memcpy(line + na, b, nb);
	if (vb_find(vb, line, na + nb) < 0)
		vb_add(vb, line, na + nb, TOKEN_TYPE_NORMAL, 0);
}

/* A byte-level BPE vocabulary; bytes for which skip[b] is set get no token. */
static void build_bpe(VocabBuilder *vb, const bool skip[256])
{
	for (unsigned b = 0; b < 256; b++) {
		char sym[2];
		size_t n = byte_symbol(b, sym);
		if (!skip[b])
			vb_add(vb, sym, n, TOKEN_TYPE_NORMAL, 0);
	}
	for (size_t i = 0; i < sizeof(bpe_merges) / sizeof(bpe_merges[0]); i++)
		add_merge(vb, bpe_merges[i][0], bpe_merges[i][1]);
	/* Merges that can never apply: a part, or the result, is no token. */
	vb_add_merge(vb, "x yz", 4);
	vb_add_merge(vb, "qq q", 4);
	for (size_t i = 0; i < sizeof(bpe_words) / sizeof(bpe_words[0]); i++) {
		char w[64];
		size_t n = to_byte_level(bpe_words[i], strlen(bpe_words[i]), w);
		if (vb_find(vb, w, n) < 0)
			vb_add(vb, w, n, TOKEN_TYPE_NORMAL, 0);
	}
	for (size_t i = 0; i < sizeof(bpe_specials) / sizeof(bpe_specials[0]); i++)
		vb_add(vb, bpe_specials[i].text, strlen(bpe_specials[i].text), bpe_specials[i].type, 0);
}

/* SentencePiece pieces (raw text, ' ' written as U+2581) and scores. */
static const struct {
	const char *text;
	float score;
} spm_pieces[] = {
	{ "\xe2\x96\x81", -1.0f },
	{ "\xe2\x96\x81t", -2.0f }, { "he", -2.5f }, { "\xe2\x96\x81the", -1.5f },
	{ "\xe2\x96\x81" "a", -2.0f }, { "in", -3.0f }, { "er", -3.0f }, { "on", -3.0f },
	{ "\xe2\x96\x81s", -3.5f }, { "re", -3.5f }, { "at", -3.5f }, { "en", -3.5f },
	{ "ing", -2.0f }, { "\xe2\x96\x81\xe2\x96\x81", -4.0f },
	{ "\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81", -4.0f },
	{ "\xc3\xa9", -5.0f }, { "\xe4\xb8\xad", -5.0f }, { "\xe6\x96\x87", -5.0f },
	{ "\xe4\xb8\xad\xe6\x96\x87", -4.5f }, { "12", -4.0f }, { "123", -3.9f },
	{ "\xe2\x96\x81hello", -1.0f }, { "hel", -6.0f }, { "lo", -6.0f },
	{ "\xe2\x96\x81hel", -6.0f }, { "ll", -6.0f }, { "\xe2\x96\x81w", -6.0f },
	{ "or", -6.0f }, { "ld", -6.0f }, { "\xe2\x96\x81wor", -6.0f },
	{ "\xe2\x96\x81world", -5.0f },
};

static void build_spm(VocabBuilder *vb)
{
	static const char hex[] = "0123456789ABCDEF";
	char c[1];

	vb_add(vb, "<unk>", 5, TOKEN_TYPE_UNKNOWN, 0);
	vb_add(vb, "<s>", 3, TOKEN_TYPE_CONTROL, 0);
	vb_add(vb, "</s>", 4, TOKEN_TYPE_CONTROL, 0);
	for (unsigned b = 0; b < 256; b++) {
		char name[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
		vb_add(vb, name, 6, TOKEN_TYPE_BYTE, 0);
	}
	for (size_t i = 0; i < sizeof(spm_pieces) / sizeof(spm_pieces[0]); i++)
		vb_add(vb, spm_pieces[i].text, strlen(spm_pieces[i].text), TOKEN_TYPE_NORMAL,
		       spm_pieces[i].score);
	/* Single characters, equal scores among some of them: ties go leftmost. */
	for (c[0] = 'a'; c[0] <= 'z'; c[0]++)
		vb_add(vb, c, 1, TOKEN_TYPE_NORMAL, -10.0f - (float)(c[0] % 4));
	for (c[0] = '0'; c[0] <= '9'; c[0]++)
		vb_add(vb, c, 1, TOKEN_TYPE_NORMAL, -10.0f);
	vb_add(vb, "<tool>", 6, TOKEN_TYPE_USER_DEFINED, 0);
}

/* ---- the fixtures ------------------------------------------------------- */

enum { N_FIXTURES = 8 };

typedef struct Fixture {
	Tokenizer *tok;
	bool spm;
	bool prefix;          /* SentencePiece adds a space before each fragment */
	bool missing[256];    /* bytes with no token: dropped from the text */
} Fixture;

static Fixture fixtures[N_FIXTURES];

static void fixture_init(Fixture *fx, const char *model, const char *pre, int add_space_prefix,
			 const bool *missing)
{
	VocabBuilder vb = { 0 };
	Error err = { 0 };
	TokenizerVocab v = { 0 };
	bool skip[256] = { false };
	int r;

	if (missing)
		memcpy(skip, missing, sizeof(skip));
	fx->spm = strcmp(model, "llama") == 0;
	if (fx->spm)
		build_spm(&vb);
	else
		build_bpe(&vb, skip);
	memcpy(fx->missing, skip, sizeof(skip));
	fx->prefix = fx->spm && add_space_prefix != 0;

	v.model = model;
	v.pre = pre;
	v.n_tokens = vb.n;
	v.tokens = vb.tokens;
	v.types = vb.types;
	v.scores = fx->spm ? vb.scores : NULL;
	v.n_merges = vb.n_merges;
	v.merges = vb.merges;
	v.bos = v.eos = v.eot = v.eom = v.unk = -1;
	if (fx->spm) {
		v.unk = 0;
		v.bos = 1;
		v.eos = 2;
	} else {
		v.eos = vb_find(&vb, "<|endoftext|>", 13);
		v.eot = vb_find(&vb, "<|im_end|>", 10);
	}
	v.add_bos = -1;
	v.add_space_prefix = add_space_prefix;
	r = tokenizer_new(&v, &fx->tok, &err);
	if (r) {
		fprintf(stderr, "tokenizer_new(%s, %s): %d %s\n", model, pre ? pre : "-", r, err.msg);
		abort();
	}
	CHECK(tokenizer_n_vocab(fx->tok) == (int32_t)vb.n);

	/* The tokenizer copied what it keeps. */
	for (size_t i = 0; i < vb.n; i++)
		free((char *)vb.tokens[i].ptr);
	for (size_t i = 0; i < vb.n_merges; i++)
		free((char *)vb.merges[i].ptr);
	free(vb.tokens);
	free(vb.types);
	free(vb.scores);
	free(vb.merges);
}

static void fixtures_init(void)
{
	static bool done;
	bool smol_missing[256] = { false };

	if (done)
		return;
	done = true;
	smol_missing[0x04] = smol_missing[0xff] = true;
	fixture_init(&fixtures[0], "gpt2", NULL, -1, NULL);        /* "default" */
	fixture_init(&fixtures[1], "gpt2", "gpt2", -1, NULL);
	fixture_init(&fixtures[2], "gpt2", "llama-bpe", -1, NULL);
	fixture_init(&fixtures[3], "gpt2", "qwen2", -1, NULL);
	fixture_init(&fixtures[4], "gpt2", "smollm", -1, NULL);
	fixture_init(&fixtures[5], "gpt2", "smollm", -1, smol_missing);
	fixture_init(&fixtures[6], "llama", NULL, -1, NULL);
	fixture_init(&fixtures[7], "llama", NULL, 0, NULL);
}

/* ---- checks ------------------------------------------------------------- */

static bool is_special_type(int32_t type)
{
	return type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN ||
	       type == TOKEN_TYPE_USER_DEFINED;
}

/* The pieces of ids[0..n) concatenated; *ret_len its length. */
static char *decode(const Tokenizer *t, const int32_t *ids, size_t n, size_t *ret_len)
{
	size_t total = 0, off = 0;
	char *out;

	for (size_t i = 0; i < n; i++) {
		size_t len;
		CHECK(tokenizer_piece(t, ids[i], &len));
		total += len;
	}
	out = xrealloc(NULL, total + 1, 1);
	for (size_t i = 0; i < n; i++) {
		size_t len;
		const char *p = tokenizer_piece(t, ids[i], &len);
		memcpy(out + off, p, len);
		off += len;
	}
	*ret_len = total;
	return out;
}

/* Byte-level BPE: the pieces are the text, less the bytes without a token. */
static void check_bpe(const Fixture *fx, const char *text, size_t len, const int32_t *ids,
		      size_t n)
{
	size_t dlen, m = 0;
	char *dec = decode(fx->tok, ids, n, &dlen);
	char *want = xrealloc(NULL, len + 1, 1);

	for (size_t i = 0; i < len; i++)
		if (!fx->missing[(uint8_t)text[i]])
			want[m++] = text[i];
	CHECK(dlen == m);
	CHECK(memcmp(dec, want, m) == 0);
	free(dec);
	free(want);
}

/*
 * SentencePiece: walk the ids against the text with every U+2581 read as
 * a space. A special token must sit at the cursor; each run of other
 * tokens decodes to the text up to the next special token (or the end),
 * after one space when the prefix applies.
 */
static void check_spm(const Fixture *fx, const char *text, size_t len, const int32_t *ids,
		      size_t n)
{
	char *norm = xrealloc(NULL, len + 1, 1);
	size_t nlen = 0, p = 0;

	for (size_t i = 0; i < len; i++) {
		if (i + 3 <= len && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
			norm[nlen++] = ' ';
			i += 2;
		} else {
			norm[nlen++] = text[i];
		}
	}
	for (size_t i = 0; i < n;) {
		size_t j = i, dlen, skip = fx->prefix ? 1 : 0;
		char *dec;

		if (is_special_type(tokenizer_token_type(fx->tok, ids[i]))) {
			const char *s = tokenizer_piece(fx->tok, ids[i], &dlen);
			CHECK(dlen <= nlen - p && memcmp(norm + p, s, dlen) == 0);
			p += dlen;
			i++;
			continue;
		}
		while (j < n && !is_special_type(tokenizer_token_type(fx->tok, ids[j])))
			j++;
		dec = decode(fx->tok, ids + i, j - i, &dlen);
		CHECK(dlen > skip);
		CHECK(!skip || dec[0] == ' ');
		CHECK(dlen - skip <= nlen - p && memcmp(norm + p, dec + skip, dlen - skip) == 0);
		p += dlen - skip;
		free(dec);
		i = j;
	}
	CHECK(p == nlen);
	free(norm);
}

/* The pre-tokenizer's words tile the text and end on code-point boundaries. */
static void check_split(const Fixture *fx, const char *text, size_t len)
{
	size_t *ends = NULL, n = 0, prev = 0, k = 0;
	bool *starts;
	int r = tokenizer_split(fx->tok, text, len, &ends, &n);

	if (r == -ENOMEM)
		return;
	CHECK(r == 0 && ends);
	CHECK((n == 0) == (len == 0));
	starts = calloc(len + 1, sizeof(bool));
	CHECK(starts);
	while (k < len) {
		size_t cl;
		starts[k] = true;
		unicode_decode_utf8(text + k, len - k, &cl);
		CHECK(cl >= 1 && cl <= len - k);
		k += cl;
	}
	starts[len] = true;
	for (size_t i = 0; i < n; i++) {
		CHECK(ends[i] > prev && ends[i] <= len && starts[ends[i]]);
		prev = ends[i];
	}
	CHECK(n == 0 || ends[n - 1] == len);
	free(starts);
	free(ends);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const Fixture *fx;
	const char *text;
	bool special;
	int32_t *ids = NULL;
	size_t n = 0, len;
	int r;

	if (size < 1)
		return 0;
	fixtures_init();
	fx = &fixtures[data[0] & 7];
	special = data[0] & 8;
	text = (const char *)data + 1;
	len = size - 1;

	r = tokenizer_encode(fx->tok, text, len, special, &ids, &n);
	if (r == -ENOMEM)
		return 0;
	CHECK(r == 0 && ids);
	for (size_t i = 0; i < n; i++) {
		int32_t ty = tokenizer_token_type(fx->tok, ids[i]);
		CHECK(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(fx->tok));
		CHECK(special || (ty != TOKEN_TYPE_CONTROL && ty != TOKEN_TYPE_UNKNOWN));
	}
	if (fx->spm)
		check_spm(fx, text, len, ids, n);
	else
		check_bpe(fx, text, len, ids, n);
	free(ids);
	check_split(fx, text, len);
	return 0;
}
