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
