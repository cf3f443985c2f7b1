/*
 * lab.h: what the turbokv-lab subcommands share: the options every one of
 * them takes (model, threads, context, --json), loading, JSON output.
 */
#pragma once

#include <stdbool.h>
#include <stdio.h>

#include "engine/model/model.h"
#include "engine/text/tokenizer.h"
#include "kernels/cpu/threadpool.h"

/* Exit codes of turbokv-lab. */
enum {
	LAB_EXIT_OK = 0,
	LAB_EXIT_FAILURE = 1, /* runtime failure (model rejected, out of memory) */
	LAB_EXIT_USAGE = 2,   /* bad command line */
};

typedef struct LabCommon {
	const char *model_path;
	DeviceChoice device;
	int threads;
	int64_t ctx;
	bool json;
} LabCommon;

/* Path of the default model: $TURBOKV_MODEL, else the setup script's cache. */
const char *lab_default_model_path(char *buf, size_t size);

/* Set defaults (threads: online CPUs capped at 8; ctx: model's, capped at 8192). */
void lab_common_init(LabCommon *c);

/*
 * Handle a shared option (getopt_long value opt, argument arg). Returns 1
 * if it was one, 0 if not, -1 on a bad value (message printed).
 */
int lab_common_option(LabCommon *c, int opt, const char *arg);

/* Long options for the shared flags; ids are the LAB_OPT_* values. */
enum {
	LAB_OPT_MODEL = 'm',
	LAB_OPT_THREADS = 't',
	LAB_OPT_CTX = 'c',
	LAB_OPT_JSON = 0x1000,
	LAB_OPT_DEVICE,
};
#define LAB_COMMON_LONGOPTS                                              \
	{ "model", required_argument, NULL, LAB_OPT_MODEL },             \
	{ "threads", required_argument, NULL, LAB_OPT_THREADS },         \
	{ "ctx", required_argument, NULL, LAB_OPT_CTX },                 \
	{ "json", no_argument, NULL, LAB_OPT_JSON },                     \
	{ "device", required_argument, NULL, LAB_OPT_DEVICE }
#define LAB_COMMON_SHORTOPTS "m:t:c:"
#define LAB_COMMON_HELP                                                              \
	"  -m, --model PATH    GGUF model (default: $TURBOKV_MODEL or the setup cache)\n" \
	"      --device D      auto, cpu or cuda (default cpu)\n"                     \
	"  -t, --threads N     worker threads (default: CPUs, at most 8)\n"            \
	"  -c, --ctx N         context size in tokens (default: the model's, at most 8192)\n" \
	"      --json          machine-readable output\n"

/*
 * Load model and tokenizer on --device, printing errors. The backend
 * lives until the program exits. Returns 0 or -1.
 */
int lab_load(const LabCommon *c, Model **ret_model, Tokenizer **ret_tok);

/*
 * The KV cache of --kv spec for m with n_ctx tokens, in m's backend: the
 * plain f32 cache when spec is NULL or "f32" (the reference path,
 * unchanged), else a kvstore cache (engine/kv/kvstore.h) with seed 0. *ret_bits (may be NULL) =
 * bits per value (turboquant.md section 6). Returns 0 or -1 (message
 * printed).
 */
int lab_kvcache_new(const Model *m, const char *spec, int64_t n_ctx, KvCache **ret, double *ret_bits);

/* Parse a positive integer option value; -1 on error (message printed). */
long lab_parse_long(const char *opt, const char *arg, long min, long max);
double lab_parse_double(const char *opt, const char *arg, double min, double max);


/* Read a whole file (or stdin for "-"); NULL and message printed on error. */
char *lab_read_file(const char *path, size_t *ret_len);

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_codebook(int argc, char **argv);

/*
 * The spec a --kv argument stands for: a preset's spec (printed to stderr
 * as "--kv small: SPEC"), else the argument itself.
 */
const char *lab_spec_resolve(const char *given);

/*
 * Split a list of KV specs given as one option value ("f16,tq4,tq3.5:tq3,0-1=q8_0")
 * into specs: a comma starts a new spec unless the next element is a
 * layer override (it holds '='), which stays with the spec before it.
 * Appends to *specs (malloc'd strings, *n entries, at most max). Returns
 * 0 or -1 (message printed).
 */
int lab_specs_add(const char *arg, char **specs, int *n, int max);

int cmd_kld(int argc, char **argv);
int cmd_niah(int argc, char **argv);
int cmd_kvstats(int argc, char **argv);
int cmd_genmodel(int argc, char **argv);
