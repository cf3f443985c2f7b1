/*
 * model.c: loading a llama-family GGUF and running its forward pass.
 *
 * Loading checks every tensor the forward pass touches (presence, type,
 * shape) so that evaluation itself never meets a surprise. The forward
 * pass is batched: a prefill of n tokens runs each weight matrix once
 * over an (n, dim) activation block; decode is the n = 1 case, and
 * model_eval_batch() decodes one token of each of n sequences in one
 * such block (EvalSeqs says whose tokens a batch holds: only RoPE
 * positions and attention differ per sequence).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "kernels/wtype.h"

/* ---- loading ------------------------------------------------------------ */

typedef struct Loader {
	Model *m;
	const char *arch;
	Error *err;
	bool f32_weights; /* model_load_f32(): matrices dequantized into owned memory */
} Loader;

static int arch_key(const Loader *ld, const char *suffix, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s.%s", ld->arch, suffix);
	return n > 0 && (size_t)n < size ? 0 : -ENAMETOOLONG;
}

/*
 * Integer metadata "<arch>.<suffix>" in [1, max]; when absent, def if
 * def >= 0 (returned as is, so 0 can mean "not given"), else an error.
 */
static int get_int(const Loader *ld, const char *suffix, int64_t def, int64_t max, int *ret)
{
	char key[128];
	int64_t v;
	int r = arch_key(ld, suffix, key, sizeof(key));
	if (r < 0)
		return r;
	r = gguf_get_i64(ld->m->gguf, key, &v);
	if (r == GGUF_E_NOT_FOUND && def >= 0) {
		*ret = (int)def;
		return 0;
	}
	if (r != 0)
		return error_set(ld->err, MODEL_E_INVALID, "metadata %s: %s", key,
				 r == GGUF_E_NOT_FOUND ? "missing" : "not an integer");
	if (v < 1 || v > max)
		return error_set(ld->err, MODEL_E_INVALID, "metadata %s = %lld out of range [1, %lld]",
				 key, (long long)v, (long long)max);
	*ret = (int)v;
	return 0;
}

static int get_float(const Loader *ld, const char *suffix, float def, float *ret)
{
	char key[128];
	int r = arch_key(ld, suffix, key, sizeof(key));
	if (r < 0)
		return r;
	r = gguf_get_f32(ld->m->gguf, key, ret);
	if (r == GGUF_E_NOT_FOUND) {
		*ret = def;
		return 0;
	}
	if (r != 0 || !isfinite(*ret))
		return error_set(ld->err, MODEL_E_INVALID, "metadata %s: not a finite float", key);
	return 0;
}

