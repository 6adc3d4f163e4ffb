// RUN: kiln-opt %s -split-input-file -verify-diagnostics
// The unfusable-op message names one op alone with nothing after it (-verify-diagnostics matches
// substrings, so it cannot see a stray "(and 0 more)").
// RUN: not kiln-opt %s -split-input-file 2>&1 | FileCheck %s

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
  // expected-error @+1 {{'kiln.fusion' op kiln.yield gives 'tensor<4xbf16>' but the results are 'tensor<4xf32>'}}
  %0 = kiln.fusion "elementwise" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %g = kiln.gelu %a : tensor<4xf32>
    %c = kiln.cast %g : tensor<4xf32> -> tensor<4xbf16>
    kiln.yield %c : tensor<4xbf16>
  }
  return %0 : tensor<4xf32>
}

// -----

func.func @yield_nothing(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op kiln.yield gives no values but the results are 'tensor<4xf32>'}}
  %0 = kiln.fusion "elementwise" "gelu"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %g = kiln.gelu %a : tensor<4xf32>
    kiln.yield
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

func.func @bad_name(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op kernel name "a b(" may hold only letters, digits and '_' (it names a C function)}}
  %0 = kiln.fusion "elementwise" "a b("(%x) : (tensor<4xf32>) -> tensor<4xf32> {
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

// Column sums are not elementwise either (they have a reduce_sum kernel of their own).
func.func @reduce_sum_in_elementwise(%x: tensor<4x8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'elementwise' holds a non-elementwise op}}
  %0 = kiln.fusion "elementwise" "gelu_reduce_sum"(%x) : (tensor<4x8xf32>) -> tensor<8xf32> {
  ^bb0(%a: tensor<4x8xf32>):
    %g = kiln.gelu %a : tensor<4x8xf32>
    %s = kiln.reduce_sum %g : tensor<4x8xf32> -> tensor<8xf32>
    kiln.yield %s : tensor<8xf32>
  }
  return %0 : tensor<8xf32>
}

// -----

func.func @two_matmuls(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'matmul' needs exactly one kiln.matmul, has 2}}
  %0:2 = kiln.fusion "matmul" "matmul"(%x) : (tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  ^bb0(%a: tensor<4x4xf32>):
    %m = kiln.matmul %a, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    %n = kiln.matmul %a, %a {transpose_lhs} : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.yield %m, %n : tensor<4x4xf32>, tensor<4x4xf32>
  }
  return %0#1 : tensor<4x4xf32>
}

// -----

// The product reads its operands from memory: the region's inputs.
func.func @matmul_of_computed(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'kiln.fusion' op reads a kiln.matmul operand from a value computed in the region; it must be an input}}
  %0 = kiln.fusion "matmul" "gelu_matmul"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    %g = kiln.gelu %a : tensor<4x4xf32>
    %m = kiln.matmul %g, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.yield %m : tensor<4x4xf32>
  }
  return %0 : tensor<4x4xf32>
}

// -----

// Every op of the region computes something it reads or yields (canonicalization would drop it).
func.func @dead_value(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = kiln.fusion "matmul" "matmul_add"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    // expected-error @+1 {{'kiln.matmul' op computes values neither read in its fusion region nor yielded}}
    %m = kiln.matmul %a, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    %s = kiln.add %a, %a : tensor<4x4xf32>
    kiln.yield %s : tensor<4x4xf32>
  }
  return %0 : tensor<4x4xf32>
}

// -----

// A reduce_sum kernel sums the columns first, then applies what consumes the sums.
func.func @reduce_sum_not_first(%x: tensor<4x8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'reduce_sum' must begin with its kiln.reduce_sum}}
  %0 = kiln.fusion "reduce_sum" "gelu_reduce_sum"(%x) : (tensor<4x8xf32>) -> tensor<8xf32> {
  ^bb0(%a: tensor<4x8xf32>):
    %g = kiln.gelu %a : tensor<4x8xf32>
    %s = kiln.reduce_sum %g : tensor<4x8xf32> -> tensor<8xf32>
    kiln.yield %s : tensor<8xf32>
  }
  return %0 : tensor<8xf32>
}

// -----

// No body at all: no kiln.yield to end it.
func.func @empty_body(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op body must end with kiln.yield}}
  %0 = "kiln.fusion"(%x) <{kind = "elementwise", kernel = "gelu"}> ({
  ^bb0(%a: tensor<4xf32>):
  }) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// CHECK: error: 'kiln.fusion' op holds an op no kernel template fuses: kiln.transpose{{$}}
func.func @unfusable_op(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'kiln.fusion' op holds an op no kernel template fuses: kiln.transpose}}
  %0 = kiln.fusion "elementwise" "transpose"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    %t = kiln.transpose %a : tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.yield %t : tensor<4x4xf32>
  }
  return %0 : tensor<4x4xf32>
}

// -----

