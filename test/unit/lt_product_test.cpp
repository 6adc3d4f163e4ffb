// lt_product: a row-major MatmulSpec as the column-major cuBLASLt call (its A is our B).
#include "runtime/device/lt_product.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(LtProduct, SwapsTheOperandsAndKeepsEachOnesTypeAndLayout) {
  MatmulSpec s;
  s.m = 3, s.n = 5, s.k = 7;
  s.trans_a = true;  // A stored [k,m]
  s.a_type = fb::DType::BF16, s.b_type = fb::DType::F32, s.d_type = fb::DType::BF16;
  s.a = 0x1000, s.b = 0x2000, s.c = 0x3000, s.d = 0x4000;
  const LtProduct p = lt_product(s);
  // cuBLASLt's A: our B, stored [k,n] row-major = [n,k] column-major, not transposed.
  EXPECT_EQ(p.a.ptr, s.b);
  EXPECT_EQ(p.a.type, fb::DType::F32);
  EXPECT_EQ(p.a.rows, 5u); EXPECT_EQ(p.a.cols, 7u); EXPECT_EQ(p.a.ld, 5); EXPECT_FALSE(p.a.transposed);
  // cuBLASLt's B: our A, stored [k,m] row-major = [m,k] column-major, transposed.
  EXPECT_EQ(p.b.ptr, s.a);
  EXPECT_EQ(p.b.type, fb::DType::BF16);
  EXPECT_EQ(p.b.rows, 3u); EXPECT_EQ(p.b.cols, 7u); EXPECT_EQ(p.b.ld, 3); EXPECT_TRUE(p.b.transposed);
  // D^T: column-major [n,m], ld n; the GELU aux matrix likewise.
  EXPECT_EQ(p.d.ptr, s.d);
  EXPECT_EQ(p.d.rows, 5u); EXPECT_EQ(p.d.cols, 3u); EXPECT_EQ(p.d.ld, 5); EXPECT_EQ(p.aux_ld, 5);
  // beta == 0: C is not read; cuBLASLt is given D's address for it, not the spec's C.
  EXPECT_EQ(p.c, s.d);
  s.beta = 1.0f;
  EXPECT_EQ(lt_product(s).c, s.c);
}

}  // namespace
}  // namespace kiln
