// Kiln's version (see version.h).
#include "runtime/version.h"

#include "kiln_git_revision.h"  // KILN_GIT_REVISION, written by cmake/git_revision.cmake
#include "runtime/module.h"

namespace kiln {

namespace {
constexpr const char* kRelease = "0.2";
}

const std::string& version() {
  static const std::string text =
      std::string(kRelease) + (*KILN_GIT_REVISION ? std::string(" (git ") + KILN_GIT_REVISION + ")" : "");
  return text;
}

std::string version_text(const std::string& tool, const std::string& details) {
  return tool + " (Kiln) " + version() + (details.empty() ? "" : "\n" + details);
}

std::string runtime_build_details() {
  return "runs module format " + std::to_string(kModuleFormatVersion) + " (cpu" +
#ifdef KILN_HAVE_CUDA
         std::string(" and cuda modules: built with CUDA ") + KILN_CUDA_VERSION + ")";
#else
         std::string(" modules; cuda ones need a build with the CUDA toolkit)");
#endif
}

}  // namespace kiln
