// A kernel's fused ops as text (the generated source's header, kiln-inspect's table): a run of one
// op is counted ("clip_coef, adamw x148") rather than listed; two in a row are listed.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace kiln {

inline std::string op_list(const std::vector<std::string>& ops, const std::string& separator) {
  std::vector<std::pair<std::string, int>> runs;
  for (const std::string& op : ops) {
    if (!runs.empty() && runs.back().first == op) ++runs.back().second;
    else runs.push_back({op, 1});
  }
  std::string text;
  for (const auto& [op, n] : runs)
    text += (text.empty() ? "" : separator) + op +
            (n > 2 ? " x" + std::to_string(n) : n == 2 ? separator + op : "");
  return text;
}

}  // namespace kiln
