/*
 * test-memfd.c: ipc/memfd.h and ipc/utf8.h with real fds.
 *
 * A sealed memfd from memfd_new_sealed() really refuses writes, growth and
 * shrinking (checked with write/ftruncate, not with our own code), and maps
 * read-only (checked in /proc/self/maps) to the same bytes. Every kind of
 * fd the daemon must refuse (unsealed, each seal missing, F_SEAL_FUTURE_WRITE
 * instead of F_SEAL_WRITE, tmpfile(), O_TMPFILE on disk and on tmpfs, a pipe,
 * a socket, over the cap, bad UTF-8) is built by hand here and must get its
 * documented code. UTF-8 validation is compared with a reference written
 * from the definition (decode by bit fields, then check the code point range
 * for the length), exhaustively for every 1- and 2-byte buffer, every 3-byte
 * buffer with a multi-byte lead, random 4-byte ones, and every scalar value.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/memfd.h"
#include "ipc/utf8.h"
#include "tests/unit/testutil.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* Is [p, p+len) mapped with permissions starting "r--"? (from /proc/self/maps) */
static bool mapped_read_only(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	bool ro = false;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 &&
		    (unsigned long)p >= lo && (unsigned long)p < hi)
			ro = strncmp(perms, "r--", 3) == 0;
	}
	fclose(f);
	return ro;
}

START_TEST(test_sealed_accepted)
{
	static const char text[] = "Grüße, κόσμε, 日本語, 🙂 and plain ASCII.\n";
	MemfdMapping m = { 0 };
	Error err = { 0 };
	int fd = -1, seals;

	ck_assert_int_eq(memfd_new_sealed("tkv-test", text, strlen(text), &fd), 0);
	ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	seals = fcntl(fd, F_GET_SEALS);
	ck_assert_int_eq(seals & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
			 F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
	/* the seals really hold */
	ck_assert_int_eq(pwrite(fd, "X", 1, 0), -1);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_eq(ftruncate(fd, 1), -1);
	ck_assert_int_eq(ftruncate(fd, 1 << 20), -1);
	ck_assert_ptr_eq(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);

	ck_assert_int_eq(memfd_map_text(fd, 0, &m, &err), 0);
	close(fd); /* the mapping outlives the fd */
	ck_assert_uint_eq(m.size, strlen(text));
	ck_assert(memcmp(m.data, text, m.size) == 0);
	ck_assert(mapped_read_only(m.data));
	memfd_mapping_release(&m);
	ck_assert_ptr_null(m.data);
	memfd_mapping_release(&m);

	/* empty is valid text */
	ck_assert_int_eq(memfd_new_sealed("empty", "", 0, &fd), 0);
	ck_assert_int_eq(memfd_map_text(fd, 0, &m, NULL), 0);
	ck_assert_uint_eq(m.size, 0);
	ck_assert_ptr_nonnull(m.data);
	memfd_mapping_release(&m);
	close(fd);
}
END_TEST

START_TEST(test_large_content)
{
	size_t n = 3u << 20;
	char *text = malloc(n);
	uint64_t rng = test_seed();
	MemfdMapping m = { 0 };
	int fd = -1;

	ck_assert_ptr_nonnull(text);
	for (size_t i = 0; i < n; i++)
		text[i] = (char)(' ' + test_rand_u64(&rng) % 95);
	ck_assert_int_eq(memfd_new_sealed("big", text, n, &fd), 0);
	ck_assert_int_eq(memfd_map_text(fd, n, &m, NULL), 0);
	ck_assert_uint_eq(m.size, n);
	ck_assert(memcmp(m.data, text, n) == 0);
	memfd_mapping_release(&m);
	ck_assert_int_eq(memfd_map_text(fd, n - 1, &m, NULL), MEMFD_E_TOO_LARGE);
	close(fd);
	free(text);
}
END_TEST

/* A memfd with "hello" and exactly these seals. */
static int memfd_with_seals(unsigned flags, int seals)
{
	int fd = memfd_create("partial", MFD_CLOEXEC | flags);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "hello", 5), 5);
	if (seals)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

