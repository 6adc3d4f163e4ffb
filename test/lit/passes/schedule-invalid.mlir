// RUN: kiln-opt %s -kiln-schedule -verify-diagnostics

// A planned function is refused: a new order would make its kiln.offsets share memory between
// buffers that are then live together.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-schedule: @forward already has a buffer plan (kiln.arena_size); run kiln-schedule before kiln-plan-buffers}}
func.func @forward() -> tensor<f32> attributes {kiln.arena_size = 256 : i64} {
  %w = kiln.param @w {kiln.offsets = array<i64: -1>} : tensor<4xf32>
  %l = kiln.reduce_sum %w {kiln.offsets = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
