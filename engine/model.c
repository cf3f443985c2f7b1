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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "wtype.h"

/* ---- loading ------------------------------------------------------------ */

typedef struct Loader {
	Model *m;
	const char *arch;
	Error *err;
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
	if (gguf_str_eq(s, "llama")) {
		c->arch = MODEL_ARCH_LLAMA;
		ld->arch = "llama";
		c->rope_style = ROPE_STYLE_NORM;
	} else if (gguf_str_eq(s, "qwen2")) {
		c->arch = MODEL_ARCH_QWEN2;
		ld->arch = "qwen2";
		c->rope_style = ROPE_STYLE_NEOX;
	} else {
		return error_set(ld->err, MODEL_E_UNSUPPORTED,
				 "architecture '%.*s' is not supported (supported: llama, qwen2)",
				 (int)MIN(s.len, 64), s.ptr);
	}

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
	return 0;
}

static const GgufTensor *find_tensor(const Loader *ld, const char *name, bool required)
{
	const GgufTensor *t = gguf_find_tensor(ld->m->gguf, name);
	if (!t && required)
		error_set(ld->err, MODEL_E_INVALID, "tensor '%s' is missing", name);
	return t;
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
	float **owned = realloc(m->owned, (m->n_owned + 1) * sizeof(*owned));
	if (!owned)
		return -ENOMEM;
	m->owned = owned;
	float *v = malloc_array(n, sizeof(float));
	if (!v)
		return -ENOMEM;
	wtype_dequantize_row(t->type, t->data, v, n);
	m->owned[m->n_owned++] = v;
	*ret = v;
	return 0;
}

static int load_layer(const Loader *ld, int il, LayerWeights *w)
{
	const ModelConfig *c = &ld->m->cfg;
	int64_t qdim = (int64_t)c->n_heads * c->head_dim, kvdim = (int64_t)c->n_kv_heads * c->head_dim;
	bool biases = c->arch == MODEL_ARCH_QWEN2;
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

	m->layers = calloc_array(c->n_layers, sizeof(LayerWeights));
	if (!m->layers)
		return -ENOMEM;
	for (int il = 0; il < c->n_layers; il++)
		if ((r = load_layer(ld, il, &m->layers[il])))
			return r;
	return 0;
}

int model_load_gguf(Gguf *g, Model **ret, Error *err)
{
	_cleanup_(model_freep) Model *m = calloc(1, sizeof(*m));
	if (!m) {
		gguf_free(g);
		return -ENOMEM;
	}
	m->gguf = g;
	Loader ld = { .m = m, .err = err };
	int r = load_config(&ld);
	if (r == 0)
		r = load_weights(&ld);
	if (r != 0)
		return r;
	*ret = TAKE_PTR(m);
	return 0;
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

int model_load(const char *path, Model **ret, Error *err)
{
	Gguf *g;
	int r = gguf_open(path, &g, err);
	if (r != 0)
		return r;
	return model_load_gguf(g, ret, err);
}

Model *model_free(Model *m)
{
	if (!m)
		return NULL;
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
	};
}

void model_describe(const Model *m, char *buf, size_t size)
{
	const ModelConfig *c = &m->cfg;
	snprintf(buf, size,
		 "%s: %d layers, dim %d, %d heads (%d kv, head_dim %d), ff %d, vocab %d, ctx %d, weights %s",
		 c->arch == MODEL_ARCH_QWEN2 ? "qwen2" : "llama", c->n_layers, c->dim, c->n_heads,
		 c->n_kv_heads, c->head_dim, c->ff_dim, c->n_vocab, c->n_ctx_train,
		 wtype_name(m->layers[0].wq.type));
}

/* ---- forward pass ------------------------------------------------------- */

struct ModelRun {
	ThreadPool *tp; /* borrowed */
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
	int64_t *pos;   /* (B,) position of each token of a multi-sequence batch */
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
} EvalSeqs;

