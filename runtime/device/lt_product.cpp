// How a row-major product is asked of column-major cuBLASLt.
#include "runtime/device/lt_product.h"

namespace kiln {

// The spec is row-major: D[m,n] = op(A) op(B). A row-major [r,c] matrix is the column-major [c,r]
// matrix of its transpose, so cuBLASLt computes D^T[n,m] = op(B)^T op(A)^T: its A is our B, its B
// our A, M = n, N = m, and D^T (column-major [n,m], ld n) is exactly D row-major. The bias runs
// along D^T's rows, i.e. along D's columns (length n): the row-major bias as it is.
LtProduct lt_product(const MatmulSpec& s) {
  const uint64_t m = uint64_t(s.m), n = uint64_t(s.n), k = uint64_t(s.k);
  LtProduct p;
  // Our B, stored [k,n] row-major = [n,k] column-major; with trans_b stored [n,k] = [k,n].
  p.a = {s.b, s.b_type, s.trans_b ? k : n, s.trans_b ? n : k, int64_t(s.trans_b ? k : n), s.trans_b};
  // Our A, stored [m,k] row-major = [k,m] column-major; with trans_a stored [k,m] = [m,k].
  p.b = {s.a, s.a_type, s.trans_a ? m : k, s.trans_a ? k : m, int64_t(s.trans_a ? m : k), s.trans_a};
  p.d = {s.d, s.d_type, n, m, int64_t(n), false};
  // beta == 0: C is not read, but cuBLASLt wants an address and a layout: D's.
  p.c = s.beta != 0.0f ? s.c : s.d;
  p.aux_ld = int64_t(n);
  return p;
}

}  // namespace kiln
