/*
 * kv_attn_pq.c: the scalar references of the PolarQuant kernels
 * (kv_attn.h, "PolarQuant rows": the definition of the sums) and their
 * run-time choice. The AVX2 twins are kv_attn_pq_avx2.c.
 */
#include <assert.h>
#include <string.h>

#include "base/bitpack.h"
#include "base/half.h"
#include "base/util.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/tq_layout.h"

size_t kv_attn_pq_query_floats(const KvPqRows *keys)
{
	const KvPqShape *s = &keys->shape;
	return (size_t)s->dim + ((size_t)kvpq_level_n(s, 1) << s->bits[0]);
}

/*
 * Codes of level l start at a bit that need not be a multiple of its
 * width: read them by absolute bit position.
 */
static inline int code_at(const uint8_t *codes, size_t bit, int b)
{
	unsigned v = 0;
	for (int k = 0; k < b; k++, bit++)
		v |= (unsigned)((codes[bit >> 3] >> (bit & 7)) & 1u) << k;
	return (int)v;
}

void kv_attn_pq_scores_ref(const KvPqRows *keys, const float *prep, int G, const uint8_t *k, int n,
			   float scale, float *scores, int ld)
{
	const KvPqShape *s = &keys->shape;
	const int d = s->dim, L = s->levels, n1 = kvpq_level_n(s, 1), nL = kvpq_level_n(s, L);
	const size_t qf = kv_attn_pq_query_floats(keys);
	float st[TQ_MAX_DIM / 2];
	for (int t = 0; t < n; t++) {
		const uint8_t *row = k + (size_t)t * keys->row_bytes;
		const uint8_t *codes = row + kvpq_radii_bytes(s);
		for (int g = 0; g < G; g++) {
			const float *t1 = prep + (size_t)g * qf + d;
			size_t bit = 0;
			for (int p = 0; p < n1; p++, bit += s->bits[0])
				st[p] = t1[((size_t)p << s->bits[0]) + (size_t)code_at(codes, bit, s->bits[0])];
			for (int l = 2; l <= L; l++) {
				int nl = kvpq_level_n(s, l), b = s->bits[l - 1];
				const float *cv = keys->cosv[l - 1], *sv = keys->sinv[l - 1];
				for (int p = 0; p < nl; p++, bit += (size_t)b) {
					int c = code_at(codes, bit, b);
					st[p] = cv[c] * st[p] + sv[c] * st[p + nl];
				}
			}
			float sum = 0.0f;
			for (int p = 0; p < nL; p++) {
				sum += half_to_f32((tkv_half)get_le(row + 2 * p, 2)) * st[p];
			}
			scores[(size_t)g * ld + t] = sum * scale;
		}
	}
}

void kv_attn_pq_values_ref(const KvPqRows *vals, const float *p, int ld, int G, const uint8_t *v,
			   int n, float *acc, int acc_ld)
{
	const KvPqShape *s = &vals->shape;
	const int d = s->dim, L = s->levels, nL = kvpq_level_n(s, L);
	float y[TQ_MAX_DIM];
	for (int t = 0; t < n; t++) {
		const uint8_t *row = v + (size_t)t * vals->row_bytes;
		const uint8_t *codes = row + kvpq_radii_bytes(s);
		for (int q = 0; q < nL; q++) {
			y[q] = half_to_f32((tkv_half)get_le(row + 2 * q, 2));
		}
		for (int l = L; l >= 1; l--) {
			int nl = kvpq_level_n(s, l), b = s->bits[l - 1];
			size_t bit = kvpq_level_bit(s, l);
			const float *cv = vals->cosv[l - 1], *sv = vals->sinv[l - 1];
			for (int q = 0; q < nl; q++, bit += (size_t)b) {
				int c = code_at(codes, bit, b);
				float r = y[q];
				y[q] = cv[c] * r;
				y[q + nl] = sv[c] * r;
			}
		}
		for (int g = 0; g < G; g++) {
			float w = p[(size_t)g * ld + t];
			float *a = acc + (size_t)g * acc_ld;
			for (int i = 0; i < d; i++)
				a[i] += w * y[i];
		}
	}
}

/* The AVX2 twins where linked (x86) and allowed; no NEON twins yet. */
KvAttnPqScoresFn kv_attn_pq_scores_get(void)
{
#if defined(CPU_KERNELS_X86)
	if (kv_attn_have_avx2())
		return kv_attn_pq_scores_avx2;
#endif
	return kv_attn_pq_scores_ref;
}

KvAttnPqValuesFn kv_attn_pq_values_get(void)
{
#if defined(CPU_KERNELS_X86)
	if (kv_attn_have_avx2())
		return kv_attn_pq_values_avx2;
#endif
	return kv_attn_pq_values_ref;
}