static int load_config(Loader *ld)
{
	ModelConfig *c = &ld->m->cfg;
	GgufStr s;
	int r;

	if (gguf_get_str(ld->m->gguf, "general.architecture", &s) != 0)
		return error_set(ld->err, MODEL_E_INVALID, "metadata general.architecture missing");
	static const struct {
		const char *name;
		ModelArch arch;
		RopeStyle style;
	} archs[] = {
		{ "llama", MODEL_ARCH_LLAMA, ROPE_STYLE_NORM },
		{ "qwen2", MODEL_ARCH_QWEN2, ROPE_STYLE_NEOX },
		{ "qwen3", MODEL_ARCH_QWEN3, ROPE_STYLE_NEOX },
		{ "gemma3", MODEL_ARCH_GEMMA3, ROPE_STYLE_NEOX },
	};
	ld->arch = NULL;
	for (size_t i = 0; i < ARRAY_SIZE(archs); i++)
		if (gguf_str_eq(s, archs[i].name)) {
			c->arch = archs[i].arch;
			ld->arch = archs[i].name;
			c->rope_style = archs[i].style;
		}
	if (!ld->arch)
		return error_set(ld->err, MODEL_E_UNSUPPORTED,
				 "architecture '%.*s' is not supported (supported: llama, qwen2, qwen3, gemma3)",
				 (int)MIN(s.len, 64), s.ptr);
	c->qk_norm = c->arch == MODEL_ARCH_QWEN3 || c->arch == MODEL_ARCH_GEMMA3;
	c->post_norms = c->arch == MODEL_ARCH_GEMMA3;
	c->ffn_act = c->arch == MODEL_ARCH_GEMMA3 ? FFN_GELU : FFN_SILU;
	c->embd_scale = 1.0f;
	c->q_scale = 1.0f;

	if ((r = get_int(ld, "block_count", -1, 4096, &c->n_layers)) ||
	    (r = get_int(ld, "embedding_length", -1, 1 << 16, &c->dim)) ||
	    (r = get_int(ld, "feed_forward_length", -1, 1 << 18, &c->ff_dim)) ||
	    (r = get_int(ld, "attention.head_count", -1, 1024, &c->n_heads)) ||
	    (r = get_int(ld, "attention.head_count_kv", c->n_heads, 1024, &c->n_kv_heads)) ||
	    (r = get_int(ld, "context_length", 2048, 1 << 24, &c->n_ctx_train)))
		return r;
	/* head_dim: explicit key_length, else dim / n_heads (which must then divide) */
	if ((r = get_int(ld, "attention.key_length", 0, 1024, &c->head_dim)))
		return r;
	if (c->head_dim == 0) {
		if (c->dim % c->n_heads)
			return error_set(ld->err, MODEL_E_INVALID, "embedding_length %d not divisible by %d heads",
					 c->dim, c->n_heads);
		c->head_dim = c->dim / c->n_heads;
	}
	int vlen;
	if ((r = get_int(ld, "attention.value_length", c->head_dim, 1024, &vlen)))
		return r;
	if (vlen != c->head_dim)
		return error_set(ld->err, MODEL_E_UNSUPPORTED, "key_length %d != value_length %d",
				 c->head_dim, vlen);
	if (c->n_heads % c->n_kv_heads)
		return error_set(ld->err, MODEL_E_INVALID, "head_count %d not a multiple of head_count_kv %d",
				 c->n_heads, c->n_kv_heads);
	if ((r = get_int(ld, "rope.dimension_count", c->head_dim, c->head_dim, &c->n_rot)))
		return r;
	if (c->n_rot % 2 || c->n_rot > 512)
		return error_set(ld->err, MODEL_E_UNSUPPORTED, "rope.dimension_count %d", c->n_rot);
	if ((r = get_float(ld, "attention.layer_norm_rms_epsilon", 1e-5f, &c->rms_eps)) ||
	    (r = get_float(ld, "rope.freq_base", 10000.0f, &c->rope_base)))
		return r;

	/*
	 * RoPE scaling, read as llama.cpp reads it: the type defaults to
	 * linear, the factor comes from rope.scaling.factor or the legacy
	 * rope.scale_linear, and positions are divided by it (none and linear
	 * both apply a factor that is present). Other types are refused.
	 */
	char key[128];
	arch_key(ld, "rope.scaling.type", key, sizeof(key));
	r = gguf_get_str(ld->m->gguf, key, &s);
	if (r == GGUF_E_WRONG_TYPE)
		return error_set(ld->err, MODEL_E_INVALID, "metadata %s is not a string", key);
	if (r == 0 && !gguf_str_eq(s, "none") && !gguf_str_eq(s, "linear"))
		return error_set(ld->err, MODEL_E_UNSUPPORTED, "rope scaling '%.*s' is not supported",
				 (int)MIN(s.len, 32), s.ptr);
	float factor;
	if ((r = get_float(ld, "rope.scaling.factor", 0.0f, &factor)))
		return r;
	if (factor == 0.0f && (r = get_float(ld, "rope.scale_linear", 0.0f, &factor)))
		return r;
	if (factor < 0.0f)
		return error_set(ld->err, MODEL_E_INVALID, "rope scaling factor %g is negative", factor);
	c->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
	c->rope_base_local = c->rope_base;

	if (c->arch == MODEL_ARCH_GEMMA3) {
		/* llama.cpp's gemma3 hparams: 5 local layers then 1 global, local RoPE base 10000 */
		if ((r = get_int(ld, "attention.sliding_window", 0, 1 << 24, &c->sliding_window)))
			return r;
		c->swa_period = 6;
		c->rope_base_local = 10000.0f;
		c->embd_scale = sqrtf((float)c->dim);
		/* queries times 1/sqrt(key_length), or 1/sqrt(dim / n_heads) for the 27B (62 layers) */
		float d = c->n_layers == 62 ? (float)c->dim / c->n_heads : (float)c->head_dim;
		c->q_scale = sqrtf((float)c->head_dim) / sqrtf(d);
	}
	return 0;
}

static const GgufTensor *find_tensor(const Loader *ld, const char *name, bool required)
{
	const GgufTensor *t = gguf_find_tensor(ld->m->gguf, name);
	if (!t && required)
		error_set(ld->err, MODEL_E_INVALID, "tensor '%s' is missing", name);
	return t;
}

/* n floats the model owns (freed with it), or NULL. */
static float *own_floats(Model *m, size_t n)
{
	float **owned = realloc(m->owned, (m->n_owned + 1) * sizeof(*owned));
	if (!owned)
		return NULL;
	m->owned = owned;
	float *v = malloc_array(n, sizeof(float));
	if (v)
		m->owned[m->n_owned++] = v;
	return v;
}

