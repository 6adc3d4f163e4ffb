// RUN: kiln-opt %s -split-input-file | kiln-opt -split-input-file | FileCheck %s
// RUN: kiln-opt %s -split-input-file --mlir-print-op-generic | kiln-opt -split-input-file | FileCheck %s

// Round trip of every kiln op: parse, print, parse the printed form again.

// Parameter declarations keep their type, init, init_std and decay flag; an unset
// init_std (default 0.0) is not printed. Dotted names need no quotes.
// CHECK: kiln.parameter @wte : tensor<16x8xf32> {decay, init = "normal", init_std = 2.000000e-02 : f32}
// CHECK: kiln.parameter @ln.weight : tensor<8xf32> {init = "ones"}
// CHECK: kiln.parameter @ln.bias : tensor<8xf32> {init = "zeros"}
// CHECK: kiln.parameter @w_bf16 : tensor<8x8xbf16> {init = "zeros"}
kiln.parameter @wte : tensor<16x8xf32> {decay, init = "normal", init_std = 2.0e-02 : f32}
kiln.parameter @"ln.weight" : tensor<8xf32> {init = "ones"}
kiln.parameter @"ln.bias" : tensor<8xf32> {init = "zeros"}
kiln.parameter @w_bf16 : tensor<8x8xbf16> {init = "zeros"}

// -----

// State reads and writes, runtime inputs, hyperparameters, iota and zeros.
// CHECK-LABEL: func.func @state
// CHECK:         %[[P:.*]] = kiln.param @wte : tensor<16x8xf32>
// CHECK:         %[[G:.*]] = kiln.grad @wte : tensor<16x8xf32>
// CHECK:         kiln.accumulate_grad @wte, %[[G]] : tensor<16x8xf32>
// CHECK:         kiln.param @w_bf16 : tensor<8x8xbf16>
// CHECK:         kiln.input "idx" : tensor<2x4xi32>
// CHECK:         kiln.input "targets" : tensor<2x4xi32>
// CHECK:         %[[H:.*]] = kiln.hyper "lr" : tensor<f32>
// CHECK:         kiln.hyper "loss_weight" : tensor<f32>
// CHECK:         kiln.iota : tensor<4xi32>
// CHECK:         kiln.zeros : tensor<2x3xf32>
// CHECK:         return %[[H]] : tensor<f32>
kiln.parameter @wte : tensor<16x8xf32> {decay, init = "normal", init_std = 2.0e-02 : f32}
kiln.parameter @w_bf16 : tensor<8x8xbf16> {init = "zeros"}
func.func @state() -> tensor<f32> {
  %p = kiln.param @wte : tensor<16x8xf32>
  %g = kiln.grad @wte : tensor<16x8xf32>
  kiln.accumulate_grad @wte, %g : tensor<16x8xf32>
  %pb = kiln.param @w_bf16 : tensor<8x8xbf16>
  %i = kiln.input "idx" : tensor<2x4xi32>
  %t = kiln.input "targets" : tensor<2x4xi32>
  %h = kiln.hyper "lr" : tensor<f32>
  %lw = kiln.hyper "loss_weight" : tensor<f32>
  %io = kiln.iota : tensor<4xi32>
  %z = kiln.zeros : tensor<2x3xf32>
  return %h : tensor<f32>
}

// -----

// Embedding and its gradient.
// CHECK-LABEL: func.func @embedding
// CHECK-SAME:    (%[[IDS:.*]]: tensor<2x4xi32>)
// CHECK:         %[[W:.*]] = kiln.param @wte
// CHECK:         %[[E:.*]] = kiln.embedding %[[W]][%[[IDS]]] : tensor<16x8xf32>, tensor<2x4xi32> -> tensor<2x4x8xf32>
// CHECK:         kiln.embedding_grad %[[E]], %[[IDS]] : tensor<2x4x8xf32>, tensor<2x4xi32> -> tensor<16x8xf32>
kiln.parameter @wte : tensor<16x8xf32> {decay, init = "normal", init_std = 2.0e-02 : f32}
func.func @embedding(%ids: tensor<2x4xi32>) -> tensor<16x8xf32> {
  %p = kiln.param @wte : tensor<16x8xf32>
  %e = kiln.embedding %p[%ids] : tensor<16x8xf32>, tensor<2x4xi32> -> tensor<2x4x8xf32>
  %eg = kiln.embedding_grad %e, %ids : tensor<2x4x8xf32>, tensor<2x4xi32> -> tensor<16x8xf32>
  return %eg : tensor<16x8xf32>
}

