/*
 * test-gguf.c: the GGUF reader against files built byte by byte here,
 * a file written by gguf-py (tests/data/gguf, scripts/gen-gguf-fixtures.py)
 * and the default model.
 *
 * The builder below writes GGUF the way the spec describes it, not by
 * calling gguf.c; broken files are made by writing the wrong bytes on
 * purpose. Every rejected image is checked for its error code and for a
 * message naming the field.
 */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf/gguf.h"
#include "kernels/wtype.h"
#include "tests/unit/testutil.h"

/* ---- a tiny GGUF writer ---- */

typedef struct Buf {
	uint8_t *p;
	size_t len, cap;
} Buf;

static void buf_free(Buf *b)
{
	free(b->p);
	*b = (Buf){ 0 };
}

static void buf_put(Buf *b, const void *d, size_t n)
{
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n)
			cap *= 2;
		b->p = realloc(b->p, cap);
		ck_assert_ptr_nonnull(b->p);
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, d, n);
	b->len += n;
}

static void buf_u8(Buf *b, uint8_t v) { buf_put(b, &v, 1); }
static void buf_u16(Buf *b, uint16_t v) { buf_put(b, &v, 2); }
static void buf_u32(Buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(Buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void buf_f32(Buf *b, float v) { buf_put(b, &v, 4); }
static void buf_f64(Buf *b, double v) { buf_put(b, &v, 8); }

static void buf_zeros(Buf *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		buf_u8(b, 0);
}

static void buf_pad(Buf *b, size_t align)
{
	buf_zeros(b, (align - b->len % align) % align);
}

/* string: u64 length, bytes */
static void buf_str(Buf *b, const char *s)
{
	buf_u64(b, strlen(s));
	buf_put(b, s, strlen(s));
}

static void buf_header(Buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	buf_put(b, "GGUF", 4);
	buf_u32(b, version);
	buf_u64(b, n_tensors);
	buf_u64(b, n_kv);
}

/* key and value type; the caller writes the value */
static void buf_key(Buf *b, const char *key, uint32_t type)
{
	buf_str(b, key);
	buf_u32(b, type);
}

/* array header after buf_key(..., ARRAY) */
static void buf_arr(Buf *b, uint32_t elem, uint64_t n)
{
	buf_u32(b, elem);
	buf_u64(b, n);
}

static void buf_tensor(Buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
		       uint64_t offset)
{
	buf_str(b, name);
	buf_u32(b, n_dims);
	for (uint32_t d = 0; d < n_dims; d++)
		buf_u64(b, ne[d]);
	buf_u32(b, type);
	buf_u64(b, offset);
}

typedef struct TSpec {
	const char *name;
	uint32_t n_dims;
	uint64_t ne[5];
	uint32_t type;
	uint64_t offset;
} TSpec;

/* v3 file: no kvs, the tensors, padding to 32, data_len zero bytes. */
static void buf_tensor_file(Buf *b, const TSpec *t, size_t n, size_t data_len)
{
	buf_header(b, 3, n, 0);
	for (size_t i = 0; i < n; i++)
		buf_tensor(b, t[i].name, t[i].n_dims, t[i].ne, t[i].type, t[i].offset);
	buf_pad(b, 32);
	buf_zeros(b, data_len);
}

/* The kvs of tests/data/gguf/all-types.gguf (scripts/gen-gguf-fixtures.py), 26 of them. */
#define ALL_TYPES_N_KV 26
static void buf_all_types(Buf *b)
{
	buf_key(b, "t.u8", GGUF_TYPE_UINT8), buf_u8(b, 200);
	buf_key(b, "t.i8", GGUF_TYPE_INT8), buf_u8(b, (uint8_t)-100);
	buf_key(b, "t.u16", GGUF_TYPE_UINT16), buf_u16(b, 60000);
	buf_key(b, "t.i16", GGUF_TYPE_INT16), buf_u16(b, (uint16_t)-30000);
	buf_key(b, "t.u32", GGUF_TYPE_UINT32), buf_u32(b, 4000000000u);
	buf_key(b, "t.i32", GGUF_TYPE_INT32), buf_u32(b, (uint32_t)-2000000000);
	buf_key(b, "t.f32", GGUF_TYPE_FLOAT32), buf_f32(b, 1.5f);
	buf_key(b, "t.bool", GGUF_TYPE_BOOL), buf_u8(b, 1);
	buf_key(b, "t.str", GGUF_TYPE_STRING), buf_str(b, "h\xc3\xa9llo");
	buf_key(b, "t.u64", GGUF_TYPE_UINT64), buf_u64(b, 1ull << 40);
	buf_key(b, "t.i64", GGUF_TYPE_INT64), buf_u64(b, (uint64_t)-(1ll << 40));
	buf_key(b, "t.f64", GGUF_TYPE_FLOAT64), buf_f64(b, 0.1);

	buf_key(b, "t.arr.u8", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_UINT8, 3);
	buf_u8(b, 1), buf_u8(b, 2), buf_u8(b, 255);
	buf_key(b, "t.arr.i8", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_INT8, 3);
	buf_u8(b, 0xff), buf_u8(b, 0), buf_u8(b, 127);
	buf_key(b, "t.arr.u16", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_UINT16, 2);
	buf_u16(b, 1), buf_u16(b, 65535);
	buf_key(b, "t.arr.i16", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_INT16, 2);
	buf_u16(b, 0x8000), buf_u16(b, 32767);
	buf_key(b, "t.arr.u32", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_UINT32, 4);
	buf_u32(b, 7), buf_u32(b, 8), buf_u32(b, 9), buf_u32(b, 10);
	buf_key(b, "t.arr.i32", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_INT32, 2);
	buf_u32(b, (uint32_t)-7), buf_u32(b, 8);
	buf_key(b, "t.arr.f32", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_FLOAT32, 3);
	buf_f32(b, 0.5f), buf_f32(b, -2.0f), buf_f32(b, 3.25f);
	buf_key(b, "t.arr.bool", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_BOOL, 3);
	buf_u8(b, 1), buf_u8(b, 0), buf_u8(b, 1);
	buf_key(b, "t.arr.str", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_STRING, 3);
	buf_str(b, "a"), buf_str(b, ""), buf_str(b, "xyz");
	buf_key(b, "t.arr.u64", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_UINT64, 1);
	buf_u64(b, 1ull << 63);
	buf_key(b, "t.arr.i64", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_INT64, 2);
	buf_u64(b, 1ull << 63), buf_u64(b, 5);
	buf_key(b, "t.arr.f64", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_FLOAT64, 1);
	buf_f64(b, 2.5);
	/* [[1, 2], [3]] as gguf-py writes it: inner arrays of its default int type, i32 */
	buf_key(b, "t.arr.nested", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_ARRAY, 2);
	buf_arr(b, GGUF_TYPE_INT32, 2), buf_u32(b, 1), buf_u32(b, 2);
	buf_arr(b, GGUF_TYPE_INT32, 1), buf_u32(b, 3);
	buf_key(b, "t.arr.nested_str", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_ARRAY, 2);
	buf_arr(b, GGUF_TYPE_STRING, 1), buf_str(b, "p");
	buf_arr(b, GGUF_TYPE_STRING, 2), buf_str(b, "q"), buf_str(b, "r");
}

/* ---- helpers ---- */

static Gguf *open_ok(const Buf *b)
{
	Error err = { 0 };
	Gguf *g = NULL;
	int r = gguf_open_memory(b->p, b->len, &g, &err);
	ck_assert_msg(r == 0, "gguf_open_memory: %d: %s", r, err.msg);
	ck_assert_ptr_nonnull(g);
	return g;
}

/*
 * Expect the image to be rejected with code; the message must contain
 * want (if given). The image is copied to an exact-size heap block so that
 * ASan sees any read past its end.
 */
static void expect_fail_mem(const void *data, size_t len, int code, const char *want)
{
	Error err = { 0 };
	Gguf *g = (Gguf *)0x1;
	uint8_t *copy = malloc(len ? len : 1);
	ck_assert_ptr_nonnull(copy);
	if (len)
		memcpy(copy, data, len);
	int r = gguf_open_memory(copy, len, &g, &err);
	ck_assert_msg(r == code, "expected %d, got %d (%s)", code, r, err.msg);
	ck_assert_int_eq(err.code, code);
	ck_assert_msg(err.msg[0] != '\0', "empty error message");
	ck_assert_msg(g == (Gguf *)0x1, "ret written on failure");
	if (want)
		ck_assert_msg(strstr(err.msg, want), "message '%s' lacks '%s'", err.msg, want);
	free(copy);
}

static void expect_fail(const Buf *b, int code, const char *want)
{
	expect_fail_mem(b->p, b->len, code, want);
}

static void check_str(GgufStr s, const char *want)
{
	ck_assert_msg(gguf_str_eq(s, want), "got '%.*s', want '%s'", (int)s.len, s.ptr, want);
}

/* The 26 t.* kvs, through the typed getters and the raw views. */
static void check_all_types(const Gguf *g)
{
	uint32_t u32;
	int64_t i64;
	float f;
	bool bo;
	GgufStr s;
	GgufArray a;

	ck_assert_int_eq(gguf_get_u32(g, "t.u8", &u32), 0); ck_assert_uint_eq(u32, 200);
	ck_assert_int_eq(gguf_get_i64(g, "t.i8", &i64), 0); ck_assert_int_eq(i64, -100);
	u32 = 12345;
	ck_assert_int_eq(gguf_get_u32(g, "t.i8", &u32), GGUF_E_WRONG_TYPE);
	ck_assert_uint_eq(u32, 12345); /* not written on failure */
	ck_assert_int_eq(gguf_get_u32(g, "t.u16", &u32), 0); ck_assert_uint_eq(u32, 60000);
	ck_assert_int_eq(gguf_get_i64(g, "t.i16", &i64), 0); ck_assert_int_eq(i64, -30000);
	ck_assert_int_eq(gguf_get_u32(g, "t.u32", &u32), 0); ck_assert_uint_eq(u32, 4000000000u);
	ck_assert_int_eq(gguf_get_i64(g, "t.u32", &i64), 0); ck_assert_int_eq(i64, 4000000000ll);
	ck_assert_int_eq(gguf_get_u32(g, "t.i32", &u32), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_i64(g, "t.i32", &i64), 0); ck_assert_int_eq(i64, -2000000000ll);
	ck_assert_int_eq(gguf_get_f32(g, "t.f32", &f), 0); ck_assert_float_eq(f, 1.5f);
	ck_assert_int_eq(gguf_get_u32(g, "t.f32", &u32), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_bool(g, "t.bool", &bo), 0); ck_assert(bo);
	ck_assert_int_eq(gguf_get_bool(g, "t.u8", &bo), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_str(g, "t.str", &s), 0); check_str(s, "h\xc3\xa9llo");
	ck_assert_int_eq(gguf_get_str(g, "t.u8", &s), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_i64(g, "t.u64", &i64), 0); ck_assert_int_eq(i64, 1ll << 40);
	ck_assert_int_eq(gguf_get_u32(g, "t.u64", &u32), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_i64(g, "t.i64", &i64), 0); ck_assert_int_eq(i64, -(1ll << 40));
	ck_assert_int_eq(gguf_get_f32(g, "t.f64", &f), 0); ck_assert_float_eq(f, 0.1f);
	ck_assert_int_eq(gguf_get_f32(g, "t.i32", &f), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_i64(g, "t.str", &i64), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_arr(g, "t.u8", &a), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_u32(g, "t.missing", &u32), GGUF_E_NOT_FOUND);
	ck_assert_int_eq(gguf_get_arr(g, "t.missing", &a), GGUF_E_NOT_FOUND);
	ck_assert_ptr_null(gguf_find_kv(g, "t.missing"));
	ck_assert_ptr_null(gguf_find_kv(g, "t.u8x"));
	ck_assert_ptr_null(gguf_find_kv(g, "t.u"));

	/* raw views */
	const GgufKv *kv = gguf_find_kv(g, "t.u16");
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(kv->type, GGUF_TYPE_UINT16);
	check_str(kv->key, "t.u16");
	uint16_t u16;
	memcpy(&u16, kv->value, 2);
	ck_assert_uint_eq(u16, 60000);
	kv = gguf_find_kv(g, "t.str");
	ck_assert_uint_eq(kv->type, GGUF_TYPE_STRING);
	check_str(kv->str, "h\xc3\xa9llo");

	/* arrays, element by element */
	static const uint8_t au8[] = { 1, 2, 255 };
	static const int8_t ai8[] = { -1, 0, 127 };
	static const uint16_t au16[] = { 1, 65535 };
	static const int16_t ai16[] = { -32768, 32767 };
	static const uint32_t au32[] = { 7, 8, 9, 10 };
	static const int32_t ai32[] = { -7, 8 };
	static const float af32[] = { 0.5f, -2.0f, 3.25f };
	static const uint8_t abool[] = { 1, 0, 1 };
	static const uint64_t au64[] = { 1ull << 63 };
	static const int64_t ai64[] = { INT64_MIN, 5 };
	static const double af64[] = { 2.5 };
	static const struct {
		const char *key;
		uint32_t type;
		uint64_t n;
		const void *want;
		size_t bytes;
	} arrs[] = {
		{ "t.arr.u8", GGUF_TYPE_UINT8, 3, au8, sizeof(au8) },
		{ "t.arr.i8", GGUF_TYPE_INT8, 3, ai8, sizeof(ai8) },
		{ "t.arr.u16", GGUF_TYPE_UINT16, 2, au16, sizeof(au16) },
		{ "t.arr.i16", GGUF_TYPE_INT16, 2, ai16, sizeof(ai16) },
		{ "t.arr.u32", GGUF_TYPE_UINT32, 4, au32, sizeof(au32) },
		{ "t.arr.i32", GGUF_TYPE_INT32, 2, ai32, sizeof(ai32) },
		{ "t.arr.f32", GGUF_TYPE_FLOAT32, 3, af32, sizeof(af32) },
		{ "t.arr.bool", GGUF_TYPE_BOOL, 3, abool, sizeof(abool) },
		{ "t.arr.u64", GGUF_TYPE_UINT64, 1, au64, sizeof(au64) },
		{ "t.arr.i64", GGUF_TYPE_INT64, 2, ai64, sizeof(ai64) },
		{ "t.arr.f64", GGUF_TYPE_FLOAT64, 1, af64, sizeof(af64) },
	};
	for (size_t i = 0; i < ARRAY_SIZE(arrs); i++) {
		ck_assert_int_eq(gguf_get_arr(g, arrs[i].key, &a), 0);
		ck_assert_msg(a.type == arrs[i].type && a.n == arrs[i].n, "%s: type %u n %llu", arrs[i].key,
			      a.type, (unsigned long long)a.n);
		ck_assert_ptr_nonnull(a.data);
		ck_assert_ptr_null(a.strs);
		ck_assert_msg(memcmp(a.data, arrs[i].want, arrs[i].bytes) == 0, "%s: elements differ", arrs[i].key);
	}
	ck_assert_int_eq(gguf_get_arr(g, "t.arr.str", &a), 0);
	ck_assert_uint_eq(a.type, GGUF_TYPE_STRING);
	ck_assert_uint_eq(a.n, 3);
	ck_assert_ptr_nonnull(a.strs);
	check_str(a.strs[0], "a");
	check_str(a.strs[1], "");
	check_str(a.strs[2], "xyz");
	ck_assert_int_eq(gguf_get_arr(g, "t.arr.nested", &a), 0);
	ck_assert_uint_eq(a.type, GGUF_TYPE_ARRAY);
	ck_assert_uint_eq(a.n, 2);
	ck_assert_ptr_null(a.data);
	ck_assert_ptr_null(a.strs);
	ck_assert_int_eq(gguf_get_arr(g, "t.arr.nested_str", &a), 0);
	ck_assert_uint_eq(a.type, GGUF_TYPE_ARRAY);
	ck_assert_uint_eq(a.n, 2);
}

/* ---- round trips ---- */

START_TEST(test_all_types_v2_v3)
{
	for (uint32_t version = 2; version <= 3; version++) {
		Buf b = { 0 };
		buf_header(&b, version, 0, ALL_TYPES_N_KV);
		buf_all_types(&b);
		Gguf *g = open_ok(&b);
		ck_assert_uint_eq(gguf_version(g), version);
		ck_assert_uint_eq(gguf_n_kv(g), ALL_TYPES_N_KV);
		ck_assert_uint_eq(gguf_n_tensors(g), 0);
		ck_assert_uint_eq(gguf_alignment(g), 32);
		ck_assert_uint_eq(gguf_file_size(g), b.len);
		check_all_types(g);
		/* file order is kept */
		check_str(gguf_kv(g, 0)->key, "t.u8");
		check_str(gguf_kv(g, ALL_TYPES_N_KV - 1)->key, "t.arr.nested_str");
		ck_assert_ptr_null(gguf_kv(g, ALL_TYPES_N_KV));
		gguf_free(g);
		buf_free(&b);
	}
}
END_TEST

START_TEST(test_integer_edges)
{
	Buf b = { 0 };
	buf_header(&b, 3, 0, 7);
	buf_key(&b, "i64min", GGUF_TYPE_INT64), buf_u64(&b, 1ull << 63);
	buf_key(&b, "u64max", GGUF_TYPE_UINT64), buf_u64(&b, UINT64_MAX);
	buf_key(&b, "u64u32max", GGUF_TYPE_UINT64), buf_u64(&b, UINT32_MAX);
	buf_key(&b, "u64u32max1", GGUF_TYPE_UINT64), buf_u64(&b, (uint64_t)UINT32_MAX + 1);
	buf_key(&b, "i8m1", GGUF_TYPE_INT8), buf_u8(&b, 0xff);
	buf_key(&b, "bool2", GGUF_TYPE_BOOL), buf_u8(&b, 0);
	buf_key(&b, "i64pos", GGUF_TYPE_INT64), buf_u64(&b, 7);
	Gguf *g = open_ok(&b);
	int64_t i64 = 0;
	uint32_t u32 = 0;
	bool bo = true;
	ck_assert_int_eq(gguf_get_i64(g, "i64min", &i64), 0); ck_assert(i64 == INT64_MIN);
	ck_assert_int_eq(gguf_get_i64(g, "u64max", &i64), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_u32(g, "u64u32max", &u32), 0); ck_assert_uint_eq(u32, UINT32_MAX);
	ck_assert_int_eq(gguf_get_u32(g, "u64u32max1", &u32), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_u32(g, "i8m1", &u32), GGUF_E_WRONG_TYPE);
	ck_assert_int_eq(gguf_get_i64(g, "i8m1", &i64), 0); ck_assert_int_eq(i64, -1);
	ck_assert_int_eq(gguf_get_u32(g, "i64pos", &u32), 0); ck_assert_uint_eq(u32, 7);
	ck_assert_int_eq(gguf_get_bool(g, "bool2", &bo), 0); ck_assert(!bo);
	gguf_free(g);
	buf_free(&b);
}
END_TEST

/* A file gguf-py wrote, checked against what gguf-py's reader reported. */
START_TEST(test_gguf_py_fixture)
{
	_cleanup_(gguf_freep) Gguf *g = NULL;
	Error err = { 0 };
	char path[4096];
	snprintf(path, sizeof(path), "%s", test_data_path("gguf/all-types.gguf"));
	int r = gguf_open(path, &g, &err);
	ck_assert_msg(r == 0, "%s: %d %s", path, r, err.msg);

	FILE *f = fopen(test_data_path("gguf/all-types.expected"), "r");
	ck_assert_ptr_nonnull(f);
	char line[512], name[128];
	unsigned long long v, ne[4], off, size;
	unsigned type, n_dims;
	size_t n_tensor_lines = 0;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "version %llu", &v) == 1)
			ck_assert_uint_eq(gguf_version(g), v);
		else if (sscanf(line, "n_kv %llu", &v) == 1)
			ck_assert_uint_eq(gguf_n_kv(g), v);
		else if (sscanf(line, "n_tensors %llu", &v) == 1)
			ck_assert_uint_eq(gguf_n_tensors(g), v);
		else if (sscanf(line, "alignment %llu", &v) == 1)
			ck_assert_uint_eq(gguf_alignment(g), v);
		else if (sscanf(line, "data_offset %llu", &v) == 1)
			ck_assert_uint_eq(gguf_data_offset(g), v);
		else if (sscanf(line, "file_size %llu", &v) == 1)
			ck_assert_uint_eq(gguf_file_size(g), v);
		else if (sscanf(line, "tensor %127s %u %u %llu %llu %llu %llu %llu %llu", name, &type, &n_dims,
				&ne[0], &ne[1], &ne[2], &ne[3], &off, &size) == 9) {
			const GgufTensor *t = gguf_find_tensor(g, name);
			ck_assert_msg(t, "tensor %s missing", name);
			ck_assert_ptr_eq(t, gguf_tensor(g, n_tensor_lines));
			ck_assert_uint_eq(t->type, type);
			ck_assert_uint_eq(t->n_dims, n_dims);
			for (int d = 0; d < 4; d++)
				ck_assert_uint_eq(t->ne[d], ne[d]);
			ck_assert_uint_eq(t->offset, off);
			ck_assert_uint_eq(t->size, size);
			ck_assert_ptr_eq(t->data, (const uint8_t *)gguf_tensor(g, 0)->data - gguf_tensor(g, 0)->offset + off);
			ck_assert_uint_eq((uintptr_t)t->data % 64, 0);
			n_tensor_lines++;
		} else {
			ck_abort_msg("unexpected line in all-types.expected: %s", line);
		}
	}
	fclose(f);
	ck_assert_uint_eq(n_tensor_lines, 5);

	check_all_types(g);
	GgufStr s;
	ck_assert_int_eq(gguf_get_str(g, "general.architecture", &s), 0);
	check_str(s, "test");
	uint32_t u32;
	ck_assert_int_eq(gguf_get_u32(g, "general.alignment", &u32), 0);
	ck_assert_uint_eq(u32, 64);

	/* tensor bytes: f32 holds 0, 0.25, ..., 2.75; f16 holds 0..7 */
	const GgufTensor *t = gguf_find_tensor(g, "f32");
	for (int i = 0; i < 12; i++) {
		float x;
		memcpy(&x, (const uint8_t *)t->data + 4 * i, 4);
		ck_assert_float_eq(x, 0.25f * (float)i);
	}
	t = gguf_find_tensor(g, "f16");
	for (int i = 0; i < 8; i++) {
		uint16_t h;
		memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
		ck_assert_float_eq(half_to_f32(h), (float)i);
	}
	t = gguf_find_tensor(g, "q4_k");
	for (int i = 0; i < 144; i++)
		ck_assert_uint_eq(((const uint8_t *)t->data)[i], (uint8_t)(i * 37 % 251));
}
END_TEST

