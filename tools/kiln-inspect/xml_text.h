// Text placed in an SVG (a log's path, a module's, a buffer's name) with XML's special
// characters escaped, so that any name keeps the picture well-formed.
#pragma once
#include <string>

namespace kiln {

inline std::string xml_escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace kiln
