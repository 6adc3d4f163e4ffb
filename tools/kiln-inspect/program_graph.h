// One program of a module as a Graphviz graph: its instructions (each generated kernel with the
// ops it fuses, each built-in op, the gradient hooks) in order, grouped by phase, and the buffers
// that flow between them. kiln-inspect --dot writes it; `dot -Tsvg` draws it.
#pragma once

#include <string>

#include "runtime/module.h"

namespace kiln {

// What to draw besides the activations between instructions.
enum class GraphState {
  Inputs,  // token ids and hyperparameters only (parameters, gradients and moments left out)
  All,     // every state buffer an instruction reads or writes, as a node of its own
};

// kiln::Error when the module has no such program.
std::string program_dot(const Module& m, const std::string& program, GraphState state);

}  // namespace kiln