static void expect_code(int fd, size_t cap, int code)
{
	MemfdMapping m = { 0 };
	Error err = { 0 };
	ck_assert_int_eq(memfd_map_text(fd, cap, &m, &err), code);
	if (code == 0) {
		ck_assert_ptr_nonnull(m.data);
		memfd_mapping_release(&m);
		return;
	}
	ck_assert_int_eq(err.code, code);
	ck_assert(err.msg[0] != 0);
	ck_assert_ptr_null(m.data); /* not written on failure */
}

START_TEST(test_not_sealed)
{
	const int w = F_SEAL_WRITE, g = F_SEAL_GROW, s = F_SEAL_SHRINK;
	const int partial[] = { w | g, w | s, g | s, w, g, s, g | s | F_SEAL_SEAL };
	int fd;

	/* sealing not allowed at all (its seals read F_SEAL_SEAL) */
	fd = memfd_with_seals(0, 0);
	expect_code(fd, 0, MEMFD_E_NOT_SEALED);
	close(fd);
	/* sealing allowed, none added */
	fd = memfd_with_seals(MFD_ALLOW_SEALING, 0);
	expect_code(fd, 0, MEMFD_E_NOT_SEALED);
	close(fd);
	for (size_t i = 0; i < ARRAY_SIZE(partial); i++) {
		fd = memfd_with_seals(MFD_ALLOW_SEALING, partial[i]);
		expect_code(fd, 0, MEMFD_E_NOT_SEALED);
		close(fd);
	}
	/* F_SEAL_FUTURE_WRITE leaves existing writable mappings: not enough */
	fd = memfd_create("future", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "hello", 5), 5);
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | g | s) == 0)
		expect_code(fd, 0, MEMFD_E_NOT_SEALED);
	close(fd);
	/* all three, no F_SEAL_SEAL: accepted */
	fd = memfd_with_seals(MFD_ALLOW_SEALING, w | g | s);
	expect_code(fd, 0, 0);
	close(fd);
}
END_TEST

START_TEST(test_not_memfd)
{
	int fd, p[2], sv[2];
	FILE *f;

	f = tmpfile();
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite("hello", 1, 5, f), 5);
	fflush(f);
	expect_code(fileno(f), 0, MEMFD_E_NOT_MEMFD);
	fclose(f);

	/* O_TMPFILE on the disk, and on tmpfs where seals can be read */
	const char *dirs[] = { "/tmp", "/dev/shm", "." };
	for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
		fd = open(dirs[i], O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		if (fd < 0)
			continue; /* not supported there */
		ck_assert_int_eq(write(fd, "hello", 5), 5);
		expect_code(fd, 0, MEMFD_E_NOT_MEMFD);
		close(fd);
	}

	/* an O_PATH descriptor, of a file and of a sealed memfd (through /proc) */
	fd = open("/etc/passwd", O_PATH | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	expect_code(fd, 0, MEMFD_E_NOT_MEMFD);
	close(fd);
	{
		int mfd;
		char path[64];
		ck_assert_int_eq(memfd_new_sealed("opath", "hello", 5, &mfd), 0);
		snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
		fd = open(path, O_PATH | O_CLOEXEC);
		if (fd >= 0) {
			expect_code(fd, 0, MEMFD_E_NOT_MEMFD);
			close(fd);
		}
		close(mfd);
	}

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	expect_code(p[0], 0, MEMFD_E_NOT_MEMFD);
	expect_code(p[1], 0, MEMFD_E_NOT_MEMFD);
	close(p[0]);
	close(p[1]);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	expect_code(sv[0], 0, MEMFD_E_NOT_MEMFD);
	close(sv[0]);
	close(sv[1]);
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	expect_code(fd, 0, MEMFD_E_NOT_MEMFD);
	close(fd);
	/* a closed fd is the caller's error, not the peer's */
	{
		MemfdMapping m = { 0 };
		ck_assert_int_eq(memfd_map_text(fd, 0, &m, NULL), -EBADF);
	}
}
END_TEST

