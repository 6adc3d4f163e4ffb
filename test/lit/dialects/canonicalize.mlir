// RUN: kiln-opt %s -split-input-file -canonicalize -cse | FileCheck %s

// Folding of kiln.reshape and CSE of state reads, as the step pipeline relies on.

// A reshape to its own type folds away.
// CHECK-LABEL: func.func @reshape_identity
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NOT:     kiln.reshape
// CHECK:         return %[[X]]
func.func @reshape_identity(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// A reshape of a reshape becomes one reshape of the original value.
// CHECK-LABEL: func.func @reshape_chain
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NEXT:    %[[R:.*]] = kiln.reshape %[[X]] : tensor<4x8xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    return %[[R]]
func.func @reshape_chain(%x: tensor<4x8xf32>) -> tensor<2x16xf32> {
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %1 = kiln.reshape %0 : tensor<32xf32> -> tensor<2x16xf32>
  return %1 : tensor<2x16xf32>
}

// -----

// A chain of three reshapes collapses to one (i32 tensors reshape too).
// CHECK-LABEL: func.func @reshape_chain3
// CHECK-SAME:    (%[[X:.*]]: tensor<2x3x4xi32>)
// CHECK-NEXT:    %[[R:.*]] = kiln.reshape %[[X]] : tensor<2x3x4xi32> -> tensor<4x6xi32>
// CHECK-NEXT:    return %[[R]]
func.func @reshape_chain3(%x: tensor<2x3x4xi32>) -> tensor<4x6xi32> {
  %0 = kiln.reshape %x : tensor<2x3x4xi32> -> tensor<24xi32>
  %1 = kiln.reshape %0 : tensor<24xi32> -> tensor<6x4xi32>
  %2 = kiln.reshape %1 : tensor<6x4xi32> -> tensor<4x6xi32>
  return %2 : tensor<4x6xi32>
}

// -----

// A reshape there and back again disappears entirely.
// CHECK-LABEL: func.func @reshape_round_trip
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-NOT:     kiln.reshape
// CHECK:         return %[[X]]
func.func @reshape_round_trip(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %1 = kiln.reshape %0 : tensor<32xf32> -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// -----

// When the inner reshape has another use it stays; the outer one reads the original value.
// CHECK-LABEL: func.func @reshape_chain_shared
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK-DAG:     %[[A:.*]] = kiln.reshape %[[X]] : tensor<4x8xf32> -> tensor<32xf32>
// CHECK-DAG:     %[[B:.*]] = kiln.reshape %[[X]] : tensor<4x8xf32> -> tensor<2x16xf32>
// CHECK:         return %[[A]], %[[B]]
func.func @reshape_chain_shared(%x: tensor<4x8xf32>) -> (tensor<32xf32>, tensor<2x16xf32>) {
  %0 = kiln.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %1 = kiln.reshape %0 : tensor<32xf32> -> tensor<2x16xf32>
  return %0, %1 : tensor<32xf32>, tensor<2x16xf32>
}

// -----

// Two reads of one parameter (weight tying) become one read; reads of two different
// parameters stay apart.
kiln.parameter @wte : tensor<16x8xf32> {init = "zeros"}
kiln.parameter @wpe : tensor<16x8xf32> {init = "zeros"}
// CHECK-LABEL: func.func @cse_param
// CHECK:         %[[A:.*]] = kiln.param @wte : tensor<16x8xf32>
// CHECK-NOT:     kiln.param @wte
// CHECK:         %[[B:.*]] = kiln.param @wpe : tensor<16x8xf32>
// CHECK-NOT:     kiln.param
// CHECK:         kiln.add %[[A]], %[[A]]
// CHECK:         kiln.add {{.*}}, %[[B]]
func.func @cse_param() -> tensor<16x8xf32> {
  %0 = kiln.param @wte : tensor<16x8xf32>
  %1 = kiln.param @wte : tensor<16x8xf32>
  %2 = kiln.param @wpe : tensor<16x8xf32>
  %3 = kiln.add %0, %1 : tensor<16x8xf32>
  %4 = kiln.add %3, %2 : tensor<16x8xf32>
  return %4 : tensor<16x8xf32>
}

// -----

// Duplicate hyperparameter reads become one; different names stay apart.
// CHECK-LABEL: func.func @cse_hyper
// CHECK-SAME:    (%[[X:.*]]: tensor<4xf32>)
// CHECK:         %[[LR:.*]] = kiln.hyper "lr" : tensor<f32>
// CHECK-NOT:     kiln.hyper "lr"
// CHECK:         %[[EPS:.*]] = kiln.hyper "eps" : tensor<f32>
// CHECK-NOT:     kiln.hyper
// CHECK:         %[[S0:.*]] = kiln.scale %[[X]], %[[LR]]
// CHECK:         %[[S1:.*]] = kiln.scale %[[S0]], %[[LR]]
// CHECK:         kiln.scale %[[S1]], %[[EPS]]
func.func @cse_hyper(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = kiln.hyper "lr" : tensor<f32>
  %1 = kiln.hyper "lr" : tensor<f32>
  %2 = kiln.hyper "eps" : tensor<f32>
  %3 = kiln.scale %x, %0 : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %4 = kiln.scale %3, %1 : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %5 = kiln.scale %4, %2 : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  return %5 : tensor<4xf32>
}

// -----

// Unused pure reads are dropped, but state writes (accumulate_grad) are kept.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// CHECK-LABEL: func.func @dead_reads
// CHECK-SAME:    (%[[G:.*]]: tensor<4xf32>)
// CHECK-NOT:     kiln.param
// CHECK-NOT:     kiln.hyper
// CHECK:         kiln.accumulate_grad @w, %[[G]] : tensor<4xf32>
// CHECK-NEXT:    kiln.accumulate_grad @w, %[[G]] : tensor<4xf32>
// CHECK-NEXT:    return
func.func @dead_reads(%g: tensor<4xf32>) {
  %0 = kiln.param @w : tensor<4xf32>
  %1 = kiln.hyper "lr" : tensor<f32>
  kiln.accumulate_grad @w, %g : tensor<4xf32>
  kiln.accumulate_grad @w, %g : tensor<4xf32>
  return
}

// -----

// State reads are not merged across a write of the same state: the second kiln.grad follows an
// accumulate_grad and the second kiln.param follows an adamw.
// CHECK-LABEL: func.func @reads_across_writes
// CHECK: %[[G0:.*]] = kiln.grad @w
// CHECK: kiln.accumulate_grad @w
// CHECK: %[[G1:.*]] = kiln.grad @w
// CHECK: %[[P0:.*]] = kiln.param @w
// CHECK: kiln.adamw @w
// CHECK: %[[P1:.*]] = kiln.param @w
// CHECK: return %[[G0]], %[[G1]], %[[P0]], %[[P1]]
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @reads_across_writes(%g: tensor<4xf32>, %s: tensor<f32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %0 = kiln.grad @w : tensor<4xf32>
  kiln.accumulate_grad @w, %g : tensor<4xf32>
  %1 = kiln.grad @w : tensor<4xf32>
  %2 = kiln.param @w : tensor<4xf32>
  kiln.adamw @w, %g scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
  %3 = kiln.param @w : tensor<4xf32>
  return %0, %1, %2, %3 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Casts: a cast of an fp32 parameter read becomes a read of its bf16 compute copy; an exact
// bf16 -> f32 -> bf16 round trip folds away; f32 -> bf16 -> f32 rounds, so it stays.
// CHECK-LABEL: func.func @casts
// CHECK: %[[COPY:.*]] = kiln.param @w : tensor<4xbf16>
// CHECK: %[[N:.*]] = kiln.cast %arg1 : tensor<4xf32> -> tensor<4xbf16>
// CHECK: %[[W:.*]] = kiln.cast %[[N]] : tensor<4xbf16> -> tensor<4xf32>
// CHECK: return %[[COPY]], %arg0, %[[W]]
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @casts(%h: tensor<4xbf16>, %f: tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xbf16>, tensor<4xf32>) {
  %p = kiln.param @w : tensor<4xf32>
  %c = kiln.cast %p : tensor<4xf32> -> tensor<4xbf16>
  %up = kiln.cast %h : tensor<4xbf16> -> tensor<4xf32>
  %down = kiln.cast %up : tensor<4xf32> -> tensor<4xbf16>
  %n = kiln.cast %f : tensor<4xf32> -> tensor<4xbf16>
  %w = kiln.cast %n : tensor<4xbf16> -> tensor<4xf32>
  return %c, %down, %w : tensor<4xbf16>, tensor<4xbf16>, tensor<4xf32>
}
