#include "runtime/crc32.h"

#include <cstring>

namespace kiln {
namespace {

// CRC-32 (IEEE 802.3, reflected 0xEDB88320; the same value as zlib's crc32), slicing-by-8: eight
// table lookups per 8 bytes, about 1-2 GB/s, so checksumming a GPT-2 small checkpoint (1.5 GB of
// values and moments) costs about a second rather than the several a byte-at-a-time loop would.
struct CrcTables {
  uint32_t t[8][256];
};

const CrcTables& crc_tables() {
  static const CrcTables tables = [] {
    CrcTables c{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t r = i;
      for (int k = 0; k < 8; ++k) r = (r >> 1) ^ (0xEDB88320u & (0u - (r & 1u)));
      c.t[0][i] = r;
    }
    // t[s][i]: the CRC of byte i followed by s zero bytes.
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) c.t[s][i] = (c.t[s - 1][i] >> 8) ^ c.t[0][c.t[s - 1][i] & 0xFFu];
    return c;
  }();
  return tables;
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto& t = crc_tables().t;
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; n > 0; ++p, --n) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xFFu];
  return ~crc;
}

}  // namespace kiln
