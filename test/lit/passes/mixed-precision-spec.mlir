// RUN: kiln-opt %s -split-input-file -kiln-mixed-precision | FileCheck %s

// Modules built from a spec with precision = "bf16" that the pass accepts: the refusal for
// "nothing in bf16" looks only at ops a result or side effect depends on, and these have one.

// The product reaches the loss through its users (a widening cast, a reduction, the return).
// CHECK-LABEL: func.func @forward
// CHECK: kiln.matmul {{.*}} -> tensor<4x4xbf16>
// CHECK: kiln.reduce_sum {{.*}} : tensor<4x4xf32> -> tensor<f32>
module attributes {kiln.spec = {precision = "bf16"}} {
  kiln.parameter @w : tensor<4x4xf32> {init = "zeros"}
  func.func @forward() -> tensor<f32> {
    %w = kiln.param @w : tensor<4x4xf32>
    %m = kiln.matmul %w, %w : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    %l = kiln.reduce_sum %m : tensor<4x4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// The product reaches no result, but an op with a side effect (an accumulation) reads it: live.
// CHECK-LABEL: func.func @forward
// CHECK: %[[M:.*]] = kiln.matmul {{.*}} -> tensor<4x4xbf16>
// CHECK: %[[MW:.*]] = kiln.cast %[[M]] : tensor<4x4xbf16> -> tensor<4x4xf32>
// CHECK: kiln.accumulate_grad @w, %[[MW]] : tensor<4x4xf32>
module attributes {kiln.spec = {precision = "bf16"}} {
  kiln.parameter @w : tensor<4x4xf32> {init = "zeros"}
  func.func @forward() -> tensor<f32> {
    %w = kiln.param @w : tensor<4x4xf32>
    %m = kiln.matmul %w, %w : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.accumulate_grad @w, %m : tensor<4x4xf32>
    %l = kiln.reduce_sum %w : tensor<4x4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}
