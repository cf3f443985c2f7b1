/*
 * unicode.c: UTF-8 and Unicode class lookups for the tokenizer (and the
 * chat renderer's Jinja-compatible trim). Owns no state: the class table
 * is generated (unicode_tables.h), searched by bisection.
 */
#include "engine/text/unicode.h"
#include "engine/text/unicode_tables.h"

unsigned unicode_flags(uint32_t cp)
{
	if (cp >= 0x110000)
		return 0;

	/* Last range whose start is <= cp; range 0 starts at U+0000. */
	size_t lo = 0, hi = UNICODE_N_RANGES;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if ((unicode_ranges[mid] >> 8) <= cp)
			lo = mid;
		else
			hi = mid;
	}
	return unicode_ranges[lo] & 0xff;
}

uint32_t unicode_decode_utf8(const char *s, size_t len, size_t *ret_n)
{
	const unsigned char *u = (const unsigned char *)s;
	uint32_t cp, min;
	size_t n;

	*ret_n = 1;
	if (u[0] < 0x80)
		return u[0];
	if (u[0] < 0xc2)   /* continuation byte, or overlong 2-byte lead */
		return UNICODE_INVALID;
	if (u[0] < 0xe0) {
		n = 2;
		cp = u[0] & 0x1f;
		min = 0x80;
	} else if (u[0] < 0xf0) {
		n = 3;
		cp = u[0] & 0x0f;
		min = 0x800;
	} else if (u[0] < 0xf5) {
		n = 4;
		cp = u[0] & 0x07;
		min = 0x10000;
	} else {
		return UNICODE_INVALID;
	}
	if (len < n)
		return UNICODE_INVALID;
	for (size_t i = 1; i < n; i++) {
		if ((u[i] & 0xc0) != 0x80)
			return UNICODE_INVALID;
		cp = cp << 6 | (u[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return UNICODE_INVALID;
	*ret_n = n;
	return cp;
}

size_t unicode_encode_utf8(uint32_t cp, char out[4])
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		if (cp >= 0xd800 && cp <= 0xdfff)
			return 0;
		out[0] = (char)(0xe0 | cp >> 12);
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	if (cp < 0x110000) {
		out[0] = (char)(0xf0 | cp >> 18);
		out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
		out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[3] = (char)(0x80 | (cp & 0x3f));
		return 4;
	}
	return 0;
}

bool unicode_is_py_space(uint32_t cp)
{
	return (cp >= 0x1c && cp <= 0x1f) || (unicode_flags(cp) & UNICODE_SPACE);
}
