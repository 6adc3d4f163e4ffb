//===- KilnDialect.td - the kiln graph dialect --------------------------*- tablegen -*-===//
#ifndef KILN_DIALECT_TD
#define KILN_DIALECT_TD

include "mlir/IR/OpBase.td"

def Kiln_Dialect : Dialect {
  let name = "kiln";
  let summary = "Tensor-level graph of a GPT training step";
  let description = [{
    The `kiln` dialect describes one training step of a GPT-style model at the level of whole
    tensors, with value semantics: every op consumes and produces builtin ranked tensors
    (`f32` activations and weights, `i32` token ids). Model state lives in module-level
    `kiln.parameter` declarations; functions read it with `kiln.param` and `kiln.grad`, and only
    the three optimizer-facing ops (`kiln.accumulate_grad`, `kiln.adamw`) write it.

    A compiled model holds up to three functions:
    * `@forward() -> tensor<f32>`: forward pass and mean loss (built from a spec);
    * `@micro_step() -> tensor<f32>`: forward, backward, and gradient accumulation (autodiff);
    * `@optimizer_step() -> tensor<f32>`: global norm, clipping and AdamW; returns the norm.

    Inputs (`kiln.input`) and hyperparameters (`kiln.hyper`) are filled by the runtime before
    each call, so one compiled module serves many runs.

    `kiln.spec`, a dictionary on the module, is the spec kilnc built it from (sizes, precision,
    target); the dialect verifies its place and kind, and the passes and kilnc that read it
    check its keys.

    The buffer plan (`kiln-plan-buffers`) is kept in two discardable attributes, which the
    dialect verifies: `kiln.offsets` on an op, one byte offset into the arena per result, each a
    multiple of 256 (or -1 for state kept outside the arena: parameters, gradients, moments);
    and `kiln.arena_size` on a function, the bytes of the buffers planned for its call (the
    activation region: the state is not counted; the runtime's arena puts that region after the
    state, as `kiln-inspect` reports).
  }];
  let cppNamespace = "::kiln";
  let hasOperationAttrVerify = 1;
}

class Kiln_Op<string mnemonic, list<Trait> traits = []> :
    Op<Kiln_Dialect, mnemonic, traits>;

#endif // KILN_DIALECT_TD