START_TEST(test_many_tensors_lookup)
{
	enum { N = 300 };
	Buf b = { 0 };
	char name[64];
	buf_header(&b, 3, N, 1);
	buf_key(&b, "general.architecture", GGUF_TYPE_STRING), buf_str(&b, "llama");
	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "blk.%d.attn_q.weight", i);
		uint64_t ne[2] = { 8, 1 };
		/* reverse file order vs data order, to exercise the overlap sort */
		buf_tensor(&b, name, 2, ne, WTYPE_F32, (uint64_t)(N - 1 - i) * 32);
	}
	buf_pad(&b, 32);
	size_t data_start = b.len;
	buf_zeros(&b, N * 32);
	Gguf *g = open_ok(&b);
	ck_assert_uint_eq(gguf_n_tensors(g), N);
	ck_assert_uint_eq(gguf_data_offset(g), data_start);
	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "blk.%d.attn_q.weight", i);
		const GgufTensor *t = gguf_find_tensor(g, name);
		ck_assert_ptr_eq(t, gguf_tensor(g, i));
		ck_assert_ptr_eq(t->data, b.p + data_start + (size_t)(N - 1 - i) * 32);
		ck_assert_uint_eq(t->size, 32);
		ck_assert_uint_eq(t->ne[2], 1);
		ck_assert_uint_eq(t->ne[3], 1);
	}
	ck_assert_ptr_null(gguf_find_tensor(g, "blk.300.attn_q.weight"));
	ck_assert_ptr_null(gguf_find_tensor(g, "blk.0.attn_q.weigh"));
	ck_assert_ptr_null(gguf_find_tensor(g, ""));
	ck_assert_ptr_null(gguf_tensor(g, N));
	gguf_free(g);
	buf_free(&b);
}
END_TEST

