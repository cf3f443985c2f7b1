/*
 * tokenizer.c: text <-> token ids for byte-level BPE ("gpt2") and
 * SentencePiece ("llama") vocabularies stored in GGUF metadata.
 *
 * Owns the vocabulary copy, its hash index, the BPE merge table, the
 * decoded pieces and the special-token list. Does not own the GGUF file
 * (everything is copied at load) nor chat templates (chat.c).
 *
 * The behaviour follows llama.cpp's llama-vocab.cpp, our golden reference:
 * special tokens are split out longest first, then each text fragment is
 * pre-tokenized by the model's regex (hand-coded here, see the split_*
 * stages) and merged word by word, lowest merge rank first (BPE) or
 * highest score first (SentencePiece), ties to the leftmost pair.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"

typedef enum TokModel {
	MODEL_BPE,
	MODEL_SPM,
} TokModel;

/* Pre-tokenizers: which split stages run, see pre_stages(). */
typedef enum PreType {
	PRE_DEFAULT,     /* llama.cpp "default": punctuation runs, gpt2, digit runs, 3-digit groups */
	PRE_GPT2,        /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
	PRE_DIGITS_GPT2, /* \p{N} isolated one by one, then gpt2 (smollm, starcoder) */
	PRE_LLAMA3,      /* llama3 regex, \p{N}{1,3} */
	PRE_QWEN2,       /* llama3 regex with \p{N} single digits */
} PreType;

static const struct {
	const char *name;
	PreType pre;
	bool ignore_merges; /* a word that is a token is taken whole */
	bool add_bos;       /* default when tokenizer.ggml.add_bos_token is absent */
} pre_names[] = {
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

typedef struct MergeSlot {
	uint64_t key;    /* left id << 32 | right id; MERGE_EMPTY if free */
	int32_t rank;
	int32_t result;  /* id of left + right */
} MergeSlot;

#define MERGE_EMPTY UINT64_MAX
#define MAX_TOKENS ((size_t)1 << 24)

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

/* ---- GPT-2 byte <-> code point mapping ---------------------------------- */

/*
 * bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other
 * 68 bytes to U+0100.. in byte order, so every byte is one visible code
 * point (' ' is U+0120 'Ġ', '\n' is U+010A 'Ċ').
 */
#define BYTE_CP_MAX 0x144

static void byte_cp_tables(uint32_t b2c[256], int16_t c2b[BYTE_CP_MAX])
{
	uint32_t extra = 256;

	for (size_t i = 0; i < BYTE_CP_MAX; i++)
		c2b[i] = -1;
	for (uint32_t b = 0; b < 256; b++) {
		bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) ||
				 (b >= 0xae && b <= 0xff);
		b2c[b] = printable ? b : extra++;
		c2b[b2c[b]] = (int16_t)b;
	}
	assert(extra == BYTE_CP_MAX);
}

