// RUN: kiln-opt %s -split-input-file -kiln-autodiff -verify-diagnostics

// The user-facing errors of kiln-autodiff.

// A module without @forward has nothing to differentiate.
// expected-error@below {{kiln-autodiff: the module has no @forward function to differentiate}}
module {
  kiln.parameter @w : tensor<4xf32> {init = "zeros"}
  func.func @loss() -> tensor<f32> {
    %w = kiln.param @w : tensor<4xf32>
    %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// A symbol named @forward that is not a function does not count.
// expected-error@below {{kiln-autodiff: the module has no @forward function to differentiate}}
module {
  kiln.parameter @forward : tensor<4xf32> {init = "zeros"}
}

// -----

// The pass refuses to run twice.
// expected-error@below {{kiln-autodiff: the module already has @micro_step}}
module {
  func.func @forward() -> tensor<f32> {
    %lw = kiln.hyper "loss_weight" : tensor<f32>
    return %lw : tensor<f32>
  }
  func.func @micro_step() -> tensor<f32> {
    %lw = kiln.hyper "loss_weight" : tensor<f32>
    return %lw : tensor<f32>
  }
}

// -----

// @forward must return the loss as a tensor<f32>, not a wider tensor.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-autodiff: @forward must return exactly the loss, a tensor<f32>}}
func.func @forward() -> tensor<4xf32> {
  %w = kiln.param @w : tensor<4xf32>
  return %w : tensor<4xf32>
}

// -----

// @forward must return exactly one value.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-autodiff: @forward must return exactly the loss, a tensor<f32>}}
func.func @forward() -> (tensor<f32>, tensor<f32>) {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  return %l, %l : tensor<f32>, tensor<f32>
}

// -----

// @forward must return something.
// expected-error@below {{kiln-autodiff: @forward must return exactly the loss, a tensor<f32>}}
func.func @forward() {
  return
}

// -----

// An op on the path to the loss without a gradient rule (here a kiln.gelu_grad) is
// reported at the forward op.
kiln.parameter @x : tensor<4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4xf32>
  // expected-error@below {{kiln-autodiff: 'kiln.gelu_grad' lies on the path to the loss but has no gradient rule}}
  %g = kiln.gelu_grad %x, %x : tensor<4xf32>
  %l = kiln.reduce_sum %g : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// The same for another rule-less op, kiln.embedding_grad, deeper in the graph.
kiln.parameter @g : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %ids = kiln.input "idx" : tensor<4xi32>
  %g = kiln.param @g : tensor<4x8xf32>
  // expected-error@below {{kiln-autodiff: 'kiln.embedding_grad' lies on the path to the loss but has no gradient rule}}
  %t = kiln.embedding_grad %g, %ids : tensor<4x8xf32>, tensor<4xi32> -> tensor<16x8xf32>
  %r = kiln.reshape %t : tensor<16x8xf32> -> tensor<128xf32>
  %l = kiln.reduce_sum %r : tensor<128xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A declaration without a body cannot be differentiated.
// expected-error@below {{kiln-autodiff: @forward must have a body and take no arguments}}
func.func private @forward() -> tensor<f32>

// -----

// Straight-line code only: a second block would be left out of the pass's order of ops.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
// expected-error@below {{kiln-autodiff: @forward must have one block (straight-line code)}}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
^bb1:
  %z = kiln.zeros : tensor<f32>
  return %z : tensor<f32>
}

// -----

// A module whose kiln.spec says bf16 takes its types from kiln-mixed-precision first: a step
// derived from fp32 types would be built in fp32 (and refused by kilnc).
// expected-error@below {{kiln-autodiff: 'kiln.spec' has precision = "bf16" but @forward computes nothing in bf16; run kiln-mixed-precision first (kiln-step-pipeline does)}}
module attributes {kiln.spec = {precision = "bf16"}} {
  kiln.parameter @w : tensor<4xf32> {init = "zeros"}
  func.func @forward() -> tensor<f32> {
    %w = kiln.param @w : tensor<4xf32>
    %l = kiln.reduce_sum %w : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// @forward reads its inputs with kiln.input: a function argument would be a value that no op of
// @micro_step defines.
// expected-error@below {{kiln-autodiff: @forward must have a body and take no arguments (inputs are kiln.input ops)}}
func.func @forward(%a: tensor<f32>) -> tensor<f32> {
  return %a : tensor<f32>
}

// -----

// kiln.scale's factor is a runtime scalar, so its rule gives it no gradient. A factor computed
// from a parameter would leave that parameter's gradient short of the factor's share.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
kiln.parameter @s : tensor<f32> {init = "ones"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %s = kiln.param @s : tensor<f32>
  // expected-error@below {{kiln-autodiff: operand #1 of 'kiln.scale' is computed from a parameter and reaches the loss, but its gradient rule gives it no gradient}}
  %y = kiln.scale %w, %s : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %l = kiln.reduce_sum %y : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A layer norm's mean is a statistic for the backward pass: read by the forward pass, here beside
// the normalized rows, its share of the input's gradient would be dropped.
kiln.parameter @x : tensor<2x4xf32> {init = "normal", init_std = 1.0 : f32}
kiln.parameter @g : tensor<4xf32> {init = "ones"}
kiln.parameter @b : tensor<4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<2x4xf32>
  %g = kiln.param @g : tensor<4xf32>
  %b = kiln.param @b : tensor<4xf32>
  // expected-error@below {{kiln-autodiff: result #1 of 'kiln.layer_norm' is a statistic for the backward pass, which takes no gradient, but it is computed from a parameter and reaches the loss}}
  %y, %mean, %rstd = kiln.layer_norm %x, %g, %b : tensor<2x4xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<2x4xf32>, tensor<2xf32>, tensor<2xf32>
  %ly = kiln.reduce_sum %y : tensor<2x4xf32> -> tensor<f32>
  %lm = kiln.reduce_sum %mean : tensor<2xf32> -> tensor<f32>
  %l = kiln.add %ly, %lm : tensor<f32>
  return %l : tensor<f32>
}

// -----

// The same for rstd (result #2), read alone.
kiln.parameter @x : tensor<2x4xf32> {init = "normal", init_std = 1.0 : f32}
kiln.parameter @g : tensor<4xf32> {init = "ones"}
kiln.parameter @b : tensor<4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<2x4xf32>
  %g = kiln.param @g : tensor<4xf32>
  %b = kiln.param @b : tensor<4xf32>
  // expected-error@below {{kiln-autodiff: result #2 of 'kiln.layer_norm' is a statistic}}
  %y, %mean, %rstd = kiln.layer_norm %x, %g, %b : tensor<2x4xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<2x4xf32>, tensor<2xf32>, tensor<2xf32>
  %l = kiln.reduce_sum %rstd : tensor<2xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Attention's log-sum-exp is a statistic too.
kiln.parameter @qkv : tensor<1x4x24xf32> {init = "normal", init_std = 1.0 : f32}
func.func @forward() -> tensor<f32> {
  %qkv = kiln.param @qkv : tensor<1x4x24xf32>
  // expected-error@below {{kiln-autodiff: result #1 of 'kiln.attention' is a statistic}}
  %y, %lse = kiln.attention %qkv {num_heads = 2 : i64} : tensor<1x4x24xf32> -> tensor<1x4x8xf32>, tensor<1x2x4xf32>
  %l = kiln.reduce_sum %lse : tensor<1x2x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// And the cross-entropy's.
kiln.parameter @logits : tensor<3x5xf32> {init = "normal", init_std = 1.0 : f32}
func.func @forward() -> tensor<f32> {
  %logits = kiln.param @logits : tensor<3x5xf32>
  %t = kiln.input "targets" : tensor<3xi32>
  // expected-error@below {{kiln-autodiff: result #1 of 'kiln.cross_entropy' is a statistic}}
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<3x5xf32>, tensor<3xi32> -> tensor<f32>, tensor<3xf32>
  %s = kiln.reduce_sum %lse : tensor<3xf32> -> tensor<f32>
  %l = kiln.add %loss, %s : tensor<f32>
  return %l : tensor<f32>
}
