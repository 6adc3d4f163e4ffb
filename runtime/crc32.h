// CRC-32 (IEEE 802.3, reflected 0xEDB88320; the same value as zlib's crc32): the checksum of
// checkpoints and of the machine code a module carries.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kiln {

// Running CRC: crc32_update(crc32_update(0, a), b) is the CRC of a followed by b.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

}  // namespace kiln
