/*
 * protocol.h: the rules of turbokv.proto that protobuf cannot state.
 *
 * The wire messages themselves are generated from proto/turbokv.proto by
 * protoc-c at build time (proto/turbokv.pb-c.h, types Turbokv__V1__*).
 * This module owns what sits on top of them: the protocol version, the
 * limits on everything a client controls, short names for the ErrorCode
 * enum, the session-name rule, and the validation of a decoded
 * ClientMessage field by field. It does not own framing (ipc/frame.h),
 * descriptors (ipc/fdpass.h, ipc/memfd.h) or any state of a connection
 * (whether Hello came first, which request ids are in flight: daemon/).
 *
 * Typical use in the daemon, per frame popped from the reader:
 *
 *   _cleanup_(protocol_client_message_freep) Turbokv__V1__ClientMessage *m = NULL;
 *   r = protocol_client_message_unpack(frame.data, frame.len, n_fds, &m, &err);
 *   if (r > 0)
 *           send Error{request_id, code = r, message = err.msg}
 *
 * Every check here is on the message alone. A positive return is always a
 * PROTOCOL_E_* value, equal to the ErrorCode sent back to the client.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "proto/turbokv.pb-c.h"

/*
 * Protocol versions. A client sends TURBOKV_PROTOCOL_VERSION in Hello;
 * the daemon accepts any version in [TURBOKV_PROTOCOL_MIN_VERSION,
 * TURBOKV_PROTOCOL_VERSION]. Bumped for changes an older peer would
 * misread; added fields alone do not need a bump.
 */
#define TURBOKV_PROTOCOL_VERSION 1u
#define TURBOKV_PROTOCOL_MIN_VERSION 1u

/*
 * Limits. Each bounds something a client controls; validation refuses a
 * message over any of them. A frame of PROTOCOL_MAX_FRAME_BYTES unpacks to
 * at most a few tens of times its size in memory (protobuf-c allocates a
 * struct per repeated element), which is why the frame cap is modest: long
 * documents travel as memfd attachments, not inline.
 */
#define PROTOCOL_MAX_FRAME_BYTES (4u * 1024 * 1024)      /* payload, prefix excluded (= FRAME_MAX_BYTES) */
#define PROTOCOL_MAX_ATTACHMENTS 16u                      /* per Generate (= FDPASS_MAX_FDS) */
#define PROTOCOL_MAX_ATTACHMENT_BYTES (64ull * 1024 * 1024) /* per attachment; a daemon may set less */
#define PROTOCOL_MAX_CHAT_MESSAGES 4096u                  /* per Generate */
#define PROTOCOL_MAX_STOP_STRINGS 16u                     /* per Generate */
#define PROTOCOL_MAX_STOP_BYTES 256u                      /* per stop string */
#define PROTOCOL_MAX_NAME_BYTES 255u                      /* client_name, attachment name */
#define PROTOCOL_MAX_MIME_BYTES 127u                      /* attachment mime */
#define PROTOCOL_MAX_SESSION_NAME 64u                     /* session name, bytes */
#define PROTOCOL_MAX_MAX_TOKENS (1u << 24)                /* Generate.max_tokens */
#define PROTOCOL_MAX_TEMPERATURE 100.0f
#define PROTOCOL_MAX_TOP_K (1u << 20)
#define PROTOCOL_MAX_REPEAT_PENALTY 100.0f
#define PROTOCOL_MAX_REPEAT_LAST_N (1u << 20)

/*
 * Short names for the ErrorCode values of turbokv.proto (each is equal to
 * the generated TURBOKV__V1__ERROR_CODE__ERROR_CODE_* constant; see the
 * .proto for what each means and when the daemon sends it). Functions of
 * this module return 0, a negative errno, or one of these.
 */
