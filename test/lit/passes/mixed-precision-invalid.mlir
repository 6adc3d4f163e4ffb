// RUN: kiln-opt %s -split-input-file -kiln-mixed-precision -verify-diagnostics

// expected-error@below {{kiln-mixed-precision: no @forward function}}
module {
}

// -----

// After kiln-autodiff the types are fixed: the backward pass follows the forward's.
func.func @forward() -> tensor<f32> {
  %x = kiln.zeros : tensor<4xf32>
  %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// expected-error@below {{kiln-mixed-precision: the module already has @micro_step; run the pass before kiln-autodiff}}
func.func @micro_step() -> tensor<f32> {
  %x = kiln.zeros : tensor<4xf32>
  %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A module built from an fp32 spec: kilnc refuses bf16 types under precision = "fp32", so the
// pass refuses to make them (kiln-step-pipeline runs it only for precision = "bf16").
// expected-error@below {{kiln-mixed-precision: 'kiln.spec' has precision = "fp32"; the pass makes a bf16 module, which kilnc compiles only with precision = "bf16" (set it in the spec and emit the graph again)}}
module attributes {kiln.spec = {precision = "fp32"}} {
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4xf32>
    %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// Without the key, a kiln.spec means fp32 (as kilnc reads it).
// expected-error@below {{kiln-mixed-precision: 'kiln.spec' has precision = "fp32"}}
module attributes {kiln.spec = {target = "cpu"}} {
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4xf32>
    %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// Under precision = "bf16" the policy must give bf16 to something the loss depends on: with no
// matmul or attention, nothing (kiln-autodiff would then ask for this pass, which has run).
module attributes {kiln.spec = {precision = "bf16"}} {
  // expected-error@below {{kiln-mixed-precision: 'kiln.spec' has precision = "bf16" but nothing the functions return is computed in bf16 (autocast's policy gives bf16 to kiln.matmul and kiln.attention); compile this graph with precision = "fp32"}}
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4x4xf32>
    %g = kiln.gelu %x : tensor<4x4xf32>
    %l = kiln.reduce_sum %g : tensor<4x4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// A matmul the loss does not read does not count: canonicalization drops it from the step, whose
// precision kilnc then finds fp32.
module attributes {kiln.spec = {precision = "bf16"}} {
  // expected-error@below {{nothing the functions return is computed in bf16}}
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4x4xf32>
    %m = kiln.matmul %x, %x : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    %l = kiln.reduce_sum %x : tensor<4x4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// A kiln.param read only reads: unused, it is dead (canonicalization drops it), bf16 or not.
module attributes {kiln.spec = {precision = "bf16"}} {
  kiln.parameter @w : tensor<4x4xf32> {init = "zeros"}
  // expected-error@below {{nothing the functions return is computed in bf16}}
  func.func @forward() -> tensor<f32> {
    %d = kiln.param @w : tensor<4x4xbf16>
    %x = kiln.param @w : tensor<4x4xf32>
    %l = kiln.reduce_sum %x : tensor<4x4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// A call keeps its callee's types while the pass retypes the value passed to it (the product,
// now bf16): the output failed the func.call verifier after the pass instead of an error here.
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @w : tensor<8x8xf32> {init = "zeros"}
func.func private @sink(tensor<4x8xf32>)
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %w = kiln.param @w : tensor<8x8xf32>
  %m = kiln.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  // expected-error@below {{kiln-mixed-precision: 'func.call' in @forward is not a kiln op: the pass changes the element types of the values it reads and would leave its types behind (graph IR holds kiln ops only)}}
  func.call @sink(%m) : (tensor<4x8xf32>) -> ()
  %s = kiln.reduce_sum %m : tensor<4x8xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// The callee's result turns bf16 (@logits returns its product) but the call's stays fp32.
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @w : tensor<8x8xf32> {init = "zeros"}
func.func @logits() -> tensor<4x8xf32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %w = kiln.param @w : tensor<8x8xf32>
  %m = kiln.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  return %m : tensor<4x8xf32>
}
func.func @forward() -> tensor<f32> {
  // expected-error@below {{kiln-mixed-precision: 'func.call' in @forward is not a kiln op: the pass changes the element types of the values it reads and would leave its types behind (graph IR holds kiln ops only)}}
  %m = func.call @logits() : () -> tensor<4x8xf32>
  %s = kiln.reduce_sum %m : tensor<4x8xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// A declaration of @forward has no graph to give types to.
// expected-error@below {{kiln-mixed-precision: no @forward function}}
module {
  func.func private @forward() -> tensor<f32>
}

// -----

// Any precision but "bf16" is refused, and the message names the one the spec has.
// expected-error@below {{kiln-mixed-precision: 'kiln.spec' has precision = "fp16"; the pass makes a bf16 module}}
module attributes {kiln.spec = {precision = "fp16"}} {
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4xf32>
    %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}
