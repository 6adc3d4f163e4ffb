#include "runtime/embedded.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "runtime/file_io.h"

namespace kiln {

namespace {

// Where a 64-bit ELF file's own contents end: its section header table, which linkers place
// last; 0 when the file is not a 64-bit ELF. Bytes past it were appended (a module).
uint64_t elf_extent(std::ifstream& in) {
  unsigned char h[64] = {};
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(h), sizeof h) || std::memcmp(h, "\x7f" "ELF", 4) != 0 || h[4] != 2) {
    in.clear();
    return 0;
  }
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0;
  std::memcpy(&shoff, h + 0x28, 8);
  std::memcpy(&shentsize, h + 0x3A, 2);
  std::memcpy(&shnum, h + 0x3C, 2);
  return shoff + uint64_t(shentsize) * shnum;
}

}  // namespace

std::optional<std::vector<uint8_t>> read_embedded_module(const std::string& path, const std::string& shown_as) {
  const std::string shown = shown_as.empty() ? path : shown_as;
  // A module is found at a regular file's end; a pipe has none (and opening a FIFO that no one
  // writes to would wait for a writer).
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  if (size < 16) return std::nullopt;
  char trailer[16];
  in.seekg(size - 16);
  in.read(trailer, 16);
  if (std::memcmp(trailer + 8, kEmbeddedMagic, 8) != 0) {
    // No trailer. Bytes after the program that begin as a Kiln module does (FlatBuffers keeps
    // the file identifier "KILN" at bytes 4-7) are a damaged or cut executable; other appended
    // bytes (a packager's) are not ours to judge.
    const uint64_t extent = elf_extent(in);
    char id[4] = {};
    if (extent > 0 && extent + 8 <= uint64_t(size)) {
      in.clear();
      in.seekg(int64_t(extent) + 4);
      in.read(id, 4);
    }
    if (in && std::memcmp(id, "KILN", 4) == 0)
      throw Error(shown + ": " + std::to_string(uint64_t(size) - extent) + " bytes of a Kiln module follow the "
                  "program but end in no module trailer (a damaged or truncated Kiln executable: compile it again "
                  "with kilnc)");
    return std::nullopt;
  }
  uint64_t moduleSize;
  std::memcpy(&moduleSize, trailer, 8);
  if (moduleSize > uint64_t(size - 16))
    throw Error(shown + ": embedded module: size " + std::to_string(moduleSize) +
                " exceeds the file (truncated executable?)");
  std::vector<uint8_t> bytes(moduleSize);
  in.seekg(size - 16 - int64_t(moduleSize));
  in.read(reinterpret_cast<char*>(bytes.data()), int64_t(moduleSize));
  if (!in) throw Error(shown + ": embedded module: read failed");
  return bytes;
}

namespace {
// A Kiln runtime is an ELF program that holds run_main's marker (runtime/cli.cpp). It is spelled
// backwards here, so that kilnc, which holds this check, does not pass it itself.
void check_runtime_bytes(const std::string& runtime, const std::vector<uint8_t>& bytes) {
  const bool elf = bytes.size() > 4 && std::memcmp(bytes.data(), "\x7f" "ELF", 4) == 0;
  std::string marker = "niam_nur:EMITNUR-NLIK";
  std::reverse(marker.begin(), marker.end());
  if (!elf || std::search(bytes.begin(), bytes.end(), marker.begin(), marker.end()) == bytes.end())
    throw Error(runtime + ": not a Kiln runtime (kiln-run, or an executable kilnc wrote)");
}
}  // namespace

void check_kiln_runtime(const std::string& runtime) { check_runtime_bytes(runtime, read_file(runtime)); }

void write_executable(const std::string& out, const std::string& runtime,
                      const std::vector<uint8_t>& module) {
  std::vector<uint8_t> bytes = read_file(runtime);
  check_runtime_bytes(runtime, bytes);
  // A runtime that already carries a module (an executable used as the runtime) is stripped.
  if (auto old = read_embedded_module(runtime)) bytes.resize(bytes.size() - old->size() - 16);
  bytes.insert(bytes.end(), module.begin(), module.end());
  uint64_t n = module.size();
  const auto* np = reinterpret_cast<const uint8_t*>(&n);
  bytes.insert(bytes.end(), np, np + 8);
  bytes.insert(bytes.end(), kEmbeddedMagic, kEmbeddedMagic + 8);
  write_file_atomic(out, {{bytes.data(), bytes.size()}}, 0755);
}

}  // namespace kiln
