/*
 * tokenizer.c: the Tokenizer object: text <-> token ids for byte-level
 * BPE ("gpt2") and SentencePiece ("llama") vocabularies stored in GGUF
 * metadata.
 *
 * Owns the vocabulary copy (from GGUF or a TokenizerVocab), its hash
 * index, the decoded pieces, the special-token list and matching, and the
 * public API. Does not own the GGUF file (everything is copied at load),
 * the pre-tokenizers (pretokenize.c), the merging (bpe.c, spm.c) nor chat
 * templates (chat.c).
 *
 * The behaviour follows llama.cpp's llama-vocab.cpp, our golden reference:
 * special tokens are split out longest first, then each text fragment is
 * pre-tokenized by the model's regex and merged word by word, lowest
 * merge rank first (BPE) or highest score first (SentencePiece), ties to
 * the leftmost pair.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/bpe.h"
#include "engine/text/pretokenize.h"
#include "engine/text/spm.h"
#include "engine/text/symbols.h"
#include "engine/text/tokenizer-internal.h"
#include "engine/text/tokenizer.h"

#define MAX_TOKENS ((size_t)1 << 24)

/* ---- the vocabulary index ----------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)s[i];
		h *= 0x100000001b3ull;
	}
	return h ^ (h >> 29);
}

int32_t tokenizer_lookup(const Tokenizer *t, const char *s, size_t n)
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

static void tokenizer_build_bytes(Tokenizer *t)
{
	if (t->model == MODEL_BPE)
		bpe_build_bytes(t);
	else
		spm_build_bytes(t);
}

/* The bytes each token stands for; see tokenizer_piece(). */
static void tokenizer_build_pieces(Tokenizer *t)
{
	ByteMap map;
	size_t off = 0;

	bpe_byte_map_init(&map);
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
			off += spm_piece_from_text(s, n, t->piece + off);
		} else {
			off += bpe_piece_from_text(&map, s, n, t->piece + off);
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
		int32_t id = tokenizer_lookup(t, names[i], strlen(names[i]));
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

/* The model, pre-tokenizer and their defaults, from v's names. */
static int tokenizer_set_model(Tokenizer *t, const TokenizerVocab *v, Error *err)
{
	bool def_add_bos = false;

	if (v->model && strcmp(v->model, "gpt2") == 0) {
		const char *name = v->pre ? v->pre : "default";
		const PreInfo *pre = pretok_find(name);
		t->model = MODEL_BPE;
		if (!pre)
			return error_set(err, TOKENIZER_E_UNSUPPORTED,
					 "unsupported pre-tokenizer \"%s\"", name);
		t->pre = pre->pre;
		t->ignore_merges = pre->ignore_merges;
		def_add_bos = pre->add_bos;
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
	return 0;
}

int tokenizer_new(const TokenizerVocab *v, Tokenizer **ret, Error *err)
{
	_cleanup_(tokenizer_freep) Tokenizer *t = NULL;
	int r;

	assert(v && ret);
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	r = tokenizer_set_model(t, v, err);
	if (r)
		return r;

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
		r = bpe_build_merges(t, v, err);
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
	return tokenizer_lookup(t, piece, strlen(piece));
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
	if (f->n == f->cap && tok_grow(&f->v, &f->cap, f->n + 1, sizeof(Frag)) < 0)
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
/*
 * Whether special token sid may be matched at text[at, at + plen): with a
 * content mask, control tokens only where no byte came from a message's
 * content (user-defined tokens are plain vocabulary and always match).
 */
static bool special_allowed(const Tokenizer *t, int32_t sid, const uint8_t *is_content, size_t at,
			    size_t plen)
{
	if (!is_content || t->type[sid] == TOKEN_TYPE_USER_DEFINED)
		return true;
	for (size_t i = at; i < at + plen; i++)
		if (is_content[i])
			return false;
	return true;
}

static int partition_special(const Tokenizer *t, const char *text, size_t len,
			     bool parse_special, const uint8_t *is_content, FragVec *cur,
			     FragVec *next)
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
			size_t from = p;
			while ((q = memmem(text + from, end - from, pat, plen))) {
				size_t at = (size_t)(q - text);
				if (!special_allowed(t, sid, is_content, at, plen)) {
					from = at + 1;
					continue;
				}
				if (at > p && fragvec_push(next, (Frag){ p, at - p, -1 }) < 0)
					return -ENOMEM;
				if (fragvec_push(next, (Frag){ at, plen, sid }) < 0)
					return -ENOMEM;
				p = from = at + plen;
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

/* ---- encoding ----------------------------------------------------------- */

/* Scratch space one encode call reuses from fragment to fragment. */
typedef struct Work {
	Pretok pre;
	Symbols sym;
} Work;

static void work_done(Work *w)
{
	pretok_done(&w->pre);
	symbols_done(&w->sym);
}

static int encode(const Tokenizer *t, const char *text, size_t len, bool parse_special,
		  const uint8_t *is_content, int32_t **ret_ids, size_t *ret_n)
{
	_cleanup_(fragvec_done) FragVec frags = { 0 };
	_cleanup_(fragvec_done) FragVec spare = { 0 };
	_cleanup_(work_done) Work w = { 0 };
	IdVec out = { 0 };
	bool prev_special = true;

	assert(t && (text || len == 0) && ret_ids && ret_n);
	if (partition_special(t, text, len, parse_special, is_content, &frags, &spare) < 0)
		return -ENOMEM;

	for (size_t i = 0; i < frags.n; i++) {
		Frag f = frags.v[i];
		int r;

		if (f.id >= 0) {
			r = idvec_push(&out, f.id);
			prev_special = true;
		} else if (t->model == MODEL_BPE) {
			r = bpe_encode(t, text + f.off, f.len, &w.pre, &w.sym, &out);
		} else {
			/* SentencePiece prefixes a space to text at the start or after a special token. */
			r = spm_encode(t, text + f.off, f.len, t->add_space_prefix && prev_special,
				       &w.sym, &out);
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

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool parse_special,
		     int32_t **ret_ids, size_t *ret_n)
{
	return encode(t, text, len, parse_special, NULL, ret_ids, ret_n);
}

int tokenizer_encode_marked(const Tokenizer *t, const char *text, size_t len,
			    const uint8_t *is_content, int32_t **ret_ids, size_t *ret_n)
{
	assert(is_content || len == 0);
	return encode(t, text, len, true, is_content, ret_ids, ret_n);
}

int tokenizer_split(const Tokenizer *t, const char *text, size_t len, size_t **ret_ends,
		    size_t *ret_n)
{
	_cleanup_(pretok_done) Pretok p = { 0 };
	size_t *ends;
	size_t n = 0;

	if (t->model == MODEL_BPE) {
		if (pretok_split(&p, t->pre, text, len) < 0)
			return -ENOMEM;
		n = p.words.n;
	} else {
		n = len > 0;
	}
	ends = malloc_array(n, sizeof(size_t));
	if (!ends)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		ends[i] = t->model == MODEL_BPE ? pretok_word_end(&p, i) : len;
	*ret_ends = ends;
	*ret_n = n;
	return 0;
}
