/*
 * protocol.c: protocol version, ErrorCode names, session names, text
 * checks and the field-by-field validation of a decoded ClientMessage.
 *
 * Validation treats the message as hostile: every count, length, enum
 * and float is checked before anyone reads it as trusted, and the first
 * problem found is reported with the field's path in err.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "proto/protocol.h"

#define ERROR_CODE_PREFIX "ERROR_CODE_"

const char *protocol_error_code_name(int code)
{
	const ProtobufCEnumValue *v =
		protobuf_c_enum_descriptor_get_value(&turbokv__v1__error_code__descriptor, code);
	if (!v)
		return NULL;
	/* "ERROR_CODE_BAD_FRAME" -> "BAD_FRAME"; every value carries the prefix */
	if (strncmp(v->name, ERROR_CODE_PREFIX, strlen(ERROR_CODE_PREFIX)) == 0)
		return v->name + strlen(ERROR_CODE_PREFIX);
	return v->name;
}

bool protocol_error_code_valid(int code)
{
	return code != TURBOKV__V1__ERROR_CODE__ERROR_CODE_UNSPECIFIED &&
	       protobuf_c_enum_descriptor_get_value(&turbokv__v1__error_code__descriptor, code);
}

int protocol_version_check(uint32_t version, Error *err)
{
	if (version < TURBOKV_PROTOCOL_MIN_VERSION || version > TURBOKV_PROTOCOL_VERSION)
		return error_set(err, PROTOCOL_E_UNSUPPORTED_VERSION,
				 "protocol version %u not supported (this daemon speaks %u to %u)",
				 version, TURBOKV_PROTOCOL_MIN_VERSION, TURBOKV_PROTOCOL_VERSION);
	return 0;
}

bool protocol_session_name_valid(const char *name)
{
	size_t n;

	if (!name)
		return false;
	for (n = 0; name[n]; n++) {
		char c = name[n];
		bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
		if (!ok || n >= PROTOCOL_MAX_SESSION_NAME)
			return false;
	}
	return n >= 1 && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

bool protocol_text_valid(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		if (c < 0x80) {
			if (c == 0)
				return false;
			i++;
			continue;
		}
		/*
		 * Lead byte -> sequence length and the allowed range of the
		 * second byte (which rules out overlongs, surrogates and
		 * values above U+10FFFF; RFC 3629 table).
		 */
		size_t len;
		uint8_t lo = 0x80, hi = 0xBF;
		if (c >= 0xC2 && c <= 0xDF) {
			len = 2;
		} else if (c >= 0xE0 && c <= 0xEF) {
			len = 3;
			if (c == 0xE0)
				lo = 0xA0;
			else if (c == 0xED)
				hi = 0x9F;
		} else if (c >= 0xF0 && c <= 0xF4) {
			len = 4;
			if (c == 0xF0)
				lo = 0x90;
			else if (c == 0xF4)
				hi = 0x8F;
		} else {
			return false; /* continuation byte, C0/C1, F5..FF */
		}
		if (n - i < len || s[i + 1] < lo || s[i + 1] > hi)
			return false;
		for (size_t k = 2; k < len; k++)
			if ((s[i + k] & 0xC0) != 0x80)
				return false;
		i += len;
	}
	return true;
}

/* A C string field (NUL-terminated by protobuf-c) of at most max bytes of UTF-8. */
static int check_string(const char *s, size_t max, const char *what, Error *err)
{
	if (!s)
		return 0; /* protobuf-c packs NULL as "" */
	size_t n = strnlen(s, (size_t)max + 1);
	if (n > max)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: longer than %zu bytes", what, max);
	if (!protocol_text_valid((const uint8_t *)s, n))
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: not valid UTF-8", what);
	return 0;
}

static int check_bytes_text(const ProtobufCBinaryData *b, const char *what, Error *err)
{
	if (b->len > 0 && !b->data)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: missing data", what);
	if (!protocol_text_valid(b->data, b->len))
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: not valid UTF-8 text (or holds NUL)", what);
	return 0;
}

static int check_request_id(uint64_t id, const char *what, Error *err)
{
	if (id == 0)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s.request_id: must not be 0", what);
	return 0;
}

