// Verifiers of the kiln ops: every shape relation an op relies on is checked here, so passes
// and the runtime can take them for granted.
#include "Kiln/KilnDialect.h"
#include "runtime/hyper_names.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/PatternMatch.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/STLExtras.h"

#include <cmath>
#include <utility>

using namespace mlir;
using namespace kiln;

namespace {
RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

// "[4, 32, 64]" for messages.
std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape)) s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

bool isSuffix(ArrayRef<int64_t> suffix, ArrayRef<int64_t> full) {
  return suffix.size() <= full.size() && full.take_back(suffix.size()) == suffix;
}

LogicalResult verifyParameterUse(Operation *op, SymbolTableCollection &symbols,
                                 FlatSymbolRefAttr name, Type used) {
  auto decl = symbols.lookupNearestSymbolFrom<ParameterOp>(op, name);
  if (!decl)
    return op->emitOpError() << "refers to " << name << ", which is not a kiln.parameter";
  if (used && decl.getType() != used)
    return op->emitOpError() << "type " << used << " does not match " << name
                             << " declared as " << decl.getType();
  return success();
}

// Elements of a static shape; false when the count passes 2^48 (or wraps on the way).
// 1 to 2^48 elements: every buffer is sized from its type, and the module writer and the kernel
// templates divide by element counts and row lengths (a zero dimension would divide by zero).
bool boundedNumel(ArrayRef<int64_t> shape) {
  if (llvm::is_contained(shape, 0)) return false;
  uint64_t elements = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(elements, uint64_t(d), &elements)) return false;
  return elements <= (uint64_t(1) << 48);
}
}  // namespace

bool kiln::fitsArena(Type type) {
  auto t = dyn_cast<RankedTensorType>(type);
  return t && t.hasStaticShape() && boundedNumel(t.getShape());
}

//===----------------------------------------------------------------------===//
// State
//===----------------------------------------------------------------------===//

LogicalResult ParameterOp::verify() {
  // The name keys the tensor in weights files and checkpoints, and messages print it.
  if (llvm::any_of(getSymName(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return emitOpError() << "name may not hold control characters (it keys the tensor in weights files and "
                            "checkpoints)";
  StringRef init = getInit();
  if (init != "normal" && init != "zeros" && init != "ones")
    return emitOpError() << "init must be \"normal\", \"zeros\" or \"ones\", not \"" << init << "\"";
  float std = getInitStd().convertToFloat();
  if (init == "normal" && !(std > 0.0f && std::isfinite(std)))
    return emitOpError() << "init \"normal\" needs init_std > 0 (and finite)";
  if (!getTensorType().hasStaticShape())
    return emitOpError() << "needs a static shape";
  // A bound far above any real tensor (2^48 elements is 1 PiB of fp32) keeps each state buffer's
  // byte size, and their sum over a module (value, gradient, two moments per parameter), from
  // wrapping int64. (The ops' types have the same bound.)
  if (!boundedNumel(getTensorType().getShape()))
    return emitOpError() << "shape " << shapeStr(getTensorType().getShape()) << " must have 1 to 2^48 elements (no zero dimension)";
  return success();
}

LogicalResult ParamOp::verifySymbolUses(SymbolTableCollection &symbols) {
  // A bf16 read of an fp32 parameter reads its compute copy.
  auto t = cast<RankedTensorType>(getType());
  auto decl = symbols.lookupNearestSymbolFrom<ParameterOp>(*this, getNameAttr());
  if (decl && t.getElementType().isBF16() && decl.getTensorType().getElementType().isF32() &&
      decl.getTensorType().getShape() == t.getShape())
    return success();
  return verifyParameterUse(*this, symbols, getNameAttr(), t);
}
LogicalResult GradOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyParameterUse(*this, symbols, getNameAttr(), getType());
}
LogicalResult AccumulateGradOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyParameterUse(*this, symbols, getNameAttr(), getGradient().getType());
}
LogicalResult AdamWOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (failed(verifyParameterUse(*this, symbols, getNameAttr(), getGrad().getType())))
    return failure();
  auto decl = symbols.lookupNearestSymbolFrom<ParameterOp>(*this, getNameAttr());
  if (decl.getDecay() != getDecay())
    return emitOpError() << "decay " << (getDecay() ? "set" : "unset") << " but " << getNameAttr()
                         << " is declared " << (decl.getDecay() ? "with" : "without") << " decay";
  return success();
}

LogicalResult ReduceGradientsOp::verify() {
  if (getParams().empty()) return emitOpError() << "needs at least one parameter";
  return success();
}

LogicalResult ReduceGradientsOp::verifySymbolUses(SymbolTableCollection &symbols) {
  for (Attribute a : getParams()) {
    auto ref = dyn_cast<FlatSymbolRefAttr>(a);
    if (!ref) return emitOpError() << "expects flat references to parameters, got " << a;
    if (failed(verifyParameterUse(*this, symbols, ref, Type()))) return failure();
  }
  return success();
}

LogicalResult IotaOp::verify() {
  // Element i is i, an i32: a longer sequence would hold positions that wrap around.
  const int64_t n = cast<RankedTensorType>(getType()).getNumElements();
  if (n > (int64_t(1) << 31))
    return emitOpError() << "holds the positions 0 to " << n - 1 << ", above the largest i32 (2^31 - 1)";
  return success();
}