typedef enum ProtocolError {
	PROTOCOL_E_BAD_FRAME = TURBOKV__V1__ERROR_CODE__ERROR_CODE_BAD_FRAME,
	PROTOCOL_E_BAD_MESSAGE = TURBOKV__V1__ERROR_CODE__ERROR_CODE_BAD_MESSAGE,
	PROTOCOL_E_UNSUPPORTED_VERSION = TURBOKV__V1__ERROR_CODE__ERROR_CODE_UNSUPPORTED_VERSION,
	PROTOCOL_E_HELLO_REQUIRED = TURBOKV__V1__ERROR_CODE__ERROR_CODE_HELLO_REQUIRED,
	PROTOCOL_E_TOO_MANY_REQUESTS = TURBOKV__V1__ERROR_CODE__ERROR_CODE_TOO_MANY_REQUESTS,
	PROTOCOL_E_REQUEST_ID_IN_USE = TURBOKV__V1__ERROR_CODE__ERROR_CODE_REQUEST_ID_IN_USE,
	PROTOCOL_E_UNKNOWN_REQUEST = TURBOKV__V1__ERROR_CODE__ERROR_CODE_UNKNOWN_REQUEST,
	PROTOCOL_E_CONTEXT_OVERFLOW = TURBOKV__V1__ERROR_CODE__ERROR_CODE_CONTEXT_OVERFLOW,
	PROTOCOL_E_ATTACHMENT_NOT_MEMFD = TURBOKV__V1__ERROR_CODE__ERROR_CODE_ATTACHMENT_NOT_MEMFD,
	PROTOCOL_E_ATTACHMENT_NOT_SEALED = TURBOKV__V1__ERROR_CODE__ERROR_CODE_ATTACHMENT_NOT_SEALED,
	PROTOCOL_E_ATTACHMENT_TOO_LARGE = TURBOKV__V1__ERROR_CODE__ERROR_CODE_ATTACHMENT_TOO_LARGE,
	PROTOCOL_E_ATTACHMENT_NOT_UTF8 = TURBOKV__V1__ERROR_CODE__ERROR_CODE_ATTACHMENT_NOT_UTF8,
	PROTOCOL_E_ATTACHMENT_SIZE_MISMATCH = TURBOKV__V1__ERROR_CODE__ERROR_CODE_ATTACHMENT_SIZE_MISMATCH,
	PROTOCOL_E_SESSION_NOT_FOUND = TURBOKV__V1__ERROR_CODE__ERROR_CODE_SESSION_NOT_FOUND,
	PROTOCOL_E_SESSION_BAD_NAME = TURBOKV__V1__ERROR_CODE__ERROR_CODE_SESSION_BAD_NAME,
	PROTOCOL_E_SESSION_QUOTA = TURBOKV__V1__ERROR_CODE__ERROR_CODE_SESSION_QUOTA,
	PROTOCOL_E_SESSION_CORRUPT = TURBOKV__V1__ERROR_CODE__ERROR_CODE_SESSION_CORRUPT,
	PROTOCOL_E_SESSION_BUSY = TURBOKV__V1__ERROR_CODE__ERROR_CODE_SESSION_BUSY,
	PROTOCOL_E_BUSY = TURBOKV__V1__ERROR_CODE__ERROR_CODE_BUSY,
	PROTOCOL_E_SHUTTING_DOWN = TURBOKV__V1__ERROR_CODE__ERROR_CODE_SHUTTING_DOWN,
	PROTOCOL_E_CANCELLED = TURBOKV__V1__ERROR_CODE__ERROR_CODE_CANCELLED,
	PROTOCOL_E_INTERNAL = TURBOKV__V1__ERROR_CODE__ERROR_CODE_INTERNAL,
	PROTOCOL_E_TIMEOUT = TURBOKV__V1__ERROR_CODE__ERROR_CODE_TIMEOUT,
} ProtocolError;

/*
 * Name of an ErrorCode value without its prefix ("BAD_FRAME",
 * "ATTACHMENT_NOT_SEALED"), as scripts and logs show it; "UNSPECIFIED"
 * for 0 and NULL for a value the enum does not define.
 */
