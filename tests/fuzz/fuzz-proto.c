/*
 * fuzz-proto.c: libFuzzer target for the daemon's view of one frame
 * payload: protobuf-c decoding of a turbokv.v1 ClientMessage, the walk of
 * its wire bytes for NUL in string fields (protocol_check_encoded_strings())
 * and protocol_validate_client_message() (proto/protocol.c).
 *
 * The input is the payload of one frame (no length prefix), as the seed
 * corpus in corpus/proto/ holds. It is tried as if sent with no
 * descriptors and, for a Generate, with as many descriptors as it names
 * attachments, so that mutations get past the fd count check and reach
 * the attachment fields.
 *
 * Promises checked for every input: unpacking returns 0 with a message or
 * a defined ErrorCode with a message and nothing kept; it agrees with
 * plain unpack + the string walk + validate (the walk never fails where
 * protobuf-c decoded, but with BAD_MESSAGE for a NUL); an accepted message packs again to bytes that
 * decode and validate the same, and packing those gives the same bytes
 * (one normalisation, then a fixed point); nothing leaks (ASan).
 */
#include <string.h>

#include "proto/protocol.h"

#include "tests/fuzz/fuzz.h"

static int try_fds(const uint8_t *data, size_t size, size_t n_fds)
{
	Turbokv__V1__ClientMessage *m = NULL;
	Error err = { 0 };
	int r = protocol_client_message_unpack(data, size, n_fds, &m, &err);

	if (r != 0) {
		CHECK(protocol_error_code_valid(r));
		CHECK(protocol_error_code_name(r) != NULL);
		CHECK(err.msg[0] != 0);
		CHECK(m == NULL);
		return r;
	}
	CHECK(m != NULL);
	CHECK(protocol_validate_client_message(m, n_fds, NULL) == 0);

	/* re-encode: decodes and validates the same, and is a fixed point */
	size_t n1 = turbokv__v1__client_message__get_packed_size(m);
	uint8_t *b1 = malloc(n1 ? n1 : 1);
	CHECK(b1);
	CHECK(turbokv__v1__client_message__pack(m, b1) == n1);
	Turbokv__V1__ClientMessage *m2 = NULL;
	CHECK(protocol_client_message_unpack(b1, n1, n_fds, &m2, NULL) == 0);
	CHECK(m2->msg_case == m->msg_case);
	size_t n2 = turbokv__v1__client_message__get_packed_size(m2);
	CHECK(n2 == n1);
	uint8_t *b2 = malloc(n2 ? n2 : 1);
	CHECK(b2);
	CHECK(turbokv__v1__client_message__pack(m2, b2) == n2);
	CHECK(memcmp(b1, b2, n1) == 0);

	free(b2);
	free(b1);
	protocol_client_message_free(m2);
	protocol_client_message_free(m);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > PROTOCOL_MAX_FRAME_BYTES + 1)
		return 0;

	/* agreement with the plain generated decoder */
	Turbokv__V1__ClientMessage *raw = turbokv__v1__client_message__unpack(NULL, size, data);
	size_t n_att = 0;
	if (raw && raw->msg_case == TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE && raw->generate)
		n_att = raw->generate->n_attachments;

	int r0 = try_fds(data, size, 0);
	int nul = raw ? protocol_check_encoded_strings(data, size, NULL) : 0;
	if (raw)
		CHECK(nul == 0 || nul == PROTOCOL_E_BAD_MESSAGE || nul == PROTOCOL_E_BAD_FRAME);
	if (!raw)
		CHECK(r0 == PROTOCOL_E_BAD_FRAME);
	else if (size <= PROTOCOL_MAX_FRAME_BYTES)
		CHECK(r0 == (nul ? nul : protocol_validate_client_message(raw, 0, NULL)));

	if (raw && n_att > 0 && n_att <= PROTOCOL_MAX_ATTACHMENTS) {
		int r = try_fds(data, size, n_att);
		CHECK(r == (nul ? nul : protocol_validate_client_message(raw, n_att, NULL)));
	}
	protocol_client_message_free(raw);
	return 0;
}
