// Vector-Jacobian products of the differentiable kiln ops (DifferentiableOpInterface).
//
// Each rule receives the gradients of its results (null where a result does not reach the
// loss) and returns one gradient per operand (null for operands that take none, such as token
// ids and runtime scalars). Statistics results (layer_norm's mean/rstd, attention's and
// cross_entropy's lse) exist for the backward pass only and are treated as constants
// (isConstantResult). kiln-autodiff refuses a forward pass where either choice would drop a
// parameter's gradient.
#include "Kiln/KilnDialect.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace kiln;

using Grads = SmallVector<Value>;

// The gradient of a converted value is converted back (bf16 gradients accumulate into fp32).
Grads CastOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value()};
  return {b.create<CastOp>(getLoc(), getInput().getType(), dy[0])};
}

Grads EmbeddingOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value(), Value()};
  Value dtable = b.create<EmbeddingGradOp>(getLoc(), getTable().getType(), dy[0], getIndices());
  return {dtable, Value()};
}

// result = op(A) op(B). Each case is the product rule written for the stored layouts, so no
// explicit transpose is ever materialised.
Grads MatmulOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  Value dc = dy[0];
  if (!dc) return {Value(), Value()};
  Value a = getLhs(), bm = getRhs();
  Type ta = a.getType(), tb = bm.getType();
  // bf16 operands with an fp32 result: the products of the gradient take dC in bf16 too (a
  // matmul's operands share one element type).
  auto elem = cast<RankedTensorType>(ta).getElementType();
  if (auto tc = cast<RankedTensorType>(dc.getType()); tc.getElementType() != elem)
    dc = b.create<CastOp>(getLoc(), tc.clone(elem), dc);
  auto mm = [&](Type t, Value l, Value r, bool tl, bool tr) -> Value {
    return b.create<MatmulOp>(getLoc(), t, l, r, tl, tr);
  };
  bool tA = getTransposeLhs(), tB = getTransposeRhs();
  if (!tA && !tB)  // C = A B:       dA = dC B^T,   dB = A^T dC
    return {mm(ta, dc, bm, false, true), mm(tb, a, dc, true, false)};
  if (!tA && tB)   // C = A B^T:     dA = dC B,     dB = dC^T A
    return {mm(ta, dc, bm, false, false), mm(tb, dc, a, true, false)};
  if (tA && !tB)   // C = A^T B:     dA = B dC^T,   dB = A dC
    return {mm(ta, bm, dc, false, true), mm(tb, a, dc, false, false)};
  // C = A^T B^T:                    dA = B^T dC^T, dB = dC^T A^T
  return {mm(ta, bm, dc, true, true), mm(tb, dc, a, true, true)};
}

Grads AddOp::buildVJP(OpBuilder &, ArrayRef<Value> dy) { return {dy[0], dy[0]}; }

Grads MulOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value(), Value()};
  Value dl = b.create<MulOp>(getLoc(), dy[0], getRhs());
  Value dr = b.create<MulOp>(getLoc(), dy[0], getLhs());
  return {dl, dr};
}

// The factor is a runtime scalar (a hyperparameter): it takes no gradient.
Grads ScaleOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value(), Value()};
  return {b.create<ScaleOp>(getLoc(), getInput().getType(), dy[0], getFactor()), Value()};
}

Grads GeluOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value()};
  return {b.create<GeluGradOp>(getLoc(), dy[0], getInput())};
}

Grads BroadcastOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value()};
  return {b.create<ReduceSumOp>(getLoc(), getInput().getType(), dy[0])};
}

Grads ReduceSumOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value()};
  return {b.create<BroadcastOp>(getLoc(), getInput().getType(), dy[0])};
}

Grads ReshapeOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value()};
  return {b.create<ReshapeOp>(getLoc(), getInput().getType(), dy[0])};
}

Grads TransposeOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value()};
  return {b.create<TransposeOp>(getLoc(), getInput().getType(), dy[0])};
}

// Pieces that do not reach the loss contribute zeros to the concatenated gradient.
Grads SplitOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (llvm::all_of(dy, [](Value v) { return !v; })) return {Value()};
  SmallVector<Value> pieces;
  for (auto [grad, result] : llvm::zip(dy, getResults()))
    pieces.push_back(grad ? grad : b.create<ZerosOp>(getLoc(), result.getType()).getResult());
  return {b.create<ConcatOp>(getLoc(), getInput().getType(), pieces)};
}

Grads ConcatOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return Grads(getInputs().size(), Value());
  auto split = b.create<SplitOp>(getLoc(), getInputs().getTypes(), dy[0]);
  return Grads(split.getResults());
}

Grads LayerNormOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value(), Value(), Value()};
  auto g = b.create<LayerNormGradOp>(getLoc(), getInput().getType(), getWeight().getType(),
                                     getBias().getType(), dy[0], getInput(), getWeight(),
                                     getMean(), getRstd());
  return {g.getInputGrad(), g.getWeightGrad(), g.getBiasGrad()};
}

bool LayerNormOp::isConstantResult(unsigned index) { return index != 0; }  // mean, rstd

Grads AttentionOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value()};
  return {b.create<AttentionGradOp>(getLoc(), getQkv().getType(), dy[0], getQkv(), getResult(),
                                    getLse(), getNumHeads())};
}

bool AttentionOp::isConstantResult(unsigned index) { return index == 1; }  // lse

Grads CrossEntropyOp::buildVJP(OpBuilder &b, ArrayRef<Value> dy) {
  if (!dy[0]) return {Value(), Value()};
  return {b.create<CrossEntropyGradOp>(getLoc(), getLogits().getType(), dy[0], getLogits(),
                                       getLse(), getTargets(), getNumClassesAttr()),
          Value()};
}

bool CrossEntropyOp::isConstantResult(unsigned index) { return index == 1; }  // lse