static int check_session_name(const char *name, const char *what, Error *err)
{
	if (!protocol_session_name_valid(name))
		return error_set(err, PROTOCOL_E_SESSION_BAD_NAME,
				 "%s: session names are 1 to %u of [A-Za-z0-9._-], not \".\" or \"..\"",
				 what, PROTOCOL_MAX_SESSION_NAME);
	return 0;
}

/* Printable ASCII only: media types are tokens like "text/markdown; charset=utf-8". */
static int check_mime(const char *s, const char *what, Error *err)
{
	if (!s)
		return 0;
	size_t n = strnlen(s, (size_t)PROTOCOL_MAX_MIME_BYTES + 1);
	if (n > PROTOCOL_MAX_MIME_BYTES)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: longer than %u bytes",
				 what, PROTOCOL_MAX_MIME_BYTES);
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: not printable ASCII", what);
	return 0;
}

static int check_hello(const Turbokv__V1__Hello *h, Error *err)
{
	int r = check_string(h->client_name, PROTOCOL_MAX_NAME_BYTES, "hello.client_name", err);
	if (r)
		return r;
	return protocol_version_check(h->protocol_version, err);
}

static int check_chat(const Turbokv__V1__Chat *c, Error *err)
{
	if (c->n_messages == 0)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.chat.messages: empty");
	if (c->n_messages > PROTOCOL_MAX_CHAT_MESSAGES)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.chat.messages: %zu, more than %u",
				 c->n_messages, PROTOCOL_MAX_CHAT_MESSAGES);
	for (size_t i = 0; i < c->n_messages; i++) {
		const Turbokv__V1__ChatMessage *m = c->messages[i];
		char what[64];
		if (!m)
			return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.chat.messages[%zu]: missing", i);
		snprintf(what, sizeof(what), "generate.chat.messages[%zu].content", i);
		switch (m->role) {
		case TURBOKV__V1__ROLE__ROLE_SYSTEM:
		case TURBOKV__V1__ROLE__ROLE_USER:
		case TURBOKV__V1__ROLE__ROLE_ASSISTANT:
			break;
		default:
			return error_set(err, PROTOCOL_E_BAD_MESSAGE,
					 "generate.chat.messages[%zu].role: %d is not a role", i, (int)m->role);
		}
		int r = check_bytes_text(&m->content, what, err);
		if (r)
			return r;
	}
	return 0;
}

/*
 * Attachments must name the frame's descriptors one to one: a descriptor
 * nobody names would be a leak, one named twice an ambiguity.
 */
static int check_attachments(const Turbokv__V1__Generate *g, size_t n_fds, Error *err)
{
	bool seen[PROTOCOL_MAX_ATTACHMENTS] = { false };

	if (g->n_attachments > PROTOCOL_MAX_ATTACHMENTS)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.attachments: %zu, more than %u",
				 g->n_attachments, PROTOCOL_MAX_ATTACHMENTS);
	if (g->n_attachments != n_fds)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE,
				 "generate.attachments: %zu attachments but %zu descriptors sent",
				 g->n_attachments, n_fds);
	for (size_t i = 0; i < g->n_attachments; i++) {
		const Turbokv__V1__Attachment *a = g->attachments[i];
		char what[64];
		int r;

		if (!a)
			return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.attachments[%zu]: missing", i);
		snprintf(what, sizeof(what), "generate.attachments[%zu].name", i);
		if ((r = check_string(a->name, PROTOCOL_MAX_NAME_BYTES, what, err)))
			return r;
		snprintf(what, sizeof(what), "generate.attachments[%zu].mime", i);
		if ((r = check_mime(a->mime, what, err)))
			return r;
		if (a->fd_index >= n_fds)
			return error_set(err, PROTOCOL_E_BAD_MESSAGE,
					 "generate.attachments[%zu].fd_index: %u, but %zu descriptors sent",
					 i, a->fd_index, n_fds);
		if (seen[a->fd_index])
			return error_set(err, PROTOCOL_E_BAD_MESSAGE,
					 "generate.attachments[%zu].fd_index: descriptor %u named twice",
					 i, a->fd_index);
		seen[a->fd_index] = true;
		if (a->size > PROTOCOL_MAX_ATTACHMENT_BYTES)
			return error_set(err, PROTOCOL_E_ATTACHMENT_TOO_LARGE,
					 "generate.attachments[%zu].size: %llu bytes, more than %llu",
					 i, (unsigned long long)a->size, PROTOCOL_MAX_ATTACHMENT_BYTES);
	}
	return 0;
}

