/*
 * kv_attn_pq_avx2.c: the AVX2 twins of kv_attn_pq_scores_ref() and
 * kv_attn_pq_values_ref() (kv_attn.h, "PolarQuant rows"). Called only when
 * kv_attn_have_avx2().
 *
 * Each row's angle codes are unpacked 8 at a time (a level whose codes
 * start at a whole byte and come in multiples of 8: one variable shift of
 * a broadcast word) and looked up as cos and sin once (a permute of 8 for
 * <= 3 bits, two and a blend for 4, a gather beyond), then every query
 * head walks the levels with 8-wide products and sums. Level 1 computes
 * cos_1[c] y[p] + sin_1[c] y[p + n_1], the entry of the reference's
 * per-query table, with the same two products and sum; every later step is
 * elementwise and the final sum over the level-L radii is scalar in the
 * reference's order, so the results are the reference's bit for bit (no
 * fused multiply-add anywhere).
 */
#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "base/half.h"
#include "base/util.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/tq_layout.h"

#define PQ2_TARGET __attribute__((target("avx2,fma,f16c")))
#define PQ2_INLINE static inline __attribute__((always_inline)) PQ2_TARGET

/* 8 codes of b bits from b bytes at src (code k at bit k b), one per dword. */
PQ2_INLINE __m256i unpack8(const uint8_t *src, int b)
{
	uint64_t w = 0;
	memcpy(&w, src, (size_t)b);
	int lo = (int)(uint32_t)w, hi = (int)(uint32_t)(w >> (4 * b));
	__m256i v = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
	__m256i sh = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 0, b, 2 * b, 3 * b);
	return _mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi32((1 << b) - 1));
}

/* t[idx] for 8 codes of b bits (t zero-padded to 1 << KVPQ_MAX_BITS floats). */
PQ2_INLINE __m256 lookup8(const float *t, int b, __m256i idx)
{
	if (b <= 3)
		return _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), idx);
	if (b == 4) {
		__m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), idx);
		__m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t + 8), idx);
		return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
	}
	return _mm256_i32gather_ps(t, idx, 4);
}

/* Level l's codes in an odd place: read bit by bit, as the reference. */
static inline int code_at(const uint8_t *codes, size_t bit, int b)
{
	unsigned v = 0;
	for (int k = 0; k < b; k++, bit++)
		v |= (unsigned)((codes[bit >> 3] >> (bit & 7)) & 1u) << k;
	return (int)v;
}

/*
 * cos and sin of every angle of a row into cs[0], cs[1] (level l's from
 * off[l]; off[L + 1] angles in all), and its level-L radii into r.
 */
PQ2_INLINE void decode_angles(const KvPqRows *rows, const uint8_t *row, const int *off, float *cs0,
			      float *cs1, float *r)
{
	const KvPqShape *s = &rows->shape;
	const uint8_t *codes = row + kvpq_radii_bytes(s);
	for (int p = 0; p < kvpq_level_n(s, s->levels); p++)
		r[p] = half_to_f32((tkv_half)get_le(row + 2 * p, 2));
	for (int l = 1; l <= s->levels; l++) {
		int nl = kvpq_level_n(s, l), b = s->bits[l - 1];
		size_t bit = kvpq_level_bit(s, l);
		const float *cv = rows->cosv[l - 1], *sv = rows->sinv[l - 1];
		float *c0 = cs0 + off[l], *c1 = cs1 + off[l];
		if (nl % 8 == 0 && bit % 8 == 0) {
			for (int p = 0; p < nl; p += 8) {
				__m256i idx = unpack8(codes + bit / 8 + (size_t)p * b / 8, b);
				_mm256_storeu_ps(c0 + p, lookup8(cv, b, idx));
				_mm256_storeu_ps(c1 + p, lookup8(sv, b, idx));
			}
		} else {
			for (int p = 0; p < nl; p++, bit += (size_t)b) {
				int c = code_at(codes, bit, b);
				c0[p] = cv[c];
				c1[p] = sv[c];
			}
		}
	}
}