START_TEST(test_too_large)
{
	char buf[1001];
	int fd;

	memset(buf, 'a', sizeof(buf));
	ck_assert_int_eq(memfd_new_sealed("cap", buf, 1000, &fd), 0);
	expect_code(fd, 1000, 0);
	expect_code(fd, 999, MEMFD_E_TOO_LARGE);
	close(fd);
	ck_assert_int_eq(memfd_new_sealed("cap", buf, 1001, &fd), 0);
	expect_code(fd, 1000, MEMFD_E_TOO_LARGE);
	close(fd);
	ck_assert_str_eq(memfd_error_name(MEMFD_E_TOO_LARGE), "MEMFD_E_TOO_LARGE");
}
END_TEST

/* U+0000 is valid UTF-8 but would cut the prompt short: refused, at its offset. */
START_TEST(test_nul_memfd)
{
	static const char text[] = "before\0after";
	MemfdMapping m = { 0 };
	Error err = { 0 };
	int fd;
	ck_assert_int_eq(memfd_new_sealed("nul", text, sizeof(text) - 1, &fd), 0);
	ck_assert_int_eq(memfd_map_text(fd, 0, &m, &err), MEMFD_E_NOT_UTF8);
	ck_assert_ptr_nonnull(strstr(err.msg, "byte 6"));
	ck_assert_ptr_null(m.data);
	close(fd);
	ck_assert_int_eq(memfd_new_sealed("nul", "\0", 1, &fd), 0);
	expect_code(fd, 0, MEMFD_E_NOT_UTF8);
	close(fd);
}
END_TEST

START_TEST(test_bad_utf8_memfd)
{
	static const struct {
		const char *s;
		size_t bad; /* offset of the first bad sequence */
	} cases[] = {
		{ "ab\xc0\xaf", 2 },             /* overlong '/' in 2 bytes */
		{ "\xc1\xbf", 0 },               /* overlong */
		{ "a\xe0\x80\xaf", 1 },          /* overlong in 3 bytes */
		{ "\xf0\x80\x80\xaf", 0 },       /* overlong in 4 bytes */
		{ "x\xed\xa0\x80y", 1 },         /* surrogate U+D800 */
		{ "\xed\xbf\xbf", 0 },           /* surrogate U+DFFF */
		{ "\xf4\x90\x80\x80", 0 },       /* U+110000 */
		{ "\xf5\x80\x80\x80", 0 },
		{ "\xff", 0 },
		{ "abc\x80", 3 },                /* stray continuation */
		{ "euro \xe2\x82", 5 },          /* truncated at the end */
		{ "\xe2\x82" "A", 0 },           /* truncated in the middle */
		{ "\xf0\x9f\x99", 0 },           /* truncated 4-byte */
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		size_t bad = 12345;
		int fd;
		ck_assert_int_eq(memfd_new_sealed("bad", cases[i].s, strlen(cases[i].s), &fd), 0);
		expect_code(fd, 0, MEMFD_E_NOT_UTF8);
		close(fd);
		ck_assert(!utf8_validate(cases[i].s, strlen(cases[i].s), &bad));
		ck_assert_uint_eq(bad, cases[i].bad);
	}
}
END_TEST

/*
 * Reference: is b[0..n) exactly one well-formed UTF-8 sequence? Decode by
 * bit fields, then require the shortest length for the value, no
 * surrogates, at most U+10FFFF.
 */
static bool ref_one_sequence(const uint8_t *b, size_t n)
{
	static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	size_t want;
	uint32_t cp;

	if ((b[0] & 0x80) == 0)
		want = 1, cp = b[0];
	else if ((b[0] & 0xe0) == 0xc0)
		want = 2, cp = b[0] & 0x1f;
	else if ((b[0] & 0xf0) == 0xe0)
		want = 3, cp = b[0] & 0x0f;
	else if ((b[0] & 0xf8) == 0xf0)
		want = 4, cp = b[0] & 0x07;
	else
		return false;
	if (want != n)
		return false;
	for (size_t i = 1; i < n; i++) {
		if ((b[i] & 0xc0) != 0x80)
			return false;
		cp = cp << 6 | (b[i] & 0x3f);
	}
	return cp >= min_cp[n] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
}