/* lo <= x <= hi (or lo < x when open_lo); false for NaN and infinities beyond the range. */
static bool float_in(float x, float lo, float hi, bool open_lo)
{
	if (!isfinite(x))
		return false;
	return (open_lo ? x > lo : x >= lo) && x <= hi;
}

static int check_sampling(const Turbokv__V1__Sampling *s, Error *err)
{
	if (s->opt_temperature_case && !float_in(s->temperature, 0.0f, PROTOCOL_MAX_TEMPERATURE, false))
		return error_set(err, PROTOCOL_E_BAD_MESSAGE,
				 "generate.sampling.temperature: %g not in [0, %g]",
				 (double)s->temperature, (double)PROTOCOL_MAX_TEMPERATURE);
	if (s->opt_top_k_case && s->top_k > PROTOCOL_MAX_TOP_K)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.sampling.top_k: %u, more than %u",
				 s->top_k, PROTOCOL_MAX_TOP_K);
	if (s->opt_top_p_case && !float_in(s->top_p, 0.0f, 1.0f, false))
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.sampling.top_p: %g not in [0, 1]",
				 (double)s->top_p);
	if (s->opt_min_p_case && !float_in(s->min_p, 0.0f, 1.0f, false))
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.sampling.min_p: %g not in [0, 1]",
				 (double)s->min_p);
	if (s->opt_repeat_penalty_case &&
	    !float_in(s->repeat_penalty, 0.0f, PROTOCOL_MAX_REPEAT_PENALTY, true))
		return error_set(err, PROTOCOL_E_BAD_MESSAGE,
				 "generate.sampling.repeat_penalty: %g not in (0, %g]",
				 (double)s->repeat_penalty, (double)PROTOCOL_MAX_REPEAT_PENALTY);
	if (s->opt_repeat_last_n_case && s->repeat_last_n > PROTOCOL_MAX_REPEAT_LAST_N)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE,
				 "generate.sampling.repeat_last_n: %u, more than %u",
				 s->repeat_last_n, PROTOCOL_MAX_REPEAT_LAST_N);
	return 0;
}

static int check_generate(const Turbokv__V1__Generate *g, size_t n_fds, Error *err)
{
	int r;

	if ((r = check_request_id(g->request_id, "generate", err)))
		return r;
	switch (g->input_case) {
	case TURBOKV__V1__GENERATE__INPUT_CHAT:
		if (!g->chat)
			return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.chat: missing");
		if ((r = check_chat(g->chat, err)))
			return r;
		break;
	case TURBOKV__V1__GENERATE__INPUT_RAW_PROMPT:
		if ((r = check_bytes_text(&g->raw_prompt, "generate.raw_prompt", err)))
			return r;
		break;
	default:
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate: neither chat nor raw_prompt set");
	}
	if ((r = check_attachments(g, n_fds, err)))
		return r;
	if (g->sampling && (r = check_sampling(g->sampling, err)))
		return r;
	if (g->max_tokens > PROTOCOL_MAX_MAX_TOKENS)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.max_tokens: %u, more than %u",
				 g->max_tokens, PROTOCOL_MAX_MAX_TOKENS);
	if (g->n_stop > PROTOCOL_MAX_STOP_STRINGS)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "generate.stop: %zu strings, more than %u",
				 g->n_stop, PROTOCOL_MAX_STOP_STRINGS);
	for (size_t i = 0; i < g->n_stop; i++) {
		char what[64];
		snprintf(what, sizeof(what), "generate.stop[%zu]", i);
		if (g->stop[i].len == 0 || g->stop[i].len > PROTOCOL_MAX_STOP_BYTES)
			return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: %zu bytes, not 1 to %u",
					 what, g->stop[i].len, PROTOCOL_MAX_STOP_BYTES);
		if ((r = check_bytes_text(&g->stop[i], what, err)))
			return r;
	}
	if (g->session && g->session[0] && (r = check_session_name(g->session, "generate.session", err)))
		return r;
	switch (g->context_policy) {
	case TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_ERROR:
	case TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST:
	case TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_STOP_AT_LIMIT:
		break;
	default:
		return error_set(err, PROTOCOL_E_BAD_MESSAGE,
				 "generate.context_policy: %d is not a policy", (int)g->context_policy);
	}
	return 0;
}

