/*
 * memfd.c: create and seal attachments (client), verify and map them
 * (daemon). Rules: memfd.h. UTF-8 rules: utf8.h.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "ipc/memfd.h"
#include "ipc/utf8.h"

#define MEMFD_REQUIRED_SEALS (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK)

const char *memfd_error_name(int code)
{
	switch (code) {
	case MEMFD_E_NOT_MEMFD:
		return "MEMFD_E_NOT_MEMFD";
	case MEMFD_E_NOT_SEALED:
		return "MEMFD_E_NOT_SEALED";
	case MEMFD_E_TOO_LARGE:
		return "MEMFD_E_TOO_LARGE";
	case MEMFD_E_NOT_UTF8:
		return "MEMFD_E_NOT_UTF8";
	default:
		return NULL;
	}
}

int memfd_new_sealed(const char *name, const void *data, size_t len, int *ret_fd)
{
	_cleanup_(closep) int fd = -1;
	const uint8_t *p = data;
	size_t done = 0;

	assert(name && ret_fd);
	assert(data || len == 0);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	while (done < len) {
		ssize_t n = write(fd, p + done, len - done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		done += (size_t)n;
	}
	if (fcntl(fd, F_ADD_SEALS, MEMFD_REQUIRED_SEALS | F_SEAL_SEAL) < 0)
		return -errno;
	*ret_fd = TAKE_FD(fd);
	return 0;
}

/* 1 if /proc says fd is a memfd, 0 if it says not, -errno if /proc cannot tell. */
static int proc_says_memfd(int fd)
{
	char path[64], target[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n < 0)
		return -errno;
	target[n] = 0;
	return strncmp(target, "/memfd:", 7) == 0;
}

/* The checks of memfd.h before mapping: returns 0 and *ret_size, or an error. */
static int memfd_verify(int fd, size_t max_bytes, size_t *ret_size, Error *err)
{
	struct stat st;
	int seals, k;

	if (fstat(fd, &st) < 0)
		return error_set(err, -errno, "cannot stat attachment: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return error_set(err, MEMFD_E_NOT_MEMFD, "attachment is not a memfd (not a regular file)");
	/* An O_PATH descriptor stats like its file but can be neither read nor sealed. */
	int flags = fcntl(fd, F_GETFL);
	if (flags >= 0 && (flags & O_PATH))
		return error_set(err, MEMFD_E_NOT_MEMFD, "attachment is not a memfd (an O_PATH descriptor)");
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		if (errno == EINVAL)
			return error_set(err, MEMFD_E_NOT_MEMFD, "attachment is not a memfd (no seals)");
		return error_set(err, -errno, "cannot read the seals of the attachment: %s", strerror(errno));
	}
	k = proc_says_memfd(fd);
	if (k == 0)
		return error_set(err, MEMFD_E_NOT_MEMFD, "attachment is not a memfd (a file)");
	if ((seals & MEMFD_REQUIRED_SEALS) != MEMFD_REQUIRED_SEALS)
		return error_set(err, MEMFD_E_NOT_SEALED, "attachment memfd lacks seals:%s%s%s",
				 (seals & F_SEAL_WRITE) ? "" : " F_SEAL_WRITE",
				 (seals & F_SEAL_GROW) ? "" : " F_SEAL_GROW",
				 (seals & F_SEAL_SHRINK) ? "" : " F_SEAL_SHRINK");
	/* Only now is the size fixed: read it again. */
	if (fstat(fd, &st) < 0)
		return error_set(err, -errno, "cannot stat attachment: %s", strerror(errno));
	if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)max_bytes)
		return error_set(err, MEMFD_E_TOO_LARGE, "attachment of %lld bytes exceeds the cap of %zu",
				 (long long)st.st_size, max_bytes);
	*ret_size = (size_t)st.st_size;
	return 0;
}

int memfd_map_text(int fd, size_t max_bytes, MemfdMapping *ret, Error *err)
{
	static const uint8_t empty[1];
	size_t size, bad;
	void *p;
	int k;

	assert(ret);
	if (fd < 0)
		return error_set(err, -EBADF, "no attachment fd");
	if (max_bytes == 0)
		max_bytes = MEMFD_MAX_BYTES;
	k = memfd_verify(fd, max_bytes, &size, err);
	if (k != 0)
		return k;
	if (size == 0) {
		*ret = (MemfdMapping){ .data = empty, .size = 0, .map_len = 0 };
		return 0;
	}
	p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED)
		return error_set(err, -errno, "cannot map attachment of %zu bytes: %s", size, strerror(errno));
	if (!utf8_validate(p, size, &bad)) {
		munmap(p, size);
		return error_set(err, MEMFD_E_NOT_UTF8, "attachment is not valid UTF-8 at byte %zu", bad);
	}
	/* Text is handed on as C strings: a NUL would cut it short silently. */
	const uint8_t *nul = memchr(p, 0, size);
	if (nul) {
		size_t at = (size_t)(nul - (const uint8_t *)p);
		munmap(p, size);
		return error_set(err, MEMFD_E_NOT_UTF8, "attachment holds U+0000 (NUL) at byte %zu", at);
	}
	*ret = (MemfdMapping){ .data = p, .size = size, .map_len = size };
	return 0;
}

void memfd_mapping_release(MemfdMapping *m)
{
	if (!m)
		return;
	if (m->map_len > 0)
		munmap((void *)m->data, m->map_len);
	*m = (MemfdMapping){ 0 };
}
