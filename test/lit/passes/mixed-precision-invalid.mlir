// RUN: kiln-opt %s -split-input-file -kiln-mixed-precision -verify-diagnostics

// expected-error@below {{kiln-mixed-precision: no @forward function}}
module {
}

// -----

// After kiln-autodiff the types are fixed: the backward pass follows the forward's.
func.func @forward() -> tensor<f32> {
  %x = kiln.zeros : tensor<4xf32>
  %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// expected-error@below {{kiln-mixed-precision: the module already has @micro_step; run the pass before kiln-autodiff}}
func.func @micro_step() -> tensor<f32> {
  %x = kiln.zeros : tensor<4xf32>
  %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