// Past the first unfusable op, the message counts the others.
func.func @unfusable_ops(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'kiln.fusion' op holds an op no kernel template fuses: kiln.transpose (and 1 more)}}
  %0 = kiln.fusion "elementwise" "transposes"(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    %t = kiln.transpose %a : tensor<4x4xf32> -> tensor<4x4xf32>
    %u = kiln.transpose %t : tensor<4x4xf32> -> tensor<4x4xf32>
    kiln.yield %u : tensor<4x4xf32>
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

// -----

// The optimizer kernel reads each gradient from memory (an accumulated kiln.grad).
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @adamw_of_computed(%g: tensor<4xf32>, %c: tensor<f32>) {
  // expected-error @+1 {{'kiln.fusion' op reads a kiln.adamw gradient from a value computed in the region; it must be an input}}
  kiln.fusion "optimizer" "scale_adamw"(%g, %c) : (tensor<4xf32>, tensor<f32>) -> () {
  ^bb0(%a: tensor<4xf32>, %s: tensor<f32>):
    %h = kiln.scale %a, %s : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
    kiln.adamw @w, %h scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    kiln.yield
  }
  return
}

// -----

// An embedding backward's fusion is the kiln.embedding_grad and at most the kiln.accumulate_grad
// of its rows: the kernel scatters the rows straight into the accumulator, so an op between
// them would be dropped.
kiln.parameter @w : tensor<8x4xf32> {init = "zeros"}
func.func @embedding_grad_then_add(%d: tensor<2x4xf32>, %ids: tensor<2xi32>) {
  kiln.fusion "embedding_grad" "embedding_grad_add_accumulate_grad"(%d, %ids) : (tensor<2x4xf32>, tensor<2xi32>) -> () {
  ^bb0(%a: tensor<2x4xf32>, %b: tensor<2xi32>):
    %e = kiln.embedding_grad %a, %b : tensor<2x4xf32>, tensor<2xi32> -> tensor<8x4xf32>
    // expected-error @+1 {{'kiln.add' op in a fusion of kind 'embedding_grad': only the kiln.accumulate_grad of the kiln.embedding_grad's result, its one use, may join it}}
    %s = kiln.add %e, %e : tensor<8x4xf32>
    kiln.accumulate_grad @w, %s : tensor<8x4xf32>
    kiln.yield
  }
  return
}

// -----

// The rows accumulated and yielded too: the kernel writes only the accumulator.
kiln.parameter @w : tensor<8x4xf32> {init = "zeros"}
func.func @embedding_grad_accumulated_and_yielded(%d: tensor<2x4xf32>, %ids: tensor<2xi32>) -> tensor<8x4xf32> {
  %r = kiln.fusion "embedding_grad" "embedding_grad_accumulate_grad"(%d, %ids) : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<8x4xf32> {
  ^bb0(%a: tensor<2x4xf32>, %b: tensor<2xi32>):
    %e = kiln.embedding_grad %a, %b : tensor<2x4xf32>, tensor<2xi32> -> tensor<8x4xf32>
    // expected-error @+1 {{'kiln.accumulate_grad' op in a fusion of kind 'embedding_grad': only the kiln.accumulate_grad of the kiln.embedding_grad's result, its one use, may join it}}
    kiln.accumulate_grad @w, %e : tensor<8x4xf32>
    kiln.yield %e : tensor<8x4xf32>
  }
  return %r : tensor<8x4xf32>
}

// -----

// Not accumulated, the rows are added into the region's yielded result: in f32.
func.func @embedding_grad_bf16(%d: tensor<2x4xf32>, %ids: tensor<2xi32>) -> tensor<8x4xbf16> {
  %r = kiln.fusion "embedding_grad" "embedding_grad"(%d, %ids) : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<8x4xbf16> {
  ^bb0(%a: tensor<2x4xf32>, %b: tensor<2xi32>):
    // expected-error @+1 {{'kiln.embedding_grad' op in a fusion of kind 'embedding_grad': a yielded result must be f32 (its rows are added into it), got 'tensor<8x4xbf16>'}}
    %e = kiln.embedding_grad %a, %b : tensor<2x4xf32>, tensor<2xi32> -> tensor<8x4xbf16>
    kiln.yield %e : tensor<8x4xbf16>
  }
  return %r : tensor<8x4xbf16>
}

// -----

// The rows go into one result: yielded twice, the second would never be written.
func.func @embedding_grad_yielded_twice(%d: tensor<2x4xf32>, %ids: tensor<2xi32>) -> tensor<8x4xf32> {
  %r:2 = kiln.fusion "embedding_grad" "embedding_grad"(%d, %ids) : (tensor<2x4xf32>, tensor<2xi32>) -> (tensor<8x4xf32>, tensor<8x4xf32>) {
  ^bb0(%a: tensor<2x4xf32>, %b: tensor<2xi32>):
    // expected-error @+1 {{'kiln.embedding_grad' op in a fusion of kind 'embedding_grad': its result is yielded more than once (the kernel adds the rows into one result)}}
    %e = kiln.embedding_grad %a, %b : tensor<2x4xf32>, tensor<2xi32> -> tensor<8x4xf32>
    kiln.yield %e, %e : tensor<8x4xf32>, tensor<8x4xf32>
  }
  return %r#0 : tensor<8x4xf32>
}

// -----

// One optimizer kernel updates every tensor with one set of hyperparameters.
kiln.parameter @a : tensor<4xf32> {init = "zeros"}
kiln.parameter @b : tensor<4xf32> {init = "zeros"}
func.func @optimizer_two_lrs(%ga: tensor<4xf32>, %gb: tensor<4xf32>, %h: tensor<f32>, %lr2: tensor<f32>) {
  kiln.fusion "optimizer" "adamw"(%ga, %gb, %h, %lr2) : (tensor<4xf32>, tensor<4xf32>, tensor<f32>, tensor<f32>) -> () {
  ^bb0(%x: tensor<4xf32>, %y: tensor<4xf32>, %s: tensor<f32>, %l: tensor<f32>):
    kiln.adamw @a, %x scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    // expected-error @+1 {{'kiln.adamw' op in a fusion of kind 'optimizer' must take the same hyperparameters as @a's kiln.adamw (its lr differs)}}
    kiln.adamw @b, %y scale %s lr %l betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    kiln.yield
  }
  return
}

// -----

// The step (the moments' bias correction) is one of them: each is compared, not only lr.
kiln.parameter @a : tensor<4xf32> {init = "zeros"}
kiln.parameter @b : tensor<4xf32> {init = "zeros"}
func.func @optimizer_two_steps(%ga: tensor<4xf32>, %gb: tensor<4xf32>, %h: tensor<f32>, %step2: tensor<f32>) {
  kiln.fusion "optimizer" "adamw"(%ga, %gb, %h, %step2) : (tensor<4xf32>, tensor<4xf32>, tensor<f32>, tensor<f32>) -> () {
  ^bb0(%x: tensor<4xf32>, %y: tensor<4xf32>, %s: tensor<f32>, %t: tensor<f32>):
    kiln.adamw @a, %x scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    // expected-error @+1 {{'kiln.adamw' op in a fusion of kind 'optimizer' must take the same hyperparameters as @a's kiln.adamw (its step differs)}}
    kiln.adamw @b, %y scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %t : tensor<4xf32>
    kiln.yield
  }
  return
}

// -----

// exactlyOne for kind 'layer_norm' (only 'matmul' was tested): no kiln.layer_norm.
func.func @layer_norm_without_norm(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'layer_norm' needs exactly one kiln.layer_norm, has 0}}
  %0 = kiln.fusion "layer_norm" "add"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %s = kiln.add %a, %a : tensor<4xf32>
    kiln.yield %s : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

