// RUN: kiln-opt %s -split-input-file -verify-diagnostics

// The buffer plan's attribute checks at their edges (KilnDialect.cpp; the basic cases are in
// invalid.mlir): a count short of the results, an offset past the first, -2 and 128 (just
// past the values that pass), and -1 on a reshape of a function argument.

// Fewer offsets than results is refused too, not only more.
func.func @offsets_fewer_than_results(%x: tensor<4x8xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{'kiln.offsets' holds 1 offset(s) for 3 result(s); the plan gives one per result (run kiln-plan-buffers)}}
  %0:3 = kiln.layer_norm %x, %w, %w {epsilon = 1.0e-05 : f32, kiln.offsets = array<i64: 0>} : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  return
}

// -----

// Every result's offset is checked, the last one too, and 128 (half the alignment) is refused.
func.func @offset_last_misaligned(%x: tensor<4x8xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{'kiln.offsets'[2] = 128 is not a multiple of 256 (the result's place in the arena; run kiln-plan-buffers)}}
  %0:3 = kiln.layer_norm %x, %w, %w {epsilon = 1.0e-05 : f32, kiln.offsets = array<i64: 0, 256, 128>} : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  return
}

// -----

// -2, just below the -1 that marks outside state, is a negative offset.
func.func @offset_minus_two(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.offsets'[0] = -2 is negative (the result's place in the arena; -1 alone marks state kept outside it; run kiln-plan-buffers)}}
  %0 = kiln.add %x, %x {kiln.offsets = array<i64: -2>} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A function argument is not state the module keeps: a reshape of one is computed here (the
// walk back through reshapes ends at a block argument, which has no defining op).
func.func @offset_outside_for_argument_reshape(%x: tensor<4xf32>) -> tensor<2x2xf32> {
  // expected-error @+1 {{'kiln.offsets'[0] = -1 marks state kept outside the arena, but this result is computed here}}
  %0 = kiln.reshape %x {kiln.offsets = array<i64: -1>} : tensor<4xf32> -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

