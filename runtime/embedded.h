// A training executable is the runtime binary with a module appended:
//   [runtime ELF][module bytes][u64 module size][8-byte magic "KILNMOD1"]
// The loader ignores trailing data, so the binary runs unchanged; at start it looks for the
// trailer on its own file (/proc/self/exe).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

constexpr char kEmbeddedMagic[8] = {'K', 'I', 'L', 'N', 'M', 'O', 'D', '1'};

// The module appended to `path`, or nullopt when the file carries none.
std::optional<std::vector<uint8_t>> read_embedded_module(const std::string& path);

// Writes `runtime` + `module` + trailer to `out` (temporary name, fsync, rename; mode 0755).
void write_executable(const std::string& out, const std::string& runtime,
                      const std::vector<uint8_t>& module);

}  // namespace kiln