/* ---- hashing ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)s[i];
		h *= 0x100000001b3ull;
	}
	return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return k;
}

static size_t pow2_at_least(size_t n)
{
	size_t p = 16;
	while (p < n)
		p <<= 1;
	return p;
}

static const char *tok_text(const Tokenizer *t, int32_t id, size_t *ret_len)
{
	*ret_len = t->text_off[id + 1] - t->text_off[id];
	return t->text + t->text_off[id];
}

static int32_t vocab_lookup(const Tokenizer *t, const char *s, size_t n)
{
	for (size_t i = hash_bytes(s, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
		int32_t id = t->slots[i];
		size_t len;
		const char *txt;

		if (id < 0)
			return -1;
		txt = tok_text(t, id, &len);
		if (len == n && memcmp(txt, s, n) == 0)
			return id;
	}
}

/* Later duplicates win, as in llama.cpp's token_to_id map. */
static void vocab_insert(Tokenizer *t, int32_t id)
{
	size_t n;
	const char *s = tok_text(t, id, &n);

	for (size_t i = hash_bytes(s, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
		int32_t other = t->slots[i];
		size_t len;
		const char *txt;

		if (other < 0) {
			t->slots[i] = id;
			return;
		}
		txt = tok_text(t, other, &len);
		if (len == n && memcmp(txt, s, n) == 0) {
			t->slots[i] = id;
			return;
		}
	}
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

/* ---- construction ------------------------------------------------------- */

Tokenizer *tokenizer_free(Tokenizer *t)
{
	if (!t)
		return NULL;
	free(t->text);
	free(t->text_off);
	free(t->piece);
	free(t->piece_off);
	free(t->type);
	free(t->eog);
	free(t->score);
	free(t->slots);
	free(t->merges);
	free(t->special);
	free(t);
	return NULL;
}

static int tokenizer_copy_vocab(Tokenizer *t, const TokenizerVocab *v, Error *err)
{
	size_t total = 0;

	for (size_t i = 0; i < v->n_tokens; i++) {
		if (v->tokens[i].len > SIZE_MAX / 2 || (v->tokens[i].len && !v->tokens[i].ptr) ||
		    size_add_overflows(total, v->tokens[i].len, &total))
			return error_set(err, TOKENIZER_E_INVALID, "token %zu: bad text", i);
	}
	t->text = malloc(total ? total : 1);
	t->piece = malloc(total ? total : 1);
	t->text_off = malloc_array(v->n_tokens + 1, sizeof(size_t));
	t->piece_off = malloc_array(v->n_tokens + 1, sizeof(size_t));
	t->type = malloc(v->n_tokens);
	t->eog = calloc(v->n_tokens, 1);
	t->slots = malloc_array(pow2_at_least(v->n_tokens * 2), sizeof(int32_t));
	if (!t->text || !t->piece || !t->text_off || !t->piece_off || !t->type || !t->eog ||
	    !t->slots)
		return -ENOMEM;

	size_t off = 0;
	for (size_t i = 0; i < v->n_tokens; i++) {
		t->text_off[i] = off;
		if (v->tokens[i].len)
			memcpy(t->text + off, v->tokens[i].ptr, v->tokens[i].len);
		off += v->tokens[i].len;
		int32_t ty = v->types ? v->types[i] : TOKEN_TYPE_NORMAL;
		t->type[i] = (ty >= TOKEN_TYPE_NORMAL && ty <= TOKEN_TYPE_BYTE) ? (uint8_t)ty : 0;
	}
	t->text_off[v->n_tokens] = off;

	t->slot_mask = pow2_at_least(v->n_tokens * 2) - 1;
	for (size_t i = 0; i <= t->slot_mask; i++)
		t->slots[i] = -1;
	for (size_t i = 0; i < v->n_tokens; i++)
		vocab_insert(t, (int32_t)i);

	if (v->scores) {
		t->score = malloc_array(v->n_tokens, sizeof(float));
		if (!t->score)
			return -ENOMEM;
		memcpy(t->score, v->scores, v->n_tokens * sizeof(float));
	}
	return 0;
}

/* "<0x41>" -> 0x41, or -1. */
static int parse_byte_token(const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	const char *hi, *lo;

	if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	hi = memchr(hex, s[3], 16);
	lo = memchr(hex, s[4], 16);
	if (!hi || !lo || !s[3] || !s[4])
		return -1;
	return (int)((hi - hex) << 4 | (lo - hex));
}

static int tokenizer_build_merges(Tokenizer *t, const TokenizerVocab *v, Error *err)
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
		a = vocab_lookup(t, s, (size_t)(sp - s));
		b = vocab_lookup(t, sp + 1, n - (size_t)(sp - s) - 1);
		if (n > cap) {
			free(buf);
			cap = n;
			buf = malloc(cap);
			if (!buf)
				return -ENOMEM;
		}
		memcpy(buf, s, (size_t)(sp - s));
		memcpy(buf + (sp - s), sp + 1, n - (size_t)(sp - s) - 1);
		m = vocab_lookup(t, buf, n - 1);
		/* A merge whose parts or result are not tokens can never apply. */
		if (a >= 0 && b >= 0 && m >= 0)
			merge_insert(t, a, b, (int32_t)r, m);
	}
	return 0;
}

static void tokenizer_build_bytes(Tokenizer *t)
{
	uint32_t b2c[256];
	int16_t c2b[BYTE_CP_MAX];

	byte_cp_tables(b2c, c2b);
	for (int b = 0; b < 256; b++) {
		char u[4];
		size_t n;
		int32_t id = -1;

		if (t->model == MODEL_BPE) {
			n = unicode_encode_utf8(b2c[b], u);
			assert(n <= 2);
			memcpy(t->byte_sym[b], u, n);
			t->byte_sym_len[b] = (uint8_t)n;
			id = vocab_lookup(t, u, n);
		} else {
			static const char hex[] = "0123456789ABCDEF";
			char name[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
			u[0] = (char)b;
			id = vocab_lookup(t, name, sizeof(name));
			if (id < 0)
				id = vocab_lookup(t, u, 1);
		}
		t->byte_token[b] = id;
	}
}

/* The bytes each token stands for; see tokenizer_piece(). */
static void tokenizer_build_pieces(Tokenizer *t)
{
	uint32_t b2c[256];
	int16_t c2b[BYTE_CP_MAX];
	size_t off = 0;

	byte_cp_tables(b2c, c2b);
	for (int32_t id = 0; id < t->n_vocab; id++) {
		size_t n;
		const char *s = tok_text(t, id, &n);
		uint8_t ty = t->type[id];
		int byte = parse_byte_token(s, n);

		t->piece_off[id] = off;
		if (ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED ||
		    ty == TOKEN_TYPE_UNKNOWN) {
			memcpy(t->piece + off, s, n);
			off += n;
		} else if (ty == TOKEN_TYPE_BYTE && byte >= 0) {
			t->piece[off++] = (char)byte;
		} else if (t->model == MODEL_SPM) {
			/* U+2581 (e2 96 81) stands for a space. */
			for (size_t i = 0; i < n; i++) {
				if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
					t->piece[off++] = ' ';
					i += 2;
				} else {
					t->piece[off++] = s[i];
				}
			}
		} else {
			/* Byte-level: each mapped code point is one byte; others stay as they are. */
			for (size_t i = 0; i < n;) {
				size_t k;
				uint32_t cp = unicode_decode_utf8(s + i, n - i, &k);
				if (cp < BYTE_CP_MAX && c2b[cp] >= 0) {
					t->piece[off++] = (char)c2b[cp];
				} else {
					memcpy(t->piece + off, s + i, k);
					off += k;
				}
				i += k;
			}
		}
	}
	t->piece_off[t->n_vocab] = off;
}

