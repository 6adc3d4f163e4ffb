// kiln-recompute: recompute GELU and layer-norm outputs in the backward pass.
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace kiln {
#define GEN_PASS_DEF_RECOMPUTE
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {
struct RecomputePass : kiln::impl::RecomputeBase<RecomputePass> {
  using RecomputeBase::RecomputeBase;

  void runOnOperation() override {
    // Also with mode=none: this is the first pass of kiln-plan-pipeline, which must not run twice.
    if (failed(refusePlanned(getOperation(), "kiln-recompute"))) return signalPassFailure();
    if (mode == "none") return;
    if (mode != "cheap") {
      getOperation().emitError() << "kiln-recompute: unknown mode '" << mode
                                 << "' (expected none or cheap)";
      return signalPassFailure();
    }
    auto step = getOperation().lookupSymbol<func::FuncOp>("micro_step");
    // Graph IR: there is no backward pass to recompute in yet, and saying nothing would look
    // like "nothing worth recomputing".
    if (!step && getOperation().lookupSymbol("forward")) {
      getOperation().emitError("kiln-recompute: no @micro_step (graph IR): the pass recomputes in the "
                               "backward pass of the training step; run kiln-autodiff first");
      return signalPassFailure();
    }
    if (!step || step.isExternal()) return;
    if (failed(requireOneBlock(step, "kiln-recompute"))) return signalPassFailure();
    // GELU and layer-norm outputs inside fusion regions are out of reach: after
    // kiln-fuse-kernels the pass would recompute only the ops left unfused, and say nothing.
    FusionOp fused;
    step.walk([&](FusionOp f) {
      fused = f;
      return WalkResult::interrupt();
    });
    if (fused) {
      fused.emitError("kiln-recompute: @micro_step is fused already (kiln.fusion), and the outputs "
                      "inside regions cannot be recomputed; run kiln-recompute before kiln-fuse-kernels");
      return signalPassFailure();
    }
    Block& body = step.getBody().front();
    if (body.getTerminator()->getNumOperands() != 1) {
      step.emitError("kiln-recompute: @micro_step must return one value, the loss");
      return signalPassFailure();
    }
    Operation* loss = body.getTerminator()->getOperand(0).getDefiningOp();
    if (!loss) return;

    // Position of every op, to tell forward uses (up to the loss) from backward ones.
    llvm::DenseMap<Operation*, unsigned> position;
    unsigned i = 0;
    for (Operation& op : body) position[&op] = i++;
    const unsigned boundary = position[loss];

    SmallVector<Operation*> candidates;
    for (Operation& op : body)
      if (position[&op] < boundary && isa<GeluOp, LayerNormOp>(op)) candidates.push_back(&op);

    for (Operation* op : candidates) {
      Value out = op->getResult(0);  // the activation; layer-norm statistics are small: kept
      SmallVector<OpOperand*> late;
      for (OpOperand& use : out.getUses())
        if (position[use.getOwner()] > boundary) late.push_back(&use);
      if (late.empty()) continue;
      Operation* first = late.front()->getOwner();
      for (OpOperand* use : late)
        if (position[use->getOwner()] < position[first]) first = use->getOwner();
      OpBuilder b(first);
      Operation* clone = b.clone(*op);
      clone->setAttr("kiln.recomputed", b.getUnitAttr());
      for (OpOperand* use : late) use->set(clone->getResult(0));
    }
  }
};
}  // namespace
