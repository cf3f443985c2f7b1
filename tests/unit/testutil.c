/* testutil.c: shared test helpers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/model.h"
#include "tests/unit/testutil.h"

uint64_t test_seed(void)
{
	static uint64_t seed;
	static int printed;
	if (!printed) {
		const char *e = getenv("TKV_SEED");
		seed = e ? strtoull(e, NULL, 0) : 0x5eed2026ull;
		fprintf(stderr, "test seed: TKV_SEED=0x%llx\n", (unsigned long long)seed);
		printed = 1;
	}
	return seed;
}

uint64_t test_rand_u64(uint64_t *s)
{
	uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

float test_rand_uniform(uint64_t *s)
{
	return (float)(test_rand_u64(s) >> 40) * (1.0f / 16777216.0f);
}

float test_rand_normal(uint64_t *s)
{
	float u1 = test_rand_uniform(s), u2 = test_rand_uniform(s);
	if (u1 < 1e-12f)
		u1 = 1e-12f;
	return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

const char *test_data_path(const char *name)
{
	static char buf[4096];
	const char *dir = getenv("TKV_TEST_DATA");
	snprintf(buf, sizeof(buf), "%s/%s", dir ? dir : "tests/data", name);
	return buf;
}

const char *test_model_path(void)
{
	static char buf[4096];
	const char *e = getenv("TURBOKV_MODEL");
	if (e && *e) {
		snprintf(buf, sizeof(buf), "%s", e);
	} else {
		model_default_path(buf, sizeof(buf));
	}
	if (access(buf, R_OK) != 0)
		ck_abort_msg("default model not found at %s: run scripts/setup.sh first", buf);
	return buf;
}

char *test_read_file(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap + 1);
	size_t n;
	while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap) {
			cap *= 2;
			char *nb = realloc(buf, cap + 1);
			if (!nb) {
				free(buf);
				buf = NULL;
			}
			buf = nb;
		}
	}
	fclose(f);
	if (!buf)
		return NULL;
	buf[len] = 0;
	if (ret_len)
		*ret_len = len;
	return buf;
}

char *test_next_line(char **cursor)
{
	char *s = *cursor;
	if (!s || !*s)
		return NULL;
	char *nl = strchr(s, '\n');
	if (nl) {
		*nl = 0;
		*cursor = nl + 1;
	} else {
		*cursor = s + strlen(s);
	}
	return s;
}

int test_run_suite(Suite *s)
{
	test_seed();
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
