/*
 * devmem_emul.c: the memory of the emulated GPU (devmem_emul.h says what
 * it guarantees). Tests only.
 *
 * One anonymous PROT_NONE mapping reserves the device range; allocations
 * are carved from it by a bump pointer, page-aligned (cudaMalloc aligns
 * to 256 bytes), each followed by a guard page. A free maps fresh
 * PROT_NONE pages over the allocation (its memory goes back to the
 * system, its addresses stay reserved and are never handed out again), so
 * a stale device pointer can never alias a later allocation. The
 * bookkeeping (DevAlloc) is host memory, outside the range.
 *
 * Protection: devmem_open() mprotects every live allocation read-write,
 * devmem_close() back to PROT_NONE; guard pages and freed ranges stay
 * PROT_NONE throughout. A SIGSEGV inside the range prints which address
 * was hit and whether it is live device memory, then re-raises with the
 * handler that was there before (AddressSanitizer's report, or the
 * default action).
 */
#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/unit/devmem_emul.h"

/* Address space reserved for the device: addresses are not reused, so it must hold every allocation of a run. */
#define RANGE_BYTES ((size_t)1 << 40)
#define RANGE_MIN_BYTES ((size_t)1 << 32)

typedef struct DevAlloc {
	struct DevAlloc *prev, *next;
	uint8_t *base;
	size_t size; /* as asked */
	size_t span; /* size rounded up to pages; a guard page follows */
} DevAlloc;

static uint8_t *range;     /* the reserved device range */
static size_t range_bytes;
static size_t range_used;  /* bytes handed out by the bump pointer, guard pages included */
static size_t page_bytes;
static DevAlloc *live;     /* live allocations, newest first */
static size_t live_bytes;  /* their sizes */
static int live_count;
static int open_depth;     /* devmem_open() calls not yet closed */
static struct sigaction old_segv;

void devmem_die(const char *fmt, ...)
{
	va_list ap;
	fflush(NULL);
	fputs("cuda emulation: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

/* ---- the SIGSEGV report ---- */

/* Async-signal-safe output: a string, a pointer in hex. */
static void put_str(const char *s)
{
	ssize_t r = write(STDERR_FILENO, s, strlen(s));
	(void)r;
}

static void put_ptr(const void *p)
{
	char buf[19] = "0x";
	uintptr_t v = (uintptr_t)p;
	for (int i = 17; i >= 2; i--, v >>= 4)
		buf[i] = "0123456789abcdef"[v & 15];
	buf[18] = '\0';
	put_str(buf);
}

static void segv_handler(int sig, siginfo_t *si, void *ctx)
{
	const uint8_t *a = si->si_addr;
	if (range && a >= range && a < range + range_bytes) {
		const DevAlloc *hit = NULL;
		for (const DevAlloc *d = live; d && !hit; d = d->next)
			if (a >= d->base && a < d->base + d->span)
				hit = d;
		put_str("cuda emulation: host code accessed device memory at ");
		put_ptr(a);
		if (hit) {
			put_str(" (inside the live allocation at ");
			put_ptr(hit->base);
			put_str(open_depth ? "; inside an emulated call)\n"
					   : ": device pointers must not be dereferenced on the host)\n");
		} else {
			put_str(" (freed device memory, or a guard page past an allocation)\n");
		}
	}
	/* fault again under the handler that was there before */
	sigaction(SIGSEGV, &old_segv, NULL);
	(void)sig;
	(void)ctx;
}

/* ---- the range ---- */

static void leak_report(void)
{
	if (!live_count)
		return;
	fflush(NULL);
	fprintf(stderr, "cuda emulation: %zu bytes of device memory in %d allocation(s) never freed\n",
		live_bytes, live_count);
	_exit(1);
}

static void range_init(void)
{
	if (range)
		return;
	page_bytes = (size_t)sysconf(_SC_PAGESIZE);
	for (size_t bytes = RANGE_BYTES; bytes >= RANGE_MIN_BYTES; bytes /= 2) {
		void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p != MAP_FAILED) {
			range = p;
			range_bytes = bytes;
			break;
		}
	}
	if (!range)
		devmem_die("cannot reserve address space for device memory: %s", strerror(errno));
	struct sigaction sa = { .sa_sigaction = segv_handler, .sa_flags = SA_SIGINFO };
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, &old_segv) < 0)
		devmem_die("sigaction: %s", strerror(errno));
	atexit(leak_report);
}

