/*
 * cmd_genmodel.c: `turbokv-lab gen-model`, a llama-shaped GGUF with
 * seeded random weights, so speed can be measured at any shape (8B and
 * up) without a download.
 *
 * Owns the shape options, the random-but-valid weight blocks of each
 * supported type, and the tokenizer metadata. The file format itself is
 * engine/gguf/gguf_writer.c; tensors are generated and written chunk by chunk,
 * so memory stays small whatever the model size.
 *
 * Weights: every matrix (token_embd and output.weight included, all of
 * --type) has values of mean ~0 and standard deviation ~1/sqrt(fan_in),
 * fan_in = its row length, so activations keep their scale through the
 * layers and logits come out finite with a spread of order 1. Norm
 * weights are F32 in [0.9, 1.1]. Tensor i of the file draws from its own
 * stream seeded by (--seed, i): the same options give the same bytes.
 *
 * Tokenizer: byte-level BPE ("gpt2", pre-tokenizer llama-bpe): ids 0..255
 * are the bytes (GPT-2 byte-to-unicode texts), 256 <|begin_of_text|>
 * (bos), 257 <|end_of_text|> (eos), then two-letter tokens "aa".."zz"
 * with their merges while the vocabulary lasts, then fillers <gen_N>.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/gguf/gguf_writer.h"
#include "kernels/wtype.h"
#include "tools/turbokv-lab/lab.h"

#define TOKEN_BOS 256
#define TOKEN_EOS 257
#define N_FIXED_TOKENS 258
#define CHUNK_BYTES ((size_t)1 << 20)

typedef struct GenShape {
	int n_layers, dim, n_heads, n_kv_heads, head_dim, ff_dim, n_vocab, n_ctx;
	bool explicit_head_dim;
	uint32_t type;   /* WType of every matrix (Q4_K for --type Q4_K_M) */
	bool q4_k_m;     /* --type Q4_K_M: llama.cpp's mix of Q4_K and Q6_K */
	uint64_t seed;
} GenShape;

/* ---- random blocks ------------------------------------------------------ */

typedef struct Rng {
	uint64_t s;
} Rng;

