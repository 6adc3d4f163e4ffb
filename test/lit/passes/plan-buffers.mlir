// RUN: kiln-opt %s -split-input-file -kiln-plan-buffers | FileCheck %s

// Offsets on a chain: GELU writes in place over its dead input, reshapes alias their input,
// the transpose needs a second slot, and the final scalar reuses the first slot.
// CHECK-LABEL: func.func @forward
// CHECK-SAME: kiln.arena_size = 512
// CHECK: kiln.param @w {kiln.offsets = array<i64: -1>}
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.reshape %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.transpose %{{.*}} {kiln.offsets = array<i64: 256>}
// CHECK: kiln.reshape %{{.*}} {kiln.offsets = array<i64: 256>}
// CHECK: kiln.reduce_sum %{{.*}} {kiln.offsets = array<i64: 0>}
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<64xf32>
  %a = kiln.gelu %w : tensor<64xf32>
  %b = kiln.gelu %a : tensor<64xf32>
  %c = kiln.reshape %b : tensor<64xf32> -> tensor<8x8xf32>
  %d = kiln.transpose %c : tensor<8x8xf32> -> tensor<8x8xf32>
  %e = kiln.reshape %d : tensor<8x8xf32> -> tensor<64xf32>
  %l = kiln.reduce_sum %e : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A value used after an elementwise op cannot be overwritten by it: %a is read again by the
// add, so the GELU result takes a fresh slot (over the dead statistics); the add then writes
// over %a, its first operand, and the sum reuses the GELU's slot.
// CHECK-LABEL: func.func @forward
// CHECK-SAME: kiln.arena_size = 2048
// CHECK: kiln.layer_norm {{.*}} {kiln.offsets = array<i64: 0, 1024, 1280>}
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 1024>}
// CHECK: kiln.add %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.reduce_sum %{{.*}} {kiln.offsets = array<i64: 1024>}
kiln.parameter @x : tensor<4x64xf32> {init = "zeros"}
kiln.parameter @g : tensor<64xf32> {init = "ones"}
kiln.parameter @b : tensor<64xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x64xf32>
  %g = kiln.param @g : tensor<64xf32>
  %b = kiln.param @b : tensor<64xf32>
  %a, %mean, %rstd = kiln.layer_norm %x, %g, %b : tensor<4x64xf32>, tensor<64xf32>, tensor<64xf32> -> tensor<4x64xf32>, tensor<4xf32>, tensor<4xf32>
  %u = kiln.gelu %a : tensor<4x64xf32>
  %s = kiln.add %a, %u : tensor<4x64xf32>
  %l = kiln.reduce_sum %s : tensor<4x64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A key/value cache is live for the whole call, so nothing shares its storage and it keeps what
// the previous call stored: the values after its last use (the transpose, the sum) take slots of
// their own, not [0, 1024), which a cache live only from its op to its use would free for them.
// CHECK-LABEL: func.func @decode
// CHECK-SAME: kiln.arena_size = 1536
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 1024>}
// CHECK: kiln.kv_cache "h.0.attn" {kiln.offsets = array<i64: 0>}
// CHECK: kiln.decode_attention {{.*}} {kiln.offsets = array<i64: 1280>
// CHECK: kiln.transpose {{.*}} {kiln.offsets = array<i64: 1024>}
// CHECK: kiln.reduce_sum {{.*}} {kiln.offsets = array<i64: 1280>}
kiln.parameter @w : tensor<2x24xf32> {init = "zeros"}
func.func @decode() -> tensor<f32> {
  %w = kiln.param @w : tensor<2x24xf32>
  %p = kiln.input "position" : tensor<1xi32>
  %qkv = kiln.gelu %w : tensor<2x24xf32>
  %kv = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
  %y = kiln.decode_attention %qkv, %kv, %p {num_heads = 2 : i64} : tensor<2x24xf32>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<2x8xf32>
  %t = kiln.transpose %y : tensor<2x8xf32> -> tensor<8x2xf32>
  %s = kiln.reduce_sum %t : tensor<8x2xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// The caches come first, in op order, ahead of larger values (which best fit places first): a
// function that declares the same caches (@prefill beside @decode) holds them at the same
// offsets. Here the 4096-byte gelu would otherwise take offset 0.
// CHECK-LABEL: func.func @prefill
// CHECK-SAME: kiln.arena_size = 6144
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 2048>} : tensor<32x32xf32>
// CHECK: kiln.kv_cache "h.0.attn" {kiln.offsets = array<i64: 0>}
// CHECK: kiln.kv_cache "h.1.attn" {kiln.offsets = array<i64: 1024>}
kiln.parameter @w : tensor<4x24xf32> {init = "zeros"}
kiln.parameter @big : tensor<32x32xf32> {init = "zeros"}
func.func @prefill() -> tensor<4x8xf32> {
  %w = kiln.param @w : tensor<4x24xf32>
  %b = kiln.param @big : tensor<32x32xf32>
  %p = kiln.input "position" : tensor<1xi32>
  %g = kiln.gelu %b : tensor<32x32xf32>
  %qkv = kiln.gelu %w : tensor<4x24xf32>
  %kv0 = kiln.kv_cache "h.0.attn" : tensor<2x2x2x8x4xf32>
  %y0 = kiln.decode_attention %qkv, %kv0, %p {num_heads = 2 : i64} : tensor<4x24xf32>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<4x8xf32>
  %kv1 = kiln.kv_cache "h.1.attn" : tensor<2x2x2x8x4xf32>
  %y1 = kiln.decode_attention %qkv, %kv1, %p {num_heads = 2 : i64} : tensor<4x24xf32>, tensor<2x2x2x8x4xf32>, tensor<1xi32> -> tensor<4x8xf32>
  %s = kiln.add %y0, %y1 : tensor<4x8xf32>
  return %s : tensor<4x8xf32>
}