LogicalResult InputOp::verify() {
  StringRef name = getInputName();
  StringRef rest = name;
  const bool prefill = (rest.consume_front("prefill_short") || rest.consume_front("prefill")) &&
                       (rest == "_tokens" || rest == "_positions");
  if (name != "idx" && name != "targets" && name != "token" && name != "position" && !prefill)
    return emitOpError() << "unknown input \"" << name
                         << "\" (expected idx, targets, token, position, or prefill[_short]_tokens or "
                            "prefill[_short]_positions)";
  auto type = cast<RankedTensorType>(getType());
  if (name == "position" && type.getShape() != ArrayRef<int64_t>{1})
    return emitOpError() << "\"position\" is one position, tensor<1xi32>, not " << type;
  return success();
}

LogicalResult HyperOp::verify() {
  if (is_hyper_name(getHyperName().str())) return success();
  return emitOpError() << "unknown hyperparameter \"" << getHyperName() << "\" (expected one of "
                       << hyper_names_listed() << ")";
}

//===----------------------------------------------------------------------===//
// Model ops
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::verify() {
  auto table = tensorType(getTable()), idx = tensorType(getIndices()), out = tensorType(getResult());
  if (table.getRank() != 2) return emitOpError() << "table must be 2-D [rows, width]";
  SmallVector<int64_t> expected(idx.getShape());
  expected.push_back(table.getDimSize(1));
  if (out.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "result shape " << shapeStr(out.getShape()) << " should be "
                         << shapeStr(expected) << " (indices shape, then the table's width)";
  if (out.getElementType() != table.getElementType())
    return emitOpError() << "result element type differs from the table's: " << out.getElementType() << ", not "
                         << table.getElementType();
  return success();
}

LogicalResult EmbeddingGradOp::verify() {
  auto grad = tensorType(getGrad()), idx = tensorType(getIndices()), out = tensorType(getResult());
  if (out.getRank() != 2) return emitOpError() << "result must be 2-D [rows, width]";
  SmallVector<int64_t> expected(idx.getShape());
  expected.push_back(out.getDimSize(1));
  if (grad.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "grad shape " << shapeStr(grad.getShape()) << " should be "
                         << shapeStr(expected) << " (indices shape, then the table's width)";
  return success();
}

LogicalResult CastOp::verify() {
  auto in = tensorType(getInput()), out = tensorType(getResult());
  if (in.getShape() != out.getShape())
    return emitOpError() << "cannot change the shape " << shapeStr(in.getShape()) << " to "
                         << shapeStr(out.getShape()) << " (only the element type)";
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getType()) return getInput();
  // bf16 -> f32 -> bf16 is exact: the inner value comes back unchanged.
  if (auto inner = getInput().getDefiningOp<CastOp>())
    if (inner.getInput().getType() == getType() &&
        tensorType(getInput()).getElementTypeBitWidth() > getType().getElementTypeBitWidth())
      return inner.getInput();
  return {};
}

namespace {
// cast(kiln.param @w : f32) : bf16  ->  kiln.param @w : bf16 (the compute copy).
struct CastOfParamToComputeCopy : OpRewritePattern<CastOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(CastOp cast, PatternRewriter &rewriter) const override {
    auto param = cast.getInput().getDefiningOp<ParamOp>();
    if (!param || !tensorType(cast.getResult()).getElementType().isBF16() ||
        !tensorType(param.getResult()).getElementType().isF32())
      return failure();
    rewriter.replaceOpWithNewOp<ParamOp>(cast, cast.getType(), param.getNameAttr());
    return success();
  }
};
}  // namespace

void CastOp::getCanonicalizationPatterns(RewritePatternSet &results, MLIRContext *context) {
  results.add<CastOfParamToComputeCopy>(context);
}

LogicalResult MatmulOp::verify() {
  auto a = tensorType(getLhs()), b = tensorType(getRhs()), c = tensorType(getResult());
  if (a.getRank() != 2 || b.getRank() != 2 || c.getRank() != 2)
    return emitOpError() << "operands and result must be 2-D";
  int64_t m = getTransposeLhs() ? a.getDimSize(1) : a.getDimSize(0);
  int64_t ka = getTransposeLhs() ? a.getDimSize(0) : a.getDimSize(1);
  int64_t kb = getTransposeRhs() ? b.getDimSize(1) : b.getDimSize(0);
  int64_t n = getTransposeRhs() ? b.getDimSize(0) : b.getDimSize(1);
  if (ka != kb)
    return emitOpError() << "contraction sizes differ: lhs has " << ka << ", rhs has " << kb;
  if (c.getDimSize(0) != m || c.getDimSize(1) != n)
    return emitOpError() << "result shape " << shapeStr(c.getShape()) << " should be "
                         << shapeStr({m, n});
  if (a.getElementType() != b.getElementType())
    return emitOpError() << "operands must share one element type, got " << a.getElementType()
                         << " and " << b.getElementType();
  return success();
}

LogicalResult ScaleOp::verify() {
  if (getInput().getType() != getResult().getType())
    return emitOpError() << "result type must equal the input type " << getInput().getType() << ", got "
                         << getResult().getType();
  return success();
}

LogicalResult BroadcastOp::verify() {
  auto in = tensorType(getInput()), out = tensorType(getResult());
  if (!isSuffix(in.getShape(), out.getShape()))
    return emitOpError() << "input shape " << shapeStr(in.getShape())
                         << " must be a suffix of the result shape " << shapeStr(out.getShape());
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "result element type " << out.getElementType() << " must be the input's, "
                         << in.getElementType();
  return success();
}

LogicalResult ReduceSumOp::verify() {
  auto in = tensorType(getInput()), out = tensorType(getResult());
  if (!isSuffix(out.getShape(), in.getShape()))
    return emitOpError() << "result shape " << shapeStr(out.getShape())
                         << " must be a suffix of the input shape " << shapeStr(in.getShape());
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "result element type " << out.getElementType() << " must be the input's, "
                         << in.getElementType();
  return success();
}

