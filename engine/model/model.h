/*
 * model.h: a llama-family transformer loaded from GGUF, and its forward pass.
 *
 * Architectures: `llama` (Llama 2/3.x, SmolLM2, Mistral), `qwen2`, `qwen3`
 * and `gemma3`.
 * Weights stay in the memory-mapped file in their GGUF types; the
 * matmul kernels read them in place. One layer:
 *
 *   h   = x + Wo · attn(rope(Wq·n1 + bq), rope(Wk·n1 + bk), Wv·n1 + bv)
 *   out = h + Wdown · (silu(Wgate·n2) * (Wup·n2))
 *   with n1 = rmsnorm(x) * attn_norm, n2 = rmsnorm(h) * ffn_norm
 *
 * then logits = Wout · (rmsnorm(x) * output_norm), Wout = token_embd when
 * the file has no separate output tensor (tied embeddings).
 *
 * qwen3 adds a per-head RMSNorm of Q and K (attn_q_norm, attn_k_norm,
 * (head_dim,) each) after the projections and before RoPE, and has no
 * biases. gemma3, as llama.cpp runs it from GGUF: x0 = embedding *
 * sqrt(dim); the same Q/K head norms; the attention and feed-forward
 * outputs are RMS-normed (post_attention_norm, post_ffw_norm) before
 * they join the residual; the FFN is gelu_tanh(Wgate·n2) * (Wup·n2); the
 * GGUF norm weights already hold Gemma's (1 + w). Layers il with il % 6
 * != 5 are local (sliding-window, RoPE base 10000), the others global
 * (rope.freq_base). Queries are scaled by 1/sqrt(key_length)
 * (1/sqrt(dim / n_heads) for the 62-layer 27B), as llama.cpp does.
 *
 * Sliding window: a local layer's query at p sees positions p - W + 1 .. p
 * (W = attention.sliding_window, llama.cpp's convention). model_kv_shape()
 * hands W and the layer pattern to the KV cache (KvCacheShape.window),
 * which masks it and, in the compressed store, keeps only the blocks
 * the window still sees (kvstore.h): the context is not capped.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kvcache.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

enum {
	MODEL_E_UNSUPPORTED = 1, /* architecture, weight type or feature we do not run */
	MODEL_E_INVALID,         /* missing or inconsistent tensors or metadata */
	MODEL_E_CONTEXT,         /* positions beyond the context size */
	MODEL_E_TOKEN,           /* a token id outside the vocabulary */
};

typedef enum ModelArch {
	MODEL_ARCH_LLAMA,
	MODEL_ARCH_QWEN2,
	MODEL_ARCH_QWEN3,
	MODEL_ARCH_GEMMA3,
} ModelArch;

typedef enum FfnAct {
	FFN_SILU, /* silu(gate) * up */
	FFN_GELU, /* gelu_tanh(gate) * up */
} FfnAct;

typedef struct ModelConfig {
	ModelArch arch;
	int n_layers;
	int dim;          /* embedding width */
	int n_heads;
	int n_kv_heads;
	int head_dim;
	int ff_dim;       /* feed-forward hidden width */
	int n_vocab;
	int n_ctx_train;  /* context length the model was trained for */
	float rms_eps;
	float rope_base;
	float rope_freq_scale;
	int n_rot;
	RopeStyle rope_style;
	bool qk_norm;        /* per-head RMSNorm of Q and K before RoPE (qwen3, gemma3) */
	bool post_norms;     /* post_attention_norm and post_ffw_norm (gemma3) */
	FfnAct ffn_act;
	float embd_scale;    /* embeddings times this (gemma3: sqrt(dim)), 1 otherwise */
	float q_scale;       /* queries times this before attention (which scales by 1/sqrt(head_dim)) */
	int sliding_window;  /* W of the local layers, 0: none */
	int swa_period;      /* layer il is local when il % swa_period != swa_period - 1 */
	float rope_base_local; /* RoPE base of the local layers */
} ModelConfig;

