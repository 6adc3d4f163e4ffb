// kiln-bucket-gradients: gradient buckets, reduced as soon as the backward pass finishes them.
#include "passes/Passes.h"

#include <cmath>

#include "mlir/IR/Builders.h"

namespace kiln {
#define GEN_PASS_DEF_BUCKETGRADIENTS
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {
struct BucketGradientsPass : kiln::impl::BucketGradientsBase<BucketGradientsPass> {
  using BucketGradientsBase::BucketGradientsBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto step = module.lookupSymbol<func::FuncOp>("micro_step");
    // Graph IR: no gradients yet, and saying nothing would look like "no buckets needed".
    if (!step && module.lookupSymbol("forward")) {
      module.emitError("kiln-bucket-gradients: no @micro_step (graph IR): the pass places the "
                       "reductions of the training step's gradients; run kiln-autodiff first");
      return signalPassFailure();
    }
    if (!step || step.isExternal()) return;
    if (failed(refusePlanned(module, "kiln-bucket-gradients"))) return signalPassFailure();
    // A second run would add buckets numbered from 0 again, out of program order for the runtime.
    Operation* placed = nullptr;
    module.walk([&](Operation* op) {
      if (isa<ReduceGradientsOp, WaitGradientsOp>(op)) placed = op;
      return placed ? WalkResult::interrupt() : WalkResult::advance();
    });
    if (placed) {
      placed->emitError() << "kiln-bucket-gradients: the module already has gradient buckets ('"
                          << placed->getName() << "'); the pass runs once";
      return signalPassFailure();
    }
    if (!(bucketMB > 0) || !std::isfinite(bucketMB)) {
      module.emitError() << "kiln-bucket-gradients: bucket-mb must be a positive finite number, not " << bucketMB;
      return signalPassFailure();
    }
    const double cap = bucketMB * 1e6;

    // The last accumulation of each parameter, in program order: the op of the step's body
    // that does it (a kiln.accumulate_grad, or the kiln.fusion region holding one).
    if (!step.getBody().hasOneBlock()) {
      step.emitError() << "kiln-bucket-gradients: @micro_step must have one block (straight-line code)";
      return signalPassFailure();
    }
    Block& body = step.getBody().front();
    // (The walk is in program order: a later accumulation replaces an earlier one, and `seq`
    // orders the parameters one region finishes as the walk meets their last accumulations.)
    llvm::DenseMap<StringAttr, std::pair<Operation*, size_t>> last;
    size_t seq = 0;
    step.walk([&](AccumulateGradOp acc) { last[acc.getNameAttr().getAttr()] = {body.findAncestorOpInBlock(*acc), seq++}; });
    SmallVector<std::pair<StringAttr, Operation*>> order;
    for (auto& [name, at] : last) order.push_back({name, at.first});
    llvm::sort(order, [&](auto& a, auto& b) {
      return a.second != b.second ? a.second->isBeforeInBlock(b.second) : last[a.first].second < last[b.first].second;
    });
    SymbolTable symbols(module);  // (a lookup by name in the module itself is a scan)

    OpBuilder b(&getContext());
    SmallVector<Attribute> bucket;
    double bytes = 0;
    int64_t id = 0;
    auto close = [&](Operation* after) {
      b.setInsertionPointAfter(after);
      b.create<ReduceGradientsOp>(after->getLoc(), b.getArrayAttr(bucket), b.getI64IntegerAttr(id++));
      bucket.clear();
      bytes = 0;
    };
    for (auto [i, entry] : llvm::enumerate(order)) {
      auto [name, acc] = entry;
      auto paramSize = [&](StringAttr n) {
        return 4.0 * symbols.lookup<ParameterOp>(n).getTensorType().getNumElements();
      };
      const double size = paramSize(name);
      bucket.push_back(FlatSymbolRefAttr::get(name));
      bytes += size;
      const bool lastOne = i + 1 == order.size();
      const double next = lastOne ? 0 : paramSize(order[i + 1].first);
      // A region that finishes several gradients closes a bucket only after its last one.
      const bool sameOp = !lastOne && order[i + 1].second == acc;
      if (lastOne || (bytes + next > cap && !sameOp)) close(acc);
    }

    if (auto opt = module.lookupSymbol<func::FuncOp>("optimizer_step"); opt && !opt.isExternal()) {
      b.setInsertionPointToStart(&opt.getBody().front());
      b.create<WaitGradientsOp>(opt.getLoc());
    }
  }
};
}  // namespace
