/*
 * kv_attn.c: scalar references of the KV attention kernels (kv_attn.h),
 * the int8 query and codebook forms, and the run-time choice between the
 * references and the AVX2 kernels.
 *
 * The per-row sums are those of engine/kv/kvquant.c (kvquant_score_*,
 * kvquant_axpy_*) and engine/codec/tq.c (tq_inner_product, the value sums of
 * the store), written again here so the kernel library does not call up
 * into the engine; test-kvstore checks them against dequantize-then-exact
 * attention, test-kvattn checks the AVX2 and AVX-512 kernels against them.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/wtype.h"

int kv_attn_rows_init(KvAttnRows *rows, KvFormat format, int dim)
{
	memset(rows, 0, sizeof(*rows));
	if (dim <= 0 || dim > TQ_MAX_DIM)
		return -EINVAL;
	rows->format = format;
	rows->dim = dim;
	switch (format) {
	case KV_FORMAT_F32:
		rows->row_bytes = (size_t)dim * sizeof(float);
		return 0;
	case KV_FORMAT_F16:
		rows->row_bytes = (size_t)dim * sizeof(tkv_half);
		return 0;
	case KV_FORMAT_Q8_0:
		rows->row_bytes = (size_t)(dim / QK8_0) * sizeof(BlockQ8_0);
		return dim % QK8_0 ? -EINVAL : 0;
	case KV_FORMAT_Q4_0:
		rows->row_bytes = (size_t)(dim / QK4_0) * sizeof(BlockQ4_0);
		return dim % QK4_0 ? -EINVAL : 0;
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK: /* read by kv_attn_pk_scores_*() only */
	case KV_FORMAT_PQ: /* read by kv_attn_pq_*() only */
		break;
	}
	return -EINVAL;
}

/* The int8 codebook of n centroids (n <= 16): cs = max |c| / 127, q = round(c / cs). */
static void codebook_int8(const float *c, int n, int8_t ret[16], float *ret_scale)
{
	float m = 0.0f;
	for (int k = 0; k < n; k++)
		m = fmaxf(m, fabsf(c[k]));
	float s = m > 0.0f ? m / 127.0f : 1.0f;
	memset(ret, 0, 16);
	for (int k = 0; k < n; k++)
		ret[k] = (int8_t)lrintf(fminf(127.0f, fmaxf(-127.0f, c[k] / s)));
	*ret_scale = s;
}

/*
 * The int16 value kernel's tables (kv_attn.h), where the layout allows it:
 * rows->q16v says whether it does.
 */
