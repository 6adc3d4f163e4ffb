// RUN: kiln-opt %s -split-input-file -kiln-autodiff | FileCheck %s

// kiln-autodiff: @forward is cloned into @micro_step and the backward pass is appended
// before the return, one vector-Jacobian product per op, in reverse order. Most cases use
// `kiln.reduce_sum ... -> tensor<f32>` as the loss, whose VJP broadcasts the seed.

// The seed is the loss_weight hyperparameter; a parameter that is the loss receives it
// directly. @forward is kept unchanged and @micro_step follows it.
kiln.parameter @s : tensor<f32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %s = kiln.param @s : tensor<f32>
  return %s : tensor<f32>
}
// CHECK-LABEL: func.func @forward() -> tensor<f32> {
// CHECK-NEXT:    %[[S:.*]] = kiln.param @s : tensor<f32>
// CHECK-NEXT:    return %[[S]] : tensor<f32>
// CHECK-NEXT:  }
// CHECK-LABEL: func.func @micro_step() -> tensor<f32> {
// CHECK-NEXT:    %[[S:.*]] = kiln.param @s : tensor<f32>
// CHECK-NEXT:    %[[LW:.*]] = kiln.hyper "loss_weight" : tensor<f32>
// CHECK-NEXT:    kiln.accumulate_grad @s, %[[LW]] : tensor<f32>
// CHECK-NEXT:    return %[[S]] : tensor<f32>
// CHECK-NEXT:  }

// -----

// reduce_sum -> broadcast of the seed; the forward ops are kept in @micro_step.
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %l = kiln.reduce_sum %x : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @forward
// CHECK-NOT:     kiln.hyper
// CHECK-NOT:     kiln.accumulate_grad
// CHECK-LABEL: func.func @micro_step
// CHECK-NEXT:    kiln.param @x
// CHECK-NEXT:    %[[L:.*]] = kiln.reduce_sum
// CHECK-NEXT:    %[[LW:.*]] = kiln.hyper "loss_weight" : tensor<f32>
// CHECK-NEXT:    %[[D:.*]] = kiln.broadcast %[[LW]] : tensor<f32> -> tensor<4x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @x, %[[D]] : tensor<4x8xf32>
// CHECK-NEXT:    return %[[L]]

// -----

// A read of the parameter's bf16 compute copy: its gradient is widened to the fp32 accumulator.
kiln.parameter @w : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<4x8xbf16>
  %f = kiln.cast %w : tensor<4x8xbf16> -> tensor<4x8xf32>
  %l = kiln.reduce_sum %f : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[D:.*]] = kiln.cast %{{.*}} : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK-NEXT:    %[[DW:.*]] = kiln.cast %[[D]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @w, %[[DW]] : tensor<4x8xf32>

// -----

// matmul C = A B: dA = dC B^T (transpose_rhs), dB = A^T dC (transpose_lhs).
kiln.parameter @a : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @b : tensor<8x6xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %a = kiln.param @a : tensor<4x8xf32>
  %b = kiln.param @b : tensor<8x6xf32>
  %c = kiln.matmul %a, %b : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  %l = kiln.reduce_sum %c : tensor<4x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[A:.*]] = kiln.param @a
// CHECK:         %[[B:.*]] = kiln.param @b
// CHECK:         %[[DC:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DA:.*]] = kiln.matmul %[[DC]], %[[B]] {transpose_rhs} : tensor<4x6xf32>, tensor<8x6xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[DB:.*]] = kiln.matmul %[[A]], %[[DC]] {transpose_lhs} : tensor<4x8xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
// CHECK-NEXT:    kiln.accumulate_grad @b, %[[DB]] : tensor<8x6xf32>
// CHECK-NEXT:    kiln.accumulate_grad @a, %[[DA]] : tensor<4x8xf32>
// CHECK-NEXT:    return

// -----

