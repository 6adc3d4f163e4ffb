// RUN: kiln-opt %s -split-input-file -kiln-bucket-gradients -verify-diagnostics

// The user-facing errors of kiln-bucket-gradients.

// A second run would add buckets numbered from 0 again, which the runtime rejects (they must be
// numbered in program order).
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @micro_step() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  kiln.accumulate_grad @w, %w : tensor<4xf32>
  // expected-error@below {{kiln-bucket-gradients: the module already has gradient buckets ('kiln.reduce_gradients'); the pass runs once}}
  kiln.reduce_gradients [@w] {bucket = 0 : i64}
  return %l : tensor<f32>
}

// -----

// The wait of @optimizer_step counts too.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @micro_step() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  kiln.accumulate_grad @w, %w : tensor<4xf32>
  return %l : tensor<f32>
}
func.func @optimizer_step() -> tensor<f32> {
  // expected-error@below {{kiln-bucket-gradients: the module already has gradient buckets ('kiln.wait_gradients'); the pass runs once}}
  kiln.wait_gradients
  %g = kiln.grad @w : tensor<4xf32>
  %n = kiln.global_norm %g : tensor<4xf32> -> tensor<f32>
  return %n : tensor<f32>
}

// -----

// A planned step is refused: the new ops would have no planned offsets.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-bucket-gradients: @micro_step already has a buffer plan (kiln.arena_size); run kiln-bucket-gradients before kiln-plan-buffers}}
func.func @micro_step() -> tensor<f32> attributes {kiln.arena_size = 256 : i64} {
  %w = kiln.param @w {kiln.offsets = array<i64: -1>} : tensor<4xf32>
  %l = kiln.reduce_sum %w {kiln.offsets = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
  kiln.accumulate_grad @w, %w : tensor<4xf32>
  return %l : tensor<f32>
}

// -----

// Straight-line code only: an accumulation in a second block has no place in the order of the
// entry block's ops.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-bucket-gradients: @micro_step must have one block (straight-line code)}}
func.func @micro_step() -> tensor<f32> {
  %0 = kiln.zeros : tensor<f32>
  return %0 : tensor<f32>
^bb1:
  %1 = kiln.zeros : tensor<4xf32>
  kiln.accumulate_grad @w, %1 : tensor<4xf32>
  return %0 : tensor<f32>
}

// -----

// Graph IR (before kiln-autodiff) has no gradients to reduce: refused rather than left as it
// is, which would read as "no buckets needed".
// expected-error@below {{kiln-bucket-gradients: no @micro_step (graph IR): the pass places the reductions of the training step's gradients; run kiln-autodiff first}}
module {
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4xf32>
    %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// Not refused: a declared @micro_step has no body to place reductions in; it is left as it is.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func private @micro_step() -> tensor<f32>
