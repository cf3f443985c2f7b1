/*
 * chat.h: chat templates, recognised from the GGUF's tokenizer.chat_template.
 *
 * We do not run Jinja. We recognise the template families users have
 * (ChatML: SmolLM2, Qwen; Qwen3's ChatML with thinking; Gemma 3; Llama 3;
 * Mistral / Llama 2 [INST]) by
 * distinctive markers and render them with C code. Anything else is
 * CHAT_E_UNKNOWN_TEMPLATE unless the caller asks for raw prompting.
 *
 * Renderings match the families' Jinja templates byte for byte except
 * that the leading `bos_token` is left out: callers add the BOS token
 * when tokenizer_add_bos() says so. Roles are system, user, assistant.
 * Llama 3.1+ templates (tools, "Cutting Knowledge Date" system header) and
 * Mistral v0.3+ ("[/INST]" without a space) are rendered as Llama 3 and
 * Mistral v0.1 and so differ from their own Jinja.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf/gguf.h"

enum {
	CHAT_E_UNKNOWN_TEMPLATE = 1,
	CHAT_E_BAD_ROLE,
};

typedef enum ChatTemplate {
	CHAT_TEMPLATE_RAW = 0,  /* concatenate contents, no markup */
	CHAT_TEMPLATE_CHATML,
	CHAT_TEMPLATE_LLAMA3,
	CHAT_TEMPLATE_MISTRAL,  /* Mistral v0.1/v0.2: [INST] without <<SYS>> */
	CHAT_TEMPLATE_LLAMA2,   /* Llama 2: [INST] with <<SYS>>, <s> before later turns */
	CHAT_TEMPLATE_GEMMA,    /* Gemma 3: <start_of_turn>user|model, system merged into the first turn */
	CHAT_TEMPLATE_QWEN3,    /* ChatML with Qwen3's thinking: earlier answers lose their <think> part */
} ChatTemplate;

typedef struct ChatMessage {
	const char *role;     /* "system", "user", "assistant" */
	const char *content;
} ChatMessage;

/* Recognise the template of a model. Returns 0 or CHAT_E_UNKNOWN_TEMPLATE. */
int chat_template_from_gguf(const Gguf *g, ChatTemplate *ret, Error *err);

/* Recognise a Jinja template string. */
int chat_template_detect(const char *jinja, size_t len, ChatTemplate *ret);

const char *chat_template_name(ChatTemplate t);

/*
 * Render messages into a prompt ending with the assistant's turn opened
 * (add_generation_prompt). default_system is used when the template adds
 * one by default and no system message is given (SmolLM2 does); may be
 * NULL. *ret_text is malloc'd and NUL-terminated. Special tokens appear
 * as text: encode with parse_special. Returns 0, -ENOMEM or CHAT_E_*.
 */
int chat_render(ChatTemplate t, const ChatMessage *msgs, size_t n, const char *default_system,
		char **ret_text, Error *err);

/*
 * chat_render() that also says where each byte came from: *ret_is_content
 * (strlen(*ret_text) bytes, malloc'd) is 1
 * for bytes of message contents and 0 for the template's markup. Encode
 * with tokenizer_encode_marked() so that text a user typed is never
 * parsed as special tokens (no forged <|im_end|><|im_start|>system turns).
 */
int chat_render_marked(ChatTemplate t, const ChatMessage *msgs, size_t n, const char *default_system,
		       char **ret_text, uint8_t **ret_is_content, Error *err);

/* The default system prompt embedded in a ChatML template (SmolLM2's), or NULL. */
char *chat_default_system_from_gguf(const Gguf *g);
