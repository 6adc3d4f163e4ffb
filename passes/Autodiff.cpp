// kiln-autodiff: reverse-mode differentiation of @forward into @micro_step.
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace kiln {
#define GEN_PASS_DEF_AUTODIFF
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {
struct AutodiffPass : kiln::impl::AutodiffBase<AutodiffPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward) {
      module.emitError("kiln-autodiff: the module has no @forward function to differentiate");
      return signalPassFailure();
    }
    if (module.lookupSymbol("micro_step")) {
      module.emitError("kiln-autodiff: the module already has @micro_step");
      return signalPassFailure();
    }
    // A bf16 module gets its types from kiln-mixed-precision, before the backward pass exists
    // (it follows them); without them the step is built in fp32 and kilnc refuses it.
    if (specPrecision(module) == "bf16" &&
        !module.walk([](Operation* op) { return computesInBf16(op) ? WalkResult::interrupt() : WalkResult::advance(); })
             .wasInterrupted()) {
      module.emitError("kiln-autodiff: 'kiln.spec' has precision = \"bf16\" but @forward computes nothing in "
                       "bf16; run kiln-mixed-precision first (kiln-step-pipeline does)");
      return signalPassFailure();
    }
    if (failed(requireOneBlock(forward, "kiln-autodiff"))) return signalPassFailure();
    if (forward.isExternal() || forward.getNumArguments() != 0) {
      forward.emitError("kiln-autodiff: @forward must have a body and take no arguments (inputs "
                        "are kiln.input ops)");
      return signalPassFailure();
    }
    if (forward.getNumResults() != 1 ||
        forward.getResultTypes()[0] != RankedTensorType::get({}, Float32Type::get(&getContext()))) {
      forward.emitError("kiln-autodiff: @forward must return exactly the loss, a tensor<f32>");
      return signalPassFailure();
    }

    func::FuncOp step = forward.clone();
    step.setName("micro_step");
    module.insert(std::next(Block::iterator(forward)), step);
    if (failed(differentiate(step))) return signalPassFailure();
  }

  LogicalResult differentiate(func::FuncOp step) {
    Block &body = step.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    SmallVector<Operation *> forwardOps;
    for (Operation &op : body.without_terminator()) forwardOps.push_back(&op);

    // The values computed from a parameter: a gradient a rule drops for one of them would be
    // missing from that parameter's gradient (checked below).
    llvm::DenseSet<Value> fromParams;
    for (Operation *op : forwardOps)
      if (isa<ParamOp>(op) || llvm::any_of(op->getOperands(), [&](Value v) { return fromParams.contains(v); }))
        fromParams.insert(op->result_begin(), op->result_end());

    // Backward ops go right before the return, in the reverse order of the forward.
    OpBuilder b(ret);
    llvm::DenseMap<Value, Value> grads;
    grads[ret.getOperand(0)] = b.create<HyperOp>(ret.getLoc(), "loss_weight");

    auto accumulate = [&](Value v, Value g) {
      Value &slot = grads[v];
      slot = slot ? b.create<AddOp>(g.getLoc(), slot, g).getResult() : g;
    };

    for (Operation *op : llvm::reverse(forwardOps)) {
      if (auto param = dyn_cast<ParamOp>(op)) {
        if (Value g = grads.lookup(param.getResult())) {
          // A read of the bf16 compute copy has a bf16 gradient; the accumulator has the
          // declared (fp32 master) type.
          auto decl = SymbolTable::lookupNearestSymbolFrom<ParameterOp>(param, param.getNameAttr());
          if (decl && g.getType() != decl.getTensorType())
            g = b.create<CastOp>(param.getLoc(), decl.getTensorType(), g);
          b.create<AccumulateGradOp>(param.getLoc(), param.getNameAttr(), g);
        }
        continue;
      }
      // Ops without operands (zeros, iota, inputs, hyperparameters) are sources: nothing to do.
      if (op->getNumOperands() == 0) continue;
      SmallVector<Value> resultGrads;
      for (Value r : op->getResults()) resultGrads.push_back(grads.lookup(r));
      if (llvm::all_of(resultGrads, [](Value g) { return !g; })) continue;

      auto diff = dyn_cast<DifferentiableOpInterface>(op);
      if (!diff)
        return op->emitError() << "kiln-autodiff: '" << op->getName()
                               << "' lies on the path to the loss but has no gradient rule";
      // A statistic reaching the loss, or an operand left without a gradient, would make some
      // parameter's gradient silently incomplete: refuse rather than train on it.
      for (auto [i, r] : llvm::enumerate(op->getResults()))
        if (resultGrads[i] && fromParams.contains(r) && diff.isConstantResult(i))
          return op->emitError() << "kiln-autodiff: result #" << i << " of '" << op->getName()
                                 << "' is a statistic for the backward pass, which takes no gradient, "
                                    "but it is computed from a parameter and reaches the loss";
      b.setInsertionPoint(ret);
      SmallVector<Value> operandGrads = diff.buildVJP(b, resultGrads);
      for (auto [i, operand, g] : llvm::enumerate(op->getOperands(), operandGrads)) {
        if (g) accumulate(operand, g);
        else if (fromParams.contains(operand))
          return op->emitError() << "kiln-autodiff: operand #" << i << " of '" << op->getName()
                                 << "' is computed from a parameter and reaches the loss, but its "
                                    "gradient rule gives it no gradient";
      }
    }
    return success();
  }
};
}  // namespace