/* The TKV_CUDA_EMUL_MEM_LIMIT cap in bytes, SIZE_MAX without one. */
static size_t mem_limit(void)
{
	const char *s = getenv("TKV_CUDA_EMUL_MEM_LIMIT");
	if (!s || !*s)
		return SIZE_MAX;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || s[0] == '-')
		devmem_die("TKV_CUDA_EMUL_MEM_LIMIT=%s is not a byte count", s);
	return v > SIZE_MAX ? SIZE_MAX : (size_t)v;
}

static void protect(DevAlloc *a, int prot)
{
	if (mprotect(a->base, a->span, prot) < 0)
		devmem_die("mprotect of device memory at %p (%zu bytes): %s", (void *)a->base, a->span,
		    strerror(errno));
}

void *devmem_alloc(size_t bytes)
{
	range_init();
	if (!bytes)
		bytes = 1;
	size_t limit = mem_limit();
	if (live_bytes > limit || bytes > limit - live_bytes || bytes > range_bytes)
		return NULL;
	size_t span = (bytes + page_bytes - 1) / page_bytes * page_bytes;
	if (span + page_bytes > range_bytes - range_used) {
		fprintf(stderr, "cuda emulation: the %zu GiB device address range is used up "
			"(addresses are not reused)\n", range_bytes >> 30);
		return NULL;
	}
	DevAlloc *a = malloc(sizeof(*a));
	if (!a)
		return NULL;
	*a = (DevAlloc){ .next = live, .base = range + range_used, .size = bytes, .span = span };
	range_used += span + page_bytes;
	protect(a, PROT_READ | PROT_WRITE);
	memset(a->base, 0xff, span);
	if (!open_depth)
		protect(a, PROT_NONE);
	if (live)
		live->prev = a;
	live = a;
	live_bytes += bytes;
	live_count++;
	return a->base;
}

void devmem_free(void *p, const char *what)
{
	if (!p)
		return;
	DevAlloc *a = live;
	while (a && a->base != p)
		a = a->next;
	if (!a)
		devmem_die("%s(%p): %s", what, p,
		    devmem_in_range(p) ? "not the start of a live allocation (freed twice?)"
				       : "host memory, not a device allocation");
	if (a->prev)
		a->prev->next = a->next;
	else
		live = a->next;
	if (a->next)
		a->next->prev = a->prev;
	live_bytes -= a->size;
	live_count--;
	/* fresh PROT_NONE pages: the memory goes back, the addresses stay reserved */
	if (mmap(a->base, a->span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
		 0) == MAP_FAILED)
		devmem_die("%s: cannot release %zu bytes at %p: %s", what, a->span, p, strerror(errno));
	free(a);
}

bool devmem_is_allocation(const void *p)
{
	for (const DevAlloc *a = live; a; a = a->next)
		if (a->base == p)
			return true;
	return false;
}

bool devmem_in_range(const void *p)
{
	const uint8_t *u = p;
	return range && u >= range && u < range + range_bytes;
}

void devmem_check(const void *p, size_t bytes, const char *what)
{
	const uint8_t *u = p;
	if (!bytes)
		return;
	for (const DevAlloc *a = live; a; a = a->next) {
		if (u < a->base || u >= a->base + a->size)
			continue;
		if (bytes <= (size_t)(a->base + a->size - u))
			return;
		devmem_die("%s: %p .. +%zu bytes runs %zu bytes past the end of the %zu-byte device allocation at %p",
		    what, p, bytes, bytes - (size_t)(a->base + a->size - u), a->size, (void *)a->base);
	}
	devmem_die("%s: %p .. +%zu bytes is not device memory (%s)", what, p, bytes,
	    devmem_in_range(p) ? "freed, or past the end of an allocation" : "a host pointer");
}

void devmem_check_host(const void *p, size_t bytes, const char *what)
{
	const uint8_t *u = p;
	if (!bytes || !range)
		return;
	if (u < range + range_bytes && (uintptr_t)u + bytes > (uintptr_t)range)
		devmem_die("%s: %p .. +%zu bytes should be host memory but is device memory", what, p, bytes);
}

void devmem_open(void)
{
	if (open_depth++)
		return;
	for (DevAlloc *a = live; a; a = a->next)
		protect(a, PROT_READ | PROT_WRITE);
}

void devmem_close(void)
{
	assert(open_depth > 0);
	if (--open_depth)
		return;
	for (DevAlloc *a = live; a; a = a->next)
		protect(a, PROT_NONE);
}
