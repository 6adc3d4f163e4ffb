// RUN: kiln-opt %s -split-input-file -kiln-autodiff -kiln-build-optimizer-step -kiln-bucket-gradients=bucket-mb=0.0006 | FileCheck %s
// RUN: kiln-opt %s -split-input-file -kiln-autodiff -kiln-build-optimizer-step -kiln-bucket-gradients | FileCheck %s --check-prefix=ONE

// Buckets follow the order in which the backward pass finishes gradients: @w2 (the last layer)
// first. With 600-byte buckets each 512-byte weight is a bucket of its own, reduced right after
// its accumulation, before the backward work that follows; the optimizer waits first.
// CHECK-LABEL: func.func @micro_step
// CHECK: kiln.accumulate_grad @w2
// CHECK-NEXT: kiln.reduce_gradients [@w2] {bucket = 0 : i64}
// CHECK: kiln.accumulate_grad @w1
// CHECK-NEXT: kiln.reduce_gradients [@w1] {bucket = 1 : i64}
// CHECK-LABEL: func.func @optimizer_step
// CHECK-NEXT: kiln.wait_gradients
// With the default 25 MB, both share one bucket, closed after the last gradient.
// ONE-LABEL: func.func @micro_step
// ONE: kiln.accumulate_grad @w1
// ONE-NEXT: kiln.reduce_gradients [@w2, @w1] {bucket = 0 : i64}
kiln.parameter @w1 : tensor<8x16xf32> {init = "zeros"}
kiln.parameter @w2 : tensor<16x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.input "idx" : tensor<4x8xi32>
  %w1 = kiln.param @w1 : tensor<8x16xf32>
  %w2 = kiln.param @w2 : tensor<16x8xf32>
  %e = kiln.embedding %w1[%x] : tensor<8x16xf32>, tensor<4x8xi32> -> tensor<4x8x16xf32>
  %r = kiln.reshape %e : tensor<4x8x16xf32> -> tensor<32x16xf32>
  %y = kiln.matmul %r, %w2 : tensor<32x16xf32>, tensor<16x8xf32> -> tensor<32x8xf32>
  %l = kiln.reduce_sum %y : tensor<32x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
