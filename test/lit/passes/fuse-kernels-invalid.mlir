// RUN: kiln-opt %s -split-input-file -kiln-fuse-kernels -verify-diagnostics

// A planned function is refused: the regions would have no planned offsets.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-fuse-kernels: @forward already has a buffer plan (kiln.arena_size); run kiln-fuse-kernels before kiln-plan-buffers}}
func.func @forward() -> tensor<f32> attributes {kiln.arena_size = 256 : i64} {
  %w = kiln.param @w {kiln.offsets = array<i64: -1>} : tensor<4xf32>
  %g = kiln.gelu %w {kiln.offsets = array<i64: 0>} : tensor<4xf32>
  %l = kiln.reduce_sum %g {kiln.offsets = array<i64: 256>} : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Straight-line code only: a second block would be left out of the pass's order of ops.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-fuse-kernels: @forward must have one block (straight-line code)}}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
^bb1:
  %z = kiln.zeros : tensor<f32>
  return %z : tensor<f32>
}
