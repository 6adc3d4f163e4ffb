// RUN: kiln-opt %s -split-input-file -kiln-fuse-kernels | FileCheck %s
// RUN: kiln-opt %s -split-input-file '-kiln-fuse-kernels=single-ops=true' | FileCheck %s --check-prefix=SINGLE

// Matmul epilogue: bias (a broadcast 1-D vector), GELU; the pre-activation is still read later
// (by the GELU backward), so the region gives it out too.
// CHECK-LABEL: func.func @matmul_bias_gelu
// CHECK: %[[R:.*]]:2 = kiln.fusion "matmul" "matmul_broadcast_add_gelu"(%{{.*}}, %{{.*}}, %{{.*}})
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.matmul
// CHECK-NEXT: kiln.broadcast
// CHECK-NEXT: kiln.add
// CHECK-NEXT: kiln.gelu
// CHECK-NEXT: kiln.yield
// CHECK: kiln.gelu_grad %{{.*}}, %[[R]]#0
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @matmul_bias_gelu(%x: tensor<8x4xf32>, %dy: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %w = kiln.param @w : tensor<4x16xf32>
  %b = kiln.param @b : tensor<16xf32>
  %0 = kiln.matmul %x, %w : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
  %1 = kiln.broadcast %b : tensor<16xf32> -> tensor<8x16xf32>
  %2 = kiln.add %0, %1 : tensor<8x16xf32>
  %3 = kiln.gelu %2 : tensor<8x16xf32>
  %4 = kiln.gelu_grad %dy, %2 : tensor<8x16xf32>
  return %3, %4 : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Matmul epilogue: bias, cast to fp32 and the residual add (the residual stream is an input).
// CHECK-LABEL: func.func @matmul_residual
// CHECK: kiln.fusion "matmul" "matmul_broadcast_add_cast"(%{{.*}}, %{{.*}}, %{{.*}}, %arg1)
// CHECK: kiln.add
// CHECK: kiln.cast
// CHECK: kiln.add
// CHECK: kiln.yield
// CHECK-NOT: kiln.add
kiln.parameter @w : tensor<4x16xbf16> {init = "zeros"}
kiln.parameter @b : tensor<16xbf16> {init = "zeros"}
func.func @matmul_residual(%x: tensor<8x4xbf16>, %res: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %w = kiln.param @w : tensor<4x16xbf16>
  %b = kiln.param @b : tensor<16xbf16>
  %0 = kiln.matmul %x, %w : tensor<8x4xbf16>, tensor<4x16xbf16> -> tensor<8x16xbf16>
  %1 = kiln.broadcast %b : tensor<16xbf16> -> tensor<8x16xbf16>
  %2 = kiln.add %0, %1 : tensor<8x16xbf16>
  %3 = kiln.cast %2 : tensor<8x16xbf16> -> tensor<8x16xf32>
  %4 = kiln.add %res, %3 : tensor<8x16xf32>
  return %4 : tensor<8x16xf32>
}

// -----

// A residual add whose sum a layer norm normalises joins the layer norm (with the cast in front
// of it), not the product: the product ends at its bias, in its own type (bf16), as cuBLASLt's
// bias epilogue needs; the layer norm reads both operands anyway.
// CHECK-LABEL: func.func @residual_into_layer_norm
// CHECK: %[[P:.*]] = kiln.fusion "matmul" "matmul_broadcast_add"
// CHECK: kiln.yield
// CHECK: %[[L:.*]]:2 = kiln.fusion "layer_norm" "cast_add_layer_norm"(%[[P]], %arg1
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.cast
// CHECK-NEXT: kiln.add
// CHECK-NEXT: kiln.layer_norm
// CHECK-NEXT: kiln.yield
// CHECK: return %[[L]]#0, %[[L]]#1
kiln.parameter @w : tensor<4x16xbf16> {init = "zeros"}
kiln.parameter @b : tensor<16xbf16> {init = "zeros"}
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @c : tensor<16xf32> {init = "zeros"}
func.func @residual_into_layer_norm(%x: tensor<8x4xbf16>, %res: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %w = kiln.param @w : tensor<4x16xbf16>
  %b = kiln.param @b : tensor<16xbf16>
  %g = kiln.param @g : tensor<16xf32>
  %c = kiln.param @c : tensor<16xf32>
  %0 = kiln.matmul %x, %w : tensor<8x4xbf16>, tensor<4x16xbf16> -> tensor<8x16xbf16>
  %1 = kiln.broadcast %b : tensor<16xbf16> -> tensor<8x16xbf16>
  %2 = kiln.add %0, %1 : tensor<8x16xbf16>
  %3 = kiln.cast %2 : tensor<8x16xbf16> -> tensor<8x16xf32>
  %4 = kiln.add %res, %3 : tensor<8x16xf32>
  %o, %m, %r = kiln.layer_norm %4, %g, %c : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>, tensor<8xf32>, tensor<8xf32>
  return %4, %o : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Weight gradient: dW = x^T dy accumulated, with the bias gradient (the row sum of dy) in the
// same kernel.
// CHECK-LABEL: func.func @weight_and_bias_grad
// CHECK: kiln.fusion "matmul" "reduce_sum_accumulate_grad_matmul"(%arg1, %arg0) : (tensor<8x16xf32>, tensor<8x4xf32>) -> () {
// CHECK: kiln.reduce_sum
// CHECK: kiln.accumulate_grad @b
// CHECK: kiln.matmul {{.*}} {transpose_lhs}
// CHECK: kiln.accumulate_grad @w
// CHECK-NEXT: kiln.yield
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @weight_and_bias_grad(%x: tensor<8x4xf32>, %dy: tensor<8x16xf32>) {
  %db = kiln.reduce_sum %dy : tensor<8x16xf32> -> tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %dw = kiln.matmul %x, %dy {transpose_lhs} : tensor<8x4xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  kiln.accumulate_grad @w, %dw : tensor<4x16xf32>
  return
}

// -----

// Layer norm with the residual add that produces its input; the sum is still read afterwards.
// CHECK-LABEL: func.func @residual_layer_norm
// CHECK: %[[R:.*]]:2 = kiln.fusion "layer_norm" "add_layer_norm"
// CHECK: kiln.add
// CHECK: kiln.layer_norm
// CHECK: kiln.yield
// CHECK: return %[[R]]#0, %[[R]]#1
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @residual_layer_norm(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %g = kiln.param @g : tensor<16xf32>
  %b = kiln.param @b : tensor<16xf32>
  %s = kiln.add %x, %y : tensor<8x16xf32>
  %o, %m, %r = kiln.layer_norm %s, %g, %b : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>, tensor<8xf32>, tensor<8xf32>
  return %s, %o : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Layer-norm backward with the residual-gradient add, the accumulation of dw and db and the
// cast of the gradient that leaves (they interleave in program order).
// CHECK-LABEL: func.func @layer_norm_grad
// CHECK: %[[R:.*]]:2 = kiln.fusion "layer_norm_grad" "layer_norm_grad_add_accumulate_grad_cast"
// CHECK: kiln.layer_norm_grad
// CHECK: kiln.add
// CHECK: kiln.accumulate_grad @g
// CHECK: kiln.accumulate_grad @b
// CHECK: kiln.cast
// CHECK: kiln.yield
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @layer_norm_grad(%dy: tensor<8x16xbf16>, %x: tensor<8x16xf32>, %m: tensor<8xf32>, %r: tensor<8xf32>, %dres: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xbf16>) {
  %g = kiln.param @g : tensor<16xf32>
  %dx, %dg, %db = kiln.layer_norm_grad %dy, %x, %g, %m, %r : tensor<8x16xbf16>, tensor<8x16xf32>, tensor<16xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32>
  %s = kiln.add %dres, %dx : tensor<8x16xf32>
  kiln.accumulate_grad @g, %dg : tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %c = kiln.cast %s : tensor<8x16xf32> -> tensor<8x16xbf16>
  return %s, %c : tensor<8x16xf32>, tensor<8x16xbf16>
}

// -----

// A gradient widened before the layer-norm backward (a layer norm whose fp32 output a matmul
// read through a cast) is cast by a kernel of its own: the template reads the gradient as is.
// CHECK-LABEL: func.func @layer_norm_grad_of_cast
// CHECK: kiln.cast
// CHECK: kiln.fusion "layer_norm_grad" "layer_norm_grad_accumulate_grad"
// CHECK-NOT: kiln.cast
// CHECK: kiln.yield
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @layer_norm_grad_of_cast(%dy: tensor<8x16xbf16>, %x: tensor<8x16xf32>, %m: tensor<8xf32>, %r: tensor<8xf32>) -> tensor<8x16xf32> {
  %g = kiln.param @g : tensor<16xf32>
  %w = kiln.cast %dy : tensor<8x16xbf16> -> tensor<8x16xf32>
  %dx, %dg, %db = kiln.layer_norm_grad %w, %x, %g, %m, %r : tensor<8x16xf32>, tensor<8x16xf32>, tensor<16xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32>
  kiln.accumulate_grad @g, %dg : tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  return %dx : tensor<8x16xf32>
}

// -----

// The gradient of a bf16 table (widened for the gather) is the scattered fp32 rows, narrowed by a
// kernel of its own: the embedding_grad template only scatters (and accumulates).
// CHECK-LABEL: func.func @embedding_grad_of_cast
// CHECK-NEXT: kiln.embedding_grad
// CHECK-NEXT: kiln.cast %{{.*}} : tensor<16x8xf32> -> tensor<16x8xbf16>
// SINGLE-LABEL: func.func @embedding_grad_of_cast
// SINGLE: kiln.fusion "embedding_grad" "embedding_grad"
// SINGLE-NOT: kiln.cast
// SINGLE: kiln.yield
// SINGLE: kiln.fusion "elementwise" "cast"
func.func @embedding_grad_of_cast(%dy: tensor<2x4x8xf32>, %idx: tensor<2x4xi32>) -> tensor<16x8xbf16> {
  %g = kiln.embedding_grad %dy, %idx : tensor<2x4x8xf32>, tensor<2x4xi32> -> tensor<16x8xf32>
  %c = kiln.cast %g : tensor<16x8xf32> -> tensor<16x8xbf16>
  return %c : tensor<16x8xbf16>
}

// -----

// The scattered rows' accumulation into the gradient joins the embedding_grad kernel.
// CHECK-LABEL: func.func @embedding_grad_accumulate
// CHECK-NEXT: kiln.fusion "embedding_grad" "embedding_grad_accumulate_grad"
// CHECK: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: return
kiln.parameter @wte : tensor<16x8xf32> {init = "zeros"}
func.func @embedding_grad_accumulate(%dy: tensor<2x4x8xf32>, %idx: tensor<2x4xi32>) {
  %g = kiln.embedding_grad %dy, %idx : tensor<2x4x8xf32>, tensor<2x4xi32> -> tensor<16x8xf32>
  kiln.accumulate_grad @wte, %g : tensor<16x8xf32>
  return
}

// -----

// The fused classifier: loss and logits gradient in one kernel; the log-sum-exp stays inside.
// CHECK-LABEL: func.func @classifier
// CHECK: %[[R:.*]]:2 = kiln.fusion "classifier" "cross_entropy_cross_entropy_grad"(%arg0, %arg1, %arg2)
// CHECK: kiln.yield %{{.*}}, %{{.*}} : tensor<f32>, tensor<8x128xf32>
// CHECK: return %[[R]]#0, %[[R]]#1
func.func @classifier(%logits: tensor<8x128xf32>, %t: tensor<8xi32>, %w: tensor<f32>) -> (tensor<f32>, tensor<8x128xf32>) {
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<8x128xf32>, tensor<8xi32> -> tensor<f32>, tensor<8xf32>
  %d = kiln.cross_entropy_grad %w, %logits, %lse, %t : tensor<8x128xf32>, tensor<8xf32>, tensor<8xi32> -> tensor<8x128xf32>
  return %loss, %d : tensor<f32>, tensor<8x128xf32>
}

// -----

// The loss alone (evaluation's forward) is a classifier region even without single-ops, and
// gives out the log-sum-exp that is read after it.
// CHECK-LABEL: func.func @loss_alone
// CHECK: %[[R:.*]]:2 = kiln.fusion "classifier" "cross_entropy"(%arg0, %arg1)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: kiln.cross_entropy
// CHECK-NEXT: kiln.yield %{{.*}}, %{{.*}} : tensor<f32>, tensor<8xf32>
// CHECK: return %[[R]]#0, %[[R]]#1
func.func @loss_alone(%logits: tensor<8x128xf32>, %t: tensor<8xi32>) -> (tensor<f32>, tensor<8xf32>) {
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<8x128xf32>, tensor<8xi32> -> tensor<f32>, tensor<8xf32>
  return %loss, %lse : tensor<f32>, tensor<8xf32>
}

// -----

// The encoder: two gathers, a broadcast and an add in one elementwise kernel.
// CHECK-LABEL: func.func @encoder
// CHECK: kiln.fusion "elementwise" "embedding_iota_broadcast_add"(%{{.*}}, %{{.*}}, %{{.*}})
// CHECK: kiln.embedding
// CHECK: kiln.iota
// CHECK: kiln.embedding
// CHECK: kiln.broadcast
// CHECK: kiln.add
// CHECK-NEXT: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: return
kiln.parameter @wte : tensor<32x16xf32> {init = "zeros"}
kiln.parameter @wpe : tensor<8x16xf32> {init = "zeros"}
func.func @encoder(%idx: tensor<2x8xi32>) -> tensor<2x8x16xf32> {
  %wte = kiln.param @wte : tensor<32x16xf32>
  %wpe = kiln.param @wpe : tensor<8x16xf32>
  %tok = kiln.embedding %wte[%idx] : tensor<32x16xf32>, tensor<2x8xi32> -> tensor<2x8x16xf32>
  %pos = kiln.iota : tensor<8xi32>
  %p = kiln.embedding %wpe[%pos] : tensor<8x16xf32>, tensor<8xi32> -> tensor<8x16xf32>
  %pb = kiln.broadcast %p : tensor<8x16xf32> -> tensor<2x8x16xf32>
  %s = kiln.add %tok, %pb : tensor<2x8x16xf32>
  return %s : tensor<2x8x16xf32>
}

// -----

// Must not fuse: a consumer that needs the whole reduced tensor. The row sum is a reduction, so
// the add that reads its broadcast runs after it in a kernel of its own; only the broadcast and
// the add fuse.
// CHECK-LABEL: func.func @whole_reduction
// CHECK: kiln.gelu
// CHECK-NEXT: kiln.reduce_sum
// CHECK-NEXT: kiln.fusion "elementwise" "broadcast_add"
// With single-ops the GELU and the reduction are regions of their own.
// SINGLE-LABEL: func.func @whole_reduction
// SINGLE: kiln.fusion "elementwise" "gelu"
// SINGLE: kiln.fusion "reduce_sum" "reduce_sum"
// SINGLE: kiln.fusion "elementwise" "broadcast_add"
func.func @whole_reduction(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %g = kiln.gelu %x : tensor<8x16xf32>
  %s = kiln.reduce_sum %g : tensor<8x16xf32> -> tensor<16xf32>
  %b = kiln.broadcast %s : tensor<16xf32> -> tensor<8x16xf32>
  %y = kiln.add %g, %b : tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}

// -----

// Must not fuse: a cycle. The matmul's epilogue add is after an op (the attention) that reads
// the matmul's result and feeds the add, so the region would both feed and need it.
// CHECK-LABEL: func.func @cycle
// CHECK: kiln.matmul
// CHECK-NEXT: kiln.reshape
// CHECK-NEXT: kiln.attention
// CHECK: kiln.add
// CHECK-NOT: kiln.fusion
func.func @cycle(%x: tensor<8x12xf32>, %w: tensor<12x12xf32>) -> tensor<8x12xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x12xf32>, tensor<12x12xf32> -> tensor<8x12xf32>
  %1 = kiln.reshape %0 : tensor<8x12xf32> -> tensor<1x8x12xf32>
  %2, %lse = kiln.attention %1 {num_heads = 2} : tensor<1x8x12xf32> -> tensor<1x8x4xf32>, tensor<1x2x8xf32>
  %3 = kiln.reshape %2 : tensor<1x8x4xf32> -> tensor<8x4xf32>
  %4 = kiln.concat %3, %3, %3 : tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32> -> tensor<8x12xf32>
  %5 = kiln.add %0, %4 : tensor<8x12xf32>
  return %5 : tensor<8x12xf32>
}

// -----

// Must not fuse: moving an effect past another. The bucket's reduction of @b sits between the
// bias gradient and the weight gradient, so the bias gradient stays out of the matmul's kernel.
// CHECK-LABEL: func.func @effect_order
// CHECK: kiln.reduce_sum
// CHECK-NEXT: kiln.accumulate_grad @b
// CHECK-NEXT: kiln.reduce_gradients
// CHECK-NEXT: kiln.fusion "matmul" "matmul_accumulate_grad"
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @effect_order(%x: tensor<8x4xf32>, %dy: tensor<8x16xf32>) {
  %db = kiln.reduce_sum %dy : tensor<8x16xf32> -> tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  kiln.reduce_gradients [@b] {bucket = 0 : i64}
  %dw = kiln.matmul %x, %dy {transpose_lhs} : tensor<8x4xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  kiln.accumulate_grad @w, %dw : tensor<4x16xf32>
  return
}

// -----

// The optimizer: clipping and every AdamW update in one kernel; the global norm stays its own.
// CHECK-LABEL: func.func @optimizer_step
// CHECK: kiln.global_norm
// CHECK: kiln.fusion "optimizer" "clip_coef_adamw"
// CHECK: kiln.clip_coef
// CHECK: kiln.adamw @w
// CHECK: kiln.adamw @b
// CHECK: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: return
kiln.parameter @w : tensor<4x16xf32> {decay, init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @optimizer_step() -> tensor<f32> {
  %gw = kiln.grad @w : tensor<4x16xf32>
  %gb = kiln.grad @b : tensor<16xf32>
  %n = kiln.global_norm %gw, %gb : tensor<4x16xf32>, tensor<16xf32> -> tensor<f32>
  %mx = kiln.hyper "max_norm" : tensor<f32>
  %c = kiln.clip_coef %n, %mx : tensor<f32>
  %lr = kiln.hyper "lr" : tensor<f32>
  %b1 = kiln.hyper "beta1" : tensor<f32>
  %b2 = kiln.hyper "beta2" : tensor<f32>
  %e = kiln.hyper "eps" : tensor<f32>
  %wd = kiln.hyper "weight_decay" : tensor<f32>
  %t = kiln.hyper "step" : tensor<f32>
  kiln.adamw @w, %gw scale %c lr %lr betas(%b1, %b2) eps %e weight_decay %wd step %t {decay} : tensor<4x16xf32>
  kiln.adamw @b, %gb scale %c lr %lr betas(%b1, %b2) eps %e weight_decay %wd step %t : tensor<16xf32>
  return %n : tensor<f32>
}

// -----

// Must not fuse: a member that reads state moving past a write of it. The add reads the
// gradient buffer of @w, which the accumulation then changes, so the add stays before it.
// CHECK-LABEL: func.func @state_read_order
// CHECK: kiln.add
// CHECK-NEXT: kiln.accumulate_grad @w
// CHECK-NEXT: kiln.mul
kiln.parameter @w : tensor<16xf32> {init = "zeros"}
func.func @state_read_order(%x: tensor<16xf32>, %y: tensor<16xf32>) -> tensor<16xf32> {
  %g = kiln.grad @w : tensor<16xf32>
  %s = kiln.add %g, %x : tensor<16xf32>
  kiln.accumulate_grad @w, %y : tensor<16xf32>
  %t = kiln.mul %s, %y : tensor<16xf32>
  return %t : tensor<16xf32>
}

// -----

// Matmul epilogues stop where a library epilogue would: after GELU only casts follow, so the
// residual add after the GELU runs in a kernel of its own.
// CHECK-LABEL: func.func @after_gelu
// CHECK: kiln.fusion "matmul" "matmul_gelu"
// CHECK: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: kiln.add
func.func @after_gelu(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %1 = kiln.gelu %0 : tensor<8x16xf32>
  %2 = kiln.add %1, %x : tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// -----

// Must not fuse: a gather's table computed in the same kernel (it is read at data-dependent
// rows). The scaling of the table runs first; the gather and the GELU fuse.
// CHECK-LABEL: func.func @gathered_table
// CHECK: kiln.scale
// CHECK-NEXT: kiln.fusion "elementwise" "embedding_gelu"
func.func @gathered_table(%t: tensor<32x8xf32>, %s: tensor<f32>, %i: tensor<4xi32>) -> tensor<4x8xf32> {
  %0 = kiln.scale %t, %s : tensor<32x8xf32>, tensor<f32> -> tensor<32x8xf32>
  %1 = kiln.embedding %0[%i] : tensor<32x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
  %2 = kiln.gelu %1 : tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}

// -----

// An op nothing reads (a hand-edited IR's) is dropped with the ops only it read, not made a
// kernel with nothing to write; the product it would have read stays, as the result reads it.
// CHECK-LABEL: func.func @unread
// CHECK-NEXT: kiln.matmul
// CHECK-NEXT: return
// SINGLE-LABEL: func.func @unread
// SINGLE-NEXT: kiln.fusion "matmul" "matmul"
// SINGLE-NEXT: ^bb0
// SINGLE-NEXT: kiln.matmul
// SINGLE-NEXT: kiln.yield
// SINGLE-NEXT: }
// SINGLE-NEXT: return
func.func @unread(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>, %b: tensor<16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %1 = kiln.broadcast %b : tensor<16xf32> -> tensor<8x16xf32>
  %2 = kiln.add %0, %1 : tensor<8x16xf32>
  %3 = kiln.gelu %2 : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

// Must not fuse: a member that reads a parameter's value moving past the AdamW that updates it.
// CHECK-LABEL: func.func @param_read_order
// CHECK: kiln.add
// CHECK-NEXT: kiln.adamw @a
// CHECK-NEXT: kiln.mul
kiln.parameter @a : tensor<16xf32> {init = "zeros"}
func.func @param_read_order(%x: tensor<16xf32>, %g: tensor<16xf32>, %h: tensor<f32>) -> tensor<16xf32> {
  %p = kiln.param @a : tensor<16xf32>
  %s = kiln.add %p, %x : tensor<16xf32>
  kiln.adamw @a, %g scale %h lr %h betas(%h, %h) eps %h weight_decay %h step %h : tensor<16xf32>
  %t = kiln.mul %s, %x : tensor<16xf32>
  return %t : tensor<16xf32>
}

// -----

// The sum is read (by a GELU) between the add and the layer norm: moving the add down to the
// layer norm would leave that read before its definition, so the add stays where it is.
// CHECK-LABEL: func.func @read_in_between
// CHECK: %[[S:.*]] = kiln.add %arg0, %arg1
// CHECK-NEXT: kiln.gelu %[[S]]
// CHECK-NOT: "add_layer_norm"
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @c : tensor<16xf32> {init = "zeros"}
func.func @read_in_between(%a: tensor<8x16xf32>, %b: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %g = kiln.param @g : tensor<16xf32>
  %c = kiln.param @c : tensor<16xf32>
  %s = kiln.add %a, %b : tensor<8x16xf32>
  %t = kiln.gelu %s : tensor<8x16xf32>
  %o, %m, %r = kiln.layer_norm %s, %g, %c : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>, tensor<8xf32>, tensor<8xf32>
  return %t, %o : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// A GELU backward that reads the product as both dy and x does not join the epilogue.
// CHECK-LABEL: func.func @gelu_grad_of_itself
// CHECK-NOT: kiln.fusion
// CHECK: %[[M:.*]] = kiln.matmul
// CHECK-NEXT: kiln.gelu_grad %[[M]], %[[M]]
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
func.func @gelu_grad_of_itself(%x: tensor<8x4xf32>) -> tensor<8x16xf32> {
  %w = kiln.param @w : tensor<4x16xf32>
  %0 = kiln.matmul %x, %w : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
  %1 = kiln.gelu_grad %0, %0 : tensor<8x16xf32>
  return %1 : tensor<8x16xf32>
}

// -----

// A broadcast bias read again after the add stays outside the epilogue (only the add joins).
// CHECK-LABEL: func.func @shared_bias
// CHECK: kiln.broadcast
// CHECK: kiln.fusion "matmul" "matmul_add"
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @shared_bias(%x: tensor<8x4xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %w = kiln.param @w : tensor<4x16xf32>
  %b = kiln.param @b : tensor<16xf32>
  %0 = kiln.matmul %x, %w : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
  %1 = kiln.broadcast %b : tensor<16xf32> -> tensor<8x16xf32>
  %2 = kiln.add %0, %1 : tensor<8x16xf32>
  return %2, %1 : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// An elementwise chain is one kernel, grown from its last op back to its first (grown from the
// first op instead, the add and the mul would fuse and leave the GELU alone).
// CHECK-LABEL: func.func @elementwise_chain
// CHECK-NEXT: %[[R:.*]] = kiln.fusion "elementwise" "add_mul_gelu"(%arg0, %arg1, %arg2)
// CHECK: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: return %[[R]]
func.func @elementwise_chain(%x: tensor<16xf32>, %y: tensor<16xf32>, %z: tensor<16xf32>) -> tensor<16xf32> {
  %a = kiln.add %x, %y : tensor<16xf32>
  %b = kiln.mul %a, %z : tensor<16xf32>
  %c = kiln.gelu %b : tensor<16xf32>
  return %c : tensor<16xf32>
}

// -----

// A producer whose result is also read outside the chain stays out of it: the add's sum is
// returned, so only the mul and the GELU fuse (with one output).
// CHECK-LABEL: func.func @producer_read_outside
// CHECK-NEXT: %[[A:.*]] = kiln.add %arg0, %arg1
// CHECK-NEXT: %[[R:.*]] = kiln.fusion "elementwise" "mul_gelu"(%[[A]], %arg2) : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
// CHECK: return %[[A]], %[[R]]
func.func @producer_read_outside(%x: tensor<16xf32>, %y: tensor<16xf32>, %z: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>) {
  %a = kiln.add %x, %y : tensor<16xf32>
  %b = kiln.mul %a, %z : tensor<16xf32>
  %c = kiln.gelu %b : tensor<16xf32>
  return %a, %c : tensor<16xf32>, tensor<16xf32>
}

// -----

// A state read between members writes nothing: the add that reads a parameter moves past the
// gradient read to fuse with the mul.
// CHECK-LABEL: func.func @state_read_between
// CHECK: kiln.grad @w
// CHECK-NEXT: kiln.fusion "elementwise" "add_mul"
kiln.parameter @w : tensor<16xf32> {init = "zeros"}
func.func @state_read_between(%x: tensor<16xf32>) -> tensor<16xf32> {
  %p = kiln.param @w : tensor<16xf32>
  %s = kiln.add %p, %x : tensor<16xf32>
  %g = kiln.grad @w : tensor<16xf32>
  %t = kiln.mul %s, %g : tensor<16xf32>
  return %t : tensor<16xf32>
}

// -----

// Must not fuse: an op the pass does not know (a call) may write any parameter, so the add that
// reads one stays before it.
// CHECK-LABEL: func.func @param_read_before_call
// CHECK: kiln.add
// CHECK-NEXT: call @opaque
// CHECK-NEXT: kiln.mul
kiln.parameter @w : tensor<16xf32> {init = "zeros"}
func.func private @opaque()
func.func @param_read_before_call(%x: tensor<16xf32>) -> tensor<16xf32> {
  %p = kiln.param @w : tensor<16xf32>
  %s = kiln.add %p, %x : tensor<16xf32>
  func.call @opaque() : () -> ()
  %t = kiln.mul %s, %x : tensor<16xf32>
  return %t : tensor<16xf32>
}

// -----

// Must not fuse: the bucket's reduction rewrites the gradient of @w (averaged across ranks), so
// the add that reads it stays before the reduction.
// CHECK-LABEL: func.func @grad_read_before_reduce
// CHECK: kiln.add
// CHECK-NEXT: kiln.reduce_gradients [@w]
// CHECK-NEXT: kiln.mul
kiln.parameter @w : tensor<16xf32> {init = "zeros"}
func.func @grad_read_before_reduce(%x: tensor<16xf32>) -> tensor<16xf32> {
  %g = kiln.grad @w : tensor<16xf32>
  %s = kiln.add %g, %x : tensor<16xf32>
  kiln.reduce_gradients [@w] {bucket = 0 : i64}
  %t = kiln.mul %s, %x : tensor<16xf32>
  return %t : tensor<16xf32>
}

// -----

// Must not fuse: the exchange's wait writes every gradient buffer (the averages land there), so
// the add that reads one stays before it.
// CHECK-LABEL: func.func @grad_read_before_wait
// CHECK: kiln.add
// CHECK-NEXT: kiln.wait_gradients
// CHECK-NEXT: kiln.mul
kiln.parameter @w : tensor<16xf32> {init = "zeros"}
func.func @grad_read_before_wait(%x: tensor<16xf32>) -> tensor<16xf32> {
  %g = kiln.grad @w : tensor<16xf32>
  %s = kiln.add %g, %x : tensor<16xf32>
  kiln.wait_gradients
  %t = kiln.mul %s, %x : tensor<16xf32>
  return %t : tensor<16xf32>
}

// -----

// A call nothing reads may still have effects: only an unread op free of them is dropped.
// CHECK-LABEL: func.func @unread_call
// CHECK-NEXT: call @effect
// CHECK-NEXT: return
func.func private @effect() -> tensor<16xf32>
func.func @unread_call() {
  %0 = func.call @effect() : () -> tensor<16xf32>
  return
}

// -----

// Must not fuse: a member that writes state moving past another state access, even with a
// member that writes nothing in between. The bucket's reduction of @b sits after the product,
// so the bias gradient (accumulated before it) stays out of the product's kernel.
// CHECK-LABEL: func.func @effect_order_after_product
// CHECK: kiln.reduce_sum
// CHECK-NEXT: kiln.accumulate_grad @b
// CHECK-NEXT: kiln.reduce_gradients [@b]
// CHECK-NEXT: kiln.fusion "matmul" "matmul_accumulate_grad"
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @effect_order_after_product(%x: tensor<8x4xf32>, %dy: tensor<8x16xf32>) {
  %db = kiln.reduce_sum %dy : tensor<8x16xf32> -> tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %dw = kiln.matmul %x, %dy {transpose_lhs} : tensor<8x4xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  kiln.reduce_gradients [@b] {bucket = 0 : i64}
  kiln.accumulate_grad @w, %dw : tensor<4x16xf32>
  return
}

// -----

// The classifier fuses only a loss and a logits gradient over the same logits and targets whose
// log-sum-exp nothing else reads; otherwise the loss is a region alone and the gradient the
// built-in kernel.
// CHECK-LABEL: func.func @classifier_other_logits
// CHECK: kiln.fusion "classifier" "cross_entropy"(%arg0, %arg2)
// CHECK: kiln.cross_entropy_grad %arg3, %arg1,
// CHECK-LABEL: func.func @classifier_other_targets
// CHECK: kiln.fusion "classifier" "cross_entropy"(%arg0, %arg1)
// CHECK: kiln.cross_entropy_grad %arg3, %arg0, %{{.*}}, %arg2
// CHECK-LABEL: func.func @classifier_lse_read
// CHECK: %[[L:.*]]:2 = kiln.fusion "classifier" "cross_entropy"(%arg0, %arg1)
// CHECK: kiln.cross_entropy_grad %arg2, %arg0, %[[L]]#1, %arg1
func.func @classifier_other_logits(%logits: tensor<8x128xf32>, %other: tensor<8x128xf32>, %t: tensor<8xi32>, %w: tensor<f32>) -> (tensor<f32>, tensor<8x128xf32>) {
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<8x128xf32>, tensor<8xi32> -> tensor<f32>, tensor<8xf32>
  %d = kiln.cross_entropy_grad %w, %other, %lse, %t : tensor<8x128xf32>, tensor<8xf32>, tensor<8xi32> -> tensor<8x128xf32>
  return %loss, %d : tensor<f32>, tensor<8x128xf32>
}
func.func @classifier_other_targets(%logits: tensor<8x128xf32>, %t: tensor<8xi32>, %u: tensor<8xi32>, %w: tensor<f32>) -> (tensor<f32>, tensor<8x128xf32>) {
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<8x128xf32>, tensor<8xi32> -> tensor<f32>, tensor<8xf32>
  %d = kiln.cross_entropy_grad %w, %logits, %lse, %u : tensor<8x128xf32>, tensor<8xf32>, tensor<8xi32> -> tensor<8x128xf32>
  return %loss, %d : tensor<f32>, tensor<8x128xf32>
}
func.func @classifier_lse_read(%logits: tensor<8x128xf32>, %t: tensor<8xi32>, %w: tensor<f32>) -> (tensor<f32>, tensor<8x128xf32>, tensor<8xf32>) {
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<8x128xf32>, tensor<8xi32> -> tensor<f32>, tensor<8xf32>
  %d = kiln.cross_entropy_grad %w, %logits, %lse, %t : tensor<8x128xf32>, tensor<8xf32>, tensor<8xi32> -> tensor<8x128xf32>
  return %loss, %d, %lse : tensor<f32>, tensor<8x128xf32>, tensor<8xf32>
}

// -----

// Epilogues read the product once, element by element: an add or a mul of the product with
// itself, or a GELU backward that takes the product as its input x (not its incoming gradient),
// stays out of the product's kernel.
// CHECK-LABEL: func.func @product_twice
// CHECK-NOT: kiln.fusion
// CHECK: %[[M:.*]] = kiln.matmul
// CHECK-NEXT: kiln.add %[[M]], %[[M]]
// CHECK-LABEL: func.func @product_squared
// CHECK-NOT: kiln.fusion
// CHECK: %[[M:.*]] = kiln.matmul
// CHECK-NEXT: kiln.mul %[[M]], %[[M]]
// CHECK-LABEL: func.func @gelu_grad_at_product
// CHECK-NOT: kiln.fusion
// CHECK: %[[M:.*]] = kiln.matmul
// CHECK-NEXT: kiln.gelu_grad %arg1, %[[M]]
func.func @product_twice(%x: tensor<8x4xf32>, %w: tensor<4x16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
  %1 = kiln.add %0, %0 : tensor<8x16xf32>
  return %1 : tensor<8x16xf32>
}
func.func @product_squared(%x: tensor<8x4xf32>, %w: tensor<4x16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
  %1 = kiln.mul %0, %0 : tensor<8x16xf32>
  return %1 : tensor<8x16xf32>
}
func.func @gelu_grad_at_product(%x: tensor<8x4xf32>, %dy: tensor<8x16xf32>, %w: tensor<4x16xf32>) -> tensor<8x16xf32> {
  %0 = kiln.matmul %x, %w : tensor<8x4xf32>, tensor<4x16xf32> -> tensor<8x16xf32>
  %1 = kiln.gelu_grad %dy, %0 : tensor<8x16xf32>
  return %1 : tensor<8x16xf32>
}

// -----

// The layer norm's residual add is a sum of two operands: a doubling stays out. A cast in front
// of the add that another op also reads stays out too (only the add and the norm fuse).
// CHECK-LABEL: func.func @layer_norm_of_double
// CHECK-NOT: kiln.fusion
// CHECK-LABEL: func.func @layer_norm_shared_cast
// CHECK: %[[C:.*]] = kiln.cast %arg0
// CHECK-NEXT: kiln.fusion "layer_norm" "add_layer_norm"(%[[C]], %arg1
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @c : tensor<16xf32> {init = "zeros"}
func.func @layer_norm_of_double(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %g = kiln.param @g : tensor<16xf32>
  %c = kiln.param @c : tensor<16xf32>
  %s = kiln.add %a, %a : tensor<8x16xf32>
  %o, %m, %r = kiln.layer_norm %s, %g, %c : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>, tensor<8xf32>, tensor<8xf32>
  return %o : tensor<8x16xf32>
}
func.func @layer_norm_shared_cast(%a: tensor<8x16xbf16>, %b: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %g = kiln.param @g : tensor<16xf32>
  %c = kiln.param @c : tensor<16xf32>
  %w = kiln.cast %a : tensor<8x16xbf16> -> tensor<8x16xf32>
  %s = kiln.add %w, %b : tensor<8x16xf32>
  %o, %m, %r = kiln.layer_norm %s, %g, %c : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>, tensor<8xf32>, tensor<8xf32>
  return %w, %o : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Layer-norm backward: a doubling of dx is no residual-gradient add; when the cast of the
// gradient that leaves comes after a read of the sum, the longest legal prefix still fuses (the
// add and both accumulations); the bias gradient of the layer before is the row sum of the
// residual sum (not of dx) and joins.
// CHECK-LABEL: func.func @layer_norm_grad_double
// CHECK: kiln.fusion "layer_norm_grad" "layer_norm_grad_accumulate_grad"
// CHECK: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: kiln.add
// CHECK-LABEL: func.func @layer_norm_grad_prefix
// CHECK: %[[R:.*]] = kiln.fusion "layer_norm_grad" "layer_norm_grad_add_accumulate_grad"
// CHECK: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: kiln.gelu %[[R]]
// CHECK-NEXT: kiln.cast %[[R]]
// CHECK-LABEL: func.func @layer_norm_grad_bias_before
// CHECK: kiln.fusion "layer_norm_grad" "layer_norm_grad_add_accumulate_grad_reduce_sum"
// CHECK: kiln.accumulate_grad @pb
// CHECK-NEXT: kiln.yield
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
kiln.parameter @pb : tensor<16xf32> {init = "zeros"}
func.func @layer_norm_grad_double(%dy: tensor<8x16xf32>, %x: tensor<8x16xf32>, %m: tensor<8xf32>, %r: tensor<8xf32>) -> tensor<8x16xf32> {
  %g = kiln.param @g : tensor<16xf32>
  %dx, %dg, %db = kiln.layer_norm_grad %dy, %x, %g, %m, %r : tensor<8x16xf32>, tensor<8x16xf32>, tensor<16xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32>
  kiln.accumulate_grad @g, %dg : tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %s = kiln.add %dx, %dx : tensor<8x16xf32>
  return %s : tensor<8x16xf32>
}
func.func @layer_norm_grad_prefix(%dy: tensor<8x16xf32>, %x: tensor<8x16xf32>, %m: tensor<8xf32>, %r: tensor<8xf32>, %dres: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xbf16>) {
  %g = kiln.param @g : tensor<16xf32>
  %dx, %dg, %db = kiln.layer_norm_grad %dy, %x, %g, %m, %r : tensor<8x16xf32>, tensor<8x16xf32>, tensor<16xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32>
  %s = kiln.add %dres, %dx : tensor<8x16xf32>
  kiln.accumulate_grad @g, %dg : tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %t = kiln.gelu %s : tensor<8x16xf32>
  %c = kiln.cast %s : tensor<8x16xf32> -> tensor<8x16xbf16>
  return %t, %c : tensor<8x16xf32>, tensor<8x16xbf16>
}
func.func @layer_norm_grad_bias_before(%dy: tensor<8x16xf32>, %x: tensor<8x16xf32>, %m: tensor<8xf32>, %r: tensor<8xf32>, %dres: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %g = kiln.param @g : tensor<16xf32>
  %dx, %dg, %db = kiln.layer_norm_grad %dy, %x, %g, %m, %r : tensor<8x16xf32>, tensor<8x16xf32>, tensor<16xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32>
  %s = kiln.add %dres, %dx : tensor<8x16xf32>
  kiln.accumulate_grad @g, %dg : tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %sum = kiln.reduce_sum %s : tensor<8x16xf32> -> tensor<16xf32>
  kiln.accumulate_grad @pb, %sum : tensor<16xf32>
  return %s : tensor<8x16xf32>
}

// -----

// The optimizer's kernel: clipping joins only when the updates alone read its coefficient (here
// it is also returned, so it stays a kernel of its own); and the updates do not fuse when one
// would move past a read of the parameter it updates.
// CHECK-LABEL: func.func @clip_read_elsewhere
// CHECK: %[[C:.*]] = kiln.clip_coef
// CHECK: kiln.fusion "optimizer" "adamw"
// CHECK: return %[[C]]
// CHECK-LABEL: func.func @update_past_read
// CHECK-NOT: kiln.fusion
// CHECK: kiln.adamw @w
// CHECK-NEXT: kiln.param @v
// CHECK-NEXT: kiln.adamw @v
kiln.parameter @w : tensor<16xf32> {init = "zeros"}
kiln.parameter @v : tensor<16xf32> {init = "zeros"}
func.func @clip_read_elsewhere(%n: tensor<f32>, %h: tensor<f32>) -> tensor<f32> {
  %gw = kiln.grad @w : tensor<16xf32>
  %gv = kiln.grad @v : tensor<16xf32>
  %c = kiln.clip_coef %n, %h : tensor<f32>
  kiln.adamw @w, %gw scale %c lr %h betas(%h, %h) eps %h weight_decay %h step %h : tensor<16xf32>
  kiln.adamw @v, %gv scale %c lr %h betas(%h, %h) eps %h weight_decay %h step %h : tensor<16xf32>
  return %c : tensor<f32>
}
func.func @update_past_read(%h: tensor<f32>) -> tensor<16xf32> {
  %gw = kiln.grad @w : tensor<16xf32>
  %gv = kiln.grad @v : tensor<16xf32>
  kiln.adamw @w, %gw scale %h lr %h betas(%h, %h) eps %h weight_decay %h step %h : tensor<16xf32>
  %p = kiln.param @v : tensor<16xf32>
  kiln.adamw @v, %gv scale %h lr %h betas(%h, %h) eps %h weight_decay %h step %h : tensor<16xf32>
  return %p : tensor<16xf32>
}

// -----

// Weight gradient in bf16: the bias gradient's row sum is widened before its accumulation, and
// the cast joins the product's kernel with it.
// CHECK-LABEL: func.func @weight_and_bias_grad_bf16
// CHECK: kiln.fusion "matmul" "reduce_sum_cast_accumulate_grad_matmul"(%arg1, %arg0)
// CHECK: kiln.accumulate_grad @b
// CHECK: kiln.accumulate_grad @w
// CHECK-NEXT: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: return
kiln.parameter @w : tensor<4x16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @weight_and_bias_grad_bf16(%x: tensor<8x4xbf16>, %dy: tensor<8x16xbf16>) {
  %db = kiln.reduce_sum %dy : tensor<8x16xbf16> -> tensor<16xbf16>
  %dbf = kiln.cast %db : tensor<16xbf16> -> tensor<16xf32>
  kiln.accumulate_grad @b, %dbf : tensor<16xf32>
  %dw = kiln.matmul %x, %dy {transpose_lhs} : tensor<8x4xbf16>, tensor<8x16xbf16> -> tensor<4x16xbf16>
  %dwf = kiln.cast %dw : tensor<4x16xbf16> -> tensor<4x16xf32>
  kiln.accumulate_grad @w, %dwf : tensor<4x16xf32>
  return
}

// -----

// A kernel of recomputed ops (kiln-recompute's clones in the backward pass) stays marked: the
// module writer puts it in the Recompute phase.
// CHECK-LABEL: func.func @recomputed
// CHECK: kiln.fusion "elementwise" "add_gelu"{{.*}}kiln.recomputed
func.func @recomputed(%x: tensor<16xf32>, %y: tensor<16xf32>) -> tensor<16xf32> {
  %a = kiln.add %x, %y {kiln.recomputed} : tensor<16xf32>
  %g = kiln.gelu %a {kiln.recomputed} : tensor<16xf32>
  return %g : tensor<16xf32>
}

// -----

// The cast of the layer norm's output (bf16 for the next product) joins its kernel.
// CHECK-LABEL: func.func @layer_norm_cast_out
// CHECK: %[[R:.*]] = kiln.fusion "layer_norm" "add_layer_norm_cast"(%arg0, %arg1
// CHECK: kiln.cast
// CHECK-NEXT: kiln.yield
// CHECK: return %[[R]]
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @c : tensor<16xf32> {init = "zeros"}
func.func @layer_norm_cast_out(%a: tensor<8x16xf32>, %b: tensor<8x16xf32>) -> tensor<8x16xbf16> {
  %g = kiln.param @g : tensor<16xf32>
  %c = kiln.param @c : tensor<16xf32>
  %s = kiln.add %a, %b : tensor<8x16xf32>
  %o, %m, %r = kiln.layer_norm %s, %g, %c : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>, tensor<8xf32>, tensor<8xf32>
  %h = kiln.cast %o : tensor<8x16xf32> -> tensor<8x16xbf16>
  return %h : tensor<8x16xbf16>
}

// -----

// Only a column reduction (to the C channels) of the gradient that leaves is a bias gradient
// the layer-norm backward computes: a row sum over the batch alone (to T x C) stays out.
// CHECK-LABEL: func.func @layer_norm_grad_partial_sum
// CHECK: %[[R:.*]] = kiln.fusion "layer_norm_grad" "layer_norm_grad_accumulate_grad"
// CHECK: kiln.yield
// CHECK-NEXT: }
// CHECK-NEXT: kiln.reduce_sum %[[R]] : tensor<2x4x16xf32> -> tensor<4x16xf32>
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
kiln.parameter @pe : tensor<4x16xf32> {init = "zeros"}
func.func @layer_norm_grad_partial_sum(%dy: tensor<2x4x16xf32>, %x: tensor<2x4x16xf32>, %m: tensor<2x4xf32>, %r: tensor<2x4xf32>) -> tensor<2x4x16xf32> {
  %g = kiln.param @g : tensor<16xf32>
  %dx, %dg, %db = kiln.layer_norm_grad %dy, %x, %g, %m, %r : tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<16xf32>, tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4x16xf32>, tensor<16xf32>, tensor<16xf32>
  kiln.accumulate_grad @g, %dg : tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %s = kiln.reduce_sum %dx : tensor<2x4x16xf32> -> tensor<4x16xf32>
  kiln.accumulate_grad @pe, %s : tensor<4x16xf32>
  return %dx : tensor<2x4x16xf32>
}

// -----

// In bf16 the bias gradient of the layer before is the row sum of the narrowed gradient that
// leaves (the cast in the kernel): it joins too, through the cast.
// CHECK-LABEL: func.func @layer_norm_grad_bias_after_cast
// CHECK: kiln.fusion "layer_norm_grad" "layer_norm_grad_accumulate_grad_cast_reduce_sum"
// CHECK: kiln.accumulate_grad @pb
// CHECK-NEXT: kiln.yield
kiln.parameter @g : tensor<16xf32> {init = "ones"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
kiln.parameter @pb : tensor<16xf32> {init = "zeros"}
func.func @layer_norm_grad_bias_after_cast(%dy: tensor<8x16xf32>, %x: tensor<8x16xf32>, %m: tensor<8xf32>, %r: tensor<8xf32>) -> tensor<8x16xbf16> {
  %g = kiln.param @g : tensor<16xf32>
  %dx, %dg, %db = kiln.layer_norm_grad %dy, %x, %g, %m, %r : tensor<8x16xf32>, tensor<8x16xf32>, tensor<16xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32>
  kiln.accumulate_grad @g, %dg : tensor<16xf32>
  kiln.accumulate_grad @b, %db : tensor<16xf32>
  %c = kiln.cast %dx : tensor<8x16xf32> -> tensor<8x16xbf16>
  %sum = kiln.reduce_sum %c : tensor<8x16xbf16> -> tensor<16xbf16>
  %sumf = kiln.cast %sum : tensor<16xbf16> -> tensor<16xf32>
  kiln.accumulate_grad @pb, %sumf : tensor<16xf32>
  return %c : tensor<8x16xbf16>
}
