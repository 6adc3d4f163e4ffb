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
// which are shown escaped (\n, \r, \t, \xNN) instead of breaking the line.
inline std::string one_line(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7F) {
      out += ch;
      continue;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
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
