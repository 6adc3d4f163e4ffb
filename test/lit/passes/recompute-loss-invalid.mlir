// RUN: kiln-opt %s -split-input-file -kiln-recompute -verify-diagnostics

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

// -----

// Straight-line code only: a second block would be left out of the pass's order of ops.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-recompute: @micro_step must have one block (straight-line code)}}
func.func @micro_step() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
^bb1:
  %z = kiln.zeros : tensor<f32>
  return %z : tensor<f32>
}
