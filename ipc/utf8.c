/* utf8.c: strict UTF-8 validation by the ranges of Unicode Table 3-7. */
#include <stdint.h>

#include "ipc/utf8.h"

bool utf8_validate(const void *s, size_t len, size_t *ret_bad)
{
	const uint8_t *p = s;
	size_t i = 0;

	while (i < len) {
		uint8_t b = p[i];
		size_t need;
		uint8_t lo = 0x80, hi = 0xbf; /* allowed range of the second byte */

		if (b < 0x80) {
			i++;
			continue;
		}
		if (b >= 0xc2 && b <= 0xdf) {
			need = 1;
		} else if (b >= 0xe0 && b <= 0xef) {
			need = 2;
			if (b == 0xe0)
				lo = 0xa0; /* no overlongs */
			else if (b == 0xed)
				hi = 0x9f; /* no surrogates */
		} else if (b >= 0xf0 && b <= 0xf4) {
			need = 3;
			if (b == 0xf0)
				lo = 0x90; /* no overlongs */
			else if (b == 0xf4)
				hi = 0x8f; /* nothing over U+10FFFF */
		} else {
			goto bad; /* 80..C1 (continuation, overlong lead), F5..FF */
		}
		if (len - i - 1 < need)
			goto bad;
		if (p[i + 1] < lo || p[i + 1] > hi)
			goto bad;
		for (size_t k = 2; k <= need; k++)
			if ((p[i + k] & 0xc0) != 0x80)
				goto bad;
		i += need + 1;
	}
	return true;
bad:
	if (ret_bad)
		*ret_bad = i;
	return false;
}
