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

// -----

// Graph IR (before kiln-autodiff) has no backward pass to recompute in: refused rather than
// left as it is, which would read as "nothing to recompute".
// expected-error@below {{kiln-recompute: no @micro_step (graph IR): the pass recomputes in the backward pass of the training step; run kiln-autodiff first}}
module {
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4xf32>
    %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// Neither @forward nor @micro_step (not a training module): nothing to recompute, and nothing said.
module {
  func.func @helper() -> tensor<f32> {
    %x = kiln.zeros : tensor<4xf32>
    %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// After kiln-fuse-kernels the GELU and layer-norm outputs sit inside regions, out of the pass's
// reach: refused rather than recomputing only what was left unfused.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @micro_step() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  // expected-error@below {{kiln-recompute: @micro_step is fused already (kiln.fusion), and the outputs inside regions cannot be recomputed; run kiln-recompute before kiln-fuse-kernels}}
  %g = kiln.fusion "elementwise" "gelu"(%w) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %0 = kiln.gelu %a : tensor<4xf32>
    kiln.yield %0 : tensor<4xf32>
  }
  %l = kiln.reduce_sum %g : tensor<4xf32> -> tensor<f32>
  kiln.accumulate_grad @w, %g : tensor<4xf32>
  return %l : tensor<f32>
}

// -----

// A declared @micro_step has no body to recompute in: nothing to do, and nothing said.
func.func private @micro_step() -> tensor<f32>