// matmul C = A B^T: dA = dC B (no flags), dB = dC^T A (transpose_lhs).
kiln.parameter @a : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @b : tensor<6x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %a = kiln.param @a : tensor<4x8xf32>
  %b = kiln.param @b : tensor<6x8xf32>
  %c = kiln.matmul %a, %b {transpose_rhs} : tensor<4x8xf32>, tensor<6x8xf32> -> tensor<4x6xf32>
  %l = kiln.reduce_sum %c : tensor<4x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[A:.*]] = kiln.param @a
// CHECK:         %[[B:.*]] = kiln.param @b
// CHECK:         %[[DC:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DA:.*]] = kiln.matmul %[[DC]], %[[B]] : tensor<4x6xf32>, tensor<6x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[DB:.*]] = kiln.matmul %[[DC]], %[[A]] {transpose_lhs} : tensor<4x6xf32>, tensor<4x8xf32> -> tensor<6x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @b, %[[DB]] : tensor<6x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @a, %[[DA]] : tensor<4x8xf32>

// -----

// matmul C = A^T B: dA = B dC^T (transpose_rhs), dB = A dC (no flags).
kiln.parameter @a : tensor<8x4xf32> {init = "zeros"}
kiln.parameter @b : tensor<8x6xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %a = kiln.param @a : tensor<8x4xf32>
  %b = kiln.param @b : tensor<8x6xf32>
  %c = kiln.matmul %a, %b {transpose_lhs} : tensor<8x4xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
  %l = kiln.reduce_sum %c : tensor<4x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[A:.*]] = kiln.param @a
// CHECK:         %[[B:.*]] = kiln.param @b
// CHECK:         %[[DC:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DA:.*]] = kiln.matmul %[[B]], %[[DC]] {transpose_rhs} : tensor<8x6xf32>, tensor<4x6xf32> -> tensor<8x4xf32>
// CHECK-NEXT:    %[[DB:.*]] = kiln.matmul %[[A]], %[[DC]] : tensor<8x4xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
// CHECK-NEXT:    kiln.accumulate_grad @b, %[[DB]] : tensor<8x6xf32>
// CHECK-NEXT:    kiln.accumulate_grad @a, %[[DA]] : tensor<8x4xf32>

// -----

// matmul C = A^T B^T: dA = B^T dC^T, dB = dC^T A^T (both flags on both).
kiln.parameter @a : tensor<8x4xf32> {init = "zeros"}
kiln.parameter @b : tensor<6x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %a = kiln.param @a : tensor<8x4xf32>
  %b = kiln.param @b : tensor<6x8xf32>
  %c = kiln.matmul %a, %b {transpose_lhs, transpose_rhs} : tensor<8x4xf32>, tensor<6x8xf32> -> tensor<4x6xf32>
  %l = kiln.reduce_sum %c : tensor<4x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[A:.*]] = kiln.param @a
// CHECK:         %[[B:.*]] = kiln.param @b
// CHECK:         %[[DC:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DA:.*]] = kiln.matmul %[[B]], %[[DC]] {transpose_lhs, transpose_rhs} : tensor<6x8xf32>, tensor<4x6xf32> -> tensor<8x4xf32>
// CHECK-NEXT:    %[[DB:.*]] = kiln.matmul %[[DC]], %[[A]] {transpose_lhs, transpose_rhs} : tensor<4x6xf32>, tensor<8x4xf32> -> tensor<6x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @b, %[[DB]] : tensor<6x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @a, %[[DA]] : tensor<8x4xf32>

// -----

// Weight tying as in GPT-2: one kiln.param feeds the embedding and the output head; its two
// gradients are summed with kiln.add and accumulated once.
kiln.parameter @wte : tensor<16x8xf32> {decay, init = "normal", init_std = 0.02 : f32}
func.func @forward() -> tensor<f32> {
  %ids = kiln.input "idx" : tensor<4xi32>
  %t = kiln.input "targets" : tensor<4xi32>
  %w = kiln.param @wte : tensor<16x8xf32>
  %e = kiln.embedding %w[%ids] : tensor<16x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
  %logits = kiln.matmul %e, %w {transpose_rhs} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
  %loss, %lse = kiln.cross_entropy %logits, %t : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
  return %loss : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[IDS:.*]] = kiln.input "idx"
