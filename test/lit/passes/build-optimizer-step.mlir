// RUN: kiln-opt %s -split-input-file -kiln-build-optimizer-step | FileCheck %s

// kiln-build-optimizer-step: @optimizer_step reads every gradient, takes the global norm,
// derives the clipping coefficient from max_norm, runs one kiln.adamw per parameter in its
// decay group, and returns the norm.

// Three parameters, one with decay: one kiln.grad each (declaration order), one
// global_norm over all of them, and an adamw each with `decay` only on @wte.
kiln.parameter @wte : tensor<16x8xf32> {decay, init = "normal", init_std = 0.02 : f32}
kiln.parameter @"ln.weight" : tensor<8xf32> {init = "ones"}
kiln.parameter @"ln.bias" : tensor<8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %w = kiln.param @wte : tensor<16x8xf32>
  %l = kiln.reduce_sum %w : tensor<16x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// The pass reads the gradients @micro_step accumulates (kiln-autodiff's output).
func.func @micro_step() -> tensor<f32> {
  %w = kiln.param @wte : tensor<16x8xf32>
  %l = kiln.reduce_sum %w : tensor<16x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// The existing functions are left alone.
// CHECK-LABEL: func.func @forward() -> tensor<f32> {
// CHECK-NEXT:    kiln.param @wte
// CHECK-NEXT:    kiln.reduce_sum
// CHECK-NEXT:    return
// CHECK-LABEL: func.func @optimizer_step() -> tensor<f32> {
// CHECK-NEXT:    %[[G0:.*]] = kiln.grad @wte : tensor<16x8xf32>
// CHECK-NEXT:    %[[G1:.*]] = kiln.grad @ln.weight : tensor<8xf32>
// CHECK-NEXT:    %[[G2:.*]] = kiln.grad @ln.bias : tensor<8xf32>
// CHECK-NEXT:    %[[N:.*]] = kiln.global_norm %[[G0]], %[[G1]], %[[G2]] : tensor<16x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<f32>
// CHECK-NEXT:    %[[MAX:.*]] = kiln.hyper "max_norm" : tensor<f32>
// CHECK-NEXT:    %[[C:.*]] = kiln.clip_coef %[[N]], %[[MAX]] : tensor<f32>
// CHECK-NEXT:    %[[LR:.*]] = kiln.hyper "lr" : tensor<f32>
// CHECK-NEXT:    %[[B1:.*]] = kiln.hyper "beta1" : tensor<f32>
// CHECK-NEXT:    %[[B2:.*]] = kiln.hyper "beta2" : tensor<f32>
// CHECK-NEXT:    %[[EPS:.*]] = kiln.hyper "eps" : tensor<f32>
// CHECK-NEXT:    %[[WD:.*]] = kiln.hyper "weight_decay" : tensor<f32>
// CHECK-NEXT:    %[[T:.*]] = kiln.hyper "step" : tensor<f32>
// CHECK-NEXT:    kiln.adamw @wte, %[[G0]] scale %[[C]] lr %[[LR]] betas(%[[B1]], %[[B2]]) eps %[[EPS]] weight_decay %[[WD]] step %[[T]] {decay} : tensor<16x8xf32>
// CHECK-NEXT:    kiln.adamw @ln.weight, %[[G1]] scale %[[C]] lr %[[LR]] betas(%[[B1]], %[[B2]]) eps %[[EPS]] weight_decay %[[WD]] step %[[T]] : tensor<8xf32>
// CHECK-NEXT:    kiln.adamw @ln.bias, %[[G2]] scale %[[C]] lr %[[LR]] betas(%[[B1]], %[[B2]]) eps %[[EPS]] weight_decay %[[WD]] step %[[T]] : tensor<8xf32>
// CHECK-NEXT:    return %[[N]] : tensor<f32>
// CHECK-NEXT:  }

// -----

// Beside @micro_step, nothing else is needed (no @forward); a single parameter gives a
// one-operand global_norm.
kiln.parameter @w : tensor<4x4xbf16> {decay, init = "normal", init_std = 1.0 : f32}
func.func @micro_step() -> tensor<f32> {
  %l = kiln.hyper "loss_weight" : tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @optimizer_step() -> tensor<f32> {
// CHECK-NEXT:    %[[G:.*]] = kiln.grad @w : tensor<4x4xbf16>
// CHECK-NEXT:    %[[N:.*]] = kiln.global_norm %[[G]] : tensor<4x4xbf16> -> tensor<f32>
// CHECK-COUNT-1: kiln.adamw @w, %[[G]] {{.*}} {decay} : tensor<4x4xbf16>
// CHECK-NOT:     kiln.adamw
// CHECK:         return %[[N]] : tensor<f32>
