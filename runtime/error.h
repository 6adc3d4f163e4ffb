// The one exception type of the runtime: a single line that names the file, the place and the
// problem ("data/train_000.bin: header: magic 1234 is not 20240520"). Tools print it and exit 1.
#pragma once
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A message as one line: a name read from a file may carry newlines or other control characters,
// which are shown escaped (\n, \r, \t, \xNN) instead of breaking the line. So are the bytes of
// C1 controls (U+0080..U+009F, which some terminals obey) and of anything that is not UTF-8.
inline std::string one_line(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto escape = [&out](unsigned char c) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02X", c);
    out += hex;
  };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c >= 0x20 && c != 0x7F) out += s[i];
      else if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else escape(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length by the lead byte, then the range of its second byte (which rules
    // out overlong forms, surrogates and code points past U+10FFFF); the rest are 80..BF.
    const size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    const unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    bool valid = n != 0 && i + n <= s.size();
    for (size_t k = 1; valid && k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      valid = k == 1 ? b >= lo && b <= hi : (b & 0xC0) == 0x80;
    }
    const bool c1 = valid && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0;
    if (!valid || c1) {
      for (size_t k = 0; k < (c1 ? 2 : 1); ++k) escape(static_cast<unsigned char>(s[i + k]));
      i += c1 ? 2 : 1;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

// At most `max` bytes of `s` for a message, cut between UTF-8 characters ("..." marks the cut).
inline std::string clipped(std::string_view s, size_t max = 40) {
  if (s.size() <= max) return std::string(s);
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

}  // namespace kiln