// -----

// Matmul in all four transpose combinations; unit attributes print in the attr-dict.
// CHECK-LABEL: func.func @matmul
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>, %[[Y:.*]]: tensor<8x6xf32>, %[[W:.*]]: tensor<16x8xf32>)
// CHECK:         %[[M0:.*]] = kiln.matmul %[[X]], %[[Y]] : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
// CHECK:         kiln.matmul %[[X]], %[[W]] {transpose_rhs} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
// CHECK:         kiln.matmul %[[X]], %[[M0]] {transpose_lhs} : tensor<4x8xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
// CHECK:         kiln.matmul %[[Y]], %[[X]] {transpose_lhs, transpose_rhs} : tensor<8x6xf32>, tensor<4x8xf32> -> tensor<6x4xf32>
func.func @matmul(%x: tensor<4x8xf32>, %y: tensor<8x6xf32>, %w: tensor<16x8xf32>) {
  %m0 = kiln.matmul %x, %y : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  %m1 = kiln.matmul %x, %w {transpose_rhs} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
  %m2 = kiln.matmul %x, %m0 {transpose_lhs} : tensor<4x8xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
  %m3 = kiln.matmul %y, %x {transpose_lhs, transpose_rhs} : tensor<8x6xf32>, tensor<4x8xf32> -> tensor<6x4xf32>
  return
}

// -----

// Elementwise ops: add, mul, scale by a runtime scalar, gelu and its gradient (bf16 too).
// CHECK-LABEL: func.func @elementwise
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>, %[[S:.*]]: tensor<f32>, %[[B:.*]]: tensor<8x8xbf16>)
// CHECK:         %[[A:.*]] = kiln.add %[[X]], %[[X]] : tensor<4x8xf32>
// CHECK:         %[[M:.*]] = kiln.mul %[[X]], %[[A]] : tensor<4x8xf32>
// CHECK:         %[[SC:.*]] = kiln.scale %[[M]], %[[S]] : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
// CHECK:         %[[GE:.*]] = kiln.gelu %[[SC]] : tensor<4x8xf32>
// CHECK:         kiln.gelu_grad %[[GE]], %[[SC]] : tensor<4x8xf32>
// CHECK:         kiln.add %[[B]], %[[B]] : tensor<8x8xbf16>
func.func @elementwise(%x: tensor<4x8xf32>, %s: tensor<f32>, %b: tensor<8x8xbf16>) {
  %a = kiln.add %x, %x : tensor<4x8xf32>
  %mu = kiln.mul %x, %a : tensor<4x8xf32>
  %sc = kiln.scale %mu, %s : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
  %ge = kiln.gelu %sc : tensor<4x8xf32>
  %gg = kiln.gelu_grad %ge, %sc : tensor<4x8xf32>
  %ab = kiln.add %b, %b : tensor<8x8xbf16>
  return
}

// -----