LogicalResult ReshapeOp::verify() {
  auto in = tensorType(getInput()), out = tensorType(getResult());
  if (in.getNumElements() != out.getNumElements())
    return emitOpError() << "cannot reshape " << shapeStr(in.getShape()) << " ("
                         << in.getNumElements() << " elements) to " << shapeStr(out.getShape())
                         << " (" << out.getNumElements() << " elements)";
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "result element type " << out.getElementType() << " must be the input's, "
                         << in.getElementType() << " (a reshape moves no data; kiln.cast converts)";
  return success();
}

OpFoldResult ReshapeOp::fold(FoldAdaptor) {
  if (getInput().getType() == getResult().getType()) return getInput();
  // reshape(reshape(x)) is one reshape of x.
  if (auto inner = getInput().getDefiningOp<ReshapeOp>()) {
    getInputMutable().assign(inner.getInput());
    return getResult();
  }
  return {};
}

LogicalResult TransposeOp::verify() {
  auto in = tensorType(getInput()), out = tensorType(getResult());
  if (in.getRank() != 2 || out.getRank() != 2 || in.getDimSize(0) != out.getDimSize(1) ||
      in.getDimSize(1) != out.getDimSize(0))
    return emitOpError() << "result " << shapeStr(out.getShape())
                         << " is not the 2-D transpose of " << shapeStr(in.getShape());
  return success();
}

// Shared by split and concat: `parts` laid side by side along the last axis make `whole`.
static LogicalResult verifyLastAxisPieces(Operation *op, RankedTensorType whole,
                                          TypeRange parts) {
  if (parts.empty()) return op->emitOpError() << "needs at least one piece";
  // The pieces are taken along the last axis, so there must be one (a 0-D tensor has none).
  if (whole.getRank() < 1)
    return op->emitOpError() << "needs tensors of at least one dimension (it splits or joins the last), got "
                             << whole;
  int64_t total = 0;
  for (Type t : parts) {
    auto part = cast<RankedTensorType>(t);
    if (part.getRank() != whole.getRank() ||
        part.getShape().drop_back() != whole.getShape().drop_back())
      return op->emitOpError() << "piece " << shapeStr(part.getShape())
                               << " must match " << shapeStr(whole.getShape())
                               << " in every dimension but the last";
    total += part.getShape().back();
  }
  if (total != whole.getShape().back())
    return op->emitOpError() << "pieces cover " << total << " of the last dimension's "
                             << whole.getShape().back();
  return success();
}

LogicalResult SplitOp::verify() {
  return verifyLastAxisPieces(*this, tensorType(getInput()), getResultTypes());
}
LogicalResult ConcatOp::verify() {
  return verifyLastAxisPieces(*this, tensorType(getResult()), getInputs().getTypes());
}

// Shared by layer_norm and layer_norm_grad, whose kernels index the per-channel vectors (named
// `what` in the message) by the input's last dimension and the statistics by its other ones.
static LogicalResult verifyLayerNormShapes(Operation *op, RankedTensorType in, ArrayRef<Value> perChannel,
                                           StringRef what, Value mean, Value rstd) {
  if (in.getRank() < 1) return op->emitOpError() << "input must have at least one dimension";
  const int64_t c = in.getShape().back();
  for (Value p : perChannel)
    if (tensorType(p).getShape() != ArrayRef<int64_t>{c})
      return op->emitOpError() << what << " must be [" << c << "] (the last dimension)";
  for (Value s : {mean, rstd})
    if (tensorType(s).getShape() != in.getShape().drop_back())
      return op->emitOpError() << "mean and rstd must have the input's shape without the last "
                                  "dimension, " << shapeStr(in.getShape().drop_back());
  return success();
}

LogicalResult LayerNormOp::verify() {
  auto in = tensorType(getInput());
  if (failed(verifyLayerNormShapes(*this, in, {getWeight(), getBias()}, "weight and bias", getMean(), getRstd())))
    return failure();
  if (tensorType(getResult()).getShape() != in.getShape())
    return emitOpError() << "result shape must equal the input shape " << shapeStr(in.getShape()) << ", got "
                         << shapeStr(tensorType(getResult()).getShape());
  const float eps = getEpsilon().convertToFloat();
  if (!(eps > 0.0f && std::isfinite(eps))) return emitOpError() << "epsilon must be > 0 (and finite)";
  return success();
}

LogicalResult LayerNormGradOp::verify() {
  auto in = tensorType(getInput());
  if (failed(verifyLayerNormShapes(*this, in, {getWeight(), getWeightGrad(), getBiasGrad()},
                                   "weight, weight_grad and bias_grad", getMean(), getRstd())))
    return failure();
  for (Value v : {getGrad(), getInputGrad()})
    if (tensorType(v).getShape() != in.getShape())
      return emitOpError() << "grad and input_grad must have the input's shape " << shapeStr(in.getShape())
                           << ", got " << shapeStr(tensorType(v).getShape());
  return success();
}

// Shared by attention and attention_grad: qkv is [B, T, 3C] and num_heads divides C. Sets
// {B, T, C}.
static LogicalResult verifyPackedQkv(Operation *op, RankedTensorType qkv, int64_t h,
                                     SmallVectorImpl<int64_t> &btc) {
  if (qkv.getRank() != 3 || qkv.getDimSize(2) % 3 != 0)
    return op->emitOpError() << "qkv must be [B, T, 3C], got " << shapeStr(qkv.getShape());
  btc.assign({qkv.getDimSize(0), qkv.getDimSize(1), qkv.getDimSize(2) / 3});
  if (h <= 0 || btc[2] % h != 0)
    return op->emitOpError() << "num_heads " << h << " must divide the " << btc[2] << " channels";
  return success();
}

