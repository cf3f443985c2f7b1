/*
 * repack.c: the X4 layout (repack.h): repacking, row gathering and the
 * scalar reference tile kernels. The SIMD tiles are repack_avx2.c,
 * repack_avx512.c (Q4_K), repack_q32_avx2.c (Q4_0, Q4_1, Q5_0, Q8_0) and
 * vec_dot_neon_impl.h (Q4_K); matmul.c picks between them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/repack.h"
#include "kernels/cpu/vec_dot.h"

static size_t block_bytes(uint32_t t)
{
	return wtype_info(t)->block_bytes;
}

/* Halves per block of a 32-value type with an X4 layout; 0 for the others. */
static int block_halves(uint32_t t)
{
	switch (t) {
	case WTYPE_Q4_0:
	case WTYPE_Q8_0: return 1;
	case WTYPE_Q4_1: return 2;
	case WTYPE_Q5_0: return 3; /* d, then qh as two 2-byte fields */
	default: return 0;
	}
}

bool repack_supported(const MatmulWeight *w)
{
	if (w->type != WTYPE_Q4_K && !block_halves(w->type))
		return false;
	return w->layout == MATMUL_LAYOUT_ROWS && w->rows > 0 && w->rows % REPACK_GROUP == 0 && w->cols > 0 &&
	       w->cols % wtype_info(w->type)->block_elems == 0 &&
	       w->row_stride == wtype_row_bytes(w->type, (uint64_t)w->cols);
}

/*
 * Where byte k of row i's block lands in its group-block (repack.h): the
 * whole block in place for Q4_K; for the 32-value types half h (bytes 2h,
 * 2h + 1) at 8 h + 2 i, quant byte j = k - 2 H at 8 H + 32 (j / 8) + 8 i
 * + j % 8.
 */
static size_t x4_offset(uint32_t t, size_t bb, int i, size_t k)
{
	size_t h = (size_t)block_halves(t);
	if (!h)
		return (size_t)i * bb + k;
	if (k < 2 * h)
		return 8 * (k / 2) + 2 * (size_t)i + k % 2;
	size_t j = k - 2 * h;
	return 8 * h + 32 * (j / REPACK_CHUNK) + REPACK_CHUNK * (size_t)i + j % REPACK_CHUNK;
}

int repack_weight(const MatmulWeight *w, MatmulWeight *ret)
{
	if (!repack_supported(w))
		return -EINVAL;
	size_t bb = block_bytes(w->type), nb = (size_t)w->cols / wtype_info(w->type)->block_elems, total = (size_t)w->rows * w->row_stride;
	uint8_t *dst = aligned_alloc(64, (total + 63) & ~(size_t)63);
	if (!dst)
		return -ENOMEM;
	const uint8_t *src = w->data;
	for (int64_t g = 0; g < w->rows / REPACK_GROUP; g++) {
		uint8_t *out = dst + (size_t)g * REPACK_GROUP * w->row_stride;
		for (size_t b = 0; b < nb; b++)
			for (int i = 0; i < REPACK_GROUP; i++) {
				const uint8_t *in = src + (size_t)(g * REPACK_GROUP + i) * w->row_stride + b * bb;
				uint8_t *gb = out + b * REPACK_GROUP * bb;
				if (w->type == WTYPE_Q4_K) {
					memcpy(gb + (size_t)i * bb, in, bb);
					continue;
				}
				for (size_t k = 0; k < bb; k++)
					gb[x4_offset(w->type, bb, i, k)] = in[k];
			}
	}
	*ret = *w;
	ret->data = dst;
	ret->layout = MATMUL_LAYOUT_X4;
	return 0;
}

const void *repack_row(const MatmulWeight *w, int64_t r, void *buf)
{
	const uint8_t *base = w->data;
	if (w->layout == MATMUL_LAYOUT_ROWS)
		return base + (size_t)r * w->row_stride;
	size_t bb = block_bytes(w->type), nb = (size_t)w->cols / wtype_info(w->type)->block_elems;
	const uint8_t *group = base + (size_t)(r / REPACK_GROUP) * REPACK_GROUP * w->row_stride;
	int i = (int)(r % REPACK_GROUP);
	for (size_t b = 0; b < nb; b++) {
		const uint8_t *gb = group + b * REPACK_GROUP * bb;
		uint8_t *out = (uint8_t *)buf + b * bb;
		for (size_t k = 0; k < bb; k++)
			out[k] = gb[x4_offset(w->type, bb, i, k)];
	}
	return buf;
}

/* The definition: each row gathered back, then the row kernel. */
void repack_tile_q4_K_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride)
{
	const BlockQ4_K *g = group;
	BlockQ4_K row[64];
	int64_t nb = n / QK_K;

	for (int i = 0; i < REPACK_GROUP; i++) {
		for (int64_t b0 = 0; b0 < nb; b0 += 64) {
			int64_t k = nb - b0 < 64 ? nb - b0 : 64;
			for (int64_t b = 0; b < k; b++)
				row[b] = g[(b0 + b) * REPACK_GROUP + i];
			for (int t = 0; t < nt; t++) {
				float s;
				vec_dot_q4_K_ref(k * QK_K, &s, row,
						 (const BlockQ8_K *)((const char *)act + (size_t)t * a_stride) + b0);
				y[(size_t)t * y_stride + (size_t)i] = b0 ? y[(size_t)t * y_stride + (size_t)i] + s : s;
			}
		}
	}
}

/* ---- the 32-value types, read in place ------------------------------- */

