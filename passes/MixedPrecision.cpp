// kiln-mixed-precision: bf16 where autocast would use it, fp32 everywhere else.
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace kiln {
#define GEN_PASS_DEF_MIXEDPRECISION
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {

bool isBF16(Value v) { return cast<RankedTensorType>(v.getType()).getElementType().isBF16(); }

RankedTensorType withElement(Value v, Type element) {
  return cast<RankedTensorType>(v.getType()).clone(element);
}

struct MixedPrecisionPass : kiln::impl::MixedPrecisionBase<MixedPrecisionPass> {
  void runOnOperation() override {
    auto forward = getOperation().lookupSymbol<func::FuncOp>("forward");
    if (!forward || forward.isExternal()) {
      getOperation().emitError("kiln-mixed-precision: no @forward function");
      return signalPassFailure();
    }
    // The policy is for the graph: the backward pass and the optimizer step follow the types it
    // gave the forward pass, and would not type-check if given them afterwards.
    if (Operation* step = getOperation().lookupSymbol("micro_step")) {
      step->emitError("kiln-mixed-precision: the module already has @micro_step; run the pass before kiln-autodiff");
      return signalPassFailure();
    }
    // A module built from a spec records its precision in kiln.spec, and kilnc refuses bf16
    // types in a module that says fp32: refuse here, where the cause is, rather than there.
    if (auto precision = specPrecision(getOperation()); precision && *precision != "bf16") {
      getOperation().emitError()
          << "kiln-mixed-precision: 'kiln.spec' has precision = \"" << *precision
          << "\"; the pass makes a bf16 module, which kilnc compiles only with precision = \"bf16\" "
             "(set it in the spec and emit the graph again)";
      return signalPassFailure();
    }
    // The pass retypes values in place; only kiln ops (and the return, whose function type it
    // rewrites) follow. A func.call would keep its callee's types: a value passed to it, or a
    // callee whose result turned bf16, left calls the verifier refuses after the pass.
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (f.isExternal()) continue;
      WalkResult foreign = f.walk([&](Operation* op) {
        if (op == f.getOperation() || isa<func::ReturnOp>(op) ||
            op->getDialect() == getContext().getLoadedDialect<KilnDialect>())
          return WalkResult::advance();
        op->emitError() << "kiln-mixed-precision: '" << op->getName() << "' in @" << f.getName()
                        << " is not a kiln op: the pass changes the element types of the values it reads and "
                           "would leave its types behind (graph IR holds kiln ops only)";
        return WalkResult::interrupt();
      });
      if (foreign.wasInterrupted()) return signalPassFailure();
    }
    for (auto f : getOperation().getOps<func::FuncOp>())
      if (!f.isExternal()) assignTypes(f);
    // Under precision = "bf16", something the functions return must be computed in bf16: else
    // kiln-autodiff (nothing in bf16) refuses the module later, asking for the pass that has just
    // run, or the dead bf16 ops go and the step is fp32 under a spec that says bf16.
    if (auto precision = specPrecision(getOperation()); precision && *precision == "bf16" && !computesLiveBf16()) {
      forward.emitError("kiln-mixed-precision: 'kiln.spec' has precision = \"bf16\" but nothing the functions "
                        "return is computed in bf16 (autocast's policy gives bf16 to kiln.matmul and "
                        "kiln.attention); compile this graph with precision = \"fp32\"");
      return signalPassFailure();
    }
  }

  // Whether an op that some function's result or side effect depends on has a bf16 result (an
  // op that only reads, as kiln.param, is dead when unused: canonicalization drops it).
  bool computesLiveBf16() {
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (f.isExternal()) continue;
      llvm::DenseSet<Operation*> live;
      for (Block& block : f.getBody())
        for (Operation& op : llvm::reverse(block.getOperations())) {
          if (op.hasTrait<OpTrait::IsTerminator>() || !wouldOpBeTriviallyDead(&op) ||
              llvm::any_of(op.getUsers(), [&](Operation* u) { return live.contains(u); }))
            live.insert(&op);
          if (live.contains(&op) && computesInBf16(&op)) return true;
        }
    }
    return false;
  }

  // Every graph function gets the policy (@forward, @logits and @decode alike).
  void assignTypes(func::FuncOp forward) {
    Type bf16 = BFloat16Type::get(&getContext()), f32 = Float32Type::get(&getContext());
    OpBuilder b(&getContext());

    // Operand `i` of `op` converted to `element` (a cast right before the op when needed).
    auto convert = [&](Operation* op, unsigned i, Type element) {
      Value v = op->getOperand(i);
      if (cast<RankedTensorType>(v.getType()).getElementType() == element) return;
      b.setInsertionPoint(op);
      op->setOperand(i, b.create<CastOp>(op->getLoc(), withElement(v, element), v));
    };
    auto setResult = [&](Value r, Type element) { r.setType(withElement(r, element)); };

    SmallVector<Operation*> ops;
    forward.walk([&](Operation* op) { ops.push_back(op); });
    for (Operation* op : ops) {
      if (auto mm = dyn_cast<MatmulOp>(op)) {
        convert(op, 0, bf16);
        convert(op, 1, bf16);
        setResult(mm.getResult(), bf16);
      } else if (auto add = dyn_cast<AddOp>(op)) {
        Value l = add.getLhs(), r = add.getRhs();
        // A bias (a broadcast parameter) added to a bf16 matmul result is added in bf16.
        auto biasOf = [](Value v) {
          auto bc = v.getDefiningOp<BroadcastOp>();
          return bc && bc.getInput().getDefiningOp<ParamOp>() ? bc : BroadcastOp();
        };
        for (auto [a, other] : {std::pair{l, r}, std::pair{r, l}})
          if (isBF16(a) && !isBF16(other))
            if (BroadcastOp bc = biasOf(other)) {
              convert(bc, 0, bf16);
              setResult(bc.getResult(), bf16);
            }
        // Otherwise mixed operands promote to fp32 (the residual stream).
        Type element = isBF16(add.getLhs()) && isBF16(add.getRhs()) ? bf16 : f32;
        convert(op, 0, element);
        convert(op, 1, element);
        setResult(add.getResult(), element);
      } else if (auto gelu = dyn_cast<GeluOp>(op)) {
        setResult(gelu.getResult(), cast<RankedTensorType>(gelu.getInput().getType()).getElementType());
      } else if (auto attn = dyn_cast<AttentionOp>(op)) {
        convert(op, 0, bf16);
        setResult(attn.getResult(), bf16);
      } else if (auto dec = dyn_cast<DecodeAttentionOp>(op)) {
        convert(op, 0, bf16);  // as kiln.attention; the cache stays fp32
        setResult(dec.getResult(), bf16);
      } else if (auto ln = dyn_cast<LayerNormOp>(op)) {
        bool feedsMatmuls = !ln.getResult().use_empty() &&
                            llvm::all_of(ln.getResult().getUsers(), [](Operation* u) { return isa<MatmulOp>(u); });
        setResult(ln.getResult(), feedsMatmuls ? bf16 : f32);
      } else if (auto reshape = dyn_cast<ReshapeOp>(op)) {
        setResult(reshape.getResult(), cast<RankedTensorType>(reshape.getInput().getType()).getElementType());
      } else if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        // The function returns what it computes (the fp32 loss; bf16 logits).
        forward.setFunctionType(FunctionType::get(&getContext(), forward.getArgumentTypes(), ret.getOperandTypes()));
      }
      // Everything else (embeddings, broadcasts of fp32 values, cross-entropy, reductions)
      // keeps fp32 results; cross-entropy reads bf16 logits as they are. Another op reading a
      // bf16 value (a reduction of a product) reads it widened, as its fp32 result requires.
      else if (!isa<CastOp, CrossEntropyOp>(op) && op->getDialect() == getContext().getLoadedDialect<KilnDialect>())
        for (unsigned i = 0; i < op->getNumOperands(); ++i)
          if (auto t = dyn_cast<RankedTensorType>(op->getOperand(i).getType()); t && t.getElementType().isBF16())
            convert(op, i, f32);
    }
  }
};

}  // namespace