LogicalResult AttentionOp::verify() {
  auto out = tensorType(getResult()), lse = tensorType(getLse());
  const int64_t h = int64_t(getNumHeads());
  SmallVector<int64_t, 3> btc;
  if (failed(verifyPackedQkv(*this, tensorType(getQkv()), h, btc))) return failure();
  const int64_t b = btc[0], t = btc[1];
  if (out.getShape() != ArrayRef<int64_t>(btc))
    return emitOpError() << "result must be " << shapeStr(btc) << ", got " << shapeStr(out.getShape());
  if (lse.getShape() != ArrayRef<int64_t>{b, h, t})
    return emitOpError() << "lse must be " << shapeStr({b, h, t}) << " [B, H, T], got " << shapeStr(lse.getShape());
  // The kernels read and write every tensor but lse in qkv's element type.
  if (out.getElementType() != tensorType(getQkv()).getElementType() || !lse.getElementType().isF32())
    return emitOpError() << "result must have qkv's element type, and lse must be f32; got " << out.getElementType()
                         << " (qkv " << tensorType(getQkv()).getElementType() << ") and " << lse.getElementType();
  return success();
}

// The cache's storage outlives the call only because nothing else in the function touches it:
// the one decode_attention that stores into it and reads it back.
LogicalResult KvCacheOp::verify() {
  auto t = tensorType(getResult());
  if (t.getRank() != 5 || t.getDimSize(0) != 2 || !t.getElementType().isF32())
    return emitOpError() << "result must be f32 [2, B, H, S, hs] (keys, then values), got " << t;
  if (!getResult().hasOneUse() || !isa<DecodeAttentionOp>(*getResult().getUsers().begin()) ||
      getResult().getUses().begin()->getOperandNumber() != 1)
    return emitOpError() << "result must have one use: the cache operand of a kiln.decode_attention";
  // Two caches of one name are one value to CSE, which would then have two uses. The block's
  // first cache checks the names of all (each checking the whole block would make verifying a
  // deep model's @decode quadratic); the error goes to the earlier cache of a pair. (So verifying
  // one op alone, not its block, checks no names unless it is the first cache.)
  Block *block = (*this)->getBlock();
  if (!block) return success();
  for (Operation *prev = (*this)->getPrevNode(); prev; prev = prev->getPrevNode())
    if (isa<KvCacheOp>(prev)) return success();
  llvm::StringMap<KvCacheOp> seen;
  for (auto cache : block->getOps<KvCacheOp>()) {
    // The later caches are not verified yet: one without its name is left to its own verifier.
    StringAttr name = cache.getCacheNameAttr();
    if (!name) continue;
    auto [it, fresh] = seen.try_emplace(name.getValue(), cache);
    if (!fresh) {
      InFlightDiagnostic diag = it->second.emitOpError()
                                << "another kiln.kv_cache in this block is named \"" << cache.getCacheName() << "\"";
      diag.attachNote(cache.getLoc()) << "the other kiln.kv_cache";
      return diag;
    }
  }
  return success();
}

LogicalResult DecodeAttentionOp::verify() {
  auto qkv = tensorType(getQkv()), cache = tensorType(getCache()), out = tensorType(getResult());
  const int64_t h = int64_t(getNumHeads());
  if (qkv.getRank() != 2 || qkv.getDimSize(1) % 3 != 0)
    return emitOpError() << "qkv must be [B * M, 3C], got " << shapeStr(qkv.getShape());
  const int64_t rows = qkv.getDimSize(0), c = qkv.getDimSize(1) / 3;
  if (h <= 0 || c % h != 0) return emitOpError() << "num_heads " << h << " must divide the " << c << " channels";
  if (cache.getRank() != 5 || cache.getDimSize(0) != 2 || cache.getDimSize(2) != h || cache.getDimSize(4) != c / h ||
      !cache.getElementType().isF32())
    return emitOpError() << "cache must be f32 [2, B, H = " << h << ", S, hs = " << c / h << "], got "
                         << shapeStr(cache.getShape());
  const int64_t b = cache.getDimSize(1), s = cache.getDimSize(3);
  if (b <= 0 || rows % b != 0 || rows / b > s)
    return emitOpError() << "qkv's " << rows << " rows must be B * M for the cache's B = " << b
                         << " rows and M new positions, at most its S = " << s;
  if (tensorType(getPosition()).getShape() != ArrayRef<int64_t>{1})
    return emitOpError() << "position must be [1], got " << shapeStr(tensorType(getPosition()).getShape());
  if (out.getShape() != ArrayRef<int64_t>{rows, c} || out.getElementType() != qkv.getElementType())
    return emitOpError() << "result must be " << shapeStr({rows, c}) << " [B * M, C] in qkv's element type, got "
                         << out;
  if (!getCache().getDefiningOp<KvCacheOp>()) return emitOpError() << "cache must be a kiln.kv_cache";
  return success();
}

