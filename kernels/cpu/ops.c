/*
 * ops.c: element-wise and row-wise transformer operators (see ops.h).
 *
 * Accumulations that decide numerics (the RMS, the softmax sum) are done
 * in double: they are cheap next to the matmuls and make results
 * independent of how the compiler vectorizes.
 */
#include <assert.h>
#include <math.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_f32.h"

void op_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
	double ss = 0.0;
	for (int64_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
	for (int64_t i = 0; i < n; i++)
		out[i] = x[i] * scale * w[i];
}

void op_add(float *x, const float *y, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] += y[i];
}

void op_add_bias(float *x, const float *b, int64_t rows, int64_t n)
{
	for (int64_t r = 0; r < rows; r++)
		op_add(x + r * n, b, n);
}

/*
 * Scalar on purpose: it is 3% of the default model's prefill, and an AVX2
 * version (exp_avx2.h's polynomial, 1e-7 from expf) tips SmolLM2's greedy
 * continuations wherever two tokens nearly tie (test-kvstore's tq4-vs-f32
 * run agreed for 3 tokens instead of 14), which would leave every
 * recorded SmolLM2 figure unreproducible for that 3%.
 */
void op_swiglu(float *gate, const float *up, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		float g = gate[i];
		gate[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

void op_geglu(float *gate, const float *up, int64_t n)
{
	vec_f32_geglu(n, gate, up);
}

void op_scale(float *x, float s, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] *= s;
}

void op_softmax(float *x, int64_t n)
{
	float max = -INFINITY;
	for (int64_t i = 0; i < n; i++)
		max = x[i] > max ? x[i] : max;
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - max);
		sum += x[i];
	}
	float inv = (float)(1.0 / sum);
	for (int64_t i = 0; i < n; i++)
		x[i] *= inv;
}

void rope_init(Rope *rope, RopeStyle style, int n_rot, float base, float freq_scale,
	       const float *factors)
{
	assert(n_rot > 0 && n_rot % 2 == 0 && n_rot / 2 <= (int)(sizeof(rope->inv_freq) / sizeof(float)));
	rope->style = style;
	rope->n_rot = n_rot;
	for (int i = 0; i < n_rot / 2; i++) {
		double f = pow((double)base, -2.0 * i / n_rot) * freq_scale;
		if (factors)
			f /= factors[i];
		rope->inv_freq[i] = (float)f;
	}
}

void rope_angles(const Rope *rope, int64_t pos, float *cs, float *sn)
{
	for (int i = 0; i < rope->n_rot / 2; i++) {
		/* theta in double: positions reach 10^5 and float loses the phase */
		double theta = (double)pos * rope->inv_freq[i];
		cs[i] = (float)cos(theta);
		sn[i] = (float)sin(theta);
	}
}

void rope_rotate(const Rope *rope, float *x, int n_heads, int head_dim, const float *cs,
		 const float *sn)
{
	int half = rope->n_rot / 2;
	/* NORM pairs (2i, 2i+1); NEOX pairs (i, i + half) */
	int stride = rope->style == ROPE_STYLE_NEOX ? 1 : 2;
	int partner = rope->style == ROPE_STYLE_NEOX ? half : 1;
	for (int h = 0; h < n_heads; h++) {
		float *v = x + (int64_t)h * head_dim;
		for (int i = 0; i < half; i++) {
			float *a = v + i * stride, *b = a + partner;
			float x0 = *a, x1 = *b;
			*a = x0 * cs[i] - x1 * sn[i];
			*b = x0 * sn[i] + x1 * cs[i];
		}
	}
}

void rope_apply(const Rope *rope, float *x, int n_heads, int head_dim, int64_t pos)
{
	float cs[256], sn[256];
	rope_angles(rope, pos, cs, sn);
	rope_rotate(rope, x, n_heads, head_dim, cs, sn);
}
