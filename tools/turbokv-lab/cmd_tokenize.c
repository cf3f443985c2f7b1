/* cmd_tokenize.c: `turbokv-lab tokenize`, the token ids of a text. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "tools/turbokv-lab/lab.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab tokenize [OPTIONS] [FILE | -p TEXT]\n\n"
		"Prints the token ids of FILE (or stdin, or TEXT), whitespace separated.\n\n"
		"  -p, --prompt TEXT   tokenize TEXT instead of a file\n"
		"      --special       match special tokens (<|im_start|>...) in the text\n"
		"      --pieces        print each token's bytes next to its id\n"
		LAB_COMMON_HELP);
}

int cmd_tokenize(int argc, char **argv)
{
	enum { OPT_SPECIAL = 0x2000, OPT_PIECES, OPT_HELP };
	static const struct option longopts[] = {
		LAB_COMMON_LONGOPTS,
		{ "prompt", required_argument, NULL, 'p' },
		{ "special", no_argument, NULL, OPT_SPECIAL },
		{ "pieces", no_argument, NULL, OPT_PIECES },
		{ "help", no_argument, NULL, OPT_HELP },
		{}
	};
	LabCommon common;
	const char *prompt = NULL;
	bool special = false, pieces = false;
	int c, r;

	lab_common_init(&common);
	optind = 1;
	while ((c = getopt_long(argc, argv, LAB_COMMON_SHORTOPTS "p:", longopts, NULL)) != -1) {
		if ((r = lab_common_option(&common, c, optarg)) != 0) {
			if (r < 0)
				return LAB_EXIT_USAGE;
			continue;
		}
		switch (c) {
		case 'p': prompt = optarg; break;
		case OPT_SPECIAL: special = true; break;
		case OPT_PIECES: pieces = true; break;
		case OPT_HELP: usage(stdout); return LAB_EXIT_OK;
		default: usage(stderr); return LAB_EXIT_USAGE;
		}
	}
	if (argc - optind > (prompt ? 0 : 1)) {
		usage(stderr);
		return LAB_EXIT_USAGE;
	}

	_cleanup_(freep) char *file_text = NULL;
	size_t len;
	if (prompt) {
		len = strlen(prompt);
	} else {
		if (!(file_text = lab_read_file(optind < argc ? argv[optind] : "-", &len)))
			return LAB_EXIT_FAILURE;
		prompt = file_text;
	}

	_cleanup_(model_freep) Model *m = NULL;
	_cleanup_(tokenizer_freep) Tokenizer *tok = NULL;
	if (lab_load(&common, &m, &tok) < 0)
		return LAB_EXIT_FAILURE;

	_cleanup_(freep) int32_t *ids = NULL;
	size_t n;
	if (tokenizer_encode(tok, prompt, len, special, &ids, &n) != 0) {
		fprintf(stderr, "turbokv-lab: out of memory\n");
		return LAB_EXIT_FAILURE;
	}

	if (common.json) {
		printf("{\"n_tokens\": %zu, \"ids\": [", n);
		for (size_t i = 0; i < n; i++)
			printf("%s%d", i ? ", " : "", ids[i]);
		printf("]");
		if (pieces) {
			printf(", \"pieces\": [");
			for (size_t i = 0; i < n; i++) {
				size_t plen;
				const char *p = tokenizer_piece(tok, ids[i], &plen);
				if (i)
					printf(", ");
				json_write_string(stdout, p, plen);
			}
			printf("]");
		}
		printf("}\n");
	} else if (pieces) {
		for (size_t i = 0; i < n; i++) {
			size_t plen;
			const char *p = tokenizer_piece(tok, ids[i], &plen);
			printf("%d\t", ids[i]);
			json_write_string(stdout, p, plen);
			putchar('\n');
		}
	} else {
		for (size_t i = 0; i < n; i++)
			printf("%s%d", i ? " " : "", ids[i]);
		putchar('\n');
	}
	return LAB_EXIT_OK;
}
