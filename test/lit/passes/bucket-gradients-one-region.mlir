// RUN: kiln-opt %s -split-input-file -kiln-bucket-gradients=bucket-mb=0.0000001 | FileCheck %s
// (bucket-gradients.mlir derives its @micro_step; this one is written out, with a region that
// accumulates two gradients, at a cap that each alone is over.)

// A region that finishes two gradients closes one bucket after it, even when each gradient alone
// is over the cap (two closes would both land right after the region, out of bucket order).
// CHECK-LABEL: func.func @micro_step
// CHECK: kiln.fusion
// CHECK: kiln.reduce_gradients [@a, @b] {bucket = 0 : i64}
// CHECK-NOT: kiln.reduce_gradients
kiln.parameter @a : tensor<16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @micro_step(%d: tensor<16xf32>) {
  kiln.fusion "elementwise" "gelu_accumulate_grad"(%d) : (tensor<16xf32>) -> () {
  ^bb0(%x: tensor<16xf32>):
    %g = kiln.gelu %x : tensor<16xf32>
    kiln.accumulate_grad @a, %g : tensor<16xf32>
    kiln.accumulate_grad @b, %x : tensor<16xf32>
    kiln.yield
  }
  return
}
