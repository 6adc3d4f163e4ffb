// RUN: kiln-opt %s -split-input-file -kiln-autodiff -kiln-recompute | FileCheck %s
// RUN: kiln-opt %s -split-input-file -kiln-autodiff -kiln-recompute=mode=none | FileCheck %s --check-prefix=NONE

// The GELU output that the weight gradient of the second matmul needs is computed again in
// the backward pass; the forward copy is then only used by the forward matmul.
// CHECK-LABEL: func.func @micro_step
// CHECK: %[[H:.*]] = kiln.matmul
// CHECK: %[[G:.*]] = kiln.gelu %[[H]] : tensor<4x8xf32>
// CHECK: kiln.matmul %[[G]], %{{.*}} : tensor<4x8xf32>, tensor<8x8xf32>
// CHECK: kiln.reduce_sum
// CHECK: %[[G2:.*]] = kiln.gelu %[[H]] {kiln.recomputed} : tensor<4x8xf32>
// CHECK: kiln.matmul %[[G2]], %{{.*}} {transpose_lhs}
// NONE-LABEL: func.func @micro_step
// NONE-NOT: kiln.recomputed
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @w1 : tensor<8x8xf32> {init = "zeros"}
kiln.parameter @w2 : tensor<8x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %w1 = kiln.param @w1 : tensor<8x8xf32>
  %w2 = kiln.param @w2 : tensor<8x8xf32>
  %h = kiln.matmul %x, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = kiln.gelu %h : tensor<4x8xf32>
  %y = kiln.matmul %g, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %l = kiln.reduce_sum %y : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// The GELU output is read twice in the backward pass (two weight-gradient matmuls): the copy
// is made before the first of them, and both read it.
// CHECK-LABEL: func.func @micro_step
// CHECK: kiln.reduce_sum
// CHECK: %[[G2:.*]] = kiln.gelu %{{.*}} {kiln.recomputed}
// CHECK: kiln.matmul %[[G2]], %{{.*}} {transpose_lhs}
// CHECK: kiln.matmul %[[G2]], %{{.*}} {transpose_lhs}
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @w1 : tensor<8x8xf32> {init = "zeros"}
kiln.parameter @w2 : tensor<8x8xf32> {init = "zeros"}
kiln.parameter @w3 : tensor<8x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %w1 = kiln.param @w1 : tensor<8x8xf32>
  %w2 = kiln.param @w2 : tensor<8x8xf32>
  %w3 = kiln.param @w3 : tensor<8x8xf32>
  %h = kiln.matmul %x, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = kiln.gelu %h : tensor<4x8xf32>
  %y = kiln.matmul %g, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %z = kiln.matmul %g, %w3 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %s = kiln.add %y, %z : tensor<4x8xf32>
  %l = kiln.reduce_sum %s : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
