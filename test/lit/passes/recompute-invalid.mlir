// RUN: kiln-opt %s -split-input-file -kiln-recompute=mode=all -verify-diagnostics

// expected-error@below {{kiln-recompute: unknown mode 'all' (expected none or cheap)}}
module {
}

// -----

// A planned step is refused whatever the mode (the module writer would copy the clones' stale
// kiln.offsets): this pass comes before kiln-plan-buffers, and kiln-plan-pipeline runs once.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-recompute: @micro_step already has a buffer plan (kiln.arena_size); run kiln-recompute before kiln-plan-buffers}}
func.func @micro_step() -> tensor<f32> attributes {kiln.arena_size = 256 : i64} {
  %w = kiln.param @w {kiln.offsets = array<i64: -1>} : tensor<4xf32>
  %l = kiln.reduce_sum %w {kiln.offsets = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