/*
 * protobuf-c 1.4 accepts a field number 0 when its tag is spelled in more
 * than one byte (and keeps it as an unknown field), although the encoding
 * rules forbid it and its own packer then writes bytes it refuses. Walk
 * every message of the tree for such fields. The schema has no recursive
 * types, so the depth is fixed by turbokv.proto.
 */
static bool unknown_fields_valid(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const char *base = (const char *)m;

	for (unsigned i = 0; i < m->n_unknown_fields; i++)
		if (m->unknown_fields[i].tag == 0)
			return false;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n;
			ProtobufCMessage **v;
			memcpy(&n, base + f->quantifier_offset, sizeof(n));
			memcpy(&v, base + f->offset, sizeof(v));
			for (size_t k = 0; k < n; k++)
				if (v[k] && !unknown_fields_valid(v[k]))
					return false;
			continue;
		}
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t which;
			memcpy(&which, base + f->quantifier_offset, sizeof(which));
			if (which != f->id)
				continue; /* another member of the oneof owns the storage */
		}
		ProtobufCMessage *sub;
		memcpy(&sub, base + f->offset, sizeof(sub));
		if (sub && !unknown_fields_valid(sub))
			return false;
	}
	return true;
}

int protocol_validate_client_message(const Turbokv__V1__ClientMessage *m, size_t n_fds, Error *err)
{
	int r;

	if (!m)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "no message");
	if (!unknown_fields_valid(&m->base))
		return error_set(err, PROTOCOL_E_BAD_FRAME, "field number 0 in the encoding");
	if (m->msg_case != TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE && n_fds > 0)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE,
				 "%zu descriptors sent with a message that takes none", n_fds);

	switch (m->msg_case) {
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_HELLO:
		if (!m->hello)
			break;
		return check_hello(m->hello, err);
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_GENERATE:
		if (!m->generate)
			break;
		return check_generate(m->generate, n_fds, err);
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_CANCEL:
		if (!m->cancel)
			break;
		return check_request_id(m->cancel->request_id, "cancel", err);
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_STATUS:
		if (!m->status)
			break;
		return check_request_id(m->status->request_id, "status", err);
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_LIST:
		if (!m->session_list)
			break;
		return check_request_id(m->session_list->request_id, "session_list", err);
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SHOW:
		if (!m->session_show)
			break;
		if ((r = check_request_id(m->session_show->request_id, "session_show", err)))
			return r;
		return check_session_name(m->session_show->name, "session_show.name", err);
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_SAVE:
		if (!m->session_save)
			return error_set(err, PROTOCOL_E_BAD_MESSAGE, "session_save: missing");
		if ((r = check_request_id(m->session_save->request_id, "session_save", err)))
			return r;
		return check_session_name(m->session_save->name, "session_save.name", err);
	case TURBOKV__V1__CLIENT_MESSAGE__MSG_SESSION_DELETE:
		if (!m->session_delete)
			break;
		if ((r = check_request_id(m->session_delete->request_id, "session_delete", err)))
			return r;
		return check_session_name(m->session_delete->name, "session_delete.name", err);
	default:
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "no known message set");
	}
	return error_set(err, PROTOCOL_E_BAD_MESSAGE, "message %d set but empty", (int)m->msg_case);
}

/* ---- string fields as they were on the wire ---- */

#define WIRE_MAX_DEPTH 8 /* the schema nests 4 deep; more is not ours */

