/*
 * sampler.c: repetition penalty, top-k, temperature, top-p, min-p, draw.
 *
 * Candidates are (id, logit) pairs. top-k uses a partial selection, so a
 * 49152-token vocabulary costs one pass plus a sort of k items, not a
 * full sort, whenever top-k is on.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/model/sampler.h"

typedef struct Candidate {
	int32_t id;
	float logit;
	float p;
} Candidate;

struct Sampler {
	SamplerParams p;
	int n_vocab;
	uint64_t rng[2]; /* xoroshiro128+ */
	Candidate *cand; /* (n_vocab,) */
};

SamplerParams sampler_params_default(void)
{
	return (SamplerParams){
		.temperature = 0.7f,
		.top_k = 40,
		.top_p = 0.95f,
		.min_p = 0.05f,
		.repeat_penalty = 1.0f,
		.repeat_last_n = 64,
		.seed = 0,
	};
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* Uniform double in [0, 1). */
static double rng_uniform(Sampler *s)
{
	uint64_t s0 = s->rng[0], s1 = s->rng[1];
	uint64_t r = s0 + s1;
	s1 ^= s0;
	s->rng[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
	s->rng[1] = rotl(s1, 37);
	return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

int sampler_new(const SamplerParams *p, int n_vocab, Sampler **ret)
{
	if (n_vocab < 1)
		return -EINVAL;
	_cleanup_(sampler_freep) Sampler *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->p = *p;
	s->n_vocab = n_vocab;
	s->cand = malloc_array(n_vocab, sizeof(Candidate));
	if (!s->cand)
		return -ENOMEM;
	uint64_t seed = p->seed;
	s->rng[0] = splitmix64(&seed);
	s->rng[1] = splitmix64(&seed);
	*ret = TAKE_PTR(s);
	return 0;
}

Sampler *sampler_free(Sampler *s)
{
	if (s) {
		free(s->cand);
		free(s);
	}
	return NULL;
}

int32_t sampler_greedy(const float *logits, int n_vocab)
{
	int32_t best = 0;
	for (int i = 1; i < n_vocab; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

static int cand_cmp_desc(const void *a, const void *b)
{
	const Candidate *x = a, *y = b;
	if (x->logit != y->logit)
		return x->logit < y->logit ? 1 : -1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Sift down in a heap whose root is the worst candidate (last in cand_cmp_desc order). */
static void heap_sift_down(Candidate *h, size_t k, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, worst = i;
		if (l < k && cand_cmp_desc(&h[l], &h[worst]) > 0)
			worst = l;
		if (r < k && cand_cmp_desc(&h[r], &h[worst]) > 0)
			worst = r;
		if (worst == i)
			return;
		Candidate t = h[i];
		h[i] = h[worst];
		h[worst] = t;
		i = worst;
	}
}

/* Move the k best candidates of c[0..n) into c[0..k), in no particular order. O(n log k). */
static void select_top_k(Candidate *c, size_t n, size_t k)
{
	for (size_t i = k / 2; i-- > 0;)
		heap_sift_down(c, k, i);
	for (size_t i = k; i < n; i++) {
		if (cand_cmp_desc(&c[i], &c[0]) < 0) {
			c[0] = c[i];
			heap_sift_down(c, k, 0);
		}
	}
}

int32_t sampler_sample(Sampler *s, const float *logits, const int32_t *history, size_t n_history)
{
	const SamplerParams *p = &s->p;
	size_t n = (size_t)s->n_vocab;
	Candidate *c = s->cand;

	for (size_t i = 0; i < n; i++)
		c[i] = (Candidate){ .id = (int32_t)i, .logit = logits[i] };

	/* repetition penalty: divide positive logits, multiply negative ones */
	if (p->repeat_penalty != 1.0f && p->repeat_last_n > 0 && history) {
		size_t from = n_history > (size_t)p->repeat_last_n ? n_history - p->repeat_last_n : 0;
		for (size_t i = from; i < n_history; i++) {
			int32_t id = history[i];
			if (id < 0 || (size_t)id >= n)
				continue;
			/* each id penalised once even if repeated: mark by id in the candidate */
			if (c[id].p != 0.0f)
				continue;
			c[id].p = 1.0f;
			float l = logits[id];
			c[id].logit = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
		}
		for (size_t i = 0; i < n; i++)
			c[i].p = 0.0f;
	}

	if (p->temperature <= 0.0f) {
		int32_t best = 0;
		for (size_t i = 1; i < n; i++)
			if (c[i].logit > c[best].logit)
				best = (int32_t)i;
		return best;
	}

	if (p->top_k > 0 && (size_t)p->top_k < n) {
		select_top_k(c, n, (size_t)p->top_k);
		n = (size_t)p->top_k;
	}
	qsort(c, n, sizeof(*c), cand_cmp_desc);

	/* softmax at temperature; c[0] is the maximum */
	double sum = 0.0;
	for (size_t i = 0; i < n; i++) {
		c[i].p = expf((c[i].logit - c[0].logit) / p->temperature);
		sum += c[i].p;
	}
	for (size_t i = 0; i < n; i++)
		c[i].p = (float)(c[i].p / sum);

	/* top-p: the smallest prefix whose mass reaches top_p */
	if (p->top_p < 1.0f) {
		double cum = 0.0;
		for (size_t i = 0; i < n; i++) {
			cum += c[i].p;
			if (cum >= p->top_p) {
				n = i + 1;
				break;
			}
		}
	}
	/* min-p: drop tokens less likely than min_p times the best one */
	if (p->min_p > 0.0f) {
		float floor_p = p->min_p * c[0].p;
		size_t keep = 1;
		while (keep < n && c[keep].p >= floor_p)
			keep++;
		n = keep;
	}

	double total = 0.0;
	for (size_t i = 0; i < n; i++)
		total += c[i].p;
	double r = rng_uniform(s) * total;
	for (size_t i = 0; i < n; i++) {
		r -= c[i].p;
		if (r < 0.0)
			return c[i].id;
	}
	return c[n - 1].id;
}
