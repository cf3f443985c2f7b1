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
		const char *d;
		size_t len;
		code = text_stream_push(&s, pieces[i], strlen(pieces[i]), &d, &len);
		ck_assert_int_ge(code, 0);
		ck_assert_uint_eq(strlen(d), len);
		memcpy(out + o, d, len);
		o += len;
		out[o++] = '|';
	}
	if (flush && code == 0) {
		const char *d;
		size_t len;
		ck_assert_int_eq(text_stream_flush(&s, &d, &len), 0);
		memcpy(out + o, d, len);
		o += len;
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

/*
 * A long output whose every token could start a stop string: what is held
 * stays under the longest stop string plus a character (so a push costs
 * the same at token 20000 as at token 1), the delta buffer is reused (no
 * allocation per token), and nothing is lost or repeated.
 */
START_TEST(test_long_output_bounded)
{
	uint8_t *stops[] = { (uint8_t *)"abX", (uint8_t *)"zzzz" };
	size_t lens[] = { 3, 4 };
	TextStream s;
	const char *d, *first = NULL;
	size_t len, total = 0;
	text_stream_init(&s, stops, lens, 2);
	for (int i = 0; i < 20000; i++) {
		ck_assert_int_eq(text_stream_push(&s, "ab", 2, &d, &len), 0);
		ck_assert_uint_le(s.n_held, 3 + 3);
		ck_assert(len == 0 || (len == 2 && memcmp(d, "ab", 2) == 0));
		total += len;
		if (i == 1)
			first = d;
		else if (i > 1)
			ck_assert_ptr_eq(d, first);
	}
	ck_assert_int_eq(text_stream_push(&s, "X tail", 6, &d, &len), 1);
	ck_assert_uint_eq(len, 0);
	ck_assert_uint_eq(total, 2 * 19999);
	text_stream_done(&s);
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
	tcase_add_test(tc, test_long_output_bounded);
	tcase_add_test(tc, test_complete_prefix);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