// Shape ops: broadcast, reduce_sum, reshape (float and i32), transpose.
// CHECK-LABEL: func.func @shapes
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>, %[[IDS:.*]]: tensor<2x4xi32>)
// CHECK:         %[[B:.*]] = kiln.broadcast %[[X]] : tensor<4x8xf32> -> tensor<2x4x8xf32>
// CHECK:         kiln.reduce_sum %[[B]] : tensor<2x4x8xf32> -> tensor<8xf32>
// CHECK:         kiln.reshape %[[B]] : tensor<2x4x8xf32> -> tensor<8x8xf32>
// CHECK:         kiln.reshape %[[IDS]] : tensor<2x4xi32> -> tensor<8xi32>
// CHECK:         kiln.transpose %[[X]] : tensor<4x8xf32> -> tensor<8x4xf32>
func.func @shapes(%x: tensor<4x8xf32>, %ids: tensor<2x4xi32>) {
  %b = kiln.broadcast %x : tensor<4x8xf32> -> tensor<2x4x8xf32>
  %r = kiln.reduce_sum %b : tensor<2x4x8xf32> -> tensor<8xf32>
  %rs = kiln.reshape %b : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %rsi = kiln.reshape %ids : tensor<2x4xi32> -> tensor<8xi32>
  %tr = kiln.transpose %x : tensor<4x8xf32> -> tensor<8x4xf32>
  return
}

// -----

// Variadic split and concat, including uneven pieces and a single piece.
// CHECK-LABEL: func.func @split_concat
// CHECK-SAME:    (%[[QKV:.*]]: tensor<2x4x24xf32>)
// CHECK:         %[[S:.*]]:3 = kiln.split %[[QKV]] : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>
// CHECK:         kiln.concat %[[S]]#0, %[[S]]#2 : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x16xf32>
// CHECK:         %[[U:.*]]:2 = kiln.split %[[QKV]] : tensor<2x4x24xf32> -> tensor<2x4x20xf32>, tensor<2x4x4xf32>
// CHECK:         kiln.concat %[[U]]#1, %[[U]]#0 : tensor<2x4x4xf32>, tensor<2x4x20xf32> -> tensor<2x4x24xf32>
// CHECK:         %[[ONE:.*]] = kiln.split %[[QKV]] : tensor<2x4x24xf32> -> tensor<2x4x24xf32>
// CHECK:         kiln.concat %[[ONE]] : tensor<2x4x24xf32> -> tensor<2x4x24xf32>
func.func @split_concat(%qkv: tensor<2x4x24xf32>) {
  %s0, %s1, %s2 = kiln.split %qkv : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>
  %c = kiln.concat %s0, %s2 : tensor<2x4x8xf32>, tensor<2x4x8xf32> -> tensor<2x4x16xf32>
  %u0, %u1 = kiln.split %qkv : tensor<2x4x24xf32> -> tensor<2x4x20xf32>, tensor<2x4x4xf32>
  %c2 = kiln.concat %u1, %u0 : tensor<2x4x4xf32>, tensor<2x4x20xf32> -> tensor<2x4x24xf32>
  %one = kiln.split %qkv : tensor<2x4x24xf32> -> tensor<2x4x24xf32>
  %c3 = kiln.concat %one : tensor<2x4x24xf32> -> tensor<2x4x24xf32>
  return
}

// -----

// layer_norm with the default epsilon (not printed) and an explicit one, and its gradient.
// CHECK-LABEL: func.func @layer_norm
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8xf32>)
// CHECK:         %[[W:.*]] = kiln.param @ln.weight : tensor<8xf32>
// CHECK:         %[[B:.*]] = kiln.param @ln.bias : tensor<8xf32>
// CHECK:         %[[Y:.*]], %[[MEAN:.*]], %[[RSTD:.*]] = kiln.layer_norm %[[X]], %[[W]], %[[B]] : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
// CHECK:         kiln.layer_norm %[[X]], %[[W]], %[[B]] {epsilon = 1.000000e-03 : f32} : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
// CHECK:         kiln.layer_norm_grad %[[Y]], %[[X]], %[[W]], %[[MEAN]], %[[RSTD]] : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
kiln.parameter @"ln.weight" : tensor<8xf32> {init = "ones"}
kiln.parameter @"ln.bias" : tensor<8xf32> {init = "zeros"}
func.func @layer_norm(%x: tensor<4x8xf32>) {
  %lw = kiln.param @"ln.weight" : tensor<8xf32>
  %lb = kiln.param @"ln.bias" : tensor<8xf32>
  %ln, %mean, %rstd = kiln.layer_norm %x, %lw, %lb : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %ln2:3 = kiln.layer_norm %x, %lw, %lb {epsilon = 1.0e-03 : f32} : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %dx, %dw, %db = kiln.layer_norm_grad %ln, %x, %lw, %mean, %rstd : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
  return
}