/* splitmix64: fast, and every seed (0 included) gives a good stream. */
static uint64_t rng_next(Rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* [0, 1) */
static float rng_uniform(Rng *r)
{
	return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

static void rng_bytes(Rng *r, uint8_t *p, size_t n)
{
	while (n > 0) {
		uint64_t v = rng_next(r);
		size_t k = MIN(n, sizeof(v));
		memcpy(p, &v, k);
		p += k;
		n -= k;
	}
}

/* A block scale near base: base * [0.75, 1.25), as fp16. */
static tkv_half jitter_half(Rng *r, float base)
{
	return f32_to_half(base * (0.75f + 0.5f * rng_uniform(r)));
}

/*
 * n blocks of type t whose values have mean ~0 and standard deviation
 * ~s. Uniform values are enough: only the scale matters for speed
 * measurements and numerical sanity.
 */
static void blocks_fill(uint32_t t, Rng *r, float s, uint8_t *out, size_t n)
{
	float a = s * sqrtf(3.0f); /* uniform(-a, a) has deviation s */

	switch (t) {
	case WTYPE_F32:
		for (size_t i = 0; i < n; i++) {
			float v = a * (2.0f * rng_uniform(r) - 1.0f);
			memcpy(out + 4 * i, &v, 4);
		}
		break;
	case WTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			tkv_half h = f32_to_half(a * (2.0f * rng_uniform(r) - 1.0f));
			memcpy(out + 2 * i, &h, 2);
		}
		break;
	case WTYPE_Q8_0: {
		/* q uniform in -127..127: E[q^2] = (255^2 - 1) / 12 */
		BlockQ8_0 *b = (BlockQ8_0 *)out;
		for (size_t i = 0; i < n; i++) {
			b[i].d = jitter_half(r, s / sqrtf(5418.67f));
			for (int j = 0; j < QK8_0; j++)
				b[i].qs[j] = (int8_t)((int)(rng_next(r) % 255) - 127);
		}
		break;
	}
	case WTYPE_Q4_0: {
		/* x = d (q - 8), q uniform in 1..15 (mean 0): E[(q - 8)^2] = 224 / 12 */
		BlockQ4_0 *b = (BlockQ4_0 *)out;
		for (size_t i = 0; i < n; i++) {
			b[i].d = jitter_half(r, s / sqrtf(224.0f / 12.0f));
			for (int j = 0; j < QK4_0 / 2; j++) {
				uint64_t v = rng_next(r);
				b[i].qs[j] = (uint8_t)((1 + v % 15) | (1 + (v >> 32) % 15) << 4);
			}
		}
		break;
	}
	case WTYPE_Q4_1: {
		/* x = d q + m, q uniform in 0..15 (variance 21.25), m = -7.5 d (mean 0) */
		BlockQ4_1 *b = (BlockQ4_1 *)out;
		for (size_t i = 0; i < n; i++) {
			b[i].d = jitter_half(r, s / sqrtf(21.25f));
			b[i].m = f32_to_half(-7.5f * half_to_f32(b[i].d));
			rng_bytes(r, b[i].qs, sizeof(b[i].qs));
		}
		break;
	}
	case WTYPE_Q5_0: {
		/* x = d (q - 16), q uniform in 0..31 (mean 15.5, variance 85.25) */
		BlockQ5_0 *b = (BlockQ5_0 *)out;
		for (size_t i = 0; i < n; i++) {
			b[i].d = jitter_half(r, s / sqrtf(85.25f));
			rng_bytes(r, b[i].qh, sizeof(b[i].qh));
			rng_bytes(r, b[i].qs, sizeof(b[i].qs));
		}
		break;
	}
	case WTYPE_Q4_K: {
		/*
		 * x = d sc q - dmin m per 32-value sub-block, q uniform in
		 * 0..15 (mean 7.5, variance 21.25), sc uniform in 32..63
		 * (E[sc^2] = 2341.5). dmin = 8 d and m ~ 15/16 sc (+-2)
		 * center each sub-block near 0, as a quantizer's mins would.
		 */
		BlockQ4_K *b = (BlockQ4_K *)out;
		float base = s / sqrtf(2341.5f * 21.25f);
		for (size_t i = 0; i < n; i++) {
			uint8_t sc[8], m[8];
			float d = base * (0.75f + 0.5f * rng_uniform(r));
			b[i].d = f32_to_half(d);
			b[i].dmin = f32_to_half(8.0f * half_to_f32(b[i].d));
			for (int j = 0; j < 8; j++) {
				uint64_t v = rng_next(r);
				sc[j] = (uint8_t)(32 + (v & 31));
				int mj = (int)lrintf(sc[j] * 0.9375f) + (int)((v >> 8) % 5) - 2;
				m[j] = (uint8_t)MAX(0, MIN(63, mj));
			}
			/* the 12-byte packing wtype_q4k_scale_min() reads */
			for (int j = 0; j < 4; j++) {
				b[i].scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
				b[i].scales[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
				b[i].scales[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | (m[j + 4] & 0xf) << 4);
			}
			rng_bytes(r, b[i].qs, sizeof(b[i].qs));
		}
		break;
	}
	case WTYPE_Q6_K: {
		/*
		 * x = d sc (q - 32) per 16-value group, q uniform in 0..63
		 * (mean 31.5, variance 341.25), sc uniform in 32..63.
		 */
		BlockQ6_K *b = (BlockQ6_K *)out;
		float base = s / sqrtf(2341.5f * 341.25f);
		for (size_t i = 0; i < n; i++) {
			rng_bytes(r, b[i].ql, sizeof(b[i].ql));
			rng_bytes(r, b[i].qh, sizeof(b[i].qh));
			for (int j = 0; j < QK_K / 16; j++)
				b[i].scales[j] = (int8_t)(32 + (rng_next(r) & 31));
			b[i].d = jitter_half(r, base);
		}
		break;
	}
	default:
		abort(); /* gen_parse_type() admits only the types above */
	}
}

/* ---- tensors ------------------------------------------------------------ */

typedef struct GenTensor {
	char name[64];
	uint32_t type;
	uint32_t n_dims;
	uint64_t ne[2];
	bool norm;       /* F32 vector near 1 */
} GenTensor;

/* Append a tensor (cols, rows) to out[*n]; returns its name buffer. */
static char *gen_add(GenTensor *out, size_t *n, uint32_t type, uint64_t cols, uint64_t rows, bool norm)
{
	GenTensor *t = &out[(*n)++];
	*t = (GenTensor){ .type = type, .n_dims = norm ? 1 : 2, .ne = { cols, rows }, .norm = norm };
	return t->name;
}

/* llama.cpp's use_more_bits(): the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K. */
static bool more_bits(int il, int n)
{
	return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

/* The tensor list of a llama model, in file order (3 + 9 * n_layers); returns the count. */
static size_t gen_tensors(const GenShape *g, GenTensor *out)
{
	uint64_t qdim = (uint64_t)g->n_heads * g->head_dim, kvdim = (uint64_t)g->n_kv_heads * g->head_dim;
	uint64_t dim = (uint64_t)g->dim, ff = (uint64_t)g->ff_dim, vocab = (uint64_t)g->n_vocab;
	const size_t sz = sizeof(out->name);
	uint32_t t = g->type;
	size_t n = 0;

	snprintf(gen_add(out, &n, t, dim, vocab, false), sz, "token_embd.weight");
	for (int il = 0; il < g->n_layers; il++) {
		snprintf(gen_add(out, &n, WTYPE_F32, dim, 1, true), sz, "blk.%d.attn_norm.weight", il);
		snprintf(gen_add(out, &n, t, dim, qdim, false), sz, "blk.%d.attn_q.weight", il);
		snprintf(gen_add(out, &n, t, dim, kvdim, false), sz, "blk.%d.attn_k.weight", il);
		uint32_t tv = g->q4_k_m && more_bits(il, g->n_layers) ? WTYPE_Q6_K : t;
		snprintf(gen_add(out, &n, tv, dim, kvdim, false), sz, "blk.%d.attn_v.weight", il);
		snprintf(gen_add(out, &n, t, qdim, dim, false), sz, "blk.%d.attn_output.weight", il);
		snprintf(gen_add(out, &n, WTYPE_F32, dim, 1, true), sz, "blk.%d.ffn_norm.weight", il);
		snprintf(gen_add(out, &n, t, dim, ff, false), sz, "blk.%d.ffn_gate.weight", il);
		snprintf(gen_add(out, &n, t, dim, ff, false), sz, "blk.%d.ffn_up.weight", il);
		snprintf(gen_add(out, &n, tv, ff, dim, false), sz, "blk.%d.ffn_down.weight", il);
	}
	snprintf(gen_add(out, &n, WTYPE_F32, dim, 1, true), sz, "output_norm.weight");
	snprintf(gen_add(out, &n, g->q4_k_m ? WTYPE_Q6_K : t, dim, vocab, false), sz, "output.weight");
	return n;
}

/* Generate and write tensor index i, chunk by chunk. Returns 0 or the writer's error. */
static int gen_tensor_write(GgufWriter *w, const GenShape *g, const GenTensor *t, size_t index,
			    uint8_t *buf)
{
	const WTypeInfo *info = wtype_info(t->type);
	uint64_t n_blocks = t->ne[0] / info->block_elems * t->ne[1];
	size_t per_chunk = CHUNK_BYTES / info->block_bytes;
	Rng r = { .s = g->seed * 0x9e3779b97f4a7c15ull ^ (index + 1) * 0xd1b54a32d192ed03ull };
	float s = 1.0f / sqrtf((float)t->ne[0]);
	int e;

	rng_next(&r);
	for (uint64_t done = 0; done < n_blocks;) {
		size_t k = (size_t)MIN((uint64_t)per_chunk, n_blocks - done);
		if (t->norm) {
			for (size_t i = 0; i < k; i++) {
				float v = 0.9f + 0.2f * rng_uniform(&r);
				memcpy(buf + 4 * i, &v, 4);
			}
		} else {
			blocks_fill(t->type, &r, s, buf, k);
		}
		if ((e = gguf_writer_write(w, buf, k * info->block_bytes)))
			return e;
		done += k;
	}
	return 0;
}

/* ---- metadata ----------------------------------------------------------- */

/* GPT-2's bytes_to_unicode(): byte b's code point, UTF-8 encoded in out (NUL-terminated). */
static void byte_text(int b, char out[3])
{
	bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
	unsigned cp = (unsigned)b;
	if (!printable) {
		cp = 256;
		for (int c = 0; c < b; c++)
			if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff)))
				cp++;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

/* A flat table of n NUL-terminated strings: one allocation of pointers and text. */
typedef struct StrTable {
	char **s;
	char *text;
	size_t n;
} StrTable;

static void str_table_done(StrTable *t)
{
	free(t->s);
	free(t->text);
}

static int gen_tokenizer(GgufWriter *w, int n_vocab)
{
	_cleanup_(str_table_done) StrTable tok = { 0 }, mrg = { 0 };
	_cleanup_(freep) int32_t *types = NULL;
	const size_t slot = 24; /* "<gen_16777215>" and "a b" fit */
	int r;

	tok.s = malloc_array((size_t)n_vocab, sizeof(char *));
	tok.text = malloc_array((size_t)n_vocab, slot);
	types = malloc_array((size_t)n_vocab, sizeof(int32_t));
	mrg.s = malloc_array(26 * 26, sizeof(char *));
	mrg.text = malloc_array(26 * 26, slot);
	if (!tok.s || !tok.text || !types || !mrg.s || !mrg.text)
		return -ENOMEM;
	for (int id = 0; id < n_vocab; id++) {
		char *p = tok.s[id] = tok.text + (size_t)id * slot;
		int pair = id - N_FIXED_TOKENS;
		types[id] = TOKEN_TYPE_NORMAL;
		if (id < 256) {
			byte_text(id, p);
		} else if (id == TOKEN_BOS || id == TOKEN_EOS) {
			strcpy(p, id == TOKEN_BOS ? "<|begin_of_text|>" : "<|end_of_text|>");
			types[id] = TOKEN_TYPE_CONTROL;
		} else if (pair < 26 * 26) {
			char a = (char)('a' + pair / 26), b = (char)('a' + pair % 26);
			snprintf(p, slot, "%c%c", a, b);
			mrg.s[mrg.n] = mrg.text + mrg.n * slot;
			snprintf(mrg.s[mrg.n++], slot, "%c %c", a, b);
		} else {
			snprintf(p, slot, "<gen_%d>", id);
		}
	}
	if ((r = gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
	    (r = gguf_writer_add_str(w, "tokenizer.ggml.pre", "llama-bpe")) ||
	    (r = gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tok.s,
					   (size_t)n_vocab)) ||
	    (r = gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", types, (size_t)n_vocab)) ||
	    (r = gguf_writer_add_str_array(w, "tokenizer.ggml.merges", (const char *const *)mrg.s,
					   mrg.n)) ||
	    (r = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", TOKEN_BOS)) ||
	    (r = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", TOKEN_EOS)) ||
	    (r = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true)))
		return r;
	return 0;
}

/* llama.cpp's general.file_type (llama_ftype) of an all-`t` file, or of Q4_K_M. */
static uint32_t gen_file_type(const GenShape *g)
{
	if (g->q4_k_m)
		return 15;
	switch (g->type) {
	case WTYPE_F32: return 0;
	case WTYPE_F16: return 1;
	case WTYPE_Q4_0: return 2;
	case WTYPE_Q4_1: return 3;
	case WTYPE_Q5_0: return 8;
	case WTYPE_Q8_0: return 7;
	case WTYPE_Q6_K: return 18;
	default: return 14; /* Q4_K_S */
	}
}

static int gen_metadata(GgufWriter *w, const GenShape *g)
{
	char name[128];
	int r;

	snprintf(name, sizeof(name), "turbokv gen-model llama L%d D%d H%d/%d F%d V%d %s seed %llu",
		 g->n_layers, g->dim, g->n_heads, g->n_kv_heads, g->ff_dim, g->n_vocab,
		 g->q4_k_m ? "Q4_K_M" : wtype_name(g->type), (unsigned long long)g->seed);
	if ((r = gguf_writer_add_str(w, "general.architecture", "llama")) ||
	    (r = gguf_writer_add_str(w, "general.name", name)) ||
	    (r = gguf_writer_add_u32(w, "general.file_type", gen_file_type(g))) ||
	    (r = gguf_writer_add_u32(w, "llama.block_count", (uint32_t)g->n_layers)) ||
	    (r = gguf_writer_add_u32(w, "llama.context_length", (uint32_t)g->n_ctx)) ||
	    (r = gguf_writer_add_u32(w, "llama.embedding_length", (uint32_t)g->dim)) ||
	    (r = gguf_writer_add_u32(w, "llama.feed_forward_length", (uint32_t)g->ff_dim)) ||
	    (r = gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)g->n_heads)) ||
	    (r = gguf_writer_add_u32(w, "llama.attention.head_count_kv", (uint32_t)g->n_kv_heads)) ||
	    (r = gguf_writer_add_u32(w, "llama.rope.dimension_count", (uint32_t)g->head_dim)) ||
	    (r = gguf_writer_add_f32(w, "llama.rope.freq_base", 500000.0f)) ||
	    (r = gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f)) ||
	    (r = gguf_writer_add_u32(w, "llama.vocab_size", (uint32_t)g->n_vocab)))
		return r;
	if (g->explicit_head_dim &&
	    ((r = gguf_writer_add_u32(w, "llama.attention.key_length", (uint32_t)g->head_dim)) ||
	     (r = gguf_writer_add_u32(w, "llama.attention.value_length", (uint32_t)g->head_dim))))
		return r;
	return gen_tokenizer(w, g->n_vocab);
}

/* ---- the command -------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab gen-model --layers L --dim D --heads H --kv-heads K --ff F\n"
		"                             --vocab V --type TYPE -o FILE [OPTIONS]\n\n"
		"Writes a llama-architecture GGUF with seeded random weights (all matrices of\n"
		"TYPE, norms F32) and a byte-level BPE tokenizer, for speed measurements.\n\n"
		"      --arch llama    architecture (only llama)\n"
		"      --layers L      transformer blocks\n"
		"      --dim D         embedding width\n"
		"      --heads H       attention heads\n"
		"      --kv-heads K    key/value heads (divides H)\n"
		"      --head-dim N    per-head width (default D / H)\n"
		"      --ff F          feed-forward width\n"
		"      --vocab V       vocabulary size (at least %d)\n"
		"      --type TYPE     F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K or Q4_K_M\n"
		"                      (default Q4_K);\n"
		"                      Q4_K_M is llama.cpp's mix: Q4_K, with output and the attn_v\n"
		"                      and ffn_down of some layers in Q6_K. Rows are whole blocks:\n"
		"                      D, H * head-dim and F multiples of 32 for Q8_0, Q4_0, Q4_1, Q5_0,\n"
		"                      of 256 for the K types\n"
		"      --ctx N         context_length metadata (default 8192)\n"
		"      --seed N        weight seed (default 1)\n"
		"  -o, --output FILE   where to write (via FILE.tmp, renamed when complete)\n",
		N_FIXED_TOKENS);
}

static int gen_parse_type(const char *s, GenShape *g)
{
	static const uint32_t types[] = { WTYPE_F32, WTYPE_F16, WTYPE_Q8_0, WTYPE_Q4_0, WTYPE_Q4_1, WTYPE_Q5_0,
					  WTYPE_Q4_K, WTYPE_Q6_K };
	g->q4_k_m = strcasecmp(s, "Q4_K_M") == 0;
	if (g->q4_k_m) {
		g->type = WTYPE_Q4_K;
		return 0;
	}
	for (size_t i = 0; i < ARRAY_SIZE(types); i++)
		if (strcasecmp(s, wtype_name(types[i])) == 0) {
			g->type = types[i];
			return 0;
		}
	fprintf(stderr, "turbokv-lab: --type: '%s' is not one of F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K, Q4_K_M\n", s);
	return -1;
}

/* Shape rules the loader and the block formats impose; message printed. */
static int gen_check(GenShape *g)
{
	uint32_t be = wtype_info(g->type)->block_elems;
	if (!g->n_layers || !g->dim || !g->n_heads || !g->ff_dim || !g->n_vocab) {
		fprintf(stderr, "turbokv-lab: gen-model needs --layers, --dim, --heads, --ff and --vocab\n");
		return -1;
	}
	if (!g->n_kv_heads)
		g->n_kv_heads = g->n_heads;
	if (g->n_heads % g->n_kv_heads) {
		fprintf(stderr, "turbokv-lab: --heads %d is not a multiple of --kv-heads %d\n", g->n_heads,
			g->n_kv_heads);
		return -1;
	}
	if (!g->head_dim) {
		if (g->dim % g->n_heads) {
			fprintf(stderr, "turbokv-lab: --dim %d is not divisible by --heads %d (give --head-dim)\n",
				g->dim, g->n_heads);
			return -1;
		}
		g->head_dim = g->dim / g->n_heads;
	}
	if (g->head_dim % 2) {
		fprintf(stderr, "turbokv-lab: head dimension %d must be even (RoPE pairs)\n", g->head_dim);
		return -1;
	}
	long qdim = (long)g->n_heads * g->head_dim;
	if (g->dim % be || qdim % be || g->ff_dim % be) {
		fprintf(stderr,
			"turbokv-lab: %s rows are blocks of %u values: --dim %d, heads x head-dim %ld and "
			"--ff %d must be multiples of %u\n",
			wtype_name(g->type), be, g->dim, qdim, g->ff_dim, be);
		return -1;
	}
	return 0;
}

static int gen_parse(int argc, char **argv, GenShape *g, const char **ret_path)
{
	enum { OPT_ARCH = 0x2000, OPT_LAYERS, OPT_DIM, OPT_HEADS, OPT_KV_HEADS, OPT_HEAD_DIM, OPT_FF,
	       OPT_VOCAB, OPT_TYPE, OPT_CTX, OPT_SEED, OPT_HELP };
	static const struct option longopts[] = {
		{ "arch", required_argument, NULL, OPT_ARCH },
		{ "layers", required_argument, NULL, OPT_LAYERS },
		{ "dim", required_argument, NULL, OPT_DIM },
		{ "heads", required_argument, NULL, OPT_HEADS },
		{ "kv-heads", required_argument, NULL, OPT_KV_HEADS },
		{ "head-dim", required_argument, NULL, OPT_HEAD_DIM },
		{ "ff", required_argument, NULL, OPT_FF },
		{ "vocab", required_argument, NULL, OPT_VOCAB },
		{ "type", required_argument, NULL, OPT_TYPE },
		{ "ctx", required_argument, NULL, OPT_CTX },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "output", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, OPT_HELP },
		{}
	};
	const char *path = NULL;
	long v = 0;
	int c;

	*g = (GenShape){ .n_ctx = 8192, .seed = 1, .type = WTYPE_Q4_K };
	optind = 1;
	while ((c = getopt_long(argc, argv, "o:", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_ARCH:
			if (strcmp(optarg, "llama") != 0) {
				fprintf(stderr, "turbokv-lab: --arch: only 'llama' is generated\n");
				return -1;
			}
			break;
#define INT_OPT(id, flag, field, min, max)                                  \
	case id:                                                            \
		if ((v = lab_parse_long(flag, optarg, min, max)) < 0)       \
			return -1;                                          \
		g->field = (int)v;                                          \
		break;
		INT_OPT(OPT_LAYERS, "--layers", n_layers, 1, 4096)
		INT_OPT(OPT_DIM, "--dim", dim, 1, 1 << 16)
		INT_OPT(OPT_HEADS, "--heads", n_heads, 1, 1024)
		INT_OPT(OPT_KV_HEADS, "--kv-heads", n_kv_heads, 1, 1024)
		INT_OPT(OPT_HEAD_DIM, "--head-dim", head_dim, 2, 1024)
		INT_OPT(OPT_FF, "--ff", ff_dim, 1, 1 << 18)
		INT_OPT(OPT_VOCAB, "--vocab", n_vocab, N_FIXED_TOKENS, 1 << 24)
		INT_OPT(OPT_CTX, "--ctx", n_ctx, 1, 1 << 24)
#undef INT_OPT
		case OPT_TYPE:
			if (gen_parse_type(optarg, g) < 0)
				return -1;
			break;
		case OPT_SEED: {
			char *end;
			errno = 0;
			g->seed = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-') {
				fprintf(stderr, "turbokv-lab: --seed: '%s' is not a non-negative integer\n", optarg);
				return -1;
			}
			break;
		}
		case 'o': path = optarg; break;
		case OPT_HELP: usage(stdout); return 1;
		default: usage(stderr); return -1;
		}
	}
	g->explicit_head_dim = g->head_dim != 0;
	if (optind != argc || !path) {
		fprintf(stderr, "turbokv-lab: gen-model needs -o FILE and no other arguments\n");
		return -1;
	}
	if (gen_check(g) < 0)
		return -1;
	*ret_path = path;
	return 0;
}

