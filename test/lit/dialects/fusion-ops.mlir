// RUN: kiln-opt %s | kiln-opt | FileCheck %s

// A fusion region round-trips: kind, kernel name, inputs, body and yielded results.
// CHECK-LABEL: func.func @region
// CHECK: %[[R:.*]]:2 = kiln.fusion "matmul" "matmul_broadcast_add_gelu"(%arg0, %arg1, %arg2) : (tensor<8x4xf32>, tensor<4x16xf32>, tensor<16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
// CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<8x4xf32>, %[[W:.*]]: tensor<4x16xf32>, %[[B:.*]]: tensor<16xf32>):
// CHECK-NEXT: %[[M:.*]] = kiln.matmul %[[A]], %[[W]]
// CHECK-NEXT: %[[BB:.*]] = kiln.broadcast %[[B]]
// CHECK-NEXT: %[[S:.*]] = kiln.add %[[M]], %[[BB]]
// CHECK-NEXT: %[[G:.*]] = kiln.gelu %[[S]]
// CHECK-NEXT: kiln.yield %[[S]], %[[G]] : tensor<8x16xf32>, tensor<8x16xf32>
// CHECK: return %[[R]]#1
func.func @region(%x: tensor<8x4xf32>, %w: tensor<4x16xf32>, %b: tensor<16xf32>) -> tensor<8x16xf32> {
  %r:2 = kiln.fusion "matmul" "matmul_broadcast_add_gelu"(%x, %w, %b)
      : (tensor<8x4xf32>, tensor<4x16xf32>, tensor<16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  ^bb0(%a: tensor<8x4xf32>, %bw: tensor<4x16xf32>, %bb: tensor<16xf32>):
    %0 = kiln.matmul %a, %bw : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
    %1 = kiln.broadcast %bb : tensor<16xf32> -> tensor<8x16xf32>
    %2 = kiln.add %0, %1 : tensor<8x16xf32>
    %3 = kiln.gelu %2 : tensor<8x16xf32>
    kiln.yield %2, %3 : tensor<8x16xf32>, tensor<8x16xf32>
  }
  return %r#1 : tensor<8x16xf32>
}

// A region with no results that writes gradient state.
// CHECK-LABEL: func.func @no_results
// CHECK: kiln.fusion "embedding_grad" "embedding_grad_accumulate_grad"(%arg0, %arg1) : (tensor<4x8xf32>, tensor<4xi32>) -> () {
// CHECK: kiln.accumulate_grad @wte
// CHECK-NEXT: kiln.yield
// CHECK-NEXT: }
kiln.parameter @wte : tensor<16x8xf32> {init = "zeros"}
func.func @no_results(%d: tensor<4x8xf32>, %i: tensor<4xi32>) {
  kiln.fusion "embedding_grad" "embedding_grad_accumulate_grad"(%d, %i) : (tensor<4x8xf32>, tensor<4xi32>) -> () {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<4xi32>):
    %g = kiln.embedding_grad %a, %b : tensor<4x8xf32>, tensor<4xi32> -> tensor<16x8xf32>
    kiln.accumulate_grad @wte, %g : tensor<16x8xf32>
    kiln.yield
  }
  return
}