/* A small valid file using every structure, for truncation. */
static void buf_small_valid(Buf *b)
{
	buf_header(b, 3, 2, 4);
	buf_key(b, "general.alignment", GGUF_TYPE_UINT32), buf_u32(b, 16);
	buf_key(b, "s", GGUF_TYPE_STRING), buf_str(b, "hi");
	buf_key(b, "a", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_STRING, 2), buf_str(b, "x"), buf_str(b, "yz");
	buf_key(b, "n", GGUF_TYPE_ARRAY), buf_arr(b, GGUF_TYPE_ARRAY, 1), buf_arr(b, GGUF_TYPE_UINT16, 2);
	buf_u16(b, 1), buf_u16(b, 2);
	uint64_t ne0[2] = { 4, 2 }, ne1[1] = { 32 };
	buf_tensor(b, "w", 2, ne0, WTYPE_F32, 0);
	buf_tensor(b, "q", 1, ne1, WTYPE_Q8_0, 32);
	buf_pad(b, 16);
	buf_zeros(b, 32 + 34);
}

START_TEST(test_truncated_every_offset)
{
	Buf b = { 0 };
	buf_small_valid(&b);
	Gguf *g = open_ok(&b);
	ck_assert_uint_eq(gguf_alignment(g), 16);
	ck_assert_uint_eq(gguf_data_offset(g) % 16, 0);
	ck_assert_uint_eq(gguf_find_tensor(g, "q")->size, 34);
	gguf_free(g);

	for (size_t len = 0; len < b.len; len++) {
		Error err = { 0 };
		uint8_t *copy = malloc(len ? len : 1);
		memcpy(copy, b.p, len);
		g = NULL;
		int r = gguf_open_memory(copy, len, &g, &err);
		ck_assert_msg(r > 0, "truncated at %zu of %zu: got %d", len, b.len, r);
		ck_assert_ptr_null(g);
		ck_assert_msg(err.msg[0], "no message at %zu", len);
		free(copy);
	}
	buf_free(&b);
}
END_TEST

