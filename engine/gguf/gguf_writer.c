/*
 * gguf_writer.c: the streaming GGUF v3 writer (format in gguf_writer.h).
 *
 * Owns the temporary file, its write buffer, the serialized metadata and
 * the tensor table. Does not know what the tensors mean (the caller
 * generates or converts their bytes) nor how to read GGUF back (gguf.c).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/gguf_writer.h"
#include "kernels/wtype.h"

#define GGUF_MAGIC 0x46554747u
#define GGUF_WRITER_VERSION 3u
#define WRITE_BUF_SIZE ((size_t)1 << 20)
#define MAX_NAME 65535u

typedef struct WriterTensor {
	char *name;
	uint32_t type;
	uint32_t n_dims;
	uint64_t ne[4];
	uint64_t offset; /* in the data section */
	uint64_t size;   /* bytes, before padding */
} WriterTensor;

struct GgufWriter {
	char *path;
	char *tmp_path;
	int fd;              /* PATH.tmp, -1 once closed */
	bool data_started;
	int failed;          /* sticky error of a write, 0 if none */

	uint8_t *kv;         /* serialized metadata key/values */
	size_t kv_len, kv_cap;
	uint64_t n_kv;
	char **keys;         /* (n_kv) for duplicate checks */

	WriterTensor *tensors;
	size_t n_tensors, cap_tensors;
	uint64_t data_size;  /* bytes of the data section so far (declared, padded) */

	size_t cur;          /* tensor being written */
	uint64_t cur_done;   /* its bytes written so far */

	uint8_t *buf;        /* (WRITE_BUF_SIZE) file write buffer */
	size_t buf_len;
};

/* ---- the file ----------------------------------------------------------- */

static int write_all(int fd, const void *data, size_t n)
{
	const uint8_t *p = data;
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return -EIO;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static int writer_flush(GgufWriter *w)
{
	int r = write_all(w->fd, w->buf, w->buf_len);
	w->buf_len = 0;
	return r;
}

/* Append to the file through the buffer; large pieces go straight through. */
static int writer_put(GgufWriter *w, const void *data, size_t n)
{
	int r;
	if (w->failed)
		return w->failed;
	if (w->buf_len + n > WRITE_BUF_SIZE) {
		if ((r = writer_flush(w)) < 0)
			return w->failed = r;
		if (n >= WRITE_BUF_SIZE) {
			if ((r = write_all(w->fd, data, n)) < 0)
				return w->failed = r;
			return 0;
		}
	}
	memcpy(w->buf + w->buf_len, data, n);
	w->buf_len += n;
	return 0;
}

static int writer_put_zeros(GgufWriter *w, size_t n)
{
	static const uint8_t zeros[GGUF_WRITER_ALIGNMENT];
	assert(n <= sizeof(zeros));
	return writer_put(w, zeros, n);
}

static size_t pad_to_alignment(uint64_t pos)
{
	return (size_t)((GGUF_WRITER_ALIGNMENT - pos % GGUF_WRITER_ALIGNMENT) % GGUF_WRITER_ALIGNMENT);
}

/* Fsync the directory holding path, so the rename is durable. */
static int fsync_parent(const char *path)
{
	_cleanup_(freep) char *copy = strdup(path);
	if (!copy)
		return -ENOMEM;
	_cleanup_(closep) int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	if (fsync(dfd) < 0)
		return -errno;
	return 0;
}

int gguf_writer_new(const char *path, GgufWriter **ret, Error *err)
{
	assert(path && ret);
	_cleanup_(gguf_writer_freep) GgufWriter *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = -1;
	size_t len = strlen(path);
	w->path = strdup(path);
	w->tmp_path = malloc(len + sizeof(".tmp"));
	w->buf = malloc(WRITE_BUF_SIZE);
	if (!w->path || !w->tmp_path || !w->buf)
		return -ENOMEM;
	memcpy(w->tmp_path, path, len);
	memcpy(w->tmp_path + len, ".tmp", sizeof(".tmp"));

	w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0)
		return error_set(err, -errno, "cannot create %s: %s", w->tmp_path, strerror(errno));

	/* First, so readers find the alignment before the tensor table. */
	int r = gguf_writer_add_u32(w, "general.alignment", GGUF_WRITER_ALIGNMENT);
	if (r)
		return r;
	*ret = TAKE_PTR(w);
	return 0;
}

