/*
 * gguf.h: read-only GGUF (versions 2 and 3) files, memory-mapped.
 *
 * File layout (all little-endian):
 *
 *   u32 magic "GGUF" (0x46554747)   u32 version (2 or 3)
 *   u64 n_tensors                    u64 n_kv
 *   n_kv x  { string key; u32 type; value }
 *   n_tensors x { string name; u32 n_dims (1..4); u64 ne[n_dims];
 *                 u32 ggml_type; u64 offset (relative to data section) }
 *   padding to `general.alignment` (u32, default 32, a power of two)
 *   data section: tensor bytes, each at its offset, offsets aligned
 *
 *   string = u64 len; len bytes (not NUL-terminated)
 *   value  = scalar of its type | string | array { u32 type; u64 n; n x value }
 *
 * Limits (beyond "fits in the file"): keys and tensor names 1..65535 bytes,
 * n_kv and n_tensors <= 2^20, arrays nested at most 8 deep, n_dims 1..4
 * with every ne >= 1, tensor types known to wtype_info() with ne[0] a whole
 * number of blocks, tensor offsets multiples of the alignment, no two
 * tensors overlapping, no duplicate keys or tensor names.
 *
 * Every count, length and offset is checked against the file before use:
 * a malformed file is rejected with GGUF_E_* and a message naming the
 * field. After gguf_open() succeeds, every pointer handed out stays inside
 * the mapping and every tensor's bytes are inside the data section.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

typedef enum GgufValueType {
	GGUF_TYPE_UINT8 = 0,
	GGUF_TYPE_INT8 = 1,
	GGUF_TYPE_UINT16 = 2,
	GGUF_TYPE_INT16 = 3,
	GGUF_TYPE_UINT32 = 4,
	GGUF_TYPE_INT32 = 5,
	GGUF_TYPE_FLOAT32 = 6,
	GGUF_TYPE_BOOL = 7,
	GGUF_TYPE_STRING = 8,
	GGUF_TYPE_ARRAY = 9,
	GGUF_TYPE_UINT64 = 10,
	GGUF_TYPE_INT64 = 11,
	GGUF_TYPE_FLOAT64 = 12,
	GGUF_TYPE_COUNT_,
} GgufValueType;

/* Positive error codes; negative values are -errno. */
enum {
	GGUF_E_TRUNCATED = 1, /* a field runs past the end of the file */
	GGUF_E_MAGIC,         /* not a GGUF file */
	GGUF_E_VERSION,       /* version other than 2 or 3 */
	GGUF_E_LIMIT,         /* a count or length beyond sane limits */
	GGUF_E_TYPE,          /* unknown value type or tensor type */
	GGUF_E_DUPLICATE,     /* a key or tensor name appears twice */
	GGUF_E_TENSOR,        /* bad shape, alignment, bounds or overlap */
	GGUF_E_NOT_FOUND,     /* (lookups) key or tensor absent */
	GGUF_E_WRONG_TYPE,    /* (lookups) present with another type */
};

/* A string inside the mapping: not NUL-terminated. */
typedef struct GgufStr {
	const char *ptr;
	uint64_t len;
} GgufStr;

typedef struct GgufArray {
	uint32_t type;        /* element GgufValueType */
	uint64_t n;
	const void *data;     /* elements, packed, if type is a scalar type */
	const GgufStr *strs;  /* n strings, if type is STRING */
	/* Arrays of arrays are validated (nesting depth <= 8) but not indexed:
	 * type is ARRAY and data and strs are NULL. */
} GgufArray;

typedef struct GgufKv {
	GgufStr key;
	uint32_t type;        /* GgufValueType */
	const void *value;    /* scalar value bytes (unaligned), if scalar */
	GgufStr str;          /* if type == STRING */
	GgufArray arr;        /* if type == ARRAY */
} GgufKv;

typedef struct GgufTensor {
	GgufStr name;
	uint32_t type;        /* WType */
	uint32_t n_dims;
	uint64_t ne[4];       /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
	uint64_t offset;      /* from the start of the data section */
	uint64_t size;        /* bytes */
	const void *data;     /* inside the mapping */
} GgufTensor;

typedef struct Gguf Gguf;

/* Map and validate a file. Returns 0, -errno or GGUF_E_*; err names the problem. */
int gguf_open(const char *path, Gguf **ret, Error *err);

/* Validate an in-memory image (borrowed: must outlive the Gguf). For tests and fuzzing. */
int gguf_open_memory(const void *data, size_t size, Gguf **ret, Error *err);

Gguf *gguf_free(Gguf *g);
DEFINE_FREEP(Gguf, gguf_free)

/*
 * The bytes [p, p + n) of the mapping will not be read again soon (a
 * backend holds its own copy): the whole pages inside go back to the
 * kernel (MADV_DONTNEED), so the copy replaces them in memory instead of
 * adding to it; a later read maps them in again from the file. Nothing
 * happens for an in-memory image or a range outside the mapping.
 */
void gguf_release_range(const Gguf *g, const void *p, size_t n);

uint32_t gguf_version(const Gguf *g);
size_t gguf_file_size(const Gguf *g);
uint32_t gguf_alignment(const Gguf *g);
/* File offset of the data section (tensor offsets are relative to it). */
size_t gguf_data_offset(const Gguf *g);

size_t gguf_n_kv(const Gguf *g);
const GgufKv *gguf_kv(const Gguf *g, size_t i);
const GgufKv *gguf_find_kv(const Gguf *g, const char *key);

size_t gguf_n_tensors(const Gguf *g);
const GgufTensor *gguf_tensor(const Gguf *g, size_t i);
const GgufTensor *gguf_find_tensor(const Gguf *g, const char *name);

/*
 * Typed lookups: 0 on success, GGUF_E_NOT_FOUND if absent,
 * GGUF_E_WRONG_TYPE if the value cannot be represented (integers of any
 * width convert when the value fits; floats accept FLOAT32 and FLOAT64).
 * ret_* is written only on success.
 */
int gguf_get_u32(const Gguf *g, const char *key, uint32_t *ret);
int gguf_get_i64(const Gguf *g, const char *key, int64_t *ret);
int gguf_get_f32(const Gguf *g, const char *key, float *ret);
int gguf_get_bool(const Gguf *g, const char *key, bool *ret);
int gguf_get_str(const Gguf *g, const char *key, GgufStr *ret);
int gguf_get_arr(const Gguf *g, const char *key, GgufArray *ret);

/* Compare a GgufStr with a C string. */
bool gguf_str_eq(GgufStr s, const char *c);

/* Copy into a NUL-terminated malloc'd string (NULL on allocation failure). */
char *gguf_str_dup(GgufStr s);

const char *gguf_type_name(uint32_t value_type);

/*
 * The model's identity for session files and clients: 64-bit FNV-1a
 * (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over the file's
 * bytes [0, gguf_data_offset()): magic, version, counts, every metadata
 * key and value, every tensor's name, shape, type and offset, and the
 * padding before the data section. The weights are not read, so this is
 * fast on large files; the same file under another path, or a copy, has
 * the same fingerprint.
 */
uint64_t gguf_fingerprint(const Gguf *g);
