// The message of the kiln::Error that f throws, or "(no error)": tests compare a refusal's exact
// wording, and a call that should pass with the same line.
#pragma once
#include <functional>
#include <string>

#include "runtime/error.h"

namespace kiln::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace kiln::testing