GgufWriter *gguf_writer_free(GgufWriter *w)
{
	if (!w)
		return NULL;
	if (w->fd >= 0) {
		w->fd = safe_close(w->fd);
		unlink(w->tmp_path);
	}
	for (uint64_t i = 0; i < w->n_kv; i++)
		free(w->keys[i]);
	free(w->keys);
	for (size_t i = 0; i < w->n_tensors; i++)
		free(w->tensors[i].name);
	free(w->tensors);
	free(w->kv);
	free(w->buf);
	free(w->tmp_path);
	free(w->path);
	free(w);
	return NULL;
}

/* ---- metadata ----------------------------------------------------------- */

static int kv_put(GgufWriter *w, const void *data, size_t n)
{
	size_t need;
	if (size_add_overflows(w->kv_len, n, &need))
		return -ENOMEM;
	if (need > w->kv_cap) {
		size_t cap = w->kv_cap ? w->kv_cap : 4096;
		while (cap < need) {
			if (size_mul_overflows(cap, 2, &cap))
				return -ENOMEM;
		}
		uint8_t *p = realloc(w->kv, cap);
		if (!p)
			return -ENOMEM;
		w->kv = p;
		w->kv_cap = cap;
	}
	if (n)
		memcpy(w->kv + w->kv_len, data, n);
	w->kv_len = need;
	return 0;
}

static int kv_put_le(GgufWriter *w, uint64_t v, int n)
{
	uint8_t b[8];
	put_le(b, v, n);
	return kv_put(w, b, (size_t)n);
}

static int kv_put_str(GgufWriter *w, const char *s, size_t n)
{
	int r = kv_put_le(w, n, 8);
	return r ? r : kv_put(w, s, n);
}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/*
 * Start a key/value: check the key, remember it, write key and type.
 * On failure the metadata is rolled back to where it was.
 */
static int kv_begin(GgufWriter *w, const char *key, uint32_t type)
{
	assert(!w->data_started);
	size_t len = strlen(key);
	if (len < 1 || len > MAX_NAME)
		return GGUF_WRITER_E_INVALID;
	for (uint64_t i = 0; i < w->n_kv; i++)
		if (strcmp(w->keys[i], key) == 0)
			return GGUF_WRITER_E_DUPLICATE;
	char **keys = realloc(w->keys, (w->n_kv + 1) * sizeof(*keys));
	if (!keys)
		return -ENOMEM;
	w->keys = keys;
	if (!(w->keys[w->n_kv] = strdup(key)))
		return -ENOMEM;
	int r = kv_put_str(w, key, len);
	if (r == 0)
		r = kv_put_le(w, type, 4);
	if (r) {
		free(w->keys[w->n_kv]);
		return r;
	}
	w->n_kv++;
	return 0;
}

/* Undo a kv_begin() whose value could not be written. */
static int kv_abort(GgufWriter *w, size_t kv_len, int r)
{
	w->kv_len = kv_len;
	w->n_kv--;
	free(w->keys[w->n_kv]);
	return r;
}

static int kv_scalar(GgufWriter *w, const char *key, uint32_t type, uint64_t v, int n)
{
	size_t mark = w->kv_len;
	int r = kv_begin(w, key, type);
	if (r)
		return r;
	if ((r = kv_put_le(w, v, n)))
		return kv_abort(w, mark, r);
	return 0;
}

int gguf_writer_add_u32(GgufWriter *w, const char *key, uint32_t v)
{
	return kv_scalar(w, key, GGUF_TYPE_UINT32, v, 4);
}

int gguf_writer_add_i32(GgufWriter *w, const char *key, int32_t v)
{
	return kv_scalar(w, key, GGUF_TYPE_INT32, (uint32_t)v, 4);
}

int gguf_writer_add_f32(GgufWriter *w, const char *key, float v)
{
	return kv_scalar(w, key, GGUF_TYPE_FLOAT32, f32_bits(v), 4);
}

int gguf_writer_add_bool(GgufWriter *w, const char *key, bool v)
{
	return kv_scalar(w, key, GGUF_TYPE_BOOL, v ? 1 : 0, 1);
}

int gguf_writer_add_str(GgufWriter *w, const char *key, const char *v)
{
	size_t mark = w->kv_len;
	int r = kv_begin(w, key, GGUF_TYPE_STRING);
	if (r)
		return r;
	if ((r = kv_put_str(w, v, strlen(v))))
		return kv_abort(w, mark, r);
	return 0;
}

