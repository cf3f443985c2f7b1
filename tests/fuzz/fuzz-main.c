/*
 * fuzz-main.c: replay inputs through a fuzz target without libFuzzer.
 *
 * Linked with any fuzz-<name>.c, it feeds each file named on the command
 * line, and each regular file inside each directory named, to
 * LLVMFuzzerTestOneInput(). Each input sits in a heap block of exactly its
 * size, so a sanitizer build sees reads past its end. This is how the seed
 * corpus and past crashes run as ordinary tests under gcc.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"


static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	uint8_t *buf;

	if (!f || fstat(fileno(f), &st) < 0) {
		fprintf(stderr, "fuzz-main: cannot read %s\n", path);
		if (f)
			fclose(f);
		return -1;
	}
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		fprintf(stderr, "fuzz-main: cannot read %s\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)st.st_size);
	free(buf);
	return 0;
}

static int run_dir(const char *dir, size_t *n)
{
	struct dirent **names;
	int count = scandir(dir, &names, NULL, alphasort);
	int r = 0;

	if (count < 0) {
		fprintf(stderr, "fuzz-main: cannot list %s\n", dir);
		return -1;
	}
	for (int i = 0; i < count; i++) {
		char path[4096];
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			if (run_file(path) < 0)
				r = -1;
			else
				(*n)++;
		}
		free(names[i]);
	}
	free(names);
	return r;
}

int main(int argc, char **argv)
{
	size_t n = 0;
	int r = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "fuzz-main: cannot stat %s\n", argv[i]);
			r = -1;
		} else if (S_ISDIR(st.st_mode)) {
			if (run_dir(argv[i], &n) < 0)
				r = -1;
		} else if (run_file(argv[i]) < 0) {
			r = -1;
		} else {
			n++;
		}
	}
	printf("fuzz-main: %zu inputs replayed\n", n);
	return r < 0 || n == 0 ? 1 : 0;
}
