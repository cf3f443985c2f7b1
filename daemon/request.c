/*
 * request.c: one Generate: building its prompt, stepping it through
 * prefill and decode, and reporting its end (see request.h).
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "daemon/connection.h"
#include "daemon/log.h"
#include "daemon/prefixcache.h"
#include "daemon/request.h"
#include "daemon/sessions.h"
#include "engine/kv/kvstore.h"
#include "ipc/memfd.h"

/* A growable byte buffer for the text of attachments. */
typedef struct Buf {
	char *data;
	size_t len, cap;
} Buf;

static int buf_append(Buf *b, const void *data, size_t len)
{
	size_t need;
	if (size_add_overflows(b->len, len, &need) || size_add_overflows(need, 1, &need))
		return -ENOMEM;
	if (need > b->cap) {
		size_t cap = MAX(need, b->cap * 2);
		char *p = realloc(b->data, cap);
		if (!p)
			return -ENOMEM;
		b->data = p;
		b->cap = cap;
	}
	memcpy(b->data + b->len, data, len);
	b->len += len;
	b->data[b->len] = 0;
	return 0;
}

static void buf_done(Buf *b)
{
	free(b->data);
	*b = (Buf){ 0 };
}

static int attachment_error_code(int r)
{
	switch (r) {
	case MEMFD_E_NOT_MEMFD: return PROTOCOL_E_ATTACHMENT_NOT_MEMFD;
	case MEMFD_E_NOT_SEALED: return PROTOCOL_E_ATTACHMENT_NOT_SEALED;
	case MEMFD_E_TOO_LARGE: return PROTOCOL_E_ATTACHMENT_TOO_LARGE;
	case MEMFD_E_NOT_UTF8: return PROTOCOL_E_ATTACHMENT_NOT_UTF8;
	default: return PROTOCOL_E_INTERNAL;
	}
}

/* The longest head: every byte of the longest name escaped as "&#NN;" (6 bytes). */
#define ATTACHMENT_HEAD_BYTES (PROTOCOL_MAX_NAME_BYTES * 6 + 32)

/*
 * `<attachment name="NAME">\n` with NAME escaped (request.h): a name cannot
 * close the attribute or the tag, nor start a line of its own.
 */
static void attachment_head(const char *name, char *buf, size_t size)
{
	size_t n = 0;
	n += (size_t)snprintf(buf, size, "<attachment name=\"");
	for (const char *p = name; *p && n + 8 < size; p++) {
		const char *e = NULL;
		char num[8];
		switch (*p) {
		case '&': e = "&amp;"; break;
		case '"': e = "&quot;"; break;
		case '<': e = "&lt;"; break;
		case '>': e = "&gt;"; break;
		default:
			if ((unsigned char)*p < 0x20 || *p == 0x7f) {
				snprintf(num, sizeof(num), "&#%d;", *p);
				e = num;
			}
		}
		if (e) {
			memcpy(buf + n, e, strlen(e));
			n += strlen(e);
		} else
			buf[n++] = *p;
	}
	snprintf(buf + n, size - n, "\">\n");
}

/*
 * The text of every attachment, framed as request.h documents, into b.
 * A text that certainly has more tokens than the context is refused here,
 * before it is copied or tokenized.
 */
static int attachments_read(Manager *m, const Turbokv__V1__Generate *g, const int *fds, Buf *b,
			    Error *err)
{
	uint64_t total = 0;
	for (size_t i = 0; i < g->n_attachments; i++) {
		const Turbokv__V1__Attachment *a = g->attachments[i];
		MemfdMapping map = { 0 };
		Error e = { 0 };
		char head[ATTACHMENT_HEAD_BYTES];
		int r;

		r = memfd_map_text(fds[a->fd_index], PROTOCOL_MAX_ATTACHMENT_BYTES, &map, &e);
		if (r != 0)
			return error_set(err, attachment_error_code(r), "attachments[%zu]: %s", i,
					 e.msg[0] ? e.msg : strerror(r < 0 ? -r : EINVAL));
		if (map.size != a->size) {
			size_t real = map.size; /* before the release clears it */
			memfd_mapping_release(&map);
			return error_set(err, PROTOCOL_E_ATTACHMENT_SIZE_MISMATCH,
					 "attachments[%zu]: size says %llu bytes, the memfd holds %zu", i,
					 (unsigned long long)a->size, real);
		}
		total += map.size;
		if (total / m->max_piece_bytes > (uint64_t)m->n_ctx) {
			memfd_mapping_release(&map);
			return error_set(err, PROTOCOL_E_CONTEXT_OVERFLOW,
					 "attachments of %llu bytes cannot fit a context of %lld tokens",
					 (unsigned long long)total, (long long)m->n_ctx);
		}
		attachment_head(a->name ? a->name : "", head, sizeof(head));
		r = buf_append(b, head, strlen(head));
		if (r == 0)
			r = buf_append(b, map.data, map.size);
		if (r == 0)
			r = buf_append(b, "\n</attachment>\n\n", 16);
		memfd_mapping_release(&map);
		if (r < 0)
			return error_set(err, r, "out of memory");
	}
	return 0;
}