int gguf_writer_add_str_array(GgufWriter *w, const char *key, const char *const *v, size_t n)
{
	size_t mark = w->kv_len;
	int r = kv_begin(w, key, GGUF_TYPE_ARRAY);
	if (r)
		return r;
	if ((r = kv_put_le(w, GGUF_TYPE_STRING, 4)) || (r = kv_put_le(w, n, 8)))
		return kv_abort(w, mark, r);
	for (size_t i = 0; i < n; i++)
		if ((r = kv_put_str(w, v[i], strlen(v[i]))))
			return kv_abort(w, mark, r);
	return 0;
}

/* An array of n 4-byte little-endian elements. */
static int kv_array32(GgufWriter *w, const char *key, uint32_t type, const uint32_t *v, size_t n)
{
	size_t mark = w->kv_len;
	int r = kv_begin(w, key, GGUF_TYPE_ARRAY);
	if (r)
		return r;
	if ((r = kv_put_le(w, type, 4)) || (r = kv_put_le(w, n, 8)))
		return kv_abort(w, mark, r);
	for (size_t i = 0; i < n; i++)
		if ((r = kv_put_le(w, v[i], 4)))
			return kv_abort(w, mark, r);
	return 0;
}

int gguf_writer_add_i32_array(GgufWriter *w, const char *key, const int32_t *v, size_t n)
{
	static_assert(sizeof(int32_t) == sizeof(uint32_t), "same width");
	return kv_array32(w, key, GGUF_TYPE_INT32, (const uint32_t *)(const void *)v, n);
}

int gguf_writer_add_f32_array(GgufWriter *w, const char *key, const float *v, size_t n)
{
	static_assert(sizeof(float) == sizeof(uint32_t), "same width");
	return kv_array32(w, key, GGUF_TYPE_FLOAT32, (const uint32_t *)(const void *)v, n);
}

/* ---- tensors ------------------------------------------------------------ */

