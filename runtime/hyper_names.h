// The hyperparameters a module may declare (kiln.hyper) and the trainer sets by name: one list
// for the dialect's verifier and the runtime's module check. Plain C++, no MLIR.
#pragma once
#include <string>

namespace kiln {

inline constexpr const char* kHyperNames[] = {"lr",           "beta1",    "beta2", "eps",
                                              "weight_decay", "max_norm", "step",  "loss_weight"};

inline bool is_hyper_name(const std::string& name) {
  for (const char* h : kHyperNames)
    if (name == h) return true;
  return false;
}

// "lr, beta1, ..., loss_weight", for messages.
inline std::string hyper_names_listed() {
  std::string s;
  for (const char* h : kHyperNames) s += (s.empty() ? "" : ", ") + std::string(h);
  return s;
}

}  // namespace kiln