static void values_q16_init(KvAttnRows *rows)
{
	const TqLayout *L = &rows->tq;
	int n_lo = L->dim - L->n_hi;
	int hi_levels = L->n_hi ? 1 << L->bits_hi : 0, lo_levels = n_lo ? 1 << L->bits_lo : 0;
	if (L->qjl_m > 0 || L->n_scales != 1 || L->dim > 64 || L->dim % 8 || L->n_hi % 8 ||
	    (L->n_hi && L->bits_hi > 5) || (n_lo && L->bits_lo > 5) || hi_levels + lo_levels > 64)
		return;
	/* 4-bit streams only (tq4): the float kernel's nibble lookups measured faster (benchmarks.md) */
	if ((!L->n_hi || L->bits_hi == 4) && (!n_lo || L->bits_lo == 4))
		return;
	uint32_t base = L->n_hi ? L->off_hi : L->off_lo, end = 0;
	if (L->n_hi && L->off_lo < base && n_lo)
		base = L->off_lo;
	if (L->n_hi)
		end = MAX(end, L->off_hi + (uint32_t)(L->n_hi * L->bits_hi / 8));
	if (n_lo)
		end = MAX(end, L->off_lo + (uint32_t)(n_lo * L->bits_lo / 8));
	if (end - base > 64)
		return;
	float cmax = 0.0f;
	for (int s = 0; s < 2; s++)
		for (int k = 0; rows->cb[s] && k < (s ? lo_levels : hi_levels); k++)
			cmax = fmaxf(cmax, fabsf(rows->cb[s][k]));
	if (!(cmax > 0.0f))
		return;
	float cv = cmax / (float)KVATTN_Q16V_CMAX;
	memset(rows->q16v_perm, 0, 64);
	memset(rows->q16v_shift, 0, 64);
	memset(rows->q16v_mask, 0, 64);
	memset(rows->q16v_add, 0, 64);
	memset(rows->q16v_planes, 0, sizeof(rows->q16v_planes));
	for (int i = 0; i < L->dim; i += 8) { /* 8 coordinates, one qword, of one stream */
		bool hi = i < L->n_hi;
		int b = hi ? L->bits_hi : L->bits_lo, k = hi ? i : i - L->n_hi;
		uint32_t src = (hi ? L->off_hi : L->off_lo) - base + (uint32_t)(k / 8 * b);
		for (int m = 0; m < 8; m++) {
			rows->q16v_perm[i + m] = (uint8_t)MIN(63u, src + (uint32_t)m);
			rows->q16v_shift[i + m] = (uint8_t)(m * b);
			rows->q16v_mask[i + m] = (uint8_t)((1u << b) - 1);
			rows->q16v_add[i + m] = (uint8_t)(hi ? 0 : hi_levels);
		}
	}
	for (int s = 0; s < 2; s++)
		for (int k = 0; rows->cb[s] && k < (s ? lo_levels : hi_levels); k++) {
			long c = lrintf(rows->cb[s][k] / cv);
			c = MIN(KVATTN_Q16V_CMAX, MAX(-KVATTN_Q16V_CMAX, c));
			rows->q16v_planes[0][(s ? hi_levels : 0) + k] = (uint8_t)((uint16_t)c & 0xff);
			rows->q16v_planes[1][(s ? hi_levels : 0) + k] = (uint8_t)((uint16_t)c >> 8);
		}
	rows->q16v_scale = cv;
	rows->q16v_bytes = (int)(end - base);
	rows->q16v_base = base;
	rows->q16v = true;
}

int kv_attn_rows_init_tq(KvAttnRows *rows, const TqLayout *layout, const float *cb_hi,
			 const float *cb_lo, float qjl_const)
{
	memset(rows, 0, sizeof(*rows));
	if (layout->dim <= 0 || layout->dim > TQ_MAX_DIM || layout->bits_hi > 8 ||
	    layout->bits_lo > 8 || (layout->n_hi > 0 && !cb_hi) || (layout->n_hi < layout->dim && !cb_lo))
		return -EINVAL;
	rows->format = KV_FORMAT_TQ;
	rows->dim = layout->dim;
	rows->row_bytes = layout->code_bytes;
	rows->tq = *layout;
	rows->cb[0] = layout->n_hi > 0 ? cb_hi : NULL;
	rows->cb[1] = layout->n_hi < layout->dim ? cb_lo : NULL;
	rows->qjl_const = layout->qjl_m > 0 ? qjl_const : 0.0f;
	rows->int8 = layout->bits_hi <= 4 && layout->bits_lo <= 4;
	for (int s = 0; s < 2; s++) {
		int bits = s ? layout->bits_lo : layout->bits_hi;
		if (rows->cb[s] && bits <= 4)
			codebook_int8(rows->cb[s], 1 << bits, rows->cb8[s], &rows->cb8_scale[s]);
		if (rows->cb[s] && bits <= 5)
			memcpy(rows->cb32[s], rows->cb[s], sizeof(float) << bits);
	}
	values_q16_init(rows);
	return 0;
}

static int pad32(int n)
{
	return (n + KV_ATTN_PAD - 1) / KV_ATTN_PAD * KV_ATTN_PAD;
}

/* Where coordinate k of a stream of n codes of `bits` bits sits in decode order (kv_attn.h). */
static int decode_pos(int k, int n, int bits)
{
	if (bits == 4 && k / 32 * 32 + 32 <= n)
		return k / 32 * 32 + (k % 2) * 16 + (k % 32) / 2;
	return k;
}