/* out[p] = c0[p] a[p] + c1[p] b[p] for p < n, 8 at a time where possible. */
PQ2_INLINE void rot_step(const float *c0, const float *c1, const float *a, const float *b, float *out, int n)
{
	int p = 0;
	for (; p + 8 <= n; p += 8) {
		__m256 x = _mm256_mul_ps(_mm256_loadu_ps(c0 + p), _mm256_loadu_ps(a + p));
		__m256 y = _mm256_mul_ps(_mm256_loadu_ps(c1 + p), _mm256_loadu_ps(b + p));
		_mm256_storeu_ps(out + p, _mm256_add_ps(x, y));
	}
	for (; p < n; p++)
		out[p] = c0[p] * a[p] + c1[p] * b[p];
}

static void level_offsets(const KvPqShape *s, int *off)
{
	off[1] = 0;
	for (int l = 1; l <= s->levels; l++)
		off[l + 1] = off[l] + kvpq_level_n(s, l);
}

PQ2_TARGET void kv_attn_pq_scores_avx2(const KvPqRows *keys, const float *prep, int G, const uint8_t *k,
				       int n, float scale, float *scores, int ld)
{
	const KvPqShape *s = &keys->shape;
	const int L = s->levels, n1 = kvpq_level_n(s, 1), nL = kvpq_level_n(s, L);
	const size_t qf = kv_attn_pq_query_floats(keys);
	int off[KVPQ_MAX_LEVELS + 2];
	float cs0[TQ_MAX_DIM], cs1[TQ_MAX_DIM], r[TQ_MAX_DIM / 2], st[TQ_MAX_DIM / 2];
	level_offsets(s, off);
	for (int t = 0; t < n; t++) {
		decode_angles(keys, k + (size_t)t * keys->row_bytes, off, cs0, cs1, r);
		for (int g = 0; g < G; g++) {
			const float *y = prep + (size_t)g * qf;
			rot_step(cs0, cs1, y, y + n1, st, n1);
			for (int l = 2; l <= L; l++) {
				int nl = kvpq_level_n(s, l);
				rot_step(cs0 + off[l], cs1 + off[l], st, st + nl, st, nl);
			}
			float sum = 0.0f;
			for (int p = 0; p < nL; p++)
				sum += r[p] * st[p];
			scores[(size_t)g * ld + t] = sum * scale;
		}
	}
}

PQ2_TARGET void kv_attn_pq_values_avx2(const KvPqRows *vals, const float *p, int ld, int G,
				       const uint8_t *v, int n, float *acc, int acc_ld)
{
	const KvPqShape *s = &vals->shape;
	const int d = s->dim, L = s->levels;
	int off[KVPQ_MAX_LEVELS + 2];
	float cs0[TQ_MAX_DIM], cs1[TQ_MAX_DIM], y[TQ_MAX_DIM];
	level_offsets(s, off);
	for (int t = 0; t < n; t++) {
		decode_angles(vals, v + (size_t)t * vals->row_bytes, off, cs0, cs1, y);
		for (int l = L; l >= 1; l--) {
			int nl = kvpq_level_n(s, l), q = 0;
			const float *c0 = cs0 + off[l], *c1 = cs1 + off[l];
			for (; q + 8 <= nl; q += 8) {
				__m256 rr = _mm256_loadu_ps(y + q);
				_mm256_storeu_ps(y + q + nl, _mm256_mul_ps(_mm256_loadu_ps(c1 + q), rr));
				_mm256_storeu_ps(y + q, _mm256_mul_ps(_mm256_loadu_ps(c0 + q), rr));
			}
			for (; q < nl; q++) {
				float rr = y[q];
				y[q] = c0[q] * rr;
				y[q + nl] = c1[q] * rr;
			}
		}
		for (int g = 0; g < G; g++) {
			float w = p[(size_t)g * ld + t];
			float *a = acc + (size_t)g * acc_ld;
			__m256 vw = _mm256_set1_ps(w);
			int i = 0;
			for (; i + 8 <= d; i += 8)
				_mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i),
								      _mm256_mul_ps(vw, _mm256_loadu_ps(y + i))));
			for (; i < d; i++)
				a[i] += w * y[i];
		}
	}
}
