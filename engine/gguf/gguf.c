/*
 * gguf.c: the GGUF v2/v3 reader.
 *
 * Owns the file mapping, the validated kv and tensor tables and the
 * lookups by key and tensor name. It does not interpret hyperparameters
 * (model.c), tokenizer tables (tokenizer.c) or tensor bytes (wtype.c); it
 * only asks wtype_info() for each tensor type's block layout.
 *
 * Parsing is one forward pass over the image with a bounds-checked cursor,
 * followed by a pass over the tensor table once the data section start is
 * known. Nothing is allocated from a count before the count has been
 * checked against the bytes left in the file, so a header that lies costs
 * at most a few times the file's size, never 2^64.
 *
 * The mapping is MAP_PRIVATE and read-only. As with any mmap reader, a
 * file truncated by another process after gguf_open() faults on access;
 * we do not guard against that.
 */
#include <assert.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf/gguf.h"
#include "kernels/wtype.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian fields in place"
#endif
static_assert(SIZE_MAX >= UINT64_MAX, "gguf.c assumes a 64-bit size_t");

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_HEADER_BYTES 24u
#define GGUF_MAX_KEY_LEN 65535u     /* spec: keys are at most 2^16 - 1 bytes */
#define GGUF_MAX_NAME_LEN 65535u
#define GGUF_MAX_DIMS 4u
#define GGUF_MAX_ARRAY_DEPTH 8u     /* arrays of arrays, nested this deep at most */
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_TENSORS (1u << 20)

/* Least bytes one entry can take in the file, for plausibility checks. */
#define GGUF_MIN_KV_BYTES 14u     /* key len 8 + key 1 + type 4 + u8 value 1 */
#define GGUF_MIN_TENSOR_BYTES 33u /* name len 8 + name 1 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define GGUF_MIN_STR_BYTES 8u     /* length only */
#define GGUF_MIN_ARRAY_BYTES 12u  /* element type 4 + count 8 */

/* Room for a name in an error message: escaped, cut at 64 bytes. */
#define SHOW_MAX 96

struct Gguf {
	const uint8_t *base;    /* image: the mapping or the caller's buffer */
	size_t size;            /* image bytes */
	void *map;              /* from mmap (gguf_open), else NULL */
	uint32_t version;
	uint32_t alignment;
	size_t data_offset;     /* data section start: align(end of tensor infos) */

	size_t n_kv;
	GgufKv *kvs;            /* (n_kv,) in file order */
	size_t n_tensors;
	GgufTensor *tensors;    /* (n_tensors,) in file order */

	/* Open-addressing hash tables: slot -> entry index + 1, 0 is empty. */
	uint32_t *kv_slots;     /* (kv_mask + 1,) */
	size_t kv_mask;
	uint32_t *tensor_slots; /* (tensor_mask + 1,) */
	size_t tensor_mask;
};

static const uint8_t value_bytes[GGUF_TYPE_COUNT_] = {
	[GGUF_TYPE_UINT8] = 1,   [GGUF_TYPE_INT8] = 1,
	[GGUF_TYPE_UINT16] = 2,  [GGUF_TYPE_INT16] = 2,
	[GGUF_TYPE_UINT32] = 4,  [GGUF_TYPE_INT32] = 4,
	[GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,
	[GGUF_TYPE_STRING] = 0,  [GGUF_TYPE_ARRAY] = 0,
	[GGUF_TYPE_UINT64] = 8,  [GGUF_TYPE_INT64] = 8,
	[GGUF_TYPE_FLOAT64] = 8,
};

static bool type_is_scalar(uint32_t t)
{
	return t < GGUF_TYPE_COUNT_ && value_bytes[t] != 0;
}

/* ---- cursor: every read is checked against the end of the image ---- */

typedef struct Cursor {
	const uint8_t *base;
	size_t size;
	size_t pos;             /* invariant: pos <= size */
} Cursor;

static size_t cursor_left(const Cursor *c)
{
	return c->size - c->pos;
}

static bool cursor_take(Cursor *c, size_t n, const uint8_t **ret)
{
	if (n > cursor_left(c))
		return false;
	*ret = c->base + c->pos;
	c->pos += n;
	return true;
}

static bool cursor_u32(Cursor *c, uint32_t *ret)
{
	const uint8_t *p;
	if (!cursor_take(c, sizeof(*ret), &p))
		return false;
	memcpy(ret, p, sizeof(*ret));
	return true;
}

static bool cursor_u64(Cursor *c, uint64_t *ret)
{
	const uint8_t *p;
	if (!cursor_take(c, sizeof(*ret), &p))
		return false;
	memcpy(ret, p, sizeof(*ret));
	return true;
}

/* A printable copy of s for messages: non-printable bytes as \xNN, cut at 64. */
static const char *str_show(GgufStr s, char *buf)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	for (uint64_t i = 0; i < s.len; i++) {
		unsigned char ch = (unsigned char)s.ptr[i];
		if (o + 8 > SHOW_MAX || i >= 64) {
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\') {
			buf[o++] = (char)ch;
		} else {
			buf[o++] = '\\';
			buf[o++] = 'x';
			buf[o++] = hex[ch >> 4];
			buf[o++] = hex[ch & 15];
		}
	}
	buf[o] = '\0';
	return buf;
}