typedef struct SpecialKey {
	size_t len;
	int32_t id;
} SpecialKey;

static int special_key_cmp(const void *pa, const void *pb)
{
	const SpecialKey *a = pa, *b = pb;
	if (a->len != b->len)
		return a->len > b->len ? -1 : 1;
	return (a->id > b->id) - (a->id < b->id);
}

static int tokenizer_build_special(Tokenizer *t)
{
	_cleanup_(freep) SpecialKey *keys = NULL;
	size_t n = 0;

	keys = malloc_array((size_t)t->n_vocab, sizeof(SpecialKey));
	t->special = malloc_array((size_t)t->n_vocab, sizeof(int32_t));
	if (!keys || !t->special)
		return -ENOMEM;
	for (int32_t id = 0; id < t->n_vocab; id++) {
		uint8_t ty = t->type[id];
		size_t len = t->text_off[id + 1] - t->text_off[id];
		if (len > 0 && (ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED ||
				ty == TOKEN_TYPE_UNKNOWN))
			keys[n++] = (SpecialKey){ .len = len, .id = id };
	}
	qsort(keys, n, sizeof(*keys), special_key_cmp);
	for (size_t i = 0; i < n; i++)
		t->special[i] = keys[i].id;
	t->n_special = n;
	return 0;
}

static void tokenizer_mark_eog(Tokenizer *t)
{
	static const char *const names[] = {
		"<|eot_id|>", "<|im_end|>", "<|endoftext|>", "</s>", "<|eom_id|>",
		"<|end|>", "<end_of_turn>", "<|end_of_text|>",
	};
	const int32_t ids[] = { t->eos, t->eot, t->eom };

	for (size_t i = 0; i < ARRAY_SIZE(ids); i++)
		if (ids[i] >= 0)
			t->eog[ids[i]] = 1;
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		int32_t id = vocab_lookup(t, names[i], strlen(names[i]));
		if (id >= 0 && t->type[id] == TOKEN_TYPE_CONTROL)
			t->eog[id] = 1;
	}
}

static int check_id(int32_t id, int32_t n_vocab, const char *what, Error *err)
{
	if (id < -1 || id >= n_vocab)
		return error_set(err, TOKENIZER_E_INVALID, "%s id %d outside vocabulary of %d",
				 what, id, n_vocab);
	return 0;
}

int tokenizer_new(const TokenizerVocab *v, Tokenizer **ret, Error *err)
{
	_cleanup_(tokenizer_freep) Tokenizer *t = NULL;
	bool def_add_bos = false;
	int r;

	assert(v && ret);
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;

	if (v->model && strcmp(v->model, "gpt2") == 0) {
		const char *pre = v->pre ? v->pre : "default";
		size_t i;
		t->model = MODEL_BPE;
		for (i = 0; i < ARRAY_SIZE(pre_names); i++)
			if (strcmp(pre, pre_names[i].name) == 0)
				break;
		if (i == ARRAY_SIZE(pre_names))
			return error_set(err, TOKENIZER_E_UNSUPPORTED,
					 "unsupported pre-tokenizer \"%s\"", pre);
		t->pre = pre_names[i].pre;
		t->ignore_merges = pre_names[i].ignore_merges;
		def_add_bos = pre_names[i].add_bos;
		t->add_space_prefix = v->add_space_prefix == 1;
	} else if (v->model && strcmp(v->model, "llama") == 0) {
		t->model = MODEL_SPM;
		def_add_bos = true;
		t->add_space_prefix = v->add_space_prefix != 0;
		if (!v->scores)
			return error_set(err, TOKENIZER_E_INVALID, "SentencePiece vocabulary without scores");
	} else {
		return error_set(err, TOKENIZER_E_UNSUPPORTED, "unsupported tokenizer model \"%s\"",
				 v->model ? v->model : "(none)");
	}
	t->add_bos = v->add_bos < 0 ? def_add_bos : v->add_bos != 0;

	if (v->n_tokens == 0 || v->n_tokens > MAX_TOKENS || !v->tokens)
		return error_set(err, TOKENIZER_E_INVALID, "bad vocabulary size %zu", v->n_tokens);
	t->n_vocab = (int32_t)v->n_tokens;
	if ((r = check_id(v->bos, t->n_vocab, "bos", err)) ||
	    (r = check_id(v->eos, t->n_vocab, "eos", err)) ||
	    (r = check_id(v->eot, t->n_vocab, "eot", err)) ||
	    (r = check_id(v->eom, t->n_vocab, "eom", err)) ||
	    (r = check_id(v->unk, t->n_vocab, "unknown", err)))
		return r;
	t->bos = v->bos;
	t->eos = v->eos;
	t->eot = v->eot;
	t->eom = v->eom;
	t->unk = v->unk;

	r = tokenizer_copy_vocab(t, v, err);
	if (r)
		return r;
	if (t->model == MODEL_BPE) {
		if (v->n_merges && !v->merges)
			return error_set(err, TOKENIZER_E_INVALID, "merges missing");
		r = tokenizer_build_merges(t, v, err);
		if (r)
			return r;
	}
	tokenizer_build_bytes(t);
	tokenizer_build_pieces(t);
	r = tokenizer_build_special(t);
	if (r)
		return r;
	tokenizer_mark_eog(t);

	*ret = TAKE_PTR(t);
	return 0;
}