void kv_attn_query_prepare(const KvAttnRows *keys, KvAttnQuery *q)
{
	int d = keys->dim;
	memcpy(q->qd, q->q, (size_t)d * sizeof(float));
	if (keys->format != KV_FORMAT_TQ)
		return;
	int n_hi = keys->tq.n_hi, hi_pad = pad32(n_hi);
	for (int s = 0; s < 2; s++) { /* the full 4-bit chunks: evens, then odds (decode_pos) */
		int n = s ? d - n_hi : n_hi, off = s ? n_hi : 0;
		if ((s ? keys->tq.bits_lo : keys->tq.bits_hi) != 4)
			continue;
		for (int c = off; c + 32 <= off + n; c += 32)
			for (int k = 0; k < 16; k++) {
				q->qd[c + k] = q->q[c + 2 * k];
				q->qd[c + 16 + k] = q->q[c + 2 * k + 1];
			}
	}
	if (!keys->int8)
		return;
	float m = 0.0f;
	for (int i = 0; i < d; i++)
		m = fmaxf(m, fabsf(q->q[i]));
	float s = m > 0.0f ? m / 127.0f : 1.0f, inv = 1.0f / s;
	memset(q->q8, 0, (size_t)(hi_pad + pad32(d - n_hi)));
	for (int i = 0; i < d; i++) {
		bool hi = i < n_hi;
		int k = hi ? i : i - n_hi, n = hi ? n_hi : d - n_hi;
		int at = (hi ? 0 : hi_pad) + decode_pos(k, n, hi ? keys->tq.bits_hi : keys->tq.bits_lo);
		long v = lrintf(q->q[i] * inv);
		q->q8[at] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
	}
	for (int i = 0; i < hi_pad + pad32(d - n_hi); i++)
		q->q8_abs[i] = (uint8_t)abs(q->q8[i]);
	q->q8_scale = s;
}

/* ---- scalar references ---- */

static float score_one_ref(const KvAttnRows *r, const KvAttnQuery *q, const uint8_t *k)
{
	const float *x = q->q;
	int d = r->dim;
	float acc = 0.0f;
	switch (r->format) {
	case KV_FORMAT_F32: {
		const float *kf = (const float *)k;
		for (int i = 0; i < d; i++)
			acc += x[i] * kf[i];
		return acc;
	}
	case KV_FORMAT_F16:
		for (int i = 0; i < d; i++)
			acc += x[i] * half_to_f32((tkv_half)(k[2 * i] | k[2 * i + 1] << 8));
		return acc;
	case KV_FORMAT_Q8_0: {
		const BlockQ8_0 *b = (const BlockQ8_0 *)k;
		for (int bi = 0; bi < d / QK8_0; bi++) {
			float s = 0.0f;
			for (int j = 0; j < QK8_0; j++)
				s += x[bi * QK8_0 + j] * (float)b[bi].qs[j];
			acc += half_to_f32(b[bi].d) * s;
		}
		return acc;
	}
	case KV_FORMAT_Q4_0: {
		const BlockQ4_0 *b = (const BlockQ4_0 *)k;
		for (int bi = 0; bi < d / QK4_0; bi++) {
			const float *xb = x + bi * QK4_0;
			float s = 0.0f;
			for (int j = 0; j < QK4_0 / 2; j++) {
				s += xb[j] * (float)((b[bi].qs[j] & 0x0f) - 8);
				s += xb[j + QK4_0 / 2] * (float)((b[bi].qs[j] >> 4) - 8);
			}
			acc += half_to_f32(b[bi].d) * s;
		}
		return acc;
	}
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK: /* read by kv_attn_pk_scores_*() only */
	case KV_FORMAT_PQ: /* read by kv_attn_pq_*() only */
		break;
	}
	/* TQ: tq_inner_product() term by term */
	const TqLayout *L = &r->tq;
	float mse = 0.0f, qjl = 0.0f;
	if (L->n_hi > 0)
		mse += tq_load_f16(k + L->off_scale[0]) *
		       tq_dot_codes(x, k + L->off_hi, L->bits_hi, r->cb[0], L->n_hi);
	if (L->n_hi < L->dim)
		mse += tq_load_f16(k + L->off_scale[L->n_scales - 1]) *
		       tq_dot_codes(x + L->n_hi, k + L->off_lo, L->bits_lo, r->cb[1], L->dim - L->n_hi);
	if (L->qjl_m > 0)
		qjl = tq_load_f16(k + L->off_gamma) * tq_dot_signs(q->sq, k + L->off_signs, L->qjl_m);
	return mse + r->qjl_const * qjl;
}

