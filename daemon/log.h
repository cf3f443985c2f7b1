/*
 * log.h: the daemon's log lines on stderr.
 *
 * When stderr is the journal (systemd sets JOURNAL_STREAM to the device and
 * inode of the stream it gave us), each line starts with a syslog priority
 * prefix "<N>" that journald strips and records as the priority. Otherwise
 * lines read "turbokvd: message" for a terminal. Only the daemon logs;
 * libraries below it return errors.
 */
#pragma once

#include <stdint.h>
#include <syslog.h>

#include "base/util.h"

/* Decide once whether stderr is the journal, and the most verbose level shown. */
void log_setup(int max_level);

/* Log one line at syslog priority level (LOG_ERR...). Keeps errno. */
void log_full(int level, const char *fmt, ...) _printf_(2, 3);

/* Log with %m meaning strerror(-r); returns r (negative), for `return log_error_errno(r, ...)`. */
int log_full_errno(int level, int r, const char *fmt, ...) _printf_(3, 4);

/*
 * Lines a client can cause (a protocol error, a refused connection) go
 * through a rate limit per call site: at most LOG_RATELIMIT_BURST lines
 * per LOG_RATELIMIT_INTERVAL_NS; the next line after a quiet spell says
 * how many were suppressed. A hostile client cannot fill the disk or the
 * journal through us.
 */
#define LOG_RATELIMIT_INTERVAL_NS (10ull * 1000 * 1000 * 1000)
#define LOG_RATELIMIT_BURST 20u

typedef struct LogRatelimit {
	uint64_t begin_ns;
	unsigned n, suppressed;
} LogRatelimit;

void log_full_ratelimited(LogRatelimit *rl, int level, const char *fmt, ...) _printf_(3, 4);

#define log_ratelimited(level, ...)                                      \
	do {                                                             \
		static LogRatelimit log_rl_;                             \
		log_full_ratelimited(&log_rl_, (level), __VA_ARGS__);    \
	} while (0)
#define log_info_ratelimited(...) log_ratelimited(LOG_INFO, __VA_ARGS__)
#define log_warning_ratelimited(...) log_ratelimited(LOG_WARNING, __VA_ARGS__)
#define log_error_ratelimited(...) log_ratelimited(LOG_ERR, __VA_ARGS__)

#define log_debug(...) log_full(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_full(LOG_INFO, __VA_ARGS__)
#define log_notice(...) log_full(LOG_NOTICE, __VA_ARGS__)
#define log_warning(...) log_full(LOG_WARNING, __VA_ARGS__)
#define log_error(...) log_full(LOG_ERR, __VA_ARGS__)
#define log_error_errno(r, ...) log_full_errno(LOG_ERR, (r), __VA_ARGS__)
#define log_warning_errno(r, ...) log_full_errno(LOG_WARNING, (r), __VA_ARGS__)
