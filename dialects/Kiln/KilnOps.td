//===- KilnOps.td - ops of the kiln graph dialect ------------------------*- tablegen -*-===//
#ifndef KILN_OPS_TD
#define KILN_OPS_TD

include "Kiln/KilnDialect.td"
include "Kiln/KilnInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

// Element types. Activations and weights are floating point; token ids are i32. Every shape
// is static, of 1 to 2^48 elements (1 PiB of fp32, far above any real tensor): the passes
// size, schedule and place each value in the arena by it, byte sizes must not wrap, and the
// kernels divide by row lengths.
class Kiln_ArenaTensorOf<list<Type> types, string what> : Type<
    And<[StaticShapeTensorOf<types>.predicate, CPred<"::kiln::fitsArena($_self)">]>,
    "statically shaped tensor of " # what # " of 1 to 2^48 elements", "::mlir::TensorType">;
def Kiln_FloatTensor : Kiln_ArenaTensorOf<[F32, BF16], "f32 or bf16">;
def Kiln_IndexTensor : Kiln_ArenaTensorOf<[I32], "i32">;
def Kiln_AnyTensor : Kiln_ArenaTensorOf<[F32, BF16, I32], "f32, bf16 or i32">;  // what moves data as is
// Positions (kiln.iota): a 1-D index tensor within the same bounds as every other value.
def Kiln_IndexVector : Type<
    And<[Kiln_IndexTensor.predicate, CPred<"::llvm::cast<::mlir::ShapedType>($_self).getRank() == 1">]>,
    "1-D statically shaped tensor of i32 of 1 to 2^48 elements", "::mlir::TensorType">;
def Kiln_Scalar : 0DTensorOf<[F32]>,
    BuildableType<"::mlir::RankedTensorType::get({}, $_builder.getF32Type())">;

// `overrides` names the interface methods with a default that the op defines itself.
class Kiln_DiffOp<string mnemonic, list<Trait> traits = [], list<string> overrides = []> :
    Kiln_Op<mnemonic, !listconcat(traits, [
        DeclareOpInterfaceMethods<Kiln_DifferentiableOpInterface, overrides>])>;

//===----------------------------------------------------------------------===//
// State: parameters, gradients, inputs, hyperparameters
//===----------------------------------------------------------------------===//