/*
 * Read a string: u64 length, then the bytes. max_len 0 means "whatever
 * fits in the file". what names the field for messages.
 */
static int cursor_str(Cursor *c, uint64_t max_len, const char *what, GgufStr *ret, Error *err)
{
	uint64_t len;
	const uint8_t *p;
	size_t at = c->pos;

	if (!cursor_u64(c, &len))
		return error_set(err, GGUF_E_TRUNCATED, "%s: length at offset %zu runs past end of file (size %zu)",
				 what, at, c->size);
	if (max_len && len > max_len)
		return error_set(err, GGUF_E_LIMIT, "%s: length %llu at offset %zu exceeds the limit %llu",
				 what, (unsigned long long)len, at, (unsigned long long)max_len);
	if (!cursor_take(c, len, &p))
		return error_set(err, GGUF_E_TRUNCATED,
				 "%s: string of %llu bytes at offset %zu runs past end of file (size %zu)",
				 what, (unsigned long long)len, at, c->size);
	*ret = (GgufStr){ .ptr = (const char *)p, .len = len };
	return 0;
}

/* ---- values ---- */

static int value_skip(Cursor *c, uint32_t type, unsigned depth, const char *what, Error *err);

/*
 * Validate n elements of type elem (an array body) and step over them.
 * depth is the nesting level of the array they belong to (1 = a kv's array).
 */
static int array_skip(Cursor *c, uint32_t elem, uint64_t n, unsigned depth, const char *what, Error *err)
{
	size_t at = c->pos;
	const uint8_t *p;
	int r;

	if (elem >= GGUF_TYPE_COUNT_)
		return error_set(err, GGUF_E_TYPE, "%s: unknown array element type %u", what, elem);

	if (type_is_scalar(elem)) {
		size_t esz = value_bytes[elem];
		if (n > cursor_left(c) / esz || !cursor_take(c, n * esz, &p))
			return error_set(err, GGUF_E_TRUNCATED,
					 "%s: array of %llu %s at offset %zu runs past end of file (size %zu)",
					 what, (unsigned long long)n, gguf_type_name(elem), at, c->size);
		return 0;
	}

	size_t min_bytes = elem == GGUF_TYPE_STRING ? GGUF_MIN_STR_BYTES : GGUF_MIN_ARRAY_BYTES;
	if (n > cursor_left(c) / min_bytes)
		return error_set(err, GGUF_E_LIMIT,
				 "%s: array of %llu %s at offset %zu cannot fit in the file (size %zu)",
				 what, (unsigned long long)n, gguf_type_name(elem), at, c->size);
	if (elem == GGUF_TYPE_ARRAY && depth >= GGUF_MAX_ARRAY_DEPTH)
		return error_set(err, GGUF_E_LIMIT, "%s: arrays nested deeper than %u", what,
				 GGUF_MAX_ARRAY_DEPTH);

	/* n <= file size / 8 here, so this loop is bounded by the file. */
	for (uint64_t i = 0; i < n; i++) {
		r = value_skip(c, elem, depth, what, err);
		if (r)
			return r;
	}
	return 0;
}

/* Validate one value of the given type and step over it. */
static int value_skip(Cursor *c, uint32_t type, unsigned depth, const char *what, Error *err)
{
	const uint8_t *p;
	size_t at = c->pos;
	uint32_t elem;
	uint64_t n;
	GgufStr s;

	if (type >= GGUF_TYPE_COUNT_)
		return error_set(err, GGUF_E_TYPE, "%s: unknown value type %u", what, type);
	if (type_is_scalar(type)) {
		if (!cursor_take(c, value_bytes[type], &p))
			return error_set(err, GGUF_E_TRUNCATED,
					 "%s: %s value at offset %zu runs past end of file (size %zu)",
					 what, gguf_type_name(type), at, c->size);
		return 0;
	}
	if (type == GGUF_TYPE_STRING)
		return cursor_str(c, 0, what, &s, err);

	if (!cursor_u32(c, &elem) || !cursor_u64(c, &n))
		return error_set(err, GGUF_E_TRUNCATED,
				 "%s: array header at offset %zu runs past end of file (size %zu)",
				 what, at, c->size);
	return array_skip(c, elem, n, depth + 1, what, err);
}

