/*
 * test-chat.c: chat template detection and rendering.
 *
 * tests/data/chat/golden.txt holds conversations rendered by Python jinja2
 * from the default model's own template and from the Llama 3, Mistral and
 * Llama 2 templates stored as tests/data/chat/<name>.jinja
 * (scripts/gen-chat-golden.py).
 * Everything else here is derived by hand.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/text/chat.h"
#include "tests/unit/testutil.h"

static const char SMOLLM_SYSTEM[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Hex to a NUL-terminated malloc'd string. */
static char *unhex(const char *s)
{
	size_t n = strlen(s) / 2, i;
	char *out = malloc(n + 1);
	for (i = 0; i < n && hexval(s[2 * i]) >= 0 && hexval(s[2 * i + 1]) >= 0; i++)
		out[i] = (char)(hexval(s[2 * i]) << 4 | hexval(s[2 * i + 1]));
	out[i] = 0;
	return out;
}

/* ---- a minimal in-memory GGUF with string keys -------------------------- */

typedef struct Image {
	unsigned char *p;
	size_t n;
} Image;

static void img_add(Image *im, const void *d, size_t n)
{
	im->p = realloc(im->p, im->n + n);
	memcpy(im->p + im->n, d, n);
	im->n += n;
}

static void img_u32(Image *im, uint32_t v)
{
	img_add(im, &v, 4);
}

static void img_u64(Image *im, uint64_t v)
{
	img_add(im, &v, 8);
}

static void img_str(Image *im, const char *s)
{
	img_u64(im, strlen(s));
	img_add(im, s, strlen(s));
}

/* A GGUF v3 with no tensors and the given (key, string value) pairs. */
static Gguf *gguf_with_strings(Image *im, const char *const *kv, size_t n_kv)
{
	Gguf *g = NULL;
	Error err = { 0 };

	im->p = NULL;
	im->n = 0;
	img_u32(im, 0x46554747);
	img_u32(im, 3);
	img_u64(im, 0);
	img_u64(im, n_kv);
	for (size_t i = 0; i < n_kv; i++) {
		img_str(im, kv[2 * i]);
		img_u32(im, GGUF_TYPE_STRING);
		img_str(im, kv[2 * i + 1]);
	}
	int r = gguf_open_memory(im->p, im->n, &g, &err);
	ck_assert_msg(r == 0, "gguf_open_memory: %d %s", r, err.msg);
	return g;
}

/* ---- golden renderings -------------------------------------------------- */

static void render_case(const char *tname, const char *cname, ChatMessage *msgs, size_t n,
			const char *expect)
{
	ChatTemplate t, want;
	char *sys = NULL, *out = NULL, *src = NULL;
	Gguf *g = NULL;
	Error err = { 0 };
	int r;

	if (strcmp(tname, "gguf") == 0) {
		r = gguf_open(test_model_path(), &g, &err);
		ck_assert_msg(r == 0, "gguf_open: %s", err.msg);
		ck_assert_int_eq(chat_template_from_gguf(g, &t, &err), 0);
		sys = chat_default_system_from_gguf(g);
		ck_assert_ptr_nonnull(sys);
		ck_assert_str_eq(sys, SMOLLM_SYSTEM);
		want = CHAT_TEMPLATE_CHATML;
	} else {
		char path[256];
		size_t len;
		snprintf(path, sizeof(path), "chat/%s", tname);
		src = test_read_file(test_data_path(path), &len);
		ck_assert_msg(src, "missing %s", path);
		ck_assert_int_eq(chat_template_detect(src, len, &t), 0);
		want = strcmp(tname, "llama3.jinja") == 0	 ? CHAT_TEMPLATE_LLAMA3 :
		       strcmp(tname, "mistral.jinja") == 0 ? CHAT_TEMPLATE_MISTRAL :
							       CHAT_TEMPLATE_LLAMA2;
	}
	ck_assert_msg(t == want, "%s detected as %s", tname, chat_template_name(t));
	r = chat_render(t, msgs, n, sys, &out, &err);
	ck_assert_msg(r == 0, "%s/%s: render %d %s", tname, cname, r, err.msg);
	ck_assert_msg(strcmp(out, expect) == 0, "%s/%s:\n got  [%s]\n want [%s]", tname, cname, out,
		      expect);
	free(out);
	free(sys);
	free(src);
	gguf_free(g);
}

