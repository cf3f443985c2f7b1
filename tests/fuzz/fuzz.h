/* fuzz.h: what every fuzz target shares: the libFuzzer entry point and CHECK. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A promise of the code under test that must hold for every input. */
#define CHECK(cond)                                                          \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: broken promise: %s\n",      \
				__FILE__, __LINE__, #cond);                  \
			abort();                                             \
		}                                                            \
	} while (0)
