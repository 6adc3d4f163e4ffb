// The GPT-2 model builder. The forward pass is written on 2-D activations [N = B*T, C] so
// every linear layer is one matrix product; attention alone sees [B, T, 3C].
//
// The vocabulary is padded: wte is [Vp, C] with Vp = V rounded up to a multiple of 128 (GPT-2:
// 50257 -> 50304), so the output head's matrix products have a friendly size. The padded rows
// start at zero (the runtime initialises them so), no token indexes them and the cross-entropy
// ignores their logits (num_classes = V), so they never get a gradient and results are those of
// the unpadded model. Files keep the real [V, C] (runtime/params.cpp).
#include "models/gpt2_builder.h"

#include <cmath>

#include "Kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "compiler/pipeline.h"
#include "mlir/IR/Builders.h"

using namespace mlir;

namespace kiln {
namespace {

class GPT2Builder {
 public:
  GPT2Builder(MLIRContext& ctx, const ModelSpec& spec)
      : spec_(spec), b_(&ctx), f32_(b_.getF32Type()), i32_(b_.getI32Type()),
        fileLoc_(FileLineColLoc::get(&ctx, spec.path, spec.model_line, 1)) {}

  OwningOpRef<ModuleOp> build() {
    const int64_t B = spec_.batch_size, T = spec_.seq_len, C = spec_.n_embd, N = B * T;
    const int64_t V = spec_.vocab_size, Vp = paddedVocab(), L = spec_.n_layer;
    module_ = ModuleOp::create(fileLoc_, spec_.name);
    setModuleSpec(*module_, spec_);
    b_.setInsertionPointToEnd(module_->getBody());

    // Parameters, in Hugging Face order; residual projections get std 0.02 / sqrt(2L).
    const float std = 0.02f, projStd = 0.02f / std::sqrt(2.0f * float(L));
    declare("wte.weight", {Vp, C}, "normal", std, true);
    declare("wpe.weight", {spec_.block_size, C}, "normal", std, true);
    for (int64_t i = 0; i < L; ++i) {
      std::string h = "h." + std::to_string(i) + ".";
      declare(h + "ln_1.weight", {C}, "ones", 0, false);
      declare(h + "ln_1.bias", {C}, "zeros", 0, false);
      declare(h + "attn.c_attn.weight", {C, 3 * C}, "normal", std, true);
      declare(h + "attn.c_attn.bias", {3 * C}, "zeros", 0, false);
      declare(h + "attn.c_proj.weight", {C, C}, "normal", projStd, true);
      declare(h + "attn.c_proj.bias", {C}, "zeros", 0, false);
      declare(h + "ln_2.weight", {C}, "ones", 0, false);
      declare(h + "ln_2.bias", {C}, "zeros", 0, false);
      declare(h + "mlp.c_fc.weight", {C, 4 * C}, "normal", std, true);
      declare(h + "mlp.c_fc.bias", {4 * C}, "zeros", 0, false);
      declare(h + "mlp.c_proj.weight", {4 * C, C}, "normal", projStd, true);
      declare(h + "mlp.c_proj.bias", {C}, "zeros", 0, false);
    }
    declare("ln_f.weight", {C}, "ones", 0, false);
    declare("ln_f.bias", {C}, "zeros", 0, false);

    // @forward: the mean loss (what autodiff differentiates); @logits: the forward pass alone,
    // for sampling, with no backward buffers; @prefill: a prompt into the key/value caches, M
    // positions at a time; @decode: one position at a time, for sampling.
    auto scalar = tensor({});
    auto forward = b_.create<func::FuncOp>(fileLoc_, "forward", b_.getFunctionType({}, {scalar}));
    b_.setInsertionPointToStart(forward.addEntryBlock());
    Value logits = buildLogits();
    Value targets = b_.create<InputOp>(loc_, itensor({B, T}), "targets");
    auto ce = b_.create<CrossEntropyOp>(loc_, scalar, tensor({N}), logits, reshape(targets, {N}),
                                        b_.getI64IntegerAttr(V));
    b_.create<func::ReturnOp>(loc_, ce.getLoss());

    b_.setInsertionPointToEnd(module_->getBody());
    // The sampler reads only the first V columns of each [Vp] row.
    auto head = b_.create<func::FuncOp>(fileLoc_, "logits", b_.getFunctionType({}, {tensor({N, Vp})}));
    b_.setInsertionPointToStart(head.addEntryBlock());
    b_.create<func::ReturnOp>(loc_, buildLogits());

    // @prefill: M prompt positions per row into each layer's cache (the sampler reads a prompt
    // with it, then decodes; see buildPrefill). @prefill_short, the same for fewer positions a
    // call: a short prompt (the usual one) need not pay for M.
    for (auto [name, M] : {std::pair<StringRef, int64_t>{"prefill", prefillPositions()},
                           std::pair<StringRef, int64_t>{"prefill_short", shortPrefillPositions()}}) {
      if (M == 0) continue;
      b_.setInsertionPointToEnd(module_->getBody());
      auto prefill = b_.create<func::FuncOp>(fileLoc_, name, b_.getFunctionType({}, {tensor({B * M, C})}));
      b_.setInsertionPointToStart(prefill.addEntryBlock());
      b_.create<func::ReturnOp>(loc_, buildPrefill(name, M));
    }

    // @decode: the logits of one new position per row, attending to the keys and values the
    // earlier calls left in each layer's cache (the sampler's fast path; see buildDecode).
    b_.setInsertionPointToEnd(module_->getBody());
    auto decode = b_.create<func::FuncOp>(fileLoc_, "decode", b_.getFunctionType({}, {tensor({B, Vp})}));
    b_.setInsertionPointToStart(decode.addEntryBlock());
    b_.create<func::ReturnOp>(loc_, buildDecode());
    return std::move(module_);
  }