// The forward's operands and results, as kiln.attention relates them, and a gradient per qkv.
LogicalResult AttentionGradOp::verify() {
  auto qkv = tensorType(getQkv());
  const int64_t h = int64_t(getNumHeads());
  SmallVector<int64_t, 3> btc;
  if (failed(verifyPackedQkv(*this, qkv, h, btc))) return failure();
  const int64_t b = btc[0], t = btc[1];
  for (auto [name, v] : {std::pair<const char *, Value>{"grad", getGrad()}, {"result", getResult()}})
    if (tensorType(v).getShape() != ArrayRef<int64_t>(btc))
      return emitOpError() << name << " must be " << shapeStr(btc) << " [B, T, C], got "
                           << shapeStr(tensorType(v).getShape());
  if (tensorType(getLse()).getShape() != ArrayRef<int64_t>{b, h, t})
    return emitOpError() << "lse must be " << shapeStr({b, h, t}) << " [B, H, T], got "
                         << shapeStr(tensorType(getLse()).getShape());
  if (tensorType(getQkvGrad()).getShape() != qkv.getShape())
    return emitOpError() << "qkv_grad must have qkv's shape " << shapeStr(qkv.getShape()) << ", got "
                         << shapeStr(tensorType(getQkvGrad()).getShape());
  for (Value v : {getGrad(), getResult(), getQkvGrad()})
    if (tensorType(v).getElementType() != qkv.getElementType())
      return emitOpError() << "grad, result and qkv_grad must have qkv's element type " << qkv.getElementType()
                           << ", got " << tensorType(v).getElementType();
  if (!tensorType(getLse()).getElementType().isF32())
    return emitOpError() << "lse must be f32, got " << tensorType(getLse()).getElementType();
  return success();
}

// Shared by cross_entropy and cross_entropy_grad: logits [N, V], targets [N], lse [N], and the
// real class count of a padded class dimension within 1..V.
static LogicalResult verifyCrossEntropy(Operation *op, RankedTensorType logits,
                                        RankedTensorType targets, RankedTensorType lse,
                                        std::optional<uint64_t> numClasses) {
  if (logits.getRank() != 2) return op->emitOpError() << "logits must be 2-D [N, V]";
  int64_t n = logits.getDimSize(0), v = logits.getDimSize(1);
  if (targets.getShape() != ArrayRef<int64_t>{n})
    return op->emitOpError() << "targets must be [" << n << "], got " << shapeStr(targets.getShape());
  if (lse.getShape() != ArrayRef<int64_t>{n})
    return op->emitOpError() << "lse must be [" << n << "], got " << shapeStr(lse.getShape());
  if (numClasses) {
    int64_t k = static_cast<int64_t>(*numClasses);
    if (k <= 0 || k > v)
      return op->emitOpError() << "num_classes " << k << " must be in [1, " << v
                               << "] (at least one class, at most the logits' last dimension)";
  }
  return success();
}

LogicalResult CrossEntropyOp::verify() {
  return verifyCrossEntropy(*this, tensorType(getLogits()), tensorType(getTargets()),
                            tensorType(getLse()), getNumClasses());
}

LogicalResult CrossEntropyGradOp::verify() {
  auto logits = tensorType(getLogits());
  if (failed(verifyCrossEntropy(*this, logits, tensorType(getTargets()), tensorType(getLse()),
                                getNumClasses())))
    return failure();
  if (tensorType(getLogitsGrad()).getShape() != logits.getShape())
    return emitOpError() << "logits_grad must have the logits' shape " << shapeStr(logits.getShape()) << ", got "
                         << shapeStr(tensorType(getLogitsGrad()).getShape());
  return success();
}

LogicalResult GlobalNormOp::verify() {
  if (getInputs().empty()) return emitOpError() << "needs at least one tensor";
  return success();
}

static int64_t numElements(Value v) { return tensorType(v).getNumElements(); }

int64_t FusionOp::getLoopSize() {
  int64_t n = 0;
  for (Operation& op : getFusedOps()) {
    for (Value r : op.getResults()) n = std::max(n, numElements(r));
    if (auto acc = dyn_cast<AccumulateGradOp>(op)) n = std::max(n, numElements(acc.getGradient()));
  }
  return n;
}

// The elementwise, matmul-epilogue and column-sum templates run one loop over n elements and
// store each yielded value and each accumulated gradient at every index of it, so those must
// have exactly n elements (a smaller tensor is only read, through a broadcast). `inLoop` says
// which ops the loop computes (a matmul's bias-gradient sums have a loop of their own).
static LogicalResult verifyStoredPerElement(FusionOp fusion, int64_t n, StringRef loop,
                                            llvm::function_ref<bool(Operation*)> inLoop) {
  for (Operation& op : fusion.getFusedOps())
    if (auto acc = dyn_cast<AccumulateGradOp>(op); acc && inLoop(&op) && numElements(acc.getGradient()) != n)
      return op.emitOpError() << "in a fusion of kind '" << fusion.getKind() << "' accumulates "
                              << numElements(acc.getGradient()) << " elements, but its kernel loops over the " << n
                              << " elements of " << loop;
  auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
  for (auto [i, v] : llvm::enumerate(yield.getValues())) {
    Operation* def = v.getDefiningOp();
    if (def && inLoop(def) && numElements(v) != n)
      return fusion.emitOpError() << "of kind '" << fusion.getKind() << "' yields (as result #" << i << ") "
                                  << numElements(v) << " elements, but its kernel stores them in its loop over the "
                                  << n << " elements of " << loop;
  }
  return success();
}