int gguf_writer_add_tensor(GgufWriter *w, const char *name, uint32_t type, uint32_t n_dims,
			   const uint64_t *ne, Error *err)
{
	assert(!w->data_started);
	size_t len = strlen(name);
	if (len < 1 || len > MAX_NAME)
		return error_set(err, GGUF_WRITER_E_INVALID, "tensor name of %zu bytes", len);
	const WTypeInfo *info = wtype_info(type);
	if (!info)
		return error_set(err, GGUF_WRITER_E_INVALID, "tensor '%s': unknown type %u", name, type);
	if (n_dims < 1 || n_dims > 4)
		return error_set(err, GGUF_WRITER_E_INVALID, "tensor '%s': %u dimensions", name, n_dims);

	/* Bytes = rows * row bytes, every product checked. */
	uint64_t rows = 1, size;
	for (uint32_t d = 0; d < n_dims; d++) {
		if (ne[d] < 1 || ne[d] > INT64_MAX)
			return error_set(err, GGUF_WRITER_E_INVALID, "tensor '%s': ne[%u] = %llu", name, d,
					 (unsigned long long)ne[d]);
		if (d > 0 && __builtin_mul_overflow(rows, ne[d], &rows))
			return error_set(err, GGUF_WRITER_E_INVALID, "tensor '%s': too large", name);
	}
	if (ne[0] % info->block_elems)
		return error_set(err, GGUF_WRITER_E_INVALID,
				 "tensor '%s': row of %llu values is not a whole number of %s blocks (%u)",
				 name, (unsigned long long)ne[0], info->name, info->block_elems);
	uint64_t row_bytes = ne[0] / info->block_elems * info->block_bytes, end;
	if (__builtin_mul_overflow(rows, row_bytes, &size) ||
	    __builtin_add_overflow(w->data_size, size + pad_to_alignment(size), &end) ||
	    size > INT64_MAX)
		return error_set(err, GGUF_WRITER_E_INVALID, "tensor '%s': too large", name);

	for (size_t i = 0; i < w->n_tensors; i++)
		if (strcmp(w->tensors[i].name, name) == 0)
			return error_set(err, GGUF_WRITER_E_DUPLICATE, "tensor '%s' declared twice", name);
	if (w->n_tensors == w->cap_tensors) {
		size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
		WriterTensor *t = realloc(w->tensors, cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		w->tensors = t;
		w->cap_tensors = cap;
	}
	WriterTensor *t = &w->tensors[w->n_tensors];
	*t = (WriterTensor){ .name = strdup(name), .type = type, .n_dims = n_dims,
			     .offset = w->data_size, .size = size };
	if (!t->name)
		return -ENOMEM;
	for (uint32_t d = 0; d < 4; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	w->n_tensors++;
	w->data_size = end;
	return 0;
}

uint64_t gguf_writer_tensor_size(const GgufWriter *w, const char *name)
{
	for (size_t i = 0; i < w->n_tensors; i++)
		if (strcmp(w->tensors[i].name, name) == 0)
			return w->tensors[i].size;
	return 0;
}

static int put_le_file(GgufWriter *w, uint64_t v, int n)
{
	uint8_t b[8];
	put_le(b, v, n);
	return writer_put(w, b, (size_t)n);
}

int gguf_writer_begin_data(GgufWriter *w, Error *err)
{
	assert(!w->data_started);
	uint64_t pos;
	int r;

	w->data_started = true;
	if ((r = put_le_file(w, GGUF_MAGIC, 4)) || (r = put_le_file(w, GGUF_WRITER_VERSION, 4)) ||
	    (r = put_le_file(w, w->n_tensors, 8)) || (r = put_le_file(w, w->n_kv, 8)) ||
	    (r = writer_put(w, w->kv, w->kv_len)))
		goto fail;
	pos = 24 + w->kv_len;
	for (size_t i = 0; i < w->n_tensors; i++) {
		const WriterTensor *t = &w->tensors[i];
		size_t len = strlen(t->name);
		if ((r = put_le_file(w, len, 8)) || (r = writer_put(w, t->name, len)) ||
		    (r = put_le_file(w, t->n_dims, 4)))
			goto fail;
		for (uint32_t d = 0; d < t->n_dims; d++)
			if ((r = put_le_file(w, t->ne[d], 8)))
				goto fail;
		if ((r = put_le_file(w, t->type, 4)) || (r = put_le_file(w, t->offset, 8)))
			goto fail;
		pos += 8 + len + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
	}
	if ((r = writer_put_zeros(w, pad_to_alignment(pos))))
		goto fail;
	w->cur = 0;
	w->cur_done = 0;
	return 0;
fail:
	return error_set(err, r, "writing %s: %s", w->tmp_path, strerror(-r));
}

/* Close the current tensor (padding) and move to the next. */
static int writer_next_tensor(GgufWriter *w)
{
	const WriterTensor *t = &w->tensors[w->cur];
	int r = writer_put_zeros(w, pad_to_alignment(t->size));
	if (r)
		return r;
	w->cur++;
	w->cur_done = 0;
	return 0;
}

int gguf_writer_write(GgufWriter *w, const void *data, size_t n)
{
	assert(w->data_started);
	int r;
	if (w->failed)
		return w->failed;
	if (n == 0)
		return 0;
	if (w->cur >= w->n_tensors || n > w->tensors[w->cur].size - w->cur_done)
		return w->failed = GGUF_WRITER_E_SIZE;
	if ((r = writer_put(w, data, n)))
		return r;
	w->cur_done += n;
	if (w->cur_done == w->tensors[w->cur].size && (r = writer_next_tensor(w)))
		return r;
	return 0;
}

int gguf_writer_finish(GgufWriter *w, Error *err)
{
	assert(w->data_started && w->fd >= 0);
	int r = w->failed;

	if (r == 0 && w->cur < w->n_tensors)
		r = error_set(err, GGUF_WRITER_E_SIZE, "tensor '%s': %llu of %llu bytes written",
			      w->tensors[w->cur].name, (unsigned long long)w->cur_done,
			      (unsigned long long)w->tensors[w->cur].size);
	else if (r)
		error_set(err, r, "writing %s: %s", w->tmp_path,
			  r < 0 ? strerror(-r) : "tensor data longer than declared");
	if (r == 0 && (r = writer_flush(w)) < 0)
		error_set(err, r, "writing %s: %s", w->tmp_path, strerror(-r));
	if (r == 0 && fsync(w->fd) < 0)
		r = error_set(err, -errno, "fsync %s: %s", w->tmp_path, strerror(errno));
	if (r == 0) {
		int fd = TAKE_FD(w->fd);
		if (close(fd) < 0)
			r = error_set(err, -errno, "close %s: %s", w->tmp_path, strerror(errno));
		else if (rename(w->tmp_path, w->path) < 0)
			r = error_set(err, -errno, "rename %s to %s: %s", w->tmp_path, w->path,
				      strerror(errno));
		if (r) {
			unlink(w->tmp_path);
			return r;
		}
		/* The file is complete under its name; a failed directory fsync is reported too. */
		r = fsync_parent(w->path);
		if (r < 0)
			return error_set(err, r, "fsync directory of %s: %s", w->path, strerror(-r));
		return 0;
	}
	w->fd = safe_close(w->fd);
	unlink(w->tmp_path);
	return w->failed = r;
}
