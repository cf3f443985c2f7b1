/*
 * cmd_codebook.c: `turbokv-lab codebook`, the Lloyd-Max codebook of
 * engine/codec/codebook.h for (dim, bits). Pure math: loads no model.
 */
#include <getopt.h>
#include <math.h>
#include <string.h>

#include "engine/codec/codebook.h"
#include "tools/turbokv-lab/lab.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: turbokv-lab codebook --dim D --bits B [--json]\n\n"
		"Prints the Lloyd-Max centroids for one coordinate of a uniform point on the\n"
		"unit sphere in R^D with 2^B levels, in units of 1/sqrt(D) (centroid * sqrt(D)),\n"
		"ascending, one per line, then 'mse <D_mse>', the expected squared error\n"
		"E||u - u~||^2 for unit vectors u.\n\n"
		"  -d, --dim D     dimension, %d..%d\n"
		"  -b, --bits B    bits per coordinate, 1..%d\n"
		"      --json      {\"dim\":D,\"bits\":B,\"centroids\":[...],\"mse\":...}\n",
		2, CODEBOOK_MAX_DIM, CODEBOOK_MAX_BITS);
}

int cmd_codebook(int argc, char **argv)
{
	enum { OPT_JSON = 0x2000, OPT_HELP };
	static const struct option longopts[] = {
		{ "dim", required_argument, NULL, 'd' },
		{ "bits", required_argument, NULL, 'b' },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "help", no_argument, NULL, OPT_HELP },
		{}
	};
	long dim = 0, bits = 0;
	bool json = false;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "d:b:", longopts, NULL)) != -1) {
		switch (c) {
		case 'd':
			if ((dim = lab_parse_long("--dim", optarg, 2, CODEBOOK_MAX_DIM)) < 0)
				return LAB_EXIT_USAGE;
			break;
		case 'b':
			if ((bits = lab_parse_long("--bits", optarg, 1, CODEBOOK_MAX_BITS)) < 0)
				return LAB_EXIT_USAGE;
			break;
		case OPT_JSON: json = true; break;
		case OPT_HELP: usage(stdout); return LAB_EXIT_OK;
		default: usage(stderr); return LAB_EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "turbokv-lab codebook: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return LAB_EXIT_USAGE;
	}
	if (dim == 0 || bits == 0) {
		fprintf(stderr, "turbokv-lab codebook: --dim and --bits are required\n");
		usage(stderr);
		return LAB_EXIT_USAGE;
	}

	const Codebook *cb;
	int r = codebook_get((int)dim, (int)bits, &cb);
	if (r < 0) {
		fprintf(stderr, "turbokv-lab codebook: cannot solve the codebook for dim %ld, bits %ld: %s\n",
			dim, bits, strerror(-r));
		return LAB_EXIT_FAILURE;
	}

	double unit = sqrt((double)dim);
	if (json) {
		printf("{\"dim\":%ld,\"bits\":%ld,\"centroids\":[", dim, bits);
		for (int i = 0; i < cb->n_levels; i++)
			printf("%s%.9g", i ? "," : "", cb->centroids[i] * unit);
		printf("],\"mse\":%.9g}\n", cb->mse);
	} else {
		for (int i = 0; i < cb->n_levels; i++)
			printf("%.6f\n", cb->centroids[i] * unit);
		printf("mse %.6g\n", cb->mse);
	}
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "turbokv-lab codebook: write error\n");
		return LAB_EXIT_FAILURE;
	}
	return LAB_EXIT_OK;
}