// -----

// Causal attention with num_heads, and its gradient.
// CHECK-LABEL: func.func @attention
// CHECK-SAME:    (%[[QKV:.*]]: tensor<2x4x24xf32>)
// CHECK:         %[[O:.*]], %[[LSE:.*]] = kiln.attention %[[QKV]] {num_heads = 2 : i64} : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x2x4xf32>
// CHECK:         kiln.attention_grad %[[O]], %[[QKV]], %[[O]], %[[LSE]] {num_heads = 2 : i64} : tensor<2x4x8xf32>, tensor<2x4x24xf32>, tensor<2x4x8xf32>, tensor<2x2x4xf32> -> tensor<2x4x24xf32>
func.func @attention(%qkv: tensor<2x4x24xf32>) {
  %at, %lse = kiln.attention %qkv {num_heads = 2 : i64} : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x2x4xf32>
  %dqkv = kiln.attention_grad %at, %qkv, %at, %lse {num_heads = 2 : i64} : tensor<2x4x8xf32>, tensor<2x4x24xf32>, tensor<2x4x8xf32>, tensor<2x2x4xf32> -> tensor<2x4x24xf32>
  return
}

// -----

// Incremental decoding: a layer's key/value cache and the attention of one position against it.
// CHECK-LABEL: func.func @decode_attention
// CHECK:         %[[KV:.*]] = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
// CHECK:         kiln.decode_attention %{{.*}}, %[[KV]], %{{.*}} {num_heads = 2 : i64} : tensor<2x24xbf16>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<2x8xbf16>
func.func @decode_attention(%qkv: tensor<2x24xbf16>, %p: tensor<1xi32>) {
  %kv = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
  %y = kiln.decode_attention %qkv, %kv, %p {num_heads = 2 : i64} : tensor<2x24xbf16>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<2x8xbf16>
  return
}

// -----

// A prompt read into the cache 3 positions per row at a time: qkv [B * M, 3C].
// CHECK-LABEL: func.func @prefill_attention
// CHECK:         kiln.decode_attention %{{.*}}, %{{.*}}, %{{.*}} {num_heads = 2 : i64} : tensor<6x24xf32>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<6x8xf32>
func.func @prefill_attention(%qkv: tensor<6x24xf32>, %p: tensor<1xi32>) {
  %kv = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
  %y = kiln.decode_attention %qkv, %kv, %p {num_heads = 2 : i64} : tensor<6x24xf32>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<6x8xf32>
  return
}

// -----

// Cross-entropy (scalar loss + lse) and its gradient.
// CHECK-LABEL: func.func @cross_entropy
// CHECK-SAME:    (%[[LOGITS:.*]]: tensor<4x16xf32>, %[[T:.*]]: tensor<4xi32>)
// CHECK:         %[[LOSS:.*]], %[[LSE:.*]] = kiln.cross_entropy %[[LOGITS]], %[[T]] : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
// CHECK:         kiln.cross_entropy_grad %[[LOSS]], %[[LOGITS]], %[[LSE]], %[[T]] : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
// CHECK:         return %[[LOSS]]
func.func @cross_entropy(%logits: tensor<4x16xf32>, %t: tensor<4xi32>) -> tensor<f32> {
  %loss, %clse = kiln.cross_entropy %logits, %t : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
  %dl = kiln.cross_entropy_grad %loss, %logits, %clse, %t : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
  return %loss : tensor<f32>
}

// -----

