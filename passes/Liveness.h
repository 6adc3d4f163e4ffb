// Shared by kiln-schedule and kiln-plan-buffers: which values occupy arena memory, their sizes,
// and which results may share an operand's storage.
#pragma once

#include "Kiln/KilnDialect.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace kiln {

// Values that live outside the arena: parameter values and gradients, inputs, hyperparameters.
inline bool isPersistent(mlir::Value v) {
  mlir::Operation* def = v.getDefiningOp();
  return def && isStateOp(def);
}

inline uint64_t byteSize(mlir::Value v) {
  auto t = mlir::cast<mlir::RankedTensorType>(v.getType());
  return uint64_t(t.getNumElements()) * ((t.getElementTypeBitWidth() + 7) / 8);
}

// (result, operand) pairs whose storage a kernel may share: the result is written element by
// element over an operand that the kernel reads only at the same element (or, for the fused
// classifier, a row it has finished reading). The planner also makes sure that no other operand
// of the op shares that storage.
inline llvm::SmallVector<std::pair<unsigned, unsigned>> inPlacePairs(mlir::Operation* op) {
  llvm::SmallVector<std::pair<unsigned, unsigned>> pairs;
  if (mlir::isa<AddOp, MulOp, ScaleOp, GeluOp, GeluGradOp>(op)) {
    for (unsigned i = 0; i < op->getNumOperands(); ++i) pairs.push_back({0, i});
    return pairs;
  }
  auto fusion = mlir::dyn_cast<FusionOp>(op);
  if (!fusion) return pairs;
  if (fusion.getKind() == "classifier") {
    // Results: the loss and the logits gradient; operands include the logits.
    for (auto [r, res] : llvm::enumerate(fusion.getResults()))
      for (auto [i, in] : llvm::enumerate(fusion.getInputs()))
        if (res.getType() == in.getType() && mlir::cast<mlir::RankedTensorType>(in.getType()).getRank() == 2)
          pairs.push_back({unsigned(r), unsigned(i)});
    return pairs;
  }
  if (fusion.getKind() != "elementwise") return pairs;
  // The kernel loops over the elements of the region's largest value. An input of that size read
  // only by elementwise ops (not gathered, broadcast or taken as a scale factor) is read at the
  // same element; a smaller one is read again at later elements (through a broadcast).
  const int64_t n = fusion.getLoopSize();
  for (auto [i, arg] : llvm::enumerate(fusion.getBlock().getArguments())) {
    if (mlir::cast<mlir::RankedTensorType>(arg.getType()).getNumElements() != n) continue;
    // Everything computed from the input must be read at the same element too: a GELU of it
    // gathered as an embedding table reads other elements, after the loop has written them.
    bool sameElement = true;
    llvm::SmallVector<mlir::Value> work{arg};
    llvm::SmallPtrSet<mlir::Operation*, 8> seen;
    while (sameElement && !work.empty()) {
      mlir::Value v = work.pop_back_val();
      for (mlir::Operation* u : v.getUsers()) {
        if (mlir::isa<YieldOp, AccumulateGradOp>(u)) continue;  // stored at the same element
        if (!mlir::isa<AddOp, MulOp, ScaleOp, GeluOp, GeluGradOp, CastOp>(u) ||
            (mlir::isa<ScaleOp>(u) && u->getOperand(1) == v)) {
          sameElement = false;
          break;
        }
        if (seen.insert(u).second) work.append(u->result_begin(), u->result_end());
      }
    }
    if (!sameElement) continue;
    for (unsigned r = 0; r < fusion.getNumResults(); ++r) pairs.push_back({r, unsigned(i)});
  }
  return pairs;
}

}  // namespace kiln
