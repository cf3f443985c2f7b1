/*
 * chat.c: recognising chat templates and rendering conversations with them.
 *
 * Owns the C renderings of the template families in chat.h; they must
 * produce byte for byte what the model's Jinja template produces with
 * add_generation_prompt, except that the leading BOS the templates write
 * as `bos_token` is left out: the caller adds the BOS token itself when
 * tokenizer_add_bos() says so (llama.cpp does the same). Does not run
 * Jinja, tokenize, or know about tools.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/chat.h"
#include "engine/text/unicode.h"

/*
 * A growing NUL-terminated string. With track set it also keeps mask:
 * mask[i] is 1 where byte i came from a message's content, 0 where the
 * template wrote it.
 */
typedef struct Buf {
	char *p;
	uint8_t *mask;
	size_t n, cap;
	bool track;
	bool in_content; /* bytes added now are content */
} Buf;

static int buf_add(Buf *b, const char *s, size_t n)
{
	size_t need;

	if (size_add_overflows(b->n, n, &need) || size_add_overflows(need, 1, &need))
		return -ENOMEM;
	if (need > b->cap) {
		size_t cap = MAX(need, b->cap * 2);
		char *p = realloc(b->p, cap);
		if (!p)
			return -ENOMEM;
		b->p = p;
		if (b->track) {
			uint8_t *m = realloc(b->mask, cap);
			if (!m)
				return -ENOMEM;
			b->mask = m;
		}
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	if (b->track)
		memset(b->mask + b->n, b->in_content, n);
	b->n += n;
	b->p[b->n] = 0;
	return 0;
}

static int buf_puts(Buf *b, const char *s)
{
	return buf_add(b, s, strlen(s));
}

static void buf_done(Buf *b)
{
	free(b->p);
	free(b->mask);
}

/* Add a message's content (marked as such). */
static int buf_content(Buf *b, const char *s)
{
	b->in_content = true;
	int r = buf_puts(b, s);
	b->in_content = false;
	return r;
}

/* Python's str.strip() (Jinja's trim filter): the span without surrounding whitespace. */
static void py_strip(const char *s, size_t *ret_off, size_t *ret_len)
{
	size_t n = strlen(s), b = 0, e = n;

	while (b < e) {
		size_t k;
		uint32_t cp = unicode_decode_utf8(s + b, e - b, &k);
		if (!unicode_is_py_space(cp))
			break;
		b += k;
	}
	/* From the end: find the start of the last code point. */
	while (e > b) {
		size_t s0 = e - 1, k;
		while (s0 > b && ((unsigned char)s[s0] & 0xc0) == 0x80 && e - s0 < 4)
			s0--;
		uint32_t cp = unicode_decode_utf8(s + s0, e - s0, &k);
		if (s0 + k != e || !unicode_is_py_space(cp))
			break;
		e = s0;
	}
	*ret_off = b;
	*ret_len = e - b;
}

/* Add a message's content, stripped (marked as content). */
static int buf_content_stripped(Buf *b, const char *s)
{
	size_t off, len;

	py_strip(s, &off, &len);
	b->in_content = true;
	int r = buf_add(b, s + off, len);
	b->in_content = false;
	return r;
}

int chat_template_detect(const char *jinja, size_t len, ChatTemplate *ret)
{
#define HAS(m) (memmem(jinja, len, m, strlen(m)) != NULL)
	ChatTemplate t;

	if (HAS("<|im_start|>") && HAS("</think>"))
		t = CHAT_TEMPLATE_QWEN3;
	else if (HAS("<|im_start|>"))
		t = CHAT_TEMPLATE_CHATML;
	else if (HAS("<start_of_turn>"))
		t = CHAT_TEMPLATE_GEMMA;
	else if (HAS("<|start_header_id|>"))
		t = CHAT_TEMPLATE_LLAMA3;
	else if (HAS("[INST]") && HAS("<<SYS>>"))
		t = CHAT_TEMPLATE_LLAMA2;
	else if (HAS("[INST]"))
		t = CHAT_TEMPLATE_MISTRAL;
	else
		return CHAT_E_UNKNOWN_TEMPLATE;
#undef HAS
	*ret = t;
	return 0;
}

int chat_template_from_gguf(const Gguf *g, ChatTemplate *ret, Error *err)
{
	GgufStr s;

	if (gguf_get_str(g, "tokenizer.chat_template", &s))
		return error_set(err, CHAT_E_UNKNOWN_TEMPLATE,
				 "model has no tokenizer.chat_template; use raw prompting");
	if (chat_template_detect(s.ptr, s.len, ret))
		return error_set(err, CHAT_E_UNKNOWN_TEMPLATE,
				 "unrecognised chat template (not ChatML, Qwen3, Gemma, Llama 3, "
				 "Llama 2 or Mistral [INST]); use raw prompting");
	return 0;
}

const char *chat_template_name(ChatTemplate t)
{
	switch (t) {
	case CHAT_TEMPLATE_RAW:
		return "raw";
	case CHAT_TEMPLATE_CHATML:
		return "chatml";
	case CHAT_TEMPLATE_LLAMA3:
		return "llama3";
	case CHAT_TEMPLATE_MISTRAL:
		return "mistral";
	case CHAT_TEMPLATE_LLAMA2:
		return "llama2";
	case CHAT_TEMPLATE_GEMMA:
		return "gemma";
	case CHAT_TEMPLATE_QWEN3:
		return "qwen3";
	}
	return "unknown";
}

typedef enum Role {
	ROLE_SYSTEM,
	ROLE_USER,
	ROLE_ASSISTANT,
} Role;

static int role_of(const char *role, Role *ret)
{
	if (role && strcmp(role, "system") == 0)
		*ret = ROLE_SYSTEM;
	else if (role && strcmp(role, "user") == 0)
		*ret = ROLE_USER;
	else if (role && strcmp(role, "assistant") == 0)
		*ret = ROLE_ASSISTANT;
	else
		return CHAT_E_BAD_ROLE;
	return 0;
}

static const char *content_of(const ChatMessage *m)
{
	return m->content ? m->content : "";
}

/* <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n */
static int render_chatml(Buf *b, const ChatMessage *msgs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (buf_puts(b, "<|im_start|>") < 0 || buf_puts(b, msgs[i].role) < 0 ||
		    buf_puts(b, "\n") < 0 || buf_content(b, content_of(&msgs[i])) < 0 ||
		    buf_puts(b, "<|im_end|>\n") < 0)
			return -ENOMEM;
	return buf_puts(b, "<|im_start|>assistant\n");
}

/*
 * Qwen3: ChatML, except that an assistant message before the last user
 * message keeps only what follows its last </think>, left-stripped of
 * newlines (the template's content.split('</think>')[-1].lstrip('\n')).
 * The generation prompt opens the assistant turn; the model thinks first.
 */
static int render_qwen3(Buf *b, const ChatMessage *msgs, const Role *roles, size_t n)
{
	size_t last_user = 0;
	for (size_t i = 0; i < n; i++)
		if (roles[i] == ROLE_USER)
			last_user = i;
	for (size_t i = 0; i < n; i++) {
		const char *c = content_of(&msgs[i]);
		if (roles[i] == ROLE_ASSISTANT && i < last_user) {
			for (const char *t; (t = strstr(c, "</think>"));)
				c = t + strlen("</think>");
			while (*c == '\n')
				c++;
		}
		if (buf_puts(b, "<|im_start|>") < 0 || buf_puts(b, msgs[i].role) < 0 ||
		    buf_puts(b, "\n") < 0 || buf_content(b, c) < 0 || buf_puts(b, "<|im_end|>\n") < 0)
			return -ENOMEM;
	}
	return buf_puts(b, "<|im_start|>assistant\n");
}

/*
 * Gemma 3: <start_of_turn>{user|model}\n{content|trim}<end_of_turn>\n ...
 * <start_of_turn>model\n. A first system message is not a turn: its
 * content (untrimmed) and "\n\n" open the first turn's content.
 */
static int render_gemma(Buf *b, const ChatMessage *msgs, const Role *roles, size_t n)
{
	const char *prefix = NULL;
	size_t first = 0;
	if (n > 0 && roles[0] == ROLE_SYSTEM) {
		prefix = content_of(&msgs[0]);
		first = 1;
	}
	for (size_t i = first; i < n; i++) {
		int r = buf_puts(b, "<start_of_turn>");
		r = r ? r : buf_puts(b, roles[i] == ROLE_ASSISTANT ? "model" : msgs[i].role);
		r = r ? r : buf_puts(b, "\n");
		if (!r && i == first && prefix) {
			r = buf_content(b, prefix);
			r = r ? r : buf_puts(b, "\n\n");
		}
		r = r ? r : buf_content_stripped(b, content_of(&msgs[i]));
		r = r ? r : buf_puts(b, "<end_of_turn>\n");
		if (r < 0)
			return r;
	}
	return buf_puts(b, "<start_of_turn>model\n");
}

/* <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|> ... */
static int render_llama3(Buf *b, const ChatMessage *msgs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (buf_puts(b, "<|start_header_id|>") < 0 || buf_puts(b, msgs[i].role) < 0 ||
		    buf_puts(b, "<|end_header_id|>\n\n") < 0 ||
		    buf_content_stripped(b, content_of(&msgs[i])) < 0 || buf_puts(b, "<|eot_id|>") < 0)
			return -ENOMEM;
	return buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/*
 * Mistral v0.1/v0.2: [INST] {user} [/INST]{assistant}</s>. Their template
 * rejects system messages; we fold each into the next user turn
 * ("{system}\n\n{user}") rather than fail.
 */
static int render_mistral(Buf *b, const ChatMessage *msgs, const Role *roles, size_t n)
{
	const char *pending = NULL;

	for (size_t i = 0; i < n; i++) {
		const char *c = content_of(&msgs[i]);
		int r = 0;

		switch (roles[i]) {
		case ROLE_SYSTEM:
			pending = c;
			break;
		case ROLE_USER:
			r = buf_puts(b, "[INST] ");
			if (!r && pending) {
				r = buf_content(b, pending);
				r = r ? r : buf_puts(b, "\n\n");
				pending = NULL;
			}
			r = r ? r : buf_content(b, c);
			r = r ? r : buf_puts(b, " [/INST]");
			break;
		case ROLE_ASSISTANT:
			r = buf_content(b, c);
			r = r ? r : buf_puts(b, "</s>");
			break;
		}
		if (r < 0)
			return r;
	}
	return 0;
}

/*
 * Llama 2: the first message, if system, goes into the first turn as
 * <<SYS>>\n{system}\n<</SYS>>\n\n; every later user turn opens with <s>
 * (the first one's BOS is the caller's); contents are stripped. Later
 * system messages are dropped, as the template does.
 */
static int render_llama2(Buf *b, const ChatMessage *msgs, const Role *roles, size_t n)
{
	const char *sys = NULL;
	size_t first = 0;

	if (n > 0 && roles[0] == ROLE_SYSTEM) {
		sys = content_of(&msgs[0]);
		first = 1;
	}
	for (size_t i = first; i < n; i++) {
		_cleanup_(buf_done) Buf content = { 0 };
		int r = 0;

		if (i == first && sys) {
			r = buf_puts(&content, "<<SYS>>\n");
			r = r ? r : buf_puts(&content, sys);
			r = r ? r : buf_puts(&content, "\n<</SYS>>\n\n");
		}
		r = r ? r : buf_puts(&content, content_of(&msgs[i]));
		if (r < 0)
			return r;

		if (roles[i] == ROLE_USER) {
			r = i > first ? buf_puts(b, "<s>") : 0;
			r = r ? r : buf_puts(b, "[INST] ");
			r = r ? r : buf_content_stripped(b, content.p);
			r = r ? r : buf_puts(b, " [/INST]");
		} else if (roles[i] == ROLE_ASSISTANT) {
			r = buf_puts(b, " ");
			r = r ? r : buf_content_stripped(b, content.p);
			r = r ? r : buf_puts(b, " </s>");
		}
		if (r < 0)
			return r;
	}
	return 0;
}

static int render(ChatTemplate t, const ChatMessage *msgs, size_t n, const char *default_system,
		  char **ret_text, uint8_t **ret_is_content, Error *err)
{
	_cleanup_(buf_done) Buf b = { .track = ret_is_content != NULL };
	_cleanup_(freep) ChatMessage *all = NULL;
	_cleanup_(freep) Role *roles = NULL;
	size_t n_all = n;
	int r = 0;

	assert(msgs || n == 0);
	assert(ret_text);

	/* The default system prompt comes first when the conversation has none. */
	all = malloc_array(n + 1, sizeof(ChatMessage));
	roles = malloc_array(n + 1, sizeof(Role));
	if (!all || !roles)
		return -ENOMEM;
	if (n > 0 && default_system && (!msgs[0].role || strcmp(msgs[0].role, "system") != 0)) {
		all[0] = (ChatMessage){ .role = "system", .content = default_system };
		memcpy(all + 1, msgs, n * sizeof(ChatMessage));
		n_all = n + 1;
	} else if (n > 0) {
		memcpy(all, msgs, n * sizeof(ChatMessage));
	}
	for (size_t i = 0; i < n_all; i++)
		if (role_of(all[i].role, &roles[i]))
			return error_set(err, CHAT_E_BAD_ROLE,
					 "message %zu: role \"%s\" is not system, user or assistant",
					 i, all[i].role ? all[i].role : "(null)");

	switch (t) {
	case CHAT_TEMPLATE_RAW:
		for (size_t i = 0; i < n_all && !r; i++)
			r = buf_content(&b, content_of(&all[i]));
		break;
	case CHAT_TEMPLATE_CHATML:
		r = render_chatml(&b, all, n_all);
		break;
	case CHAT_TEMPLATE_LLAMA3:
		r = render_llama3(&b, all, n_all);
		break;
	case CHAT_TEMPLATE_MISTRAL:
		r = render_mistral(&b, all, roles, n_all);
		break;
	case CHAT_TEMPLATE_LLAMA2:
		r = render_llama2(&b, all, roles, n_all);
		break;
	case CHAT_TEMPLATE_GEMMA:
		r = render_gemma(&b, all, roles, n_all);
		break;
	case CHAT_TEMPLATE_QWEN3:
		r = render_qwen3(&b, all, roles, n_all);
		break;
	default:
		return error_set(err, CHAT_E_UNKNOWN_TEMPLATE, "unknown chat template %d", (int)t);
	}
	if (r < 0)
		return r;
	if (!b.p && buf_add(&b, "", 0) < 0)
		return -ENOMEM;
	if (ret_is_content)
		*ret_is_content = TAKE_PTR(b.mask);
	*ret_text = TAKE_PTR(b.p);
	return 0;
}

int chat_render(ChatTemplate t, const ChatMessage *msgs, size_t n, const char *default_system,
		char **ret_text, Error *err)
{
	return render(t, msgs, n, default_system, ret_text, NULL, err);
}

int chat_render_marked(ChatTemplate t, const ChatMessage *msgs, size_t n, const char *default_system,
		       char **ret_text, uint8_t **ret_is_content, Error *err)
{
	assert(ret_is_content);
	return render(t, msgs, n, default_system, ret_text, ret_is_content, err);
}

/*
 * The literal after "<|im_start|>system" + newline up to "<|im_end|>" in a
 * Jinja string (SmolLM2: "You are a helpful AI assistant named SmolLM,
 * trained by Hugging Face"). An occurrence followed by an expression
 * (' + messages[0]['content'] + ') is not a default and is skipped.
 */
char *chat_default_system_from_gguf(const Gguf *g)
{
	static const char open[] = "<|im_start|>system";
	static const char close[] = "<|im_end|>";
	GgufStr s;
	const char *p, *end;

	if (gguf_get_str(g, "tokenizer.chat_template", &s))
		return NULL;
	p = s.ptr;
	end = s.ptr + s.len;
	while ((p = memmem(p, (size_t)(end - p), open, sizeof(open) - 1))) {
		const char *q = p + sizeof(open) - 1, *c;
		_cleanup_(buf_done) Buf out = { 0 };
		bool literal = true;

		p = q;
		/* The newline, written either raw or as a \n escape. */
		if (q < end && *q == '\n')
			q++;
		else if (end - q >= 2 && q[0] == '\\' && q[1] == 'n')
			q += 2;
		else
			continue;
		c = memmem(q, (size_t)(end - q), close, sizeof(close) - 1);
		if (!c || c == q)
			continue;
		for (const char *x = q; x < c && literal; x++) {
			char ch = *x;
			if (ch == '\'' || ch == '"' || ch == '{' || ch == '}') {
				literal = false;
			} else if (ch == '\\' && x + 1 < c) {
				char e = *++x;
				ch = e == 'n' ? '\n' : e == 't' ? '\t' : e;
			}
			if (literal && buf_add(&out, &ch, 1) < 0)
				return NULL;
		}
		if (literal)
			return TAKE_PTR(out.p);
	}
	return NULL;
}