// CHECK:         %[[W:.*]] = kiln.param @wte
// CHECK:         %[[E:.*]] = kiln.embedding %[[W]][%[[IDS]]]
// CHECK:         %[[DL:.*]] = kiln.cross_entropy_grad
// CHECK-NEXT:    %[[DE:.*]] = kiln.matmul %[[DL]], %[[W]] : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[DW1:.*]] = kiln.matmul %[[DL]], %[[E]] {transpose_lhs} : tensor<4x16xf32>, tensor<4x8xf32> -> tensor<16x8xf32>
// CHECK-NEXT:    %[[DW2:.*]] = kiln.embedding_grad %[[DE]], %[[IDS]] : tensor<4x8xf32>, tensor<4xi32> -> tensor<16x8xf32>
// CHECK-NEXT:    %[[DW:.*]] = kiln.add %[[DW1]], %[[DW2]] : tensor<16x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @wte, %[[DW]] : tensor<16x8xf32>
// CHECK-NOT:     kiln.accumulate_grad
// CHECK:         return

// -----

// embedding -> embedding_grad of the incoming gradient at the same indices; the i32
// indices take no gradient.
kiln.parameter @w : tensor<16x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %ids = kiln.input "idx" : tensor<2x4xi32>
  %w = kiln.param @w : tensor<16x8xf32>
  %e = kiln.embedding %w[%ids] : tensor<16x8xf32>, tensor<2x4xi32> -> tensor<2x4x8xf32>
  %l = kiln.reduce_sum %e : tensor<2x4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[IDS:.*]] = kiln.input "idx"
// CHECK:         %[[D:.*]] = kiln.broadcast {{.*}} -> tensor<2x4x8xf32>
// CHECK-NEXT:    %[[DW:.*]] = kiln.embedding_grad %[[D]], %[[IDS]] : tensor<2x4x8xf32>, tensor<2x4xi32> -> tensor<16x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @w, %[[DW]]
// CHECK-NEXT:    return

// -----

// broadcast -> reduce_sum back to the input's shape (a bias gradient).
kiln.parameter @bias : tensor<8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %b = kiln.param @bias : tensor<8xf32>
  %bb = kiln.broadcast %b : tensor<8xf32> -> tensor<4x8xf32>
  %l = kiln.reduce_sum %bb : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[LW:.*]] = kiln.hyper "loss_weight"
// CHECK-NEXT:    %[[D:.*]] = kiln.broadcast %[[LW]] : tensor<f32> -> tensor<4x8xf32>
// CHECK-NEXT:    %[[DB:.*]] = kiln.reduce_sum %[[D]] : tensor<4x8xf32> -> tensor<8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @bias, %[[DB]] : tensor<8xf32>

// -----

// layer_norm -> layer_norm_grad from the saved mean and rstd; its three results are the
// gradients of input, weight and bias.
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @w : tensor<8xf32> {init = "ones"}
kiln.parameter @b : tensor<8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %w = kiln.param @w : tensor<8xf32>
  %b = kiln.param @b : tensor<8xf32>
  %y, %mean, %rstd = kiln.layer_norm %x, %w, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %l = kiln.reduce_sum %y : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[X:.*]] = kiln.param @x
// CHECK:         %[[W:.*]] = kiln.param @w
// CHECK:         %{{.*}}, %[[MEAN:.*]], %[[RSTD:.*]] = kiln.layer_norm
// CHECK:         %[[D:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DX:.*]], %[[DW:.*]], %[[DB:.*]] = kiln.layer_norm_grad %[[D]], %[[X]], %[[W]], %[[MEAN]], %[[RSTD]] : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @b, %[[DB]]
// CHECK-NEXT:    kiln.accumulate_grad @w, %[[DW]]
// CHECK-NEXT:    kiln.accumulate_grad @x, %[[DX]]

// -----

// attention -> attention_grad from qkv, the output and lse, keeping num_heads.
kiln.parameter @qkv : tensor<2x4x24xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %qkv = kiln.param @qkv : tensor<2x4x24xf32>
  %o, %lse = kiln.attention %qkv {num_heads = 2 : i64} : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x2x4xf32>
  %l = kiln.reduce_sum %o : tensor<2x4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[QKV:.*]] = kiln.param @qkv