/* Parse the array value of a kv (after its type) into kv->arr. */
static int kv_parse_array(Cursor *c, GgufKv *kv, const char *what, Error *err)
{
	size_t at = c->pos, start;
	uint32_t elem;
	uint64_t n;
	int r;

	if (!cursor_u32(c, &elem) || !cursor_u64(c, &n))
		return error_set(err, GGUF_E_TRUNCATED,
				 "%s: array header at offset %zu runs past end of file (size %zu)",
				 what, at, c->size);
	start = c->pos;
	r = array_skip(c, elem, n, 1, what, err);
	if (r)
		return r;

	kv->arr.type = elem;
	kv->arr.n = n;
	if (type_is_scalar(elem)) {
		kv->arr.data = c->base + start;
	} else if (elem == GGUF_TYPE_STRING) {
		/* Validated above: n strings lie in [start, c->pos). Index them. */
		Cursor sc = { .base = c->base, .size = c->pos, .pos = start };
		GgufStr *strs = malloc_array(n, sizeof(*strs));
		if (!strs)
			return error_set(err, -ENOMEM, "%s: no memory for %llu strings", what,
					 (unsigned long long)n);
		for (uint64_t i = 0; i < n; i++) {
			r = cursor_str(&sc, 0, what, &strs[i], err);
			if (r) {
				free(strs);
				return r;
			}
		}
		kv->arr.strs = strs;
	}
	/* Nested arrays: validated, exposed as type ARRAY with no element data. */
	return 0;
}

/* Parse kv number i at the cursor. On failure nothing is left allocated in kv. */
static int kv_parse(Cursor *c, size_t i, GgufKv *kv, Error *err)
{
	char what[SHOW_MAX + 32], show[SHOW_MAX + 1];
	const uint8_t *p;
	size_t at;
	int r;

	snprintf(what, sizeof(what), "kv %zu key", i);
	*kv = (GgufKv){ 0 };
	r = cursor_str(c, GGUF_MAX_KEY_LEN, what, &kv->key, err);
	if (r)
		return r;
	if (kv->key.len == 0)
		return error_set(err, GGUF_E_LIMIT, "kv %zu: empty key", i);

	snprintf(what, sizeof(what), "key '%s'", str_show(kv->key, show));
	at = c->pos;
	if (!cursor_u32(c, &kv->type))
		return error_set(err, GGUF_E_TRUNCATED, "%s: type at offset %zu runs past end of file (size %zu)",
				 what, at, c->size);
	if (kv->type >= GGUF_TYPE_COUNT_)
		return error_set(err, GGUF_E_TYPE, "%s: unknown value type %u", what, kv->type);

	at = c->pos;
	if (type_is_scalar(kv->type)) {
		if (!cursor_take(c, value_bytes[kv->type], &p))
			return error_set(err, GGUF_E_TRUNCATED,
					 "%s: %s value at offset %zu runs past end of file (size %zu)",
					 what, gguf_type_name(kv->type), at, c->size);
		kv->value = p;
		return 0;
	}
	if (kv->type == GGUF_TYPE_STRING)
		return cursor_str(c, 0, what, &kv->str, err);
	return kv_parse_array(c, kv, what, err);
}

/* ---- lookup tables ---- */

static uint64_t hash_bytes(const char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static bool str_eq_mem(GgufStr s, const char *p, size_t n)
{
	return s.len == n && memcmp(s.ptr, p, n) == 0;
}

/* Slot table for n entries: a power of two at least twice n. */
static uint32_t *slots_new(size_t n, size_t *ret_mask)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap *= 2;
	uint32_t *slots = calloc(cap, sizeof(*slots));
	if (slots)
		*ret_mask = cap - 1;
	return slots;
}

/*
 * Insert entry idx with name s; returns 0, or the index + 1 of an entry
 * with the same name already present.
 */
static uint32_t slots_insert(uint32_t *slots, size_t mask, GgufStr s, uint32_t idx,
			     GgufStr (*name_of)(const Gguf *, uint32_t), const Gguf *g)
{
	size_t h = hash_bytes(s.ptr, s.len) & mask;
	while (slots[h]) {
		GgufStr o = name_of(g, slots[h] - 1);
		if (str_eq_mem(o, s.ptr, s.len))
			return slots[h];
		h = (h + 1) & mask;
	}
	slots[h] = idx + 1;
	return 0;
}