void kv_attn_scores_ref(const KvAttnRows *keys, const KvAttnQuery *q, int G, const uint8_t *k,
			int n, float scale, float *scores, int ld)
{
	for (int j = 0; j < n; j++)
		for (int g = 0; g < G; g++)
			scores[g * ld + j] = scale * score_one_ref(keys, &q[g], k + (size_t)j * keys->row_bytes);
}

/* acc (dim,) += a * stored value v. */
static void axpy_one_ref(const KvAttnRows *r, float a, const uint8_t *v, float *acc)
{
	int d = r->dim;
	switch (r->format) {
	case KV_FORMAT_F32: {
		const float *vf = (const float *)v;
		for (int i = 0; i < d; i++)
			acc[i] += a * vf[i];
		return;
	}
	case KV_FORMAT_F16:
		for (int i = 0; i < d; i++)
			acc[i] += a * half_to_f32((tkv_half)(v[2 * i] | v[2 * i + 1] << 8));
		return;
	case KV_FORMAT_Q8_0: {
		const BlockQ8_0 *b = (const BlockQ8_0 *)v;
		for (int bi = 0; bi < d / QK8_0; bi++) {
			float as = a * half_to_f32(b[bi].d);
			for (int j = 0; j < QK8_0; j++)
				acc[bi * QK8_0 + j] += as * (float)b[bi].qs[j];
		}
		return;
	}
	case KV_FORMAT_Q4_0: {
		const BlockQ4_0 *b = (const BlockQ4_0 *)v;
		for (int bi = 0; bi < d / QK4_0; bi++) {
			float as = a * half_to_f32(b[bi].d);
			float *ab = acc + bi * QK4_0;
			for (int j = 0; j < QK4_0 / 2; j++) {
				ab[j] += as * (float)((b[bi].qs[j] & 0x0f) - 8);
				ab[j + QK4_0 / 2] += as * (float)((b[bi].qs[j] >> 4) - 8);
			}
		}
		return;
	}
	case KV_FORMAT_TQ:
	case KV_FORMAT_PK: /* read by kv_attn_pk_scores_*() only */
	case KV_FORMAT_PQ: /* read by kv_attn_pq_*() only */
		break;
	}
	/* TQ: a s_g c[idx_i] per rotated coordinate */
	const TqLayout *L = &r->tq;
	if (L->n_hi > 0) {
		float sa = a * tq_load_f16(v + L->off_scale[0]);
		for (int i = 0; i < L->n_hi; i++)
			acc[i] += sa * tq_code_value(v + L->off_hi, L->bits_hi, r->cb[0], i);
	}
	if (L->n_hi < L->dim) {
		float sa = a * tq_load_f16(v + L->off_scale[L->n_scales - 1]);
		float *lo = acc + L->n_hi;
		for (int i = 0; i < L->dim - L->n_hi; i++)
			lo[i] += sa * tq_code_value(v + L->off_lo, L->bits_lo, r->cb[1], i);
	}
}

void kv_attn_values_ref(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			int n, float *acc, int acc_ld)
{
	for (int j = 0; j < n; j++)
		for (int g = 0; g < G; g++)
			axpy_one_ref(vals, p[g * ld + j], v + (size_t)j * vals->row_bytes, acc + (size_t)g * acc_ld);
}

