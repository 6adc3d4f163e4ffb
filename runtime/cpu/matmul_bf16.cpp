// bf16 matrix products by oneDNN (see matmul_bf16.h).
#include "runtime/cpu/matmul_bf16.h"

#ifdef KILN_HAVE_DNNL
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kiln::cpu {

#ifdef KILN_HAVE_DNNL
namespace {

using Shape = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool>;  // M, N, K, tA, tB, bf16 out

// A shape's primitive and its operands' memory objects (pointed at the data at each call).
struct Made {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
};

struct Engine {
  std::optional<dnnl::engine> engine;  // nullopt: oneDNN could not make a CPU engine
  std::optional<dnnl::stream> stream;
  std::mutex mutex;
  std::map<Shape, std::optional<Made>> made;  // nullopt: oneDNN has none for this shape

  Engine() {
    try {
      engine.emplace(dnnl::engine::kind::cpu, 0);
      stream.emplace(*engine);
    } catch (const dnnl::error&) {
      engine.reset();
    }
  }
};

Engine& engine() {
  static Engine e;
  return e;
}

std::optional<Made> make(dnnl::engine& eng, const Shape& s) {
  const auto [M, N, K, tA, tB, bf16_out] = s;
  using dt = dnnl::memory::data_type;
  // Strides of the row-major arrays as stored: a transposed operand walks its rows by 1.
  const dnnl::memory::desc a({M, K}, dt::bf16, tA ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
  const dnnl::memory::desc b({K, N}, dt::bf16, tB ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
  const dnnl::memory::desc c({M, N}, bf16_out ? dt::bf16 : dt::f32, dnnl::memory::dims{N, 1});
  try {
    dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng));
    return Made{prim, dnnl::memory(a, eng, DNNL_MEMORY_NONE), dnnl::memory(b, eng, DNNL_MEMORY_NONE),
                dnnl::memory(c, eng, DNNL_MEMORY_NONE)};
  } catch (const dnnl::error&) {
    return std::nullopt;  // e.g. a CPU without AVX-512: the BLAS instead
  }
}

}  // namespace
#endif

bool matmul_bf16(void* out, bool out_bf16, const uint16_t* a, const uint16_t* b, int64_t M, int64_t N,
                 int64_t K, bool trans_a, bool trans_b) {
#ifdef KILN_HAVE_DNNL
  if (M <= 0 || N <= 0 || K <= 0) return false;  // degenerate shapes: the caller's loops
  Engine& e = engine();
  if (!e.engine) return false;
  std::lock_guard<std::mutex> lock(e.mutex);
  const Shape shape{M, N, K, trans_a, trans_b, out_bf16};
  auto it = e.made.find(shape);
  if (it == e.made.end()) it = e.made.emplace(shape, make(*e.engine, shape)).first;
  if (!it->second) return false;
  Made& m = *it->second;
  try {
    m.a.set_data_handle(const_cast<uint16_t*>(a));
    m.b.set_data_handle(const_cast<uint16_t*>(b));
    m.c.set_data_handle(out);
    m.prim.execute(*e.stream, {{DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_DST, m.c}});
    e.stream->wait();
    return true;
  } catch (const dnnl::error&) {
    it->second.reset();  // not expected once made; the caller's BLAS from now on (it rewrites out)
    return false;
  }
#else
  (void)out, (void)out_bf16, (void)a, (void)b, (void)M, (void)N, (void)K, (void)trans_a, (void)trans_b;
  return false;
#endif
}

int bf16_flops_per_cycle() {
#ifdef KILN_HAVE_DNNL
  // oneDNN's ISA values are sets of feature bits: AMX's include AVX-512 BF16's.
  const unsigned isa = unsigned(dnnl_get_effective_cpu_isa());
  const unsigned amx = unsigned(dnnl_cpu_isa_avx512_core_amx), bf16 = unsigned(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & amx) == amx ? 1024 : (isa & bf16) == bf16 ? 128 : 0;
#else
  return 0;
#endif
}

}  // namespace kiln::cpu