// Checks exactlyOne for kind 'layer_norm_grad': no kiln.layer_norm_grad.
func.func @layer_norm_grad_without_grad(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'layer_norm_grad' needs exactly one kiln.layer_norm_grad, has 0}}
  %0 = kiln.fusion "layer_norm_grad" "add"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %s = kiln.add %a, %a : tensor<4xf32>
    kiln.yield %s : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

// Checks exactlyOne for kind 'classifier': a region without its kiln.cross_entropy.
func.func @classifier_without_loss(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'classifier' needs exactly one kiln.cross_entropy, has 0}}
  %0 = kiln.fusion "classifier" "add"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %s = kiln.add %a, %a : tensor<4xf32>
    kiln.yield %s : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

// The classifier kernel writes the loss and the logits' gradient: another op would be dropped.
func.func @classifier_with_add(%logits: tensor<4x16xf32>, %t: tensor<4xi32>) -> tensor<f32> {
  %0 = kiln.fusion "classifier" "cross_entropy_add"(%logits, %t) : (tensor<4x16xf32>, tensor<4xi32>) -> tensor<f32> {
  ^bb0(%l: tensor<4x16xf32>, %tt: tensor<4xi32>):
    %loss, %lse = kiln.cross_entropy %l, %tt : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
    // expected-error @+1 {{'kiln.add' op in a fusion of kind 'classifier': only a kiln.cross_entropy and the kiln.cross_entropy_grad of its lse may join it}}
    %twice = kiln.add %loss, %loss : tensor<f32>
    kiln.yield %twice : tensor<f32>
  }
  return %0 : tensor<f32>
}

// -----

