//===- Passes.td - kiln compiler passes ----------------------------------*- tablegen -*-===//
#ifndef KILN_PASSES_TD
#define KILN_PASSES_TD

include "mlir/Pass/PassBase.td"

def Autodiff : Pass<"kiln-autodiff", "::mlir::ModuleOp"> {
  let summary = "Derive the backward pass: @forward becomes @micro_step";
  let description = [{
    Clones `@forward` (which returns the mean loss) into `@micro_step` and appends the
    backward pass: a reverse walk over the forward ops that asks each op for its
    vector-Jacobian product (`DifferentiableOpInterface`), summing the gradients of values
    with several uses (weight tying is two uses of one `kiln.param`). The walk is seeded with
    the `loss_weight` hyperparameter (1 / micro-steps per optimizer step), so accumulating
    over micro-steps yields the mean gradient. Each parameter's gradient ends in a
    `kiln.accumulate_grad`. `@forward` is kept for evaluation.

    The pass refuses, rather than derive, a gradient it knows to be incomplete: a statistic
    result (`isConstantResult`: a layer norm's mean and rstd, a log-sum-exp) computed from a
    parameter that reaches the loss, or an operand computed from a parameter to which the op's
    rule gives no gradient (such as `kiln.scale`'s factor, a runtime scalar).
  }];
  let dependentDialects = ["::kiln::KilnDialect"];
}

def BuildOptimizerStep : Pass<"kiln-build-optimizer-step", "::mlir::ModuleOp"> {
  let summary = "Add @optimizer_step: global norm, clipping and AdamW over all parameters";
  let description = [{
    Builds `@optimizer_step() -> tensor<f32>` from the module's `kiln.parameter`
    declarations: reads every accumulated gradient, takes their global norm, derives the
    clipping coefficient from the `max_norm` hyperparameter, and updates each parameter with
    `kiln.adamw` in its decay group (the `decay` flag of its declaration). Returns the norm
    before clipping. The learning rate arrives as the `lr` hyperparameter: the runtime
    evaluates the schedule, so one module serves any schedule.
  }];
  let dependentDialects = ["::kiln::KilnDialect", "::mlir::func::FuncDialect"];
}

def MixedPrecision : Pass<"kiln-mixed-precision", "::mlir::ModuleOp"> {
  let summary = "Assign bf16 or fp32 to every value of @forward (autocast's policy)";
  let description = [{
    Runs on the graph before autodiff, so the backward pass inherits the types (the gradient of
    a bf16 value is bf16; a cast's gradient is cast back). The policy, that of
    `torch.autocast(dtype=torch.bfloat16)` around the forward and loss:
    * matrix products take bf16 operands (weights through `kiln.cast` of the fp32 master, which
      canonicalization turns into reads of the bf16 compute copy) and give bf16 results, the
      products accumulated in fp32; a bias added to one is added in bf16;
    * GELU and attention run on bf16 values (computed in fp32 inside the kernel);
    * layer norm computes its statistics in fp32; its output is stored in bf16 when every user
      is a matrix product (the cast folded into the producer);
    * cross-entropy reads bf16 logits and computes the softmax and loss in fp32;
    * the residual stream, the embeddings, every reduction, the loss, gradient accumulators,
      master weights and AdamW state stay fp32: a bf16 branch added to the fp32 residual is
      widened first (type promotion).
  }];
  let dependentDialects = ["::kiln::KilnDialect"];
}

def Recompute : Pass<"kiln-recompute", "::mlir::ModuleOp"> {
  let summary = "Rematerialise cheap activations in the backward pass of @micro_step";
  let description = [{
    With `mode=cheap`, each GELU output and layer-norm output that the backward pass needs is
    computed again right before its first backward use instead of being kept alive from the
    forward pass (llm.c's `-r`): the forward copy dies after its forward uses. The clones carry
    the unit attribute `kiln.recomputed`, so reports can count the extra work. The backward pass
    starts after the op that defines the returned loss. `mode=none` leaves the IR as it is.
  }];
  let options = [
    Option<"mode", "mode", "std::string", /*default=*/"\"cheap\"",
           "what to recompute: none | cheap (GELU and layer-norm outputs); default cheap, while "
           "kilnc and --kiln-plan-pipeline default to none">
  ];
  let dependentDialects = ["::kiln::KilnDialect"];
}

def Schedule : Pass<"kiln-schedule", "::mlir::ModuleOp"> {
  let summary = "Order each function's kernels to keep live memory low";
  let description = [{
    A deterministic list scheduler over every function: among the ops whose operands are
    ready, it picks the one that adds the fewest live bytes (bytes it allocates minus bytes of
    operands it is the last user of), ties broken by the original order. Ops with memory
    effects (state reads and writes) keep their relative order. The new order is kept only when
    its peak of live bytes is below the original order's peak.
  }];
  let dependentDialects = ["::kiln::KilnDialect"];
}

def BucketGradients : Pass<"kiln-bucket-gradients", "::mlir::ModuleOp"> {
  let summary = "Place the cross-rank gradient reductions in the step program";
  let description = [{
    Groups the parameters into buckets of about `bucket-mb` megabytes of fp32 gradients, in
    the order the (scheduled) backward pass of `@micro_step` finishes their gradients, and puts
    a `kiln.reduce_gradients` right after the last `kiln.accumulate_grad` of each bucket, so
    that averaging a finished bucket across ranks overlaps the backward work that follows it.
    `@optimizer_step` starts with a `kiln.wait_gradients`. In a single process these do nothing.
    A bucket closes when the next gradient would take it past `bucket-mb`, except where one fused
    kernel finishes several gradients: they stay in one bucket (it may then be larger), since its
    reduction can start only after that kernel. A parameter larger than `bucket-mb` is a bucket
    alone. Graph IR (a `@forward` without `@micro_step`) is refused: run kiln-autodiff first.
  }];
  let options = [
    Option<"bucketMB", "bucket-mb", "double", /*default=*/"25.0",
           "bucket size, in MB of fp32 gradients (the gradients one fused kernel finishes stay together, and a larger parameter is a bucket alone; default 25)">
  ];
  let dependentDialects = ["::kiln::KilnDialect"];
}

def PlanBuffers : Pass<"kiln-plan-buffers", "::mlir::ModuleOp"> {
  let summary = "Give every activation an offset in one arena";
  let description = [{
    For each function, computes the live interval of every activation over the (scheduled)
    op order, lets results share storage where that is free (a reshape aliases its input; an
    elementwise op writes in place over an operand it is the last user of; a `kiln.kv_cache`
    is live for the whole call, so it shares with nothing), and packs the
    intervals into one arena (largest first, best fit, 256-byte alignment). Writes
    `kiln.offsets` (one byte offset per result; -1 for parameters, gradients, inputs and
    hyperparameters, which live outside the arena) on every op with results, and
    `kiln.arena_size` on the function. The module writer copies these out; the runtime's plan
    verifier checks them independently. Graph IR built from a spec (a `kiln.spec` module with
    `@forward` but no `@micro_step`) is refused: run kiln-autodiff first.
  }];
  let dependentDialects = ["::kiln::KilnDialect"];
}

def FuseKernels : Pass<"kiln-fuse-kernels", "::mlir::ModuleOp"> {
  let summary = "Group the scheduled ops into fusion regions, one kernel launch each";
  let description = [{
    Runs on the scheduled program of every function and wraps each group of ops that one kernel
    can compute into a `kiln.fusion` region. The rules, in the order they claim ops:
    1. classifier: `kiln.cross_entropy` with the `kiln.cross_entropy_grad` that reads its
       log-sum-exp (and nothing else does): loss and logits gradient in one pass over the logits;
       a `kiln.cross_entropy` no classifier took (evaluation's loss, or a loss whose log-sum-exp
       other ops read) gets a region of its own, single op as it is: its generated row pass
       vectorises the exponentials;
    2. layer-norm backward: `kiln.layer_norm_grad` with the cast of its incoming gradient, the add of
       the residual gradient, the accumulation of its weight and bias gradients, the cast of the
       gradient that leaves, and the bias gradient of the layer before (the accumulated row sum of
       that gradient: a column reduction of the kernel's own output);
    3. matmul epilogues: a `kiln.matmul` followed along its result by bias adds (a broadcast
       1-D bias), GELU, residual adds, GELU backward, casts, scaling and gradient accumulation; a
       weight-gradient matmul (transposed left operand) also takes the bias gradient, the
       accumulated row sum of its right operand;
    4. layer norm: `kiln.layer_norm` with the residual add that produces its input (its sum may
       still be read elsewhere) and the cast of its output;
    5. embedding backward: `kiln.embedding_grad` (and a cast) with its gradient accumulation;
    6. elementwise chains: elementwise ops, casts, broadcasts, gathers and accumulation, where
       every use of a producer's result is inside the group;
    7. the optimizer: `kiln.clip_coef` and every `kiln.adamw` of `@optimizer_step` (horizontal
       fusion; the global norm stays one kernel), so the update is 2 launches.
    A group runs where its last op was; it is formed only when that is legal: no op outside the
    group between a member and that point reads the member's result (which would create a cycle),
    and no op with memory effects is crossed by a member with memory effects. Reductions are never
    producers inside a group: a consumer that needs the whole reduced tensor runs after it.

    With `single-ops`, an op that joins no group still gets a region of its own when a kernel
    template computes it (a target without built-in kernels, such as CUDA, runs only generated
    kernels); the global norm and attention are left to the target.

    Graph IR built from a spec (a `kiln.spec` module with `@forward` but no `@micro_step`) is
    refused: the regions are formed on the training step, after kiln-autodiff.
  }];
  let options = [
    Option<"singleOps", "single-ops", "bool", /*default=*/"false",
           "also give a lone op a region when a kernel template computes it">
  ];
  let dependentDialects = ["::kiln::KilnDialect"];
}

#endif // KILN_PASSES_TD
