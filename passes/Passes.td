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

#endif // KILN_PASSES_TD