// The gradient is computed in the same pass as the loss: from the same logits.
func.func @classifier_other_logits(%logits: tensor<4x16xf32>, %other: tensor<4x16xf32>, %t: tensor<4xi32>, %d: tensor<f32>) -> (tensor<f32>, tensor<4x16xf32>) {
  %0:2 = kiln.fusion "classifier" "cross_entropy_cross_entropy_grad"(%logits, %other, %t, %d) : (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4xi32>, tensor<f32>) -> (tensor<f32>, tensor<4x16xf32>) {
  ^bb0(%l: tensor<4x16xf32>, %o: tensor<4x16xf32>, %tt: tensor<4xi32>, %dd: tensor<f32>):
    %loss, %lse = kiln.cross_entropy %l, %tt : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
    // expected-error @+1 {{'kiln.cross_entropy_grad' op in a fusion of kind 'classifier' must read the kiln.cross_entropy's logits, targets and lse, with its num_classes}}
    %g = kiln.cross_entropy_grad %dd, %o, %lse, %tt : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
    kiln.yield %loss, %g : tensor<f32>, tensor<4x16xf32>
  }
  return %0#0, %0#1 : tensor<f32>, tensor<4x16xf32>
}

// -----

// ... and with the same num_classes (the one pass computes the softmax over those classes).
func.func @classifier_other_num_classes(%logits: tensor<4x16xf32>, %t: tensor<4xi32>, %d: tensor<f32>) -> (tensor<f32>, tensor<4x16xf32>) {
  %0:2 = kiln.fusion "classifier" "cross_entropy_cross_entropy_grad"(%logits, %t, %d) : (tensor<4x16xf32>, tensor<4xi32>, tensor<f32>) -> (tensor<f32>, tensor<4x16xf32>) {
  ^bb0(%l: tensor<4x16xf32>, %tt: tensor<4xi32>, %dd: tensor<f32>):
    %loss, %lse = kiln.cross_entropy %l, %tt : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
    // expected-error @+1 {{'kiln.cross_entropy_grad' op in a fusion of kind 'classifier' must read the kiln.cross_entropy's logits, targets and lse, with its num_classes}}
    %g = kiln.cross_entropy_grad %dd, %l, %lse, %tt {num_classes = 13 : i64} : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
    kiln.yield %loss, %g : tensor<f32>, tensor<4x16xf32>
  }
  return %0#0, %0#1 : tensor<f32>, tensor<4x16xf32>
}

// -----

// The incoming gradient is read from memory (the kernel reads it before the rows' pass).
func.func @classifier_grad_of_own_loss(%logits: tensor<4x16xf32>, %t: tensor<4xi32>) -> (tensor<f32>, tensor<4x16xf32>) {
  // expected-error @+1 {{'kiln.fusion' op reads a kiln.cross_entropy_grad's incoming gradient from a value computed in the region; it must be an input}}
  %0:2 = kiln.fusion "classifier" "cross_entropy_cross_entropy_grad"(%logits, %t) : (tensor<4x16xf32>, tensor<4xi32>) -> (tensor<f32>, tensor<4x16xf32>) {
  ^bb0(%l: tensor<4x16xf32>, %tt: tensor<4xi32>):
    %loss, %lse = kiln.cross_entropy %l, %tt : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
    %g = kiln.cross_entropy_grad %loss, %l, %lse, %tt : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
    kiln.yield %loss, %g : tensor<f32>, tensor<4x16xf32>
  }
  return %0#0, %0#1 : tensor<f32>, tensor<4x16xf32>
}

// -----

// Checks exactlyOne for kind 'reduce_sum': no kiln.reduce_sum.
func.func @reduce_sum_without_sum(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'reduce_sum' needs exactly one kiln.reduce_sum, has 0}}
  %0 = kiln.fusion "reduce_sum" "add"(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %s = kiln.add %a, %a : tensor<4xf32>
    kiln.yield %s : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

// Checks exactlyOne for kind 'embedding_grad': two kiln.embedding_grad in one region.
func.func @two_embedding_grads(%g: tensor<4x8xf32>, %i: tensor<4xi32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  // expected-error @+1 {{'kiln.fusion' op of kind 'embedding_grad' needs exactly one kiln.embedding_grad, has 2}}
  %0:2 = kiln.fusion "embedding_grad" "eg"(%g, %i) : (tensor<4x8xf32>, tensor<4xi32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<4xi32>):
    %e = kiln.embedding_grad %a, %b : tensor<4x8xf32>, tensor<4xi32> -> tensor<16x8xf32>
    %f = kiln.embedding_grad %a, %b : tensor<4x8xf32>, tensor<4xi32> -> tensor<16x8xf32>
    kiln.yield %e, %f : tensor<16x8xf32>, tensor<16x8xf32>
  }
  return %0#0, %0#1 : tensor<16x8xf32>, tensor<16x8xf32>
}

// -----

