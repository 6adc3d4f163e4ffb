// RUN: kiln-opt %s -kiln-plan-pipeline -kiln-plan-pipeline -verify-diagnostics

// kiln-plan-pipeline runs once: its first pass refuses the step the first run planned (a second
// run would number a second set of gradient buckets from 0).
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-recompute: @micro_step already has a buffer plan (kiln.arena_size); run kiln-recompute before kiln-plan-buffers}}
func.func @micro_step() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  kiln.accumulate_grad @w, %w : tensor<4xf32>
  return %l : tensor<f32>
}