/* Reference for a whole buffer: a split into well-formed sequences exists. */
static bool ref_valid(const uint8_t *b, size_t n)
{
	if (n == 0)
		return true;
	for (size_t k = 1; k <= 4 && k <= n; k++)
		if (ref_one_sequence(b, k) && ref_valid(b + k, n - k))
			return true;
	return false;
}

START_TEST(test_utf8_exhaustive)
{
	uint64_t rng = test_seed() ^ 0x77;
	uint8_t b[4];
	size_t valid3 = 0;

	for (uint32_t x = 0; x < 0x100; x++) {
		b[0] = (uint8_t)x;
		ck_assert_int_eq(utf8_validate(b, 1, NULL), ref_valid(b, 1));
	}
	for (uint32_t x = 0; x < 0x10000; x++) {
		b[0] = (uint8_t)(x >> 8);
		b[1] = (uint8_t)x;
		ck_assert_int_eq(utf8_validate(b, 2, NULL), ref_valid(b, 2));
	}
	/* leads below C0 are ASCII or invalid: the 1- and 2-byte loops cover what follows them */
	for (uint32_t x = 0xc00000; x < 0x1000000; x++) {
		b[0] = (uint8_t)(x >> 16);
		b[1] = (uint8_t)(x >> 8);
		b[2] = (uint8_t)x;
		if (ref_one_sequence(b, 3))
			valid3++;
		/* ck_assert is slow: compare first */
		if (utf8_validate(b, 3, NULL) != ref_valid(b, 3))
			ck_abort_msg("bytes %02x %02x %02x", b[0], b[1], b[2]);
	}
	/* 3-byte scalar values: U+0800..U+FFFF less 2048 surrogates */
	ck_assert_uint_eq(valid3, 0x10000 - 0x800 - 0x800);
	for (int i = 0; i < 2000000; i++) {
		uint64_t r = test_rand_u64(&rng);
		b[0] = (uint8_t)(0xf0 + (r & 7));
		b[1] = (uint8_t)(r >> 8);
		b[2] = (uint8_t)(0x80 | ((r >> 16) & 0x3f));
		b[3] = (uint8_t)(0x80 | ((r >> 24) & 0x3f));
		if (r >> 63)
			b[3] = (uint8_t)(r >> 32); /* sometimes a bad last byte */
		if (utf8_validate(b, 4, NULL) != ref_valid(b, 4))
			ck_abort_msg("bytes %02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
	}
	/* every scalar value, encoded by hand, is accepted; surrogates are not */
	for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
		size_t n;
		if (cp < 0x80) {
			b[0] = (uint8_t)cp;
			n = 1;
		} else if (cp < 0x800) {
			b[0] = (uint8_t)(0xc0 | cp >> 6);
			b[1] = (uint8_t)(0x80 | (cp & 0x3f));
			n = 2;
		} else if (cp < 0x10000) {
			b[0] = (uint8_t)(0xe0 | cp >> 12);
			b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
			b[2] = (uint8_t)(0x80 | (cp & 0x3f));
			n = 3;
		} else {
			b[0] = (uint8_t)(0xf0 | cp >> 18);
			b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
			b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
			b[3] = (uint8_t)(0x80 | (cp & 0x3f));
			n = 4;
		}
		ck_assert_int_eq(utf8_validate(b, n, NULL), !(cp >= 0xd800 && cp <= 0xdfff));
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("memfd");
	TCase *tc = tcase_create("memfd");

	tcase_add_test(tc, test_sealed_accepted);
	tcase_add_test(tc, test_large_content);
	tcase_add_test(tc, test_not_sealed);
	tcase_add_test(tc, test_not_memfd);
	tcase_add_test(tc, test_too_large);
	tcase_add_test(tc, test_bad_utf8_memfd);
	tcase_add_test(tc, test_nul_memfd);
	tcase_add_test(tc, test_utf8_exhaustive);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