// The layer_norm template computes its input at each element of a row (the ops before it, such
// as the residual add, evaluated in place; only the input itself is stored), then writes the
// output, the casts of it and the row statistics. Any other op would be left out of the kernel.
static LogicalResult verifyLayerNormRegion(FusionOp fusion) {
  LayerNormOp ln;
  for (Operation& op : fusion.getFusedOps())
    if (auto l = dyn_cast<LayerNormOp>(op)) ln = l;
  llvm::SmallPtrSet<Operation*, 8> before;  // the ops the layer norm's input is computed from
  SmallVector<Value> work{ln.getInput()};
  while (!work.empty()) {
    Operation* def = work.pop_back_val().getDefiningOp();
    if (def && before.insert(def).second) work.append(def->operand_begin(), def->operand_end());
  }
  for (Operation& op : fusion.getFusedOps()) {
    if (&op == ln.getOperation() || (isa<CastOp>(op) && op.getOperand(0) == ln.getResult())) continue;
    if (!before.contains(&op))
      return op.emitOpError() << "in a fusion of kind 'layer_norm': only the ops that compute the kiln.layer_norm's "
                                 "input and the kiln.cast of its output may join it";
    if (!isa<AddOp, MulOp, ScaleOp, GeluOp, GeluGradOp, CastOp, BroadcastOp, EmbeddingOp, IotaOp, ZerosOp>(op))
      return op.emitOpError() << "in a fusion of kind 'layer_norm' computes the kiln.layer_norm's input, which the "
                                 "kernel evaluates element by element: only elementwise ops, broadcasts and gathers may";
  }
  auto yield = cast<YieldOp>(fusion.getBlock().getTerminator());
  for (auto [i, v] : llvm::enumerate(yield.getValues()))
    if (v != ln.getInput() && v.getDefiningOp() && before.contains(v.getDefiningOp()))
      return fusion.emitOpError() << "of kind 'layer_norm' yields (as result #" << i << ") a value the kiln.layer_norm's "
                                     "input is computed from: the kernel stores only the input itself";
  return success();
}

// The layer_norm_grad template writes, per element of a row, the input gradient and the adds and
// casts that follow it (the residual gradient); per column, the weight and bias gradients (stored
// or accumulated) and the column sums of those row values (bias gradients: each sum cast and
// accumulated along a chain of single uses). Any other op would be left out of the kernel.
static LogicalResult verifyLayerNormGradRegion(FusionOp fusion) {
  LayerNormGradOp lg;
  for (Operation& op : fusion.getFusedOps())
    if (auto l = dyn_cast<LayerNormGradOp>(op)) lg = l;
  llvm::DenseSet<Value> rows{lg.getInputGrad()}, columns;
  for (Operation& op : fusion.getFusedOps()) {
    if (&op == lg.getOperation()) continue;
    auto fromRows = llvm::any_of(op.getOperands(), [&](Value v) { return rows.contains(v); });
    auto fromColumns = llvm::any_of(op.getOperands(), [&](Value v) { return columns.contains(v); });
    if (auto acc = dyn_cast<AccumulateGradOp>(op)) {
      Value g = acc.getGradient();
      if (g == lg.getWeightGrad() || g == lg.getBiasGrad() || columns.contains(g)) continue;
      return op.emitOpError() << "in a fusion of kind 'layer_norm_grad' may accumulate only the kiln.layer_norm_grad's "
                                 "weight and bias gradients and the column sums of its input gradient";
    }
    if (isa<ReduceSumOp>(op) && fromRows) {
      // The kernel sums each of the row's C columns (a sum to [T, C] would be left unwritten).
      if (numElements(op.getResult(0)) != numElements(lg.getWeightGrad()))
        return op.emitOpError() << "in a fusion of kind 'layer_norm_grad' must sum the rows into "
                                << numElements(lg.getWeightGrad()) << " columns (the kernel's), not "
                                << numElements(op.getResult(0));
      columns.insert(op.getResult(0));
      continue;
    }
    if (isa<CastOp>(op) && fromColumns) {
      columns.insert(op.getResult(0));
      continue;
    }
    if (isa<AddOp, CastOp>(op) && fromRows && !fromColumns) {
      rows.insert(op.getResult(0));
      continue;
    }
    return op.emitOpError() << "in a fusion of kind 'layer_norm_grad': only adds and casts of the input gradient, "
                               "column sums of those (cast and accumulated), and the accumulation of the weight and "
                               "bias gradients may join it";
  }
  for (Operation& op : fusion.getFusedOps())
    if (op.getNumResults() == 1 && columns.contains(op.getResult(0)) && !op.getResult(0).hasOneUse())
      return op.emitOpError() << "in a fusion of kind 'layer_norm_grad' is a column sum (or its cast) read more "
                                 "than once: the kernel carries each along one chain of uses";
  return success();
}

// A fusion region's interface (block arguments, yield) matches its operands and results, and its
// body holds what its kind's kernel template can generate. The interface is checked by verify(),
// before the body's ops; the body by verifyRegions(), which MLIR runs after the body's ops are
// verified, so their operand and result counts and types can be relied on there (checked
// earlier, a malformed fused op crashed the verifier).
LogicalResult FusionOp::verify() {
  Block& block = getBlock();
  if (block.getNumArguments() != getInputs().size())
    return emitOpError() << "body has " << block.getNumArguments() << " arguments for "
                         << getInputs().size() << " inputs";
  for (auto [arg, in] : llvm::zip(block.getArguments(), getInputs()))
    if (arg.getType() != in.getType())
      return emitOpError() << "body argument #" << arg.getArgNumber() << " is " << arg.getType()
                           << " but its input is " << in.getType();
  auto yield = block.empty() ? YieldOp() : dyn_cast<YieldOp>(block.back());
  if (!yield) return emitOpError() << "body must end with kiln.yield";
  if (yield.getValues().getTypes() != getResults().getTypes()) {
    // (An empty TypeRange prints as nothing: say so.)
    InFlightDiagnostic d = emitOpError() << "kiln.yield gives ";
    if (yield.getValues().empty()) d << "no values";
    else d << yield.getValues().getTypes();
    d << " but the results are ";
    if (getResults().empty()) d << "none";
    else d << getResults().getTypes();
    return d;
  }
  if (getKernel().empty()) return emitOpError() << "needs a kernel name";
  // The name becomes part of a C function's name in the generated source (k<N>_<name>).
  if (!llvm::all_of(getKernel(), [](char c) { return llvm::isAlnum(c) || c == '_'; }))
    return emitOpError() << "kernel name \"" << getKernel()
                         << "\" may hold only letters, digits and '_' (it names a C function)";
  return success();
}

