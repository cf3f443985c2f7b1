/*
 * memfd.h: text attachments passed as sealed memfds.
 *
 * Client side: memfd_new_sealed() copies a buffer into a new memfd
 * (MFD_CLOEXEC | MFD_ALLOW_SEALING) and seals it with F_SEAL_WRITE,
 * F_SEAL_GROW, F_SEAL_SHRINK and F_SEAL_SEAL, so its contents and size can
 * never change again, for anyone.
 *
 * Daemon side: memfd_map_text() accepts an fd from a peer only if
 *   - it is a memfd: a regular file whose seals can be read (F_GET_SEALS),
 *     and, where /proc is mounted, whose /proc/self/fd link names "/memfd:";
 *     else MEMFD_E_NOT_MEMFD (pipes, sockets, files, O_TMPFILE, /dev/shm,
 *     an O_PATH descriptor of anything);
 *   - it carries F_SEAL_WRITE, F_SEAL_GROW and F_SEAL_SHRINK (F_SEAL_SEAL is
 *     not needed: seals cannot be removed); else MEMFD_E_NOT_SEALED. With
 *     these seals the sender can change neither the bytes under our mapping
 *     nor the size (no SIGBUS from a shrink);
 *   - its size, read after the seals were checked, is at most the cap; else
 *     MEMFD_E_TOO_LARGE;
 *   - its contents are strict UTF-8 (utf8.h) without U+0000 (the text
 *     goes on as a C string, which a NUL would cut short); else
 *     MEMFD_E_NOT_UTF8.
 * The contents are mapped read-only (PROT_READ, MAP_PRIVATE) and stay
 * mapped after the fd is closed, until memfd_mapping_release().
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define MEMFD_MAX_BYTES (64u * 1024 * 1024) /* default attachment cap */

/* Positive error codes of this module (0 is success, negative is -errno). */
enum {
	MEMFD_E_NOT_MEMFD = 1,  /* the fd is not a memfd */
	MEMFD_E_NOT_SEALED = 2, /* missing F_SEAL_WRITE, F_SEAL_GROW or F_SEAL_SHRINK */
	MEMFD_E_TOO_LARGE = 3,  /* size over the cap */
	MEMFD_E_NOT_UTF8 = 4,   /* contents are not valid UTF-8 */
};

/* Name of a MEMFD_E_* code, or NULL. */
const char *memfd_error_name(int code);

/*
 * New sealed memfd named name (shown in /proc) holding data[0..len).
 * Returns 0 and *ret_fd (owned by the caller, close-on-exec) or -errno.
 */
int memfd_new_sealed(const char *name, const void *data, size_t len, int *ret_fd);

/* A read-only mapping of a verified memfd. */
typedef struct MemfdMapping {
	const uint8_t *data; /* (size,) never NULL, even for size 0 */
	size_t size;
	size_t map_len;      /* bytes mapped; 0 when nothing is */
} MemfdMapping;

/*
 * Check fd (borrowed: the caller still closes it) as described above,
 * with max_bytes as the cap (0: MEMFD_MAX_BYTES), and map it. Returns 0 and
 * *ret, a MEMFD_E_* code, or -errno; err names what was wrong.
 */
int memfd_map_text(int fd, size_t max_bytes, MemfdMapping *ret, Error *err);

/* Unmap; safe on a zeroed or already released mapping. */
void memfd_mapping_release(MemfdMapping *m);
