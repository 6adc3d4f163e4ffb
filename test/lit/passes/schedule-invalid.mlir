// RUN: kiln-opt %s -split-input-file -kiln-schedule -verify-diagnostics

// A planned function is refused: a new order would make its kiln.offsets share memory between
// buffers that are then live together.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-schedule: @forward already has a buffer plan (kiln.arena_size); run kiln-schedule before kiln-plan-buffers}}
func.func @forward() -> tensor<f32> attributes {kiln.arena_size = 256 : i64} {
  %w = kiln.param @w {kiln.offsets = array<i64: -1>} : tensor<4xf32>
  %l = kiln.reduce_sum %w {kiln.offsets = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Straight-line code only: a second block would be left out of the pass's order of ops.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-schedule: @forward must have one block (straight-line code)}}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
^bb1:
  %z = kiln.zeros : tensor<f32>
  return %z : tensor<f32>
}

// -----

// Every value is sized as a tensor of static shape: another dialect's i32 (here a call's) has no
// size in the arena.
func.func private @ext() -> i32
func.func @forward() -> tensor<f32> {
  // expected-error@below {{kiln-schedule: a result of type 'i32', not a tensor of static shape: it has no size in the arena}}
  %c = func.call @ext() : () -> i32
  %h = kiln.hyper "lr" : tensor<f32>
  return %h : tensor<f32>
}

// -----

// Another dialect's tensor has none of the kiln types' bounds (1 to 2^48 elements): 2^60 f64
// made the arena size negative (IR the verifier refuses), and 2^62 x 4 elements wrapped to 0 bytes.
func.func private @ext() -> tensor<1152921504606846976xf64>
func.func @forward() -> tensor<f32> {
  // expected-error@below {{kiln-schedule: a value of type 'tensor<1152921504606846976xf64>' has no element or more than 2^48 (every kiln value holds 1 to 2^48): its size in the arena would not fit}}
  %c = func.call @ext() : () -> tensor<1152921504606846976xf64>
  %h = kiln.hyper "lr" : tensor<f32>
  return %h : tensor<f32>
}

// -----

func.func private @ext() -> tensor<4611686018427387904x4xf32>
func.func @forward() -> tensor<f32> {
  // expected-error@below {{kiln-schedule: a value of type 'tensor<4611686018427387904x4xf32>' has no element or more than 2^48 (every kiln value holds 1 to 2^48): its size in the arena would not fit}}
  %c = func.call @ext() : () -> tensor<4611686018427387904x4xf32>
  %h = kiln.hyper "lr" : tensor<f32>
  return %h : tensor<f32>
}

// -----

// expected-error@below {{kiln-schedule: a value of type 'tensor<0x4xf32>' has no element or more than 2^48 (every kiln value holds 1 to 2^48): its size in the arena would not fit}}
func.func @f(%a: tensor<0x4xf32>) -> tensor<f32> {
  %h = kiln.hyper "lr" : tensor<f32>
  return %h : tensor<f32>
}

// -----

// An argument is sized the same way: a dynamic tensor has no size in the arena.
// expected-error@below {{kiln-schedule: @f's argument #0 has type 'tensor<?xf32>', not a tensor of static shape: it has no size in the arena}}
func.func @f(%a: tensor<?xf32>) -> tensor<f32> {
  %h = kiln.hyper "lr" : tensor<f32>
  return %h : tensor<f32>
}