// The layer_norm kernel writes the norm, its casts and its statistics: a GELU of the output would
// be left out of it.
func.func @layer_norm_then_gelu(%x: tensor<4x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.fusion "layer_norm" "layer_norm_gelu"(%x, %w, %b) : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %aw: tensor<8xf32>, %ab: tensor<8xf32>):
    %y, %m, %r = kiln.layer_norm %a, %aw, %ab : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
    // expected-error @+1 {{'kiln.gelu' op in a fusion of kind 'layer_norm': only the ops that compute the kiln.layer_norm's input and the kiln.cast of its output may join it}}
    %g = kiln.gelu %y : tensor<4x8xf32>
    kiln.yield %g : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// Only a cast of the layer norm's output joins it: a cast of anything else is left out of the kernel.
func.func @layer_norm_casts_its_input(%x: tensor<4x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xbf16>) {
  %0:2 = kiln.fusion "layer_norm" "layer_norm_cast"(%x, %w, %b) : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xbf16>) {
  ^bb0(%a: tensor<4x8xf32>, %aw: tensor<8xf32>, %ab: tensor<8xf32>):
    %y, %m, %r = kiln.layer_norm %a, %aw, %ab : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
    // expected-error @+1 {{'kiln.cast' op in a fusion of kind 'layer_norm': only the ops that compute the kiln.layer_norm's input and the kiln.cast of its output may join it}}
    %c = kiln.cast %a : tensor<4x8xf32> -> tensor<4x8xbf16>
    kiln.yield %y, %c : tensor<4x8xf32>, tensor<4x8xbf16>
  }
  return %0#0, %0#1 : tensor<4x8xf32>, tensor<4x8xbf16>
}

// -----

// The layer_norm kernel evaluates its input at each element of a row: a matrix product cannot be.
func.func @layer_norm_of_matmul(%x: tensor<4x2xf32>, %v: tensor<2x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.fusion "layer_norm" "matmul_layer_norm"(%x, %v, %w, %b) : (tensor<4x2xf32>, tensor<2x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x2xf32>, %av: tensor<2x8xf32>, %aw: tensor<8xf32>, %ab: tensor<8xf32>):
    // expected-error @+1 {{'kiln.matmul' op in a fusion of kind 'layer_norm' computes the kiln.layer_norm's input, which the kernel evaluates element by element: only elementwise ops, broadcasts and gathers may}}
    %p = kiln.matmul %a, %av : tensor<4x2xf32>, tensor<2x8xf32> -> tensor<4x8xf32>
    %y, %m, %r = kiln.layer_norm %p, %aw, %ab : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
    kiln.yield %y : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// Of the ops before the norm, the kernel stores only the value the norm reads (the residual sum).
func.func @layer_norm_yields_before(%x: tensor<4x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  // expected-error @+1 {{'kiln.fusion' op of kind 'layer_norm' yields (as result #0) a value the kiln.layer_norm's input is computed from: the kernel stores only the input itself}}
  %0:2 = kiln.fusion "layer_norm" "gelu_add_layer_norm"(%x, %w, %b) : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %aw: tensor<8xf32>, %ab: tensor<8xf32>):
    %g = kiln.gelu %a : tensor<4x8xf32>
    %s = kiln.add %g, %a : tensor<4x8xf32>
    %y, %m, %r = kiln.layer_norm %s, %aw, %ab : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
    kiln.yield %g, %y : tensor<4x8xf32>, tensor<4x8xf32>
  }
  return %0#0, %0#1 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// The layer_norm_grad kernel writes the input gradient and the adds and casts that follow it: a
// GELU backward after it would be left out.
func.func @layer_norm_grad_then_gelu_grad(%dy: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w: tensor<8xf32>, %m: tensor<4xf32>, %r: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = kiln.fusion "layer_norm_grad" "layer_norm_grad_gelu_grad"(%dy, %x, %w, %m, %r) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %ax: tensor<4x8xf32>, %aw: tensor<8xf32>, %am: tensor<4xf32>, %ar: tensor<4xf32>):
    %dx, %dw, %db = kiln.layer_norm_grad %a, %ax, %aw, %am, %ar : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
    // expected-error @+1 {{'kiln.gelu_grad' op in a fusion of kind 'layer_norm_grad': only adds and casts of the input gradient, column sums of those (cast and accumulated), and the accumulation of the weight and bias gradients may join it}}
    %g = kiln.gelu_grad %dx, %ax : tensor<4x8xf32>
    kiln.yield %g : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// Accumulation in a layer_norm_grad region is of its weight and bias gradients (or the column sums).
kiln.parameter @w : tensor<4x8xf32> {init = "zeros"}
func.func @layer_norm_grad_accumulates_input(%dy: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w: tensor<8xf32>, %m: tensor<4xf32>, %r: tensor<4xf32>) -> tensor<4x8xf32> {
  %0 = kiln.fusion "layer_norm_grad" "layer_norm_grad_accumulate_grad"(%dy, %x, %w, %m, %r) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %ax: tensor<4x8xf32>, %aw: tensor<8xf32>, %am: tensor<4xf32>, %ar: tensor<4xf32>):
    %dx, %dw, %db = kiln.layer_norm_grad %a, %ax, %aw, %am, %ar : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
    // expected-error @+1 {{'kiln.accumulate_grad' op in a fusion of kind 'layer_norm_grad' may accumulate only the kiln.layer_norm_grad's weight and bias gradients and the column sums of its input gradient}}
    kiln.accumulate_grad @w, %ax : tensor<4x8xf32>
    kiln.yield %dx : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// A column sum is carried along one chain of uses (its cast, then its accumulation).
