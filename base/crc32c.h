/*
 * crc32c.h: CRC-32C (Castagnoli), the checksum of session files.
 *
 * Reflected polynomial 0x82f63b78, initial value and final xor
 * 0xffffffff (iSCSI, ext4, tq.h's descriptor records): crc32c of the
 * ASCII bytes "123456789" is 0xe3069283. Table-driven, eight bytes per
 * step (slicing-by-8), scalar C: about 1-2 GB/s, enough for files that
 * are written and read once per save or restore.
 *
 * Incremental use: crc = crc32c_update(0, a, na); crc = crc32c_update(crc,
 * b, nb) gives crc32c(a || b).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of n bytes of data. */
uint32_t crc32c(const void *data, size_t n);

/* Continue crc (a previous result, 0 to start) over n more bytes. */
uint32_t crc32c_update(uint32_t crc, const void *data, size_t n);
