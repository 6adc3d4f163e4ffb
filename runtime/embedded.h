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

// The module appended to `path`, or nullopt when the file carries none; messages name it
// `shown` (the executable's own name rather than /proc/self/exe). An ELF file with bytes after
// the program but no trailer at its end is an error (a damaged or truncated executable), not a
// file without a module.
std::optional<std::vector<uint8_t>> read_embedded_module(const std::string& path, const std::string& shown = "");

// Writes `runtime` + `module` + trailer to `out` (temporary name, fsync, rename; mode 0755).
// kiln::Error "RUNTIME: not a Kiln runtime ..." unless `runtime` is one write_executable takes.
void check_kiln_runtime(const std::string& runtime);
void write_executable(const std::string& out, const std::string& runtime,
                      const std::vector<uint8_t>& module);

}  // namespace kiln