  // The forward pass of the token at `position` of each of the B rows, [B, Vp]: the same layers
  // as buildLogits on [B, C] activations, with kiln.decode_attention reading (and extending) a
  // kiln.kv_cache per layer of seq_len positions instead of attending over the whole sequence.
  Value buildDecode() {
    const int64_t B = spec_.batch_size, T = spec_.seq_len, C = spec_.n_embd, H = spec_.n_head;
    const int64_t Vp = paddedVocab();
    // x = wte[token] + wpe[position]
    loc_ = at("embed");
    Value token = b_.create<InputOp>(loc_, itensor({B}), "token");
    Value position = b_.create<InputOp>(loc_, itensor({1}), "position");
    Value wte = param("wte.weight");
    // As buildLogits with T = 1 (so the same fusion applies), then [B, C].
    Value tok = b_.create<EmbeddingOp>(loc_, tensor({B, 1, C}), wte, reshape(token, {B, 1}));
    Value pos = b_.create<EmbeddingOp>(loc_, tensor({1, C}), param("wpe.weight"), position);
    Value x3 = b_.create<AddOp>(loc_, tok, b_.create<BroadcastOp>(loc_, tensor({B, 1, C}), pos));
    Value x = reshape(x3, {B, C});
    Value f = layers(x, [&](Value qkv, const std::string& h) -> Value {
      Value cache = b_.create<KvCacheOp>(loc_, tensor({2, B, H, T, C / H}), h + "attn");
      return b_.create<DecodeAttentionOp>(loc_, tensor({B, C}), qkv, cache, position, H);
    });
    loc_ = at("head");
    return b_.create<MatmulOp>(loc_, tensor({B, Vp}), f, wte, false, true);
  }

  // Positions @prefill reads per call: enough rows for the matrix products to run at speed
  // (B x 64). @prefill_short reads 16, so that a prompt of a few tokens pads to 16, not 64; there
  // is none when seq_len leaves no room for both (0). With seq_len 1 there is no @prefill: a
  // call of one position is @decode's.
  int64_t prefillPositions() const { return spec_.seq_len > 1 ? std::min<int64_t>(spec_.seq_len, 64) : 0; }
  int64_t shortPrefillPositions() const { return spec_.seq_len > 16 ? 16 : 0; }

  // @`name` (prefill or prefill_short): the M tokens at positions `name`_positions (p, p+1, ...,
  // p+M-1 with p = position) of each of the B rows through the layers, each kiln.decode_attention storing
  // their keys and values in its layer's cache (the caches @decode declares: kiln-plan-buffers
  // gives them the same place). Returns the last layer's attention output [B*M, C], which keeps
  // every layer live; the sampler ignores it and gets the logits of the prompt's last token
  // from @decode. No head: the ln_f and the last MLP left dead here are dropped.
  Value buildPrefill(StringRef name, int64_t M) {
    const int64_t B = spec_.batch_size, T = spec_.seq_len, C = spec_.n_embd, H = spec_.n_head;
    loc_ = at("embed");
    Value tokens = b_.create<InputOp>(loc_, itensor({B, M}), (name + "_tokens").str());
    Value positions = b_.create<InputOp>(loc_, itensor({M}), (name + "_positions").str());
    Value position = b_.create<InputOp>(loc_, itensor({1}), "position");
    Value tok = b_.create<EmbeddingOp>(loc_, tensor({B, M, C}), param("wte.weight"), tokens);
    Value pos = b_.create<EmbeddingOp>(loc_, tensor({M, C}), param("wpe.weight"), positions);
    Value x3 = b_.create<AddOp>(loc_, tok, b_.create<BroadcastOp>(loc_, tensor({B, M, C}), pos));
    Value last;
    layers(reshape(x3, {B * M, C}), [&](Value qkv, const std::string& h) -> Value {
      Value cache = b_.create<KvCacheOp>(loc_, tensor({2, B, H, T, C / H}), h + "attn");
      return last = b_.create<DecodeAttentionOp>(loc_, tensor({B * M, C}), qkv, cache, position, H);
    });
    return last;
  }

