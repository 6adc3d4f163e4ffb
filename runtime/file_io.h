// Whole-file reads and crash-safe writes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// Reads a whole file; kiln::Error naming it on failure.
std::vector<uint8_t> read_file(const std::string& path);

// Atomically replaces `path` with the concatenation of `pieces` (pointer, size): write to
// path + ".tmp.<pid>", fsync, rename, fsync the directory. On failure the temporary file is
// removed and `path` is left as it was.
void write_file_atomic(const std::string& path,
                       const std::vector<std::pair<const void*, size_t>>& pieces, int mode = 0644);

}  // namespace kiln
