// RUN: kiln-opt %s -kiln-recompute=mode=all -verify-diagnostics

// expected-error@below {{kiln-recompute: unknown mode 'all' (expected none or cheap)}}
module {
}