/* A 2-D weight (rows, cols): ne = {cols, rows} in GGUF order. */
static int load_matrix(const Loader *ld, const char *name, int64_t rows, int64_t cols,
		       MatmulWeight *ret)
{
	const GgufTensor *t = find_tensor(ld, name, true);
	if (!t)
		return MODEL_E_INVALID;
	if (!wtype_is_supported(t->type))
		return error_set(ld->err, MODEL_E_UNSUPPORTED, "tensor '%s' has weight type %s (%u), not supported",
				 name, wtype_name(t->type), t->type);
	if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
		return error_set(ld->err, MODEL_E_INVALID,
				 "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
				 (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
				 (long long)cols, (long long)rows);
	*ret = (MatmulWeight){
		.data = t->data, .type = t->type, .rows = rows, .cols = cols,
		.row_stride = wtype_row_bytes(t->type, cols),
	};
	if (ld->f32_weights && t->type != WTYPE_F32) {
		if (cols <= 0 || (size_t)rows > SIZE_MAX / sizeof(float) / (size_t)cols)
			return -ENOMEM;
		float *v = own_floats(ld->m, (size_t)rows * (size_t)cols);
		if (!v)
			return -ENOMEM;
		for (int64_t r = 0; r < rows; r++)
			wtype_dequantize_row(t->type, (const uint8_t *)t->data + r * ret->row_stride, v + r * cols,
					     cols);
		*ret = (MatmulWeight){ .data = v, .type = WTYPE_F32, .rows = rows, .cols = cols,
				       .row_stride = (size_t)cols * sizeof(float) };
	}
	return 0;
}

/* A 1-D f32 vector of n values; other types are converted into owned memory. */
static int load_vector(const Loader *ld, const char *name, int64_t n, bool required,
		       const float **ret)
{
	Model *m = ld->m;
	const GgufTensor *t = find_tensor(ld, name, required);
	if (!t) {
		if (required)
			return MODEL_E_INVALID;
		*ret = NULL;
		return 0;
	}
	if (t->n_dims != 1 || (int64_t)t->ne[0] != n)
		return error_set(ld->err, MODEL_E_INVALID, "tensor '%s' has %llu values, expected %lld",
				 name, (unsigned long long)t->ne[0], (long long)n);
	if (t->type == WTYPE_F32) {
		*ret = t->data;
		return 0;
	}
	if (!wtype_is_supported(t->type) || wtype_row_bytes(t->type, n) == 0)
		return error_set(ld->err, MODEL_E_UNSUPPORTED, "tensor '%s': type %s not supported here",
				 name, wtype_name(t->type));
	float *v = own_floats(m, (size_t)n);
	if (!v)
		return -ENOMEM;
	wtype_dequantize_row(t->type, t->data, v, n);
	*ret = v;
	return 0;
}

static int load_layer(const Loader *ld, int il, LayerWeights *w)
{
	const ModelConfig *c = &ld->m->cfg;
	int64_t qdim = (int64_t)c->n_heads * c->head_dim, kvdim = (int64_t)c->n_kv_heads * c->head_dim;
	bool biases = c->arch == MODEL_ARCH_QWEN2, post = c->post_norms;
	char name[96];
	int r;

#define NAME(s) (snprintf(name, sizeof(name), "blk.%d." s, il), name)
	if ((r = load_vector(ld, NAME("attn_norm.weight"), c->dim, true, &w->attn_norm)) ||
	    (r = load_matrix(ld, NAME("attn_q.weight"), qdim, c->dim, &w->wq)) ||
	    (r = load_matrix(ld, NAME("attn_k.weight"), kvdim, c->dim, &w->wk)) ||
	    (r = load_matrix(ld, NAME("attn_v.weight"), kvdim, c->dim, &w->wv)) ||
	    (r = load_matrix(ld, NAME("attn_output.weight"), c->dim, qdim, &w->wo)) ||
	    (r = load_vector(ld, NAME("attn_q.bias"), qdim, biases, &w->bq)) ||
	    (r = load_vector(ld, NAME("attn_k.bias"), kvdim, biases, &w->bk)) ||
	    (r = load_vector(ld, NAME("attn_v.bias"), kvdim, biases, &w->bv)) ||
	    (r = load_vector(ld, NAME("ffn_norm.weight"), c->dim, true, &w->ffn_norm)) ||
	    (r = load_matrix(ld, NAME("ffn_gate.weight"), c->ff_dim, c->dim, &w->w_gate)) ||
	    (r = load_matrix(ld, NAME("ffn_up.weight"), c->ff_dim, c->dim, &w->w_up)) ||
	    (r = load_matrix(ld, NAME("ffn_down.weight"), c->dim, c->ff_dim, &w->w_down)))
		return r;
	if (c->qk_norm &&
	    ((r = load_vector(ld, NAME("attn_q_norm.weight"), c->head_dim, true, &w->q_norm)) ||
	     (r = load_vector(ld, NAME("attn_k_norm.weight"), c->head_dim, true, &w->k_norm))))
		return r;
	if (post &&
	    ((r = load_vector(ld, NAME("post_attention_norm.weight"), c->dim, true, &w->post_attn_norm)) ||
	     (r = load_vector(ld, NAME("post_ffw_norm.weight"), c->dim, true, &w->post_ffw_norm))))
		return r;
	w->local = c->sliding_window > 0 && il % c->swa_period != c->swa_period - 1;
#undef NAME
	return 0;
}

static int load_weights(Loader *ld)
{
	Model *m = ld->m;
	ModelConfig *c = &m->cfg;
	int r;

	const GgufTensor *emb = find_tensor(ld, "token_embd.weight", true);
	if (!emb)
		return MODEL_E_INVALID;
	if (emb->n_dims != 2 || emb->ne[1] < 1 || emb->ne[1] > (1u << 24))
		return error_set(ld->err, MODEL_E_INVALID, "token_embd.weight has a bad shape");
	c->n_vocab = (int)emb->ne[1];
	if ((r = load_matrix(ld, "token_embd.weight", c->n_vocab, c->dim, &m->tok_embd)))
		return r;
	if (gguf_find_tensor(m->gguf, "output.weight")) {
		if ((r = load_matrix(ld, "output.weight", c->n_vocab, c->dim, &m->output)))
			return r;
	} else {
		m->output = m->tok_embd; /* tied embeddings */
	}
	if ((r = load_vector(ld, "output_norm.weight", c->dim, true, &m->output_norm)))
		return r;

	const float *factors;
	if ((r = load_vector(ld, "rope_freqs.weight", c->n_rot / 2, false, &factors)))
		return r;
	rope_init(&m->rope, c->rope_style, c->n_rot, c->rope_base, c->rope_freq_scale, factors);
	rope_init(&m->rope_local, c->rope_style, c->n_rot, c->rope_base_local, c->rope_freq_scale, factors);

	const BackendOps *ops = m->backend->ops;
	if ((c->ffn_act == FFN_GELU || c->embd_scale != 1.0f || c->q_scale != 1.0f) &&
	    (!ops->geglu || !ops->scale))
		return error_set(ld->err, MODEL_E_UNSUPPORTED,
				 "architecture %s does not run on the %s backend yet (no GELU/scale ops)",
				 ld->arch, backend_name(m->backend));

	m->layers = calloc_array(c->n_layers, sizeof(LayerWeights));
	if (!m->layers)
		return -ENOMEM;
	for (int il = 0; il < c->n_layers; il++)
		if ((r = load_layer(ld, il, &m->layers[il])))
			return r;
	return 0;
}

/*
 * Hand every weight to the backend once (the CPU keeps reading the
 * mapping; CUDA copies to device memory and the pointers become device
 * pointers). A tied output matrix is the embedding's upload, not a second
 * copy.
 */
static int upload_weights(Model *m, Error *err)
{
	Backend *b = m->backend;
	const ModelConfig *c = &m->cfg;
	bool tied = m->output.data == m->tok_embd.data;
	int r;

	/* A weight the backend copied gives its mapped pages back. */
#define UPLOAD_W(w, what) \
	{ \
		const void *mapped = (w).data; \
		if ((r = b->ops->upload_weight(b, &(w)))) \
			return error_set(err, r, "%s: uploading %s failed (%s)", backend_name(b), what, \
					 r == -ENOMEM ? "out of memory" : "device error"); \
		if ((w).data != mapped) \
			gguf_release_range(m->gguf, mapped, (size_t)(w).rows * (w).row_stride); \
		m->n_uploaded++; \
	}
#define UPLOAD_V(v, n, what) \
	if ((v) && (r = b->ops->upload_vector(b, &(v), n))) \
		return error_set(err, r, "%s: uploading %s failed (%s)", backend_name(b), what, \
				 r == -ENOMEM ? "out of memory" : "device error");
	UPLOAD_W(m->tok_embd, "token_embd.weight")
	if (tied)
		m->output = m->tok_embd;
	else
		UPLOAD_W(m->output, "output.weight")
	UPLOAD_V(m->output_norm, c->dim, "output_norm.weight")
	int64_t qdim = (int64_t)c->n_heads * c->head_dim, kvdim = (int64_t)c->n_kv_heads * c->head_dim;
	for (int il = 0; il < c->n_layers; il++) {
		LayerWeights *w = &m->layers[il];
		char what[48];
		snprintf(what, sizeof(what), "layer %d", il);
		UPLOAD_V(w->attn_norm, c->dim, what)
		UPLOAD_W(w->wq, what)
		UPLOAD_W(w->wk, what)
		UPLOAD_W(w->wv, what)
		UPLOAD_W(w->wo, what)
		UPLOAD_V(w->bq, qdim, what)
		UPLOAD_V(w->bk, kvdim, what)
		UPLOAD_V(w->bv, kvdim, what)
		UPLOAD_V(w->ffn_norm, c->dim, what)
		UPLOAD_W(w->w_gate, what)
		UPLOAD_W(w->w_up, what)
		UPLOAD_W(w->w_down, what)
		UPLOAD_V(w->q_norm, c->head_dim, what)
		UPLOAD_V(w->k_norm, c->head_dim, what)
		UPLOAD_V(w->post_attn_norm, c->dim, what)
		UPLOAD_V(w->post_ffw_norm, c->dim, what)
	}
#undef UPLOAD_W
#undef UPLOAD_V
	return 0;
}

static int load_gguf(Gguf *g, Backend *b, bool f32_weights, Model **ret, Error *err)
{
	_cleanup_(model_freep) Model *m = calloc(1, sizeof(*m));
	if (!m) {
		gguf_free(g);
		return -ENOMEM;
	}
	m->gguf = g;
	m->backend = b;
	Loader ld = { .m = m, .err = err, .f32_weights = f32_weights };
	int r = load_config(&ld);
	if (r == 0)
		r = load_weights(&ld);
	if (r == 0)
		r = upload_weights(m, err);
	if (r != 0)
		return r;
	*ret = TAKE_PTR(m);
	return 0;
}

int model_load_gguf(Gguf *g, Backend *b, Model **ret, Error *err)
{
	return load_gguf(g, b, false, ret, err);
}

char *model_default_path(char *buf, size_t size)
{
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	if (xdg && *xdg)
		snprintf(buf, size, "%s/turbokv/models/" MODEL_DEFAULT_FILE, xdg);
	else
		snprintf(buf, size, "%s/.cache/turbokv/models/" MODEL_DEFAULT_FILE, home ? home : "/");
	return buf;
}

int model_load_on(const char *path, Backend *b, Model **ret, Error *err)
{
	Gguf *g;
	int r = gguf_open(path, &g, err);
	if (r != 0)
		return r;
	return model_load_gguf(g, b, ret, err);
}

int model_load(const char *path, Model **ret, Error *err)
{
	return model_load_on(path, backend_cpu(), ret, err);
}

int model_load_f32(const char *path, Model **ret, Error *err)
{
	Gguf *g;
	int r = gguf_open(path, &g, err);
	if (r != 0)
		return r;
	return load_gguf(g, backend_cpu(), true, ret, err);
}

/* Hand back what upload_weights() got from the backend (the first
 * n_uploaded weights, in its order; a tied output is tok_embd's). */
static void release_weights(Model *m)
{
	Backend *b = m->backend;
	size_t n = m->n_uploaded;
	if (!b || !b->ops->release_weight || n == 0)
		return;
	bool tied = m->output.data == m->tok_embd.data;
	b->ops->release_weight(b, &m->tok_embd);
	if (--n && !tied) {
		b->ops->release_weight(b, &m->output);
		n--;
	}
	for (int il = 0; n > 0 && il < m->cfg.n_layers; il++) {
		LayerWeights *w = &m->layers[il];
		MatmulWeight *ws[] = { &w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down };
		for (size_t i = 0; n > 0 && i < ARRAY_SIZE(ws); i++, n--)
			b->ops->release_weight(b, ws[i]);
	}
}

Model *model_free(Model *m)
{
	if (!m)
		return NULL;
	release_weights(m);
	for (size_t i = 0; i < m->n_owned; i++)
		free(m->owned[i]);
	free(m->owned);
	free(m->layers);
	gguf_free(m->gguf);
	free(m);
	return NULL;
}

KvCacheShape model_kv_shape(const Model *m, int64_t n_ctx)
{
	return (KvCacheShape){
		.n_layers = m->cfg.n_layers,
		.n_heads = m->cfg.n_heads,
		.n_kv_heads = m->cfg.n_kv_heads,
		.head_dim = m->cfg.head_dim,
		.capacity = n_ctx,
		/* the local layers' window, masked (and their blocks dropped) by the cache */
		.window = m->cfg.sliding_window,
		.window_period = m->cfg.swa_period,
		/* the keys' RoPE, for the formats that center on the mean before it (kvropemean.h) */
		.rope = m->rope,
		.rope_local = m->rope_local,
	};
}

const char *model_arch_name(ModelArch a)
{
	switch (a) {
	case MODEL_ARCH_LLAMA: return "llama";
	case MODEL_ARCH_QWEN2: return "qwen2";
	case MODEL_ARCH_QWEN3: return "qwen3";
	case MODEL_ARCH_GEMMA3: return "gemma3";
	}
	return "?";
}

int model_kvcache_new(const Model *m, const KvPlan *plan, uint64_t seed, int64_t n_ctx, KvCache **ret,
		      Error *err)
{
	KvCacheShape shape = model_kv_shape(m, n_ctx);
	return m->backend->ops->kvcache_new(m->backend, &shape, plan, seed, ret, err);
}

int model_kvcache_adopt(const Model *m, KvCache *host, KvCache **ret, Error *err)
{
	return m->backend->ops->kvcache_adopt(m->backend, host, ret, err);
}

LogitsDiff model_logits_diff(const float *got, const float *ref, int n)
{
	LogitsDiff d = { .top_got = 0, .top_ref = 0 };
	float lo = ref[0], hi = ref[0];
	for (int i = 1; i < n; i++) {
		lo = fminf(lo, ref[i]);
		if (ref[i] > hi) {
			hi = ref[i];
			d.top_ref = i;
		}
		if (!(got[i] <= got[d.top_got])) /* NaN-proof: a NaN is never the top */
			d.top_got = isnan(got[i]) ? d.top_got : i;
	}
	double range = fmax((double)hi - lo, 1e-6), sum = 0.0, second = -INFINITY;
	for (int i = 0; i < n; i++) {
		double diff = fabs((double)got[i] - ref[i]);
		if (!isfinite(diff))
			diff = INFINITY;
		d.max_rel = fmax(d.max_rel, diff / range);
		sum += diff;
		if (i != d.top_ref)
			second = fmax(second, ref[i]);
	}
	d.mean_rel = sum / n / range;
	d.margin = n > 1 ? (hi - second) / range : 1.0;
	return d;
}

bool model_logits_agree(const LogitsDiff *d)
{
	return d->max_rel <= MODEL_LOGITS_MAX_REL && d->mean_rel <= MODEL_LOGITS_MEAN_REL &&
	       (d->margin <= MODEL_LOGITS_CLEAR_MARGIN || d->top_got == d->top_ref);
}

void model_describe(const Model *m, char *buf, size_t size)
{
	const ModelConfig *c = &m->cfg;
	snprintf(buf, size,
		 "%s: %d layers, dim %d, %d heads (%d kv, head_dim %d), ff %d, vocab %d, ctx %d, weights %s",
		 model_arch_name(c->arch), c->n_layers, c->dim, c->n_heads,
		 c->n_kv_heads, c->head_dim, c->ff_dim, c->n_vocab, c->n_ctx_train,
		 wtype_name(m->layers[0].wq.type));
}

/* ---- forward pass ------------------------------------------------------- */

/*
 * Activations live in the backend's memory (device memory for CUDA); the
 * host arrays are the positions and, for a backend that is not host
 * memory, nothing else: logits come back through download().
 */
struct ModelRun {
	Backend *b;     /* the model's */
	ThreadPool *tp; /* borrowed: host threads (CPU kernels, host caches) */
	int max_batch;
	float *x;    /* (B, dim) residual stream */
	float *xb;   /* (B, dim) normed input / branch output */
	float *q;    /* (B, n_heads * head_dim) */
	float *k;    /* (B, n_kv_heads * head_dim) */
	float *v;    /* (B, n_kv_heads * head_dim) */
	float *att;  /* (B, n_heads * head_dim) attention output */
	float *hb;   /* (B, ff_dim) gate, then swiglu */
	float *hb2;  /* (B, ff_dim) up */
	float *cs, *sn; /* (B, n_rot / 2) rope angles of the batch */
	float *cs_l, *sn_l; /* (B, n_rot / 2) the local layers' angles (gemma3), else NULL */
	float *logits;  /* (B, n_vocab) when the backend is not host memory, else NULL */
	int64_t *pos;     /* host (B,): position of each sequence of a multi-sequence batch */
	int64_t *tok_pos; /* host (B,): position of each token of the batch */
	int32_t *tok;     /* host (B,): the tokens of a multi-sequence batch (0 for a failed one) */
	_Atomic uint64_t layers_done; /* layers evaluated so far, read by model_run_progress() */
};

/*
 * Whose tokens a batch holds: either n tokens of one sequence at
 * positions pos0 .. pos0 + n - 1 of kvs[0] (n_seq == 1), or one token of
 * each of n sequences, token i at pos[i] of kvs[i] (n_seq == n).
 */
typedef struct EvalSeqs {
	KvCache *const *kvs;  /* (n_seq,) */
	const int64_t *pos;   /* (n_seq,) first position of each sequence's tokens */
	int64_t n_seq;
	/*
	 * (n_seq,) 0, or why sequence i failed (set before the batch for
	 * input errors, by the batch for its cache's): a failed sequence is
	 * neither appended to nor attended any more, and its cache is not
	 * advanced. Its rows of the batch still run through the weights.
	 */
	int *status;
} EvalSeqs;

uint64_t model_run_progress(const ModelRun *r)
{
	return atomic_load_explicit(&r->layers_done, memory_order_relaxed);
}

ModelRun *model_run_free(ModelRun *r)
{
	if (!r)
		return NULL;
	float *bufs[] = { r->x, r->xb, r->q, r->k, r->v, r->att, r->hb, r->hb2, r->cs, r->sn, r->cs_l, r->sn_l,
			  r->logits };
	for (size_t i = 0; i < ARRAY_SIZE(bufs); i++)
		if (bufs[i])
			r->b->ops->dealloc(r->b, bufs[i]);
	free(r->pos);
	free(r->tok_pos);
	free(r->tok);
	free(r);
	return NULL;
}

static int run_alloc(ModelRun *r, size_t n, float **ret)
{
	size_t bytes;
	if (size_mul_overflows(n, sizeof(float), &bytes))
		return -ENOMEM;
	return r->b->ops->alloc(r->b, bytes, (void **)ret);
}

int model_run_new(const Model *m, int max_batch, ThreadPool *tp, ModelRun **ret)
{
	const ModelConfig *c = &m->cfg;
	if (max_batch < 1)
		return -EINVAL;
	_cleanup_(model_run_freep) ModelRun *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	size_t b = (size_t)max_batch;
	size_t qdim = (size_t)c->n_heads * c->head_dim, kvdim = (size_t)c->n_kv_heads * c->head_dim;
	r->b = m->backend;
	r->tp = tp;
	r->max_batch = max_batch;
	int e;
	if ((e = run_alloc(r, b * c->dim, &r->x)) || (e = run_alloc(r, b * c->dim, &r->xb)) ||
	    (e = run_alloc(r, b * qdim, &r->q)) || (e = run_alloc(r, b * kvdim, &r->k)) ||
	    (e = run_alloc(r, b * kvdim, &r->v)) || (e = run_alloc(r, b * qdim, &r->att)) ||
	    (e = run_alloc(r, b * c->ff_dim, &r->hb)) || (e = run_alloc(r, b * c->ff_dim, &r->hb2)) ||
	    (e = run_alloc(r, b * (c->n_rot / 2), &r->cs)) || (e = run_alloc(r, b * (c->n_rot / 2), &r->sn)))
		return e;
	if (c->sliding_window > 0 && ((e = run_alloc(r, b * (c->n_rot / 2), &r->cs_l)) ||
				      (e = run_alloc(r, b * (c->n_rot / 2), &r->sn_l))))
		return e;
	if (!backend_is_host(r->b) && (e = run_alloc(r, b * c->n_vocab, &r->logits)))
		return e;
	r->pos = malloc_array(b, sizeof(int64_t));
	r->tok_pos = malloc_array(b, sizeof(int64_t));
	r->tok = malloc_array(b, sizeof(int32_t));
	if (!r->pos || !r->tok_pos || !r->tok)
		return -ENOMEM;
	*ret = TAKE_PTR(r);
	return 0;
}

/* Attention of one token of each of n sequences, the sequences split across threads. */
typedef struct SeqAttendJob {
	const EvalSeqs *s;
	int layer;
	int64_t qdim;
	const float *q; /* (n_seq, qdim) */
	float *att;     /* (n_seq, qdim) */
} SeqAttendJob;

static void seq_attend_task(void *ctx, int ith, int nth)
{
	const SeqAttendJob *j = ctx;
	long begin, end;
	threadpool_split((long)j->s->n_seq, ith, nth, &begin, &end);
	for (long i = begin; i < end; i++)
		if (!j->s->status[i])
			j->s->status[i] = kvcache_attend(j->s->kvs[i], NULL, j->layer, j->s->pos[i], 1,
							 j->q + i * j->qdim, j->att + i * j->qdim);
}

/* A KV cache's append code as the model's: what the caller of model_eval*() sees. */
static int append_status(int e)
{
	if (e == KVCACHE_E_FULL)
		return MODEL_E_CONTEXT;
	if (e > 0) /* KVCACHE_E_POSITION: the model always appends at the end */
		return -EINVAL;
	return e;
}

/*
 * Show the caches the batch's queries, append its K and V (after RoPE)
 * and attend: each
 * sequence's tokens against its own cache, at its own positions. With at
 * least as many sequences as threads, each host thread takes whole
 * sequences (one dispatch per layer instead of one per sequence);
 * otherwise each sequence's attention is split across the threads by the
 * cache. Device caches get their calls from this thread, in order. A
 * cache that fails fails its own sequence (s->status), not the batch.
 */
static void layer_attend(ModelRun *r, const EvalSeqs *s, int il, int64_t n, int64_t qdim, int64_t kvdim)
{
	int64_t per = n / s->n_seq; /* tokens per sequence */
	int nth = r->tp ? threadpool_n_threads(r->tp) : 1;
	for (int64_t i = 0; i < s->n_seq; i++) {
		int64_t t = i * per;
		if (s->status[i])
			continue;
		/* the queries first: a cache learns from them only here, never in attend */
		kvcache_observe(s->kvs[i], il, s->pos[i], per, r->q + t * qdim);
		s->status[i] = append_status(kvcache_append(s->kvs[i], il, s->pos[i], per,
							    r->k + t * kvdim, r->v + t * kvdim));
	}
	if (backend_is_host(r->b) && s->n_seq > 1 && s->n_seq >= nth) {
		SeqAttendJob j = { .s = s, .layer = il, .qdim = qdim, .q = r->q, .att = r->att };
		threadpool_run(r->tp, seq_attend_task, &j);
		return;
	}
	ThreadPool *tp = backend_is_host(r->b) ? r->tp : NULL;
	for (int64_t i = 0; i < s->n_seq; i++)
		if (!s->status[i])
			s->status[i] = kvcache_attend(s->kvs[i], tp, il, s->pos[i], per, r->q + i * per * qdim,
						      r->att + i * per * qdim);
}

static int layer_forward(const Model *m, ModelRun *r, const EvalSeqs *s, int il, int64_t n)
{
	const ModelConfig *c = &m->cfg;
	const LayerWeights *w = &m->layers[il];
	const BackendOps *ops = r->b->ops;
	Backend *b = r->b;
	int64_t qdim = (int64_t)c->n_heads * c->head_dim, kvdim = (int64_t)c->n_kv_heads * c->head_dim;
	int e;

	/* attention block */
	if ((e = ops->rmsnorm(b, r->xb, r->x, w->attn_norm, n, c->dim, c->rms_eps)))
		return e;
	const MatmulWeight *qkv[3] = { &w->wq, &w->wk, &w->wv };
	float *qkv_out[3] = { r->q, r->k, r->v };
	if ((e = ops->matmul(b, r->tp, qkv, qkv_out, 3, r->xb, n)))
		return e;
	if (w->bq && ((e = ops->add_bias(b, r->q, w->bq, n, qdim)) ||
		      (e = ops->add_bias(b, r->k, w->bk, n, kvdim)) ||
		      (e = ops->add_bias(b, r->v, w->bv, n, kvdim))))
		return e;
	if (w->q_norm && ((e = ops->rmsnorm(b, r->q, r->q, w->q_norm, n * c->n_heads, c->head_dim, c->rms_eps)) ||
			  (e = ops->rmsnorm(b, r->k, r->k, w->k_norm, n * c->n_kv_heads, c->head_dim, c->rms_eps))))
		return e;
	const Rope *rope = w->local ? &m->rope_local : &m->rope;
	const float *cs = w->local ? r->cs_l : r->cs, *sn = w->local ? r->sn_l : r->sn;
	if ((e = ops->rope(b, rope, r->q, n, c->n_heads, c->head_dim, cs, sn)) ||
	    (e = ops->rope(b, rope, r->k, n, c->n_kv_heads, c->head_dim, cs, sn)))
		return e;
	if (c->q_scale != 1.0f && (e = ops->scale(b, r->q, c->q_scale, n * qdim)))
		return e;
	layer_attend(r, s, il, n, qdim, kvdim);
	const MatmulWeight *wo = &w->wo;
	if ((e = ops->matmul(b, r->tp, &wo, &r->xb, 1, r->att, n)))
		return e;
	if (w->post_attn_norm && (e = ops->rmsnorm(b, r->xb, r->xb, w->post_attn_norm, n, c->dim, c->rms_eps)))
		return e;
	if ((e = ops->add(b, r->x, r->xb, n * c->dim)))
		return e;

	/* feed-forward block */
	if ((e = ops->rmsnorm(b, r->xb, r->x, w->ffn_norm, n, c->dim, c->rms_eps)))
		return e;
	const MatmulWeight *gate_up[2] = { &w->w_gate, &w->w_up };
	float *gate_up_out[2] = { r->hb, r->hb2 };
	if ((e = ops->matmul(b, r->tp, gate_up, gate_up_out, 2, r->xb, n)))
		return e;
	e = c->ffn_act == FFN_GELU ? ops->geglu(b, r->hb, r->hb2, n * c->ff_dim)
				   : ops->swiglu(b, r->hb, r->hb2, n * c->ff_dim);
	if (e)
		return e;
	const MatmulWeight *down = &w->w_down;
	if ((e = ops->matmul(b, r->tp, &down, &r->xb, 1, r->hb, n)))
		return e;
	if (w->post_ffw_norm && (e = ops->rmsnorm(b, r->xb, r->xb, w->post_ffw_norm, n, c->dim, c->rms_eps)))
		return e;
	if ((e = ops->add(b, r->x, r->xb, n * c->dim)))
		return e;
	return 0;
}

/*
 * Logits of rows first .. first + n - 1 of the batch into the host array
 * out (n, n_vocab): straight into out on a host backend, through the
 * run's buffer and one download otherwise.
 */
static int batch_logits(const Model *m, ModelRun *r, int64_t first, int64_t n, float *out)
{
	const ModelConfig *c = &m->cfg;
	const BackendOps *ops = r->b->ops;
	float *y = r->logits ? r->logits : out;
	const MatmulWeight *w = &m->output;
	int e;
	if ((e = ops->rmsnorm(r->b, r->xb, r->x + first * c->dim, m->output_norm, n, c->dim, c->rms_eps)) ||
	    (e = ops->matmul(r->b, r->tp, &w, &y, 1, r->xb, n)))
		return e;
	if (r->logits)
		return ops->download(r->b, out, r->logits, (size_t)n * c->n_vocab * sizeof(float));
	return 0;
}

/*
 * One batch of n <= max_batch tokens of the sequences s (EvalSeqs), token
 * i at position pos(i). Logits of the last token go to last_logits, of
 * every token to all_logits (n, n_vocab), when non-NULL (host arrays).
 * Returns 0 when the batch ran (s->status then says which sequences
 * went in) or the backend's error, which fails every sequence.
 */
static int eval_batch(const Model *m, ModelRun *r, const EvalSeqs *s, const int32_t *tokens, int64_t n,
		      float *last_logits, float *all_logits)
{
	const ModelConfig *c = &m->cfg;
	const BackendOps *ops = r->b->ops;
	int64_t per = n / s->n_seq;
	int e;

	for (int64_t i = 0; i < n; i++)
		r->tok_pos[i] = s->pos[i / per] + i % per;
	if ((e = ops->embed(r->b, &m->tok_embd, tokens, n, r->x)) ||
	    (e = ops->rope_angles(r->b, &m->rope, r->tok_pos, n, r->cs, r->sn)))
		return e;
	if (r->cs_l && (e = ops->rope_angles(r->b, &m->rope_local, r->tok_pos, n, r->cs_l, r->sn_l)))
		return e;
	if (c->embd_scale != 1.0f && (e = ops->scale(r->b, r->x, c->embd_scale, n * c->dim)))
		return e;
	for (int il = 0; il < c->n_layers; il++) {
		if ((e = layer_forward(m, r, s, il, n)))
			return e;
		atomic_fetch_add_explicit(&r->layers_done, 1, memory_order_relaxed);
	}
	for (int64_t i = 0; i < s->n_seq; i++)
		if (!s->status[i])
			kvcache_set_n_tokens(s->kvs[i], s->pos[i] + per);

	if (all_logits) {
		if ((e = batch_logits(m, r, 0, n, all_logits)))
			return e;
		if (last_logits)
			memcpy(last_logits, all_logits + (n - 1) * c->n_vocab, c->n_vocab * sizeof(float));
	} else if (last_logits) {
		if ((e = batch_logits(m, r, n - 1, 1, last_logits)))
			return e;
	}
	return 0;
}

/* Whether kv lives where the model computes (a host cache on a GPU model would be read as device memory). */
static bool cache_fits(const Model *m, const KvCache *kv)
{
	return strcmp(kvcache_device(kv), backend_name(m->backend)) == 0;
}

int model_eval(const Model *m, ModelRun *r, KvCache *kv, const int32_t *tokens, int64_t n,
	       float *ret_logits, float *all_logits)
{
	const ModelConfig *c = &m->cfg;
	if (n < 1 || !cache_fits(m, kv))
		return -EINVAL;
	if (n > kv->shape.capacity - kvcache_n_tokens(kv))
		return MODEL_E_CONTEXT;
	for (int64_t i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
			return MODEL_E_TOKEN;

	for (int64_t done = 0; done < n;) {
		int64_t b = MIN(n - done, (int64_t)r->max_batch);
		bool last = done + b == n;
		int64_t pos0 = kvcache_n_tokens(kv);
		int status = 0;
		EvalSeqs s = { .kvs = &kv, .pos = &pos0, .n_seq = 1, .status = &status };
		int e = eval_batch(m, r, &s, tokens + done, b, last ? ret_logits : NULL,
				   all_logits ? all_logits + done * c->n_vocab : NULL);
		if (e || (e = status))
			return e;
		done += b;
	}
	return 0;
}

int model_eval_batch(const Model *m, ModelRun *r, KvCache *const *kvs, const int32_t *tokens, int n,
		     float *logits, int *ret_status)
{
	const ModelConfig *c = &m->cfg;
	if (n < 1)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		/* One cache twice would append two tokens at one position. */
		for (int j = 0; j < i; j++)
			if (kvs[j] == kvs[i])
				return -EINVAL;
		if (!cache_fits(m, kvs[i]))
			return -EINVAL;
	}

	for (int done = 0; done < n;) {
		int b = MIN(n - done, r->max_batch);
		int *status = ret_status + done;
		for (int i = 0; i < b; i++) {
			KvCache *kv = kvs[done + i];
			int32_t t = tokens[done + i];
			status[i] = kvcache_n_tokens(kv) >= kv->shape.capacity ? MODEL_E_CONTEXT
				    : t < 0 || t >= c->n_vocab		  ? MODEL_E_TOKEN
									  : 0;
			r->pos[i] = kvcache_n_tokens(kv);
			r->tok[i] = status[i] ? 0 : t; /* a failed row still goes through the weights */
		}
		EvalSeqs s = { .kvs = kvs + done, .pos = r->pos, .n_seq = b, .status = status };
		int e = eval_batch(m, r, &s, r->tok, b, NULL, logits + (size_t)done * c->n_vocab);
		if (e)
			return e;
		done += b;
	}
	return 0;
}