// -----

// An elementwise region loops over its largest value: an input smaller than that (here read
// through a broadcast, at i % 64 for every i of 128) is read again after the loop has passed its
// elements, so the result never takes its storage, even with the same byte size.
// CHECK-LABEL: func.func @forward
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.fusion "elementwise" "gelu_cast_broadcast"(%{{.*}}) {kiln.offsets = array<i64: 256>}
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<64xf32>
  %a = kiln.gelu %w : tensor<64xf32>
  %r = kiln.fusion "elementwise" "gelu_cast_broadcast"(%a) : (tensor<64xf32>) -> tensor<2x64xbf16> {
  ^bb0(%x: tensor<64xf32>):
    %g = kiln.gelu %x : tensor<64xf32>
    %c = kiln.cast %g : tensor<64xf32> -> tensor<64xbf16>
    %b = kiln.broadcast %c : tensor<64xbf16> -> tensor<2x64xbf16>
    kiln.yield %b : tensor<2x64xbf16>
  }
  %s = kiln.reduce_sum %r : tensor<2x64xbf16> -> tensor<64xbf16>
  %f = kiln.cast %s : tensor<64xbf16> -> tensor<64xf32>
  %l = kiln.reduce_sum %f : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// What is computed from an input must be read at the same element too: a GELU of it gathered as
// an embedding table (rows 0..3, read again for each of the 2 copies the broadcast makes) reads
// elements the loop has written, so the result does not take the input's storage.
// CHECK-LABEL: func.func @forward
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.fusion "elementwise" "gelu_iota_embedding_broadcast"(%{{.*}}) {kiln.offsets = array<i64: 256>}
kiln.parameter @w : tensor<8x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<8x8xf32>
  %a = kiln.gelu %w : tensor<8x8xf32>
  %r = kiln.fusion "elementwise" "gelu_iota_embedding_broadcast"(%a) : (tensor<8x8xf32>) -> tensor<2x4x8xf32> {
  ^bb0(%x: tensor<8x8xf32>):
    %g = kiln.gelu %x : tensor<8x8xf32>
    %i = kiln.iota : tensor<4xi32>
    %e = kiln.embedding %g[%i] : tensor<8x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
    %b = kiln.broadcast %e : tensor<4x8xf32> -> tensor<2x4x8xf32>
    kiln.yield %b : tensor<2x4x8xf32>
  }
  %f = kiln.reshape %r : tensor<2x4x8xf32> -> tensor<64xf32>
  %l = kiln.reduce_sum %f : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// One storage passed twice: as %x, read at the same element, and (through a reshape) as %t, a