static const char *role_name(Turbokv__V1__Role role)
{
	switch (role) {
	case TURBOKV__V1__ROLE__ROLE_SYSTEM: return "system";
	case TURBOKV__V1__ROLE__ROLE_ASSISTANT: return "assistant";
	default: return "user";
	}
}

static void strv_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static const char *session_role_name(SessionRole role)
{
	return role == SESSION_ROLE_SYSTEM ? "system" : role == SESSION_ROLE_USER ? "user" : "assistant";
}

static SessionRole session_role(Turbokv__V1__Role role)
{
	switch (role) {
	case TURBOKV__V1__ROLE__ROLE_SYSTEM: return SESSION_ROLE_SYSTEM;
	case TURBOKV__V1__ROLE__ROLE_ASSISTANT: return SESSION_ROLE_ASSISTANT;
	default: return SESSION_ROLE_USER;
	}
}

/*
 * The new turns as a session keeps them (texts as rendered, attachments
 * included) into *ret_turns: texts[0..n) are handed over.
 */
static int chat_turns_take(const Turbokv__V1__Chat *chat, char **texts, size_t n, SessionMessage **ret_turns)
{
	SessionMessage *t = calloc_array(n, sizeof(*t));
	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		t[i].role = i < chat->n_messages ? session_role(chat->messages[i]->role) : SESSION_ROLE_USER;
		t[i].text = TAKE_PTR(texts[i]);
		t[i].len = strlen(t[i].text);
	}
	*ret_turns = t;
	return 0;
}

/*
 * Render the chat (attachments before the last user message) into *ret
 * (malloc'd), with *ret_is_content marking the bytes that came from
 * messages and attachments: those are never parsed as special tokens.
 * With a session, its messages (prev, n_prev) come first and the new
 * turns are handed back in *ret_turns (n_turns).
 */
