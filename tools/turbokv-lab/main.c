/*
 * turbokv-lab: the offline engine tool (no daemon): generation,
 * tokenization and benchmarks on a GGUF model.
 */
#include <stdio.h>
#include <string.h>

#include "tools/turbokv-lab/lab.h"

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *help;
} commands[] = {
	{ "generate", cmd_generate, "generate text from a prompt" },
	{ "tokenize", cmd_tokenize, "print the token ids of a text" },
	{ "bench", cmd_bench, "prompt and decode speed, like llama-bench" },
	{ "codebook", cmd_codebook, "Lloyd-Max codebook of the TurboQuant codec (no model)" },
	{ "kld", cmd_kld, "KL divergence of KV types against an f32 cache on a text" },
	{ "niah", cmd_niah, "needle-in-a-haystack recall of KV types beside f32" },
	{ "kvstats", cmd_kvstats, "per-layer K/V and attention error of KV types on real activations" },
	{ "gen-model", cmd_genmodel, "write a llama GGUF with seeded random weights (any shape)" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: turbokv-lab COMMAND [OPTIONS]\n\ncommands:\n");
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
	fprintf(f, "\n'turbokv-lab COMMAND --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return LAB_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return LAB_EXIT_OK;
	}
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "turbokv-lab: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return LAB_EXIT_USAGE;
}
