// One program of a module as a Graphviz graph: its instructions (each generated kernel with the
// ops it fuses, each built-in op, the gradient hooks) in order, grouped by phase, and the buffers
// that flow between them. kiln-inspect --dot writes it; `dot -Tsvg` draws it.
#pragma once

#include <string>

#include "runtime/module.h"

namespace kiln {

// What to draw besides the activations between instructions.
enum class GraphState {
  Inputs,  // token ids, hyperparameters and decode's key/value caches (no weights or optimizer state)
  All,     // also every parameter, compute copy, gradient and moment an instruction reads or writes
};

// The op's place in the model from its location: loc("h.0.mlp"(...)) gives h.0.mlp; "" for a
// location without a name (IR compiled without --debug-info: a file:line:col).
std::string place(const flatbuffers::String* loc);

// The program of that name; kiln::Error naming the module's programs when it has none such
// (--dot and --svg's --program).
const fb::Program& named_program(const Module& m, const std::string& program);

// kiln::Error when the module has no such program.
std::string program_dot(const Module& m, const std::string& program, GraphState state);

}  // namespace kiln
