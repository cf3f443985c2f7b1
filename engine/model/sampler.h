/*
 * sampler.h: choosing the next token from logits.
 *
 * Order of operations (as llama.cpp's default chain): repetition penalty
 * over the last repeat_last_n tokens, top-k, softmax at the temperature,
 * top-p (nucleus), min-p (relative to the most likely token), then a
 * draw from the renormalised distribution with a seeded generator.
 * temperature <= 0 means greedy (argmax, ties to the lowest id). The same
 * seed and the same inputs give the same tokens.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

typedef struct SamplerParams {
	float temperature;    /* <= 0: greedy */
	int top_k;            /* <= 0: off */
	float top_p;          /* >= 1: off */
	float min_p;          /* <= 0: off */
	float repeat_penalty; /* 1: off; >1 penalises recent tokens */
	int repeat_last_n;    /* tokens of history the penalty looks at */
	uint64_t seed;
} SamplerParams;

/* Sensible defaults for chat: temperature 0.7, top-k 40, top-p 0.95, min-p 0.05. */
SamplerParams sampler_params_default(void);

typedef struct Sampler Sampler;

int sampler_new(const SamplerParams *p, int n_vocab, Sampler **ret);
Sampler *sampler_free(Sampler *s);
DEFINE_FREEP(Sampler, sampler_free)

/*
 * Pick a token. logits (n_vocab,) are read, not modified; history holds
 * the tokens so far (prompt and output) for the repetition penalty.
 */
int32_t sampler_sample(Sampler *s, const float *logits, const int32_t *history, size_t n_history);

/* Argmax, ties to the lowest id. */
int32_t sampler_greedy(const float *logits, int n_vocab);