START_TEST(test_truncated_fixture)
{
	size_t len;
	char *data = test_read_file(test_data_path("gguf/all-types.gguf"), &len);
	ck_assert_ptr_nonnull(data);
	/* gguf-py pads the last tensor: a cut inside that padding is still valid */
	size_t end = 1280 + 320 + 144; /* data_offset + q4_k offset + size, all-types.expected */
	for (size_t cut = 0; cut < len; cut++) {
		Gguf *g = NULL;
		uint8_t *copy = malloc(cut ? cut : 1);
		memcpy(copy, data, cut);
		int r = gguf_open_memory(copy, cut, &g, NULL); /* NULL err is allowed */
		if (cut < end)
			ck_assert_msg(r > 0, "cut at %zu: %d", cut, r);
		else
			ck_assert_msg(r == 0, "cut at %zu: %d", cut, r);
		gguf_free(g);
		free(copy);
	}
	free(data);
}
END_TEST

/* ---- header ---- */

START_TEST(test_bad_header)
{
	Buf b = { 0 };
	buf_header(&b, 3, 0, 0);
	Gguf *g = open_ok(&b); /* the smallest valid file */
	ck_assert_uint_eq(gguf_n_kv(g), 0);
	gguf_free(g);

	b.p[3] = 'G';
	expect_fail(&b, GGUF_E_MAGIC, "magic");
	buf_free(&b);

	static const uint32_t bad_versions[] = { 0, 1, 4, 0x03000000u, UINT32_MAX };
	for (size_t i = 0; i < ARRAY_SIZE(bad_versions); i++) {
		buf_header(&b, bad_versions[i], 0, 0);
		expect_fail(&b, GGUF_E_VERSION, NULL);
		buf_free(&b);
	}
	buf_header(&b, 1, 0, 0);
	expect_fail(&b, GGUF_E_VERSION, "version 1");
	buf_free(&b);

	expect_fail_mem("", 0, GGUF_E_TRUNCATED, NULL);
	expect_fail_mem("GGU", 3, GGUF_E_TRUNCATED, NULL);
}
END_TEST