START_TEST(test_golden)
{
	size_t len;
	char *data = test_read_file(test_data_path("chat/golden.txt"), &len), *p, *l;
	char cname[128] = "", tname[128] = "";
	ChatMessage msgs[16];
	size_t n = 0;
	int n_cases = 0;

	ck_assert_msg(data, "missing chat/golden.txt");
	for (p = data; (l = strsep(&p, "\n"));) {
		if (strncmp(l, "case ", 5) == 0) {
			snprintf(cname, sizeof(cname), "%s", l + 5);
			n = 0;
		} else if (strncmp(l, "template ", 9) == 0) {
			snprintf(tname, sizeof(tname), "%s", l + 9);
		} else if (strncmp(l, "msg ", 4) == 0) {
			char *role = l + 4, *sp = strchr(role, ' ');
			ck_assert(sp && n < 16);
			*sp = 0;
			msgs[n].role = strdup(role);
			msgs[n].content = unhex(sp + 1);
			n++;
		} else if (strncmp(l, "expect", 6) == 0) {
			char *expect = unhex(l[6] ? l + 7 : l + 6);
			render_case(tname, cname, msgs, n, expect);
			for (size_t i = 0; i < n; i++) {
				free((char *)msgs[i].role);
				free((char *)msgs[i].content);
			}
			free(expect);
			n = 0;
			n_cases++;
		}
	}
	ck_assert_int_ge(n_cases, 30);
	free(data);
}
END_TEST

/* ---- detection and the hand-derived rest -------------------------------- */

START_TEST(test_detect)
{
	ChatTemplate t = CHAT_TEMPLATE_RAW;
	const char *s;

	s = "{{ '<|im_start|>' + m }}";
	ck_assert_int_eq(chat_template_detect(s, strlen(s), &t), 0);
	ck_assert_int_eq(t, CHAT_TEMPLATE_CHATML);
	s = "{{ '<|start_header_id|>' }}";
	ck_assert_int_eq(chat_template_detect(s, strlen(s), &t), 0);
	ck_assert_int_eq(t, CHAT_TEMPLATE_LLAMA3);
	s = "{{ '[INST] ' + x + ' [/INST]' }}";
	ck_assert_int_eq(chat_template_detect(s, strlen(s), &t), 0);
	ck_assert_int_eq(t, CHAT_TEMPLATE_MISTRAL);
	s = "{{ '<<SYS>>\\n' }}{{ '[INST]' }}";
	ck_assert_int_eq(chat_template_detect(s, strlen(s), &t), 0);
	ck_assert_int_eq(t, CHAT_TEMPLATE_LLAMA2);

	s = "{{ '<start_of_turn>' + role }}";
	ck_assert_int_eq(chat_template_detect(s, strlen(s), &t), 0);
	ck_assert_int_eq(t, CHAT_TEMPLATE_GEMMA);
	s = "{{ '<|im_start|>' }}{% if '</think>' in content %}";
	ck_assert_int_eq(chat_template_detect(s, strlen(s), &t), 0);
	ck_assert_int_eq(t, CHAT_TEMPLATE_QWEN3);

	t = CHAT_TEMPLATE_LLAMA3;
	s = "{% for m in messages %}<|turn|>{{ m.content }}{% endfor %}";
	ck_assert_int_eq(chat_template_detect(s, strlen(s), &t), CHAT_E_UNKNOWN_TEMPLATE);
	ck_assert_int_eq(t, CHAT_TEMPLATE_LLAMA3);  /* untouched on error */
	/* The marker must be inside the given length. */
	s = "xx<|im_start|>";
	ck_assert_int_eq(chat_template_detect(s, 5, &t), CHAT_E_UNKNOWN_TEMPLATE);

	ck_assert_str_eq(chat_template_name(CHAT_TEMPLATE_CHATML), "chatml");
	ck_assert_str_eq(chat_template_name(CHAT_TEMPLATE_RAW), "raw");
}
END_TEST

START_TEST(test_from_gguf_errors)
{
	static const char *const gemma[] = {
		"tokenizer.chat_template", "{{ '<|turn|>' + role }}",
	};
	static const char *const other[] = { "general.name", "x" };
	Image im;
	Gguf *g;
	ChatTemplate t;
	Error err = { 0 };

	g = gguf_with_strings(&im, gemma, 1);
	ck_assert_int_eq(chat_template_from_gguf(g, &t, &err), CHAT_E_UNKNOWN_TEMPLATE);
	ck_assert(strstr(err.msg, "unrecognised"));
	ck_assert_ptr_null(chat_default_system_from_gguf(g));
	gguf_free(g);
	free(im.p);

	g = gguf_with_strings(&im, other, 1);
	ck_assert_int_eq(chat_template_from_gguf(g, &t, &err), CHAT_E_UNKNOWN_TEMPLATE);
	ck_assert(strstr(err.msg, "no tokenizer.chat_template"));
	ck_assert_ptr_null(chat_default_system_from_gguf(g));
	gguf_free(g);
	free(im.p);
}
END_TEST