def Kiln_ParameterOp : Kiln_Op<"parameter", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "declares a trainable parameter";
  let description = [{
    A module-level declaration of one trainable tensor: its name (Hugging Face GPT-2 naming
    without the `transformer.` prefix), its type, its initialisation and whether AdamW's weight
    decay applies to it. The runtime owns the storage (fp32 master value, gradient accumulator,
    AdamW moments); functions read it with `kiln.param` / `kiln.grad`.

    `init` is `"normal"` (mean 0, standard deviation `init_std`), `"zeros"` or `"ones"`.

    ```mlir
    kiln.parameter @"wte.weight" : tensor<50257x768xf32> {decay, init = "normal", init_std = 2.0e-02 : f32}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttrOf<RankedTensorOf<[F32, BF16]>>:$type,
                       StrAttr:$init, DefaultValuedAttr<F32Attr, "0.0f">:$init_std,
                       UnitAttr:$decay);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
  }];
}

// Reads of model state. They read memory that kiln.accumulate_grad and kiln.adamw write, so CSE
// never merges a read before such a write with one after it; unused reads are still dead.
class Kiln_StateReadOp<string mnemonic> :
    Kiln_Op<mnemonic, [MemoryEffects<[MemRead]>, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Kiln_ParamOp : Kiln_StateReadOp<"param"> {
  let summary = "reads the current value of a parameter";
  let description = [{
    Yields the value of the `kiln.parameter` named by `name`: the declared (fp32 master) type,
    or the same shape in bf16, which reads the parameter's bf16 compute copy (kept by the
    runtime and refreshed by `kiln.adamw`). Reading the same parameter in two places (weight
    tying) is two uses of one value, so its gradient is the sum of both.
  }];
}

def Kiln_GradOp : Kiln_StateReadOp<"grad"> {
  let summary = "reads a parameter's accumulated gradient";
  let description = [{
    Yields the gradient accumulated by `kiln.accumulate_grad` over the micro-steps of the
    current optimizer step (already divided by the number of micro-steps, since the backward
    pass is seeded with `loss_weight`).
  }];
}

def Kiln_AccumulateGradOp : Kiln_Op<"accumulate_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>, MemoryEffects<[MemWrite]>]> {
  let summary = "adds a gradient to a parameter's gradient accumulator";
  let description = [{
    `grad(name) += gradient`. The runtime clears the accumulators at the start of every
    optimizer step, so micro-steps sum their contributions.
  }];
  let arguments = (ins FlatSymbolRefAttr:$name, Kiln_FloatTensor:$gradient);
  let assemblyFormat = "$name `,` $gradient attr-dict `:` type($gradient)";
}

def Kiln_InputOp : Kiln_Op<"input", [Pure]> {
  let summary = "a tensor the runtime fills before each call (token ids, targets, positions)";
  let description = [{
    Training and `@logits`: `"idx"` holds the input token ids and `"targets"` the next-token
    targets of a micro-batch, both `tensor<BxTxi32>`. Sampling with key/value caches: `@decode`
    reads one new token per row, `"token"` (`tensor<Bxi32>`), at `"position"` (`tensor<1xi32>`);
    `@prefill` and `@prefill_short` read M prompt tokens per row, `"prefill_tokens"`
    (`tensor<BxMxi32>`, M <= T), at positions `"prefill_positions"` (`tensor<Mxi32>`), starting
    at `"position"` (and likewise `"prefill_short_tokens"`, `"prefill_short_positions"`).
    The sizes against the spec (B, T) are checked where the spec is known (kilnc).
  }];
  let arguments = (ins StrAttr:$input_name);
  let results = (outs Kiln_IndexTensor:$result);
  let assemblyFormat = "$input_name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Kiln_HyperOp : Kiln_Op<"hyper", [Pure]> {
  let summary = "a scalar hyperparameter the runtime sets per step";
  let description = [{
    Hyperparameters are runtime inputs so that one compiled module serves many runs:
    `lr` (this step's learning rate, after the schedule), `beta1`, `beta2`, `eps`,
    `weight_decay`, `max_norm` (0 disables clipping), `step` (1-based AdamW step) and
    `loss_weight` (1 / micro-steps per optimizer step: the seed of the backward pass).
  }];
  let arguments = (ins StrAttr:$hyper_name);
  let results = (outs Kiln_Scalar:$result);
  let assemblyFormat = "$hyper_name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Kiln_IotaOp : Kiln_Op<"iota", [Pure]> {
  let summary = "the positions 0, 1, ..., n-1";
  let description = [{
    The position ids of a sequence of n tokens, for the position embedding: element i is i.
  }];
  let results = (outs Kiln_IndexVector:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Kiln_ZerosOp : Kiln_Op<"zeros", [Pure]> {
  let summary = "a tensor of zeros";
  let description = [{
    A constant. Autodiff makes one for a piece of a `kiln.split` whose result nothing used: the
    piece's gradient in the `kiln.concat` that joins the pieces' gradients.
  }];
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
}

def Kiln_CastOp : Kiln_DiffOp<"cast", [Pure]> {
  let summary = "converts between fp32 and bf16";
  let description = [{
    Same shape, another element type. fp32 -> bf16 rounds to nearest even. The mixed-precision
    pass inserts casts; canonicalization removes a bf16 -> fp32 -> bf16 round trip and turns a
    cast of an fp32 `kiln.param` into a read of the parameter's bf16 compute copy.
  }];
  let arguments = (ins Kiln_FloatTensor:$input);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// Model ops
//===----------------------------------------------------------------------===//

def Kiln_EmbeddingOp : Kiln_DiffOp<"embedding", [Pure]> {
  let summary = "gathers rows of a table";
  let description = [{
    `result[i..., :] = table[indices[i...], :]`: the result shape is the indices' shape
    followed by the table's row width.
  }];
  let arguments = (ins Kiln_FloatTensor:$table, Kiln_IndexTensor:$indices);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$table `[` $indices `]` attr-dict `:` type($table) `,` type($indices) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_EmbeddingGradOp : Kiln_Op<"embedding_grad", [Pure]> {
  let summary = "scatter-adds rows into a table-shaped gradient";
  let description = [{
    The vector-Jacobian product of `kiln.embedding` for its table: a zero tensor of the
    table's shape into which each row of `grad` is added at `indices` (repeated ids add up).
  }];
  let arguments = (ins Kiln_FloatTensor:$grad, Kiln_IndexTensor:$indices);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $indices attr-dict `:` type($grad) `,` type($indices) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_MatmulOp : Kiln_DiffOp<"matmul", [Pure]> {
  let summary = "2-D matrix product, optionally transposing either operand";
  let description = [{
    `result[M, N] = op(lhs) @ op(rhs)` where `op` transposes when `transpose_lhs` /
    `transpose_rhs` is set. Both operands share one element type; products accumulate in fp32
    and the result is stored in its own type (bf16 operands give a bf16 result). A linear layer in Hugging Face's Conv1D layout is
    `kiln.matmul %x, %w` with `%w : [in, out]`; the tied output head is
    `kiln.matmul %x, %wte {transpose_rhs}`.
  }];
  let arguments = (ins Kiln_FloatTensor:$lhs, Kiln_FloatTensor:$rhs,
                       UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
  let hasVerifier = 1;
}

class Kiln_BinaryOp<string mnemonic> :
    Kiln_DiffOp<mnemonic, [Pure, SameOperandsAndResultType]> {
  let arguments = (ins Kiln_FloatTensor:$lhs, Kiln_FloatTensor:$rhs);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Kiln_AddOp : Kiln_BinaryOp<"add"> {
  let summary = "elementwise sum";
  let description = [{ `result = lhs + rhs`, same shapes (use `kiln.broadcast` first). }];
}

def Kiln_MulOp : Kiln_BinaryOp<"mul"> {
  let summary = "elementwise product";
  let description = [{ `result = lhs * rhs`, same shapes. }];
}

def Kiln_ScaleOp : Kiln_DiffOp<"scale", [Pure]> {
  let summary = "multiplies a tensor by a runtime scalar";
  let description = [{ `result = input * factor` with `factor` a 0-d tensor. }];
  let arguments = (ins Kiln_FloatTensor:$input, Kiln_Scalar:$factor);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input `,` $factor attr-dict `:` type($input) `,` type($factor) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_GeluOp : Kiln_DiffOp<"gelu", [Pure, SameOperandsAndResultType]> {
  let summary = "GELU, tanh approximation";
  let description = [{
    `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, elementwise (GPT-2's form).
  }];
  let arguments = (ins Kiln_FloatTensor:$input);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Kiln_GeluGradOp : Kiln_Op<"gelu_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "gradient of GELU";
  let description = [{ `result = grad * gelu'(input)`, elementwise. }];
  let arguments = (ins Kiln_FloatTensor:$grad, Kiln_FloatTensor:$input);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$grad `,` $input attr-dict `:` type($result)";
}

