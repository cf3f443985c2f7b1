/*
 * util.h: small helpers every engine module uses.
 *
 * Ownership (cleanup attributes, TAKE_PTR), error values with a human
 * message (Error), overflow-checked size arithmetic. Nothing here logs:
 * libraries return errors, main()s and the daemon print them.
 */
#pragma once

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Hand a pointer over to a new owner: returns it and clears the source. */
#define TAKE_PTR(p)                         \
	({                                  \
		__typeof__(p) _p_ = (p);    \
		(p) = NULL;                 \
		_p_;                        \
	})
#define TAKE_FD(fd)                         \
	({                                  \
		int _fd_ = (fd);            \
		(fd) = -1;                  \
		_fd_;                       \
	})

/* Define foo_freep() for use as _cleanup_(foo_freep) from foo_free(). */
#define DEFINE_FREEP(type, func)                \
	static inline void func##p(type **p)    \
	{                                       \
		if (*p)                         \
			func(*p);               \
	}

static inline void freep(void *p)
{
	free(*(void **)p);
}

static inline int safe_close(int fd)
{
	if (fd >= 0) {
		int saved = errno;
		close(fd);
		errno = saved;
	}
	return -1;
}

static inline void closep(int *fd)
{
	safe_close(*fd);
}

/*
 * Error: the human side of an error value. Functions return int codes
 * (0, -errno, or a positive module code) and, when handed a non-NULL
 * Error, write a message naming what was wrong. Callers may pass NULL.
 */
typedef struct Error {
	int code;
	char msg[256];
} Error;

/* Record code and a formatted message in err (if any); returns code. */
int error_set(Error *err, int code, const char *fmt, ...) _printf_(3, 4);

/* Overflow-checked arithmetic for sizes that come from outside. */
static inline bool size_mul_overflows(size_t a, size_t b, size_t *ret)
{
	return __builtin_mul_overflow(a, b, ret);
}

static inline bool size_add_overflows(size_t a, size_t b, size_t *ret)
{
	return __builtin_add_overflow(a, b, ret);
}

/* malloc(n * size) that returns NULL on overflow instead of wrapping. */
static inline void *malloc_array(size_t n, size_t size)
{
	size_t total;
	if (size_mul_overflows(n, size, &total))
		return NULL;
	return malloc(total ? total : 1);
}

static inline void *calloc_array(size_t n, size_t size)
{
	return calloc(n ? n : 1, size ? size : 1);
}

/* Write len bytes of s as a JSON string literal (quotes and escapes added). */
void json_write_string(FILE *f, const char *s, size_t len);

/* Monotonic clock in nanoseconds, for timings reported to users. */
uint64_t now_ns(void);

/* ---- little-endian fields of file formats (session files, codec records) ---- */

/* p[0 .. n-1] = the n low bytes of v, least significant first. */
static inline void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* The n-byte little-endian value at p. */
static inline uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}
