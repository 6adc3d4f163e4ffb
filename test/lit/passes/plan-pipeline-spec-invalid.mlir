// RUN: kiln-opt %s -split-input-file -kiln-plan-pipeline -verify-diagnostics

// A kiln.spec string key (path, name, precision, target) given as another attribute kind is refused.
// expected-error@+1 {{'kiln.spec' path must be a string}}
module attributes {kiln.spec = {path = 1 : i64}} {
}

// -----

// precision must be a string too (checked before the integer keys).
// expected-error@+1 {{'kiln.spec' precision must be a string}}
module attributes {kiln.spec = {precision = 16 : i64, n_layer = 1 : i64}} {
}

// -----

// Neither @forward nor @micro_step: not graph IR, and nothing to plan (no error).
module {
}

// -----

// Graph IR: the planning passes run on the training step, after kiln-autodiff (planned graph IR
// is refused by kilnc).
// expected-error@+1 {{kiln-plan-pipeline: graph IR (no @micro_step); plan the training step: run -kiln-step-pipeline first (or kilnc --emit=step)}}
module {
  func.func @forward() -> tensor<f32> {
    %x = kiln.zeros : tensor<4xf32>
    %l = kiln.reduce_sum %x : tensor<4xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}
