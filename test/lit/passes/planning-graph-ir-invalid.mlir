// RUN: not kiln-opt %s -kiln-fuse-kernels 2>&1 | FileCheck %s --check-prefix=FUSE
// RUN: not kiln-opt %s -kiln-plan-buffers 2>&1 | FileCheck %s --check-prefix=PLAN
// RUN: sed "s/module attributes .* {/module {/" %s | kiln-opt -kiln-plan-buffers | FileCheck %s --check-prefix=NOSPEC

// Graph IR built from a spec (kiln.spec, @forward, no @micro_step) is refused by the planning
// passes, where the pass order is wrong: kilnc would refuse the planned graph only later.
// FUSE: error: kiln-fuse-kernels: no @micro_step (graph IR): the pass plans the training step; run kiln-autodiff first (kiln-opt -kiln-step-pipeline, or kilnc --emit=step)
// PLAN: error: kiln-plan-buffers: no @micro_step (graph IR): the pass plans the training step; run kiln-autodiff first
// A module without kiln.spec (forward-only functions, the passes' own tests) is planned as it is.
// NOSPEC: func.func @forward() -> tensor<f32> attributes {kiln.arena_size =
module attributes {kiln.spec = {precision = "fp32"}} {
  kiln.parameter @w : tensor<4xf32> {init = "zeros"}
  func.func @forward() -> tensor<f32> {
    %w = kiln.param @w : tensor<4xf32>
    %g = kiln.gelu %w : tensor<4xf32>
    %l = kiln.reduce_sum %g : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}
