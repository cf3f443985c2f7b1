/*
 * fuzz-chat.c: libFuzzer target for chat templates (engine/text/chat.c).
 *
 * The whole input is used two ways:
 *   - as a Jinja template string: chat_template_detect() on it, and on a
 *     GGUF image built here in memory whose tokenizer.chat_template is the
 *     input, chat_template_from_gguf() and chat_default_system_from_gguf();
 *   - as a conversation: split at NUL bytes, every part after the first
 *     (the template) is a message, its first byte picking the role
 *     (system, user, assistant, a bad role or none) and the rest the
 *     content; rendered by chat_render() with every template, with no
 *     default system prompt, a fixed one and the one the template embeds.
 * Promises checked, a broken one aborts: return codes are the documented
 * ones; the GGUF path agrees with chat_template_detect(); a rendered
 * prompt is NUL-terminated; raw, ChatML and Llama 3 renderings equal what
 * is built here independently (Llama 3 with its own Python-style strip).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/text/chat.h"
#include "engine/text/unicode.h"

#include "tests/fuzz/fuzz.h"

/* A growing byte string, aborting on allocation failure (test code). */
typedef struct Str {
	char *p;
	size_t n, cap;
} Str;

static void str_add(Str *s, const void *p, size_t n)
{
	if (s->n + n + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 64;
		while (cap < s->n + n + 1)
			cap *= 2;
		s->p = realloc(s->p, cap);
		CHECK(s->p);
		s->cap = cap;
	}
	if (n)
		memcpy(s->p + s->n, p, n);
	s->n += n;
	s->p[s->n] = 0;
}

static void str_puts(Str *s, const char *p)
{
	str_add(s, p, strlen(p));
}

/* ---- the template as a string and inside a GGUF ------------------------- */

static void put_u32(Str *s, uint32_t v)
{
	uint8_t b[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
	str_add(s, b, 4);
}

static void put_u64(Str *s, uint64_t v)
{
	put_u32(s, (uint32_t)v);
	put_u32(s, (uint32_t)(v >> 32));
}

/*
 * GGUF v3, no tensors, two kvs: general.architecture = "llama" and
 * tokenizer.chat_template = the input; padded to the 32-byte alignment.
 */
static void gguf_image(const uint8_t *data, size_t size, Str *out)
{
	static const char arch[] = "general.architecture", key[] = "tokenizer.chat_template";

	str_add(out, "GGUF", 4);
	put_u32(out, 3);
	put_u64(out, 0);   /* n_tensors */
	put_u64(out, 2);   /* n_kv */
	put_u64(out, sizeof(arch) - 1);
	str_add(out, arch, sizeof(arch) - 1);
	put_u32(out, GGUF_TYPE_STRING);
	put_u64(out, 5);
	str_add(out, "llama", 5);
	put_u64(out, sizeof(key) - 1);
	str_add(out, key, sizeof(key) - 1);
	put_u32(out, GGUF_TYPE_STRING);
	put_u64(out, size);
	str_add(out, data, size);
	while (out->n % 32)
		str_add(out, "", 1);
}

/* Returns the default system prompt the template embeds, or NULL. */
static char *check_template(const uint8_t *data, size_t size)
{
	Str img = { 0 };
	Gguf *g = NULL;
	Error err = { 0 };
	ChatTemplate t = CHAT_TEMPLATE_RAW, tg = CHAT_TEMPLATE_RAW;
	char *sys;
	int r, rg;

	r = chat_template_detect((const char *)data, size, &t);
	CHECK(r == 0 || r == CHAT_E_UNKNOWN_TEMPLATE);
	if (r == 0)
		CHECK(t >= CHAT_TEMPLATE_CHATML && t <= CHAT_TEMPLATE_QWEN3);
	if (memmem(data, size, "<|im_start|>", 12))
		CHECK(r == 0 && t == (memmem(data, size, "</think>", 8) ? CHAT_TEMPLATE_QWEN3 : CHAT_TEMPLATE_CHATML));
	if (!memmem(data, size, "<|im_start|>", 12) && !memmem(data, size, "<|start_header_id|>", 19) &&
	    !memmem(data, size, "[INST]", 6) && !memmem(data, size, "<start_of_turn>", 15))
		CHECK(r == CHAT_E_UNKNOWN_TEMPLATE);

	gguf_image(data, size, &img);
	rg = gguf_open_memory(img.p, img.n, &g, &err);
	if (rg == -ENOMEM) {
		free(img.p);
		return NULL;
	}
	CHECK(rg == 0);
	rg = chat_template_from_gguf(g, &tg, &err);
	CHECK(rg == r);
	CHECK(rg || tg == t);
	CHECK(!rg || (err.code == rg && err.msg[0]));

	sys = chat_default_system_from_gguf(g);
	if (sys) {
		/* Escapes only shrink it; an escaped brace or a NUL may be in it. */
		CHECK(strlen(sys) <= size);
		CHECK(memmem(data, size, "<|im_start|>system", 18));
	}
	gguf_free(g);
	free(img.p);
	return sys;
}

/* ---- conversations ------------------------------------------------------ */

static const char *const role_names[] = { "system", "user", "assistant", "tool", NULL };

typedef struct Conversation {
	ChatMessage *msgs;
	char **texts;      /* owned copies of each content */
	size_t n;
	bool bad_role;
} Conversation;

/*
 * Split data at NUL bytes; the first part is left to the template, each
 * later one is a message: role byte, content.
 */
static void conversation_parse(const uint8_t *data, size_t size, Conversation *c)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t max = 1;

	for (size_t i = 0; i < size; i++)
		max += data[i] == 0;
	c->msgs = calloc(max, sizeof(ChatMessage));
	c->texts = calloc(max, sizeof(char *));
	CHECK(c->msgs && c->texts);
	for (size_t i = nul ? (size_t)(nul - data) + 1 : size; i < size;) {
		const uint8_t *end = memchr(data + i, 0, size - i);
		size_t n = end ? (size_t)(end - (data + i)) : size - i;

		if (n > 0) {
			const char *role = role_names[data[i] % 5];
			char *text = malloc(n);
			CHECK(text);
			memcpy(text, data + i + 1, n - 1);
			text[n - 1] = 0;
			c->texts[c->n] = text;
			c->msgs[c->n] = (ChatMessage){ .role = role, .content = text };
			/* An empty part carries no content at all: NULL means "". */
			if (n == 1 && data[i] % 7 == 0)
				c->msgs[c->n].content = NULL;
			if (!role || strcmp(role, "tool") == 0)
				c->bad_role = true;
			c->n++;
		}
		i += n + 1;
	}
}