static uint32_t slots_find(const uint32_t *slots, size_t mask, const char *name,
			   GgufStr (*name_of)(const Gguf *, uint32_t), const Gguf *g)
{
	size_t n = strlen(name);
	size_t h = hash_bytes(name, n) & mask;
	while (slots[h]) {
		if (str_eq_mem(name_of(g, slots[h] - 1), name, n))
			return slots[h];
		h = (h + 1) & mask;
	}
	return 0;
}

static GgufStr kv_name(const Gguf *g, uint32_t i)
{
	return g->kvs[i].key;
}

static GgufStr tensor_name(const Gguf *g, uint32_t i)
{
	return g->tensors[i].name;
}

/* ---- tensors ---- */

/* Parse tensor info i: name, shape, type, offset; checks what needs no data section. */
static int tensor_parse(Cursor *c, size_t i, uint32_t alignment, GgufTensor *t, Error *err)
{
	char what[SHOW_MAX + 32], show[SHOW_MAX + 1];
	const WTypeInfo *info;
	uint64_t nrows = 1, nelems;
	size_t at;
	int r;

	snprintf(what, sizeof(what), "tensor %zu name", i);
	*t = (GgufTensor){ .ne = { 1, 1, 1, 1 } };
	r = cursor_str(c, GGUF_MAX_NAME_LEN, what, &t->name, err);
	if (r)
		return r;
	if (t->name.len == 0)
		return error_set(err, GGUF_E_TENSOR, "tensor %zu: empty name", i);
	snprintf(what, sizeof(what), "tensor '%s'", str_show(t->name, show));

	at = c->pos;
	if (!cursor_u32(c, &t->n_dims))
		return error_set(err, GGUF_E_TRUNCATED, "%s: n_dims at offset %zu runs past end of file (size %zu)",
				 what, at, c->size);
	if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
		return error_set(err, GGUF_E_TENSOR, "%s: n_dims %u (expected 1..%u)", what, t->n_dims,
				 GGUF_MAX_DIMS);
	for (uint32_t d = 0; d < t->n_dims; d++) {
		at = c->pos;
		if (!cursor_u64(c, &t->ne[d]))
			return error_set(err, GGUF_E_TRUNCATED,
					 "%s: ne[%u] at offset %zu runs past end of file (size %zu)",
					 what, d, at, c->size);
		/* ggml stores ne as int64; empty tensors are never weights we use. */
		if (t->ne[d] == 0 || t->ne[d] > INT64_MAX)
			return error_set(err, GGUF_E_TENSOR, "%s: ne[%u] = %llu out of range", what, d,
					 (unsigned long long)t->ne[d]);
	}
	at = c->pos;
	if (!cursor_u32(c, &t->type) || !cursor_u64(c, &t->offset))
		return error_set(err, GGUF_E_TRUNCATED,
				 "%s: type/offset at offset %zu runs past end of file (size %zu)",
				 what, at, c->size);

	info = wtype_info(t->type);
	if (!info || info->block_elems == 0 || info->block_bytes == 0)
		return error_set(err, GGUF_E_TYPE, "%s: unknown tensor type %u", what, t->type);
	if (t->ne[0] % info->block_elems)
		return error_set(err, GGUF_E_TENSOR, "%s: ne[0] = %llu is not a multiple of the %s block size %u",
				 what, (unsigned long long)t->ne[0], info->name, info->block_elems);
	for (uint32_t d = 1; d < t->n_dims; d++)
		if (__builtin_mul_overflow(nrows, t->ne[d], &nrows))
			goto too_big;
	if (__builtin_mul_overflow(nrows, t->ne[0], &nelems) || nelems > INT64_MAX)
		goto too_big;
	/* (ne[0] / block_elems) * block_bytes may exceed ne[0]: check it too. */
	uint64_t row_bytes;
	if (__builtin_mul_overflow(t->ne[0] / info->block_elems, (uint64_t)info->block_bytes, &row_bytes) ||
	    __builtin_mul_overflow(row_bytes, nrows, &t->size))
		goto too_big;
	if (t->offset % alignment)
		return error_set(err, GGUF_E_TENSOR, "%s: offset %llu is not a multiple of the alignment %u",
				 what, (unsigned long long)t->offset, alignment);
	return 0;

too_big:
	return error_set(err, GGUF_E_TENSOR, "%s: shape [%llu, %llu, %llu, %llu] of type %s overflows",
			 what, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
			 (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], info->name);
}

typedef struct TensorSpan {
	uint64_t offset;
	uint64_t size;
	size_t index;
} TensorSpan;

static int span_cmp(const void *a, const void *b)
{
	const TensorSpan *x = a, *y = b;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return x->index < y->index ? -1 : x->index > y->index;
}

