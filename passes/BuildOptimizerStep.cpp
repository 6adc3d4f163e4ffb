// kiln-build-optimizer-step: global norm, clipping and AdamW over every parameter.
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"

namespace kiln {
#define GEN_PASS_DEF_BUILDOPTIMIZERSTEP
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {
struct BuildOptimizerStepPass : kiln::impl::BuildOptimizerStepBase<BuildOptimizerStepPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (module.lookupSymbol("optimizer_step")) {
      module.emitError("kiln-build-optimizer-step: the module already has @optimizer_step");
      return signalPassFailure();
    }
    auto params = llvm::to_vector(module.getOps<ParameterOp>());
    if (params.empty()) {
      module.emitError("kiln-build-optimizer-step: the module declares no kiln.parameter");
      return signalPassFailure();
    }
    // @optimizer_step reads the gradients that @micro_step accumulates: without it the step
    // has nothing to read (and kilnc refuses the module), so this is kiln-autodiff's output.
    if (!module.lookupSymbol("micro_step")) {
      module.emitError("kiln-build-optimizer-step: the module has no @micro_step, whose gradients "
                       "@optimizer_step reads; run kiln-autodiff first");
      return signalPassFailure();
    }

    Location loc = NameLoc::get(StringAttr::get(&getContext(), "optimizer"));
    auto scalar = RankedTensorType::get({}, Float32Type::get(&getContext()));
    OpBuilder b(module.getBodyRegion());
    b.setInsertionPointToEnd(module.getBody());
    auto func = b.create<func::FuncOp>(loc, "optimizer_step", b.getFunctionType({}, {scalar}));
    b.setInsertionPointToStart(func.addEntryBlock());

    SmallVector<Value> grads;
    for (ParameterOp p : params)
      grads.push_back(b.create<GradOp>(p.getLoc(), p.getType(), FlatSymbolRefAttr::get(p)));
    Value norm = b.create<GlobalNormOp>(loc, grads);
    Value coef = b.create<ClipCoefOp>(loc, norm, b.create<HyperOp>(loc, "max_norm"));

    auto hyper = [&](StringRef name) { return b.create<HyperOp>(loc, name).getResult(); };
    Value lr = hyper("lr"), beta1 = hyper("beta1"), beta2 = hyper("beta2"), eps = hyper("eps"),
          wd = hyper("weight_decay"), t = hyper("step");
    for (auto [p, g] : llvm::zip(params, grads))
      b.create<AdamWOp>(p.getLoc(), FlatSymbolRefAttr::get(p), g, coef, lr, beta1, beta2, eps,
                        wd, t, p.getDecay() ? b.getUnitAttr() : UnitAttr());
    b.create<func::ReturnOp>(loc, norm);
  }
};
}  // namespace
