/*
 * utf8.h: strict UTF-8 validation (RFC 3629) for text received from peers.
 *
 * Accepted: the well-formed byte sequences of Unicode Table 3-7, i.e. code
 * points U+0000..U+10FFFF except the surrogates U+D800..U+DFFF, each in its
 * shortest form. Rejected: overlong forms (C0, C1, E0 80..9F, F0 80..8F),
 * surrogates (ED A0..BF), values over U+10FFFF (F4 90.., F5..FF), stray
 * continuation bytes, and sequences cut short (also at the end).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/*
 * True if s[0..len) is valid UTF-8. Otherwise false, and *ret_bad (if not
 * NULL) is the offset of the first byte of the first invalid sequence.
 */
bool utf8_validate(const void *s, size_t len, size_t *ret_bad);