// CHECK:         %[[O:.*]], %[[LSE:.*]] = kiln.attention %[[QKV]]
// CHECK:         %[[D:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DQKV:.*]] = kiln.attention_grad %[[D]], %[[QKV]], %[[O]], %[[LSE]] {num_heads = 2 : i64} : tensor<2x4x8xf32>, tensor<2x4x24xf32>, tensor<2x4x8xf32>, tensor<2x2x4xf32> -> tensor<2x4x24xf32>
// CHECK-NEXT:    kiln.accumulate_grad @qkv, %[[DQKV]]

// -----

// cross_entropy -> cross_entropy_grad of the scalar seed, the logits, lse and targets.
kiln.parameter @logits : tensor<4x16xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %t = kiln.input "targets" : tensor<4xi32>
  %z = kiln.param @logits : tensor<4x16xf32>
  %loss, %lse = kiln.cross_entropy %z, %t : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>, tensor<4xf32>
  return %loss : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[T:.*]] = kiln.input "targets"
// CHECK:         %[[Z:.*]] = kiln.param @logits
// CHECK:         %[[LOSS:.*]], %[[LSE:.*]] = kiln.cross_entropy %[[Z]], %[[T]]
// CHECK-NEXT:    %[[LW:.*]] = kiln.hyper "loss_weight"
// CHECK-NEXT:    %[[DZ:.*]] = kiln.cross_entropy_grad %[[LW]], %[[Z]], %[[LSE]], %[[T]] : tensor<4x16xf32>, tensor<4xf32>, tensor<4xi32> -> tensor<4x16xf32>
// CHECK-NEXT:    kiln.accumulate_grad @logits, %[[DZ]]
// CHECK-NEXT:    return %[[LOSS]]

// -----

// gelu -> gelu_grad of the incoming gradient at the gelu's input.
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %g = kiln.gelu %x : tensor<4x8xf32>
  %l = kiln.reduce_sum %g : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[X:.*]] = kiln.param @x
// CHECK:         %[[D:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DX:.*]] = kiln.gelu_grad %[[D]], %[[X]] : tensor<4x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @x, %[[DX]]

// -----

// split: pieces that do not reach the loss contribute kiln.zeros to a concat of the
// gradients, in piece order.
kiln.parameter @qkv : tensor<4x24xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %qkv = kiln.param @qkv : tensor<4x24xf32>
  %q, %k, %v = kiln.split %qkv : tensor<4x24xf32> -> tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  %l = kiln.reduce_sum %k : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[DK:.*]] = kiln.broadcast {{.*}} -> tensor<4x8xf32>
// CHECK-NEXT:    %[[ZQ:.*]] = kiln.zeros : tensor<4x8xf32>
// CHECK-NEXT:    %[[ZV:.*]] = kiln.zeros : tensor<4x8xf32>
// CHECK-NEXT:    %[[D:.*]] = kiln.concat %[[ZQ]], %[[DK]], %[[ZV]] : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x24xf32>
// CHECK-NEXT:    kiln.accumulate_grad @qkv, %[[D]] : tensor<4x24xf32>

// -----

// concat -> split of the incoming gradient into the input pieces.
kiln.parameter @a : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @b : tensor<4x16xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %a = kiln.param @a : tensor<4x8xf32>
  %b = kiln.param @b : tensor<4x16xf32>
  %c = kiln.concat %a, %b : tensor<4x8xf32>, tensor<4x16xf32> -> tensor<4x24xf32>
  %l = kiln.reduce_sum %c : tensor<4x24xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[D:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[S:.*]]:2 = kiln.split %[[D]] : tensor<4x24xf32> -> tensor<4x8xf32>, tensor<4x16xf32>
// CHECK-NEXT:    kiln.accumulate_grad @b, %[[S]]#1 : tensor<4x16xf32>
// CHECK-NEXT:    kiln.accumulate_grad @a, %[[S]]#0 : tensor<4x8xf32>

