// train --profile's totals: per kernel (a generated kernel's symbol k<N>_<ops>, a device step
// such as "k12_matmul (cuBLASLt)", or a built-in CPU op's opcode), over the profiled steps.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kiln {

struct KernelTime {
  double seconds = 0;
  int64_t calls = 0;
  double flops = 0;  // the arithmetic of those calls (runtime/instr_flops.h's convention)
};
using Profile = std::map<std::string, KernelTime>;

}  // namespace kiln