START_TEST(test_absurd_counts)
{
	Buf b = { 0 };
	/* n_kv, n_tensors: 2^62, and merely more than the file can hold */
	buf_header(&b, 3, 0, 1ull << 62);
	expect_fail(&b, GGUF_E_LIMIT, "n_kv");
	buf_free(&b);
	buf_header(&b, 3, 1ull << 62, 0);
	expect_fail(&b, GGUF_E_LIMIT, "n_tensors");
	buf_free(&b);
	buf_header(&b, 3, UINT64_MAX, UINT64_MAX);
	expect_fail(&b, GGUF_E_LIMIT, NULL);
	buf_free(&b);
	buf_header(&b, 3, 0, 1000);
	buf_key(&b, "k", GGUF_TYPE_UINT8), buf_u8(&b, 1);
	expect_fail(&b, GGUF_E_LIMIT, "n_kv 1000");
	buf_free(&b);
	buf_header(&b, 3, 1000, 0);
	buf_zeros(&b, 1000);
	expect_fail(&b, GGUF_E_LIMIT, "n_tensors 1000");
	buf_free(&b);

	/* key length 2^62, and just over 64 KiB */
	buf_header(&b, 3, 0, 1);
	buf_u64(&b, 1ull << 62), buf_zeros(&b, 32);
	expect_fail(&b, GGUF_E_LIMIT, "kv 0 key");
	buf_free(&b);
	buf_header(&b, 3, 0, 1);
	buf_u64(&b, 65536), buf_zeros(&b, 65536 + 16);
	expect_fail(&b, GGUF_E_LIMIT, "65536");
	buf_free(&b);
	buf_header(&b, 3, 0, 1);
	buf_u64(&b, 0), buf_u32(&b, GGUF_TYPE_UINT32), buf_u32(&b, 0), buf_zeros(&b, 8);
	expect_fail(&b, GGUF_E_LIMIT, "empty key");
	buf_free(&b);

	/* string value of 2^62 bytes, and one byte longer than the file */
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "general.name", GGUF_TYPE_STRING), buf_u64(&b, 1ull << 62), buf_zeros(&b, 8);
	expect_fail(&b, GGUF_E_TRUNCATED, "key 'general.name'");
	buf_free(&b);
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "general.name", GGUF_TYPE_STRING), buf_u64(&b, 4), buf_put(&b, "abc", 3);
	expect_fail(&b, GGUF_E_TRUNCATED, "general.name");
	buf_free(&b);
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "s", GGUF_TYPE_STRING), buf_u64(&b, UINT64_MAX);
	expect_fail(&b, GGUF_E_TRUNCATED, NULL);
	buf_free(&b);

	/* arrays of 2^62 elements: scalars, strings, arrays */
	static const uint32_t elems[] = { GGUF_TYPE_UINT8, GGUF_TYPE_UINT64, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY };
	for (size_t i = 0; i < ARRAY_SIZE(elems); i++) {
		for (int big = 0; big < 2; big++) {
			buf_header(&b, 3, 0, 1);
			buf_key(&b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
			buf_arr(&b, elems[i], big ? 1ull << 62 : UINT64_MAX / 4 + 3);
			buf_zeros(&b, 64);
			int want = elems[i] == GGUF_TYPE_STRING || elems[i] == GGUF_TYPE_ARRAY ? GGUF_E_LIMIT
												: GGUF_E_TRUNCATED;
			expect_fail(&b, want, "tokenizer.ggml.tokens");
			buf_free(&b);
		}
	}
	/* a u32 array whose byte size wraps around 2^64 */
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "a", GGUF_TYPE_ARRAY), buf_arr(&b, GGUF_TYPE_UINT32, (1ull << 62) + 1), buf_zeros(&b, 8);
	expect_fail(&b, GGUF_E_TRUNCATED, NULL);
	buf_free(&b);
	/* an inner string of a string array claims 2^62 bytes */
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "a", GGUF_TYPE_ARRAY), buf_arr(&b, GGUF_TYPE_STRING, 2);
	buf_str(&b, "ok"), buf_u64(&b, 1ull << 62), buf_zeros(&b, 8);
	expect_fail(&b, GGUF_E_TRUNCATED, "key 'a'");
	buf_free(&b);
}
END_TEST

START_TEST(test_value_types)
{
	Buf b = { 0 };
	/* unknown value type */
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "x", 13), buf_u64(&b, 0);
	expect_fail(&b, GGUF_E_TYPE, "key 'x'");
	buf_free(&b);
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "x", UINT32_MAX), buf_u64(&b, 0);
	expect_fail(&b, GGUF_E_TYPE, "4294967295");
	buf_free(&b);
	/* unknown array element type, at the top and nested */
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "x", GGUF_TYPE_ARRAY), buf_arr(&b, 13, 0);
	expect_fail(&b, GGUF_E_TYPE, "key 'x'");
	buf_free(&b);
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "x", GGUF_TYPE_ARRAY), buf_arr(&b, GGUF_TYPE_ARRAY, 1), buf_arr(&b, 99, 1), buf_u64(&b, 0);
	expect_fail(&b, GGUF_E_TYPE, "key 'x'");
	buf_free(&b);

	/* nesting: depth 8 is accepted, 9 is not */
	for (int depth = 8; depth <= 9; depth++) {
		buf_header(&b, 3, 0, 1);
		buf_key(&b, "deep", GGUF_TYPE_ARRAY);
		for (int d = 1; d < depth; d++)
			buf_arr(&b, GGUF_TYPE_ARRAY, 1);
		buf_arr(&b, GGUF_TYPE_UINT8, 1), buf_u8(&b, 7);
		if (depth == 8) {
			Gguf *g = open_ok(&b);
			GgufArray a;
			ck_assert_int_eq(gguf_get_arr(g, "deep", &a), 0);
			ck_assert_uint_eq(a.type, GGUF_TYPE_ARRAY);
			gguf_free(g);
		} else {
			expect_fail(&b, GGUF_E_LIMIT, "nested");
		}
		buf_free(&b);
	}
	/* empty arrays are fine */
	buf_header(&b, 3, 0, 2);
	buf_key(&b, "e", GGUF_TYPE_ARRAY), buf_arr(&b, GGUF_TYPE_STRING, 0);
	buf_key(&b, "f", GGUF_TYPE_ARRAY), buf_arr(&b, GGUF_TYPE_FLOAT32, 0);
	Gguf *g = open_ok(&b);
	GgufArray a;
	ck_assert_int_eq(gguf_get_arr(g, "e", &a), 0);
	ck_assert_uint_eq(a.n, 0);
	gguf_free(g);
	buf_free(&b);
}
END_TEST

