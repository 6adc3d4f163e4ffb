// The spec a module carries (kiln.spec) and the checks of IR input against it (see module_spec.h).
#include "compiler/module_spec.h"

#include "Kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/Passes.h"
#include "llvm/ADT/StringExtras.h"

#include <map>
#include <set>

using namespace mlir;

namespace kiln {

void setModuleSpec(ModuleOp module, const ModelSpec& s) {
  Builder b(module.getContext());
  auto i = [&](int v) { return b.getI64IntegerAttr(v); };
  module->setAttr("kiln.spec",
                  b.getDictionaryAttr({
                      b.getNamedAttr("path", b.getStringAttr(s.path)),
                      b.getNamedAttr("name", b.getStringAttr(s.name)),
                      b.getNamedAttr("n_layer", i(s.n_layer)),
                      b.getNamedAttr("n_head", i(s.n_head)),
                      b.getNamedAttr("n_embd", i(s.n_embd)),
                      b.getNamedAttr("vocab_size", i(s.vocab_size)),
                      b.getNamedAttr("block_size", i(s.block_size)),
                      b.getNamedAttr("batch_size", i(s.batch_size)),
                      b.getNamedAttr("seq_len", i(s.seq_len)),
                      b.getNamedAttr("precision", b.getStringAttr(s.precision)),
                      b.getNamedAttr("target", b.getStringAttr(s.target)),
                  }));
}

namespace {

// The layer of a GPT-2 parameter name ("h.3.attn.c_attn.weight" -> 3); -1 for any other name.
int64_t layerOf(StringRef name) {
  if (!name.consume_front("h.")) return -1;
  size_t digits = name.find_first_not_of("0123456789");
  if (digits == 0 || digits == StringRef::npos || name[digits] != '.') return -1;
  int64_t layer = -1;
  return name.take_front(digits).getAsInteger(10, layer) ? -1 : layer;
}

// Where the values of `v` come from: through reshapes, and from a fusion region's argument to
// the operand the region was given.
Value sourceOf(Value v) {
  while (true) {
    if (auto a = dyn_cast<BlockArgument>(v)) {
      auto f = dyn_cast<FusionOp>(a.getOwner()->getParentOp());
      if (!f || a.getArgNumber() >= f->getNumOperands()) return v;
      v = f->getOperand(a.getArgNumber());
    } else if (auto r = v.getDefiningOp<ReshapeOp>()) {
      v = r.getInput();
    } else {
      return v;
    }
  }
}

// The input a value of token ids is ("idx", "targets"), or "" when it is none.
StringRef inputNameOf(Value v) {
  auto in = sourceOf(v).getDefiningOp<InputOp>();
  return in ? in.getInputName() : StringRef();
}

// An input of @prefill or @prefill_short: "prefill_tokens", "prefill_short_positions", ...
bool isPrefillInput(StringRef name, StringRef suffix) {
  return (name.consume_front("prefill_short") || name.consume_front("prefill")) && name == suffix;
}

// The module's IR agrees with its spec where the runtime relies on both: it fills the inputs with
// batch_size x seq_len token ids below vocab_size, and reports and checkpoints use the sizes
// (n_layer: the MFU estimate and llm.c .bin files).
LogicalResult checkSpecAgainstIR(ModuleOp module, const ModelSpec& s) {
  const int64_t B = s.batch_size, T = s.seq_len, V = s.vocab_size, C = s.n_embd, H = s.n_head;
  auto ids = RankedTensorType::get({B, T}, IntegerType::get(module.getContext(), 32));
  std::set<int64_t> layers;  // of the parameters named h.N.*
  Operation* firstBf16 = nullptr;  // the first op with a bf16 result
  WalkResult walk = module.walk([&](Operation* op) -> WalkResult {
    if (!firstBf16 && computesInBf16(op)) firstBf16 = op;
    // The runtime keeps every parameter's master value, gradient and moments in fp32 (a bf16
    // read of it is its compute copy).
    if (auto p = dyn_cast<ParameterOp>(op); p && !p.getTensorType().getElementType().isF32())
      return p.emitError() << "kiln.parameter @" << p.getSymName() << " is " << p.getType()
                           << " but the runtime keeps parameters in fp32 (declare it f32 and read its bf16 "
                              "compute copy with kiln.param)";
    if (auto in = dyn_cast<InputOp>(op)) {
      if ((in.getInputName() == "idx" || in.getInputName() == "targets") && in.getType() != ids)
        return in.emitError() << "kiln.input \"" << in.getInputName() << "\" is " << in.getType()
                              << " but 'kiln.spec' has batch_size = " << B << ", seq_len = " << T
                              << " (expected " << ids << ")";
      // @decode's: one token per row, and the position they are at.
      auto i32 = IntegerType::get(module.getContext(), 32);
      if (in.getInputName() == "token" && in.getType() != RankedTensorType::get({B}, i32))
        return in.emitError() << "kiln.input \"token\" is " << in.getType() << " but 'kiln.spec' has batch_size = "
                              << B << " (expected " << RankedTensorType::get({B}, i32) << ")";
      // ("position" is [1] by its verifier: that needs no spec.)
      // @prefill's and @prefill_short's: M tokens per row and their M positions, M <= seq_len.
      auto chunk = dyn_cast<RankedTensorType>(in.getType());
      if (isPrefillInput(in.getInputName(), "_tokens") &&
          (!chunk || chunk.getRank() != 2 || chunk.getDimSize(0) != B || chunk.getDimSize(1) > T || !chunk.getElementType().isInteger(32)))
        return in.emitError() << "kiln.input \"" << in.getInputName() << "\" is " << in.getType()
                              << " but 'kiln.spec' has batch_size = " << B << ", seq_len = " << T
                              << " (expected [batch_size, M] of i32 with M <= seq_len)";
      if (isPrefillInput(in.getInputName(), "_positions") &&
          (!chunk || chunk.getRank() != 1 || chunk.getDimSize(0) > T || !chunk.getElementType().isInteger(32)))
        return in.emitError() << "kiln.input \"" << in.getInputName() << "\" is " << in.getType()
                              << " but 'kiln.spec' has seq_len = " << T << " (expected [M] of i32 with M <= seq_len)";
    } else if (auto kv = dyn_cast<KvCacheOp>(op)) {
      // The sampler decodes positions below seq_len (the context of @logits).
      ArrayRef<int64_t> shape = kv.getType().getShape();
      if (shape != ArrayRef<int64_t>{2, B, H, T, C / H})
        return kv.emitError() << "kiln.kv_cache " << kv.getType() << " must be [2, batch_size = " << B
                              << ", n_head = " << H << ", seq_len = " << T << ", n_embd / n_head = " << C / H
                              << "] by 'kiln.spec'";
    } else if (auto p = dyn_cast<ParameterOp>(op)) {
      ArrayRef<int64_t> shape = p.getTensorType().getShape();
      if (int64_t layer = layerOf(p.getSymName()); layer >= 0) {
        if (layer >= s.n_layer)
          return p.emitError() << "@" << p.getSymName() << " belongs to layer " << layer
                               << " but 'kiln.spec' has n_layer = " << s.n_layer;
        layers.insert(layer);
      }
      if (p.getSymName() == "wte.weight" && (shape.size() != 2 || shape[0] < V || shape[1] != C))
        return p.emitError() << "@wte.weight " << p.getType() << " must be [rows >= vocab_size = "
                             << V << ", n_embd = " << C << "] by 'kiln.spec'";
      if (p.getSymName() == "wpe.weight" && shape != ArrayRef<int64_t>{s.block_size, C})
        return p.emitError() << "@wpe.weight " << p.getType() << " must be [block_size = "
                             << s.block_size << ", n_embd = " << C << "] by 'kiln.spec'";
    } else if (auto e = dyn_cast<EmbeddingOp>(op)) {
      // Rows are read at the ids without a bounds check: the data's tokens are below vocab_size
      // and positions below their iota's length.
      const int64_t rows = e.getTable().getType().getDimSize(0);
      auto iota = sourceOf(e.getIndices()).getDefiningOp<IotaOp>();
      const StringRef input = inputNameOf(e.getIndices());
      const bool positions = input == "position" || isPrefillInput(input, "_positions");
      const int64_t need = input == "idx" || input == "token" || isPrefillInput(input, "_tokens") ? V
                           : positions                                                             ? T
                           : iota ? iota.getType().getNumElements()
                                  : 0;
      if (rows < need)
        return e.emitError() << "kiln.embedding reads a table of " << rows << " rows at ids up to " << need - 1
                             << (iota        ? " (its iota)"
                                 : positions ? " (positions below 'kiln.spec' seq_len)"
                                             : " (token ids below 'kiln.spec' vocab_size)");
    } else if (isa<CrossEntropyOp, CrossEntropyGradOp>(op)) {
      Value logits = op->getOperand(isa<CrossEntropyOp>(op) ? 0 : 1);
      Value targets = op->getOperand(isa<CrossEntropyOp>(op) ? 1 : 3);
      auto numClasses = op->getAttrOfType<IntegerAttr>("num_classes");
      const int64_t classes = numClasses ? numClasses.getInt() : cast<RankedTensorType>(logits.getType()).getShape().back();
      if (inputNameOf(targets) == "targets" && classes < V)
        return op->emitError() << op->getName() << " has " << classes
                               << " classes, fewer than 'kiln.spec' vocab_size = " << V
                               << " (the targets are token ids below it)";
    } else if (auto d = dyn_cast<DecodeAttentionOp>(op); d && inputNameOf(d.getPosition()) != "position") {
      // The sampler sets only that input, and keeps it below seq_len.
      return d.emitError() << "kiln.decode_attention must read its position from kiln.input \"position\"";
    }
    if (isa<AttentionOp, AttentionGradOp, DecodeAttentionOp>(op)) {
      const int64_t h = op->getAttrOfType<IntegerAttr>("num_heads").getInt();
      if (h != H)
        return op->emitError() << op->getName() << " has num_heads = " << h
                               << " but 'kiln.spec' has n_head = " << H;
    }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted()) return failure();
  // The precision is the module's record of how it computes (the runtime's MFU peak, a
  // checkpoint's description, which attention kernels kilnc may tune): it must say what the IR
  // does once kiln-mixed-precision has run, before @micro_step exists.
  if (firstBf16 && s.precision != "bf16")
    return firstBf16->emitError() << firstBf16->getName() << " computes in bf16 but 'kiln.spec' has precision = \"" << s.precision << "\"";
  if (!firstBf16 && s.precision == "bf16" && module.lookupSymbol("micro_step"))
    return module.emitError() << "'kiln.spec' has precision = \"bf16\" but the training step computes nothing in bf16 "
                                 "(the step was built in fp32)";
  // Layers are numbered from 0, so with none past n_layer - 1 a missing one shows in the count.
  if (!layers.empty() && int64_t(layers.size()) != s.n_layer)
    return module.emitError() << "the IR has parameters of " << layers.size()
                              << (layers.size() == 1 ? " layer" : " layers") << " (h.N.*) but 'kiln.spec' has n_layer = " << s.n_layer;
  return success();
}

}  // namespace

FailureOr<ModelSpec> getModuleSpec(ModuleOp module) {
  auto dict = module->getAttrOfType<DictionaryAttr>("kiln.spec");
  if (!dict) return module.emitError("the module has no 'kiln.spec' attribute (was it built by kilnc?)");
  // The checks of a TOML spec (compiler/spec.cpp): an edited file must not carry sizes the
  // runtime trusts (it sizes and fills buffers from them).
  auto bad = [&]() { return module.emitError() << "'kiln.spec' "; };
  ModelSpec s;
  std::pair<const char*, std::string*> strings[] = {
      {"path", &s.path}, {"name", &s.name}, {"precision", &s.precision}, {"target", &s.target}};
  std::pair<const char*, int*> integers[] = {
      {"n_layer", &s.n_layer},       {"n_head", &s.n_head},         {"n_embd", &s.n_embd},
      {"vocab_size", &s.vocab_size}, {"block_size", &s.block_size}, {"batch_size", &s.batch_size},
      {"seq_len", &s.seq_len}};
  for (NamedAttribute a : dict) {
    auto known = [&](auto& table) {
      return llvm::any_of(table, [&](auto& k) { return a.getName().getValue() == k.first; });
    };
    if (!known(strings) && !known(integers))
      return bad() << "has the unknown key '" << a.getName().str() << "'";
  }
  for (auto [key, out] : strings) {
    Attribute a = dict.get(key);
    if (!a) continue;  // path and name are for messages; precision and target have defaults
    auto str = dyn_cast<StringAttr>(a);
    if (!str) return bad() << key << " must be a string";
    *out = str.str();
  }
  for (auto [key, out] : integers) {
    auto a = dyn_cast_or_null<IntegerAttr>(dict.get(key));
    if (!a || a.getType().isInteger(1)) return bad() << "needs the integer key '" << key << "'";
    // Any integer type: the value counts, read as its type's signedness, and must fit its range.
    const APInt& v = a.getValue();
    const bool isUnsigned = a.getType().isUnsignedInteger();
    const auto [lo, hi, why] = spec_range(key);
    const bool fits = isUnsigned ? v.getActiveBits() < 64 : v.getSignificantBits() <= 64;
    const int64_t n = !fits ? 0 : isUnsigned ? int64_t(v.getZExtValue()) : v.getSExtValue();
    if (!fits || n < lo || n > hi)
      return bad() << key << " = " << llvm::toString(v, 10, !isUnsigned) << " is out of range ["
                   << int64_t(lo) << ", " << int64_t(hi) << "]" << why;
    *out = int(n);
  }
  for (const char* key : {"precision", "target"}) {
    const std::string& v = key == std::string("precision") ? s.precision : s.target;
    const std::set<std::string>& allowed = spec_choices(key);
    if (!allowed.count(v)) {
      std::string list;
      for (const std::string& c : allowed) list += (list.empty() ? "\"" : ", \"") + c + "\"";
      return bad() << key << " = \"" << v << "\" is not one of " << list;
    }
  }
  if (dict.get("name") && !is_spec_name(s.name))
    return bad() << "name = \"" << s.name << "\" must be non-empty, without control characters, quotes or backslashes";
  if (auto relation = spec_relation_error(s, [](const std::string& k) { return k; }))
    return bad() << relation->second;
  if (failed(checkSpecAgainstIR(module, s))) return failure();
  return s;
}

LogicalResult verifyEntryPoints(ModuleOp module) {
  auto scalar = RankedTensorType::get({}, Float32Type::get(module.getContext()));
  // Every buffer is sized from its type: static shapes with no zero dimension (the writer and
  // the kernel templates divide by element counts and row lengths).
  WalkResult shapes = module.walk([&](Operation* op) -> WalkResult {
    auto check = [&](Type t) {
      auto r = dyn_cast<RankedTensorType>(t);
      return !isa<TensorType>(t) || (r && r.hasStaticShape() && llvm::all_of(r.getShape(), [](int64_t d) { return d > 0; }));
    };
    // (kiln ops' types and kiln.parameter's verifier hold to this already: this is for the
    // results of other dialects' ops.)
    for (Type t : op->getResultTypes())
      if (!check(t)) return op->emitError() << "result type " << t << " must have a static shape with no zero dimension";
    return WalkResult::advance();
  });
  if (shapes.wasInterrupted()) return failure();
  std::set<std::string> optimized;  // the parameters @optimizer_step updates
  for (StringRef name : kProgramNames) {
    auto f = module.lookupSymbol<func::FuncOp>(name);
    if (!f) continue;
    if (f.isExternal() || f.getNumArguments() != 0)
      return f.emitError() << "@" << name
                           << " must have a body and take no arguments (inputs are kiln.input ops)";
    if (!f.getBody().hasOneBlock())
      return f.emitError() << "@" << name << " must have one block (straight-line code)";
    const bool logits = name == "logits" || name == "decode", prefill = name.starts_with("prefill");
    ArrayRef<Type> results = f.getResultTypes();
    if (results.size() != 1 || (logits || prefill ? !isa<RankedTensorType>(results[0]) : results[0] != scalar))
      return f.emitError() << "@" << name << " must return one "
                           << (logits                      ? "tensor, the logits"
                               : prefill                  ? "tensor (its last attention's output, which keeps every layer live)"
                               : name == "optimizer_step" ? "tensor<f32>, the gradient norm"
                                                           : "tensor<f32>, the loss");
    // One AdamW update per parameter: a second would step it twice with the same moments.
    std::set<std::string> updated;
    WalkResult twice = f.walk([&](AdamWOp a) -> WalkResult {
      if (updated.insert(a.getName().str()).second) return WalkResult::advance();
      a.emitError() << "@" << a.getName() << " is updated a second time in @" << name
                    << " (one kiln.adamw per parameter)";
      return WalkResult::interrupt();
    });
    if (twice.wasInterrupted()) return failure();
    if (name == "optimizer_step") optimized = std::move(updated);
    // Which program writes which state: the gradients (and their exchange) @micro_step, the
    // parameters and moments @optimizer_step. Evaluation and sampling run the others between
    // training steps, and must leave the training state as they found it.
    WalkResult misplaced = f.walk([&](Operation* op) -> WalkResult {
      const char* home = isa<AccumulateGradOp, ReduceGradientsOp>(op) ? "micro_step"
                         : isa<AdamWOp, WaitGradientsOp>(op)          ? "optimizer_step"
                                                                      : nullptr;
      if (!home || name == home) return WalkResult::advance();
      return op->emitError() << "'" << op->getName() << "' in @" << name << ": only @" << home
                              << " may write the " << (home == StringRef("micro_step") ? "gradients" : "parameters and their AdamW moments")
                              << " (the other programs run between training steps and leave the training state as it was)";
    });
    if (misplaced.wasInterrupted()) return failure();
  }
  // The programs the runtime runs together: a training step is both, the sampler's prefill fills
  // the caches @decode reads.
  auto has = [&](StringRef name) { return bool(module.lookupSymbol<func::FuncOp>(name)); };
  for (auto [one, other] : {std::pair<StringRef, StringRef>{"micro_step", "optimizer_step"}, {"optimizer_step", "micro_step"},
                            {"prefill", "decode"}, {"prefill_short", "decode"}})
    if (has(one) && !has(other))
      return module.lookupSymbol<func::FuncOp>(one).emitError() << "@" << one << " needs @" << other << " beside it ("
                                                                << (other == "decode" ? "@decode reads the caches it fills)"
                                                                    : other == "optimizer_step"
                                                                        ? "a training step runs both; kiln-opt -kiln-build-optimizer-step adds it)"
                                                                        : "a training step runs both; kiln-opt -kiln-autodiff derives it from @forward)");
  // The gradient buckets (kiln-bucket-gradients): numbered 0, 1, ... in the order they start, each
  // parameter in one, and each started after the last accumulation of its gradients (the runtime
  // sends a bucket as soon as it is reached on the last micro-step).
  if (auto f = module.lookupSymbol<func::FuncOp>("micro_step")) {
    int64_t next = 0;
    std::map<std::string, int64_t> bucketOf;
    WalkResult buckets = f.walk([&](Operation* op) -> WalkResult {  // (post-order: a fusion's body before it)
      if (auto r = dyn_cast<ReduceGradientsOp>(op)) {
        if (int64_t(r.getBucket()) != next)
          return r.emitError() << "kiln.reduce_gradients has bucket = " << int64_t(r.getBucket()) << " but is bucket "
                               << next << " in program order (buckets are numbered 0, 1, ... as they start)";
        for (Attribute a : r.getParams()) {
          const std::string param = cast<SymbolRefAttr>(a).getRootReference().str();
          if (auto [it, fresh] = bucketOf.emplace(param, next); !fresh)
            return r.emitError() << "@" << param << " is in bucket " << it->second << " already (one bucket per parameter)";
        }
        ++next;
      } else if (auto acc = dyn_cast<AccumulateGradOp>(op)) {
        if (auto it = bucketOf.find(acc.getName().str()); it != bucketOf.end())
          return acc.emitError() << "kiln.accumulate_grad accumulates @" << acc.getName() << "'s gradient after kiln.reduce_gradients (bucket "
                                 << it->second << ") started averaging it";
      }
      return WalkResult::advance();
    });
    if (buckets.wasInterrupted()) return failure();
    // A gradient no update reads would be computed every step for nothing: its parameter never
    // trains (a deleted kiln.adamw).
    std::set<std::string> accumulated;
    WalkResult frozen = f.walk([&](AccumulateGradOp acc) -> WalkResult {
      accumulated.insert(acc.getName().str());
      if (optimized.count(acc.getName().str())) return WalkResult::advance();
      return acc.emitError() << "kiln.accumulate_grad accumulates @" << acc.getName()
                             << "'s gradient, but @optimizer_step has no kiln.adamw that updates it";
    });
    if (frozen.wasInterrupted()) return failure();
    // And the converse: an update with no gradient steps on zeros (weight decay alone), so its
    // parameter never learns from the data (a deleted kiln.accumulate_grad).
    if (auto opt = module.lookupSymbol<func::FuncOp>("optimizer_step")) {
      WalkResult gradless = opt.walk([&](AdamWOp a) -> WalkResult {
        if (accumulated.count(a.getName().str())) return WalkResult::advance();
        return a.emitError() << "kiln.adamw updates @" << a.getName()
                             << ", but @micro_step accumulates no gradient for it (no kiln.accumulate_grad: it would never learn)";
      });
      if (gradless.wasInterrupted()) return failure();
    }
  }
  return verifyMicroStepInputs(module);
}

LogicalResult verifyMicroStepInputs(ModuleOp module) {
  auto f = module.lookupSymbol<func::FuncOp>("micro_step");
  if (!f) return success();
  std::set<std::string> read;
  f.walk([&](InputOp in) { read.insert(in.getInputName().str()); });
  for (const char* input : {"idx", "targets"})
    if (!read.count(input))
      return f.emitError() << "@micro_step reads no kiln.input \"" << input
                           << "\" (the loss does not depend on it): the trainer feeds \"idx\" and \"targets\" to "
                              "every micro-step";
  return success();
}

}  // namespace kiln