ModelRun *model_run_free(ModelRun *r)
{
	if (!r)
		return NULL;
	free(r->x);
	free(r->xb);
	free(r->q);
	free(r->k);
	free(r->v);
	free(r->att);
	free(r->hb);
	free(r->hb2);
	free(r->cs);
	free(r->sn);
	free(r->pos);
	free(r);
	return NULL;
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
	r->tp = tp;
	r->max_batch = max_batch;
	r->x = malloc_array(b * c->dim, sizeof(float));
	r->xb = malloc_array(b * c->dim, sizeof(float));
	r->q = malloc_array(b * qdim, sizeof(float));
	r->k = malloc_array(b * kvdim, sizeof(float));
	r->v = malloc_array(b * kvdim, sizeof(float));
	r->att = malloc_array(b * qdim, sizeof(float));
	r->hb = malloc_array(b * c->ff_dim, sizeof(float));
	r->hb2 = malloc_array(b * c->ff_dim, sizeof(float));
	r->cs = malloc_array(b * (c->n_rot / 2), sizeof(float));
	r->sn = malloc_array(b * (c->n_rot / 2), sizeof(float));
	r->pos = malloc_array(b, sizeof(int64_t));
	if (!r->x || !r->xb || !r->q || !r->k || !r->v || !r->att || !r->hb || !r->hb2 || !r->cs ||
	    !r->sn || !r->pos)
		return -ENOMEM;
	*ret = TAKE_PTR(r);
	return 0;
}

/*
 * Products sharing one input (q/k/v, gate/up) in one dispatch; weights
 * whose activation formats differ (mixed-type files such as Q4_K_M) are
 * rejected by matmul_group with -EINVAL and run one by one instead.
 */
static int matmul_shared_input(ThreadPool *tp, const MatmulWeight *const *ws, float *const *ys, int n_w,
			       const float *x, int64_t n)
{
	int e = matmul_group(tp, ws, ys, n_w, x, n);
	if (e != -EINVAL)
		return e;
	for (int i = 0; i < n_w; i++)
		if ((e = matmul(tp, ws[i], x, ys[i], n)))
			return e;
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
		kvcache_attend(j->s->kvs[i], NULL, j->layer, j->s->pos[i], 1, j->q + i * j->qdim,
			       j->att + i * j->qdim);
}

/*
 * Append the batch's K and V (after RoPE) to the caches and attend: each
 * sequence's tokens against its own cache, at its own positions. With at
 * least as many sequences as threads, each thread takes whole sequences
 * (one dispatch per layer instead of one per sequence); otherwise each
 * sequence's attention is split across the threads by the cache.
 */
static int layer_attend(ModelRun *r, const EvalSeqs *s, int il, int64_t n, int64_t qdim, int64_t kvdim)
{
	int64_t per = n / s->n_seq; /* tokens per sequence */
	int nth = r->tp ? threadpool_n_threads(r->tp) : 1;
	for (int64_t i = 0; i < s->n_seq; i++) {
		int64_t t = i * per;
		int e = kvcache_append(s->kvs[i], il, s->pos[i], per, r->k + t * kvdim, r->v + t * kvdim);
		if (e == KVCACHE_E_FULL)
			return MODEL_E_CONTEXT;
		if (e > 0) /* KVCACHE_E_POSITION: the model always appends at the end */
			return -EINVAL;
		if (e < 0)
			return e;
	}
	if (s->n_seq > 1 && s->n_seq >= nth) {
		SeqAttendJob j = { .s = s, .layer = il, .qdim = qdim, .q = r->q, .att = r->att };
		threadpool_run(r->tp, seq_attend_task, &j);
		return 0;
	}
	for (int64_t i = 0; i < s->n_seq; i++)
		kvcache_attend(s->kvs[i], r->tp, il, s->pos[i], per, r->q + i * per * qdim, r->att + i * per * qdim);
	return 0;
}

static int layer_forward(const Model *m, ModelRun *r, const EvalSeqs *s, int il, int64_t n)
{
	const ModelConfig *c = &m->cfg;
	const LayerWeights *w = &m->layers[il];
	int64_t qdim = (int64_t)c->n_heads * c->head_dim, kvdim = (int64_t)c->n_kv_heads * c->head_dim;
	int half = c->n_rot / 2;
	int e;

	/* attention block */
	for (int64_t i = 0; i < n; i++)
		op_rmsnorm(r->xb + i * c->dim, r->x + i * c->dim, w->attn_norm, c->dim, c->rms_eps);
	const MatmulWeight *qkv[3] = { &w->wq, &w->wk, &w->wv };
	float *qkv_out[3] = { r->q, r->k, r->v };
	if ((e = matmul_shared_input(r->tp, qkv, qkv_out, 3, r->xb, n)))
		return e;
	if (w->bq) {
		op_add_bias(r->q, w->bq, n, qdim);
		op_add_bias(r->k, w->bk, n, kvdim);
		op_add_bias(r->v, w->bv, n, kvdim);
	}
	for (int64_t i = 0; i < n; i++) {
		rope_rotate(&m->rope, r->q + i * qdim, c->n_heads, c->head_dim, r->cs + i * half,
			    r->sn + i * half);
		rope_rotate(&m->rope, r->k + i * kvdim, c->n_kv_heads, c->head_dim, r->cs + i * half,
			    r->sn + i * half);
	}
	if ((e = layer_attend(r, s, il, n, qdim, kvdim)))
		return e;
	if ((e = matmul(r->tp, &w->wo, r->att, r->xb, n)))
		return e;
	op_add(r->x, r->xb, n * c->dim);

	/* feed-forward block */
	for (int64_t i = 0; i < n; i++)
		op_rmsnorm(r->xb + i * c->dim, r->x + i * c->dim, w->ffn_norm, c->dim, c->rms_eps);
	const MatmulWeight *gate_up[2] = { &w->w_gate, &w->w_up };
	float *gate_up_out[2] = { r->hb, r->hb2 };
	if ((e = matmul_shared_input(r->tp, gate_up, gate_up_out, 2, r->xb, n)))
		return e;
	op_swiglu(r->hb, r->hb2, n * c->ff_dim);
	if ((e = matmul(r->tp, &w->w_down, r->hb, r->xb, n)))
		return e;
	op_add(r->x, r->xb, n * c->dim);
	return 0;
}