START_TEST(test_duplicates)
{
	Buf b = { 0 };
	buf_header(&b, 3, 0, 3);
	buf_key(&b, "general.name", GGUF_TYPE_STRING), buf_str(&b, "a");
	buf_key(&b, "x", GGUF_TYPE_UINT8), buf_u8(&b, 1);
	buf_key(&b, "general.name", GGUF_TYPE_UINT32), buf_u32(&b, 2);
	expect_fail(&b, GGUF_E_DUPLICATE, "duplicate key 'general.name'");
	buf_free(&b);

	/* keys that differ only in length or last byte are not duplicates */
	buf_header(&b, 3, 0, 3);
	buf_key(&b, "ab", GGUF_TYPE_UINT8), buf_u8(&b, 1);
	buf_key(&b, "abc", GGUF_TYPE_UINT8), buf_u8(&b, 2);
	buf_key(&b, "abd", GGUF_TYPE_UINT8), buf_u8(&b, 3);
	Gguf *g = open_ok(&b);
	uint32_t v;
	ck_assert_int_eq(gguf_get_u32(g, "abd", &v), 0); ck_assert_uint_eq(v, 3);
	ck_assert_int_eq(gguf_get_u32(g, "ab", &v), 0); ck_assert_uint_eq(v, 1);
	gguf_free(g);
	buf_free(&b);

	TSpec t[] = {
		{ "blk.0.attn_q.weight", 1, { 8 }, WTYPE_F32, 0 },
		{ "blk.0.attn_q.weight", 1, { 8 }, WTYPE_F32, 32 },
	};
	buf_tensor_file(&b, t, 2, 64);
	expect_fail(&b, GGUF_E_DUPLICATE, "duplicate tensor name 'blk.0.attn_q.weight'");
	buf_free(&b);
}
END_TEST

/* ---- tensors ---- */

START_TEST(test_tensor_shapes)
{
	Buf b = { 0 };
	TSpec t;

	t = (TSpec){ "blk.0.attn_q.weight", 0, { 8 }, WTYPE_F32, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "tensor 'blk.0.attn_q.weight': n_dims 0");
	buf_free(&b);
	t = (TSpec){ "blk.0.attn_q.weight", 5, { 1, 1, 1, 1, 1 }, WTYPE_F32, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "n_dims 5");
	buf_free(&b);
	t = (TSpec){ "z", 2, { 8, 0 }, WTYPE_F32, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "ne[1]");
	buf_free(&b);
	t = (TSpec){ "neg", 1, { (uint64_t)-8 }, WTYPE_F32, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "ne[0]");
	buf_free(&b);
	/* element count overflows int64, row bytes overflow u64 */
	t = (TSpec){ "big", 4, { 1ull << 20, 1ull << 20, 1ull << 20, 1ull << 20 }, WTYPE_F32, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "overflows");
	buf_free(&b);
	t = (TSpec){ "wide", 1, { 1ull << 62 }, WTYPE_F32, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "'wide'");
	buf_free(&b);
	t = (TSpec){ "wideq", 2, { 1ull << 61, 3 }, WTYPE_Q8_K, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "'wideq'");
	buf_free(&b);

	/* type */
	t = (TSpec){ "blk.3.ffn_up.weight", 1, { 32 }, 99, 0 };
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TYPE, "tensor 'blk.3.ffn_up.weight': unknown tensor type 99");
	buf_free(&b);
	t = (TSpec){ "t4", 1, { 32 }, 4, 0 }; /* Q4_2: removed from ggml long ago */
	buf_tensor_file(&b, &t, 1, 64);
	expect_fail(&b, GGUF_E_TYPE, "type 4");
	buf_free(&b);

	/* ne[0] must be whole blocks */
	t = (TSpec){ "q", 2, { 16, 2 }, WTYPE_Q8_0, 0 };
	buf_tensor_file(&b, &t, 1, 128);
	expect_fail(&b, GGUF_E_TENSOR, "ne[0] = 16");
	buf_free(&b);
	t = (TSpec){ "k", 1, { 128 }, WTYPE_Q6_K, 0 };
	buf_tensor_file(&b, &t, 1, 256);
	expect_fail(&b, GGUF_E_TENSOR, "'k'");
	buf_free(&b);

	/* every type in the block table: size = ne[0] / block * bytes * rows */
	static const struct { uint32_t type, elems, bytes; } tab[] = {
		{ 0, 1, 4 }, { 1, 1, 2 }, { 30, 1, 2 }, { 2, 32, 18 }, { 3, 32, 20 },
		{ 6, 32, 22 }, { 7, 32, 24 }, { 8, 32, 34 }, { 9, 32, 36 }, { 10, 256, 84 },
		{ 11, 256, 110 }, { 12, 256, 144 }, { 13, 256, 176 }, { 14, 256, 210 }, { 15, 256, 292 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(tab); i++) {
		uint64_t size = (uint64_t)2 * tab[i].bytes * 3 * 2;
		t = (TSpec){ "x", 4, { 2 * tab[i].elems, 3, 2, 1 }, tab[i].type, 0 };
		buf_tensor_file(&b, &t, 1, size);
		Gguf *g = open_ok(&b);
		const GgufTensor *gt = gguf_tensor(g, 0);
		ck_assert_msg(gt->size == size, "type %u: size %llu want %llu", tab[i].type,
			      (unsigned long long)gt->size, (unsigned long long)size);
		ck_assert_uint_eq(gt->n_dims, 4);
		ck_assert_uint_eq(gt->ne[1], 3);
		gguf_free(g);
		buf_free(&b);
		/* one byte short */
		buf_tensor_file(&b, &t, 1, size - 1);
		expect_fail(&b, GGUF_E_TENSOR, "extends past end of file");
		buf_free(&b);
	}
}
END_TEST

