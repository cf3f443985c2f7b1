/*
 * fuzz-session.c: libFuzzer target for the session file reader
 * (session_read in engine/session/session.c).
 *
 * The input is read against each of a few expectations: the shape of the
 * seed corpus (3 layers, 4 query heads, 2 kv-heads of 64, vocabulary
 * 1000, capacity 256, fingerprint 0x0123456789abcdef; the corpus is
 * written by tests/unit/test-session.c with TKV_SESSION_CORPUS=DIR) under
 * the f32 cache, q8_0, tq4, "tq4+qjl:tq3.5o", "tq4_nc+c:tq3" (centered
 * keys), "pk4:tq3" (pair-coded keys) and the default "pk5:tq3.5_nc"
 * (version 6's compact records and blocks; the corpus has files of 1 and
 * 44 tokens). An input whose last byte is odd gets its header and section
 * checksums recomputed first (walking the section lengths it claims), so
 * that mutations also reach the checks behind the CRCs.
 *
 * Promises checked for every input: the reader fails with a documented
 * code and a message, or returns a state whose counts agree (n_kv <=
 * n_tokens, token ids in the vocabulary, the cache within its capacity)
 * and whose cache runs attention over all its tokens (ASan watches the
 * reads); saving that state and reading it back succeeds with the same
 * tokens.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "engine/session/session.h"

#include "tests/fuzz/fuzz.h"

#define NL 3
#define NH 4
#define KVH 2
#define D 64
#define CAP 256
#define VOCAB 1000
#define FP 0x0123456789abcdefull

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Recompute the header CRC and every whole section's CRC in place. */
static void fix_crcs(uint8_t *b, size_t len)
{
	if (len < SESSION_HEADER_BYTES)
		return;
	put32(b + 60, crc32c(b, 60));
	size_t pos = SESSION_HEADER_BYTES;
	while (len - pos >= SESSION_SECTION_HEADER_BYTES + 4) {
		uint64_t l = 0;
		for (int i = 0; i < 8; i++)
			l |= (uint64_t)b[pos + 8 + i] << (8 * i);
		if (l > len - pos - SESSION_SECTION_HEADER_BYTES - 4)
			return;
		put32(b + pos + SESSION_SECTION_HEADER_BYTES + l, crc32c(b + pos, SESSION_SECTION_HEADER_BYTES + l));
		pos += SESSION_SECTION_HEADER_BYTES + l + 4;
	}
}

static void check_state(const SessionState *s, const SessionExpect *e)
{
	int64_t n_kv = kvcache_n_tokens(s->kv);
	CHECK(n_kv >= 0 && (uint64_t)n_kv <= s->n_tokens && n_kv <= e->shape.capacity);
	CHECK(s->n_tokens <= SESSION_MAX_TOKENS);
	for (size_t i = 0; i < s->n_tokens; i++)
		CHECK(s->tokens[i] >= 0 && s->tokens[i] < e->n_vocab);
	for (size_t i = 0; i < s->n_messages; i++)
		CHECK(s->messages[i].text && strlen(s->messages[i].text) == s->messages[i].len);
	CHECK(s->kind == SESSION_KIND_RAW || s->kind == SESSION_KIND_CHAT);

	if (n_kv > 0) {
		float *q = calloc(NH * D, sizeof(float)), *out = malloc(NH * D * sizeof(float));
		CHECK(q && out);
		for (int i = 0; i < NH * D; i++)
			q[i] = (float)((i % 7) - 3) * 0.1f;
		for (int l = 0; l < NL; l++)
			CHECK(kvcache_attend(s->kv, NULL, l, n_kv - 1, 1, q, out) == 0);
		free(q);
		free(out);
	}

	/* it saves, and reads back */
	int fd = memfd_create("session", MFD_CLOEXEC);
	CHECK(fd >= 0);
	uint64_t bytes = 0;
	int r = session_write_fd(fd, s, e->fingerprint, "fuzz", NULL, &bytes, NULL);
	CHECK(r == 0 || r == -ENOMEM);
	if (r == 0) {
		uint8_t *again = malloc(bytes);
		CHECK(again && pread(fd, again, bytes, 0) == (ssize_t)bytes);
		SessionState *t = NULL;
		r = session_read(again, bytes, e, &t, NULL);
		CHECK(r == 0 || r == -ENOMEM);
		if (r == 0) {
			CHECK(t->n_tokens == s->n_tokens && t->n_messages == s->n_messages);
			CHECK(s->n_tokens == 0 || memcmp(t->tokens, s->tokens, s->n_tokens * sizeof(int32_t)) == 0);
			CHECK(kvcache_n_tokens(t->kv) == n_kv);
		}
		session_state_free(t);
		free(again);
	}
	close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	static const char *const specs[] = { NULL, "q8_0", "tq4", "tq4+qjl:tq3.5o", "tq4_nc+c:tq3",
					       "pk4:tq3", "pk5:tq3.5_nc" };
	static KvPlan *plans[ARRAY_SIZE(specs)];
	static bool ready;
	if (!ready) {
		for (size_t i = 1; i < ARRAY_SIZE(specs); i++)
			CHECK(kvplan_from_text(specs[i], NL, KVH, D, &plans[i], NULL) == 0);
		ready = true;
	}

	uint8_t *data = malloc(size ? size : 1); /* exact size: ASan sees overreads */
	CHECK(data);
	memcpy(data, input, size);
	if (size > 0 && (input[size - 1] & 1))
		fix_crcs(data, size);

	for (size_t i = 0; i < ARRAY_SIZE(specs); i++) {
		SessionExpect e = {
			.fingerprint = FP,
			.shape = { .n_layers = NL, .n_heads = NH, .n_kv_heads = KVH, .head_dim = D, .capacity = CAP },
			.n_vocab = VOCAB,
			.plan = plans[i],
		};
		SessionState *s = NULL;
		Error err = { 0 };
		int r = session_read(data, size, &e, &s, &err);
		if (r != 0) {
			CHECK(s == NULL);
			CHECK(r == -ENOMEM || (r >= SESSION_E_TRUNCATED && r <= SESSION_E_TOO_LARGE));
			CHECK(err.msg[0] != 0);
			continue;
		}
		check_state(s, &e);
		session_state_free(s);
	}
	free(data);
	return 0;
}