void kv_attn_values_q16_ref(const KvAttnRows *vals, const float *p, int ld, int G, const uint8_t *v,
			    int n, float *acc, int acc_ld)
{
	const TqLayout *L = &vals->tq;
	const int d = vals->dim;
	assert(vals->q16v && n <= KV_BLOCK_TOKENS);
	int hi_levels = L->n_hi ? 1 << L->bits_hi : 0;
	int16_t c16[KV_BLOCK_TOKENS][64];
	float sc[KV_BLOCK_TOKENS];
	for (int j = 0; j < n; j++) {
		const uint8_t *row = v + (size_t)j * vals->row_bytes;
		sc[j] = tq_load_f16(row + L->off_scale[0]);
		for (int i = 0; i < d; i++) {
			int k = i < L->n_hi ? (int)bitpack_get(row + L->off_hi, L->bits_hi, (size_t)i)
					    : hi_levels + (int)bitpack_get(row + L->off_lo, L->bits_lo, (size_t)(i - L->n_hi));
			c16[j][i] = (int16_t)(vals->q16v_planes[0][k] | vals->q16v_planes[1][k] << 8);
		}
	}
	for (int g = 0; g < G; g++) {
		float w[KV_BLOCK_TOKENS], wm = 0.0f;
		int32_t w16[KV_BLOCK_TOKENS];
		for (int j = 0; j < n; j++)
			wm = fmaxf(wm, w[j] = p[(size_t)g * ld + j] * sc[j]);
		if (!(wm > 0.0f))
			continue;
		float inv = (float)KVATTN_Q16V_WMAX / wm;
		for (int j = 0; j < n; j++)
			w16[j] = (int32_t)lrintf(w[j] * inv);
		float f = (wm / (float)KVATTN_Q16V_WMAX) * vals->q16v_scale;
		for (int i = 0; i < d; i++) {
			int32_t sum = 0;
			for (int j = 0; j < n; j++)
				sum += w16[j] * c16[j][i];
			acc[(size_t)g * acc_ld + i] += (float)sum * f;
		}
	}
}

void kv_attn_softmax_ref(float *s, int ld, int G, int n, float *m, float *l, float *ret_corr)
{
	for (int g = 0; g < G; g++) {
		float *sg = s + (size_t)g * ld, mx = m[g], sum = 0.0f;
		for (int j = 0; j < n; j++)
			mx = fmaxf(mx, sg[j]);
		for (int j = 0; j < n; j++)
			sum += sg[j] = expf(sg[j] - mx);
		ret_corr[g] = expf(m[g] - mx);
		l[g] = l[g] * ret_corr[g] + sum;
		m[g] = mx;
	}
}

/* ---- pair-coded keys ---- */

void kv_attn_pk_scores_ref(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			   float scale, float *scores, int ld)
{
	const int d = keys->dim, BT = KV_BLOCK_TOKENS;
	const uint8_t *sc = kvpk_scales(blk, keys->code_bits), *widths = sc + d / 2;
	float acc[KVPK_MAX_GROUP][KV_BLOCK_TOKENS], y[KV_BLOCK_TOKENS];
	uint8_t idx[KV_BLOCK_TOKENS];
	assert(G <= KVPK_MAX_GROUP);
	memset(acc, 0, sizeof(acc));
	const uint8_t *col = blk;
	/* column by column: each coordinate's 32 values once, then every query head */
	for (int j = 0; j < d; j++) {
		int b = kvpk_width(widths, j / 2);
		if (b == 0)
			continue;
		kvpk_column_unpack(col, b, idx);
		col += (size_t)BT * b / 8;
		const float *c = keys->centroids[b];
		float s = keys->sigma[sc[j / 2]];
		for (int t = 0; t < BT; t++)
			y[t] = c[idx[t]] * s;
		for (int g = 0; g < G; g++) {
			float qj = q[(size_t)g * d + j];
			for (int t = 0; t < BT; t++)
				acc[g][t] += qj * y[t];
		}
	}
	for (int g = 0; g < G; g++)
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] = acc[g][t] * scale;
}

