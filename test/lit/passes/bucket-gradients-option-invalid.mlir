// RUN: kiln-opt %s -kiln-bucket-gradients=bucket-mb=0 -verify-diagnostics

// The pass's own option: a bucket of at most 0 MB would hold no gradient (the rule is the same
// for --bucket-mb of kilnc and kiln-run).
// expected-error@below {{kiln-bucket-gradients: bucket-mb must be a positive finite number, not 0}}
module {
  kiln.parameter @w : tensor<4xf32> {init = "zeros"}
  func.func @micro_step() -> tensor<f32> {
    %w = kiln.param @w : tensor<4xf32>
    %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
    kiln.accumulate_grad @w, %w : tensor<4xf32>
    return %l : tensor<f32>
  }
}
