// RUN: kiln-opt %s -kiln-fuse-kernels -mlir-print-debuginfo -mlir-print-local-scope | FileCheck %s

// A kernel takes its anchor op's location (the product's, where the model's layer is named),
// not that of the accumulation it ends with, which is where it is placed and what it yields.
// CHECK-LABEL: func.func @weight_grad
// CHECK: kiln.fusion "matmul" "matmul_accumulate_grad"
// CHECK: kiln.yield loc("h.0.acc")
// CHECK-NEXT: } loc("h.0.mlp.fc")
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
func.func @weight_grad(%x: tensor<8x4xf32>, %dy: tensor<8x16xf32>) {
  %dw = kiln.matmul %x, %dy {transpose_lhs} : tensor<8x4xf32>, tensor<8x16xf32> -> tensor<4x16xf32> loc("h.0.mlp.fc")
  kiln.accumulate_grad @w, %dw : tensor<4x16xf32> loc("h.0.acc")
  return
}