/* Bounds against the data section, then no two tensors overlapping. */
static int tensors_place(Gguf *g, Error *err)
{
	char show[SHOW_MAX + 1], show2[SHOW_MAX + 1];
	_cleanup_(freep) TensorSpan *spans = NULL;

	for (size_t i = 0; i < g->n_tensors; i++) {
		GgufTensor *t = &g->tensors[i];
		uint64_t start, end;
		if (__builtin_add_overflow((uint64_t)g->data_offset, t->offset, &start) ||
		    __builtin_add_overflow(start, t->size, &end))
			return error_set(err, GGUF_E_TENSOR, "tensor '%s': offset %llu + size %llu overflows",
					 str_show(t->name, show), (unsigned long long)t->offset,
					 (unsigned long long)t->size);
		if (end > g->size)
			return error_set(err, GGUF_E_TENSOR,
					 "tensor '%s': data [%llu, %llu) extends past end of file (size %zu)",
					 str_show(t->name, show), (unsigned long long)start,
					 (unsigned long long)end, g->size);
		t->data = g->base + start;
	}

	spans = malloc_array(g->n_tensors, sizeof(*spans));
	if (!spans)
		return error_set(err, -ENOMEM, "no memory for %zu tensor spans", g->n_tensors);
	for (size_t i = 0; i < g->n_tensors; i++)
		spans[i] = (TensorSpan){ g->tensors[i].offset, g->tensors[i].size, i };
	qsort(spans, g->n_tensors, sizeof(*spans), span_cmp);
	for (size_t i = 1; i < g->n_tensors; i++) {
		const TensorSpan *a = &spans[i - 1], *b = &spans[i];
		if (a->offset + a->size > b->offset)
			return error_set(err, GGUF_E_TENSOR,
					 "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data section",
					 str_show(g->tensors[a->index].name, show), (unsigned long long)a->offset,
					 (unsigned long long)(a->offset + a->size),
					 str_show(g->tensors[b->index].name, show2), (unsigned long long)b->offset,
					 (unsigned long long)(b->offset + b->size));
	}
	return 0;
}

/* ---- whole file ---- */

static int header_parse(Gguf *g, Cursor *c, uint64_t *ret_n_tensors, uint64_t *ret_n_kv, Error *err)
{
	uint32_t magic, version;
	uint64_t n_tensors, n_kv, need;

	if (!cursor_u32(c, &magic))
		return error_set(err, GGUF_E_TRUNCATED, "file of %zu bytes is too short for a GGUF header", c->size);
	if (magic != GGUF_MAGIC)
		return error_set(err, GGUF_E_MAGIC, "bad magic 0x%08x (expected \"GGUF\")", magic);
	if (!cursor_u32(c, &version))
		return error_set(err, GGUF_E_TRUNCATED, "file of %zu bytes is too short for a GGUF header", c->size);
	if (version == 0x02000000u || version == 0x03000000u)
		return error_set(err, GGUF_E_VERSION, "big-endian GGUF files are not supported");
	if (version != 2 && version != 3)
		return error_set(err, GGUF_E_VERSION, "GGUF version %u (expected 2 or 3)", version);
	if (!cursor_u64(c, &n_tensors) || !cursor_u64(c, &n_kv))
		return error_set(err, GGUF_E_TRUNCATED, "file of %zu bytes is too short for a GGUF header", c->size);

	if (n_kv > GGUF_MAX_KV)
		return error_set(err, GGUF_E_LIMIT, "n_kv %llu exceeds the limit %u", (unsigned long long)n_kv,
				 GGUF_MAX_KV);
	if (n_tensors > GGUF_MAX_TENSORS)
		return error_set(err, GGUF_E_LIMIT, "n_tensors %llu exceeds the limit %u",
				 (unsigned long long)n_tensors, GGUF_MAX_TENSORS);
	/* Both are < 2^20 now: this cannot overflow. */
	need = n_kv * GGUF_MIN_KV_BYTES + n_tensors * GGUF_MIN_TENSOR_BYTES;
	if (need > cursor_left(c))
		return error_set(err, GGUF_E_LIMIT,
				 "n_kv %llu and n_tensors %llu need at least %llu bytes, file has %zu after the header",
				 (unsigned long long)n_kv, (unsigned long long)n_tensors,
				 (unsigned long long)need, cursor_left(c));
	g->version = version;
	*ret_n_tensors = n_tensors;
	*ret_n_kv = n_kv;
	return 0;
}

