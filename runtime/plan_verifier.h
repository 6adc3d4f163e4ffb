// An independent check of a module's memory plan: no two buffers that are live at the same
// time share bytes of the arena (except an elementwise kernel writing over an input it is the
// last reader of), no activation is read before it is written, and the state region
// (parameters, gradients, AdamW moments, inputs, hyperparameters) overlaps nothing.
#pragma once

#include "runtime/module.h"

namespace kiln {

// Throws kiln::Error naming the two buffers (or the one) and the program.
void verify_plan(const Module& module);

}  // namespace kiln