kiln.parameter @bias : tensor<8xf32> {init = "zeros"}
func.func @layer_norm_grad_sum_read_twice(%dy: tensor<4x8xf32>, %x: tensor<4x8xf32>, %w: tensor<8xf32>, %m: tensor<4xf32>, %r: tensor<4xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %0:4 = kiln.fusion "layer_norm_grad" "layer_norm_grad_reduce_sum"(%dy, %x, %w, %m, %r) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %ax: tensor<4x8xf32>, %aw: tensor<8xf32>, %am: tensor<4xf32>, %ar: tensor<4xf32>):
    %dx, %dw, %db = kiln.layer_norm_grad %a, %ax, %aw, %am, %ar : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
    // expected-error @+1 {{'kiln.reduce_sum' op in a fusion of kind 'layer_norm_grad' is a column sum (or its cast) read more than once: the kernel carries each along one chain of uses}}
    %s = kiln.reduce_sum %dx : tensor<4x8xf32> -> tensor<8xf32>
    kiln.accumulate_grad @bias, %s : tensor<8xf32>
    kiln.yield %dx, %dw, %db, %s : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
  return %0#0, %0#1, %0#2, %0#3 : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// A column sum added back into the row values: the kernel computes the sums after the rows, so
// the add is left out (one row, summed to [1, 8], makes the types match).
func.func @layer_norm_grad_adds_a_column_sum(%dy: tensor<1x8xf32>, %x: tensor<1x8xf32>, %w: tensor<8xf32>, %m: tensor<1xf32>, %r: tensor<1xf32>) -> (tensor<1x8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %0:3 = kiln.fusion "layer_norm_grad" "layer_norm_grad_reduce_sum_add"(%dy, %x, %w, %m, %r) : (tensor<1x8xf32>, tensor<1x8xf32>, tensor<8xf32>, tensor<1xf32>, tensor<1xf32>) -> (tensor<1x8xf32>, tensor<8xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<1x8xf32>, %ax: tensor<1x8xf32>, %aw: tensor<8xf32>, %am: tensor<1xf32>, %ar: tensor<1xf32>):
    %dx, %dw, %db = kiln.layer_norm_grad %a, %ax, %aw, %am, %ar : tensor<1x8xf32>, tensor<1x8xf32>, tensor<8xf32>, tensor<1xf32>, tensor<1xf32> -> tensor<1x8xf32>, tensor<8xf32>, tensor<8xf32>
    %s = kiln.reduce_sum %dx : tensor<1x8xf32> -> tensor<1x8xf32>
    // expected-error @+1 {{'kiln.add' op in a fusion of kind 'layer_norm_grad': only adds and casts of the input gradient, column sums of those (cast and accumulated), and the accumulation of the weight and bias gradients may join it}}
    %t = kiln.add %dx, %s : tensor<1x8xf32>
    kiln.yield %t, %dw, %db : tensor<1x8xf32>, tensor<8xf32>, tensor<8xf32>
  }
  return %0#0, %0#1, %0#2 : tensor<1x8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// An elementwise kernel loops over its largest value: accumulating a smaller tensor in it would
// write past that tensor's end.
kiln.parameter @b : tensor<8xf32> {init = "zeros"}
func.func @elementwise_accumulates_smaller(%x: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.fusion "elementwise" "gelu_accumulate_grad"(%x, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %ab: tensor<8xf32>):
    %g = kiln.gelu %a : tensor<4x8xf32>
    // expected-error @+1 {{'kiln.accumulate_grad' op in a fusion of kind 'elementwise' accumulates 8 elements, but its kernel loops over the 32 elements of its largest value}}
    kiln.accumulate_grad @b, %ab : tensor<8xf32>
    kiln.yield %g : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// Nor can it store a smaller result.
func.func @elementwise_yields_smaller(%x: tensor<4x8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  // expected-error @+1 {{'kiln.fusion' op of kind 'elementwise' yields (as result #1) 8 elements, but its kernel stores them in its loop over the 32 elements of its largest value}}
  %0:2 = kiln.fusion "elementwise" "gelu_gelu"(%x, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %ab: tensor<8xf32>):
    %g = kiln.gelu %a : tensor<4x8xf32>
    %h = kiln.gelu %ab : tensor<8xf32>
    kiln.yield %g, %h : tensor<4x8xf32>, tensor<8xf32>
  }
  return %0#0, %0#1 : tensor<4x8xf32>, tensor<8xf32>
}