/* ---- GGUF --------------------------------------------------------------- */

static int gguf_token_id(const Gguf *g, const char *key, int32_t def, int32_t n_vocab,
			 int32_t *ret, Error *err)
{
	int64_t v;
	int r = gguf_get_i64(g, key, &v);

	if (r == GGUF_E_NOT_FOUND) {
		*ret = def < n_vocab ? def : -1;
		return 0;
	}
	if (r)
		return error_set(err, TOKENIZER_E_INVALID, "%s is not an integer", key);
	/* Some converters write -1 (or UINT32_MAX) for "none". */
	if (v == -1 || v == UINT32_MAX)
		v = -1;
	if (v < -1 || v >= n_vocab)
		return error_set(err, TOKENIZER_E_INVALID, "%s = %lld outside vocabulary of %d",
				 key, (long long)v, n_vocab);
	*ret = (int32_t)v;
	return 0;
}

static int gguf_flag(const Gguf *g, const char *key, int *ret, Error *err)
{
	bool b;
	int r = gguf_get_bool(g, key, &b);

	if (r == GGUF_E_NOT_FOUND) {
		*ret = -1;
		return 0;
	}
	if (r)
		return error_set(err, TOKENIZER_E_INVALID, "%s is not a bool", key);
	*ret = b;
	return 0;
}

/* An optional numeric array of n elements, copied out of the (unaligned) mapping. */
static int gguf_copy_array(const Gguf *g, const char *key, uint32_t type, size_t n,
			   void **ret, Error *err)
{
	GgufArray a;
	int r = gguf_get_arr(g, key, &a);
	void *p;

	if (r == GGUF_E_NOT_FOUND) {
		*ret = NULL;
		return 0;
	}
	if (r || a.type != type || a.n != n)
		return error_set(err, TOKENIZER_E_INVALID, "%s: expected %zu elements of type %s",
				 key, n, gguf_type_name(type));
	p = malloc_array(n, 4);
	if (!p)
		return -ENOMEM;
	memcpy(p, a.data, n * 4);
	*ret = p;
	return 0;
}