// A padded class dimension: num_classes (the real classes, 13 of 16 columns) is kept on both.
// CHECK-LABEL: func.func @cross_entropy_padded
// CHECK-SAME:    (%[[LOGITS:.*]]: tensor<4x16xf32>, %[[T:.*]]: tensor<4xi32>)
// CHECK:         %[[LOSS:.*]], %[[LSE:.*]] = kiln.cross_entropy %[[LOGITS]], %[[T]] {num_classes = 13 : i64} : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
// CHECK:         kiln.cross_entropy_grad %[[LOSS]], %[[LOGITS]], %[[LSE]], %[[T]] {num_classes = 13 : i64} : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
// CHECK:         return %[[LOSS]]
func.func @cross_entropy_padded(%logits: tensor<4x16xf32>, %t: tensor<4xi32>) -> tensor<f32> {
  %loss, %clse = kiln.cross_entropy %logits, %t {num_classes = 13 : i64} : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
  %dl = kiln.cross_entropy_grad %loss, %logits, %clse, %t {num_classes = 13} : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
  return %loss : tensor<f32>
}

// -----

// Optimizer ops: variadic global_norm, clip_coef, and adamw's custom syntax with and
// without decay.
// CHECK-LABEL: func.func @optimizer
// CHECK-SAME:    (%[[G:.*]]: tensor<16x8xf32>)
// CHECK:         %[[G2:.*]] = kiln.grad @ln.weight : tensor<8xf32>
// CHECK:         %[[N:.*]] = kiln.global_norm %[[G]], %[[G2]] : tensor<16x8xf32>, tensor<8xf32> -> tensor<f32>
// CHECK:         kiln.global_norm %[[G]] : tensor<16x8xf32> -> tensor<f32>
// CHECK:         %[[MAX:.*]] = kiln.hyper "max_norm" : tensor<f32>
// CHECK:         %[[C:.*]] = kiln.clip_coef %[[N]], %[[MAX]] : tensor<f32>
// CHECK:         %[[LR:.*]] = kiln.hyper "lr"
// CHECK:         %[[B1:.*]] = kiln.hyper "beta1"
// CHECK:         %[[B2:.*]] = kiln.hyper "beta2"
// CHECK:         %[[EPS:.*]] = kiln.hyper "eps"
// CHECK:         %[[WD:.*]] = kiln.hyper "weight_decay"
// CHECK:         %[[ST:.*]] = kiln.hyper "step"
// CHECK:         kiln.adamw @wte, %[[G]] scale %[[C]] lr %[[LR]] betas(%[[B1]], %[[B2]]) eps %[[EPS]] weight_decay %[[WD]] step %[[ST]] {decay} : tensor<16x8xf32>
// CHECK:         kiln.adamw @ln.weight, %[[G2]] scale %[[C]] lr %[[LR]] betas(%[[B1]], %[[B2]]) eps %[[EPS]] weight_decay %[[WD]] step %[[ST]] : tensor<8xf32>
// CHECK:         return %[[N]] : tensor<f32>
kiln.parameter @wte : tensor<16x8xf32> {decay, init = "normal", init_std = 2.0e-02 : f32}
kiln.parameter @"ln.weight" : tensor<8xf32> {init = "ones"}
func.func @optimizer(%g: tensor<16x8xf32>) -> tensor<f32> {
  %g2 = kiln.grad @"ln.weight" : tensor<8xf32>
  %n = kiln.global_norm %g, %g2 : tensor<16x8xf32>, tensor<8xf32> -> tensor<f32>
  %n1 = kiln.global_norm %g : tensor<16x8xf32> -> tensor<f32>
  %mx = kiln.hyper "max_norm" : tensor<f32>
  %c = kiln.clip_coef %n, %mx : tensor<f32>
  %lr = kiln.hyper "lr" : tensor<f32>
  %b1 = kiln.hyper "beta1" : tensor<f32>
  %b2 = kiln.hyper "beta2" : tensor<f32>
  %eps = kiln.hyper "eps" : tensor<f32>
  %wd = kiln.hyper "weight_decay" : tensor<f32>
  %st = kiln.hyper "step" : tensor<f32>
  kiln.adamw @wte, %g scale %c lr %lr betas(%b1, %b2) eps %eps weight_decay %wd step %st {decay} : tensor<16x8xf32>
  kiln.adamw @"ln.weight", %g2 scale %c lr %lr betas(%b1, %b2) eps %eps weight_decay %wd step %st : tensor<8xf32>
  return %n : tensor<f32>
}
