// RUN: kiln-opt %s -split-input-file -kiln-step-pipeline | FileCheck %s
// RUN: kiln-opt %s -split-input-file -kiln-step-pipeline | FileCheck %s --check-prefix=COUNT
// RUN: kiln-opt %s -split-input-file -kiln-step-pipeline | FileCheck %s --check-prefix=DECAY

// kiln-step-pipeline on a one-layer GPT-2 graph (kilnc --emit=graph of n_layer = 1,
// n_head = 2, n_embd = 8, vocab_size = 16, batch_size = 2, seq_len = 4; the kiln.spec
// attribute is dropped): @forward is kept, @micro_step gets the backward pass and one
// accumulate_grad per parameter, @optimizer_step one grad and one adamw per parameter.

module @one {
  kiln.parameter @wte.weight : tensor<16x8xf32> {decay, init = "normal", init_std = 2.000000e-02 : f32}
  kiln.parameter @wpe.weight : tensor<8x8xf32> {decay, init = "normal", init_std = 2.000000e-02 : f32}
  kiln.parameter @h.0.ln_1.weight : tensor<8xf32> {init = "ones"}
  kiln.parameter @h.0.ln_1.bias : tensor<8xf32> {init = "zeros"}
  kiln.parameter @h.0.attn.c_attn.weight : tensor<8x24xf32> {decay, init = "normal", init_std = 2.000000e-02 : f32}
  kiln.parameter @h.0.attn.c_attn.bias : tensor<24xf32> {init = "zeros"}
  kiln.parameter @h.0.attn.c_proj.weight : tensor<8x8xf32> {decay, init = "normal", init_std = 0.0141421352 : f32}
  kiln.parameter @h.0.attn.c_proj.bias : tensor<8xf32> {init = "zeros"}
  kiln.parameter @h.0.ln_2.weight : tensor<8xf32> {init = "ones"}
  kiln.parameter @h.0.ln_2.bias : tensor<8xf32> {init = "zeros"}
  kiln.parameter @h.0.mlp.c_fc.weight : tensor<8x32xf32> {decay, init = "normal", init_std = 2.000000e-02 : f32}
  kiln.parameter @h.0.mlp.c_fc.bias : tensor<32xf32> {init = "zeros"}
  kiln.parameter @h.0.mlp.c_proj.weight : tensor<32x8xf32> {decay, init = "normal", init_std = 0.0141421352 : f32}
  kiln.parameter @h.0.mlp.c_proj.bias : tensor<8xf32> {init = "zeros"}
  kiln.parameter @ln_f.weight : tensor<8xf32> {init = "ones"}
  kiln.parameter @ln_f.bias : tensor<8xf32> {init = "zeros"}
  func.func @forward() -> tensor<f32> {
    %0 = kiln.input "idx" : tensor<2x4xi32>
    %1 = kiln.input "targets" : tensor<2x4xi32>
    %2 = kiln.param @wte.weight : tensor<16x8xf32>
    %3 = kiln.embedding %2[%0] : tensor<16x8xf32>, tensor<2x4xi32> -> tensor<2x4x8xf32>
    %4 = kiln.iota : tensor<4xi32>
    %5 = kiln.param @wpe.weight : tensor<8x8xf32>
    %6 = kiln.embedding %5[%4] : tensor<8x8xf32>, tensor<4xi32> -> tensor<4x8xf32>
    %7 = kiln.broadcast %6 : tensor<4x8xf32> -> tensor<2x4x8xf32>
    %8 = kiln.add %3, %7 : tensor<2x4x8xf32>
    %9 = kiln.reshape %8 : tensor<2x4x8xf32> -> tensor<8x8xf32>
    %10 = kiln.param @h.0.ln_1.bias : tensor<8xf32>
    %11 = kiln.param @h.0.ln_1.weight : tensor<8xf32>
    %result, %mean, %rstd = kiln.layer_norm %9, %11, %10 : tensor<8x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x8xf32>, tensor<8xf32>, tensor<8xf32>
    %12 = kiln.param @h.0.attn.c_attn.weight : tensor<8x24xf32>
    %13 = kiln.matmul %result, %12 : tensor<8x8xf32>, tensor<8x24xf32> -> tensor<8x24xf32>
    %14 = kiln.param @h.0.attn.c_attn.bias : tensor<24xf32>
    %15 = kiln.broadcast %14 : tensor<24xf32> -> tensor<8x24xf32>
    %16 = kiln.add %13, %15 : tensor<8x24xf32>
    %17 = kiln.reshape %16 : tensor<8x24xf32> -> tensor<2x4x24xf32>
    %result_0, %lse = kiln.attention %17 {num_heads = 2 : i64} : tensor<2x4x24xf32> -> tensor<2x4x8xf32>, tensor<2x2x4xf32>
    %18 = kiln.reshape %result_0 : tensor<2x4x8xf32> -> tensor<8x8xf32>
    %19 = kiln.param @h.0.attn.c_proj.weight : tensor<8x8xf32>
    %20 = kiln.matmul %18, %19 : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
    %21 = kiln.param @h.0.attn.c_proj.bias : tensor<8xf32>
    %22 = kiln.broadcast %21 : tensor<8xf32> -> tensor<8x8xf32>
    %23 = kiln.add %20, %22 : tensor<8x8xf32>
    %24 = kiln.add %9, %23 : tensor<8x8xf32>
    %25 = kiln.param @h.0.ln_2.bias : tensor<8xf32>
    %26 = kiln.param @h.0.ln_2.weight : tensor<8xf32>
    %result_1, %mean_2, %rstd_3 = kiln.layer_norm %24, %26, %25 : tensor<8x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x8xf32>, tensor<8xf32>, tensor<8xf32>
    %27 = kiln.param @h.0.mlp.c_fc.weight : tensor<8x32xf32>
    %28 = kiln.matmul %result_1, %27 : tensor<8x8xf32>, tensor<8x32xf32> -> tensor<8x32xf32>
    %29 = kiln.param @h.0.mlp.c_fc.bias : tensor<32xf32>
    %30 = kiln.broadcast %29 : tensor<32xf32> -> tensor<8x32xf32>
    %31 = kiln.add %28, %30 : tensor<8x32xf32>
    %32 = kiln.gelu %31 : tensor<8x32xf32>
    %33 = kiln.param @h.0.mlp.c_proj.weight : tensor<32x8xf32>
    %34 = kiln.matmul %32, %33 : tensor<8x32xf32>, tensor<32x8xf32> -> tensor<8x8xf32>
    %35 = kiln.param @h.0.mlp.c_proj.bias : tensor<8xf32>
    %36 = kiln.broadcast %35 : tensor<8xf32> -> tensor<8x8xf32>
    %37 = kiln.add %34, %36 : tensor<8x8xf32>
    %38 = kiln.add %24, %37 : tensor<8x8xf32>
    %39 = kiln.param @ln_f.bias : tensor<8xf32>
    %40 = kiln.param @ln_f.weight : tensor<8xf32>
    %result_4, %mean_5, %rstd_6 = kiln.layer_norm %38, %40, %39 : tensor<8x8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x8xf32>, tensor<8xf32>, tensor<8xf32>
    %41 = kiln.matmul %result_4, %2 {transpose_rhs} : tensor<8x8xf32>, tensor<16x8xf32> -> tensor<8x16xf32>
    %42 = kiln.reshape %1 : tensor<2x4xi32> -> tensor<8xi32>
    %loss, %lse_7 = kiln.cross_entropy %41, %42 : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>, tensor<8xf32>
    return %loss : tensor<f32>
  }
}

