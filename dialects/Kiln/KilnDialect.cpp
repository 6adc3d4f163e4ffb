#include "Kiln/KilnDialect.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Operation.h"

using namespace mlir;
using namespace kiln;

#include "Kiln/KilnDialect.cpp.inc"
#include "Kiln/KilnInterfaces.cpp.inc"

void KilnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "Kiln/KilnOps.cpp.inc"
      >();
}

// State the module keeps outside the arena (parameters, gradients, inputs, hyperparameters), seen
// through reshapes: the values whose planned offset is -1.
// (MLIR checks an op's dialect attributes before the op itself, and the reshapes before it may
// not be verified yet either: one without its operand is left to its own verifier.)
static bool isOutsideArena(Value v) {
  while (auto r = v.getDefiningOp<ReshapeOp>()) {
    if (r->getNumOperands() != 1) return false;
    v = r->getOperand(0);
  }
  Operation* def = v.getDefiningOp();
  return def && isStateOp(def);
}

// The buffer plan's attributes. The alignment is the module format's (runtime/arena_layout.cpp):
// cuBLASLt operands and 16-byte vector accesses need it.
LogicalResult KilnDialect::verifyOperationAttribute(Operation* op, NamedAttribute attr) {
  constexpr int64_t kAlign = 256;
  if (attr.getName() == "kiln.offsets") {
    auto offsets = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    if (!offsets) return op->emitError() << "'kiln.offsets' must be an array<i64: ...> of byte offsets";
    if (offsets.size() != int64_t(op->getNumResults()))
      return op->emitError() << "'kiln.offsets' holds " << offsets.size() << " offset(s) for " << op->getNumResults()
                             << " result(s); the plan gives one per result (run kiln-plan-buffers)";
    for (int64_t i = 0; i < offsets.size(); ++i)  // (-1: state the module keeps outside the arena)
      if (offsets[i] < -1 || (offsets[i] >= 0 && offsets[i] % kAlign != 0))
        return op->emitError() << "'kiln.offsets'[" << i << "] = " << offsets[i] << " is "
                               << (offsets[i] < 0 ? "negative" : "not a multiple of " + std::to_string(kAlign))
                               << " (the result's place in the arena"
                               << (offsets[i] < 0 ? "; -1 alone marks state kept outside it" : "")
                               << "; run kiln-plan-buffers)";
      else if (offsets[i] == -1 && !isOutsideArena(op->getResult(i)))
        return op->emitError() << "'kiln.offsets'[" << i << "] = -1 marks state kept outside the arena, but this "
                               << "result is computed here: it needs its place in the arena (run kiln-plan-buffers)";
    return success();
  }
  if (attr.getName() == "kiln.spec") {  // its keys and values: getModuleSpec (module_spec.cpp)
    if (!isa<DictionaryAttr>(attr.getValue()) || !isa<ModuleOp>(op))
      return op->emitError() << "'kiln.spec' must be a dictionary on the module (the spec kilnc built it from)";
    return success();
  }
  if (attr.getName() == "kiln.arena_size") {
    auto size = dyn_cast<IntegerAttr>(attr.getValue());
    if (!size || size.getType().isSignlessInteger(64) == false || size.getInt() < 0)
      return op->emitError() << "'kiln.arena_size' must be a non-negative i64 (the bytes the function's buffers need)";
    return success();
  }
  return success();
}
