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

// Flushes stdout; kiln::Error "stdout: write failed" when anything written there was lost (a
// full disk, a closed pipe), so that cut-short output does not pass for whole.
void flush_stdout();

// Atomically replaces `path` with the concatenation of `pieces` (pointer, size): write to
// path + ".tmp.<pid>", fsync, rename, fsync the directory. On failure the temporary file is
// removed and `path` is left as it was. A symbolic link is followed (the file it names is
// replaced, the link stays); an existing path that is not a regular file or a folder (a device
// such as /dev/null, a FIFO) is written in place, since a rename would replace it with a file.
void write_file_atomic(const std::string& path,
                       const std::vector<std::pair<const void*, size_t>>& pieces, int mode = 0644);

}  // namespace kiln