  // The forward pass from the token ids to the logits [B*T, Vp], at the insertion point.
  Value buildLogits() {
    const int64_t B = spec_.batch_size, T = spec_.seq_len, C = spec_.n_embd, N = B * T;
    const int64_t Vp = paddedVocab();
    // x = wte[idx] + wpe[0:T]
    loc_ = at("embed");
    Value idx = b_.create<InputOp>(loc_, itensor({B, T}), "idx");
    Value wte = param("wte.weight");
    Value tok = b_.create<EmbeddingOp>(loc_, tensor({B, T, C}), wte, idx);
    Value positions = b_.create<IotaOp>(loc_, itensor({T}));
    Value pos = b_.create<EmbeddingOp>(loc_, tensor({T, C}), param("wpe.weight"), positions);
    Value x3 = b_.create<AddOp>(loc_, tok, b_.create<BroadcastOp>(loc_, tensor({B, T, C}), pos));
    Value x = reshape(x3, {N, C});
    Value f = layers(x, [&](Value qkv, const std::string&) -> Value {
      auto attn = b_.create<AttentionOp>(loc_, tensor({B, T, C}), tensor({B, spec_.n_head, T}),
                                         reshape(qkv, {B, T, 3 * C}), spec_.n_head);
      return reshape(attn.getResult(), {N, C});
    });

    // logits = ln_f(x) @ wte^T (tied head, no bias).
    loc_ = at("head");
    return b_.create<MatmulOp>(loc_, tensor({N, Vp}), f, wte, false, true);
  }

 private:
  // The transformer blocks over activations x [rows, C], then ln_f: pre-norm attention and MLP,
  // each added to the residual stream. `attention` maps a block's packed q|k|v [rows, 3C] to its
  // heads' outputs [rows, C] (h: the block's name prefix, "h.3.").
  Value layers(Value x, llvm::function_ref<Value(Value qkv, const std::string& h)> attention) {
    const int64_t C = spec_.n_embd;
    for (int64_t i = 0; i < spec_.n_layer; ++i) {
      std::string h = "h." + std::to_string(i) + ".";
      loc_ = at(h + "attn");
      Value qkv = linear(layerNorm(x, h + "ln_1"), h + "attn.c_attn", 3 * C);
      x = b_.create<AddOp>(loc_, x, linear(attention(qkv, h), h + "attn.c_proj", C));

      loc_ = at(h + "mlp");
      Value m = layerNorm(x, h + "ln_2");
      Value u = b_.create<GeluOp>(loc_, linear(m, h + "mlp.c_fc", 4 * C));
      x = b_.create<AddOp>(loc_, x, linear(u, h + "mlp.c_proj", C));
    }
    loc_ = at("head");
    return layerNorm(x, "ln_f");
  }

  // Rows of wte: the vocabulary rounded up to a multiple of 128.
  int64_t paddedVocab() const { return (int64_t(spec_.vocab_size) + 127) / 128 * 128; }
  RankedTensorType tensor(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, f32_); }
  RankedTensorType itensor(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, i32_); }
  Location at(const std::string& name) { return NameLoc::get(b_.getStringAttr(name), fileLoc_); }

  void declare(const std::string& name, ArrayRef<int64_t> shape, StringRef init, float std,
               bool decay) {
    auto p = b_.create<ParameterOp>(at(name), name, tensor(shape), init, llvm::APFloat(std), decay);
    types_[name] = p.getTensorType();
  }
  Value param(const std::string& name) {
    return b_.create<ParamOp>(at(name), types_.at(name), FlatSymbolRefAttr::get(b_.getContext(), name));
  }
  Value reshape(Value v, ArrayRef<int64_t> shape) {
    auto type = RankedTensorType::get(shape, cast<RankedTensorType>(v.getType()).getElementType());
    return b_.create<ReshapeOp>(loc_, type, v);
  }
  Value layerNorm(Value x, const std::string& name) {
    auto t = cast<RankedTensorType>(x.getType());
    auto stats = tensor(t.getShape().drop_back());
    return b_.create<LayerNormOp>(at(name), t, stats, stats, x, param(name + ".weight"),
                                  param(name + ".bias"), b_.getF32FloatAttr(1e-5f))
        .getResult();
  }
  // x [N, in] @ W [in, out] + b, in Hugging Face's Conv1D layout.
  Value linear(Value x, const std::string& name, int64_t out) {
    int64_t n = cast<RankedTensorType>(x.getType()).getDimSize(0);
    Location loc = at(name);
    Value y = b_.create<MatmulOp>(loc, tensor({n, out}), x, param(name + ".weight"), false, false);
    Value bias = b_.create<BroadcastOp>(loc, tensor({n, out}), param(name + ".bias"));
    return b_.create<AddOp>(loc, y, bias);
  }

  const ModelSpec& spec_;
  OpBuilder b_;
  Type f32_, i32_;
  Location fileLoc_;
  Location loc_ = fileLoc_;
  OwningOpRef<ModuleOp> module_;
  std::map<std::string, RankedTensorType> types_;
};

}  // namespace

OwningOpRef<ModuleOp> buildGPT2(MLIRContext& ctx, const ModelSpec& spec) {
  ctx.loadDialect<KilnDialect, func::FuncDialect>();
  return GPT2Builder(ctx, spec).build();
}

}  // namespace kiln
