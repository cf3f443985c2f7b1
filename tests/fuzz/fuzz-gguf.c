/*
 * fuzz-gguf.c: libFuzzer target for the GGUF reader (engine/gguf/gguf.c).
 *
 * Opens the input with gguf_open_memory() and, when it is accepted, walks
 * every kv and tensor the way a model loader would, checking the reader's
 * promises: every pointer it hands out lies inside the image, tensors lie
 * in the data section at aligned offsets and do not overlap, lookups find
 * each entry. A broken promise aborts, which the fuzzer reports.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"

#include "tests/fuzz/fuzz.h"

static volatile uint8_t sink;

typedef struct Image {
	const uint8_t *base;
	size_t size;
} Image;

/* [p, p + n) lies inside the image; read its first and last byte. */
static void touch(const Image *im, const void *p, uint64_t n)
{
	const uint8_t *q = p;
	if (n == 0)
		return;
	CHECK(q >= im->base && n <= im->size && (size_t)(q - im->base) <= im->size - n);
	sink ^= q[0];
	sink ^= q[n - 1];
}

static void touch_str(const Image *im, GgufStr s)
{
	touch(im, s.ptr, s.len);
}

/* Bytes of one scalar of type t; 0 for strings, arrays and unknown types. */
static size_t elem_bytes(uint32_t t)
{
	static const uint8_t bytes[GGUF_TYPE_COUNT_] = {
		[GGUF_TYPE_UINT8] = 1,   [GGUF_TYPE_INT8] = 1,  [GGUF_TYPE_BOOL] = 1,
		[GGUF_TYPE_UINT16] = 2,  [GGUF_TYPE_INT16] = 2,
		[GGUF_TYPE_UINT32] = 4,  [GGUF_TYPE_INT32] = 4, [GGUF_TYPE_FLOAT32] = 4,
		[GGUF_TYPE_UINT64] = 8,  [GGUF_TYPE_INT64] = 8, [GGUF_TYPE_FLOAT64] = 8,
	};
	return t < GGUF_TYPE_COUNT_ ? bytes[t] : 0;
}

static void walk_kv(const Gguf *g, const Image *im, const GgufKv *kv)
{
	touch_str(im, kv->key);
	CHECK(kv->key.len > 0);
	CHECK(kv->type < GGUF_TYPE_COUNT_);

	/* lookups, and the typed getters on every key */
	char *key = gguf_str_dup(kv->key);
	CHECK(key);
	if (!memchr(kv->key.ptr, 0, kv->key.len)) {
		uint32_t u32;
		int64_t i64;
		float f;
		bool b;
		GgufStr s;
		GgufArray a;
		CHECK(gguf_find_kv(g, key) == kv);
		CHECK(gguf_get_u32(g, key, &u32) != GGUF_E_NOT_FOUND);
		(void)gguf_get_i64(g, key, &i64);
		(void)gguf_get_f32(g, key, &f);
		(void)gguf_get_bool(g, key, &b);
		CHECK((gguf_get_str(g, key, &s) == 0) == (kv->type == GGUF_TYPE_STRING));
		CHECK((gguf_get_arr(g, key, &a) == 0) == (kv->type == GGUF_TYPE_ARRAY));
	}
	free(key);

	size_t eb = elem_bytes(kv->type);
	if (eb) {
		touch(im, kv->value, eb);
	} else if (kv->type == GGUF_TYPE_STRING) {
		touch_str(im, kv->str);
	} else {
		const GgufArray *a = &kv->arr;
		CHECK(a->type < GGUF_TYPE_COUNT_);
		eb = elem_bytes(a->type);
		if (eb) {
			CHECK(a->n <= im->size / eb);
			touch(im, a->data, a->n * eb);
		} else if (a->type == GGUF_TYPE_STRING) {
			CHECK(a->n == 0 || a->strs);
			for (uint64_t i = 0; i < a->n; i++)
				touch_str(im, a->strs[i]);
		} else {
			CHECK(!a->data && !a->strs);
		}
	}
}

static void walk_tensors(const Gguf *g, const Image *im)
{
	size_t n = gguf_n_tensors(g), data_off = gguf_data_offset(g);
	uint32_t align = gguf_alignment(g);

	for (size_t i = 0; i < n; i++) {
		const GgufTensor *t = gguf_tensor(g, i);
		touch_str(im, t->name);
		CHECK(t->n_dims >= 1 && t->n_dims <= 4);
		CHECK(t->size > 0);
		CHECK(t->offset % align == 0);
		CHECK((const uint8_t *)t->data == im->base + data_off + t->offset);
		touch(im, t->data, t->size);
		for (uint32_t d = t->n_dims; d < 4; d++)
			CHECK(t->ne[d] == 1);
		char *name = gguf_str_dup(t->name);
		CHECK(name);
		if (!memchr(t->name.ptr, 0, t->name.len))
			CHECK(gguf_find_tensor(g, name) == t);
		free(name);
		/* pairwise overlap, for the small tensor counts fuzz inputs reach */
		for (size_t j = 0; j < i && n <= 64; j++) {
			const GgufTensor *u = gguf_tensor(g, j);
			CHECK(u->offset + u->size <= t->offset || t->offset + t->size <= u->offset);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Image im = { data, size };
	Error err = { 0 };
	Gguf *g = NULL;

	int r = gguf_open_memory(data, size, &g, &err);
	if (r) {
		CHECK(r > 0 || r == -ENOMEM);
		CHECK(err.code == r && err.msg[0] && !g);
		return 0;
	}
	CHECK(g);
	CHECK(gguf_version(g) == 2 || gguf_version(g) == 3);
	CHECK(gguf_file_size(g) == size);
	uint32_t a = gguf_alignment(g);
	CHECK(a && !(a & (a - 1)));
	CHECK(gguf_data_offset(g) % a == 0);
	for (size_t i = 0; i < gguf_n_kv(g); i++)
		walk_kv(g, &im, gguf_kv(g, i));
	CHECK(!gguf_kv(g, gguf_n_kv(g)));
	walk_tensors(g, &im);
	CHECK(!gguf_tensor(g, gguf_n_tensors(g)));
	gguf_free(g);
	return 0;
}