typedef struct LayerWeights {
	const float *attn_norm; /* (dim,) */
	MatmulWeight wq;        /* (n_heads * head_dim, dim) */
	MatmulWeight wk;        /* (n_kv_heads * head_dim, dim) */
	MatmulWeight wv;        /* (n_kv_heads * head_dim, dim) */
	MatmulWeight wo;        /* (dim, n_heads * head_dim) */
	const float *bq, *bk, *bv; /* qwen2 biases, NULL for llama */
	const float *ffn_norm;  /* (dim,) */
	MatmulWeight w_gate;    /* (ff_dim, dim) */
	MatmulWeight w_up;      /* (ff_dim, dim) */
	MatmulWeight w_down;    /* (dim, ff_dim) */
	const float *q_norm, *k_norm;     /* (head_dim,) qwen3 and gemma3, else NULL */
	const float *post_attn_norm;      /* (dim,) gemma3, else NULL */
	const float *post_ffw_norm;       /* (dim,) gemma3, else NULL */
	bool local;                       /* a sliding-window layer */
} LayerWeights;

typedef struct Model {
	Backend *backend;       /* borrowed: where weights live and the forward pass runs */
	Gguf *gguf;             /* owns the mapping the weights are read from */
	ModelConfig cfg;
	Rope rope;
	Rope rope_local;        /* the local layers' (gemma3), else equal to rope */
	MatmulWeight tok_embd;  /* (n_vocab, dim) */
	MatmulWeight output;    /* (n_vocab, dim), tok_embd when tied */
	const float *output_norm; /* (dim,) */
	LayerWeights *layers;   /* (n_layers,) */
	float **owned;          /* tensors converted to f32 at load (vectors; every matrix under model_load_f32) */
	size_t n_owned;
	size_t n_uploaded;      /* weights handed to backend->upload_weight, for release */
} Model;

/*
 * Where scripts/fetch-model.sh puts the default model (SmolLM2-135M-Instruct
 * Q4_1): ${XDG_CACHE_HOME:-$HOME/.cache}/turbokv/models/<file>. Writes the
 * path into buf (truncated to size) and returns buf.
 */
#define MODEL_DEFAULT_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"
char *model_default_path(char *buf, size_t size);

/* Load onto the CPU backend. */
int model_load(const char *path, Model **ret, Error *err);
/*
 * Load onto backend b (borrowed: it must outlive the model): every weight
 * is uploaded once, here. Returns 0, the codes above, -ENOMEM (host or
 * device memory: err says which tensor did not fit) or the backend's error.
 */
int model_load_on(const char *path, Backend *b, Model **ret, Error *err);
/*
 * Load onto the CPU backend with every weight matrix dequantized to f32
 * at load, into memory the model owns (4 bytes per weight: 0.5 GiB for the
 * default model, 1.1 GiB for Gemma 3 270M). f32 weights take f32
 * activations, so nothing rounds activations to int8 blocks before a
 * product: the forward pass is then exact up to float32 rounding, which
 * is what test-model compares with the float64 reference, and what tells a
 * wrong kernel or op (a difference that stays) from activation rounding
 * (one that goes). For checks, not for serving.
 */
int model_load_f32(const char *path, Model **ret, Error *err);
/* Build from an opened GGUF (consumed: freed with the model, or on error). */
int model_load_gguf(Gguf *g, Backend *b, Model **ret, Error *err);
Model *model_free(Model *m);
DEFINE_FREEP(Model, model_free)

/* Shape of a KV cache for this model with capacity n_ctx tokens (and its local layers' window). */
KvCacheShape model_kv_shape(const Model *m, int64_t n_ctx);

/*
 * A KV cache of n_ctx tokens in the model's backend memory: the exact f32
 * cache when plan is NULL or all f32, else plan's types with codec seeds
 * from seed (kvstore.h). The model only evaluates into caches of its own
 * backend.
 */
int model_kvcache_new(const Model *m, const KvPlan *plan, uint64_t seed, int64_t n_ctx, KvCache **ret,
		      Error *err);

/*
 * A cache of the model's backend holding what the host cache host holds
 * (a restored session). host is consumed on success (*ret may be host
 * itself, on the CPU) and left to the caller on error.
 */
