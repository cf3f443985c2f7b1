/*
 * gen-v4v5-sessions.c: writes tests/data/session/v4-*.tkvs and v5-*.tkvs,
 * session files as turbokv wrote them in versions 4 and 5 (whole blocks
 * in the LAYER sections, the records "PLN1", "TQD1", "CTR1", "PKY1"),
 * each with the tokens the model goes on to generate (NAME.tokens).
 * test-session's test_v4_v5_files reads them with today's code.
 *
 * For each KV spec: the tiny K-quant model (tests/data/tiny/llama-kquant
 * .gguf, greedy) evaluates a 40-token prompt, generates 8 tokens, and the
 * session (the 48 tokens, all in the cache, and two messages) is saved;
 * then it evaluates token NEXT and generates 8 more, which go to
 * NAME.tokens as one line of ids.
 *
 * Built against an old commit's engine (its include paths and API are
 * today's) by scripts/gen-v4v5-sessions.sh; not part of the build.
 * Usage: gen-v4v5-sessions MODEL OUTDIR PREFIX
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf/gguf.h"
#include "engine/kv/kvstore.h"
#include "engine/kv/kvtype.h"
#include "engine/model/model.h"
#include "engine/session/session.h"

#define PROMPT 40
#define GEN 8
#define NEXT 3
#define CTX 128

static int argmax(const float *x, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

static int write_one(const Model *m, const char *spec, const char *dir, const char *name)
{
	Error err = { 0 };
	KvPlan *plan = NULL;
	KvCache *kv = NULL;
	ModelRun *run = NULL;
	int nv = m->cfg.n_vocab;
	float *logits = malloc(sizeof(float) * nv);
	int32_t tokens[PROMPT + GEN], more[GEN];
	if (strcmp(spec, "f32") != 0 &&
	    kvplan_from_text(spec, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim, &plan, &err)) {
		fprintf(stderr, "%s: %s\n", spec, err.msg);
		return 1;
	}
	if (model_kvcache_new(m, plan, 7, CTX, &kv, &err) || model_run_new(m, 64, NULL, &run)) {
		fprintf(stderr, "%s: %s\n", spec, err.msg);
		return 1;
	}
	for (int i = 0; i < PROMPT; i++)
		tokens[i] = (i * 37 + 11) % nv;
	if (model_eval(m, run, kv, tokens, PROMPT, logits, NULL))
		return 1;
	for (int i = 0; i < GEN; i++) {
		tokens[PROMPT + i] = argmax(logits, nv);
		if (model_eval(m, run, kv, &tokens[PROMPT + i], 1, logits, NULL))
			return 1;
	}
	SessionMessage msgs[2] = {
		{ .role = SESSION_ROLE_USER, .text = "Where is Lisbon?", .len = 16 },
		{ .role = SESSION_ROLE_ASSISTANT, .text = "In Portugal.", .len = 12 },
	};
	SessionState s = { .kind = SESSION_KIND_CHAT, .tokens = tokens, .n_tokens = PROMPT + GEN,
			   .messages = msgs, .n_messages = 2, .kv = kv };
	char path[512];
	snprintf(path, sizeof(path), "%s/%s.tkvs", dir, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || session_write_fd(fd, &s, gguf_fingerprint(m->gguf), spec, NULL, NULL, &err)) {
		fprintf(stderr, "%s: %s\n", path, err.msg);
		return 1;
	}
	close(fd);
	int32_t next = NEXT;
	if (model_eval(m, run, kv, &next, 1, logits, NULL))
		return 1;
	for (int i = 0; i < GEN; i++) {
		more[i] = argmax(logits, nv);
		if (model_eval(m, run, kv, &more[i], 1, logits, NULL))
			return 1;
	}
	snprintf(path, sizeof(path), "%s/%s.tokens", dir, name);
	FILE *f = fopen(path, "w");
	if (!f)
		return 1;
	for (int i = 0; i < GEN; i++)
		fprintf(f, "%d%c", more[i], i + 1 < GEN ? ' ' : '\n');
	fclose(f);
	model_run_free(run);
	kvcache_free(kv);
	kvplan_free(plan);
	free(logits);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct { const char *spec, *name; } files[] = {
		{ "q8_0", "q8_0" }, { "f32", "f32" }, { "pk5:tq3.5_nc", "pk5-tq3.5nc" },
	};
	if (argc != 4) {
		fprintf(stderr, "usage: %s MODEL OUTDIR PREFIX\n", argv[0]);
		return 2;
	}
	Model *m = NULL;
	Error err = { 0 };
	if (model_load(argv[1], &m, &err)) {
		fprintf(stderr, "%s: %s\n", argv[1], err.msg);
		return 1;
	}
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char name[128];
		snprintf(name, sizeof(name), "%s-%s", argv[3], files[i].name);
		if (write_one(m, files[i].spec, argv[2], name))
			return 1;
	}
	model_free(m);
	return 0;
}