// The backward pass walks the layer in reverse: loss, final layer_norm, MLP, attention,
// first layer_norm, then both embeddings; the tied wte gradient (output head + embedding)
// is summed into one accumulate_grad.
// CHECK-LABEL: func.func @forward() -> tensor<f32>
// CHECK-NOT:     kiln.accumulate_grad
// CHECK:         %[[LOSS:.*]], %{{.*}} = kiln.cross_entropy
// CHECK-NEXT:    return %[[LOSS]] : tensor<f32>
// CHECK-LABEL: func.func @micro_step() -> tensor<f32>
// CHECK:         %[[LOSS:.*]], %{{.*}} = kiln.cross_entropy
// CHECK-NEXT:    %[[LW:.*]] = kiln.hyper "loss_weight" : tensor<f32>
// CHECK-NEXT:    kiln.cross_entropy_grad %[[LW]]
// CHECK:         kiln.layer_norm_grad
// CHECK:         kiln.accumulate_grad @ln_f.weight
// CHECK:         kiln.accumulate_grad @h.0.mlp.c_proj.weight
// CHECK:         kiln.gelu_grad
// CHECK:         kiln.accumulate_grad @h.0.mlp.c_fc.weight
// CHECK:         kiln.layer_norm_grad
// CHECK:         kiln.attention_grad {{.*}} {num_heads = 2 : i64}
// CHECK:         kiln.accumulate_grad @h.0.attn.c_attn.weight
// CHECK:         kiln.layer_norm_grad
// CHECK:         kiln.embedding_grad {{.*}} -> tensor<8x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @wpe.weight
// CHECK-NEXT:    %[[DWTE:.*]] = kiln.embedding_grad {{.*}} -> tensor<16x8xf32>
// CHECK-NEXT:    %[[SUM:.*]] = kiln.add %{{.*}}, %[[DWTE]] : tensor<16x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @wte.weight, %[[SUM]] : tensor<16x8xf32>
// CHECK-NEXT:    return %[[LOSS]] : tensor<f32>
// CHECK-LABEL: func.func @optimizer_step() -> tensor<f32>
// CHECK:         %[[NORM:.*]] = kiln.global_norm
// CHECK-NEXT:    %[[MAX:.*]] = kiln.hyper "max_norm"
// CHECK-NEXT:    kiln.clip_coef %[[NORM]], %[[MAX]]
// CHECK:         kiln.adamw @wte.weight, {{.*}} {decay} : tensor<16x8xf32>
// CHECK:         kiln.adamw @ln_f.bias, {{.*}} step %{{[0-9]+}} : tensor<8xf32>
// CHECK-NEXT:    return %[[NORM]] : tensor<f32>