int tokenizer_new_from_gguf(const Gguf *g, Tokenizer **ret, Error *err)
{
	_cleanup_(freep) char *model = NULL;
	_cleanup_(freep) char *pre = NULL;
	_cleanup_(freep) int32_t *types = NULL;
	_cleanup_(freep) float *scores = NULL;
	TokenizerVocab v = { 0 };
	GgufArray tokens, merges;
	GgufStr s;
	int32_t n_vocab;
	bool spm;
	int r;

	if (gguf_get_str(g, "tokenizer.ggml.model", &s))
		return error_set(err, TOKENIZER_E_INVALID, "tokenizer.ggml.model missing");
	model = gguf_str_dup(s);
	if (!model)
		return -ENOMEM;
	spm = strcmp(model, "llama") == 0;
	if (gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0) {
		pre = gguf_str_dup(s);
		if (!pre)
			return -ENOMEM;
	}

	if (gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens) || tokens.type != GGUF_TYPE_STRING)
		return error_set(err, TOKENIZER_E_INVALID, "tokenizer.ggml.tokens missing");
	if (tokens.n == 0 || tokens.n > MAX_TOKENS)
		return error_set(err, TOKENIZER_E_INVALID, "bad vocabulary size %llu",
				 (unsigned long long)tokens.n);
	n_vocab = (int32_t)tokens.n;

	r = gguf_copy_array(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, tokens.n,
			    (void **)&types, err);
	if (r)
		return r;
	r = gguf_copy_array(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, tokens.n,
			    (void **)&scores, err);
	if (r)
		return r;
	if (gguf_get_arr(g, "tokenizer.ggml.merges", &merges) == 0) {
		if (merges.type != GGUF_TYPE_STRING)
			return error_set(err, TOKENIZER_E_INVALID, "tokenizer.ggml.merges not strings");
		v.n_merges = merges.n;
		v.merges = merges.strs;
	}

	/* llama.cpp's defaults for SentencePiece: <unk> 0, <s> 1, </s> 2. */
	if ((r = gguf_token_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n_vocab, &v.bos, err)) ||
	    (r = gguf_token_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n_vocab, &v.eos, err)) ||
	    (r = gguf_token_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n_vocab, &v.unk, err)) ||
	    (r = gguf_token_id(g, "tokenizer.ggml.eot_token_id", -1, n_vocab, &v.eot, err)) ||
	    (r = gguf_token_id(g, "tokenizer.ggml.eom_token_id", -1, n_vocab, &v.eom, err)) ||
	    (r = gguf_flag(g, "tokenizer.ggml.add_bos_token", &v.add_bos, err)) ||
	    (r = gguf_flag(g, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix, err)))
		return r;

	v.model = model;
	v.pre = pre;
	v.n_tokens = tokens.n;
	v.tokens = tokens.strs;
	v.types = types;
	v.scores = scores;
	return tokenizer_new(&v, ret, err);
}

/* ---- accessors ---------------------------------------------------------- */

int32_t tokenizer_n_vocab(const Tokenizer *t)
{
	return t->n_vocab;
}

int32_t tokenizer_bos(const Tokenizer *t)
{
	return t->bos;
}

int32_t tokenizer_eos(const Tokenizer *t)
{
	return t->eos;
}

bool tokenizer_add_bos(const Tokenizer *t)
{
	return t->add_bos && t->bos >= 0;
}

int32_t tokenizer_token_type(const Tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}

bool tokenizer_is_eog(const Tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && t->eog[id];
}

int32_t tokenizer_find(const Tokenizer *t, const char *piece)
{
	return vocab_lookup(t, piece, strlen(piece));
}

const char *tokenizer_piece(const Tokenizer *t, int32_t id, size_t *ret_len)
{
	if (id < 0 || id >= t->n_vocab) {
		*ret_len = 0;
		return NULL;
	}
	*ret_len = t->piece_off[id + 1] - t->piece_off[id];
	return t->piece + t->piece_off[id];
}

/* ---- scratch space ------------------------------------------------------ */

/* Grow *p to hold at least n elements of size sz. */
static int grow(void *pp, size_t *cap, size_t n, size_t sz)
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

typedef struct IdVec {
	int32_t *v;
	size_t n, cap;
} IdVec;

static int idvec_push(IdVec *a, int32_t id)
{
	if (a->n == a->cap && grow(&a->v, &a->cap, a->n + 1, sizeof(int32_t)) < 0)
		return -ENOMEM;
	a->v[a->n++] = id;
	return 0;
}

/* Word boundaries: end[i] is where chunk i ends (code point index); chunks tile from 0. */
typedef struct Spans {
	size_t *end;
	size_t n, cap;
} Spans;

static int spans_emit(Spans *s, size_t end)
{
	if (s->n > 0 && end <= s->end[s->n - 1])
		return 0;
	if (s->n == 0 && end == 0)
		return 0;
	if (s->n == s->cap && grow(&s->end, &s->cap, s->n + 1, sizeof(size_t)) < 0)
		return -ENOMEM;
	s->end[s->n++] = end;
	return 0;
}

/* A fragment decoded to code points. */
typedef struct Cps {
	uint32_t *cp;    /* (n) code points, UNICODE_INVALID for a stray byte */
	uint8_t *fl;     /* (n) unicode_flags() */
	size_t *off;     /* (n + 1) byte offset of each code point */
	size_t n;
	size_t cap_cp, cap_fl, cap_off;
} Cps;

typedef struct Bigram {
	int32_t rank;    /* BPE merge rank */
	float score;     /* SentencePiece score */
	int32_t left, right;
	int32_t result;  /* BPE: merged id */
	size_t size;     /* SPM: merged length in bytes */
} Bigram;

typedef struct Work {
	Cps c;
	Spans a, b;
	int32_t *sid, *prev, *next;
	size_t *start, *len;
	size_t cap_sid, cap_prev, cap_next, cap_start, cap_len;
	Bigram *heap;
	size_t n_heap, cap_heap;
	char *buf;
	size_t cap_buf;
} Work;

static void work_done(Work *w)
{
	free(w->c.cp);
	free(w->c.fl);
	free(w->c.off);
	free(w->a.end);
	free(w->b.end);
	free(w->sid);
	free(w->prev);
	free(w->next);
	free(w->start);
	free(w->len);
	free(w->heap);
	free(w->buf);
}

