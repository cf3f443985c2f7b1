/*
 * gen-old-sessions.c: writes the session files of tests/data/session/,
 * files as turbokv wrote them before session file version 4 (versions
 * 1, 2 and 3: TurboQuant descriptors, +c records and pk records in the
 * KV section, laid out by the session container itself). test-session
 * checks that today's reader recognises them as another KV layout and
 * recovers their conversation (the daemon then recomputes the prompt).
 *
 * Built against commit 919634a's engine (the include paths and API of
 * that commit) by scripts/gen-old-sessions.sh; not part of the build.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kvstore.h"
#include "engine/session.h"

/* The shape test-session.c's old_sessions test expects. */
#define NL 2
#define NH 2
#define KVH 1
#define D 32
#define CAP 128
#define N 70
#define VOCAB 1000
#define FP 0x0123456789abcdefull

static uint64_t rng_state = 0x5e55;

static float rnd(void)
{
	/* xorshift64*, uniform in (-1, 1): deterministic on every machine */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	uint64_t x = rng_state * 0x2545f4914f6cdd1dull;
	return (float)((double)(x >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static int write_one(const char *spec, const char *path)
{
	KvCacheShape sh = { .n_layers = NL, .n_heads = NH, .n_kv_heads = KVH, .head_dim = D, .capacity = CAP };
	KvPlan *plan = NULL;
	KvCache *kv = NULL;
	Error err = { 0 };
	if (kvplan_from_text(spec, NL, KVH, D, &plan, &err) || kvcache_new_quant(&sh, plan, 7, &kv, &err)) {
		fprintf(stderr, "%s: %s\n", spec, err.msg);
		return 1;
	}
	static float k[N * KVH * D], v[N * KVH * D], q[N * NH * D], out[N * NH * D];
	for (int i = 0; i < N * KVH * D; i++) {
		k[i] = rnd();
		v[i] = rnd();
	}
	for (int i = 0; i < N * NH * D; i++)
		q[i] = rnd();
	for (int l = 0; l < NL; l++) {
		kvcache_append(kv, l, 0, N, k, v);
		kvcache_attend(kv, NULL, l, 0, N, q, out);
	}
	kvcache_set_n_tokens(kv, N);
	static int32_t tokens[N + 2];
	for (int i = 0; i < N + 2; i++)
		tokens[i] = (i * 37 + 11) % VOCAB;
	SessionMessage msgs[2] = {
		{ .role = SESSION_ROLE_USER, .text = "Where is Lisbon?", .len = 16 },
		{ .role = SESSION_ROLE_ASSISTANT, .text = "In Portugal.", .len = 12 },
	};
	SessionState s = { .kind = SESSION_KIND_CHAT, .tokens = tokens, .n_tokens = N + 2,
			   .messages = msgs, .n_messages = 2, .kv = kv };
	FILE *f = fopen(path, "wb");
	if (!f || session_write_fd(fileno(f), &s, FP, spec, NULL, NULL, &err)) {
		fprintf(stderr, "%s: %s\n", path, err.msg);
		return 1;
	}
	fclose(f);
	kvcache_free(kv);
	kvplan_free(plan);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen-old-sessions DIR\n");
		return 2;
	}
	static const char *const specs[][2] = {
		{ "tq4:q8_0", "v1-tq4-q8_0.tkvs" },
		{ "tq4_nc+c:tq3.5_nc", "v2-centered.tkvs" },
		{ "pk4:tq3_nc", "v3-pk.tkvs" },
	};
	char path[4096];
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/%s", argv[1], specs[i][1]);
		if (write_one(specs[i][0], path))
			return 1;
	}
	return 0;
}
