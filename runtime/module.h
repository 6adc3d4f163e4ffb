// A loaded, verified module (the FlatBuffers file kilnc writes).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "schema/module_generated.h"

namespace kiln {

// The module format this runtime reads and kilnc writes (2: generated fused kernels).
constexpr uint32_t kModuleFormatVersion = 5;  // 3: kernels_crc32; 4: @prefill, DecodeAttention of M positions;
                                              // 5: crc32 of the whole module

// The programs that read a prompt into @decode's key/value caches, M positions a call (the
// sampler's choice of them: sampler.h).
inline constexpr const char* kPrefillPrograms[] = {"prefill", "prefill_short"};

class Module {
 public:
  // From a .kiln file, or from an executable that carries one (kilnc -o).
  static Module load(const std::string& path);
  // From bytes in memory; `source` names them in messages.
  static Module from_bytes(std::vector<uint8_t> bytes, std::string source);

  const fb::Module& fb() const { return *fb_; }
  const std::string& source() const { return source_; }
  const fb::Program* program(const std::string& name) const;  // null when absent
  // Activations a program keeps from one run to the next: the key/value caches that its
  // decode_attention kernels and DecodeAttention instructions extend and read (their input 1).
  // Nothing else may share them.
  std::vector<uint32_t> kept_buffers(const fb::Program& program) const;
  const fb::Buffer& buffer(uint32_t i) const { return *fb_->buffers()->Get(i); }
  size_t size_bytes() const { return bytes_.size(); }

 private:
  void verify(size_t tables_end) const;  // tables_end: where the FlatBuffers tables end
  std::vector<uint8_t> bytes_;
  std::string source_;
  const fb::Module* fb_ = nullptr;
};

// How many ints an instruction of `op` carries (runtime/executor.cpp says what they are); -n: at
// least n.
int instr_int_count(fb::OpCode op);

// The CRC-32 a module records of itself (module.fbs crc32): of all `size` bytes of a module that
// passed the FlatBuffers verifier, with the four bytes of its crc32 field read as zero.
uint32_t module_crc32(const uint8_t* bytes, size_t size);
// Writes module_crc32 into a finished module built with its crc32 field present (kilnc stores 1
// there first; a builder with ForceDefaults(true) stores 0).
void seal_module(std::vector<uint8_t>& bytes);

size_t dtype_bytes(fb::DType t);
const char* dtype_name(fb::DType t);
int64_t numel(const fb::Buffer& b);
// A size as kilnc and kiln-inspect print a module's memory: "512 B", "1.50 MiB".
std::string human_bytes(double bytes);

}  // namespace kiln