static int work_symbols(Work *w, size_t n)
{
	if (grow(&w->sid, &w->cap_sid, n, sizeof(int32_t)) < 0 ||
	    grow(&w->prev, &w->cap_prev, n, sizeof(int32_t)) < 0 ||
	    grow(&w->next, &w->cap_next, n, sizeof(int32_t)) < 0 ||
	    grow(&w->start, &w->cap_start, n, sizeof(size_t)) < 0 ||
	    grow(&w->len, &w->cap_len, n, sizeof(size_t)) < 0)
		return -ENOMEM;
	if (n > INT32_MAX)
		return -ENOMEM;
	return 0;
}

static int cps_decode(Cps *c, const char *s, size_t n)
{
	size_t i = 0, k = 0;

	if (grow(&c->cp, &c->cap_cp, n, sizeof(uint32_t)) < 0 ||
	    grow(&c->fl, &c->cap_fl, n, 1) < 0 ||
	    grow(&c->off, &c->cap_off, n + 1, sizeof(size_t)) < 0)
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

/* ---- pre-tokenizer stages ----------------------------------------------- */

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

/* Decode s into w->c and split it: the words end at w->a.end[0..w->a.n) (code points). */
static int pre_tokenize(const Tokenizer *t, const char *s, size_t n, Work *w)
{
	SplitStage stages[5];
	size_t n_stages = pre_stages(t->pre, stages);

	if (cps_decode(&w->c, s, n) < 0)
		return -ENOMEM;
	w->a.n = 0;
	if (spans_emit(&w->a, w->c.n) < 0)
		return -ENOMEM;
	for (size_t k = 0; k < n_stages; k++) {
		size_t b = 0;
		Spans tmp;

		w->b.n = 0;
		for (size_t i = 0; i < w->a.n; i++) {
			if (stages[k](&w->c, b, w->a.end[i], &w->b) < 0)
				return -ENOMEM;
			b = w->a.end[i];
		}
		tmp = w->a;
		w->a = w->b;
		w->b = tmp;
	}
	return 0;
}

/* ---- merging ------------------------------------------------------------ */

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

static int heap_push(Work *w, Bigram g, bool spm)
{
	size_t i;

	if (grow(&w->heap, &w->cap_heap, w->n_heap + 1, sizeof(Bigram)) < 0)
		return -ENOMEM;
	i = w->n_heap++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!bigram_before(&g, &w->heap[p], spm))
			break;
		w->heap[i] = w->heap[p];
		i = p;
	}
	w->heap[i] = g;
	return 0;
}

static Bigram heap_pop(Work *w, bool spm)
{
	Bigram top = w->heap[0], last = w->heap[--w->n_heap];
	size_t i = 0, n = w->n_heap;

	for (;;) {
		size_t l = 2 * i + 1, best;
		if (l >= n)
			break;
		best = l;
		if (l + 1 < n && bigram_before(&w->heap[l + 1], &w->heap[l], spm))
			best = l + 1;
		if (!bigram_before(&w->heap[best], &last, spm))
			break;
		w->heap[i] = w->heap[best];
		i = best;
	}
	if (n > 0)
		w->heap[i] = last;
	return top;
}

static int bpe_add_bigram(const Tokenizer *t, Work *w, int32_t l, int32_t r)
{
	const MergeSlot *m;

	if (l < 0 || r < 0 || !(m = merge_find(t, w->sid[l], w->sid[r])))
		return 0;
	return heap_push(w, (Bigram){ .rank = m->rank, .left = l, .right = r, .result = m->result },
			 false);
}