// Counts: 16 parameters, so 16 accumulate_grads (none in @forward), 16 grads and 16
// adamw updates, 6 of them (the matrices) with decay; after CSE one read per parameter.
// COUNT-LABEL:   func.func @forward
// COUNT-COUNT-16: kiln.param @
// COUNT-NOT:     kiln.param @
// COUNT-LABEL:   func.func @micro_step
// COUNT-COUNT-16: kiln.param @
// COUNT-NOT:     kiln.param @
// COUNT-COUNT-16: kiln.accumulate_grad
// COUNT-NOT:     kiln.accumulate_grad
// COUNT-LABEL:   func.func @optimizer_step
// COUNT-COUNT-16: kiln.grad @
// COUNT-NOT:     kiln.grad @
// COUNT:         kiln.global_norm
// COUNT-COUNT-16: kiln.adamw
// COUNT-NOT:     kiln.adamw
// COUNT:         return
// DECAY-LABEL:   func.func @optimizer_step
// DECAY-COUNT-6: {decay} : tensor<{{[0-9x]+}}xf32>
// DECAY-NOT:     {decay}
// DECAY:         return

// -----

// The pipeline's cleanup: a reshape chain in @forward, and the reshape chain its gradient
// produces in @micro_step, each fold into one reshape (the forward is canonicalized too).
kiln.parameter @x : tensor<4x8xf32> {init = "zeros"}
func.func @forward() -> tensor<f32> {
  %x = kiln.param @x : tensor<4x8xf32>
  %r = kiln.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
  %s = kiln.reshape %r : tensor<32xf32> -> tensor<2x16xf32>
  %l = kiln.reduce_sum %s : tensor<2x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @forward() -> tensor<f32>
// CHECK-NEXT:    %[[X:.*]] = kiln.param @x
// CHECK-NEXT:    %[[R:.*]] = kiln.reshape %[[X]] : tensor<4x8xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    kiln.reduce_sum %[[R]]
// CHECK-LABEL: func.func @micro_step() -> tensor<f32>
// CHECK-NEXT:    %[[X:.*]] = kiln.param @x
// CHECK-NEXT:    %[[R:.*]] = kiln.reshape %[[X]] : tensor<4x8xf32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[L:.*]] = kiln.reduce_sum %[[R]]
// CHECK-NEXT:    %[[LW:.*]] = kiln.hyper "loss_weight"
// CHECK-NEXT:    %[[D:.*]] = kiln.broadcast %[[LW]] : tensor<f32> -> tensor<2x16xf32>
// CHECK-NEXT:    %[[DX:.*]] = kiln.reshape %[[D]] : tensor<2x16xf32> -> tensor<4x8xf32>
// CHECK-NEXT:    kiln.accumulate_grad @x, %[[DX]]
// CHECK-NEXT:    return %[[L]]
// CHECK-LABEL: func.func @optimizer_step() -> tensor<f32>
// CHECK-NEXT:    %[[G:.*]] = kiln.grad @x
// CHECK-NEXT:    kiln.global_norm %[[G]] : tensor<4x8xf32> -> tensor<f32>
// CHECK:         kiln.adamw @x, %[[G]]
// CHECK-NEXT:    return