static int kvs_parse(Gguf *g, Cursor *c, uint64_t n_kv, Error *err)
{
	char show[SHOW_MAX + 1];
	int r;

	g->kvs = calloc_array(n_kv, sizeof(*g->kvs));
	if (!g->kvs)
		return error_set(err, -ENOMEM, "no memory for %llu kvs", (unsigned long long)n_kv);
	for (size_t i = 0; i < n_kv; i++) {
		r = kv_parse(c, i, &g->kvs[i], err);
		if (r)
			return r;
		g->n_kv = i + 1; /* owns kvs[i]'s string table from now on */
	}

	g->kv_slots = slots_new(g->n_kv, &g->kv_mask);
	if (!g->kv_slots)
		return error_set(err, -ENOMEM, "no memory for the key index");
	for (size_t i = 0; i < g->n_kv; i++) {
		uint32_t dup = slots_insert(g->kv_slots, g->kv_mask, g->kvs[i].key, (uint32_t)i, kv_name, g);
		if (dup)
			return error_set(err, GGUF_E_DUPLICATE, "duplicate key '%s' (kv %u and %zu)",
					 str_show(g->kvs[i].key, show), dup - 1, i);
	}
	return 0;
}

static int alignment_parse(Gguf *g, Error *err)
{
	uint32_t idx = slots_find(g->kv_slots, g->kv_mask, "general.alignment", kv_name, g);
	uint32_t a;

	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	if (!idx)
		return 0;
	const GgufKv *kv = &g->kvs[idx - 1];
	if (kv->type != GGUF_TYPE_UINT32)
		return error_set(err, GGUF_E_TYPE, "key 'general.alignment': type %s (expected u32)",
				 gguf_type_name(kv->type));
	memcpy(&a, kv->value, sizeof(a));
	if (a == 0 || (a & (a - 1)))
		return error_set(err, GGUF_E_LIMIT, "key 'general.alignment': %u is not a power of two", a);
	g->alignment = a;
	return 0;
}

static int tensors_parse(Gguf *g, Cursor *c, uint64_t n_tensors, Error *err)
{
	char show[SHOW_MAX + 1];
	int r;

	g->tensors = calloc_array(n_tensors, sizeof(*g->tensors));
	if (!g->tensors)
		return error_set(err, -ENOMEM, "no memory for %llu tensors", (unsigned long long)n_tensors);
	for (size_t i = 0; i < n_tensors; i++) {
		r = tensor_parse(c, i, g->alignment, &g->tensors[i], err);
		if (r)
			return r;
		g->n_tensors = i + 1;
	}

	g->tensor_slots = slots_new(g->n_tensors, &g->tensor_mask);
	if (!g->tensor_slots)
		return error_set(err, -ENOMEM, "no memory for the tensor index");
	for (size_t i = 0; i < g->n_tensors; i++) {
		uint32_t dup = slots_insert(g->tensor_slots, g->tensor_mask, g->tensors[i].name, (uint32_t)i,
					    tensor_name, g);
		if (dup)
			return error_set(err, GGUF_E_DUPLICATE, "duplicate tensor name '%s' (tensors %u and %zu)",
					 str_show(g->tensors[i].name, show), dup - 1, i);
	}

	/* Data section start: the end of the tensor infos, rounded up. */
	uint64_t a = g->alignment, end = c->pos, data;
	if (__builtin_add_overflow(end, a - 1, &data))
		return error_set(err, GGUF_E_TENSOR, "data section offset overflows");
	g->data_offset = data & ~(a - 1);
	return tensors_place(g, err);
}

/* Validate the image [base, base + size) and build the tables. */
static int gguf_parse(const void *base, size_t size, Gguf **ret, Error *err)
{
	_cleanup_(gguf_freep) Gguf *g = NULL;
	Cursor c = { .base = base, .size = size, .pos = 0 };
	uint64_t n_tensors = 0, n_kv = 0;
	int r;

	g = calloc(1, sizeof(*g));
	if (!g)
		return error_set(err, -ENOMEM, "no memory");
	g->base = base;
	g->size = size;

	r = header_parse(g, &c, &n_tensors, &n_kv, err);
	if (r)
		return r;
	r = kvs_parse(g, &c, n_kv, err);
	if (r)
		return r;
	r = alignment_parse(g, err);
	if (r)
		return r;
	r = tensors_parse(g, &c, n_tensors, err);
	if (r)
		return r;

	*ret = TAKE_PTR(g);
	return 0;
}

int gguf_open_memory(const void *data, size_t size, Gguf **ret, Error *err)
{
	assert(ret);
	if (!data && size)
		return error_set(err, -EINVAL, "NULL image");
	return gguf_parse(data ? data : "", size, ret, err);
}