START_TEST(test_tensor_placement)
{
	Buf b = { 0 };
	TSpec t[2];

	/* out of bounds: message names the tensor, the span and the file size */
	t[0] = (TSpec){ "blk.0.attn_q.weight", 1, { 16 }, WTYPE_F32, 32 };
	buf_tensor_file(&b, t, 1, 64);
	char want[160];
	size_t start = b.len - 64 + 32;
	snprintf(want, sizeof(want), "tensor 'blk.0.attn_q.weight': data [%zu, %zu) extends past end of file (size %zu)",
		 start, start + 64, b.len);
	expect_fail(&b, GGUF_E_TENSOR, want);
	buf_free(&b);
	/* offsets near 2^64 */
	t[0] = (TSpec){ "far", 1, { 8 }, WTYPE_F32, UINT64_MAX - 31 };
	buf_tensor_file(&b, t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "'far'");
	buf_free(&b);
	t[0] = (TSpec){ "far2", 1, { 8 }, WTYPE_F32, 1ull << 62 };
	buf_tensor_file(&b, t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "extends past end");
	buf_free(&b);

	/* misaligned */
	t[0] = (TSpec){ "m", 1, { 8 }, WTYPE_F32, 4 };
	buf_tensor_file(&b, t, 1, 64);
	expect_fail(&b, GGUF_E_TENSOR, "tensor 'm': offset 4 is not a multiple of the alignment 32");
	buf_free(&b);

	/* overlap: second starts inside the first; identical spans; gap is fine */
	t[0] = (TSpec){ "a", 1, { 16 }, WTYPE_F32, 0 };  /* [0, 64) */
	t[1] = (TSpec){ "b", 1, { 8 }, WTYPE_F32, 32 };  /* [32, 64) */
	buf_tensor_file(&b, t, 2, 128);
	expect_fail(&b, GGUF_E_TENSOR, "overlap");
	buf_free(&b);
	t[0] = (TSpec){ "a", 1, { 8 }, WTYPE_F32, 32 };
	t[1] = (TSpec){ "b", 1, { 8 }, WTYPE_F32, 32 };
	buf_tensor_file(&b, t, 2, 128);
	expect_fail(&b, GGUF_E_TENSOR, "overlap");
	buf_free(&b);
	t[0] = (TSpec){ "a", 1, { 9 }, WTYPE_F32, 64 }; /* [64, 100) */
	t[1] = (TSpec){ "b", 1, { 8 }, WTYPE_F32, 0 };  /* [0, 32) */
	buf_tensor_file(&b, t, 2, 100);
	Gguf *g = open_ok(&b);
	ck_assert_ptr_eq(gguf_find_tensor(g, "a")->data, b.p + gguf_data_offset(g) + 64);
	ck_assert_ptr_eq(gguf_find_tensor(g, "b")->data, b.p + gguf_data_offset(g));
	ck_assert_uint_eq(gguf_data_offset(g) + 100, b.len);
	gguf_free(g);
	buf_free(&b);
	/* touching spans do not overlap */
	t[0] = (TSpec){ "a", 1, { 8 }, WTYPE_F32, 0 };
	t[1] = (TSpec){ "b", 1, { 8 }, WTYPE_F32, 32 };
	buf_tensor_file(&b, t, 2, 64);
	g = open_ok(&b);
	gguf_free(g);
	buf_free(&b);
}
END_TEST

START_TEST(test_alignment)
{
	Buf b = { 0 };
	static const uint32_t bad[] = { 0, 3, 48, 0x80000001u };
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		buf_header(&b, 3, 0, 1);
		buf_key(&b, "general.alignment", GGUF_TYPE_UINT32), buf_u32(&b, bad[i]);
		expect_fail(&b, GGUF_E_LIMIT, "general.alignment");
		buf_free(&b);
	}
	buf_header(&b, 3, 0, 1);
	buf_key(&b, "general.alignment", GGUF_TYPE_UINT64), buf_u64(&b, 32);
	expect_fail(&b, GGUF_E_TYPE, "general.alignment");
	buf_free(&b);

	/* alignment 64: the data section starts at a multiple of 64 and 32-aligned offsets are refused */
	for (int off = 32; off <= 64; off += 32) {
		buf_header(&b, 3, 1, 1);
		buf_key(&b, "general.alignment", GGUF_TYPE_UINT32), buf_u32(&b, 64);
		uint64_t ne[1] = { 8 };
		buf_tensor(&b, "t", 1, ne, WTYPE_F32, (uint64_t)off);
		size_t end = b.len;
		buf_pad(&b, 64);
		size_t data = b.len;
		ck_assert_uint_ne(end, data); /* the header is not already aligned */
		buf_zeros(&b, 128);
		if (off == 32) {
			expect_fail(&b, GGUF_E_TENSOR, "alignment 64");
		} else {
			Gguf *g = open_ok(&b);
			ck_assert_uint_eq(gguf_alignment(g), 64);
			ck_assert_uint_eq(gguf_data_offset(g), data);
			ck_assert_ptr_eq(gguf_tensor(g, 0)->data, b.p + data + 64);
			gguf_free(g);
		}
		buf_free(&b);
	}
	/* alignment 1: the data section starts right after the infos */
	buf_header(&b, 3, 1, 1);
	buf_key(&b, "general.alignment", GGUF_TYPE_UINT32), buf_u32(&b, 1);
	uint64_t ne[1] = { 3 };
	buf_tensor(&b, "t", 1, ne, WTYPE_F32, 1);
	size_t data = b.len;
	buf_zeros(&b, 13);
	Gguf *g = open_ok(&b);
	ck_assert_uint_eq(gguf_data_offset(g), data);
	ck_assert_ptr_eq(gguf_tensor(g, 0)->data, b.p + data + 1);
	gguf_free(g);
	buf_free(&b);
}
END_TEST

/* ---- files ---- */

START_TEST(test_open_errors)
{
	Error err = { 0 };
	Gguf *g = NULL;
	ck_assert_int_eq(gguf_open("/nonexistent/x.gguf", &g, &err), -ENOENT);
	ck_assert(strstr(err.msg, "/nonexistent/x.gguf"));
	ck_assert_int_eq(gguf_open("/", &g, &err), -EINVAL);
	ck_assert_ptr_null(g);

	char path[] = "/tmp/test-gguf-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(gguf_open(path, &g, &err), GGUF_E_TRUNCATED); /* empty */
	Buf b = { 0 };
	buf_small_valid(&b);
	ck_assert_int_eq(write(fd, b.p, b.len), (ssize_t)b.len);
	ck_assert_int_eq(gguf_open(path, &g, &err), 0);
	ck_assert_uint_eq(gguf_n_tensors(g), 2);
	ck_assert_uint_eq((uintptr_t)gguf_tensor(g, 0)->data % 16, 0);
	g = gguf_free(g);
	ck_assert_ptr_null(g);
	ck_assert_int_eq(ftruncate(fd, (off_t)b.len - 1), 0);
	ck_assert_int_eq(gguf_open(path, &g, &err), GGUF_E_TENSOR);
	close(fd);
	unlink(path);
	buf_free(&b);
	ck_assert_ptr_null(gguf_free(NULL));
}
END_TEST

START_TEST(test_strings)
{
	GgufStr s = { .ptr = "abcdef", .len = 3 };
	ck_assert(gguf_str_eq(s, "abc"));
	ck_assert(!gguf_str_eq(s, "ab"));
	ck_assert(!gguf_str_eq(s, "abcd"));
	char *d = gguf_str_dup(s);
	ck_assert_str_eq(d, "abc");
	free(d);
	d = gguf_str_dup((GgufStr){ .ptr = NULL, .len = 0 });
	ck_assert_str_eq(d, "");
	free(d);
	ck_assert_str_eq(gguf_type_name(GGUF_TYPE_UINT32), "u32");
	ck_assert_str_eq(gguf_type_name(GGUF_TYPE_STRING), "str");
	ck_assert_str_eq(gguf_type_name(GGUF_TYPE_FLOAT64), "f64");
	ck_assert_ptr_nonnull(gguf_type_name(1000));
}
END_TEST