// -----

// A matmul's epilogue loops over the product: the bias accumulated there would be written 4 times
// past its end (its gradient is a column sum, kiln.reduce_sum, with a loop of its own).
kiln.parameter @b : tensor<8xf32> {init = "zeros"}
func.func @matmul_accumulates_bias(%x: tensor<4x2xf32>, %v: tensor<2x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = kiln.fusion "matmul" "matmul_accumulate_grad"(%x, %v, %b) : (tensor<4x2xf32>, tensor<2x8xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x2xf32>, %av: tensor<2x8xf32>, %ab: tensor<8xf32>):
    %p = kiln.matmul %a, %av : tensor<4x2xf32>, tensor<2x8xf32> -> tensor<4x8xf32>
    // expected-error @+1 {{'kiln.accumulate_grad' op in a fusion of kind 'matmul' accumulates 8 elements, but its kernel loops over the 32 elements of the kiln.matmul's result}}
    kiln.accumulate_grad @b, %ab : tensor<8xf32>
    kiln.yield %p : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// A reduce_sum kernel loops over the column sums: a value as large as its input cannot be stored there.
func.func @reduce_sum_yields_broadcast(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'reduce_sum' yields (as result #0) 32 elements, but its kernel stores them in its loop over the 8 elements of the column sums}}
  %0 = kiln.fusion "reduce_sum" "reduce_sum_broadcast"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>):
    %s = kiln.reduce_sum %a : tensor<4x8xf32> -> tensor<8xf32>
    %b = kiln.broadcast %s : tensor<8xf32> -> tensor<4x8xf32>
    kiln.yield %b : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// The layer_norm_grad kernel sums the rows into the norm's C columns: a sum to [T, C] would be
// written only in its first C elements.
kiln.parameter @wpe : tensor<2x8xf32> {init = "zeros"}
func.func @layer_norm_grad_sum_to_rows(%dy: tensor<2x2x8xf32>, %x: tensor<2x2x8xf32>, %w: tensor<8xf32>, %m: tensor<2x2xf32>, %r: tensor<2x2xf32>) -> tensor<2x2x8xf32> {
  %0 = kiln.fusion "layer_norm_grad" "layer_norm_grad_reduce_sum"(%dy, %x, %w, %m, %r) : (tensor<2x2x8xf32>, tensor<2x2x8xf32>, tensor<8xf32>, tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2x8xf32> {
  ^bb0(%a: tensor<2x2x8xf32>, %ax: tensor<2x2x8xf32>, %aw: tensor<8xf32>, %am: tensor<2x2xf32>, %ar: tensor<2x2xf32>):
    %dx, %dw, %db = kiln.layer_norm_grad %a, %ax, %aw, %am, %ar : tensor<2x2x8xf32>, tensor<2x2x8xf32>, tensor<8xf32>, tensor<2x2xf32>, tensor<2x2xf32> -> tensor<2x2x8xf32>, tensor<8xf32>, tensor<8xf32>
    // expected-error @+1 {{'kiln.reduce_sum' op in a fusion of kind 'layer_norm_grad' must sum the rows into 8 columns (the kernel's), not 16}}
    %s = kiln.reduce_sum %dx : tensor<2x2x8xf32> -> tensor<2x8xf32>
    kiln.accumulate_grad @wpe, %s : tensor<2x8xf32>
    kiln.yield %dx : tensor<2x2x8xf32>
  }
  return %0 : tensor<2x2x8xf32>
}

// -----

// A matmul kernel is the product and its epilogue: an optimizer update in it would be left out.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @matmul_with_adamw(%x: tensor<4x2xf32>, %v: tensor<2x8xf32>, %g: tensor<4xf32>, %h: tensor<f32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'matmul' holds an op its kernel template leaves out: only its kiln.matmul (with a bias gradient's kiln.reduce_sum) and the elementwise ops on it may join it}}
  %0 = kiln.fusion "matmul" "matmul_adamw"(%x, %v, %g, %h) : (tensor<4x2xf32>, tensor<2x8xf32>, tensor<4xf32>, tensor<f32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x2xf32>, %av: tensor<2x8xf32>, %ag: tensor<4xf32>, %s: tensor<f32>):
    %p = kiln.matmul %a, %av : tensor<4x2xf32>, tensor<2x8xf32> -> tensor<4x8xf32>
    kiln.adamw @w, %ag scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    kiln.yield %p : tensor<4x8xf32>
  }
  return %0 : tensor<4x8xf32>
}

// -----

// One bias gradient per matmul kernel (its column-sum loop).
func.func @matmul_two_sums(%x: tensor<4x2xf32>, %v: tensor<2x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) {
  // expected-error @+1 {{'kiln.fusion' op of kind 'matmul' holds 2 kiln.reduce_sum (a bias gradient's column sums; one at most)}}
  %0:3 = kiln.fusion "matmul" "reduce_sum_reduce_sum_matmul"(%x, %v, %y) : (tensor<4x2xf32>, tensor<2x8xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) {
  ^bb0(%a: tensor<4x2xf32>, %av: tensor<2x8xf32>, %ay: tensor<4x8xf32>):
    %s1 = kiln.reduce_sum %ay : tensor<4x8xf32> -> tensor<8xf32>
    %s2 = kiln.reduce_sum %ay : tensor<4x8xf32> -> tensor<8xf32>
    %p = kiln.matmul %a, %av : tensor<4x2xf32>, tensor<2x8xf32> -> tensor<4x8xf32>
    kiln.yield %p, %s1, %s2 : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
  }
  return %0#0, %0#1, %0#2 : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// Nor does a reduce_sum kernel update parameters.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @reduce_sum_with_adamw(%x: tensor<4x8xf32>, %g: tensor<4xf32>, %h: tensor<f32>) -> tensor<8xf32> {
  // expected-error @+1 {{'kiln.fusion' op of kind 'reduce_sum' holds an op its kernel template leaves out: only its kiln.reduce_sum and the elementwise ops on it may join it}}
  %0 = kiln.fusion "reduce_sum" "reduce_sum_adamw"(%x, %g, %h) : (tensor<4x8xf32>, tensor<4xf32>, tensor<f32>) -> tensor<8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %ag: tensor<4xf32>, %s: tensor<f32>):
    %r = kiln.reduce_sum %a : tensor<4x8xf32> -> tensor<8xf32>
    kiln.adamw @w, %ag scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    kiln.yield %r : tensor<8xf32>
  }
  return %0 : tensor<8xf32>
}

