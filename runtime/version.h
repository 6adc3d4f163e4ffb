// Kiln's version: its release number and the git commit a build was made from, for every tool's
// --version and for the modules kilnc writes (kiln-inspect shows which kilnc made a module).
#pragma once

#include <string>

namespace kiln {

// "0.2 (git 39baf91e1a2b)"; "0.2 (git 39baf91e1a2b, modified)" from a tree with uncommitted
// changes; "0.2" from a tree that is no git checkout.
const std::string& version();

// A tool's --version text: "TOOL (Kiln) VERSION", then `details` (what it was built with) on a
// line of its own where given.
std::string version_text(const std::string& tool, const std::string& details = "");

// What this runtime runs: its module format, and whether it has the CUDA backend.
std::string runtime_build_details();

}  // namespace kiln