LogicalResult FusionOp::verifyRegions() {
  Block& block = getBlock();

  // How many ops of each anchor kind the body holds.
  int matmuls = 0, norms = 0, normGrads = 0, ces = 0, ceGrads = 0, embGrads = 0, adams = 0, sums = 0, others = 0;
  Operation* unfusable = nullptr;
  for (Operation& op : getFusedOps()) {
    if (isa<FusionOp>(op)) return emitOpError() << "fusion regions do not nest";
    if (isa<MatmulOp>(op)) ++matmuls;
    else if (isa<LayerNormOp>(op)) ++norms;
    else if (isa<LayerNormGradOp>(op)) ++normGrads;
    else if (isa<CrossEntropyGradOp>(op)) ++ceGrads;
    else if (isa<EmbeddingGradOp>(op)) ++embGrads;
    else if (isa<AdamWOp>(op)) ++adams;
    else if (isa<CrossEntropyOp>(op)) ++ces;
    else if (isa<ReduceSumOp>(op)) ++sums;
    else if (!isa<AddOp, MulOp, ScaleOp, GeluOp, GeluGradOp, BroadcastOp, CastOp, EmbeddingOp, IotaOp,
                   AccumulateGradOp, ClipCoefOp, ZerosOp>(op)) {
      ++others;
      if (!unfusable) unfusable = &op;
    }
  }
  if (others)
    return emitOpError() << "holds an op no kernel template fuses: " << unfusable->getName()
                         << (others > 1 ? " (and " + std::to_string(others - 1) + " more)" : std::string());
  // An op none of whose results is used would be a kernel's wasted work (and canonicalization
  // would drop it, leaving a region its kind no longer describes). A layer norm's statistics
  // may go unread where nothing differentiates it.
  for (Operation& op : getFusedOps())
    if (op.getNumResults() && op.use_empty())
      return op.emitOpError() << "computes values neither read in its fusion region nor yielded";
  // What the kernel templates read from memory: a product's operands, an optimizer's gradients.
  auto fromInput = [&](Value v, StringRef what) -> LogicalResult {
    if (isa<BlockArgument>(v) && cast<BlockArgument>(v).getOwner() == &block) return success();
    return emitOpError() << "reads " << what << " from a value computed in the region; it must be an input";
  };
  for (Operation& op : getFusedOps()) {
    if (auto mm = dyn_cast<MatmulOp>(op))
      for (Value operand : {mm.getLhs(), mm.getRhs()})
        if (failed(fromInput(operand, "a kiln.matmul operand"))) return failure();
    if (auto adam = dyn_cast<AdamWOp>(op))
      if (failed(fromInput(adam.getGrad(), "a kiln.adamw gradient"))) return failure();
  }
  StringRef kind = getKind();
  auto exactlyOne = [&](int n, StringRef what) -> LogicalResult {
    if (n != 1) return emitOpError() << "of kind '" << kind << "' needs exactly one " << what << ", has " << n;
    return success();
  };
  if (kind == "elementwise") {
    if (matmuls + norms + normGrads + ces + ceGrads + embGrads + adams + sums)
      return emitOpError() << "of kind 'elementwise' holds a non-elementwise op";
    return verifyStoredPerElement(*this, getLoopSize(), "its largest value", [](Operation*) { return true; });
  }
  // The other anchors (a layer norm, the loss, an optimizer update...) have templates of their own.
  auto onlyAnchor = [&](StringRef what, int allowed) -> LogicalResult {
    if (norms + normGrads + ces + ceGrads + embGrads + adams + matmuls + sums > allowed)
      return emitOpError() << "of kind '" << kind << "' holds an op its kernel template leaves out: only " << what
                           << " and the elementwise ops on it may join it";
    return success();
  };
  if (kind == "matmul") {
    if (failed(exactlyOne(matmuls, "kiln.matmul"))) return failure();
    if (sums > 1)
      return emitOpError() << "of kind 'matmul' holds " << sums << " kiln.reduce_sum (a bias gradient's column sums; one at most)";
    if (failed(onlyAnchor("its kiln.matmul (with a bias gradient's kiln.reduce_sum)", 1 + sums))) return failure();
    // The bias gradient (column sums, and the casts and accumulation of them) has a loop of its own.
    llvm::SmallPtrSet<Operation*, 4> columns;
    MatmulOp mm;
    for (Operation& op : getFusedOps()) {
      if (auto m = dyn_cast<MatmulOp>(op)) mm = m;
      if (isa<ReduceSumOp>(op) ||
          (isa<CastOp, AccumulateGradOp>(op) && llvm::any_of(op.getOperands(), [&](Value v) {
             return v.getDefiningOp() && columns.contains(v.getDefiningOp());
           })))
        columns.insert(&op);
    }
    return verifyStoredPerElement(*this, numElements(mm.getResult()), "the kiln.matmul's result",
                                  [&](Operation* op) { return !columns.contains(op); });
  }
  if (kind == "layer_norm") {
    if (failed(exactlyOne(norms, "kiln.layer_norm"))) return failure();
    return verifyLayerNormRegion(*this);
  }
  if (kind == "layer_norm_grad") {
    if (failed(exactlyOne(normGrads, "kiln.layer_norm_grad"))) return failure();
    return verifyLayerNormGradRegion(*this);
  }
  if (kind == "classifier") {
    if (ceGrads > 1) return emitOpError() << "of kind 'classifier' holds " << ceGrads << " kiln.cross_entropy_grad";
    if (failed(exactlyOne(ces, "kiln.cross_entropy"))) return failure();
    // The kernel computes the loss (and the logits' gradient) from the logits and targets in one
    // pass per row, and writes them to the region's results: another op would be left out of it.
    CrossEntropyOp ce;
    for (Operation& op : getFusedOps()) {
      if (auto c = dyn_cast<CrossEntropyOp>(op)) ce = c;
      else if (!isa<CrossEntropyGradOp>(op))
        return op.emitOpError() << "in a fusion of kind 'classifier': only a kiln.cross_entropy and the "
                                   "kiln.cross_entropy_grad of its lse may join it";
    }
    for (Operation& op : getFusedOps()) {
      auto g = dyn_cast<CrossEntropyGradOp>(op);
      if (!g) continue;
      if (g.getLse() != ce.getLse() || g.getLogits() != ce.getLogits() || g.getTargets() != ce.getTargets() ||
          g.getNumClassesAttr() != ce.getNumClassesAttr())
        return g.emitOpError() << "in a fusion of kind 'classifier' must read the kiln.cross_entropy's logits, "
                                  "targets and lse, with its num_classes (the kernel computes both from one pass)";
      if (failed(fromInput(g.getGrad(), "a kiln.cross_entropy_grad's incoming gradient"))) return failure();
    }
    return success();
  }
  if (kind == "reduce_sum") {  // the column sums first, then what consumes them
    if (failed(exactlyOne(sums, "kiln.reduce_sum"))) return failure();
    if (failed(onlyAnchor("its kiln.reduce_sum", 1))) return failure();
    auto sum = dyn_cast<ReduceSumOp>(*getFusedOps().begin());
    if (!sum) return emitOpError() << "of kind 'reduce_sum' must begin with its kiln.reduce_sum";
    return verifyStoredPerElement(*this, numElements(sum.getResult()), "the column sums",
                                  [](Operation*) { return true; });
  }
  if (kind == "embedding_grad") {
    // The kernel scatters the rows straight into the gradient accumulator, or into the zeroed
    // result: the region holds the embedding_grad and at most the accumulate_grad of its rows.
    if (failed(exactlyOne(embGrads, "kiln.embedding_grad"))) return failure();
    for (Operation& op : getFusedOps()) {
      if (isa<EmbeddingGradOp>(op)) continue;
      auto acc = dyn_cast<AccumulateGradOp>(op);
      if (!acc || !isa_and_nonnull<EmbeddingGradOp>(acc.getGradient().getDefiningOp()) ||
          !acc.getGradient().hasOneUse())
        return op.emitOpError() << "in a fusion of kind 'embedding_grad': only the kiln.accumulate_grad of the "
                                   "kiln.embedding_grad's result, its one use, may join it";
    }
    // Not accumulated, the rows are added into the region's yielded result, cleared first: in fp32.
    if (llvm::none_of(getFusedOps(), [](Operation& op) { return isa<AccumulateGradOp>(op); })) {
      Operation* eg = &*llvm::find_if(getFusedOps(), [](Operation& op) { return isa<EmbeddingGradOp>(op); });
      Value g = eg->getResult(0);
      if (llvm::count(getBlock().getTerminator()->getOperands(), g) > 1)
        return eg->emitOpError() << "in a fusion of kind 'embedding_grad': its result is yielded more than once (the "
                                    "kernel adds the rows into one result)";
      if (!tensorType(g).getElementType().isF32())
        return eg->emitOpError() << "in a fusion of kind 'embedding_grad': a yielded result must be f32 (its rows are "
                                    "added into it), got "
                                 << g.getType();
    }
    return success();
  }
  if (kind == "optimizer") {
    if (adams == 0) return emitOpError() << "of kind 'optimizer' needs at least one kiln.adamw";
    // The kernel computes the clipping coefficient once, then updates each tensor.
    int clips = 0;
    for (Operation& op : getFusedOps()) {
      clips += isa<ClipCoefOp>(op);
      if (!isa<AdamWOp, ClipCoefOp>(op) || clips > 1)
        return op.emitOpError() << "in a fusion of kind 'optimizer': only kiln.adamw updates and one kiln.clip_coef "
                                   "may join it";
    }
    // One kernel updates every tensor with one set of hyperparameters (scale, lr, betas, eps,
    // weight decay, step); only the parameter and its gradient differ.
    AdamWOp first;
    for (Operation& op : getFusedOps()) {
      auto adam = dyn_cast<AdamWOp>(op);
      if (!adam) continue;
      if (!first) {
        first = adam;
        continue;
      }
      const std::pair<const char*, bool> same[] = {
          {"scale", adam.getScale() == first.getScale()}, {"lr", adam.getLr() == first.getLr()},
          {"beta1", adam.getBeta1() == first.getBeta1()}, {"beta2", adam.getBeta2() == first.getBeta2()},
          {"eps", adam.getEps() == first.getEps()},       {"weight_decay", adam.getWeightDecay() == first.getWeightDecay()},
          {"step", adam.getStep() == first.getStep()}};
      for (const auto& [name, equal] : same)
        if (!equal)
          return adam.emitOpError() << "in a fusion of kind 'optimizer' must take the same hyperparameters as @"
                                    << first.getName() << "'s kiln.adamw (its " << name << " differs)";
    }
    return success();
  }
  return emitOpError() << "unknown kind '" << kind
                       << "' (elementwise, matmul, layer_norm, layer_norm_grad, classifier, "
                          "embedding_grad, optimizer, reduce_sum)";
}

#define GET_OP_CLASSES
#include "Kiln/KilnOps.cpp.inc"