// -----

// reshape -> reshape of the gradient back to the input's shape.
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %r = kiln.reshape %x : tensor<4x8xf32> -> tensor<2x16xf32>
  %l = kiln.reduce_sum %r : tensor<2x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[D:.*]] = kiln.broadcast {{.*}} -> tensor<2x16xf32>
// CHECK-NEXT:    %[[DX:.*]] = kiln.reshape %[[D]] : tensor<2x16xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @x, %[[DX]] : tensor<4x8xf32>

// -----

// transpose -> transpose of the gradient.
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %t = kiln.transpose %x : tensor<4x8xf32> -> tensor<8x4xf32>
  %l = kiln.reduce_sum %t : tensor<8x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[D:.*]] = kiln.broadcast {{.*}} -> tensor<8x4xf32>
// CHECK-NEXT:    %[[DX:.*]] = kiln.transpose %[[D]] : tensor<8x4xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @x, %[[DX]] : tensor<4x8xf32>

// -----

// add passes the gradient to both operands; mul multiplies it by the other operand; scale
// scales it by the same runtime factor (which itself takes no gradient).
kiln.parameter @a : tensor<4xf32> {init = "zeros"}
kiln.parameter @b : tensor<4xf32> {init = "zeros"}
kiln.parameter @c : tensor<4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %a = kiln.param @a : tensor<4xf32>
  %b = kiln.param @b : tensor<4xf32>
  %c = kiln.param @c : tensor<4xf32>
  %lr = kiln.hyper "lr" : tensor<f32>
  %m = kiln.mul %a, %b : tensor<4xf32>
  %s = kiln.add %m, %c : tensor<4xf32>
  %y = kiln.scale %s, %lr : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %l = kiln.reduce_sum %y : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[A:.*]] = kiln.param @a
// CHECK:         %[[B:.*]] = kiln.param @b
// CHECK:         %[[LR:.*]] = kiln.hyper "lr"
// CHECK:         %[[DY:.*]] = kiln.broadcast
// CHECK-NEXT:    %[[DS:.*]] = kiln.scale %[[DY]], %[[LR]] : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
// CHECK-NEXT:    %[[DA:.*]] = kiln.mul %[[DS]], %[[B]] : tensor<4xf32>
// CHECK-NEXT:    %[[DB:.*]] = kiln.mul %[[DS]], %[[A]] : tensor<4xf32>
// CHECK-NEXT:    kiln.accumulate_grad @c, %[[DS]]
// CHECK-NEXT:    kiln.accumulate_grad @b, %[[DB]]
// CHECK-NEXT:    kiln.accumulate_grad @a, %[[DA]]
// CHECK-NEXT:    return

// -----

// Values off the path to the loss get no gradient: an unused parameter read has no
// accumulate_grad, and an op without a gradient rule is fine when it does not reach the
// loss.
kiln.parameter @x : tensor<4xf32> {init = "zeros"}
kiln.parameter @unused : tensor<4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4xf32>
  %u = kiln.param @unused : tensor<4xf32>
  %g = kiln.gelu_grad %u, %x : tensor<4xf32>
  %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         kiln.gelu_grad
// CHECK:         kiln.accumulate_grad @x
// CHECK-NOT:     kiln.accumulate_grad @unused
// CHECK:         return

// -----

// Sources on the path to the loss (kiln.zeros here) take no gradient; the parameter still does.
// CHECK-LABEL: func.func @micro_step
// CHECK: kiln.accumulate_grad @w
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @w : tensor<4xf32>
  %z = kiln.zeros : tensor<4xf32>
  %s = kiln.add %w, %z : tensor<4xf32>
  %l = kiln.reduce_sum %s : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// bf16 operands with an fp32 result: dC is cast to bf16 for the two products (a matmul's
