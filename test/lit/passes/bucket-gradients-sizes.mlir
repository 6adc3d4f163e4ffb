// RUN: kiln-opt %s -split-input-file -kiln-bucket-gradients=bucket-mb=1 | FileCheck %s
// Bucket sizes at their edges, with a 1 MB cap (10^6 bytes of fp32 gradients, exact in a
// double); the steps are written out so the gradients' sizes and order are chosen.

// Two gradients of 500000 bytes fill the cap exactly: a bucket closes only when the next
// gradient would take it past the cap, so they share one.
// CHECK-LABEL: func.func @micro_step
// CHECK: kiln.accumulate_grad @a
// CHECK-NEXT: kiln.accumulate_grad @b
// CHECK-NEXT: kiln.reduce_gradients [@a, @b] {bucket = 0 : i64}
// CHECK-NOT: kiln.reduce_gradients
kiln.parameter @a : tensor<125000xf32> {init = "zeros"}
kiln.parameter @b : tensor<125000xf32> {init = "zeros"}
func.func @micro_step(%d: tensor<125000xf32>) {
  kiln.accumulate_grad @a, %d : tensor<125000xf32>
  kiln.accumulate_grad @b, %d : tensor<125000xf32>
  return
}

// -----

// 500000 + 548576 bytes = 2^20: past 10^6, so two buckets (an MB is 10^6 bytes, not 2^20).
// CHECK-LABEL: func.func @micro_step
// CHECK: kiln.accumulate_grad @a
// CHECK-NEXT: kiln.reduce_gradients [@a] {bucket = 0 : i64}
// CHECK-NEXT: kiln.accumulate_grad @b
// CHECK-NEXT: kiln.reduce_gradients [@b] {bucket = 1 : i64}
kiln.parameter @a : tensor<125000xf32> {init = "zeros"}
kiln.parameter @b : tensor<137144xf32> {init = "zeros"}
func.func @micro_step(%d: tensor<125000xf32>, %e: tensor<137144xf32>) {
  kiln.accumulate_grad @a, %d : tensor<125000xf32>
  kiln.accumulate_grad @b, %e : tensor<137144xf32>
  return
}

// -----

// A gradient accumulated twice (a tied weight) is finished by its last accumulation: its bucket
// is reduced after that one, and it is ordered after @v, which finishes in between.
// CHECK-LABEL: func.func @micro_step
// CHECK: kiln.accumulate_grad @w
// CHECK-NEXT: kiln.accumulate_grad @v
// CHECK-NEXT: kiln.accumulate_grad @w
// CHECK-NEXT: kiln.reduce_gradients [@v, @w] {bucket = 0 : i64}
// CHECK-NEXT: return
kiln.parameter @w : tensor<4xf32> {init = "zeros"}
kiln.parameter @v : tensor<4xf32> {init = "zeros"}
func.func @micro_step(%d: tensor<4xf32>) {
  kiln.accumulate_grad @w, %d : tensor<4xf32>
  kiln.accumulate_grad @v, %d : tensor<4xf32>
  kiln.accumulate_grad @w, %d : tensor<4xf32>
  return
}