static void conversation_done(Conversation *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->texts[i]);
	free(c->texts);
	free(c->msgs);
}

/*
 * Python's str.strip() over UTF-8 decoded front to back: bytes that are
 * not UTF-8 count as non-space characters.
 */
static void strip_ref(const char *s, size_t *ret_off, size_t *ret_len)
{
	size_t n = strlen(s), i = 0, first = n, last_end = 0;

	while (i < n) {
		size_t k;
		uint32_t cp = unicode_decode_utf8(s + i, n - i, &k);
		bool space = cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) ||
			     cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
			     cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
			     cp == 0x3000;
		if (!space) {
			if (first == n)
				first = i;
			last_end = i + k;
		}
		i += k;
	}
	*ret_off = first == n ? 0 : first;
	*ret_len = first == n ? 0 : last_end - first;
}

/* What chat_render() must produce for the templates simple enough to restate. */
static bool expected_render(ChatTemplate t, const ChatMessage *msgs, size_t n, Str *out)
{
	for (size_t i = 0; i < n; i++) {
		const char *c = msgs[i].content ? msgs[i].content : "";
		size_t off, len;

		switch (t) {
		case CHAT_TEMPLATE_RAW:
			str_puts(out, c);
			break;
		case CHAT_TEMPLATE_CHATML:
			str_puts(out, "<|im_start|>");
			str_puts(out, msgs[i].role);
			str_puts(out, "\n");
			str_puts(out, c);
			str_puts(out, "<|im_end|>\n");
			break;
		case CHAT_TEMPLATE_LLAMA3:
			str_puts(out, "<|start_header_id|>");
			str_puts(out, msgs[i].role);
			str_puts(out, "<|end_header_id|>\n\n");
			strip_ref(c, &off, &len);
			str_add(out, c + off, len);
			str_puts(out, "<|eot_id|>");
			break;
		default:
			return false;
		}
	}
	if (t == CHAT_TEMPLATE_CHATML)
		str_puts(out, "<|im_start|>assistant\n");
	else if (t == CHAT_TEMPLATE_LLAMA3)
		str_puts(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
	str_add(out, "", 0);
	return true;
}

static void check_render(ChatTemplate t, const Conversation *c, const char *default_system)
{
	Error err = { 0 };
	char *text = NULL;
	int r = chat_render(t, c->msgs, c->n, default_system, &text, &err);
	ChatMessage *all;
	size_t n_all = c->n;
	Str want = { 0 };

	if (r == -ENOMEM)
		return;
	if (c->bad_role) {
		CHECK(r == CHAT_E_BAD_ROLE && err.code == r && err.msg[0] && !text);
		return;
	}
	CHECK(r == 0 && text);
	(void)strlen(text);  /* NUL-terminated inside its allocation (ASan checks) */

	/* The default system prompt leads when the conversation opens otherwise. */
	all = calloc(c->n + 1, sizeof(ChatMessage));
	CHECK(all);
	if (c->n > 0 && default_system && strcmp(c->msgs[0].role, "system") != 0) {
		all[0] = (ChatMessage){ .role = "system", .content = default_system };
		memcpy(all + 1, c->msgs, c->n * sizeof(ChatMessage));
		n_all++;
	} else if (c->n > 0) {
		memcpy(all, c->msgs, c->n * sizeof(ChatMessage));
	}
	if (expected_render(t, all, n_all, &want))
		CHECK(strcmp(text, want.p) == 0);
	else if (t == CHAT_TEMPLATE_MISTRAL || t == CHAT_TEMPLATE_LLAMA2)
		CHECK(n_all > 0 || text[0] == 0);
	free(want.p);
	free(all);
	free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const ChatTemplate templates[] = {
		CHAT_TEMPLATE_RAW, CHAT_TEMPLATE_CHATML, CHAT_TEMPLATE_LLAMA3,
		CHAT_TEMPLATE_MISTRAL, CHAT_TEMPLATE_LLAMA2,
	};
	Conversation conv = { 0 };
	char *sys = check_template(data, size);
	Error err = { 0 };
	char *text = NULL;

	conversation_parse(data, size, &conv);
	for (size_t i = 0; i < sizeof(templates) / sizeof(templates[0]); i++) {
		CHECK(strcmp(chat_template_name(templates[i]), "unknown") != 0);
		check_render(templates[i], &conv, NULL);
		check_render(templates[i], &conv, "You are a helpful assistant.");
		if (sys)
			check_render(templates[i], &conv, sys);
	}
	/* A value outside the enum is refused, not rendered. */
	if (!conv.bad_role) {
		int r = chat_render((ChatTemplate)99, conv.msgs, conv.n, NULL, &text, &err);
		CHECK(r == CHAT_E_UNKNOWN_TEMPLATE && !text);
	}
	conversation_done(&conv);
	free(sys);
	return 0;
}
