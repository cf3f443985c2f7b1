/*
 * bitpack.h: tight packing of B-bit codes (1 <= B <= 8).
 *
 * Byte layout (part of the on-disk and on-device format): the codes form
 * one little-endian bit stream. Code i occupies stream bits
 * [i*B, i*B + B), least significant bit first; stream bit k is bit k % 8
 * of byte k / 8. So B = 4 puts code 2j in the low nibble of byte j and
 * code 2j+1 in the high nibble; B = 2 puts four codes per byte, code 4j
 * in bits 0-1; B = 3 packs eight codes in three bytes; B = 1 is one bit
 * per code, code 8j in bit 0 of byte j. A final partial byte is zero-
 * padded. n codes take bitpack_bytes(B, n) = ceil(n * B / 8) bytes.
 *
 * Everything here is static inline and free of host-only calls so that
 * CUDA kernels include it as is (__host__ __device__ under nvcc).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define BITPACK_HD __host__ __device__
#else
#define BITPACK_HD
#endif

static inline BITPACK_HD size_t bitpack_bytes(int bits, size_t n)
{
	return (n * (size_t)bits + 7) / 8;
}

/* Code i of a packed stream (reads only the bytes that hold it). */
static inline BITPACK_HD uint8_t bitpack_get(const uint8_t *packed, int bits, size_t i)
{
	size_t bit = i * (size_t)bits;
	size_t byte = bit >> 3;
	unsigned shift = (unsigned)(bit & 7);
	unsigned v = packed[byte] >> shift;
	if (shift + (unsigned)bits > 8)
		v |= (unsigned)packed[byte + 1] << (8 - shift);
	return (uint8_t)(v & ((1u << bits) - 1));
}

/*
 * Pack n codes into bitpack_bytes(bits, n) bytes at out (written in full,
 * padding zeroed, nothing beyond). Bits of a code above bit B-1 are ignored.
 */
static inline BITPACK_HD void bitpack_pack(const uint8_t *codes, size_t n, int bits, uint8_t *out)
{
	size_t nbytes = bitpack_bytes(bits, n);
	for (size_t i = 0; i < nbytes; i++)
		out[i] = 0;
	for (size_t i = 0; i < n; i++) {
		size_t bit = i * (size_t)bits;
		size_t byte = bit >> 3;
		unsigned shift = (unsigned)(bit & 7);
		unsigned v = (unsigned)(codes[i] & ((1u << bits) - 1)) << shift;
		out[byte] |= (uint8_t)v;
		if (shift + (unsigned)bits > 8)
			out[byte + 1] |= (uint8_t)(v >> 8);
	}
}

/* Unpack n codes. */
static inline BITPACK_HD void bitpack_unpack(const uint8_t *packed, size_t n, int bits, uint8_t *codes)
{
	for (size_t i = 0; i < n; i++)
		codes[i] = bitpack_get(packed, bits, i);
}