/* Encode one pre-tokenized word of n bytes with ranked merges. */
static int bpe_word(const Tokenizer *t, const char *s, size_t n, Work *w, IdVec *out)
{
	if (t->ignore_merges && n > 1) {
		size_t m = 0;
		int32_t id;

		if (grow(&w->buf, &w->cap_buf, 2 * n, 1) < 0)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			uint8_t b = (uint8_t)s[i];
			memcpy(w->buf + m, t->byte_sym[b], t->byte_sym_len[b]);
			m += t->byte_sym_len[b];
		}
		id = vocab_lookup(t, w->buf, m);
		/*
		 * Only the BPE model's own tokens: a control or unknown token
		 * spelled as one word ("<|>") must not come out of plain text
		 * (HF keeps those among the added tokens, outside the model's
		 * vocab; llama.cpp would emit it here).
		 */
		if (id >= 0 && t->type[id] != TOKEN_TYPE_CONTROL && t->type[id] != TOKEN_TYPE_UNKNOWN)
			return idvec_push(out, id);
	}

	if (work_symbols(w, n) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		w->sid[i] = t->byte_token[(uint8_t)s[i]];
		w->prev[i] = (int32_t)i - 1;
		w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
	}
	w->n_heap = 0;
	for (size_t i = 1; i < n; i++)
		if (bpe_add_bigram(t, w, (int32_t)i - 1, (int32_t)i) < 0)
			return -ENOMEM;

	while (w->n_heap > 0) {
		Bigram g = heap_pop(w, false);
		const MergeSlot *m;
		int32_t l = g.left, r = g.right;

		/* Stale if either side was merged since the pair was queued. */
		if (w->next[l] != r || w->sid[r] < 0 || !(m = merge_find(t, w->sid[l], w->sid[r])) ||
		    m->result != g.result)
			continue;
		w->sid[l] = g.result;
		w->sid[r] = -1;
		w->next[l] = w->next[r];
		if (w->next[r] >= 0)
			w->prev[w->next[r]] = l;
		if (bpe_add_bigram(t, w, w->prev[l], l) < 0 || bpe_add_bigram(t, w, l, w->next[l]) < 0)
			return -ENOMEM;
	}

	for (int32_t i = 0; i >= 0; i = w->next[i])
		if (w->sid[i] >= 0 && idvec_push(out, w->sid[i]) < 0)
			return -ENOMEM;
	return 0;
}

static int encode_bpe(const Tokenizer *t, const char *s, size_t n, Work *w, IdVec *out)
{
	size_t b = 0;

	if (pre_tokenize(t, s, n, w) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < w->a.n; i++) {
		size_t e = w->a.end[i];
		size_t bs = w->c.off[b], be = w->c.off[e];
		if (bpe_word(t, s + bs, be - bs, w, out) < 0)
			return -ENOMEM;
		b = e;
	}
	return 0;
}

/* SentencePiece merges may only form ordinary pieces, never control or byte tokens. */
static int32_t spm_lookup(const Tokenizer *t, const char *s, size_t n)
{
	int32_t id = vocab_lookup(t, s, n);
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

static int spm_add_bigram(const Tokenizer *t, Work *w, int32_t l, int32_t r)
{
	size_t size;
	int32_t id;

	if (l < 0 || r < 0)
		return 0;
	size = w->len[l] + w->len[r];
	id = spm_lookup(t, w->buf + w->start[l], size);
	if (id < 0)
		return 0;
	return heap_push(w, (Bigram){ .score = t->score[id], .left = l, .right = r, .size = size },
			 true);
}

/*
 * llama.cpp's llm_tokenizer_spm: spaces become U+2581 (with one in front
 * when prefix is set), symbols start as characters, and the adjacent pair
 * whose concatenation is the best-scoring piece merges first. Symbols
 * that are no piece fall back to <0xNN> byte tokens.
 */
static int encode_spm(const Tokenizer *t, const char *s, size_t n, bool prefix, Work *w,
		      IdVec *out)
{
	size_t m = 0, cap, n_sym = 0;

	if (size_mul_overflows(n, 3, &cap) || size_add_overflows(cap, 3, &cap) ||
	    grow(&w->buf, &w->cap_buf, cap, 1) < 0)
		return -ENOMEM;
	if (prefix) {
		memcpy(w->buf, "\xe2\x96\x81", 3);
		m = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(w->buf + m, "\xe2\x96\x81", 3);
			m += 3;
		} else {
			w->buf[m++] = s[i];
		}
	}
	if (m == 0)
		return 0;

	if (work_symbols(w, m) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < m;) {
		size_t k;
		unicode_decode_utf8(w->buf + i, m - i, &k);
		w->start[n_sym] = i;
		w->len[n_sym] = k;
		w->prev[n_sym] = (int32_t)n_sym - 1;
		w->next[n_sym] = (int32_t)n_sym + 1;
		n_sym++;
		i += k;
	}
	w->next[n_sym - 1] = -1;

	w->n_heap = 0;
	for (size_t i = 1; i < n_sym; i++)
		if (spm_add_bigram(t, w, (int32_t)i - 1, (int32_t)i) < 0)
			return -ENOMEM;
	while (w->n_heap > 0) {
		Bigram g = heap_pop(w, true);
		int32_t l = g.left, r = g.right;

		if (w->len[l] == 0 || w->len[r] == 0 || w->len[l] + w->len[r] != g.size)
			continue;
		w->len[l] += w->len[r];
		w->len[r] = 0;
		w->next[l] = w->next[r];
		if (w->next[r] >= 0)
			w->prev[w->next[r]] = l;
		if (spm_add_bigram(t, w, w->prev[l], l) < 0 || spm_add_bigram(t, w, l, w->next[l]) < 0)
			return -ENOMEM;
	}

	for (int32_t i = 0; i >= 0; i = w->next[i]) {
		int32_t id = spm_lookup(t, w->buf + w->start[i], w->len[i]);
		if (id >= 0) {
			if (idvec_push(out, id) < 0)
				return -ENOMEM;
			continue;
		}
		for (size_t k = 0; k < w->len[i]; k++) {
			int32_t b = t->byte_token[(uint8_t)w->buf[w->start[i] + k]];
			if (b < 0)
				b = t->unk;
			if (b >= 0 && idvec_push(out, b) < 0)
				return -ENOMEM;
		}
	}
	return 0;
}