int model_kvcache_adopt(const Model *m, KvCache *host, KvCache **ret, Error *err);

/*
 * Activation buffers for batches of up to max_batch tokens, and the
 * threads the kernels use. One per concurrently evaluated sequence.
 */
typedef struct ModelRun ModelRun;

int model_run_new(const Model *m, int max_batch, ThreadPool *tp, ModelRun **ret);
ModelRun *model_run_free(ModelRun *r);
DEFINE_FREEP(ModelRun, model_run_free)

/*
 * How many layers r has evaluated since it was created: grows while an
 * evaluation runs (once per layer of each internal batch). Safe to call
 * from another thread than the one evaluating (a watchdog asks whether
 * the model is making progress).
 */
uint64_t model_run_progress(const ModelRun *r);

/*
 * Evaluate n tokens at positions kv->n_tokens .. +n-1, appending their K
 * and V to kv (any length: split into batches internally). Writes logits
 * (n_vocab,) of the last token to ret_logits if non-NULL, and of every
 * token to all_logits (n, n_vocab) if non-NULL (host arrays, whatever
 * the backend). kv must be a cache of the model's backend
 * (model_kvcache_new), else -EINVAL. Returns 0, -ENOMEM,
 * MODEL_E_CONTEXT if the cache would overflow or MODEL_E_TOKEN for an id
 * outside the vocabulary (KV cache codes are translated, never passed up).
 */
int model_eval(const Model *m, ModelRun *r, KvCache *kv, const int32_t *tokens, int64_t n,
	       float *ret_logits, float *all_logits);

/*
 * One new token for each of n independent sequences: tokens[i] at
 * position kvs[i]->n_tokens, appended to kvs[i] (n distinct caches, of any
 * KvCacheOps). The weight matrices run once over the n tokens together
 * (batches of up to the run's max_batch); RoPE and attention are per
 * sequence. Each sequence succeeds or fails on its own: ret_status (n,)
 * gets 0 where tokens[i] went in and row i of logits (n, n_vocab) equals
 * what model_eval() of tokens[i] alone on kvs[i] gives, up to float
 * rounding; else MODEL_E_CONTEXT (kvs[i] is full), MODEL_E_TOKEN (an id
 * outside the vocabulary) or its cache's -errno (-ENOMEM), with kvs[i]
 * holding what it held before and row i unspecified. Returns 0 when the
 * batch ran (read ret_status), -EINVAL (n < 1, a cache given twice, a
 * cache of another backend: nothing touched) or the backend's error,
 * which fails them all.
 */
int model_eval_batch(const Model *m, ModelRun *r, KvCache *const *kvs, const int32_t *tokens, int n,
		     float *logits, int *ret_status);

/*
 * How far logits got are from ref (n each), measured against the spread
 * of ref: the backends agree only to within activation rounding (the CPU
 * quantizes activations to 8 bits for quantized weights, CUDA does not),
 * so closeness is relative to max - min of ref, and the top-1 tokens must
 * agree only where ref's top-1/top-2 gap is clear of that noise.
 */
typedef struct LogitsDiff {
	double max_rel;  /* max |got - ref| / (max - min of ref); INFINITY if got has a NaN or inf */
	double mean_rel; /* mean |got - ref| / (max - min of ref) */
	double margin;   /* (top-1 - top-2 of ref) / (max - min of ref) */
	int top_got, top_ref;
} LogitsDiff;

LogitsDiff model_logits_diff(const float *got, const float *ref, int n);

/* Limits the GPU check and the daemon's start-up check hold a backend to against the CPU. */
#define MODEL_LOGITS_MAX_REL 0.05
#define MODEL_LOGITS_MEAN_REL 0.01
#define MODEL_LOGITS_CLEAR_MARGIN 0.05

/* Whether d is within those limits (top-1 compared only when ref's margin is clear). */
bool model_logits_agree(const LogitsDiff *d);

/* The architecture's GGUF name ("llama", "qwen2", "qwen3", "gemma3"). */
const char *model_arch_name(ModelArch a);

/* Human description ("llama 30 layers, dim 576, ...") into buf. */
void model_describe(const Model *m, char *buf, size_t size);
