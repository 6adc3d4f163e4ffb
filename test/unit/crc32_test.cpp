// CRC-32 (runtime/crc32): slicing-by-8 against values from zlib's crc32 (Python's zlib.crc32),
// at every length around the 8-byte blocks (the tail loop alone, one block, a block and a tail),
// and the running form, split at every offset, against the one-call value.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/crc32.h"

namespace kiln {
namespace {

// d[i] = (37 i + 11) mod 256: every byte value differs from its neighbours, so a table or lane
// mix-up changes the result.
std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = uint8_t(i * 37 + 11);
  return d;
}

TEST(Crc32, MatchesZlibForKnownStrings) {
  // The CRC-32 check value (of "123456789") and zlib.crc32 of a pangram, of 32 zero bytes and of
  // 32 0xff bytes.
  const char* digits = "123456789";
  EXPECT_EQ(crc32_update(0, digits, 9), 0xCBF43926u);
  const char* fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32_update(0, fox, std::strlen(fox)), 0x414FA339u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(crc32_update(0, zeros.data(), zeros.size()), 0x190A55ADu);
  EXPECT_EQ(crc32_update(0, ones.data(), ones.size()), 0xFF6CAB0Bu);
}

TEST(Crc32, MatchesZlibAtEveryLengthAroundTheBlocks) {
  // zlib.crc32(bytes((37 * i + 11) & 0xff for i in range(n))) for n = 0..17 and 64.
  const uint32_t want[18] = {0x00000000, 0x45d03605, 0x84f4fb98, 0x3753a57b, 0xa5328cbe, 0x9ececd5f,
                             0xb5416b8c, 0xef6f3b31, 0x648bad8b, 0x17dc5f9e, 0xa0125457, 0x0919340f,
                             0x7a6c29ec, 0x7ec47ae4, 0xdca7a3c5, 0x53605ee3, 0x24e8a988, 0xcdfc844a};
  const std::vector<uint8_t> d = pattern(64);
  for (size_t n = 0; n < 18; ++n) EXPECT_EQ(crc32_update(0, d.data(), n), want[n]) << "n=" << n;
  EXPECT_EQ(crc32_update(0, d.data(), 64), 0xffbae609u);
}

TEST(Crc32, RunningCrcOfTwoPartsIsTheCrcOfTheWhole) {
  // What a checkpoint written piece by piece relies on: any split, aligned to 8 or not.
  const std::vector<uint8_t> d = pattern(40);
  const uint32_t whole = crc32_update(0, d.data(), d.size());
  for (size_t k = 0; k <= d.size(); ++k)
    EXPECT_EQ(crc32_update(crc32_update(0, d.data(), k), d.data() + k, d.size() - k), whole) << "split at " << k;
}

}  // namespace
}  // namespace kiln