/* ---- special tokens ----------------------------------------------------- */

typedef struct Frag {
	size_t off, len;
	int32_t id;      /* special token, or -1 for text still to encode */
} Frag;

typedef struct FragVec {
	Frag *v;
	size_t n, cap;
} FragVec;

static int fragvec_push(FragVec *f, Frag x)
{
	if (f->n == f->cap && grow(&f->v, &f->cap, f->n + 1, sizeof(Frag)) < 0)
		return -ENOMEM;
	f->v[f->n++] = x;
	return 0;
}

static void fragvec_done(FragVec *f)
{
	free(f->v);
}

/*
 * llama.cpp's tokenizer_st_partition: for each special token, longest
 * first, cut every remaining text fragment at its occurrences.
 */
static int partition_special(const Tokenizer *t, const char *text, size_t len,
			     bool parse_special, FragVec *cur, FragVec *next)
{
	cur->n = 0;
	if (len > 0 && fragvec_push(cur, (Frag){ 0, len, -1 }) < 0)
		return -ENOMEM;

	for (size_t k = 0; k < t->n_special; k++) {
		int32_t sid = t->special[k];
		size_t plen;
		const char *pat = tok_text(t, sid, &plen);
		bool any_text = false;
		FragVec tmp;

		if (!parse_special && t->type[sid] != TOKEN_TYPE_USER_DEFINED)
			continue;
		if (plen > len || !memmem(text, len, pat, plen))
			continue;
		next->n = 0;
		for (size_t i = 0; i < cur->n; i++) {
			Frag f = cur->v[i];
			size_t p = f.off, end = f.off + f.len;
			const char *q;

			if (f.id >= 0) {
				if (fragvec_push(next, f) < 0)
					return -ENOMEM;
				continue;
			}
			while ((q = memmem(text + p, end - p, pat, plen))) {
				size_t at = (size_t)(q - text);
				if (at > p && fragvec_push(next, (Frag){ p, at - p, -1 }) < 0)
					return -ENOMEM;
				if (fragvec_push(next, (Frag){ at, plen, sid }) < 0)
					return -ENOMEM;
				p = at + plen;
			}
			if (p < end && fragvec_push(next, (Frag){ p, end - p, -1 }) < 0)
				return -ENOMEM;
		}
		tmp = *cur;
		*cur = *next;
		*next = tmp;
		for (size_t i = 0; i < cur->n && !any_text; i++)
			any_text = cur->v[i].id < 0;
		if (!any_text)
			break;
	}
	return 0;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool parse_special,
		     int32_t **ret_ids, size_t *ret_n)
{
	_cleanup_(fragvec_done) FragVec frags = { 0 };
	_cleanup_(fragvec_done) FragVec spare = { 0 };
	_cleanup_(work_done) Work w = { 0 };
	IdVec out = { 0 };
	bool prev_special = true;

	assert(t && (text || len == 0) && ret_ids && ret_n);
	if (partition_special(t, text, len, parse_special, &frags, &spare) < 0)
		return -ENOMEM;

	for (size_t i = 0; i < frags.n; i++) {
		Frag f = frags.v[i];
		int r;

		if (f.id >= 0) {
			r = idvec_push(&out, f.id);
			prev_special = true;
		} else if (t->model == MODEL_BPE) {
			r = encode_bpe(t, text + f.off, f.len, &w, &out);
		} else {
			/* SentencePiece prefixes a space to text at the start or after a special token. */
			r = encode_spm(t, text + f.off, f.len, t->add_space_prefix && prev_special,
				       &w, &out);
			prev_special = false;
		}
		if (r < 0) {
			free(out.v);
			return r;
		}
	}
	if (!out.v && !(out.v = malloc(sizeof(int32_t))))
		return -ENOMEM;
	*ret_ids = out.v;
	*ret_n = out.n;
	return 0;
}

int tokenizer_split(const Tokenizer *t, const char *text, size_t len, size_t **ret_ends,
		    size_t *ret_n)
{
	_cleanup_(work_done) Work w = { 0 };
	size_t *ends;
	size_t n = 0;

	if (t->model == MODEL_BPE) {
		if (pre_tokenize(t, text, len, &w) < 0)
			return -ENOMEM;
		n = w.a.n;
	} else {
		n = len > 0;
	}
	ends = malloc_array(n, sizeof(size_t));
	if (!ends)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		ends[i] = t->model == MODEL_BPE ? w.c.off[w.a.end[i]] : len;
	*ret_ends = ends;
	*ret_n = n;
	return 0;
}
