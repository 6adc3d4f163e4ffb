// RUN: kiln-opt %s -split-input-file -kiln-mixed-precision | FileCheck %s
// RUN: kiln-opt %s -split-input-file -kiln-mixed-precision -kiln-autodiff -canonicalize -cse | FileCheck %s --check-prefix=STEP

// One block: layer norm feeding matmuls stores bf16; matmuls take bf16 weights (casts of the
// fp32 masters) and give bf16; the bias is added in bf16; GELU stays bf16; the branch is
// widened before the fp32 residual add; cross-entropy reads bf16 logits; the loss is fp32.
// CHECK-LABEL: func.func @forward
// CHECK: %[[LN:.*]], %{{.*}}, %{{.*}} = kiln.layer_norm {{.*}} -> tensor<4x8xbf16>, tensor<4xf32>, tensor<4xf32>
// CHECK: %[[W:.*]] = kiln.cast %{{.*}} : tensor<8x16xf32> -> tensor<8x16xbf16>
// CHECK: kiln.matmul %[[LN]], %[[W]] : tensor<4x8xbf16>, tensor<8x16xbf16> -> tensor<4x16xbf16>
// CHECK: kiln.cast %{{.*}} : tensor<16xf32> -> tensor<16xbf16>
// CHECK: kiln.broadcast %{{.*}} : tensor<16xbf16> -> tensor<4x16xbf16>
// CHECK: kiln.add %{{.*}} : tensor<4x16xbf16>
// CHECK: kiln.gelu %{{.*}} : tensor<4x16xbf16>
// CHECK: kiln.matmul {{.*}} -> tensor<4x8xbf16>
// CHECK: %[[WIDE:.*]] = kiln.cast %{{.*}} : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK: kiln.add %{{.*}}, %[[WIDE]] : tensor<4x8xf32>
// CHECK: kiln.matmul {{.*}} {transpose_rhs} : tensor<4x8xbf16>, tensor<32x8xbf16> -> tensor<4x32xbf16>
// CHECK: kiln.cross_entropy %{{.*}}, %{{.*}} : tensor<4x32xbf16>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>

// After autodiff and canonicalization the weights are read from their bf16 compute copies,
// and their bf16 gradients are widened before accumulating into the fp32 accumulators.
// STEP-LABEL: func.func @micro_step
// STEP: kiln.param @w1 : tensor<8x16xbf16>
// STEP: %[[DW:.*]] = kiln.matmul {{.*}} {transpose_lhs} : tensor<4x8xbf16>, tensor<4x16xbf16> -> tensor<8x16xbf16>
// STEP: %[[DW32:.*]] = kiln.cast %[[DW]] : tensor<8x16xbf16> -> tensor<8x16xf32>
// STEP: kiln.accumulate_grad @w1, %[[DW32]] : tensor<8x16xf32>
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @g : tensor<8xf32> {init = "ones"}
kiln.parameter @b : tensor<8xf32> {init = "zeros"}
kiln.parameter @w1 : tensor<8x16xf32> {init = "normal", init_std = 0.02 : f32, decay}
kiln.parameter @b1 : tensor<16xf32> {init = "zeros"}
kiln.parameter @w2 : tensor<16x8xf32> {init = "normal", init_std = 0.02 : f32, decay}
kiln.parameter @emb : tensor<32x8xf32> {init = "normal", init_std = 0.02 : f32, decay}
func.func @forward() -> tensor<f32> {
  %t = kiln.input "targets" : tensor<4xi32>
  %x = kiln.param @x : tensor<4x8xf32>
  %g = kiln.param @g : tensor<8xf32>
  %b = kiln.param @b : tensor<8xf32>
  %a, %m, %r = kiln.layer_norm %x, %g, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %w1 = kiln.param @w1 : tensor<8x16xf32>
  %h = kiln.matmul %a, %w1 : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %b1 = kiln.param @b1 : tensor<16xf32>
  %bb = kiln.broadcast %b1 : tensor<16xf32> -> tensor<4x16xf32>
  %hb = kiln.add %h, %bb : tensor<4x16xf32>
  %u = kiln.gelu %hb : tensor<4x16xf32>
  %w2 = kiln.param @w2 : tensor<16x8xf32>
  %y = kiln.matmul %u, %w2 : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
  %res = kiln.add %x, %y : tensor<4x8xf32>
  %a2, %m2, %r2 = kiln.layer_norm %res, %g, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %emb = kiln.param @emb : tensor<32x8xf32>
  %logits = kiln.matmul %a2, %emb {transpose_rhs} : tensor<4x8xf32>, tensor<32x8xf32> -> tensor<4x32xf32>
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<4x32xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
  return %loss : tensor<f32>
}

