/* testutil.h: what every unit test program shares (paths, seeds, the runner). */
#pragma once

#include <check.h>
#include <stdint.h>
#include <stdio.h>

/* Seed for property tests: $TKV_SEED or a fixed default; printed once. */
uint64_t test_seed(void);

/* xorshift64* stream for test inputs. */
uint64_t test_rand_u64(uint64_t *state);
float test_rand_uniform(uint64_t *state);   /* [0, 1) */
float test_rand_normal(uint64_t *state);    /* N(0, 1) */

/* $TKV_TEST_DATA/<name> in a static buffer. */
const char *test_data_path(const char *name);

/*
 * Path to the default model: $TURBOKV_MODEL, else the setup script's
 * cache (${XDG_CACHE_HOME:-$HOME/.cache}/turbokv/models/...). Fails the
 * test (not skips) if the file is missing: run scripts/setup.sh.
 */
const char *test_model_path(void);

/* Read a whole file; NULL on error. *ret_len may be NULL. */
char *test_read_file(const char *path, size_t *ret_len);

/*
 * Next line of a text buffer being walked with *cursor (the newline is
 * replaced by NUL in place); NULL at the end.
 */
char *test_next_line(char **cursor);

/* Run a suite with the Check runner; returns the process exit code. */
int test_run_suite(Suite *s);