// operands share one element type), and each gradient is bf16 as its operand.
kiln.parameter @a : tensor<4x8xf32> {init = "zeros"}
kiln.parameter @b : tensor<8x6xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %a = kiln.param @a : tensor<4x8xf32>
  %b = kiln.param @b : tensor<8x6xf32>
  %ah = kiln.cast %a : tensor<4x8xf32> -> tensor<4x8xbf16>
  %bh = kiln.cast %b : tensor<8x6xf32> -> tensor<8x6xbf16>
  %c = kiln.matmul %ah, %bh : tensor<4x8xbf16>, tensor<8x6xbf16> -> tensor<4x6xf32>
  %l = kiln.reduce_sum %c : tensor<4x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[DC:.*]] = kiln.broadcast {{.*}} -> tensor<4x6xf32>
// CHECK-NEXT:    %[[DCH:.*]] = kiln.cast %[[DC]] : tensor<4x6xf32> -> tensor<4x6xbf16>
// CHECK-NEXT:    %[[DA:.*]] = kiln.matmul %[[DCH]], %{{.*}} {transpose_rhs} : tensor<4x6xbf16>, tensor<8x6xbf16> -> tensor<4x8xbf16>
// CHECK-NEXT:    %[[DB:.*]] = kiln.matmul %{{.*}}, %[[DCH]] {transpose_lhs} : tensor<4x8xbf16>, tensor<4x6xbf16> -> tensor<8x6xbf16>
// CHECK:         kiln.accumulate_grad @b, {{.*}} : tensor<8x6xf32>
// CHECK:         kiln.accumulate_grad @a, {{.*}} : tensor<4x8xf32>

// -----

// The statistics results are constants to the backward pass. A loss that reads only the mean of
// a layer norm computed from no parameter (reading one from a parameter is refused, see
// autodiff-invalid.mlir) takes no layer_norm_grad: the rule is called without a gradient for
// the normalized rows.
// CHECK-LABEL: func.func @micro_step
// CHECK:         kiln.reduce_sum %mean
// CHECK-NEXT:    kiln.hyper "loss_weight"
// CHECK-NEXT:    kiln.broadcast
// CHECK-NEXT:    return
func.func @forward() -> tensor<f32> {
  %x = kiln.zeros : tensor<4x8xf32>
  %g = kiln.zeros : tensor<8xf32>
  %b = kiln.zeros : tensor<8xf32>
  %y, %mean, %rstd = kiln.layer_norm %x, %g, %b : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<4x8xf32>, tensor<4xf32>, tensor<4xf32>
  %l = kiln.reduce_sum %mean : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// The same for attention's lse: no attention_grad.
// CHECK-LABEL: func.func @micro_step
// CHECK:         kiln.reduce_sum %lse
// CHECK-NEXT:    kiln.hyper "loss_weight"
// CHECK-NEXT:    kiln.broadcast
// CHECK-NEXT:    return
func.func @forward() -> tensor<f32> {
  %qkv = kiln.zeros : tensor<2x4x24xf32>
  %o, %lse = kiln.attention %qkv {num_heads = 2 : i64} : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x2x4xf32>
  %l = kiln.reduce_sum %lse : tensor<2x2x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A value that takes a gradient through one use (the add) and none through another (a scale's
// factor) keeps the first: nothing is added for the use without one.
// CHECK-LABEL: func.func @micro_step
// CHECK:         %[[LR:.*]] = kiln.hyper "lr"
// CHECK:         %[[LW:.*]] = kiln.hyper "loss_weight"
// CHECK-NEXT:    %[[D:.*]] = kiln.broadcast %[[LW]] : tensor<f32> -> tensor<4xf32>
// CHECK-NEXT:    %[[DX:.*]] = kiln.scale %[[D]], %[[LR]]
// CHECK-NEXT:    kiln.accumulate_grad @x, %[[DX]] : tensor<4xf32>
// CHECK-NEXT:    return
kiln.parameter @x : tensor<4xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4xf32>
  %lr = kiln.hyper "lr" : tensor<f32>
  %y = kiln.scale %x, %lr : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
  %s = kiln.reduce_sum %y : tensor<4xf32> -> tensor<f32>
  %l = kiln.add %s, %lr : tensor<f32>
  return %l : tensor<f32>
}