void kv_attn_exact_scores_ref(const float *x, int d, const float *q, int G, int n, float scale,
			      float *scores, int ld)
{
	for (int g = 0; g < G; g++)
		for (int t = 0; t < n; t++) {
			float sum = 0.0f;
			for (int i = 0; i < d; i++)
				sum += q[(size_t)g * d + i] * x[(size_t)t * d + i];
			scores[(size_t)g * ld + t] = sum * scale;
		}
}

int kv_attn_pk_q16_tables(const float *c, int b, int16_t *c16, uint8_t *planes)
{
	assert(b >= 1 && b <= KVPK_MAX_BITS);
	memset(c16, 0, KVPK_Q16_TABLE * sizeof(int16_t));
	memset(planes, 0, 2 * 256);
	for (int k = 0; k < 1 << b; k++) {
		long v = lrintf(c[k] * (float)(1 << KVPK_Q16_SHIFT));
		if (v > KVPK_Q16_CMAX || v < -KVPK_Q16_CMAX)
			return -ERANGE;
		c16[k] = (int16_t)v;
		planes[k] = (uint8_t)((uint16_t)v & 0xff);
		planes[256 + k] = (uint8_t)((uint16_t)v >> 8);
	}
	return 0;
}

/*
 * The quantized query of one head for one block (kv_attn.h): u16 (d,) and
 * the factor f, from sig (d,) (sigma_{j/2}, 0 for pairs of width 0).
 */
static float pk_q16_query_ref(const float *q, const float *sig, int d, float scale, int16_t *u16)
{
	float m = 0.0f;
	for (int j = 0; j < d; j++)
		m = fmaxf(m, fabsf(q[j] * sig[j]));
	float inv = m > 0.0f ? (float)KVPK_Q16_UMAX / m : 0.0f;
	for (int j = 0; j < d; j++)
		u16[j] = (int16_t)lrintf(q[j] * sig[j] * inv);
	return (m / (float)KVPK_Q16_UMAX) * (scale * (1.0f / (float)(1 << KVPK_Q16_SHIFT)));
}

void kv_attn_pk_scores_q16_ref(const KvPkRows *keys, const uint8_t *blk, const float *q, int G, int n,
			       float scale, float *scores, int ld)
{
	const int d = keys->dim, BT = KV_BLOCK_TOKENS;
	const uint8_t *sc = kvpk_scales(blk, keys->code_bits), *widths = sc + d / 2;
	float sig[KVPK_MAX_DIM], f[KVPK_MAX_GROUP], out[KVPK_MAX_GROUP][KV_BLOCK_TOKENS];
	int16_t u16[KVPK_MAX_GROUP][KVPK_MAX_DIM];
	uint8_t idx[KV_BLOCK_TOKENS];
	assert(G <= KVPK_MAX_GROUP);
	for (int j = 0; j < d; j++)
		sig[j] = kvpk_width(widths, j / 2) ? keys->sigma[sc[j / 2]] : 0.0f;
	for (int g = 0; g < G; g++)
		f[g] = pk_q16_query_ref(q + (size_t)g * d, sig, d, scale, u16[g]);
	memset(out, 0, sizeof(out));
	const uint8_t *col = blk;
	for (int j0 = 0; j0 < d; j0 += KVPK_Q16_CHUNK) {
		int32_t acc[KVPK_MAX_GROUP][KV_BLOCK_TOKENS];
		memset(acc, 0, sizeof(acc));
		for (int j = j0; j < d && j < j0 + KVPK_Q16_CHUNK; j++) {
			int b = kvpk_width(widths, j / 2);
			if (b == 0)
				continue;
			kvpk_column_unpack(col, b, idx);
			col += (size_t)BT * b / 8;
			for (int g = 0; g < G; g++)
				for (int t = 0; t < BT; t++)
					acc[g][t] += (int32_t)u16[g][j] * keys->c16[b][idx[t]];
		}
		for (int g = 0; g < G; g++)
			for (int t = 0; t < BT; t++)
				out[g][t] += (float)acc[g][t] * f[g];
	}
	for (int g = 0; g < G; g++)
		for (int t = 0; t < n; t++)
			scores[(size_t)g * ld + t] = out[g][t];
}