// -----

// Nor does it scatter an embedding's gradient rows.
func.func @reduce_sum_with_embedding_grad(%x: tensor<4x8xf32>, %g: tensor<2x8xf32>, %i: tensor<2xi32>) -> (tensor<8xf32>, tensor<16x8xf32>) {
  // expected-error @+1 {{'kiln.fusion' op of kind 'reduce_sum' holds an op its kernel template leaves out: only its kiln.reduce_sum and the elementwise ops on it may join it}}
  %0:2 = kiln.fusion "reduce_sum" "reduce_sum_embedding_grad"(%x, %g, %i) : (tensor<4x8xf32>, tensor<2x8xf32>, tensor<2xi32>) -> (tensor<8xf32>, tensor<16x8xf32>) {
  ^bb0(%a: tensor<4x8xf32>, %ag: tensor<2x8xf32>, %ai: tensor<2xi32>):
    %r = kiln.reduce_sum %a : tensor<4x8xf32> -> tensor<8xf32>
    %e = kiln.embedding_grad %ag, %ai : tensor<2x8xf32>, tensor<2xi32> -> tensor<16x8xf32>
    kiln.yield %r, %e : tensor<8xf32>, tensor<16x8xf32>
  }
  return %0#0, %0#1 : tensor<8xf32>, tensor<16x8xf32>
}

// -----

// The optimizer kernel computes the clipping coefficient, then the updates: nothing else.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @optimizer_with_gelu(%g: tensor<4xf32>, %h: tensor<f32>) -> tensor<4xf32> {
  %0 = kiln.fusion "optimizer" "gelu_adamw"(%g, %h) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32> {
  ^bb0(%ag: tensor<4xf32>, %s: tensor<f32>):
    kiln.adamw @w, %ag scale %s lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    // expected-error @+1 {{'kiln.gelu' op in a fusion of kind 'optimizer': only kiln.adamw updates and one kiln.clip_coef may join it}}
    %q = kiln.gelu %ag : tensor<4xf32>
    kiln.yield %q : tensor<4xf32>
  }
  return %0 : tensor<4xf32>
}

// -----

// The coefficient is computed once: a second kiln.clip_coef is refused.
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @optimizer_two_clip_coefs(%g: tensor<4xf32>, %n: tensor<f32>, %h: tensor<f32>) {
  kiln.fusion "optimizer" "clip_coef_clip_coef_adamw"(%g, %n, %h) : (tensor<4xf32>, tensor<f32>, tensor<f32>) -> () {
  ^bb0(%ag: tensor<4xf32>, %an: tensor<f32>, %s: tensor<f32>):
    %c1 = kiln.clip_coef %an, %s : tensor<f32>
    // expected-error @+1 {{'kiln.clip_coef' op in a fusion of kind 'optimizer': only kiln.adamw updates and one kiln.clip_coef may join it}}
    %c2 = kiln.clip_coef %an, %c1 : tensor<f32>
    kiln.adamw @w, %ag scale %c2 lr %s betas(%s, %s) eps %s weight_decay %s step %s : tensor<4xf32>
    kiln.yield
  }
  return
}
