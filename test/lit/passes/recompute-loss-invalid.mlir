// RUN: kiln-opt %s -kiln-recompute -verify-diagnostics

// The backward pass starts after the op that defines the returned loss: a step that returns
// nothing has none.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-recompute: @micro_step must return one value, the loss}}
func.func @micro_step() {
  %w = kiln.param @w : tensor<4xf32>
  %g = kiln.gelu %w : tensor<4xf32>
  kiln.accumulate_grad @w, %g : tensor<4xf32>
  return
}