/* ---- dispatch ---- */

bool kv_attn_have_avx2(void)
{
#if defined(CPU_KERNELS_X86)
	const CpuFeatures *f = cpu_features();
	/* pdep unpacks odd code widths; every AVX2 CPU has BMI2, but a VM may hide it */
	return f->avx2 && f->fma && f->f16c && __builtin_cpu_supports("bmi2");
#else
	return false;
#endif
}

bool kv_attn_have_avx512(void)
{
	return cpu_features()->avx512 && kv_attn_have_avx2();
}

bool kv_attn_have_avx512vbmi(void)
{
	return cpu_features()->avx512vbmi && kv_attn_have_avx512();
}

bool kv_attn_have_avx512vnni(void)
{
	return cpu_features()->avx512vnni && kv_attn_have_avx512vbmi();
}

bool kv_attn_have_neon(void)
{
#if defined(CPU_KERNELS_NEON)
	return cpu_features()->neon;
#else
	return false;
#endif
}

#if defined(CPU_KERNELS_X86)
KvAttnScoresFn kv_attn_scores_get(void)
{
	if (kv_attn_have_avx512())
		return kv_attn_scores_avx512;
	return kv_attn_have_avx2() ? kv_attn_scores_avx2 : kv_attn_scores_ref;
}

KvAttnSoftmaxFn kv_attn_softmax_get(void)
{
	if (kv_attn_have_avx512())
		return kv_attn_softmax_avx512;
	return kv_attn_have_avx2() ? kv_attn_softmax_avx2 : kv_attn_softmax_ref;
}

KvAttnPkScoresFn kv_attn_pk_scores_get(void)
{
	if (kv_attn_have_avx512vnni())
		return kv_attn_pk_scores_q16_avx512;
	return kv_attn_have_avx2() ? kv_attn_pk_scores_q16_avx2 : kv_attn_pk_scores_q16_ref;
}

KvAttnExactScoresFn kv_attn_exact_scores_get(void)
{
	return kv_attn_have_avx2() ? kv_attn_exact_scores_avx2 : kv_attn_exact_scores_ref;
}

KvAttnValuesFn kv_attn_values_get(void)
{
	if (kv_attn_have_avx512vnni())
		return kv_attn_values_q16_avx512;
	if (kv_attn_have_avx512())
		return kv_attn_values_avx512;
	return kv_attn_have_avx2() ? kv_attn_values_avx2 : kv_attn_values_ref;
}
#elif defined(CPU_KERNELS_NEON)
KvAttnScoresFn kv_attn_scores_get(void)
{
	return kv_attn_have_neon() ? kv_attn_scores_neon : kv_attn_scores_ref;
}

KvAttnSoftmaxFn kv_attn_softmax_get(void)
{
	return kv_attn_softmax_ref;
}

KvAttnPkScoresFn kv_attn_pk_scores_get(void)
{
	return kv_attn_have_neon() ? kv_attn_pk_scores_neon : kv_attn_pk_scores_ref;
}

KvAttnValuesFn kv_attn_values_get(void)
{
	return kv_attn_have_neon() ? kv_attn_values_neon : kv_attn_values_ref;
}

KvAttnExactScoresFn kv_attn_exact_scores_get(void)
{
	return kv_attn_have_neon() ? kv_attn_exact_scores_neon : kv_attn_exact_scores_ref;
}
#else
KvAttnScoresFn kv_attn_scores_get(void)
{
	return kv_attn_scores_ref;
}

KvAttnSoftmaxFn kv_attn_softmax_get(void)
{
	return kv_attn_softmax_ref;
}

KvAttnPkScoresFn kv_attn_pk_scores_get(void)
{
	return kv_attn_pk_scores_ref;
}

KvAttnValuesFn kv_attn_values_get(void)
{
	return kv_attn_values_ref;
}

KvAttnExactScoresFn kv_attn_exact_scores_get(void)
{
	return kv_attn_exact_scores_ref;
}
#endif