const char *protocol_error_code_name(int code);

/* Whether code is a value of the ErrorCode enum other than UNSPECIFIED. */
bool protocol_error_code_valid(int code);

/*
 * Whether a client speaking `version` is served. Returns 0 or
 * PROTOCOL_E_UNSUPPORTED_VERSION (err names the supported range).
 */
int protocol_version_check(uint32_t version, Error *err);

/*
 * Session names: [A-Za-z0-9._-]{1,64}, except "." and ".." (names become
 * file names under the state directory). NULL is not valid.
 */
bool protocol_session_name_valid(const char *name);

/*
 * Whether s[0..n) is strict UTF-8 (no overlong forms, surrogates, values
 * above U+10FFFF or truncated sequences) without NUL bytes: what every
 * text field and attachment must be.
 */
bool protocol_text_valid(const uint8_t *s, size_t n);

/*
 * Check every field of a decoded ClientMessage that the client controls:
 * the oneof is set, request ids are non-zero, enums hold defined values,
 * counts and string lengths are within the limits above, text is UTF-8,
 * sampling values are finite and in range, session names are valid,
 * attachment sizes are under PROTOCOL_MAX_ATTACHMENT_BYTES, and the
 * attachments name the n_fds descriptors received with the frame exactly
 * once each (a message other than Generate must come with none).
 * Hello's version is checked with protocol_version_check(). Unknown
 * fields (from a newer client) are ignored, except a field number 0,
 * which protobuf-c lets through and the encoding rules forbid.
 *
 * Returns 0, or the PROTOCOL_E_* code for the first problem found
 * (BAD_FRAME for field number 0; BAD_MESSAGE, UNSUPPORTED_VERSION,
 * ATTACHMENT_TOO_LARGE or SESSION_BAD_NAME), with err naming the field
 * ("generate.stop[2]: ...").
 */
int protocol_validate_client_message(const Turbokv__V1__ClientMessage *m, size_t n_fds, Error *err);

/*
 * protobuf-c hands string fields over NUL-terminated, without their
 * length: a session name "good\0bad" would reach the daemon as "good".
 * This walks the encoded ClientMessage data[0..len) (with the generated
 * descriptors, into every sub-message) and refuses any string field whose
 * bytes hold U+0000. Returns 0, PROTOCOL_E_BAD_MESSAGE (err names the
 * field: "session_delete.name: holds U+0000 (NUL) at byte 4"), or
 * PROTOCOL_E_BAD_FRAME for bytes that are not a protobuf encoding. Call it
 * on every frame beside protocol_validate_client_message(); bytes fields
 * are checked there (protocol_text_valid() refuses NUL).
 */
int protocol_check_encoded_strings(const uint8_t *data, size_t len, Error *err);

/*
 * Decode one frame payload as a ClientMessage and validate it (both checks above). Returns 0
 * and hands the message to *ret (free with protocol_client_message_free);
 * PROTOCOL_E_BAD_FRAME if len exceeds PROTOCOL_MAX_FRAME_BYTES or the
 * bytes do not decode (protobuf-c reports an allocation failure the same
 * way); or another PROTOCOL_E_* from validation. On failure nothing is
 * kept and *ret is untouched.
 */
int protocol_client_message_unpack(const uint8_t *data, size_t len, size_t n_fds,
				   Turbokv__V1__ClientMessage **ret, Error *err);

/* Free a message from protocol_client_message_unpack(); NULL is fine. Returns NULL. */
Turbokv__V1__ClientMessage *protocol_client_message_free(Turbokv__V1__ClientMessage *m);
DEFINE_FREEP(Turbokv__V1__ClientMessage, protocol_client_message_free)

/* Likewise for a ServerMessage a client unpacked with turbokv__v1__server_message__unpack(). */
Turbokv__V1__ServerMessage *protocol_server_message_free(Turbokv__V1__ServerMessage *m);
DEFINE_FREEP(Turbokv__V1__ServerMessage, protocol_server_message_free)
