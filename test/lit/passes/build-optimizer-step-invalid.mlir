// RUN: kiln-opt %s -split-input-file -kiln-build-optimizer-step -verify-diagnostics

// The user-facing errors of kiln-build-optimizer-step.

// Without parameters there is nothing to optimize.
// expected-error@below {{kiln-build-optimizer-step: the module declares no kiln.parameter}}
module {
  func.func @forward() -> tensor<f32> {
    %lw = kiln.hyper "loss_weight" : tensor<f32>
    return %lw : tensor<f32>
  }
}

// -----

// The pass refuses to run twice.
// expected-error@below {{kiln-build-optimizer-step: the module already has @optimizer_step}}
module {
  kiln.parameter @w : tensor<4xf32> {init = "zeros"}
  func.func @optimizer_step() -> tensor<f32> {
    %g = kiln.grad @w : tensor<4xf32>
    %n = kiln.global_norm %g : tensor<4xf32> -> tensor<f32>
    return %n : tensor<f32>
  }
}

// -----

// Graph IR: the gradients come from @micro_step, which kiln-autodiff has not built yet
// (kilnc would refuse the output: "@optimizer_step needs @micro_step beside it").
// expected-error@below {{kiln-build-optimizer-step: the module has no @micro_step, whose gradients @optimizer_step reads; run kiln-autodiff first}}
module {
  kiln.parameter @w : tensor<4xf32> {init = "zeros"}
  func.func @forward() -> tensor<f32> {
    %w = kiln.param @w : tensor<4xf32>
    %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}
