// RUN: %python %S/Inputs/arena_bound.py 281474976710592 error > %t.exact.mlir
// RUN: kiln-opt %t.exact.mlir -kiln-plan-buffers -verify-diagnostics
// RUN: %python %S/Inputs/arena_bound.py 281474976710528 > %t.fits.mlir
// RUN: kiln-opt %t.fits.mlir -kiln-plan-buffers | FileCheck %s
// RUN: %python %S/Inputs/arena_bound.py 0 cache error > %t.cache.mlir
// RUN: kiln-opt %t.cache.mlir -kiln-plan-buffers -verify-diagnostics

// The arena's size is an i64, so the buffers may need at most 2^63 - 1 bytes together (each
// aligned to 256). 8191 tensors of 2^50 bytes, one of 2^50 - 256 and the norm's 256 bytes make
// exactly 2^63: refused (the size would wrap negative). With the last one 256 bytes smaller they
// make 2^63 - 256, which fits: all live at the norm, they are packed end to end.
// CHECK: kiln.arena_size = 9223372036854775552
//
// A key/value cache counts too: the same 8191 tensors with a 2^50-byte cache in place of the last
// one go past 2^63 only with the cache, which is placed ahead of the packed values.
