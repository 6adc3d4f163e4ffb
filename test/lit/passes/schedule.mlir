// RUN: kiln-opt %s -split-input-file -kiln-schedule | FileCheck %s

// Two independent chains written breadth-first keep both 64 KiB broadcasts alive at once;
// the scheduler finishes each reduction before starting the next broadcast.
// CHECK-LABEL: func.func @forward
// CHECK: %[[A:.*]] = kiln.broadcast
// CHECK-NEXT: kiln.reduce_sum %[[A]]
// CHECK-NEXT: %[[B:.*]] = kiln.broadcast
// CHECK-NEXT: kiln.reduce_sum %[[B]]
// CHECK-NEXT: kiln.add
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
kiln.parameter @v : tensor<64xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<64xf32>
  %v = kiln.param @v : tensor<64xf32>
  %a = kiln.broadcast %w : tensor<64xf32> -> tensor<256x64xf32>
  %b = kiln.broadcast %v : tensor<64xf32> -> tensor<256x64xf32>
  %ra = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<64xf32>
  %rb = kiln.reduce_sum %b : tensor<256x64xf32> -> tensor<64xf32>
  %s = kiln.add %ra, %rb : tensor<64xf32>
  %l = kiln.reduce_sum %s : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// An order that is already best stays as written, and state writes keep their order.
// CHECK-LABEL: func.func @optimizer_step
// CHECK: kiln.adamw @w
// CHECK-NEXT: kiln.adamw @v
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
kiln.parameter @v : tensor<64xf32> {init = "zeros"}
func.func @optimizer_step() -> tensor<f32> {
  %gw = kiln.grad @w : tensor<64xf32>
  %gv = kiln.grad @v : tensor<64xf32>
  %n = kiln.global_norm %gw, %gv : tensor<64xf32>, tensor<64xf32> -> tensor<f32>
  %h = kiln.hyper "lr" : tensor<f32>
  kiln.adamw @w, %gw scale %h lr %h betas(%h, %h) eps %h weight_decay %h step %h : tensor<64xf32>
  kiln.adamw @v, %gv scale %h lr %h betas(%h, %h) eps %h weight_decay %h step %h : tensor<64xf32>
  return %n : tensor<f32>
}

// -----

// A read of a gradient buffer stays after the accumulation that writes it, even when the
// scheduler reorders the rest (breadth-first broadcasts) and the read would price 0 earlier.
// CHECK-LABEL: func.func @state_order
// CHECK: kiln.accumulate_grad @w
// CHECK: kiln.grad @w
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
kiln.parameter @p : tensor<64xf32> {init = "zeros"}
kiln.parameter @q : tensor<64xf32> {init = "zeros"}
func.func @state_order() -> tensor<f32> {
  %p = kiln.param @p : tensor<64xf32>
  %a = kiln.broadcast %p : tensor<64xf32> -> tensor<256x64xf32>
  %q = kiln.param @q : tensor<64xf32>
  %c = kiln.broadcast %q : tensor<64xf32> -> tensor<256x64xf32>
  %ra = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<64xf32>
  %rc = kiln.reduce_sum %c : tensor<256x64xf32> -> tensor<64xf32>
  kiln.accumulate_grad @w, %ra : tensor<64xf32>
  %g = kiln.grad @w : tensor<64xf32>
  %s = kiln.add %g, %rc : tensor<64xf32>
  %l = kiln.reduce_sum %s : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// The greedy order (the smaller GELU first) reaches the same peak as the order written (both
// results are returned, so both stay live): the order written is kept.
// CHECK-LABEL: func.func @tie
// CHECK: %[[W:.*]] = kiln.param @w
// CHECK-NEXT: %[[V:.*]] = kiln.param @v
// CHECK-NEXT: kiln.gelu %[[W]]
// CHECK-NEXT: kiln.gelu %[[V]]
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
kiln.parameter @v : tensor<16xf32> {init = "zeros"}
func.func @tie() -> (tensor<64xf32>, tensor<16xf32>) {
  %w = kiln.param @w : tensor<64xf32>
  %v = kiln.param @v : tensor<16xf32>
  %a = kiln.gelu %w : tensor<64xf32>
  %b = kiln.gelu %v : tensor<16xf32>
  return %a, %b : tensor<64xf32>, tensor<16xf32>
}
