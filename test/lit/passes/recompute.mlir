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

// -----

// A layer-norm output is recomputed like a GELU's: the weight gradient of the matmul reads a
// copy; the statistics are kept, and layer_norm_grad reads the forward op's mean and rstd.
// CHECK-LABEL: func.func @micro_step
// CHECK: %[[Y:[a-z0-9_]+]], %[[MEAN:[a-z0-9_]+]], %[[RSTD:[a-z0-9_]+]] = kiln.layer_norm %{{.*}}, %{{.*}}, %{{.*}} :
// CHECK: kiln.matmul %[[Y]], %{{.*}} : tensor<4x8xf32>, tensor<8x8xf32>
// CHECK: kiln.reduce_sum
// CHECK: %[[Y2:[a-z0-9_]+]], %{{.*}}, %{{.*}} = kiln.layer_norm %{{.*}}, %{{.*}}, %{{.*}} {kiln.recomputed}
// CHECK-NEXT: kiln.matmul %[[Y2]], %{{.*}} {transpose_lhs}
// CHECK-NEXT: kiln.layer_norm_grad %{{.*}}, %{{.*}}, %{{.*}}, %[[MEAN]], %[[RSTD]] :
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @g : tensor<8xf32> {init = "ones"}
kiln.parameter @b : tensor<8xf32> {init = "zeros"}
kiln.parameter @w : tensor<8x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %g = kiln.param @g : tensor<8xf32>
  %b = kiln.param @b : tensor<8xf32>
  %w = kiln.param @w : tensor<8x8xf32>
  %y, %mean, %rstd = kiln.layer_norm %x, %g, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %h = kiln.matmul %y, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %l = kiln.reduce_sum %h : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A GELU output that only the loss reads (gelu_grad reads the input) has no backward use: nothing
// is recomputed, and the loss keeps reading the forward copy.
// CHECK-LABEL: func.func @micro_step
// CHECK: %[[G:.*]] = kiln.gelu %{{.*}} : tensor<4x8xf32>
// CHECK-NEXT: kiln.reduce_sum %[[G]]
// CHECK-NOT: kiln.recomputed
// CHECK: return
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %g = kiln.gelu %x : tensor<4x8xf32>
  %l = kiln.reduce_sum %g : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// The op that computes the loss is the last of the forward pass, not a candidate, even when it is
// a GELU: the return reads the loss itself, not a copy made after the backward pass.
// CHECK-LABEL: func.func @micro_step
// CHECK: %[[L:.*]] = kiln.gelu %{{.*}} : tensor<f32>
// CHECK-NOT: kiln.recomputed
// CHECK: return %[[L]] : tensor<f32>
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %s = kiln.reduce_sum %x : tensor<4x8xf32> -> tensor<f32>
  %l = kiln.gelu %s : tensor<f32>
  return %l : tensor<f32>
}