def Kiln_BroadcastOp : Kiln_DiffOp<"broadcast", [Pure]> {
  let summary = "repeats a tensor along new leading dimensions";
  let description = [{
    The input's shape must be a suffix of the result's shape; the result repeats the input
    over the extra leading dimensions (a bias over rows, positions over the batch).
  }];
  let arguments = (ins Kiln_FloatTensor:$input);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_ReduceSumOp : Kiln_DiffOp<"reduce_sum", [Pure]> {
  let summary = "sums a tensor over its leading dimensions";
  let description = [{
    The inverse shape relation of `kiln.broadcast`: the result's shape is a suffix of the
    input's, and the result sums the input over the leading dimensions that were dropped (a
    bias gradient is the sum of the output gradient over rows).
  }];
  let arguments = (ins Kiln_FloatTensor:$input);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_ReshapeOp : Kiln_DiffOp<"reshape", [Pure]> {
  let summary = "reinterprets a tensor with another shape of the same size";
  let description = [{ Row-major order is kept; no data moves. }];
  let arguments = (ins Kiln_AnyTensor:$input);
  let results = (outs Kiln_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Kiln_TransposeOp : Kiln_DiffOp<"transpose", [Pure]> {
  let summary = "2-D transpose";
  let description = [{
    A copy with the two dimensions swapped: `[M, N] -> [N, M]`. GPT-2's matrix products take
    transposed operands as flags (`transpose_lhs`, `transpose_rhs`) and need no copy; the op is
    for graphs that transpose a value itself (its gradient is the transpose of the gradient).
  }];
  let arguments = (ins Kiln_FloatTensor:$input);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_SplitOp : Kiln_DiffOp<"split", [Pure]> {
  let summary = "splits the last dimension into consecutive pieces";
  let description = [{
    Each result takes the next `size` columns of the last dimension; the sizes add up to the
    input's last dimension, and all other dimensions are kept.
  }];
  let arguments = (ins Kiln_FloatTensor:$input);
  let results = (outs Variadic<Kiln_FloatTensor>:$results);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($results)";
  let hasVerifier = 1;
}

def Kiln_ConcatOp : Kiln_DiffOp<"concat", [Pure]> {
  let summary = "concatenates tensors along the last dimension";
  let description = [{
    The inverse of `kiln.split`: the inputs agree in every dimension but the last, and the
    result's last dimension is the sum of theirs. Autodiff makes one for the gradient of a split
    (q, k and v's gradients joined into the gradient of the qkv projection).
  }];
  let arguments = (ins Variadic<Kiln_FloatTensor>:$inputs);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_LayerNormOp : Kiln_DiffOp<"layer_norm", [Pure], ["isConstantResult"]> {
  let summary = "layer normalisation over the last dimension";
  let description = [{
    For each row: `mean`, `rstd = 1 / sqrt(var + epsilon)` with the biased variance, and
    `result = (x - mean) * rstd * weight + bias`. `mean` and `rstd` (one per row) are results
    so the backward pass does not recompute them. Statistics are computed in fp32; the result
    may be stored in another float type than the input (a bf16 output that feeds a matrix
    product is the cast folded into the producer).
  }];
  let arguments = (ins Kiln_FloatTensor:$input, Kiln_FloatTensor:$weight,
                       Kiln_FloatTensor:$bias, DefaultValuedAttr<F32Attr, "1.0e-5f">:$epsilon);
  let results = (outs Kiln_FloatTensor:$result, Kiln_FloatTensor:$mean,
                      Kiln_FloatTensor:$rstd);
  let assemblyFormat = "$input `,` $weight `,` $bias attr-dict `:` type($input) `,` type($weight) `,` type($bias) `->` type(results)";
  let hasVerifier = 1;
}

def Kiln_LayerNormGradOp : Kiln_Op<"layer_norm_grad", [Pure]> {
  let summary = "gradients of layer normalisation";
  let description = [{
    From the result gradient and the saved statistics, the gradients of the input, the weight
    and the bias. Shapes as in `kiln.layer_norm`: `grad` and `input_grad` have the input's
    shape, `weight` and its gradients are `[C]` (the last dimension), `mean` and `rstd` have the
    input's shape without its last dimension.
  }];
  let arguments = (ins Kiln_FloatTensor:$grad, Kiln_FloatTensor:$input,
                       Kiln_FloatTensor:$weight, Kiln_FloatTensor:$mean, Kiln_FloatTensor:$rstd);
  let results = (outs Kiln_FloatTensor:$input_grad, Kiln_FloatTensor:$weight_grad,
                      Kiln_FloatTensor:$bias_grad);
  let assemblyFormat = "$grad `,` $input `,` $weight `,` $mean `,` $rstd attr-dict `:` type($grad) `,` type($input) `,` type($weight) `,` type($mean) `,` type($rstd) `->` type(results)";
  let hasVerifier = 1;
}

def Kiln_AttentionOp : Kiln_DiffOp<"attention", [Pure], ["isConstantResult"]> {
  let summary = "causal multi-head self-attention from packed q|k|v";
  let description = [{
    `qkv : [B, T, 3C]` holds queries, keys and values side by side; each is split into
    `num_heads` heads of `C / num_heads` channels. Per head,
    `softmax(q k^T / sqrt(hs) + causal mask) v`, with heads concatenated back into
    `result : [B, T, C]`. `lse : [B, H, T]` is the log-sum-exp of each softmax row, which
    the backward pass uses to rebuild the probabilities instead of storing the T x T matrix.
  }];
  let arguments = (ins Kiln_FloatTensor:$qkv, I64Attr:$num_heads);
  let results = (outs Kiln_FloatTensor:$result, Kiln_FloatTensor:$lse);
  let assemblyFormat = "$qkv attr-dict `:` type($qkv) `->` type(results)";
  let hasVerifier = 1;
}

def Kiln_AttentionGradOp : Kiln_Op<"attention_grad", [Pure]> {
  let summary = "gradient of causal attention with respect to packed q|k|v";
  let arguments = (ins Kiln_FloatTensor:$grad, Kiln_FloatTensor:$qkv,
                       Kiln_FloatTensor:$result, Kiln_FloatTensor:$lse, I64Attr:$num_heads);
  let results = (outs Kiln_FloatTensor:$qkv_grad);
  let description = [{
    From the result gradient `grad : [B, T, C]`, the forward's operand `qkv : [B, T, 3C]`, its
    `result : [B, T, C]` and log-sum-exp `lse : [B, H, T]`, the gradient of `qkv`, of its shape.
  }];
  let assemblyFormat = "$grad `,` $qkv `,` $result `,` $lse attr-dict `:` type($grad) `,` type($qkv) `,` type($result) `,` type($lse) `->` type($qkv_grad)";
  let hasVerifier = 1;
}

def Kiln_CrossEntropyOp : Kiln_DiffOp<"cross_entropy", [Pure], ["isConstantResult"]> {
  let summary = "mean softmax cross-entropy of logits against targets";
  let description = [{
    `logits : [N, V]`, `targets : [N]`. `loss = mean_i (lse_i - logits[i, targets_i])` with
    `lse_i = log sum_{j < num_classes} exp(logits[i, j])`, which is also returned for the
    backward pass. Computed in fp32 whatever the logits' type (bf16 logits are read and widened).

    `num_classes` (optional; absent means all `V` columns) is the real number of classes when
    the class dimension is padded (GPT-2's vocabulary 50257 is stored as 50304 columns): the
    columns `num_classes .. V-1` take no part in the softmax, and targets must be below it.

    ```mlir
    %loss, %lse = kiln.cross_entropy %logits, %t {num_classes = 50257 : i64}
        : tensor<8x50304xf32>, tensor<8xi32> -> tensor<f32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Kiln_FloatTensor:$logits, Kiln_IndexTensor:$targets,
                       OptionalAttr<I64Attr>:$num_classes);
  let results = (outs Kiln_Scalar:$loss, Kiln_FloatTensor:$lse);
  let assemblyFormat = "$logits `,` $targets attr-dict `:` type($logits) `,` type($targets) `->` type(results)";
  let hasVerifier = 1;
}

def Kiln_CrossEntropyGradOp : Kiln_Op<"cross_entropy_grad", [Pure]> {
  let summary = "gradient of the mean cross-entropy with respect to the logits";
  let description = [{
    `grad / N * (softmax(logits) - onehot(targets))` over the first `num_classes` columns (all
    of them when the attribute is absent); the padded columns `num_classes .. V-1` get exactly 0.
  }];
  let arguments = (ins Kiln_Scalar:$grad, Kiln_FloatTensor:$logits, Kiln_FloatTensor:$lse,
                       Kiln_IndexTensor:$targets, OptionalAttr<I64Attr>:$num_classes);
  let results = (outs Kiln_FloatTensor:$logits_grad);
  let assemblyFormat = "$grad `,` $logits `,` $lse `,` $targets attr-dict `:` type($logits) `,` type($lse) `,` type($targets) `->` type($logits_grad)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Optimizer ops
//===----------------------------------------------------------------------===//

def Kiln_GlobalNormOp : Kiln_Op<"global_norm", [Pure]> {
  let summary = "Euclidean norm of all gradients together";
  let description = [{ `sqrt(sum over every operand and element of g^2)`. }];
  let arguments = (ins Variadic<Kiln_FloatTensor>:$inputs);
  let results = (outs Kiln_Scalar:$result);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

def Kiln_ClipCoefOp : Kiln_Op<"clip_coef", [Pure]> {
  let summary = "the gradient clipping coefficient";
  let description = [{
    `min(1, max_norm / (norm + 1e-6))` when `max_norm > 0`, else 1 (clipping disabled).
  }];
  let arguments = (ins Kiln_Scalar:$norm, Kiln_Scalar:$max_norm);
  let results = (outs Kiln_Scalar:$result);
  let assemblyFormat = "$norm `,` $max_norm attr-dict `:` type($result)";
}

def Kiln_AdamWOp : Kiln_Op<"adamw", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>, MemoryEffects<[MemWrite]>]> {
  let summary = "one AdamW update of a parameter (PyTorch semantics)";
  let description = [{
    With `g = grad * scale` (the clipping coefficient), `t = step`:
    ```
    p = p * (1 - lr * weight_decay)      # only with the `decay` attribute
    m = beta1 m + (1 - beta1) g
    v = beta2 v + (1 - beta2) g^2
    p = p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
    ```
    `decay` must match the parameter's declaration (the decay group).
  }];
  let arguments = (ins FlatSymbolRefAttr:$name, Kiln_FloatTensor:$grad, Kiln_Scalar:$scale,
                       Kiln_Scalar:$lr, Kiln_Scalar:$beta1, Kiln_Scalar:$beta2,
                       Kiln_Scalar:$eps, Kiln_Scalar:$weight_decay, Kiln_Scalar:$step,
                       UnitAttr:$decay);
  let assemblyFormat = [{
    $name `,` $grad `scale` $scale `lr` $lr `betas` `(` $beta1 `,` $beta2 `)` `eps` $eps
    `weight_decay` $weight_decay `step` $step attr-dict `:` type($grad)
  }];
}

//===----------------------------------------------------------------------===//
// Incremental decoding (the sampler's @decode)
//===----------------------------------------------------------------------===//

def Kiln_KvCacheOp : Kiln_Op<"kv_cache", [Pure]> {
  let summary = "one layer's key/value cache for incremental decoding";
  let description = [{
    `result : [2, B, H, S, hs]` f32 holds the keys (index 0) and values (index 1) of every
    position decoded so far, for S positions of each of B rows and H heads. Its storage is
    planned in the function's activation region and spans the whole call, and nothing else in
    the function uses it, so it keeps its contents from one call to the next (as long as no other
    program runs in between: they reuse that region). `kiln-plan-buffers` places a function's
    caches first in that region, in op order, so `@prefill` and `@decode`, which declare the
    same caches, share them. `name` says which layer it serves, for reports.

    ```mlir
    %kv = kiln.kv_cache "h.0.attn" : tensor<2x4x2x32x8xf32>
    ```
  }];
  let arguments = (ins StrAttr:$cache_name);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$cache_name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Kiln_DecodeAttentionOp : Kiln_Op<"decode_attention", [Pure]> {
  let summary = "causal attention of new positions against a key/value cache";
  let description = [{
    `qkv : [B * M, 3C]` packs the query, key and value of M consecutive tokens of each of B
    rows (row `b * M + m`), at positions `position + m`, where `position : [1]` (i32) is the
    same for every row. The op stores those keys and values into `cache` (a `kiln.kv_cache` it
    alone uses, [2, B, H, S, hs]) and returns, per head of `hs = C / num_heads` channels and
    per new token, `softmax(q k^T / sqrt(hs)) v` over cache positions `0 .. position + m`:
    `result : [B * M, C]`, in qkv's element type. That is row `position + m` of
    `kiln.attention` over the sequence the cache has seen, so `@decode` (M = 1) gives the
    logits `@logits` gives at that position without recomputing the earlier ones, and
    `@prefill` (M > 1) reads a prompt M positions per call. Tokens at positions S and beyond
    are skipped (their rows of `result` are left as they were); the runtime keeps `position`
    in [0, S). Arithmetic is fp32 (the cache is fp32 whatever qkv's type).
  }];
  let arguments = (ins Kiln_FloatTensor:$qkv, Kiln_FloatTensor:$cache, Kiln_IndexTensor:$position,
                       I64Attr:$num_heads);
  let results = (outs Kiln_FloatTensor:$result);
  let assemblyFormat = "$qkv `,` $cache `,` $position attr-dict `:` type($qkv) `,` type($cache) `,` type($position) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Data parallelism
//===----------------------------------------------------------------------===//

def Kiln_ReduceGradientsOp : Kiln_Op<"reduce_gradients", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>, MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "starts averaging a bucket of gradients across ranks";
  let description = [{
    Placed by `kiln-bucket-gradients` right after the last `kiln.accumulate_grad` of the
    listed parameters, so the exchange of this bucket overlaps the rest of the backward pass.
    On the last micro-step of an optimizer step with more than one rank, the runtime starts a
    non-blocking sum of these gradient accumulators across ranks (a reduce-scatter with ZeRO-1);
    otherwise it does nothing. `bucket` numbers the buckets in the order they start.
  }];
  let arguments = (ins SymbolRefArrayAttr:$params, I64Attr:$bucket);
  let assemblyFormat = "$params attr-dict";
  let hasVerifier = 1;
}

def Kiln_WaitGradientsOp : Kiln_Op<"wait_gradients", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "waits for every gradient reduction started by kiln.reduce_gradients";
  let description = [{
    The first op of `@optimizer_step`: from here on the accumulators hold gradients averaged
    over all ranks (with ZeRO-1, this rank's pieces of them).
  }];
  let assemblyFormat = "attr-dict";
}

//===----------------------------------------------------------------------===//
// Fused kernels (the fused-kernel IR)
//===----------------------------------------------------------------------===//

def Kiln_FusionOp : Kiln_Op<"fusion", [IsolatedFromAbove, RecursiveMemoryEffects]> {
  let summary = "a fusion region: kiln ops that run as one kernel launch";
  let description = [{
    Formed by `kiln-fuse-kernels`. The body holds the fused ops in program order; its block
    arguments are the region's `inputs` and `kiln.yield` lists the values the rest of the program
    reads (the `results`). Values that stay inside the body never reach memory; every op's results
    are read in the body or yielded (a layer norm's statistics may go unread). Ops in the body
    with side effects (`kiln.accumulate_grad`, `kiln.adamw`) write state as they would outside, so
    the region has the union of its body's effects.

    `kind` says which kernel template the code generators use:
    - `elementwise`: elementwise ops, broadcasts, casts, gathers (`kiln.embedding`) and gradient
      accumulation, in one loop over the elements of the largest value;
    - `matmul`: one `kiln.matmul` of two region inputs with its epilogue (elementwise ops on its
      result: bias, GELU, residual add, GELU backward, casts, gradient accumulation) and the bias
      gradient (`kiln.reduce_sum` of the right operand over rows, accumulated);
    - `layer_norm`: one `kiln.layer_norm`, the elementwise ops that compute its input (the
      residual add; only the input itself is yielded) and the casts of its output;
    - `layer_norm_grad`: one `kiln.layer_norm_grad`, the adds and casts that follow its input
      gradient (the residual gradient), column sums of those (cast and accumulated along one chain
      of uses) and the accumulation of its weight and bias gradients;
    - `classifier`: `kiln.cross_entropy` and its `kiln.cross_entropy_grad` (the probabilities are
      never stored), or the loss alone;
    - `reduce_sum`: one `kiln.reduce_sum` (column sums), first, then what consumes the sums;
    - `embedding_grad`: `kiln.embedding_grad` scattered straight into the gradient accumulator;
    - `optimizer`: `kiln.clip_coef` and every `kiln.adamw` of the optimizer step, each reading its
      gradient from a region input.

    Where a template runs one loop (elementwise, a matmul's epilogue, the column sums of
    `reduce_sum`), every value it yields or accumulates has the loop's element count.

    `kernel` names the kernel after the ops it fuses (`matmul_add_gelu`): letters, digits and `_`
    only, as it becomes part of a C function's name in the generated source.

    ```mlir
    %r:2 = kiln.fusion "matmul" "matmul_broadcast_add_gelu" (%x, %w, %b)
        : (tensor<8x4xf32>, tensor<4x16xf32>, tensor<16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
    ^bb0(%a: tensor<8x4xf32>, %bw: tensor<4x16xf32>, %bb: tensor<16xf32>):
      %0 = kiln.matmul %a, %bw : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
      %1 = kiln.broadcast %bb : tensor<16xf32> -> tensor<8x16xf32>
      %2 = kiln.add %0, %1 : tensor<8x16xf32>
      %3 = kiln.gelu %2 : tensor<8x16xf32>
      kiln.yield %2, %3 : tensor<8x16xf32>, tensor<8x16xf32>
    }
    ```
  }];
  let arguments = (ins StrAttr:$kind, StrAttr:$kernel, Variadic<Kiln_AnyTensor>:$inputs);
  let results = (outs Variadic<Kiln_AnyTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $kind $kernel `(` $inputs `)` attr-dict `:` functional-type($inputs, $results) $body
  }];
  // verify: the region's interface (arguments, yield, kernel name), before the body's ops are
  // verified; verifyRegions: what the body holds, after them, as it reads the fused ops' operands
  // and result types, which must have passed their own verifiers first.
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Block &getBlock() { return getBody().front(); }
    // The ops the region fuses, in program order (without the terminator).
    auto getFusedOps() { return getBlock().without_terminator(); }
    // The elements an elementwise kernel loops over: those of the largest value the region
    // computes or accumulates.
    int64_t getLoopSize();
  }];
}

def Kiln_YieldOp : Kiln_Op<"yield", [Pure, Terminator, HasParent<"FusionOp">]> {
  let summary = "the values a fusion region gives to the rest of the program";
  let description = [{
    Terminates a `kiln.fusion` body; its operands become the region's results, in order.
  }];
  let arguments = (ins Variadic<Kiln_AnyTensor>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

#endif // KILN_OPS_TD