// gathered table. The result would overwrite rows of %t before they are read again.
// CHECK-LABEL: func.func @forward
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.fusion "elementwise" "iota_embedding_broadcast_add"(%{{.*}}, %{{.*}}) {kiln.offsets = array<i64: 256>}
kiln.parameter @w : tensor<8x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<8x8xf32>
  %a = kiln.gelu %w : tensor<8x8xf32>
  %ar = kiln.reshape %a : tensor<8x8xf32> -> tensor<2x4x8xf32>
  %r = kiln.fusion "elementwise" "iota_embedding_broadcast_add"(%ar, %a) : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32> {
  ^bb0(%x: tensor<2x4x8xf32>, %t: tensor<8x8xf32>):
    %i = kiln.iota : tensor<4xi32>
    %e = kiln.embedding %t[%i] : tensor<8x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
    %b = kiln.broadcast %e : tensor<4x8xf32> -> tensor<2x4x8xf32>
    %y = kiln.add %x, %b : tensor<2x4x8xf32>
    kiln.yield %y : tensor<2x4x8xf32>
  }
  %f = kiln.reshape %r : tensor<2x4x8xf32> -> tensor<64xf32>
  %l = kiln.reduce_sum %f : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A region that widens bf16 to f32 writes 4 bytes per element over 2-byte inputs it has not read
// yet: the result must not take the input's storage even though the input dies there.
// CHECK-LABEL: func.func @forward
// CHECK: kiln.cast %{{.*}} {kiln.offsets = array<i64: 256>}
// CHECK: kiln.fusion "elementwise" "gelu_cast"(%{{.*}}) {kiln.offsets = array<i64: 0>}
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<64xf32>
  %a = kiln.cast %w : tensor<64xf32> -> tensor<64xbf16>
  %r = kiln.fusion "elementwise" "gelu_cast"(%a) : (tensor<64xbf16>) -> tensor<64xf32> {
  ^bb0(%x: tensor<64xbf16>):
    %g = kiln.gelu %x : tensor<64xbf16>
    %c = kiln.cast %g : tensor<64xbf16> -> tensor<64xf32>
    kiln.yield %c : tensor<64xf32>
  }
  %l = kiln.reduce_sum %r : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Caches whose size is not a multiple of the arena alignment still start aligned.
// CHECK-LABEL: func.func @decode
// CHECK: kiln.kv_cache "h.0.attn" {kiln.offsets = array<i64: 0>}
// CHECK: kiln.kv_cache "h.1.attn" {kiln.offsets = array<i64: 256>}
kiln.parameter @w : tensor<1x9xf32> {init = "zeros"}
func.func @decode() -> tensor<1x3xf32> {
  %w = kiln.param @w : tensor<1x9xf32>
  %p = kiln.input "position" : tensor<1xi32>
  %kv0 = kiln.kv_cache "h.0.attn" : tensor<2x1x1x1x3xf32>
  %y0 = kiln.decode_attention %w, %kv0, %p {num_heads = 1 : i64} : tensor<1x9xf32>, tensor<2x1x1x1x3xf32>, tensor<1xi32> -> tensor<1x3xf32>
  %kv1 = kiln.kv_cache "h.1.attn" : tensor<2x1x1x1x3xf32>
  %y1 = kiln.decode_attention %w, %kv1, %p {num_heads = 1 : i64} : tensor<1x9xf32>, tensor<2x1x1x1x3xf32>, tensor<1xi32> -> tensor<1x3xf32>
  %s = kiln.add %y0, %y1 : tensor<1x3xf32>
  return %s : tensor<1x3xf32>
}

// -----

// One value passed as both operands of an elementwise op, dying there: each element is read at
// the element being written, so the sum still takes %a's storage (no second slot).
// CHECK-LABEL: func.func @forward
// CHECK-SAME: kiln.arena_size = 512
// CHECK: kiln.gelu %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.add %{{.*}}, %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK: kiln.reduce_sum %{{.*}} {kiln.offsets = array<i64: 256>}
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<64xf32>
  %a = kiln.gelu %w : tensor<64xf32>
  %s = kiln.add %a, %a : tensor<64xf32>
  %l = kiln.reduce_sum %s : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A declaration has no body to plan and is left as it is; the function beside it is planned.
// Ops without results (the return) get no kiln.offsets.
// CHECK-LABEL: func.func private @helper() -> tensor<64xf32>{{$}}
// CHECK-LABEL: func.func @forward() -> tensor<f32> attributes {kiln.arena_size = 256 : i64}
// CHECK: kiln.reduce_sum %{{.*}} {kiln.offsets = array<i64: 0>}
// CHECK-NEXT: return %{{[0-9]+}} : tensor<f32>
kiln.parameter @w : tensor<64xf32> {init = "zeros"}
func.func private @helper() -> tensor<64xf32>
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<64xf32>
  %l = kiln.reduce_sum %w : tensor<64xf32> -> tensor<f32>
  return %l : tensor<f32>
}
