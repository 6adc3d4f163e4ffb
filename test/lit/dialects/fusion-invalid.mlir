// RUN: kiln-opt %s -split-input-file -verify-diagnostics

func.func @wrong_argument_count(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op body has 0 arguments for 1 inputs}}
  %0 = kiln.fusion "elementwise" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
    %c = kiln.zeros : tensor<4xf32>
    kiln.yield %c : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @argument_type(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op body argument #0 is 'tensor<4xbf16>' but its input is 'tensor<4xf32>'}}
  %0 = kiln.fusion "elementwise" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xbf16>):
    %g = kiln.gelu %a : tensor<4xbf16>
    %c = kiln.cast %g : tensor<4xbf16> -> tensor<4xf32>
    kiln.yield %c : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @yield_types(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op kiln.yield's types differ from the results' types}}
  %0 = kiln.fusion "elementwise" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %g = kiln.gelu %a : tensor<4xf32>
    %c = kiln.cast %g : tensor<4xf32> -> tensor<4xbf16>
    kiln.yield %c : tensor<4xbf16>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @unknown_kind(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op unknown kind 'softmax' (elementwise, matmul, layer_norm, layer_norm_grad, classifier, embedding_grad, optimizer, reduce_sum)}}
  %0 = kiln.fusion "softmax" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %g = kiln.gelu %a : tensor<4xf32>
    kiln.yield %g : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @no_name(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op needs a kernel name}}
  %0 = kiln.fusion "elementwise" ""(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %g = kiln.gelu %a : tensor<4xf32>
    kiln.yield %g : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @matmul_in_elementwise(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'elementwise' holds a non-elementwise op}}
  %0 = kiln.fusion "elementwise" "matmul"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    %m = kiln.matmul %a, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.yield %m : tensor<4x4xf32>
  }
  return %0 : tensor<4x4xf32>
}

// -----

func.func @two_matmuls(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'matmul' needs exactly one kiln.matmul, has 2}}
  %0 = kiln.fusion "matmul" "matmul"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    %m = kiln.matmul %a, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    %n = kiln.matmul %m, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.yield %n : tensor<4x4xf32>
  }
  return %0 : tensor<4x4xf32>
}

// -----

func.func @unfusable_op(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'kiln.fusion' op holds an op no kernel template fuses}}
  %0 = kiln.fusion "elementwise" "transpose"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    %t = kiln.transpose %a : tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.yield %t : tensor<4x4xf32>
  }
  return %0 : tensor<4x4xf32>
}

// -----

func.func @no_adamw() {
  // expected-error @+1 {{'kiln.fusion' op of kind 'optimizer' needs at least one kiln.adamw}}
  kiln.fusion "optimizer" "nothing"() : () -> () {
    kiln.yield
  }
  return
}

// -----

func.func @yield_outside(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.yield' op expects parent op 'kiln.fusion'}}
  kiln.yield %x : tensor<4xf32>
}

// -----

// A fused region holds plain ops: kernels are not made of kernels.
func.func @nested(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op fusion regions do not nest}}
  %0 = kiln.fusion "elementwise" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %i = kiln.fusion "elementwise" "gelu"(%a) : (tensor<4xf32>) -> tensor<4xf32> {
    ^bb0(%b: tensor<4xf32>):
      %g = kiln.gelu %b : tensor<4xf32>
      kiln.yield %g : tensor<4xf32>
    }
    kiln.yield %i : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

// The body hands its values out through kiln.yield, and nothing else.
func.func @no_yield(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op body must end with kiln.yield}}
  %0 = kiln.fusion "elementwise" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %g = kiln.gelu %a : tensor<4xf32>
    func.return %g : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

// A classifier kernel computes one logits gradient.
func.func @two_grads(%logits: tensor<4x16xf32>, %t: tensor<4xi32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  // expected-error @+1 {{'kiln.fusion' op of kind 'classifier' holds 2 kiln.cross_entropy_grad}}
  %0:2 = kiln.fusion "classifier" "cross_entropy_cross_entropy_grad"(%logits, %t) : (tensor<4x16xf32>, tensor<4xi32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  ^bb0(%l: tensor<4x16xf32>, %tt: tensor<4xi32>):
    %loss, %lse = kiln.cross_entropy %l, %tt : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
    %d1 = kiln.cross_entropy_grad %loss, %l, %lse, %tt : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
    %d2 = kiln.cross_entropy_grad %loss, %l, %lse, %tt : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
    kiln.yield %d1, %d2 : tensor<4x16xf32>, tensor<4x16xf32>
  }
  return %0#0, %0#1 : tensor<4x16xf32>, tensor<4x16xf32>
}