static int chat_build(Manager *m, const Turbokv__V1__Chat *chat, const Buf *att, const SessionMessage *prev,
		      size_t n_prev, char **ret, uint8_t **ret_is_content, SessionMessage **ret_turns,
		      size_t *ret_n_turns, Error *err)
{
	size_t n = chat->n_messages, last_user = SIZE_MAX;
	for (size_t i = 0; i < n; i++)
		if (chat->messages[i]->role == TURBOKV__V1__ROLE__ROLE_USER)
			last_user = i;
	bool extra = att->len > 0 && last_user == SIZE_MAX;
	ChatMessage *msgs = calloc_array(n_prev + n + 1, sizeof(*msgs));
	char **texts = calloc_array(n + 1, sizeof(char *));
	int r = 0;

	if (!msgs || !texts) {
		free(msgs);
		free(texts);
		return error_set(err, -ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n && r == 0; i++) {
		const ProtobufCBinaryData *c = &chat->messages[i]->content;
		size_t pre = i == last_user ? att->len : 0, len;
		if (size_add_overflows(c->len, pre + 1, &len) || !(texts[i] = malloc(len))) {
			r = -ENOMEM;
			break;
		}
		if (pre)
			memcpy(texts[i], att->data, pre);
		if (c->len)
			memcpy(texts[i] + pre, c->data, c->len);
		texts[i][pre + c->len] = 0;
		msgs[i] = (ChatMessage){ .role = role_name(chat->messages[i]->role), .content = texts[i] };
	}
	if (r == 0 && extra) {
		if ((texts[n] = strdup(att->data))) {
			msgs[n] = (ChatMessage){ .role = "user", .content = texts[n] };
			n++;
		} else
			r = -ENOMEM;
	}
	if (r == 0 && n_prev) {
		/* the session's history first */
		memmove(msgs + n_prev, msgs, n * sizeof(*msgs));
		for (size_t i = 0; i < n_prev; i++)
			msgs[i] = (ChatMessage){ .role = session_role_name(prev[i].role), .content = prev[i].text };
	}
	if (r == 0) {
		r = chat_render_marked(m->chat_template, msgs, n_prev + n, m->default_system, ret, ret_is_content,
				       err);
		if (r > 0)
			r = error_set(err, PROTOCOL_E_BAD_MESSAGE, "chat: %s", err->msg);
		if (r == 0 && ret_turns) {
			if ((r = chat_turns_take(chat, texts, n, ret_turns)) < 0)
				error_set(err, r, "out of memory");
			else {
				/* the turn the attachments went into stays when older turns are dropped */
				for (size_t i = 0; i < n && att->len > 0; i++)
					(*ret_turns)[i].pinned = i == last_user || (extra && i == n - 1);
				*ret_n_turns = n;
			}
		}
	} else
		error_set(err, r, "out of memory");
	strv_free(texts, chat->n_messages + 1);
	free(msgs);
	return r;
}

/*
 * Tokenize the request's input (and attachments, read from fds, or att_in
 * when given) into r->tokens, BOS first if wanted; of a chat session's
 * messages those r->drop marks are left out.
 */
static int request_tokenize(Request *r, Manager *m, const Turbokv__V1__Generate *g, const int *fds,
			    const Buf *att_in, Error *err)
{
	Buf att = { 0 };
	_cleanup_(freep) char *text = NULL;
	_cleanup_(freep) uint8_t *is_content = NULL;
	_cleanup_(freep) SessionMessage *kept = NULL; /* borrowed texts: the session's messages not dropped */
	size_t len;
	int k;

	const SessionState *st = r->session ? session_state(r->session) : NULL;
	bool chat = g->input_case == TURBOKV__V1__GENERATE__INPUT_CHAT;
	size_t n_prev = 0; /* raw sessions: token ids that go before the new text's */

	r->session_kind = chat ? SESSION_KIND_CHAT : SESSION_KIND_RAW;
	if (st && st->n_tokens > 0 && st->kind != (SessionKind)r->session_kind) {
		k = error_set(err, PROTOCOL_E_BAD_MESSAGE, "session '%s' holds a %s conversation; continue it with %s",
			      g->session, st->kind == SESSION_KIND_CHAT ? "chat" : "raw text",
			      st->kind == SESSION_KIND_CHAT ? "chat messages" : "raw_prompt");
		goto out;
	}
	if (st && !chat)
		n_prev = st->n_tokens;
	if (att_in)
		att = *att_in; /* borrowed: not freed here */
	else if ((k = attachments_read(m, g, fds, &att, err)) != 0)
		goto out;
	if (chat) {
		size_t n_kept = 0;
		if (st && st->n_messages && !(kept = calloc_array(st->n_messages, sizeof(*kept)))) {
			k = error_set(err, -ENOMEM, "out of memory");
			goto out;
		}
		for (size_t i = 0; r->drop && i < r->n_drop; i++)
			if (!r->drop[i])
				kept[n_kept++] = st->messages[i];
		if (!r->drop && kept)
			memcpy(kept, st->messages, (n_kept = st->n_messages) * sizeof(*kept));
		if ((k = chat_build(m, g->chat, &att, kept, n_kept, &text, &is_content,
				    r->session ? (SessionMessage **)&r->turns : NULL, &r->n_turns, err)) != 0)
			goto out;
		len = strlen(text);
	} else {
		Buf raw = { 0 };
		if (att_in)
			k = att.len ? buf_append(&raw, att.data, att.len) : 0; /* borrowed: copied */
		else {
			raw = att;
			att = (Buf){ 0 };
			k = 0;
		}
		if (k < 0 || (k = buf_append(&raw, g->raw_prompt.data ? g->raw_prompt.data : (const uint8_t *)"",
				    g->raw_prompt.len)) < 0) {
			buf_done(&raw);
			error_set(err, k, "out of memory");
			goto out;
		}
		text = raw.data;
		len = raw.len;
	}
	if (len / m->max_piece_bytes > (size_t)m->n_ctx) {
		k = error_set(err, PROTOCOL_E_CONTEXT_OVERFLOW, "a prompt of %zu bytes cannot fit a context of %lld tokens",
			      len, (long long)m->n_ctx);
		goto out;
	}

	int32_t *ids;
	size_t n;
	/* chat: special tokens only in the template's markup; raw prompts: none */
	if (is_content)
		k = tokenizer_encode_marked(m->tokenizer, text, len, is_content, &ids, &n);
	else
		k = tokenizer_encode(m->tokenizer, text ? text : "", len, false, &ids, &n);
	if (k != 0) {
		error_set(err, k < 0 ? k : -ENOMEM, "out of memory while tokenizing");
		k = k < 0 ? k : -ENOMEM;
		goto out;
	}
	bool bos = n_prev == 0 && tokenizer_add_bos(m->tokenizer) && tokenizer_bos(m->tokenizer) >= 0;
	if (n_prev > (size_t)m->n_ctx * 2) {
		free(ids);
		k = error_set(err, PROTOCOL_E_CONTEXT_OVERFLOW, "session '%s' holds %zu tokens, more than the context",
			      g->session, n_prev);
		goto out;
	}
	r->cap = n_prev + n + bos + 64;
	r->tokens = malloc_array(r->cap, sizeof(int32_t));
	if (!r->tokens) {
		free(ids);
		k = error_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	if (bos)
		r->tokens[0] = tokenizer_bos(m->tokenizer);
	if (n_prev)
		memcpy(r->tokens, st->tokens, n_prev * sizeof(int32_t));
	memcpy(r->tokens + n_prev + bos, ids, n * sizeof(int32_t));
	free(ids);
	r->n_prompt = r->n_tokens = n_prev + n + bos;
	k = 0;
out:
	if (!att_in)
		buf_done(&att);
	return k;
}

/* Prompt tokens a request must leave for its answer when older turns are dropped. */
static int64_t request_reserve(const Request *r, const Manager *m)
{
	int64_t want = r->max_tokens ? (int64_t)r->max_tokens : 1;
	return MAX(1, MIN(want, m->n_ctx / 2));
}

/*
 * CONTEXT_POLICY_TRUNCATE_OLDEST: mark the next whole oldest turn of the
 * session to drop: its first message that is neither a system message,
 * pinned nor dropped already, and the assistant answers right after it.
 * Returns false when nothing more may be dropped.
 */
static bool request_drop_turn(Request *r, const SessionState *st)
{
	size_t i = 0;
	while (i < r->n_drop && (r->drop[i] || st->messages[i].role == SESSION_ROLE_SYSTEM || st->messages[i].pinned))
		i++;
	if (i == r->n_drop)
		return false;
	r->drop[i++] = 1;
	while (i < r->n_drop && st->messages[i].role == SESSION_ROLE_ASSISTANT && !st->messages[i].pinned)
		r->drop[i++] = 1;
	return true;
}

/* Forget the prompt built by request_tokenize() (to build it again with fewer turns). */
static void request_untokenize(Request *r)
{
	for (size_t i = 0; i < r->n_turns; i++)
		free(r->turns[i].text);
	free(r->turns);
	r->turns = NULL;
	r->n_turns = 0;
	free(r->tokens);
	r->tokens = NULL;
	r->n_prompt = r->n_tokens = r->cap = 0;
}

/*
 * CONTEXT_POLICY_TRUNCATE_OLDEST without a session: the request's own
 * history (a stateless client sends it whole every time) loses whole
 * oldest turns as a session's would: a user message and the answers
 * after it; never a system message, never the last user message or what
 * follows it (the new turn, which also holds the attachments). Until the
 * prompt is within limit tokens, or nothing more may go.
 */
static int request_build_prompt_anon(Request *r, Manager *m, const Turbokv__V1__Generate *g, const Buf *att,
				     int64_t limit, Error *err)
{
	const Turbokv__V1__Chat *chat = g->chat;
	size_t n = chat->n_messages, last_user = n, first = 0;
	_cleanup_(freep) Turbokv__V1__ChatMessage **kept = calloc_array(n, sizeof(*kept));
	_cleanup_(freep) uint8_t *drop = calloc(n ? n : 1, 1);
	Turbokv__V1__Chat c2 = *chat;
	Turbokv__V1__Generate g2 = *g;
	int k;

	if (!kept || !drop)
		return error_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		if (chat->messages[i]->role == TURBOKV__V1__ROLE__ROLE_USER)
			last_user = i;
	g2.chat = &c2;
	for (;;) {
		c2.n_messages = 0;
		for (size_t i = 0; i < n; i++)
			if (!drop[i])
				kept[c2.n_messages++] = chat->messages[i];
		c2.messages = kept;
		if ((k = request_tokenize(r, m, &g2, NULL, att, err)) != 0)
			return k;
		if (!first)
			first = r->n_prompt;
		if ((int64_t)r->n_prompt <= limit)
			break;
		size_t i = 0;
		while (i < last_user && (drop[i] || chat->messages[i]->role == TURBOKV__V1__ROLE__ROLE_SYSTEM))
			i++;
		if (i >= last_user)
			break;
		drop[i++] = 1;
		while (i < last_user && chat->messages[i]->role == TURBOKV__V1__ROLE__ROLE_ASSISTANT)
			drop[i++] = 1;
		request_untokenize(r);
	}
	r->n_dropped = (uint32_t)(first - r->n_prompt);
	return 0;
}

/*
 * Build the prompt; with CONTEXT_POLICY_TRUNCATE_OLDEST drop whole oldest
 * turns (chat sessions) or the oldest tokens after BOS (raw sessions)
 * until the prompt leaves request_reserve() tokens, counting the dropped
 * prompt tokens in r->n_dropped.
 */
static int request_build_prompt(Request *r, Manager *m, const Turbokv__V1__Generate *g, const int *fds,
				Error *err)
{
	const SessionState *st = r->session ? session_state(r->session) : NULL;
	int64_t limit = m->n_ctx - request_reserve(r, m);
	bool chat = g->input_case == TURBOKV__V1__GENERATE__INPUT_CHAT;
	Buf att = { 0 };
	int k;

	if (r->policy != TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST || (!st && !chat))
		return request_tokenize(r, m, g, fds, NULL, err);
	if ((k = attachments_read(m, g, fds, &att, err)) != 0)
		goto out;
	if (!st) {
		k = request_build_prompt_anon(r, m, g, &att, limit, err);
		goto out;
	}
	if (chat && st->n_messages) {
		r->n_drop = st->n_messages;
		if (!(r->drop = calloc(r->n_drop, 1))) {
			k = error_set(err, -ENOMEM, "out of memory");
			goto out;
		}
	}
	size_t first = 0;
	for (;;) {
		if ((k = request_tokenize(r, m, g, fds, &att, err)) != 0)
			goto out;
		if (!first)
			first = r->n_prompt;
		if ((int64_t)r->n_prompt <= limit)
			break;
		if (!chat) {
			/* raw: the oldest tokens after BOS go, only the session's (never the new text's) */
			bool bos = st->n_tokens > 0 && tokenizer_add_bos(m->tokenizer) &&
				   st->tokens[0] == tokenizer_bos(m->tokenizer);
			size_t avail = st->n_tokens - bos, cut = MIN(avail, (size_t)((int64_t)r->n_prompt - limit));
			memmove(r->tokens + bos, r->tokens + bos + cut, (r->n_prompt - bos - cut) * sizeof(int32_t));
			r->n_prompt = r->n_tokens = r->n_prompt - cut;
			break;
		}
		if (!r->drop || !request_drop_turn(r, st))
			break;
		request_untokenize(r);
	}
	r->n_dropped = first - r->n_prompt;
	k = 0;
out:
	buf_done(&att);
	return k;
}

/*
 * Refuse a prompt that does not fit, never truncate it here: a prompt
 * that leaves no room for one answer token, or (CONTEXT_POLICY_ERROR) an
 * explicit max_tokens beyond the room. The daemon's default answer limit
 * refuses nothing: such an answer ends at the context's end (LENGTH).
 */
static int request_check_context(Request *r, Manager *m, const Turbokv__V1__Generate *g, Error *err)
{
	int64_t room = m->n_ctx - (int64_t)r->n_prompt;
	bool truncate = r->policy == TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST;
	char how[160] = "";

	if (r->n_prompt == 0)
		return error_set(err, PROTOCOL_E_BAD_MESSAGE, "the prompt is empty");
	if (room >= 1 && (r->policy != TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_ERROR || g->max_tokens == 0 ||
			  (int64_t)g->max_tokens <= room))
		return 0;
	if (truncate)
		snprintf(how, sizeof(how), "%s", r->session
			 ? "; only the system prompt, turns holding attachments and this request's turns are left: "
			   "shorten the question or start a new session"
			 : g->input_case == TURBOKV__V1__GENERATE__INPUT_CHAT
			 ? "; only the system prompt and the last user turn are left: shorten them"
			 : "; a raw prompt without a session has no older turns to drop: shorten it");
	else if (r->session)
		snprintf(how, sizeof(how), "; use --on-overflow drop-oldest (CONTEXT_POLICY_TRUNCATE_OLDEST) to drop "
			 "the oldest turns, or start a new session");
	else if (room < 1)
		snprintf(how, sizeof(how), "; shorten the prompt");
	else
		snprintf(how, sizeof(how), "; ask for fewer tokens");
	if (room < 1)
		return error_set(err, PROTOCOL_E_CONTEXT_OVERFLOW,
				 "the prompt has %zu tokens; the context holds %lld (and one more is needed to answer)%s",
				 r->n_prompt, (long long)m->n_ctx, how);
	return error_set(err, PROTOCOL_E_CONTEXT_OVERFLOW,
			 "the prompt (%zu tokens) plus max_tokens (%u) exceed the context of %lld tokens; nothing was "
			 "dropped%s", r->n_prompt, g->max_tokens, (long long)m->n_ctx, how);
}

/* The policy a request runs with: its own, else its session's, else the daemon's --on-overflow. */
static void request_policy(Request *r, Manager *m, const Turbokv__V1__Generate *g)
{
	const SessionState *st = r->session ? session_state(r->session) : NULL;
	static const SessionPolicy stored[] = {
		[TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_ERROR] = SESSION_POLICY_ERROR,
		[TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST] = SESSION_POLICY_DROP_OLDEST,
		[TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_STOP_AT_LIMIT] = SESSION_POLICY_STOP_AT_LIMIT,
	};

	if (g->context_policy != TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_ERROR || g->context_policy_set) {
		r->policy = g->context_policy; /* validated by protocol.c */
		r->store_policy = stored[g->context_policy];
	} else if (st && st->policy != SESSION_POLICY_NONE)
		r->policy = st->policy == SESSION_POLICY_DROP_OLDEST
			    ? TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST
			    : st->policy == SESSION_POLICY_STOP_AT_LIMIT
			    ? TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_STOP_AT_LIMIT
			    : TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_ERROR;
	else
		r->policy = m->config->drop_oldest ? TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_TRUNCATE_OLDEST
						   : TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_ERROR;
}

static int request_sampling(Request *r, const Turbokv__V1__Sampling *s)
{
	SamplerParams p = sampler_params_default();
	bool seeded = false;

	if (s) {
		if (s->opt_temperature_case == TURBOKV__V1__SAMPLING__OPT_TEMPERATURE_TEMPERATURE)
			p.temperature = s->temperature;
		if (s->opt_top_k_case == TURBOKV__V1__SAMPLING__OPT_TOP_K_TOP_K)
			p.top_k = (int)s->top_k;
		if (s->opt_top_p_case == TURBOKV__V1__SAMPLING__OPT_TOP_P_TOP_P)
			p.top_p = s->top_p;
		if (s->opt_min_p_case == TURBOKV__V1__SAMPLING__OPT_MIN_P_MIN_P)
			p.min_p = s->min_p;
		if (s->opt_repeat_penalty_case == TURBOKV__V1__SAMPLING__OPT_REPEAT_PENALTY_REPEAT_PENALTY)
			p.repeat_penalty = s->repeat_penalty;
		if (s->opt_repeat_last_n_case == TURBOKV__V1__SAMPLING__OPT_REPEAT_LAST_N_REPEAT_LAST_N)
			p.repeat_last_n = (int)s->repeat_last_n;
		if (s->opt_seed_case == TURBOKV__V1__SAMPLING__OPT_SEED_SEED) {
			p.seed = s->seed;
			seeded = true;
		}
		if (s->greedy)
			p.temperature = 0.0f;
	}
	if (!seeded && getrandom(&p.seed, sizeof(p.seed), GRND_NONBLOCK) != sizeof(p.seed))
		p.seed = now_ns();
	r->sampling = p;
	return 0;
}

static int request_copy_stops(Request *r, const Turbokv__V1__Generate *g)
{
	if (g->n_stop == 0)
		return 0;
	r->stops = calloc_array(g->n_stop, sizeof(uint8_t *));
	r->stop_lens = calloc_array(g->n_stop, sizeof(size_t));
	if (!r->stops || !r->stop_lens)
		return -ENOMEM;
	for (size_t i = 0; i < g->n_stop; i++) {
		if (!(r->stops[i] = malloc(g->stop[i].len ? g->stop[i].len : 1)))
			return -ENOMEM;
		memcpy(r->stops[i], g->stop[i].data, g->stop[i].len);
		r->stop_lens[i] = g->stop[i].len;
		r->n_stops++;
	}
	return 0;
}

int request_new_consume_fds(Manager *m, Connection *c, const Turbokv__V1__Generate *g, int *fds,
			    size_t n_fds, Request **ret, Error *err)
{
	Request *r = calloc(1, sizeof(*r));
	int k;

	if (!r) {
		k = error_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	r->manager = m;
	r->conn = c;
	r->id = g->request_id;
	r->uid = c->cred.uid;
	r->state = REQUEST_QUEUED;
	/* no max_tokens: the daemon's answer limit (config.h) */
	r->max_tokens = g->max_tokens ? g->max_tokens : m->config->answer_tokens;
	r->t_received = now_ns();
	if (g->session && g->session[0] &&
	    (k = sessions_acquire(m->sessions, c->cred.uid, g->session, &r->session, err)) != 0)
		goto out;
	request_policy(r, m, g);
	if ((k = request_build_prompt(r, m, g, fds, err)) != 0 || (k = request_check_context(r, m, g, err)) != 0)
		goto out;
	if ((k = request_sampling(r, g->sampling)) < 0 || (k = request_copy_stops(r, g)) < 0) {
		error_set(err, k, "out of memory");
		goto out;
	}
	text_stream_init(&r->stream, r->stops, r->stop_lens, r->n_stops);
	*ret = TAKE_PTR(r);
	k = 0;
out:
	for (size_t i = 0; i < n_fds; i++)
		safe_close(fds[i]);
	request_free(r);
	return k;
}

/* The request's answer as text: the pieces of its generated tokens. NULL on -ENOMEM. */
static char *request_answer(const Request *r, Manager *m, size_t *ret_len)
{
	size_t len = 0, plen;
	for (size_t i = r->n_prompt; i < r->n_tokens; i++) {
		tokenizer_piece(m->tokenizer, r->tokens[i], &plen);
		len += plen;
	}
	char *t = malloc(len + 1), *p = t;
	if (!t)
		return NULL;
	for (size_t i = r->n_prompt; i < r->n_tokens; i++) {
		const char *piece = tokenizer_piece(m->tokenizer, r->tokens[i], &plen);
		memcpy(p, piece, plen);
		p += plen;
	}
	*p = 0;
	*ret_len = len;
	return t;
}

/*
 * Give the session back: once the request ran, its cache, token ids, new
 * turns and answer (chat) become the session's; otherwise nothing changes.
 */
static void request_session_release(Request *r)
{
	Manager *m = r->manager;
	SessionMessage *turns = TAKE_PTR(r->turns);
	size_t n_turns = r->n_turns;

	r->n_turns = 0;
	if (r->kv && r->session_kind == SESSION_KIND_CHAT && r->n_generated > 0) {
		size_t len = 0;
		char *answer = request_answer(r, m, &len);
		SessionMessage *t = answer && !memchr(answer, 0, len) ? realloc(turns, (n_turns + 1) * sizeof(*t)) : NULL;
		if (t) {
			turns = t;
			turns[n_turns++] = (SessionMessage){ .role = SESSION_ROLE_ASSISTANT, .text = answer, .len = len };
		} else
			free(answer);
	}
	SessionRelease how = { .drop = r->drop, .n_drop = r->n_drop, .policy = r->store_policy };
	sessions_release(m->sessions, TAKE_PTR(r->session), TAKE_PTR(r->kv), r->tokens, r->n_tokens,
			 (SessionKind)r->session_kind, turns, n_turns, &how);
}

Request *request_free(Request *r)
{
	if (!r)
		return NULL;
	for (size_t i = 0; i < r->n_stops; i++)
		free(r->stops[i]);
	free(r->stops);
	free(r->stop_lens);
	text_stream_done(&r->stream);
	if (r->session)
		request_session_release(r);
	else if (r->kv && r->state == REQUEST_DECODE && r->manager->prefixes) {
		/* a finished prefill: the cache is whole, for the uid's next request with this prefix */
		const Config *cfg = r->manager->config;
		uint64_t used = sessions_memory_bytes(r->manager->sessions);
		uint64_t budget = cfg->session_memory > used ? cfg->session_memory - used : 0;
		(void)prefixcache_put(r->manager->prefixes, r->uid, TAKE_PTR(r->kv), r->tokens, r->n_tokens, r->n_prompt,
				      budget);
	}
	for (size_t i = 0; i < r->n_turns; i++)
		free(r->turns[i].text);
	free(r->turns);
	free(r->drop);
	kvcache_free(r->kv);
	sampler_free(r->sampler);
	free(r->logits);
	free(r->tokens);
	free(r);
	return NULL;
}

/*
 * Reuse the session's cache for the longest common token prefix of what
 * it holds and the prompt, minus at least the prompt's last token (its
 * logits are needed). Returns 1 if there was a cache to reuse.
 */
static int request_session_reuse(Request *r)
{
	const SessionState *st = session_state(r->session);
	KvCache *kv = session_take_kv(r->session);
	if (!kv)
		return 0;
	size_t n_kv = (size_t)kvcache_n_tokens(kv), keep = 0;
	size_t limit = MIN(MIN(n_kv, st->n_tokens), r->n_prompt - 1);
	while (keep < limit && st->tokens[keep] == r->tokens[keep])
		keep++;
	/* a sliding-window layer no longer holds what a query there sees: recompute from the start */
	if ((int64_t)keep < kvcache_rewind_floor(kv))
		keep = 0;
	kvcache_set_n_tokens(kv, (int64_t)keep); /* rewind to the divergence point */
	r->kv = kv;
	r->n_prefilled = r->n_cached = keep;
	return 1;
}

int request_activate(Request *r, Manager *m)
{
	/* Room for the prompt and the answer: a request with max_tokens needs no more than that. */
	int64_t cap = r->max_tokens ? MIN(m->n_ctx, (int64_t)r->n_prompt + r->max_tokens) : m->n_ctx;
	int k;

	assert(r->state == REQUEST_QUEUED);
	bool anon = !r->session && m->config->prefix_cache > 0;
	if (r->session || anon)
		cap = m->n_ctx; /* the session (or the prefix cache) goes on after this request */
	Error err = { 0 };
	size_t keep = 0;
	if (r->session && request_session_reuse(r))
		k = 0;
	else if (anon && (r->kv = prefixcache_take(m->prefixes, r->uid, r->tokens, r->n_prompt, cap, &keep))) {
		r->n_prefilled = r->n_cached = keep;
		k = 0;
	} else
		/* A fixed codec seed: the same question gets the same greedy answer
		 * (and turbokv-lab's, which uses seed 0 too); sessions record it. */
		k = model_kvcache_new(m->model, m->kv_plan, MANAGER_KV_SEED, cap, &r->kv, &err);
	if (k != 0) {
		/* on a GPU: how much device memory was asked for */
		log_error("request %llu: KV cache of %lld tokens on %s: %s", (unsigned long long)r->id,
			  (long long)cap, m->device_name, err.msg[0] ? err.msg : strerror(k < 0 ? -k : EINVAL));
		return k;
	}
	if ((k = sampler_new(&r->sampling, m->model->cfg.n_vocab, &r->sampler)) != 0)
		return k;
	if (!(r->logits = malloc_array((size_t)m->model->cfg.n_vocab, sizeof(float))))
		return -ENOMEM;
	r->state = REQUEST_PREFILL;
	return 0;
}

static void request_send_token(Request *r, const char *text, size_t len, int32_t id)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Token t = TURBOKV__V1__TOKEN__INIT;
	t.request_id = r->id;
	t.text = (ProtobufCBinaryData){ .len = len, .data = (uint8_t *)text };
	t.token_id = (uint32_t)id;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_TOKEN;
	msg.token = &t;
	if (!r->t_first_token)
		r->t_first_token = now_ns();
	connection_send(r->conn, &msg);
}

static void request_send_done(Request *r, Turbokv__V1__FinishReason reason)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Done d = TURBOKV__V1__DONE__INIT;
	d.request_id = r->id;
	d.finish_reason = reason;
	d.prompt_tokens = (uint32_t)r->n_prompt;
	d.cached_tokens = (uint32_t)r->n_cached;
	d.completion_tokens = r->n_generated;
	d.dropped_tokens = r->n_dropped;
	d.prefill_ms = r->prefill_ns / 1e6;
	d.decode_ms = r->decode_ns / 1e6;
	d.ttft_ms = r->t_first_token ? (r->t_first_token - r->t_received) / 1e6 : 0.0;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_DONE;
	msg.done = &d;
	connection_send(r->conn, &msg);
}

/* Send what the stream still holds, then Done. Returns 1 (finished). */
static int request_finish(Request *r, Turbokv__V1__FinishReason reason)
{
	const char *delta = NULL;
	size_t len = 0;
	if (reason != TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP_STRING &&
	    text_stream_flush(&r->stream, &delta, &len) == 0 && len > 0)
		request_send_token(r, delta, len, r->n_tokens > r->n_prompt ? r->tokens[r->n_tokens - 1] : 0);
	request_send_done(r, reason);
	return 1;
}

/* The answer reached the end of the context: LENGTH, as an answer limit (STOP_AT_LIMIT: CONTEXT_FULL). */
static int request_finish_full(Request *r)
{
	return request_finish(r, r->policy == TURBOKV__V1__CONTEXT_POLICY__CONTEXT_POLICY_STOP_AT_LIMIT
				 ? TURBOKV__V1__FINISH_REASON__FINISH_REASON_CONTEXT_FULL
				 : TURBOKV__V1__FINISH_REASON__FINISH_REASON_LENGTH);
}

static int request_fail(Request *r, int k)
{
	if (k == MODEL_E_CONTEXT)
		return request_finish_full(r);
	/* the device's own words go to the log, not to the client */
	log_error("request %llu: evaluation failed (%d) on %s %s", (unsigned long long)r->id, k,
		  r->manager->device_name, backend_last_error(r->manager->backend));
	connection_send_error(r->conn, r->id, PROTOCOL_E_INTERNAL, "evaluation failed: %s",
			      k < 0 ? strerror(-k) : "engine error");
	return 1;
}

int request_decode_fail(Request *r, int k)
{
	return request_fail(r, k);
}

int request_decode_input(Request *r, int32_t *ret_token)
{
	assert(r->state == REQUEST_DECODE && r->n_tokens > r->n_prompt);
	if (kvcache_n_tokens(r->kv) >= r->kv->shape.capacity)
		return request_finish_full(r);
	*ret_token = r->tokens[r->n_tokens - 1];
	return 0;
}

int request_decode_output(Request *r, Manager *m, float *logits, uint64_t eval_ns)
{
	uint64_t t0 = now_ns();
	int32_t next = sampler_sample(r->sampler, logits, r->tokens, r->n_tokens);
	r->decode_ns += eval_ns + (now_ns() - t0);
	if (tokenizer_is_eog(m->tokenizer, next))
		return request_finish(r, TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP);

	if (r->n_tokens == r->cap) {
		size_t cap = r->cap * 2;
		int32_t *p = cap > (size_t)m->n_ctx * 2 + 64 ? NULL : realloc(r->tokens, cap * sizeof(int32_t));
		if (!p)
			return request_fail(r, -ENOMEM);
		r->tokens = p;
		r->cap = cap;
	}
	r->tokens[r->n_tokens++] = next;
	r->n_generated++;
	m->tokens_generated++;

	size_t plen, len;
	const char *piece = tokenizer_piece(m->tokenizer, next, &plen);
	const char *delta;
	int k = text_stream_push(&r->stream, piece, plen, &delta, &len);
	if (k < 0)
		return request_fail(r, k);
	request_send_token(r, delta, len, next); /* every token, even with an empty delta: clients count them */
	if (k == 1)
		return request_finish(r, TURBOKV__V1__FINISH_REASON__FINISH_REASON_STOP_STRING);
	if (r->max_tokens && r->n_generated >= r->max_tokens)
		return request_finish(r, TURBOKV__V1__FINISH_REASON__FINISH_REASON_LENGTH);
	return 0;
}

int request_prefill_output(Request *r, Manager *m, size_t n, int k, uint64_t eval_ns)
{
	Turbokv__V1__ServerMessage msg = TURBOKV__V1__SERVER_MESSAGE__INIT;
	Turbokv__V1__Progress p = TURBOKV__V1__PROGRESS__INIT;

	assert(r->state == REQUEST_PREFILL && n > 0 && n <= r->n_prompt - r->n_prefilled);
	r->prefill_ns += eval_ns;
	if (k != 0)
		return request_fail(r, k);
	r->n_prefilled += n;
	p.request_id = r->id;
	p.prefilled_tokens = (uint32_t)r->n_prefilled;
	p.total_tokens = (uint32_t)r->n_prompt;
	msg.msg_case = TURBOKV__V1__SERVER_MESSAGE__MSG_PROGRESS;
	msg.progress = &p;
	connection_send(r->conn, &msg);
	if (r->n_prefilled < r->n_prompt)
		return 0;
	/* The first token comes from the prefill's logits, in this step: TTFT is the prefill and no more. */
	r->state = REQUEST_DECODE;
	return request_decode_output(r, m, r->logits, 0);
}

void request_cancel(Request *r, bool shutting_down)
{
	if (r->state == REQUEST_QUEUED)
		connection_send_error(r->conn, r->id, shutting_down ? PROTOCOL_E_SHUTTING_DOWN : PROTOCOL_E_CANCELLED,
				      shutting_down ? "the daemon is stopping" : "cancelled before it started");
	else
		request_send_done(r, TURBOKV__V1__FINISH_REASON__FINISH_REASON_CANCELLED);
}
