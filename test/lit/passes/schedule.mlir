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

// -----

// A read of a gradient buffer stays before a later accumulation that writes it, even where the
// accumulation, once ready, would free more (its operand's last use) than the read does.
// CHECK-LABEL: func.func @read_before_write
// CHECK: kiln.accumulate_grad @u
// CHECK-NEXT: kiln.grad @w
// CHECK-NEXT: kiln.accumulate_grad @w
kiln.parameter @u : tensor<64xf32> {init = "zeros"}
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
kiln.parameter @p : tensor<64xf32> {init = "zeros"}
kiln.parameter @q : tensor<64xf32> {init = "zeros"}
func.func @read_before_write() -> tensor<f32> {
  %p = kiln.param @p : tensor<64xf32>
  %a = kiln.broadcast %p : tensor<64xf32> -> tensor<256x64xf32>
  %q = kiln.param @q : tensor<64xf32>
  %c = kiln.broadcast %q : tensor<64xf32> -> tensor<256x64xf32>
  %ra = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<64xf32>
  %rc = kiln.reduce_sum %c : tensor<256x64xf32> -> tensor<64xf32>
  kiln.accumulate_grad @u, %rc : tensor<64xf32>
  %g = kiln.grad @w : tensor<64xf32>
  kiln.accumulate_grad @w, %ra : tensor<64xf32>
  %s = kiln.add %g, %rc : tensor<64xf32>
  %l = kiln.reduce_sum %s : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A user's price is updated when an operand becomes its to free: once the scalar sum has read
// %a, the other sum frees %a's 64 KiB and runs before the broadcast (252 bytes, 256 bytes
// before %a's earlier use ran). The order written keeps %a live under the broadcast.
// CHECK-LABEL: func.func @reprice
// CHECK: %[[A:.*]] = kiln.broadcast
// CHECK-NEXT: %[[X:.*]] = kiln.reduce_sum %[[A]] : tensor<256x64xf32> -> tensor<f32>
// CHECK-NEXT: kiln.reduce_sum %[[A]] : tensor<256x64xf32> -> tensor<64xf32>
// CHECK-NEXT: kiln.broadcast %[[X]]
kiln.parameter @p : tensor<64xf32> {init = "zeros"}
func.func @reprice() -> tensor<64xf32> {
  %p = kiln.param @p : tensor<64xf32>
  %a = kiln.broadcast %p : tensor<64xf32> -> tensor<256x64xf32>
  %x = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<f32>
  %c = kiln.broadcast %x : tensor<f32> -> tensor<64xf32>
  %y = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<64xf32>
  %s = kiln.add %c, %y : tensor<64xf32>
  return %s : tensor<64xf32>
}

// -----

// A returned value stays live to the end: finishing %a's reduction first frees nothing, so the
// greedy order reaches the same peak as the order written (both broadcasts live at once), which
// is kept.
// CHECK-LABEL: func.func @returned_stays_live
// CHECK: kiln.broadcast
// CHECK-NEXT: kiln.broadcast
// CHECK-NEXT: kiln.reduce_sum
// CHECK-NEXT: kiln.reduce_sum
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
kiln.parameter @v : tensor<64xf32> {init = "zeros"}
func.func @returned_stays_live() -> (tensor<256x64xf32>, tensor<64xf32>) {
  %w = kiln.param @w : tensor<64xf32>
  %v = kiln.param @v : tensor<64xf32>
  %a = kiln.broadcast %w : tensor<64xf32> -> tensor<256x64xf32>
  %b = kiln.broadcast %v : tensor<64xf32> -> tensor<256x64xf32>
  %ra = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<64xf32>
  %rb = kiln.reduce_sum %b : tensor<256x64xf32> -> tensor<64xf32>
  %s = kiln.add %ra, %rb : tensor<64xf32>
  return %a, %s : tensor<256x64xf32>, tensor<64xf32>
}

// -----

// A parameter read allocates nothing (the value lives outside the arena): it runs as soon as
// the reads before it have, ahead of ops that allocate, even where it is the largest value.
// CHECK-LABEL: func.func @param_read_is_free
// CHECK: kiln.param @w
// CHECK-NEXT: kiln.param @v
// CHECK-NEXT: kiln.param @big
// CHECK-NEXT: kiln.zeros
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
kiln.parameter @v : tensor<64xf32> {init = "zeros"}
kiln.parameter @big : tensor<256x64xf32> {init = "zeros"}
func.func @param_read_is_free() -> tensor<f32> {
  %w = kiln.param @w : tensor<64xf32>
  %v = kiln.param @v : tensor<64xf32>
  %a = kiln.broadcast %w : tensor<64xf32> -> tensor<256x64xf32>
  %b = kiln.broadcast %v : tensor<64xf32> -> tensor<256x64xf32>
  %ra = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<64xf32>
  %rb = kiln.reduce_sum %b : tensor<256x64xf32> -> tensor<64xf32>
  %z = kiln.zeros : tensor<64xf32>
  %big = kiln.param @big : tensor<256x64xf32>
  %rbig = kiln.reduce_sum %big : tensor<256x64xf32> -> tensor<64xf32>
  %s = kiln.add %ra, %rb : tensor<64xf32>
  %t = kiln.add %s, %z : tensor<64xf32>
  %u = kiln.add %t, %rbig : tensor<64xf32>
  %l = kiln.reduce_sum %u : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// An op that reads a value twice frees it when both its uses are the last (and is priced
// again when they become so): once the scalar sum has read %a, the square of %a costs nothing
// and runs before the broadcast of the sum.
// CHECK-LABEL: func.func @read_twice
// CHECK: %[[X:.*]] = kiln.reduce_sum %[[A:.*]] : tensor<256x64xf32> -> tensor<f32>
// CHECK-NEXT: kiln.mul %[[A]], %[[A]]
// CHECK-NEXT: kiln.reduce_sum
// CHECK-NEXT: kiln.broadcast %[[X]]
kiln.parameter @p : tensor<64xf32> {init = "zeros"}
func.func @read_twice() -> tensor<64xf32> {
  %p = kiln.param @p : tensor<64xf32>
  %a = kiln.broadcast %p : tensor<64xf32> -> tensor<256x64xf32>
  %x = kiln.reduce_sum %a : tensor<256x64xf32> -> tensor<f32>
  %c = kiln.broadcast %x : tensor<f32> -> tensor<64xf32>
  %y = kiln.mul %a, %a : tensor<256x64xf32>
  %ry = kiln.reduce_sum %y : tensor<256x64xf32> -> tensor<64xf32>
  %s = kiln.add %c, %ry : tensor<64xf32>
  return %s : tensor<64xf32>
}

// -----

// A result nobody reads is freed as soon as it is made, in the peak of either order. Written
// first, the 4 KiB zeros sets the peak alone; the greedy order makes it last, beside the loss,
// which is a higher peak, so the written order stays. (Were the zeros counted live for ever,
// the written order's peak would add everything after it, and the greedy order would win.)
// CHECK-LABEL: func.func @forward
// CHECK: kiln.zeros : tensor<1024xf32>
// CHECK-NEXT: kiln.zeros : tensor<16xf32>
// CHECK-NEXT: kiln.add
// CHECK-NEXT: kiln.reduce_sum
func.func @forward() -> tensor<f32> {
  %unread = kiln.zeros : tensor<1024xf32>
  %x = kiln.zeros : tensor<16xf32>
  %y = kiln.add %x, %x : tensor<16xf32>
  %l = kiln.reduce_sum %y : tensor<16xf32> -> tensor<f32>
  return %l : tensor<f32>
}