/* One varint at *p (bounded by end); 0, or -1 if it runs past end or 10 bytes. */
static int wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret)
{
	uint64_t v = 0;
	for (int shift = 0; shift < 70 && *p < end; shift += 7) {
		uint8_t b = *(*p)++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*ret = v;
			return 0;
		}
	}
	return -1;
}

/*
 * Walk the encoding of a message of descriptor d in data[0..len): every
 * string field (and string fields of sub-messages) must be free of NUL.
 * path holds the field path so far ("generate"), extended in place.
 */
static int wire_strings_check(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, char *path,
			      size_t path_size, int depth, Error *err)
{
	const uint8_t *p = data, *end = data + len;
	size_t base = strlen(path);

	if (depth > WIRE_MAX_DEPTH)
		return error_set(err, PROTOCOL_E_BAD_FRAME, "messages nested too deep");
	while (p < end) {
		uint64_t key, n;
		if (wire_varint(&p, end, &key) < 0)
			return error_set(err, PROTOCOL_E_BAD_FRAME, "a truncated field key");
		switch (key & 7) {
		case 0:
			if (wire_varint(&p, end, &n) < 0)
				return error_set(err, PROTOCOL_E_BAD_FRAME, "a truncated varint");
			continue;
		case 1:
			n = 8;
			break;
		case 5:
			n = 4;
			break;
		case 2:
			if (wire_varint(&p, end, &n) < 0)
				return error_set(err, PROTOCOL_E_BAD_FRAME, "a truncated length");
			break;
		default:
			return error_set(err, PROTOCOL_E_BAD_FRAME, "wire type %u", (unsigned)(key & 7));
		}
		if (n > (uint64_t)(end - p))
			return error_set(err, PROTOCOL_E_BAD_FRAME, "a field runs past the end of its message");
		const ProtobufCFieldDescriptor *f =
			key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
		if (f && (key & 7) == 2 && (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)) {
			snprintf(path + base, path_size - base, "%s%s", base ? "." : "", f->name);
			if (f->type == PROTOBUF_C_TYPE_STRING) {
				const uint8_t *nul = memchr(p, 0, (size_t)n);
				if (nul)
					return error_set(err, PROTOCOL_E_BAD_MESSAGE, "%s: holds U+0000 (NUL) at byte %zu",
							 path, (size_t)(nul - p));
			} else {
				int r = wire_strings_check(f->descriptor, p, (size_t)n, path, path_size, depth + 1, err);
				if (r)
					return r;
			}
			path[base] = 0;
		}
		p += n;
	}
	return 0;
}

int protocol_check_encoded_strings(const uint8_t *data, size_t len, Error *err)
{
	char path[256] = "";
	return wire_strings_check(&turbokv__v1__client_message__descriptor, data, len, path, sizeof(path), 0, err);
}

int protocol_client_message_unpack(const uint8_t *data, size_t len, size_t n_fds,
				   Turbokv__V1__ClientMessage **ret, Error *err)
{
	_cleanup_(protocol_client_message_freep) Turbokv__V1__ClientMessage *m = NULL;
	int r;

	assert(ret);
	if (len > PROTOCOL_MAX_FRAME_BYTES)
		return error_set(err, PROTOCOL_E_BAD_FRAME, "message of %zu bytes, more than %u",
				 len, PROTOCOL_MAX_FRAME_BYTES);
	m = turbokv__v1__client_message__unpack(NULL, len, data);
	if (!m)
		return error_set(err, PROTOCOL_E_BAD_FRAME, "%zu bytes that are not a ClientMessage", len);
	r = protocol_check_encoded_strings(data, len, err);
	if (r == 0)
		r = protocol_validate_client_message(m, n_fds, err);
	if (r)
		return r;
	*ret = TAKE_PTR(m);
	return 0;
}

Turbokv__V1__ClientMessage *protocol_client_message_free(Turbokv__V1__ClientMessage *m)
{
	if (m)
		turbokv__v1__client_message__free_unpacked(m, NULL);
	return NULL;
}

Turbokv__V1__ServerMessage *protocol_server_message_free(Turbokv__V1__ServerMessage *m)
{
	if (m)
		turbokv__v1__server_message__free_unpacked(m, NULL);
	return NULL;
}
