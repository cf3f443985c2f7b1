/*
 * test-stream.c: daemon/stream.c, the text deltas a client sees: never a
 * split UTF-8 character, never any part of a stop string, invalid bytes
 * as U+FFFD. Expected outputs are written out by hand.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/stream.h"

/* Push pieces[] in order; return all deltas joined with '|' between pushes, and the last code. */
static char *run(const char *const *pieces, size_t n, const char *const *stops, size_t n_stops, bool flush,
		 int *ret_code)
{
	uint8_t *sv[4];
	size_t lens[4];
	TextStream s;
	static char out[1024];
	size_t o = 0;
	int code = 0;

	for (size_t i = 0; i < n_stops; i++) {
		sv[i] = (uint8_t *)stops[i];
		lens[i] = strlen(stops[i]);
	}
	text_stream_init(&s, sv, lens, n_stops);
	for (size_t i = 0; i < n && code == 0; i++) {
		char *d;
		size_t len;
		code = text_stream_push(&s, pieces[i], strlen(pieces[i]), &d, &len);
		ck_assert_int_ge(code, 0);
		ck_assert_uint_eq(strlen(d), len);
		memcpy(out + o, d, len);
		o += len;
		out[o++] = '|';
		free(d);
	}
	if (flush && code == 0) {
		char *d;
		size_t len;
		ck_assert_int_eq(text_stream_flush(&s, &d, &len), 0);
		memcpy(out + o, d, len);
		o += len;
		free(d);
	}
	out[o] = 0;
	text_stream_done(&s);
	*ret_code = code;
	return out;
}

START_TEST(test_utf8_held_back)
{
	/* "é" is C3 A9 and "€" is E2 82 AC, split across tokens. */
	const char *p[] = { "caf\xc3", "\xa9 ", "\xe2\x82", "\xac!" };
	int code;
	ck_assert_str_eq(run(p, 4, NULL, 0, true, &code), "caf|\xc3\xa9 ||\xe2\x82\xac!|");
	ck_assert_int_eq(code, 0);
}
END_TEST

START_TEST(test_invalid_bytes)
{
	/* A lone continuation byte and an incomplete sequence at the end become U+FFFD. */
	const char *p[] = { "a\x80" "b", "c\xe2\x82" };
	int code;
	ck_assert_str_eq(run(p, 2, NULL, 0, true, &code), "a\xef\xbf\xbd" "b|c|\xef\xbf\xbd\xef\xbf\xbd");
}
END_TEST

START_TEST(test_stop_across_tokens)
{
	const char *p[] = { "Hello <", "|end", "|> more" };
	const char *stops[] = { "<|end|>" };
	int code;
	ck_assert_str_eq(run(p, 3, stops, 1, false, &code), "Hello |||");
	ck_assert_int_eq(code, 1);
}
END_TEST

START_TEST(test_stop_earliest)
{
	const char *p[] = { "a <", "b", " END and STOP" };
	const char *stops[] = { "STOP", "<x", "END" };
	int code;
	ck_assert_str_eq(run(p, 3, stops, 3, false, &code), "a |<b| |");
	ck_assert_int_eq(code, 1);
}
END_TEST

START_TEST(test_complete_prefix)
{
	ck_assert_uint_eq(utf8_complete_prefix((const uint8_t *)"ab\xf0\x9f\x98", 5), 2);
	ck_assert_uint_eq(utf8_complete_prefix((const uint8_t *)"ab\xf0\x9f\x98\x80", 6), 6);
	ck_assert_uint_eq(utf8_complete_prefix((const uint8_t *)"\xff", 1), 1);
	ck_assert_uint_eq(utf8_complete_prefix((const uint8_t *)"\xed\xa0", 2), 2); /* surrogate: invalid, not pending */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("stream");
	TCase *tc = tcase_create("stream");
	tcase_add_test(tc, test_utf8_held_back);
	tcase_add_test(tc, test_invalid_bytes);
	tcase_add_test(tc, test_stop_across_tokens);
	tcase_add_test(tc, test_stop_earliest);
	tcase_add_test(tc, test_complete_prefix);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
