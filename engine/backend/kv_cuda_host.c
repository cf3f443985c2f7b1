/*
 * kv_cuda_host.c: a CudaKv shaped like one layer of a CPU cache, with the
 * same types and the very same TurboQuant codecs (seeds and outlier masks
 * from kvtq_side_desc()), flattened by tq_codec_kernel().
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "engine/backend/kv_cuda_host.h"
#include "engine/codec/tq.h"
#include "engine/kv/fmt_tq.h"
#include "engine/kv/kvstore.h"

/* The flattened codecs of one side; blobs[h] owns codecs[h]'s blob. */
typedef struct SideCodecs {
	KvkCodec *codecs;
	uint8_t **blobs;
	int n;
} SideCodecs;

static void side_codecs_clear(SideCodecs *s)
{
	for (int h = 0; s->blobs && h < s->n; h++)
		free(s->blobs[h]);
	free(s->blobs);
	free(s->codecs);
	*s = (SideCodecs){ 0 };
}

static int side_codecs_build(const KvCache *cpu, int layer, KvRole role, SideCodecs *s, Error *err)
{
	int n = cpu->shape.n_kv_heads;
	s->codecs = calloc((size_t)n, sizeof(*s->codecs));
	s->blobs = calloc((size_t)n, sizeof(*s->blobs));
	if (!s->codecs || !s->blobs)
		return error_set(err, -ENOMEM, "out of memory");
	s->n = n;
	for (int h = 0; h < n; h++) {
		TqDesc desc;
		int r = kvtq_side_desc(cpu, layer, h, role, &desc);
		if (r)
			return error_set(err, r, "layer %d head %d %s: no TQ descriptor (an outlier "
				"type needs its first append on the CPU)", layer, h, role ? "V" : "K");
		_cleanup_(tq_codec_freep) TqCodec *codec = NULL;
		if ((r = tq_codec_new(&desc, &codec, err)))
			return r;
		if ((r = tq_codec_kernel(codec, &s->codecs[h], &s->blobs[h])))
			return error_set(err, r, "layer %d: the GPU takes head_dim and QJL rows up to %d",
					 layer, KVK_MAX_DIM);
	}
	return 0;
}

int cuda_kv_new_like(const KvCache *cpu, int layer, int n_seqs, int64_t capacity, CudaKv **ret,
		     Error *err)
{
	if (!kvstore_is(cpu))
		return error_set(err, KVSTORE_E_NOT_STORE, "not a compressed (kvstore) cache");
	if (layer < 0 || layer >= cpu->shape.n_layers)
		return error_set(err, -EINVAL, "layer %d out of range", layer);

	const KvLayerTypes *types = kvstore_layer_types(cpu, layer);
	const KvType *t[2] = { &types->k, &types->v };
	SideCodecs codecs[2] = { { 0 } };
	CudaKvSide sides[2];
	int r = 0;
	for (int role = 0; role < 2 && !r; role++) {
		sides[role] = (CudaKvSide){ .format = (int)t[role]->format,
					    .hadamard = t[role]->hadamard };
		if (t[role]->format == KV_FORMAT_TQ) {
			r = side_codecs_build(cpu, layer, (KvRole)role, &codecs[role], err);
			sides[role].tq = codecs[role].codecs;
		}
	}
	if (!r) {
		CudaKvShape shape = {
			.n_seqs = n_seqs,
			.n_heads = cpu->shape.n_heads,
			.n_kv_heads = cpu->shape.n_kv_heads,
			.dim = cpu->shape.head_dim,
			.capacity = capacity,
			.window = kvcache_layer_window(&cpu->shape, layer),
		};
		char msg[256] = "";
		r = cuda_kv_new(&shape, &sides[0], &sides[1], ret, msg, sizeof(msg));
		if (r)
			error_set(err, r, "%s", msg[0] ? msg : "GPU KV cache: allocation failed");
	}
	side_codecs_clear(&codecs[0]);
	side_codecs_clear(&codecs[1]);
	return r;
}
