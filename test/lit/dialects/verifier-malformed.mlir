// RUN: kiln-opt %s -split-input-file -verify-diagnostics

// Malformed ops reach the verifiers before their own checks have run (a fusion region's body,
// a later kiln.kv_cache, the producer of a planned value): each is reported, nothing crashes.

// A 0-D tensor has no last dimension to split or join.
kiln.parameter @w : tensor<f32> {init = "zeros"}
func.func @split_0d() -> tensor<f32> {
  %w = kiln.param @w : tensor<f32>
  // expected-error @+1 {{'kiln.split' op needs tensors of at least one dimension (it splits or joins the last), got 'tensor<f32>'}}
  %a = kiln.split %w : tensor<f32> -> tensor<f32>
  return %a : tensor<f32>
}

// -----

kiln.parameter @w : tensor<f32> {init = "zeros"}
func.func @concat_0d() -> tensor<f32> {
  %w = kiln.param @w : tensor<f32>
  // expected-error @+1 {{'kiln.concat' op needs tensors of at least one dimension (it splits or joins the last), got 'tensor<f32>'}}
  %a = kiln.concat %w, %w : tensor<f32>, tensor<f32> -> tensor<f32>
  return %a : tensor<f32>
}

// -----

// A fused op without its operands and results: its own verifier reports it, before the region's.
func.func @fused_layer_norm_without_operands(%x: tensor<4x8xf32>) {
  kiln.fusion "layer_norm" "ln"(%x) : (tensor<4x8xf32>) -> () {
  ^bb0(%a: tensor<4x8xf32>):
    // expected-error @+1 {{'kiln.layer_norm' op expected 3 results}}
    "kiln.layer_norm"() : () -> ()
    kiln.yield
  }
  return
}

// -----

func.func @fused_matmul_one_operand(%x: tensor<4x8xf32>) -> tensor<4x4xf32> {
  %r = kiln.fusion "matmul" "mm"(%x) : (tensor<4x8xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x8xf32>):
    // expected-error @+1 {{'kiln.matmul' op expected 2 operands, but found 1}}
    %0 = "kiln.matmul"(%a) : (tensor<4x8xf32>) -> tensor<4x4xf32>
    kiln.yield %0 : tensor<4x4xf32>
  }
  return %r : tensor<4x4xf32>
}

// -----

func.func @fused_scalar_result(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = kiln.fusion "elementwise" "ew"(%x) : (tensor<4xf32>) -> (tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'kiln.gelu' op result #0 must be statically shaped tensor of f32 or bf16}}
    %0 = "kiln.gelu"(%a) : (tensor<4xf32>) -> f32
    %1 = "kiln.gelu"(%0) : (f32) -> tensor<4xf32>
    kiln.yield %1 : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fused_loss_without_operands(%x: tensor<4x8xf32>) {
  kiln.fusion "classifier" "ce"(%x) : (tensor<4x8xf32>) -> () {
  ^bb0(%a: tensor<4x8xf32>):
    // expected-error @+1 {{'kiln.cross_entropy' op expected 2 results}}
    "kiln.cross_entropy"() : () -> ()
    kiln.yield
  }
  return
}

// -----

// The first cache checks every cache's name, the later ones not verified yet.
func.func @kv_cache_without_name(%qkv: tensor<2x24xf32>, %p: tensor<1xi32>) -> tensor<2x8xf32> {
  %kv = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
  %0 = kiln.decode_attention %qkv, %kv, %p {num_heads = 2 : i64} : tensor<2x24xf32>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<2x8xf32>
  // expected-error @+1 {{'kiln.kv_cache' op requires attribute 'cache_name'}}
  %kv2 = "kiln.kv_cache"() : () -> tensor<2x2x2x8x4xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// A planned value marked outside the arena is followed back through its reshapes: one without
// its operand stops the walk (it is computed here), and the plan's check reports it first.
func.func @reshape_without_operand_outside_arena() -> tensor<8xf32> {
  // expected-error @+1 {{'kiln.offsets'[0] = -1 marks state kept outside the arena, but this result is computed here}}
  %0 = "kiln.reshape"() {kiln.offsets = array<i64: -1>} : () -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