// @decode gets the policy too: decode attention reads bf16 qkv (a cast of the fp32 value here)
// and gives bf16, while its key/value cache stays fp32.
// CHECK-LABEL: func.func @decode
// CHECK: %[[KV:.*]] = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
// CHECK: %[[Q:.*]] = kiln.cast %{{.*}} : tensor<2x24xf32> -> tensor<2x24xbf16>
// CHECK: kiln.decode_attention %[[Q]], %[[KV]], %{{.*}} {num_heads = 2 : i64} : tensor<2x24xbf16>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<2x8xbf16>
kiln.parameter @qkv : tensor<2x24xf32> {init = "zeros"}
func.func @decode() -> tensor<2x8xf32> {
  %qkv = kiln.param @qkv : tensor<2x24xf32>
  %p = kiln.input "position" : tensor<1xi32>
  %kv = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
  %y = kiln.decode_attention %qkv, %kv, %p {num_heads = 2 : i64} : tensor<2x24xf32>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// -----

// A layer norm read by a matmul and by something else (a residual add) keeps an fp32 result;
// only the matmul's operand is narrowed (a cast in front of it).
// CHECK-LABEL: func.func @forward
// CHECK: %[[LN:.*]], %{{.*}}, %{{.*}} = kiln.layer_norm {{.*}} -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
// CHECK: kiln.cast %[[LN]] : tensor<4x8xf32> -> tensor<4x8xbf16>
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @g : tensor<8xf32> {init = "ones"}
kiln.parameter @b : tensor<8xf32> {init = "zeros"}
kiln.parameter @w : tensor<8x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %g = kiln.param @g : tensor<8xf32>
  %b = kiln.param @b : tensor<8xf32>
  %w = kiln.param @w : tensor<8x8xf32>
  %a, %m, %r = kiln.layer_norm %x, %g, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %h = kiln.matmul %a, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %s = kiln.add %a, %h : tensor<4x8xf32>
  %l = kiln.reduce_sum %s : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A function's arguments stay as they are (its results follow what it returns).
// CHECK-LABEL: func.func @with_argument
// CHECK-SAME: (%[[X:.*]]: tensor<2x4xf32>) -> tensor<2x4xbf16>
// CHECK: kiln.cast %[[X]] : tensor<2x4xf32> -> tensor<2x4xbf16>
kiln.parameter @w : tensor<4x4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<4x4xf32>
  %l = kiln.reduce_sum %w : tensor<4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
func.func @with_argument(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %w = kiln.param @w : tensor<4x4xf32>
  %0 = kiln.matmul %x, %w : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// An op that keeps its fp32 result (here a reduction) reads a bf16 product widened: its
// verifier wants its input's element type.
// CHECK-LABEL: func.func @forward
// CHECK: %[[P:.*]] = kiln.matmul {{.*}} -> tensor<4x16xbf16>
// CHECK: %[[PW:.*]] = kiln.cast %[[P]] : tensor<4x16xbf16> -> tensor<4x16xf32>
// CHECK: kiln.reduce_sum %[[PW]] : tensor<4x16xf32> -> tensor<f32>
// STEP-LABEL: func.func @micro_step
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @w : tensor<8x16xf32> {init = "normal", init_std = 0.02 : f32, decay}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %w = kiln.param @w : tensor<8x16xf32>
  %y = kiln.matmul %x, %w : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %l = kiln.reduce_sum %y : tensor<4x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Hand-written IR without a kiln.spec: nothing asks for bf16, so a graph with no matmul or
// attention keeps fp32 throughout (the refusal is for precision = "bf16" alone).
// CHECK-LABEL: func.func @forward
// CHECK: kiln.gelu %{{.*}} : tensor<4x4xf32>
// CHECK: kiln.reduce_sum %{{.*}} : tensor<4x4xf32> -> tensor<f32>
func.func @forward() -> tensor<f32> {
  %x = kiln.zeros : tensor<4x4xf32>
  %g = kiln.gelu %x : tensor<4x4xf32>
  %l = kiln.reduce_sum %g : tensor<4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A bias is either operand of the add: on the left it is narrowed too, and the add is bf16. A
// broadcast of something other than a parameter (kiln.zeros here) is no bias: that add promotes
// to fp32, the product widened in front of it.
// CHECK-LABEL: func.func @forward
// CHECK: %[[H:.*]] = kiln.matmul {{.*}} -> tensor<4x16xbf16>
// CHECK: kiln.cast %{{.*}} : tensor<16xf32> -> tensor<16xbf16>
// CHECK: %[[B:.*]] = kiln.broadcast %{{.*}} : tensor<16xbf16> -> tensor<4x16xbf16>
// CHECK: kiln.add %[[B]], %[[H]] : tensor<4x16xbf16>
// CHECK: %[[Z:.*]] = kiln.broadcast %{{.*}} : tensor<16xf32> -> tensor<4x16xf32>
// CHECK: %[[HW:.*]] = kiln.cast %[[H]] : tensor<4x16xbf16> -> tensor<4x16xf32>
// CHECK: kiln.add %[[HW]], %[[Z]] : tensor<4x16xf32>
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @w : tensor<8x16xf32> {init = "zeros"}
kiln.parameter @b : tensor<16xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %w = kiln.param @w : tensor<8x16xf32>
  %h = kiln.matmul %x, %w : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %b = kiln.param @b : tensor<16xf32>
  %bb = kiln.broadcast %b : tensor<16xf32> -> tensor<4x16xf32>
  %hb = kiln.add %bb, %h : tensor<4x16xf32>
  %z = kiln.zeros : tensor<16xf32>
  %zb = kiln.broadcast %z : tensor<16xf32> -> tensor<4x16xf32>
  %hz = kiln.add %h, %zb : tensor<4x16xf32>
  %s = kiln.add %hb, %hz : tensor<4x16xf32>
  %l = kiln.reduce_sum %s : tensor<4x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Attention reads bf16 qkv (a cast in front) and gives a bf16 result, its lse staying fp32; a
// reshape keeps its input's element type, so the product after it reads bf16 without a cast.
// CHECK-LABEL: func.func @forward
// CHECK: %[[Q:.*]] = kiln.cast %{{.*}} : tensor<2x4x24xf32> -> tensor<2x4x24xbf16>
// CHECK: %[[O:.*]], %{{.*}} = kiln.attention %[[Q]] {num_heads = 2 : i64} : tensor<2x4x24xbf16> -> tensor<2x4x8xbf16>, tensor<2x2x4xf32>
// CHECK: %[[R:.*]] = kiln.reshape %[[O]] : tensor<2x4x8xbf16> -> tensor<8x8xbf16>
// CHECK: kiln.matmul %[[R]], %{{.*}} : tensor<8x8xbf16>, tensor<8x8xbf16> -> tensor<8x8xbf16>
kiln.parameter @qkv : tensor<2x4x24xf32> {init = "zeros"}
kiln.parameter @w : tensor<8x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %qkv = kiln.param @qkv : tensor<2x4x24xf32>
  %o, %lse = kiln.attention %qkv {num_heads = 2 : i64} : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x2x4xf32>
  %r = kiln.reshape %o : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %w = kiln.param @w : tensor<8x8xf32>
  %y = kiln.matmul %r, %w : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %l = kiln.reduce_sum %y : tensor<8x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A layer norm whose output nothing reads (only its mean is used) keeps it fp32: "every user is a
// matrix product" holds for no user at all, which is no reason for bf16.
// CHECK-LABEL: func.func @forward
// (Its operands are no parameters: kiln-autodiff, in the STEP run, refuses a statistic computed
// from a parameter that reaches the loss.)
// CHECK: kiln.layer_norm {{.*}} -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
func.func @forward() -> tensor<f32> {
  %x = kiln.zeros : tensor<4x8xf32>
  %g = kiln.zeros : tensor<8xf32>
  %b = kiln.zeros : tensor<8xf32>
  %a, %m, %r = kiln.layer_norm %x, %g, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %l = kiln.reduce_sum %m : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
