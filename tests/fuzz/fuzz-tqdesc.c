/*
 * fuzz-tqdesc.c: libFuzzer target for the TurboQuant descriptor parser
 * (tq_desc_decode in engine/codec/tq.c), the record stored next to every code.
 *
 * A record of exactly TQ_DESC_RECORD_BYTES whose last byte is odd gets
 * its checksum recomputed first, so that mutations also reach the field
 * checks behind the CRC (otherwise nearly every input stops there).
 *
 * Promises checked for every input: decode either fails with a documented
 * code or yields a descriptor that validates and re-encodes to exactly the
 * input bytes (only canonical records are accepted); a codec built from an
 * accepted descriptor (small dimensions only, to keep runs fast) encodes
 * and decodes a vector within exactly tq_code_bytes() bytes to finite
 * values, and accepts its own record in tq_codec_check().
 */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <string.h>

#include "engine/codec/tq.h"

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	uint8_t fixed[TQ_DESC_RECORD_BYTES];
	const uint8_t *data = input;
	if (size == TQ_DESC_RECORD_BYTES && (input[size - 1] & 1)) {
		memcpy(fixed, input, size);
		uint32_t crc = tq_crc32c(fixed, offsetof(TqDescRecord, crc));
		for (int i = 0; i < 4; i++)
			fixed[offsetof(TqDescRecord, crc) + i] = (uint8_t)(crc >> (8 * i));
		data = fixed;
	}
	TqDesc d;
	Error err = { 0 };
	int r = tq_desc_decode(data, size, &d, &err);
	if (r != 0) {
		CHECK(r == TQ_E_CORRUPT || r == TQ_E_VERSION || r == TQ_E_BAD_DESC);
		CHECK(err.msg[0] != 0);
		return 0;
	}
	CHECK(size == TQ_DESC_RECORD_BYTES);
	CHECK(tq_desc_validate(&d, NULL) == 0);
	uint8_t again[TQ_DESC_RECORD_BYTES];
	CHECK(tq_desc_encode(&d, again) == 0);
	CHECK(memcmp(again, data, size) == 0);

	if (d.dim > 128)
		return 0; /* dense rotations of large d cost O(d^3) to build */
	TqCodec *c = NULL;
	r = tq_codec_new(&d, &c, &err);
	CHECK(r == 0 || r == -ENOMEM);
	if (r != 0)
		return 0;
	CHECK(tq_codec_check(c, data, size, NULL) == 0);

	size_t n = tq_code_bytes(c);
	uint8_t *code = malloc(n); /* exact size: ASan sees any overrun */
	float x[128], y[128];
	CHECK(code);
	for (int i = 0; i < d.dim; i++)
		x[i] = sinf(0.37f * (float)i + 0.1f) * (1.0f + (float)(i % 7));
	tq_encode(c, x, code);
	tq_decode(c, code, y);
	for (int i = 0; i < d.dim; i++)
		CHECK(isfinite(y[i]));
	free(code);
	tq_codec_free(c);
	return 0;
}
