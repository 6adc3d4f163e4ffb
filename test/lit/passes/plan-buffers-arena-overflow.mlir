// RUN: %python -c "P = chr(37); t = 'tensor<281474976710656xf32>'; n = 8193; print('// expected-error@below {{kiln-plan-buffers: the buffers of @f need more than 2^63 bytes together (the arena' + chr(39) + 's size and offsets are i64); use smaller tensors}}'); print('func.func @f() -> tensor<f32> {'); [print('  ' + P + 'z' + str(i) + ' = kiln.zeros : ' + t) for i in range(n)]; print('  ' + P + 'n = kiln.global_norm ' + ', '.join(P + 'z' + str(i) for i in range(n)) + ' : ' + ', '.join([t] * n) + ' -> tensor<f32>'); print('  return ' + P + 'n : tensor<f32>'); print('}')" > %t.mlir
// RUN: kiln-opt %t.mlir -kiln-plan-buffers -verify-diagnostics

// Each value is at most 2^48 elements (2^50 bytes of f32), but 8193 of them live at once need more
// than 2^63 bytes: the plan's arena size and offsets, i64s, came out negative (IR its own verifier
// refuses, reported against kiln.arena_size as if the input had it) instead of an error.