int gguf_open(const char *path, Gguf **ret, Error *err)
{
	_cleanup_(closep) int fd = -1;
	struct stat st;
	Gguf *g = NULL;
	void *map;
	int r;

	assert(path);
	assert(ret);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		return error_set(err, r, "cannot open %s: %s", path, strerror(-r));
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		return error_set(err, r, "cannot stat %s: %s", path, strerror(-r));
	}
	if (!S_ISREG(st.st_mode))
		return error_set(err, -EINVAL, "%s is not a regular file", path);
	if ((uint64_t)st.st_size < GGUF_HEADER_BYTES)
		return error_set(err, GGUF_E_TRUNCATED, "%s: file of %lld bytes is too short for a GGUF header",
				 path, (long long)st.st_size);

	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		r = -errno;
		return error_set(err, r, "cannot map %s: %s", path, strerror(-r));
	}
	r = gguf_parse(map, (size_t)st.st_size, &g, err);
	if (r) {
		munmap(map, (size_t)st.st_size);
		return r;
	}
	g->map = map;
	*ret = g;
	return 0;
}

Gguf *gguf_free(Gguf *g)
{
	if (!g)
		return NULL;
	for (size_t i = 0; i < g->n_kv; i++)
		free((void *)g->kvs[i].arr.strs);
	free(g->kvs);
	free(g->tensors);
	free(g->kv_slots);
	free(g->tensor_slots);
	if (g->map)
		munmap(g->map, g->size);
	free(g);
	return NULL;
}

