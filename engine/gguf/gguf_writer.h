/*
 * gguf_writer.h: writing GGUF version 3 files, streaming the tensor data.
 *
 * The layout written is the one engine/gguf/gguf.h reads:
 *
 *   u32 magic "GGUF"  u32 version 3  u64 n_tensors  u64 n_kv
 *   n_kv x { string key; u32 type; value }      ("general.alignment" first)
 *   n_tensors x { string name; u32 n_dims; u64 ne[n_dims]; u32 type; u64 offset }
 *   zero padding to GGUF_WRITER_ALIGNMENT
 *   tensor data in declaration order, each tensor zero-padded to the
 *   alignment (offsets are relative to the start of the data section)
 *
 * Use: gguf_writer_new(), then metadata (gguf_writer_add_*) and tensor
 * declarations (gguf_writer_add_tensor) in any order, then
 * gguf_writer_begin_data(), then each tensor's bytes, in declaration
 * order, in pieces of any size (gguf_writer_write), then
 * gguf_writer_finish(). Only the metadata and the tensor table are held
 * in memory, never the weights.
 *
 * The file is written as PATH.tmp and renamed to PATH by
 * gguf_writer_finish() after fsync(); a writer freed before that (or
 * after any failure) removes PATH.tmp, so no partial file is left at
 * PATH.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define GGUF_WRITER_ALIGNMENT 32u

/* Positive error codes; negative values are -errno (-ENOSPC, -EFBIG...). */
enum {
	GGUF_WRITER_E_DUPLICATE = 1, /* a key or tensor name given twice */
	GGUF_WRITER_E_INVALID,       /* bad key/name length, shape or type */
	GGUF_WRITER_E_SIZE,          /* tensor data longer or shorter than declared */
};

typedef struct GgufWriter GgufWriter;

/* Create PATH.tmp (truncating a stale one). Returns 0 or -errno. */
int gguf_writer_new(const char *path, GgufWriter **ret, Error *err);

/* Close and remove PATH.tmp unless gguf_writer_finish() succeeded. Returns NULL. */
GgufWriter *gguf_writer_free(GgufWriter *w);
DEFINE_FREEP(GgufWriter, gguf_writer_free)

/*
 * Metadata, before gguf_writer_begin_data(). Keys are 1..65535 bytes.
 * Each returns 0, -ENOMEM, GGUF_WRITER_E_DUPLICATE or GGUF_WRITER_E_INVALID.
 */
int gguf_writer_add_u32(GgufWriter *w, const char *key, uint32_t v);
int gguf_writer_add_i32(GgufWriter *w, const char *key, int32_t v);
int gguf_writer_add_f32(GgufWriter *w, const char *key, float v);
int gguf_writer_add_bool(GgufWriter *w, const char *key, bool v);
int gguf_writer_add_str(GgufWriter *w, const char *key, const char *v);
int gguf_writer_add_str_array(GgufWriter *w, const char *key, const char *const *v, size_t n);
int gguf_writer_add_i32_array(GgufWriter *w, const char *key, const int32_t *v, size_t n);
int gguf_writer_add_f32_array(GgufWriter *w, const char *key, const float *v, size_t n);

/*
 * Declare a tensor of WType type with n_dims (1..4) dimensions ne[],
 * ne[0] the contiguous one and a whole number of blocks. Returns 0,
 * -ENOMEM, GGUF_WRITER_E_DUPLICATE or GGUF_WRITER_E_INVALID (err says why).
 */
int gguf_writer_add_tensor(GgufWriter *w, const char *name, uint32_t type, uint32_t n_dims,
			   const uint64_t *ne, Error *err);

/* Bytes of a declared tensor (0 for an unknown name). */
uint64_t gguf_writer_tensor_size(const GgufWriter *w, const char *name);

/* Write the header, metadata, tensor table and padding. Returns 0 or -errno. */
int gguf_writer_begin_data(GgufWriter *w, Error *err);

/*
 * Append n bytes of the current tensor's data; a tensor is complete when
 * all its bytes are written and the next write goes to the next tensor.
 * Returns 0, -errno, or GGUF_WRITER_E_SIZE when n runs past the current
 * tensor's end. A failure is sticky: later calls return it again.
 */
int gguf_writer_write(GgufWriter *w, const void *data, size_t n);

/*
 * Check that every tensor is complete, flush, fsync, rename PATH.tmp to
 * PATH and fsync its directory. Returns 0, -errno or GGUF_WRITER_E_SIZE;
 * on failure PATH.tmp is removed (and PATH untouched).
 */
int gguf_writer_finish(GgufWriter *w, Error *err);