/*
 * One batch of n <= max_batch tokens of the sequences s (EvalSeqs), token
 * i at position pos(i). Logits of the last token go to last_logits, of
 * every token to all_logits (n, n_vocab), when non-NULL.
 */
static int eval_batch(const Model *m, ModelRun *r, const EvalSeqs *s, const int32_t *tokens, int64_t n,
		      float *last_logits, float *all_logits)
{
	const ModelConfig *c = &m->cfg;
	int64_t per = n / s->n_seq;
	int half = c->n_rot / 2;
	int e;

	for (int64_t i = 0; i < n; i++) {
		wtype_dequantize_row(m->tok_embd.type,
				     (const uint8_t *)m->tok_embd.data + (size_t)tokens[i] * m->tok_embd.row_stride,
				     r->x + i * c->dim, c->dim);
		rope_angles(&m->rope, s->pos[i / per] + i % per, r->cs + i * half, r->sn + i * half);
	}
	for (int il = 0; il < c->n_layers; il++)
		if ((e = layer_forward(m, r, s, il, n)))
			return e;
	for (int64_t i = 0; i < s->n_seq; i++)
		kvcache_set_n_tokens(s->kvs[i], s->pos[i] + per);

	if (all_logits) {
		for (int64_t i = 0; i < n; i++)
			op_rmsnorm(r->xb + i * c->dim, r->x + i * c->dim, m->output_norm, c->dim, c->rms_eps);
		if ((e = matmul(r->tp, &m->output, r->xb, all_logits, n)))
			return e;
		if (last_logits)
			memcpy(last_logits, all_logits + (n - 1) * c->n_vocab, c->n_vocab * sizeof(float));
	} else if (last_logits) {
		op_rmsnorm(r->xb, r->x + (n - 1) * c->dim, m->output_norm, c->dim, c->rms_eps);
		if ((e = matmul(r->tp, &m->output, r->xb, last_logits, 1)))
			return e;
	}
	return 0;
}

int model_eval(const Model *m, ModelRun *r, KvCache *kv, const int32_t *tokens, int64_t n,
	       float *ret_logits, float *all_logits)
{
	const ModelConfig *c = &m->cfg;
	if (n < 1)
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
		EvalSeqs s = { .kvs = &kv, .pos = &pos0, .n_seq = 1 };
		int e = eval_batch(m, r, &s, tokens + done, b, last ? ret_logits : NULL,
				   all_logits ? all_logits + done * c->n_vocab : NULL);
		if (e)
			return e;
		done += b;
	}
	return 0;
}

int model_eval_batch(const Model *m, ModelRun *r, KvCache *const *kvs, const int32_t *tokens, int n,
		     float *logits)
{
	const ModelConfig *c = &m->cfg;
	if (n < 1)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		/* One cache twice would append two tokens at one position. */
		for (int j = 0; j < i; j++)
			if (kvs[j] == kvs[i])
				return -EINVAL;
		if (kvcache_n_tokens(kvs[i]) >= kvs[i]->shape.capacity)
			return MODEL_E_CONTEXT;
		if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
			return MODEL_E_TOKEN;
	}

	for (int done = 0; done < n;) {
		int b = MIN(n - done, r->max_batch);
		for (int i = 0; i < b; i++)
			r->pos[i] = kvcache_n_tokens(kvs[done + i]);
		EvalSeqs s = { .kvs = kvs + done, .pos = r->pos, .n_seq = b };
		int e = eval_batch(m, r, &s, tokens + done, b, NULL, logits + (size_t)done * c->n_vocab);
		if (e)
			return e;
		done += b;
	}
	return 0;
}
