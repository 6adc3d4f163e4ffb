// The arithmetic one instruction does, by one convention shared by kiln-inspect's FLOP counts
// and roofline, and train --profile's GFLOP/s.
#pragma once

#include "runtime/module.h"

namespace kiln {

// FLOPs of one execution of `ins` (0 for instructions that only move data).
double instr_flops(const Module& m, const fb::Instr& ins);

}  // namespace kiln
