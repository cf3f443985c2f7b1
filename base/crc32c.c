/*
 * crc32c.c: CRC-32C by slicing-by-8 over tables built once (see crc32c.h).
 */
#include <pthread.h>

#include "base/crc32c.h"

#define CRC32C_POLY 0x82f63b78u

static uint32_t crc_table[8][256]; /* [k][b]: b's CRC shifted through k more zero bytes */
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_tables_init(void)
{
	for (uint32_t b = 0; b < 256; b++) {
		uint32_t c = b;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
		crc_table[0][b] = c;
	}
	for (uint32_t b = 0; b < 256; b++)
		for (int k = 1; k < 8; k++)
			crc_table[k][b] = (crc_table[k - 1][b] >> 8) ^ crc_table[0][crc_table[k - 1][b] & 0xff];
}

uint32_t crc32c_update(uint32_t crc, const void *data, size_t n)
{
	const uint8_t *p = data;
	uint32_t c = ~crc;

	pthread_once(&crc_once, crc_tables_init);
	while (n >= 8) {
		/* little-endian assembly by bytes: no alignment or byte-order assumptions */
		uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
				   (uint32_t)p[3] << 24);
		c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
		    crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
		    crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
		p += 8;
		n -= 8;
	}
	while (n--)
		c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
	return ~c;
}

uint32_t crc32c(const void *data, size_t n)
{
	return crc32c_update(0, data, n);
}
