// Text templates for generated kernel sources (compiler/attention_cuda*.cpp): ${NAME}
// substitution and exact float literals. Plain C++, no MLIR.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

inline std::string num(int64_t n) { return std::to_string(n); }

// A float literal that reads back as exactly `f`.
inline std::string floatLiteral(float f) {
  std::ostringstream os;
  os.precision(9);
  os << f;
  std::string s = os.str();
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

// Replaces every ${NAME} of `text` by its value; a ${ left over is a bug in the template.
inline std::string fillTemplate(std::string text, const std::vector<std::pair<std::string, std::string>>& vars) {
  for (const auto& [name, value] : vars) {
    const std::string key = "${" + name + "}";
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
      text.replace(at, key.size(), value);
  }
  if (text.find("${") != std::string::npos) throw std::logic_error("kernel source template: unfilled variable");
  return text;
}

}  // namespace kiln
