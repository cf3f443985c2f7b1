/*
 * ops.h: the element-wise and row-wise operators of a transformer layer.
 *
 * Plain C written so the compiler vectorizes it; none of these is on the
 * bandwidth-critical path (matmul.h and attention are). Shapes in the
 * comments: n is a row length, rows are contiguous.
 */
#pragma once

#include <stdint.h>

/* out (n,) = x (n,) / rms(x) * w (n,);  rms = sqrt(mean(x^2) + eps). out may alias x. */
void op_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);

/* x (n,) += y (n,) */
void op_add(float *x, const float *y, int64_t n);

/* x (n,) += b (n,) for each of rows rows of x (bias broadcast). */
void op_add_bias(float *x, const float *b, int64_t rows, int64_t n);

/* gate (n,) = silu(gate) * up  (SwiGLU) */
void op_swiglu(float *gate, const float *up, int64_t n);

/* gate (n,) = gelu(gate) * up, GELU in its tanh form (ggml's ggml_gelu, Gemma's FFN) */
void op_geglu(float *gate, const float *up, int64_t n);

/* x (n,) *= s */
void op_scale(float *x, float s, int64_t n);

/* In place softmax of x (n,); returns nothing, x sums to 1. */
void op_softmax(float *x, int64_t n);

typedef enum RopeStyle {
	ROPE_STYLE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama in GGUF */
	ROPE_STYLE_NEOX = 2, /* rotate halves (x[i], x[i + n_rot/2]): qwen2, gpt-neox */
} RopeStyle;

/*
 * Rotary embedding tables: for rotation index i < n_rot/2,
 * inv_freq[i] = base^(-2i/n_rot) * freq_scale / factor[i] (factor: the
 * optional rope_freqs tensor of Llama 3.1-style scaling, else 1).
 */
typedef struct Rope {
	RopeStyle style;
	int n_rot;           /* rotated dims per head (<= head_dim, even) */
	float inv_freq[256]; /* n_rot / 2 entries */
} Rope;

/* Fill rope->inv_freq. factors may be NULL. n_rot must be even and <= 512. */
void rope_init(Rope *rope, RopeStyle style, int n_rot, float base, float freq_scale,
	       const float *factors);

/* cos and sin of every rotation angle at position pos: cs, sn (n_rot / 2,). */
void rope_angles(const Rope *rope, int64_t pos, float *cs, float *sn);

/* Rotate n_heads heads at x (n_heads, head_dim) by the angles of rope_angles(). */
void rope_rotate(const Rope *rope, float *x, int n_heads, int head_dim, const float *cs,
		 const float *sn);

/* rope_angles() then rope_rotate(): rotate x for position pos. */
void rope_apply(const Rope *rope, float *x, int n_heads, int head_dim, int64_t pos);