static inline float half_at(const uint8_t *p)
{
	tkv_half h;
	memcpy(&h, p, sizeof(h));
	return half_to_f32(h);
}

/* Quant byte j of row i in a group-block whose quant bytes start at qs. */
static inline uint8_t x4_q(const uint8_t *qs, int i, int j)
{
	return qs[32 * (j / REPACK_CHUNK) + REPACK_CHUNK * i + j % REPACK_CHUNK];
}

/*
 * Each kernel is vec_dot_*_ref (vec_dot_ref.c) with its weight reads
 * replaced by the layout's: the same integer sums and the same float
 * expression in the same order, so the same floats.
 */
void repack_tile_q4_0_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride)
{
	const uint8_t *g = group;
	int64_t nb = n / QK4_0;
	for (int t = 0; t < nt; t++) {
		const BlockQ8_0 *a = (const BlockQ8_0 *)((const char *)act + (size_t)t * a_stride);
		for (int i = 0; i < REPACK_GROUP; i++) {
			float sum = 0.0f;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *gb = g + (size_t)b * REPACK_GROUP * sizeof(BlockQ4_0);
				int isum = 0;
				for (int j = 0; j < QK4_0 / 2; j++) {
					uint8_t q = x4_q(gb + 8, i, j);
					isum += ((q & 0xF) - 8) * a[b].qs[j];
					isum += ((q >> 4) - 8) * a[b].qs[j + 16];
				}
				sum += half_at(gb + 2 * i) * half_to_f32(a[b].d) * (float)isum;
			}
			y[(size_t)t * y_stride + (size_t)i] = sum;
		}
	}
}

void repack_tile_q4_1_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride)
{
	const uint8_t *g = group;
	int64_t nb = n / QK4_1;
	for (int t = 0; t < nt; t++) {
		const BlockQ8_1 *a = (const BlockQ8_1 *)((const char *)act + (size_t)t * a_stride);
		for (int i = 0; i < REPACK_GROUP; i++) {
			float sum = 0.0f;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *gb = g + (size_t)b * REPACK_GROUP * sizeof(BlockQ4_1);
				int isum = 0;
				for (int j = 0; j < QK4_1 / 2; j++) {
					uint8_t q = x4_q(gb + 16, i, j);
					isum += (q & 0xF) * a[b].qs[j];
					isum += (q >> 4) * a[b].qs[j + 16];
				}
				sum += half_at(gb + 2 * i) * half_to_f32(a[b].d) * (float)isum +
				       half_at(gb + 8 + 2 * i) * half_to_f32(a[b].s);
			}
			y[(size_t)t * y_stride + (size_t)i] = sum;
		}
	}
}

void repack_tile_q5_0_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride)
{
	const uint8_t *g = group;
	int64_t nb = n / QK5_0;
	for (int t = 0; t < nt; t++) {
		const BlockQ8_0 *a = (const BlockQ8_0 *)((const char *)act + (size_t)t * a_stride);
		for (int i = 0; i < REPACK_GROUP; i++) {
			float sum = 0.0f;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *gb = g + (size_t)b * REPACK_GROUP * sizeof(BlockQ5_0);
				const uint8_t *h01 = gb + 8 + 2 * i, *h23 = gb + 16 + 2 * i;
				uint32_t qh = (uint32_t)h01[0] | (uint32_t)h01[1] << 8 | (uint32_t)h23[0] << 16 |
					      (uint32_t)h23[1] << 24;
				int isum = 0;
				for (int j = 0; j < QK5_0 / 2; j++) {
					uint8_t q = x4_q(gb + 24, i, j);
					isum += (((q & 0xF) | (int)((qh >> j) & 1) << 4) - 16) * a[b].qs[j];
					isum += (((q >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16) * a[b].qs[j + 16];
				}
				sum += half_at(gb + 2 * i) * half_to_f32(a[b].d) * (float)isum;
			}
			y[(size_t)t * y_stride + (size_t)i] = sum;
		}
	}
}

void repack_tile_q8_0_ref(int64_t n, const void *group, const void *act, size_t a_stride, int nt, float *y,
			  size_t y_stride)
{
	const uint8_t *g = group;
	int64_t nb = n / QK8_0;
	for (int t = 0; t < nt; t++) {
		const BlockQ8_0 *a = (const BlockQ8_0 *)((const char *)act + (size_t)t * a_stride);
		for (int i = 0; i < REPACK_GROUP; i++) {
			float sum = 0.0f;
			for (int64_t b = 0; b < nb; b++) {
				const uint8_t *gb = g + (size_t)b * REPACK_GROUP * sizeof(BlockQ8_0);
				int isum = 0;
				for (int j = 0; j < QK8_0; j++)
					isum += (int8_t)x4_q(gb + 8, i, j) * a[b].qs[j];
				sum += half_at(gb + 2 * i) * half_to_f32(a[b].d) * (float)isum;
			}
			y[(size_t)t * y_stride + (size_t)i] = sum;
		}
	}
}

RepackTileFn repack_tile_ref_get(uint32_t t)
{
	switch (t) {
	case WTYPE_Q4_K: return repack_tile_q4_K_ref;
	case WTYPE_Q4_0: return repack_tile_q4_0_ref;
	case WTYPE_Q4_1: return repack_tile_q4_1_ref;
	case WTYPE_Q5_0: return repack_tile_q5_0_ref;
	case WTYPE_Q8_0: return repack_tile_q8_0_ref;
	default: return NULL;
	}
}
