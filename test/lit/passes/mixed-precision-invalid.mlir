// RUN: kiln-opt %s -kiln-mixed-precision -verify-diagnostics

// expected-error@below {{kiln-mixed-precision: no @forward function}}
module {
}
