/*
 * log.c: stderr logging with journal priority prefixes (see log.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/log.h"

static bool log_to_journal;
static int log_max_level = LOG_INFO;

/* JOURNAL_STREAM is "DEV:INO" of the stream; it counts only if stderr is that stream. */
static bool stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
		return false;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_setup(int max_level)
{
	log_to_journal = stderr_is_journal();
	log_max_level = max_level;
}

static void log_write(int level, const char *fmt, va_list ap, int r)
{
	char msg[2048];
	int saved = errno;

	if (level > log_max_level)
		return;
	/* %m means the error r stands for, not whatever errno happens to hold. */
	errno = r < 0 ? -r : saved;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	/* A closed or full stderr (`turbokvd | head`) loses the line, nothing more: SIGPIPE is ignored (manager.c). */
	if (log_to_journal)
		(void)fprintf(stderr, "<%d>%s\n", level, msg);
	else
		(void)fprintf(stderr, "turbokvd: %s\n", msg);
	if (ferror(stderr))
		clearerr(stderr);
	errno = saved;
}

void log_full(int level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_write(level, fmt, ap, 0);
	va_end(ap);
}

void log_full_ratelimited(LogRatelimit *rl, int level, const char *fmt, ...)
{
	uint64_t now = now_ns();
	va_list ap;

	if (level > log_max_level)
		return;
	if (rl->begin_ns == 0 || now - rl->begin_ns >= LOG_RATELIMIT_INTERVAL_NS) {
		if (rl->suppressed)
			log_full(LOG_WARNING, "%u similar lines suppressed in the last %llu s", rl->suppressed,
				 (unsigned long long)((now - rl->begin_ns) / 1000000000ull));
		rl->begin_ns = now;
		rl->n = 0;
		rl->suppressed = 0;
	}
	if (rl->n >= LOG_RATELIMIT_BURST) {
		rl->suppressed++;
		return;
	}
	rl->n++;
	va_start(ap, fmt);
	log_write(level, fmt, ap, 0);
	va_end(ap);
}

int log_full_errno(int level, int r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_write(level, fmt, ap, r);
	va_end(ap);
	return r < 0 ? r : -EIO;
}