void gguf_release_range(const Gguf *g, const void *p, size_t n)
{
	uintptr_t lo = (uintptr_t)p, hi = lo + n, mlo = (uintptr_t)g->map, page = (uintptr_t)sysconf(_SC_PAGESIZE);
	if (!g->map || n == 0 || lo < mlo || hi > mlo + g->size || hi < lo)
		return;
	lo = (lo + page - 1) & ~(page - 1);
	hi &= ~(page - 1);
	if (hi > lo)
		(void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: failure changes nothing */
}

/* ---- accessors ---- */

uint32_t gguf_version(const Gguf *g)
{
	return g->version;
}

size_t gguf_file_size(const Gguf *g)
{
	return g->size;
}

uint32_t gguf_alignment(const Gguf *g)
{
	return g->alignment;
}

size_t gguf_data_offset(const Gguf *g)
{
	return g->data_offset;
}

size_t gguf_n_kv(const Gguf *g)
{
	return g->n_kv;
}

const GgufKv *gguf_kv(const Gguf *g, size_t i)
{
	return i < g->n_kv ? &g->kvs[i] : NULL;
}

const GgufKv *gguf_find_kv(const Gguf *g, const char *key)
{
	uint32_t idx = slots_find(g->kv_slots, g->kv_mask, key, kv_name, g);
	return idx ? &g->kvs[idx - 1] : NULL;
}

size_t gguf_n_tensors(const Gguf *g)
{
	return g->n_tensors;
}

const GgufTensor *gguf_tensor(const Gguf *g, size_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const GgufTensor *gguf_find_tensor(const Gguf *g, const char *name)
{
	uint32_t idx = slots_find(g->tensor_slots, g->tensor_mask, name, tensor_name, g);
	return idx ? &g->tensors[idx - 1] : NULL;
}

/* ---- typed lookups ---- */

/* An integer kv as sign and magnitude; false if kv is not an integer type. */
static bool kv_integer(const GgufKv *kv, bool *ret_neg, uint64_t *ret_mag)
{
	uint8_t u8;
	int8_t i8;
	uint16_t u16;
	int16_t i16;
	uint32_t u32;
	int32_t i32;
	uint64_t u64;
	int64_t i64;
	int64_t s;

	switch (kv->type) {
	case GGUF_TYPE_UINT8:
		memcpy(&u8, kv->value, 1);
		*ret_neg = false, *ret_mag = u8;
		return true;
	case GGUF_TYPE_UINT16:
		memcpy(&u16, kv->value, 2);
		*ret_neg = false, *ret_mag = u16;
		return true;
	case GGUF_TYPE_UINT32:
		memcpy(&u32, kv->value, 4);
		*ret_neg = false, *ret_mag = u32;
		return true;
	case GGUF_TYPE_UINT64:
		memcpy(&u64, kv->value, 8);
		*ret_neg = false, *ret_mag = u64;
		return true;
	case GGUF_TYPE_INT8:
		memcpy(&i8, kv->value, 1);
		s = i8;
		break;
	case GGUF_TYPE_INT16:
		memcpy(&i16, kv->value, 2);
		s = i16;
		break;
	case GGUF_TYPE_INT32:
		memcpy(&i32, kv->value, 4);
		s = i32;
		break;
	case GGUF_TYPE_INT64:
		memcpy(&i64, kv->value, 8);
		s = i64;
		break;
	default:
		return false;
	}
	*ret_neg = s < 0;
	/* -(INT64_MIN) does not fit in int64: negate in unsigned arithmetic. */
	*ret_mag = s < 0 ? 0 - (uint64_t)s : (uint64_t)s;
	return true;
}

int gguf_get_u32(const Gguf *g, const char *key, uint32_t *ret)
{
	const GgufKv *kv = gguf_find_kv(g, key);
	uint64_t mag;
	bool neg;

	if (!kv)
		return GGUF_E_NOT_FOUND;
	if (!kv_integer(kv, &neg, &mag) || neg || mag > UINT32_MAX)
		return GGUF_E_WRONG_TYPE;
	*ret = (uint32_t)mag;
	return 0;
}

int gguf_get_i64(const Gguf *g, const char *key, int64_t *ret)
{
	const GgufKv *kv = gguf_find_kv(g, key);
	uint64_t mag;
	bool neg;

	if (!kv)
		return GGUF_E_NOT_FOUND;
	if (!kv_integer(kv, &neg, &mag))
		return GGUF_E_WRONG_TYPE;
	if (neg) {
		/* mag <= 2^63 always for a negative int64 */
		*ret = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
		return 0;
	}
	if (mag > INT64_MAX)
		return GGUF_E_WRONG_TYPE;
	*ret = (int64_t)mag;
	return 0;
}

int gguf_get_f32(const Gguf *g, const char *key, float *ret)
{
	const GgufKv *kv = gguf_find_kv(g, key);
	float f;
	double d;

	if (!kv)
		return GGUF_E_NOT_FOUND;
	if (kv->type == GGUF_TYPE_FLOAT32) {
		memcpy(&f, kv->value, sizeof(f));
		*ret = f;
		return 0;
	}
	if (kv->type == GGUF_TYPE_FLOAT64) {
		memcpy(&d, kv->value, sizeof(d));
		*ret = (float)d;
		return 0;
	}
	return GGUF_E_WRONG_TYPE;
}

int gguf_get_bool(const Gguf *g, const char *key, bool *ret)
{
	const GgufKv *kv = gguf_find_kv(g, key);

	if (!kv)
		return GGUF_E_NOT_FOUND;
	if (kv->type != GGUF_TYPE_BOOL)
		return GGUF_E_WRONG_TYPE;
	*ret = *(const uint8_t *)kv->value != 0;
	return 0;
}

int gguf_get_str(const Gguf *g, const char *key, GgufStr *ret)
{
	const GgufKv *kv = gguf_find_kv(g, key);

	if (!kv)
		return GGUF_E_NOT_FOUND;
	if (kv->type != GGUF_TYPE_STRING)
		return GGUF_E_WRONG_TYPE;
	*ret = kv->str;
	return 0;
}

int gguf_get_arr(const Gguf *g, const char *key, GgufArray *ret)
{
	const GgufKv *kv = gguf_find_kv(g, key);

	if (!kv)
		return GGUF_E_NOT_FOUND;
	if (kv->type != GGUF_TYPE_ARRAY)
		return GGUF_E_WRONG_TYPE;
	*ret = kv->arr;
	return 0;
}

/* ---- strings and names ---- */

bool gguf_str_eq(GgufStr s, const char *c)
{
	return str_eq_mem(s, c, strlen(c));
}

char *gguf_str_dup(GgufStr s)
{
	char *p;

	if (s.len >= SIZE_MAX)
		return NULL;
	p = malloc(s.len + 1);
	if (!p)
		return NULL;
	if (s.len)
		memcpy(p, s.ptr, s.len);
	p[s.len] = '\0';
	return p;
}

const char *gguf_type_name(uint32_t value_type)
{
	static const char *const names[GGUF_TYPE_COUNT_] = {
		[GGUF_TYPE_UINT8] = "u8",    [GGUF_TYPE_INT8] = "i8",
		[GGUF_TYPE_UINT16] = "u16",  [GGUF_TYPE_INT16] = "i16",
		[GGUF_TYPE_UINT32] = "u32",  [GGUF_TYPE_INT32] = "i32",
		[GGUF_TYPE_FLOAT32] = "f32", [GGUF_TYPE_BOOL] = "bool",
		[GGUF_TYPE_STRING] = "str",  [GGUF_TYPE_ARRAY] = "arr",
		[GGUF_TYPE_UINT64] = "u64",  [GGUF_TYPE_INT64] = "i64",
		[GGUF_TYPE_FLOAT64] = "f64",
	};
	return value_type < GGUF_TYPE_COUNT_ ? names[value_type] : "unknown";
}

uint64_t gguf_fingerprint(const Gguf *g)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < g->data_offset && i < g->size; i++)
		h = (h ^ g->base[i]) * 0x100000001b3ull;
	return h;
}