/* The default model, against values gguf-py 0.19.0's GGUFReader reports for it. */
START_TEST(test_default_model)
{
	_cleanup_(gguf_freep) Gguf *g = NULL;
	Error err = { 0 };
	const char *path = test_model_path();
	int r = gguf_open(path, &g, &err);
	ck_assert_msg(r == 0, "%s: %d %s", path, r, err.msg);

	ck_assert_uint_eq(gguf_version(g), 3);
	ck_assert_uint_eq(gguf_n_tensors(g), 272);
	ck_assert_uint_eq(gguf_n_kv(g), 33);
	ck_assert_uint_eq(gguf_alignment(g), 32);
	ck_assert_uint_eq(gguf_file_size(g), 98362432);
	ck_assert_uint_eq(gguf_data_offset(g), 1785664);

	uint32_t u32;
	float f;
	bool bo;
	GgufStr s;
	GgufArray a;
	ck_assert_int_eq(gguf_get_u32(g, "llama.block_count", &u32), 0); ck_assert_uint_eq(u32, 30);
	ck_assert_int_eq(gguf_get_u32(g, "llama.embedding_length", &u32), 0); ck_assert_uint_eq(u32, 576);
	ck_assert_int_eq(gguf_get_u32(g, "llama.context_length", &u32), 0); ck_assert_uint_eq(u32, 8192);
	ck_assert_int_eq(gguf_get_u32(g, "llama.attention.head_count", &u32), 0); ck_assert_uint_eq(u32, 9);
	ck_assert_int_eq(gguf_get_u32(g, "llama.attention.head_count_kv", &u32), 0); ck_assert_uint_eq(u32, 3);
	ck_assert_int_eq(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u32), 0); ck_assert_uint_eq(u32, 1);
	ck_assert_int_eq(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u32), 0); ck_assert_uint_eq(u32, 2);
	ck_assert_int_eq(gguf_get_f32(g, "llama.rope.freq_base", &f), 0); ck_assert_float_eq(f, 100000.0f);
	ck_assert_int_eq(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), 0);
	ck_assert_float_eq(f, 1e-5f);
	ck_assert_int_eq(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bo), 0); ck_assert(!bo);
	ck_assert_int_eq(gguf_get_str(g, "general.architecture", &s), 0); check_str(s, "llama");
	ck_assert_int_eq(gguf_get_str(g, "tokenizer.ggml.model", &s), 0); check_str(s, "gpt2");
	ck_assert_int_eq(gguf_get_u32(g, "general.alignment", &u32), GGUF_E_NOT_FOUND);

	ck_assert_int_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", &a), 0);
	ck_assert_uint_eq(a.type, GGUF_TYPE_STRING);
	ck_assert_uint_eq(a.n, 49152);
	check_str(a.strs[0], "<|endoftext|>");
	check_str(a.strs[49151], "ectable");
	ck_assert_int_eq(gguf_get_arr(g, "tokenizer.ggml.merges", &a), 0);
	ck_assert_uint_eq(a.n, 48900);
	check_str(a.strs[0], "\xc4\xa0 t");
	check_str(a.strs[48899], "ect able");
	ck_assert_int_eq(gguf_get_arr(g, "tokenizer.ggml.token_type", &a), 0);
	ck_assert_uint_eq(a.type, GGUF_TYPE_INT32);
	ck_assert_uint_eq(a.n, 49152);
	int32_t tt;
	memcpy(&tt, a.data, 4);
	ck_assert_int_eq(tt, 3);

	const GgufTensor *t = gguf_find_tensor(g, "token_embd.weight");
	ck_assert_ptr_eq(t, gguf_tensor(g, 0));
	ck_assert_uint_eq(t->type, 8);
	ck_assert_uint_eq(t->n_dims, 2);
	ck_assert_uint_eq(t->ne[0], 576);
	ck_assert_uint_eq(t->ne[1], 49152);
	ck_assert_uint_eq(t->offset, 0);
	ck_assert_uint_eq(t->size, 30081024);
	ck_assert_uint_eq((uintptr_t)t->data % 32, 0);
	ck_assert_uint_eq((uintptr_t)t->data % 4096, 1785664 % 4096); /* the mapping is page aligned */

	t = gguf_find_tensor(g, "blk.0.attn_norm.weight");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->type, WTYPE_F32);
	ck_assert_uint_eq(t->n_dims, 1);
	ck_assert_uint_eq(t->ne[0], 576);
	ck_assert_uint_eq(t->offset, 30081024);
	t = gguf_find_tensor(g, "blk.0.ffn_down.weight");
	ck_assert_uint_eq(t->type, WTYPE_Q4_1);
	ck_assert_uint_eq(t->ne[0], 1536);
	ck_assert_uint_eq(t->ne[1], 576);
	ck_assert_uint_eq(t->size, 552960);
	t = gguf_find_tensor(g, "output_norm.weight");
	ck_assert_uint_eq(t->offset, 96574464);
	ck_assert_ptr_eq((const uint8_t *)t->data + t->size,
			 (const uint8_t *)gguf_tensor(g, 0)->data - 1785664 + 98362432);

	/* every tensor name is found and every kv key is found */
	for (size_t i = 0; i < gguf_n_tensors(g); i++) {
		char *name = gguf_str_dup(gguf_tensor(g, i)->name);
		ck_assert_ptr_eq(gguf_find_tensor(g, name), gguf_tensor(g, i));
		ck_assert_uint_eq((uintptr_t)gguf_tensor(g, i)->data % 32, 0);
		free(name);
	}
	for (size_t i = 0; i < gguf_n_kv(g); i++) {
		char *key = gguf_str_dup(gguf_kv(g, i)->key);
		ck_assert_ptr_eq(gguf_find_kv(g, key), gguf_kv(g, i));
		free(key);
	}
}
END_TEST

static Suite *gguf_suite(void)
{
	Suite *s = suite_create("gguf");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_all_types_v2_v3);
	tcase_add_test(tc, test_integer_edges);
	tcase_add_test(tc, test_gguf_py_fixture);
	tcase_add_test(tc, test_many_tensors_lookup);
	tcase_add_test(tc, test_truncated_every_offset);
	tcase_add_test(tc, test_truncated_fixture);
	tcase_add_test(tc, test_bad_header);
	tcase_add_test(tc, test_absurd_counts);
	tcase_add_test(tc, test_value_types);
	tcase_add_test(tc, test_duplicates);
	tcase_add_test(tc, test_tensor_shapes);
	tcase_add_test(tc, test_tensor_placement);
	tcase_add_test(tc, test_alignment);
	tcase_add_test(tc, test_open_errors);
	tcase_add_test(tc, test_strings);
	tcase_add_test(tc, test_default_model);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(gguf_suite());
}
