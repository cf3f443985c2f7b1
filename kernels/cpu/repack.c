/*
 * repack.c: the X4 layout (repack.h): repacking, row gathering and the
 * scalar reference tile kernel. The AVX2 tile kernel is repack_avx2.c;
 * matmul.c picks between them.
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

bool repack_supported(const MatmulWeight *w)
{
	return w->layout == MATMUL_LAYOUT_ROWS && w->type == WTYPE_Q4_K && w->rows > 0 &&
	       w->rows % REPACK_GROUP == 0 && w->cols > 0 && w->cols % QK_K == 0 &&
	       w->row_stride == wtype_row_bytes(w->type, (uint64_t)w->cols);
}

int repack_weight(const MatmulWeight *w, MatmulWeight *ret)
{
	if (!repack_supported(w))
		return -EINVAL;
	size_t bb = block_bytes(w->type), nb = (size_t)w->cols / QK_K, total = (size_t)w->rows * w->row_stride;
	uint8_t *dst = aligned_alloc(64, (total + 63) & ~(size_t)63);
	if (!dst)
		return -ENOMEM;
	const uint8_t *src = w->data;
	for (int64_t g = 0; g < w->rows / REPACK_GROUP; g++) {
		uint8_t *out = dst + (size_t)g * REPACK_GROUP * w->row_stride;
		for (size_t b = 0; b < nb; b++)
			for (int i = 0; i < REPACK_GROUP; i++) {
				const uint8_t *in = src + (size_t)(g * REPACK_GROUP + i) * w->row_stride + b * bb;
				memcpy(out + (b * REPACK_GROUP + (size_t)i) * bb, in, bb);
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
	for (size_t b = 0; b < nb; b++)
		memcpy((uint8_t *)buf + b * bb, group + (b * REPACK_GROUP + (size_t)(r % REPACK_GROUP)) * bb, bb);
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

RepackTileFn repack_tile_ref_get(uint32_t t)
{
	return t == WTYPE_Q4_K ? repack_tile_q4_K_ref : NULL;
}
