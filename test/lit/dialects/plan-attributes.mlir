// RUN: kiln-opt %s -split-input-file | FileCheck %s

// Buffer plans that verify (KilnDialect.cpp), at the edges of its checks: -1 on state followed
// back through a chain of reshapes, and an arena size of 0.

// A parameter seen through two reshapes is still state outside the arena (-1); an op's result
// takes an arena offset that is a multiple of 256.
// CHECK-LABEL: func.func @planned
// CHECK-SAME:    kiln.arena_size = 512 : i64
// CHECK:         kiln.param @wte {kiln.offsets = array<i64: -1>}
// CHECK:         kiln.reshape %{{.*}} {kiln.offsets = array<i64: -1>}
// CHECK:         kiln.reshape %{{.*}} {kiln.offsets = array<i64: -1>}
// CHECK:         kiln.gelu %{{.*}} {kiln.offsets = array<i64: 256>}
kiln.parameter @wte : tensor<16x8xf32> {init = "zeros"}
func.func @planned() -> tensor<128xf32> attributes {kiln.arena_size = 512 : i64} {
  %p = kiln.param @wte {kiln.offsets = array<i64: -1>} : tensor<16x8xf32>
  %a = kiln.reshape %p {kiln.offsets = array<i64: -1>} : tensor<16x8xf32> -> tensor<8x16xf32>
  %b = kiln.reshape %a {kiln.offsets = array<i64: -1>} : tensor<8x16xf32> -> tensor<128xf32>
  %c = kiln.gelu %b {kiln.offsets = array<i64: 256>} : tensor<128xf32>
  return %c : tensor<128xf32>
}

// -----

// A function with nothing in the arena needs 0 bytes: an arena size of 0 verifies.
// CHECK-LABEL: func.func @empty_arena
// CHECK-SAME:    kiln.arena_size = 0 : i64
func.func @empty_arena() attributes {kiln.arena_size = 0 : i64} {
  return
}
