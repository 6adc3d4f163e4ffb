// Runs a module's programs on the CPU over one arena allocated at start.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "runtime/module.h"

namespace kiln {

class Executor {
 public:
  // Allocates the arena (zeroed) and checks every instruction's operands against its opcode.
  explicit Executor(const Module& module);
  ~Executor();

  // Runs a program ("forward", "micro_step", "optimizer_step"); returns its scalar result.
  float run(const std::string& program);

  float* f32(uint32_t buffer);
  int32_t* i32(uint32_t buffer);
  // Scalars and inputs by name; kiln::Error when the module has none of that name.
  void set_hyper(const std::string& name, float value);
  bool has_hyper(const std::string& name) const;
  int32_t* input(const std::string& name);
  // Zeroes every gradient accumulator (start of an optimizer step).
  void zero_grads();

  // Per-opcode wall time of every instruction run since profiling was enabled.
  void enable_profiling(bool on) { profile_ = on; }
  void print_profile() const;

  const Module& module() const { return module_; }
  uint64_t arena_bytes() const { return module_.fb().arena_size(); }

 private:
  void check(const fb::Program& prog) const;
  void exec(const fb::Instr& ins);
  const Module& module_;
  uint8_t* arena_ = nullptr;
  bool profile_ = false;
  std::map<std::string, std::pair<double, int64_t>> profile_by_op_;  // seconds, calls
};

}  // namespace kiln