int cmd_genmodel(int argc, char **argv)
{
	GenShape g;
	const char *path;
	int r = gen_parse(argc, argv, &g, &path);
	if (r != 0)
		return r > 0 ? LAB_EXIT_OK : LAB_EXIT_USAGE;

	size_t n_tensors = 3 + 9 * (size_t)g.n_layers;
	_cleanup_(freep) GenTensor *ts = malloc_array(n_tensors, sizeof(GenTensor));
	_cleanup_(freep) uint8_t *buf = malloc(CHUNK_BYTES);
	if (!ts || !buf) {
		fprintf(stderr, "turbokv-lab: out of memory\n");
		return LAB_EXIT_FAILURE;
	}
	n_tensors = gen_tensors(&g, ts);

	uint64_t t0 = now_ns(), total = 0;
	Error err = { 0 };
	_cleanup_(gguf_writer_freep) GgufWriter *w = NULL;
	if ((r = gguf_writer_new(path, &w, &err)))
		goto fail;
	if ((r = gen_metadata(w, &g))) {
		error_set(&err, r, "metadata: %s", r < 0 ? strerror(-r) : "rejected by the writer");
		goto fail;
	}
	for (size_t i = 0; i < n_tensors; i++) {
		if ((r = gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, &err)))
			goto fail;
		total += gguf_writer_tensor_size(w, ts[i].name);
	}
	if ((r = gguf_writer_begin_data(w, &err)))
		goto fail;
	for (size_t i = 0; i < n_tensors; i++) {
		if ((r = gen_tensor_write(w, &g, &ts[i], i, buf))) {
			error_set(&err, r, "writing %s: %s", ts[i].name,
				  r < 0 ? strerror(-r) : "size mismatch");
			goto fail;
		}
	}
	if ((r = gguf_writer_finish(w, &err)))
		goto fail;

	double secs = (double)(now_ns() - t0) * 1e-9;
	printf("wrote %s: llama, %d layers, dim %d, %d heads (%d kv, head_dim %d), ff %d, vocab %d, "
	       "%s, %zu tensors, %.2f GiB of weights in %.1f s (%.0f MiB/s)\n",
	       path, g.n_layers, g.dim, g.n_heads, g.n_kv_heads, g.head_dim, g.ff_dim, g.n_vocab,
	       g.q4_k_m ? "Q4_K_M" : wtype_name(g.type), n_tensors, (double)total / (1 << 30), secs,
	       secs > 0 ? (double)total / (1 << 20) / secs : 0.0);
	return LAB_EXIT_OK;

fail:
	fprintf(stderr, "turbokv-lab: gen-model %s: %s\n", path, err.msg[0] ? err.msg : strerror(r < 0 ? -r : EINVAL));
	return LAB_EXIT_FAILURE;
}