START_TEST(test_default_system)
{
	/* Qwen 2.5 style: the system turn from a message first, a \n-escaped default later. */
	static const char *const qwen[] = {
		"tokenizer.chat_template",
		"{%- if messages[0]['role'] == 'system' %}"
		"{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
		"{%- else %}"
		"{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
		"helpful assistant.<|im_end|>\\n' }}{%- endif %}",
	};
	static const char *const plain[] = {
		"tokenizer.chat_template",
		"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
		"message['content'] + '<|im_end|>' + '\n'}}{% endfor %}",
	};
	Image im;
	Gguf *g;
	char *s;

	g = gguf_with_strings(&im, qwen, 1);
	s = chat_default_system_from_gguf(g);
	ck_assert_ptr_nonnull(s);
	ck_assert_str_eq(s, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
	free(s);
	gguf_free(g);
	free(im.p);

	g = gguf_with_strings(&im, plain, 1);
	ck_assert_ptr_null(chat_default_system_from_gguf(g));
	gguf_free(g);
	free(im.p);
}
END_TEST

static void expect_render(ChatTemplate t, const ChatMessage *m, size_t n, const char *sys,
			  const char *want)
{
	char *out = NULL;
	Error err = { 0 };
	int r = chat_render(t, m, n, sys, &out, &err);
	ck_assert_msg(r == 0, "render: %d %s", r, err.msg);
	ck_assert_msg(strcmp(out, want) == 0, "got [%s]\nwant [%s]", out, want);
	free(out);
}

START_TEST(test_render_by_hand)
{
	const ChatMessage conv[] = {
		{ "system", "Be brief." }, { "user", "Hi" }, { "assistant", "Yo" }, { "user", "Q?" },
	};
	const ChatMessage bad[] = { { "user", "x" }, { "tool", "y" } };
	char *out = (char *)0x1;
	Error err = { 0 };

	/* Mistral has no system role: it is folded into the next user turn. */
	expect_render(CHAT_TEMPLATE_MISTRAL, conv, 4, NULL,
		      "[INST] Be brief.\n\nHi [/INST]Yo</s>[INST] Q? [/INST]");
	/* A default system prompt is used only without a system message. */
	expect_render(CHAT_TEMPLATE_CHATML, conv + 1, 1, "Sys",
		      "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
		      "<|im_start|>assistant\n");
	expect_render(CHAT_TEMPLATE_CHATML, conv, 2, "Sys",
		      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
		      "<|im_start|>assistant\n");
	expect_render(CHAT_TEMPLATE_RAW, conv, 4, NULL, "Be brief.HiYoQ?");
	/* Gemma 3: the system message opens the first turn (untrimmed), contents trimmed */
	const ChatMessage gconv[] = {
		{ "system", " Be brief." }, { "user", " Hi\n" }, { "assistant", "Yo " }, { "user", "Q?" },
	};
	expect_render(CHAT_TEMPLATE_GEMMA, gconv, 4, NULL,
		      "<start_of_turn>user\n Be brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"
		      "<start_of_turn>user\nQ?<end_of_turn>\n<start_of_turn>model\n");
	expect_render(CHAT_TEMPLATE_GEMMA, gconv + 1, 1, NULL,
		      "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
	/* Qwen3: earlier answers keep only what follows their last </think> */
	const ChatMessage qconv[] = {
		{ "user", "Hi" }, { "assistant", "<think>\nhm\n</think>\n\nYo" }, { "user", "Q?" },
	};
	expect_render(CHAT_TEMPLATE_QWEN3, qconv, 3, NULL,
		      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"
		      "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n");
	/* Python's strip() also removes U+001F and U+00A0, not U+200B. */
	const ChatMessage ws[] = { { "user", "\x1f\xc2\xa0 x \xe2\x80\x8b" } };
	expect_render(CHAT_TEMPLATE_LLAMA3, ws, 1, NULL,
		      "<|start_header_id|>user<|end_header_id|>\n\nx \xe2\x80\x8b<|eot_id|>"
		      "<|start_header_id|>assistant<|end_header_id|>\n\n");

	ck_assert_int_eq(chat_render(CHAT_TEMPLATE_CHATML, bad, 2, NULL, &out, &err),
			 CHAT_E_BAD_ROLE);
	ck_assert_ptr_eq(out, (char *)0x1);
	ck_assert(strstr(err.msg, "tool"));
}
END_TEST

static Suite *chat_suite(void)
{
	Suite *s = suite_create("chat");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_golden);
	tcase_add_test(tc, test_detect);
	tcase_add_test(tc, test_from_gguf_errors);
	tcase_add_test(tc, test_default_system);
	tcase_add_test(tc, test_render_by_hand);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return test_run_suite(chat_suite());
}
