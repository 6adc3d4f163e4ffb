// The CUDA emulation as a kiln::Device (see emulated_device.h).
#include "emulated_device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "runtime/cpu/bf16.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device/lt_product.h"
#include "runtime/error.h"

#ifndef KILN_EMU_DIR
#error "KILN_EMU_DIR: the directory of shim.h and kernels_tu.cpp"
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;
typedef void (*KernelFn)(void* const*, const long long*);
typedef void (*LaunchFn)(KernelFn, const char*, unsigned, unsigned, void* const*, const long long*);
typedef void (*StatsFn)(long long*);  // shim.h's kemu_stats
typedef void (*RegionFn)(const volatile void*, size_t);  // ASan's (un)poison_memory_region

float get(DevicePtr p, fb::DType t, int64_t i) {
  if (t == fb::DType::BF16) return cpu::from_bf16(reinterpret_cast<const uint16_t*>(p)[i]);
  return reinterpret_cast<const float*>(p)[i];
}
void set(DevicePtr p, fb::DType t, int64_t i, float v) {
  if (t == fb::DType::BF16) reinterpret_cast<uint16_t*>(p)[i] = cpu::to_bf16(v);
  else reinterpret_cast<float*>(p)[i] = v;
}

// cuBLASLt's product and epilogues, accumulated in double, computed from the column-major call
// that runtime/cuda/cuda_device.cpp makes (lt_product) as cublasLt.h defines it: D = op(A) op(B)
// (+ beta C), element (i, j) of a matrix at ptr[i + j * ld], the bias along D's rows (bias[i]),
// the GELU auxiliary matrix laid out like D with its own leading dimension. So a wrong transpose,
// operand or leading dimension in that translation fails every test that multiplies. GELU and
// its derivative are the CPU runtime's.
void emulate_matmul(const MatmulSpec& s) {
  const EpilogueFlags f = epilogue_flags(s.epilogue, s.where);
  const LtProduct p = lt_product(s);
  const int64_t M = int64_t(p.d.rows), N = int64_t(p.d.cols);
  const int64_t K = int64_t(p.a.transposed ? p.a.rows : p.a.cols);
  const int64_t b_rows = int64_t(p.b.transposed ? p.b.cols : p.b.rows), b_cols = int64_t(p.b.transposed ? p.b.rows : p.b.cols);
  const int64_t a_rows = int64_t(p.a.transposed ? p.a.cols : p.a.rows);
  if (a_rows != M || b_rows != K || b_cols != N || p.d.ld < M || p.aux_ld < M || p.a.ld < int64_t(p.a.rows) || p.b.ld < int64_t(p.b.rows))
    throw Error(s.where + ": emulated cuBLASLt: layouts do not make a product (op(A) " + std::to_string(a_rows) + "x" +
                std::to_string(K) + ", op(B) " + std::to_string(b_rows) + "x" + std::to_string(b_cols) + ", D " +
                std::to_string(M) + "x" + std::to_string(N) + ")");
  // Each matrix packed (ld its rows, or one column), so that it lies within the rows x cols
  // elements the executor checked its operand holds: this loop runs in the driver, where
  // KEMU_SANITIZE's poisoning of the arena (fence) sees nothing.
  auto packed = [](const LtMatrix& x, int64_t ld) { return x.cols <= 1 || ld == int64_t(x.rows); };
  if (!packed(p.a, p.a.ld) || !packed(p.b, p.b.ld) || !packed(p.d, p.d.ld) || (s.aux && !packed(p.d, p.aux_ld)))
    throw Error(s.where + ": emulated cuBLASLt: a leading dimension reaches past its matrix");
  // op(X)(i, j): X(i, j), or X(j, i) when transposed.
  auto op = [](const LtMatrix& x, int64_t i, int64_t j) {
    return double(get(x.ptr, x.type, x.transposed ? j + i * x.ld : i + j * x.ld));
  };
  std::vector<float> out(size_t(M * N));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0;
      for (int64_t q = 0; q < K; q++) acc += op(p.a, i, q) * op(p.b, q, j);
      float x = float(acc);
      if (s.beta != 0.0f) x += s.beta * get(p.c, p.d.type, i + j * p.d.ld);
      if (f.bias) x += get(s.bias, s.bias_type, i);
      if (f.aux_out) set(s.aux, s.aux_type, i + j * p.aux_ld, x);
      if (f.gelu) cpu::gelu_fwd(&x, &x, 1);
      if (f.dgelu) {
        const float u = get(s.aux, s.aux_type, i + j * p.aux_ld), dy = x;
        cpu::gelu_bwd(&x, &u, &dy, 1);
      }
      out[size_t(i + j * M)] = x;
    }
  for (int64_t j = 0; j < N; j++)
    for (int64_t i = 0; i < M; i++) set(p.d.ptr, p.d.type, i + j * p.d.ld, out[size_t(i + j * M)]);
}

class EmulatedDevice final : public Device {
 public:
  ~EmulatedDevice() override {
    for (auto& [p, n] : allocations_) std::free(reinterpret_cast<void*>(p));
    if (lib_) dlclose(lib_);
  }
  std::string describe() const override { return "a CUDA emulation on the CPU (test/e2e/cuda_emulation)"; }

  DevicePtr alloc(size_t bytes, const std::string& what) override {
    // Under KEMU_SANITIZE the exact size, so that AddressSanitizer's redzone starts at the last byte.
    void* p = nullptr;
    if (!sanitize()) p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    else if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) p = nullptr;
    if (!p) throw Error("emulated device: cannot allocate " + std::to_string(bytes) + " bytes for " + what);
    std::memset(p, 0xff, bytes);  // NaN until written
    allocations_[DevicePtr(p)] = bytes;
    return DevicePtr(p);
  }
  size_t allocated_bytes() const override {
    size_t n = 0;
    for (const auto& [p, bytes] : allocations_) n += bytes;
    return n;
  }
  void free(DevicePtr p) override {
    if (!allocations_.erase(p)) throw Error("emulated device: free of an address it did not allocate");
    std::free(reinterpret_cast<void*>(p));
  }
  void upload(DevicePtr dst, const void* src, size_t bytes) override {
    not_capturing("upload");
    check(dst, bytes, "upload");
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  }
  void download(void* dst, DevicePtr src, size_t bytes) override {
    not_capturing("download");
    check(src, bytes, "download");
    std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  }
  void copy(DevicePtr dst, DevicePtr src, size_t bytes) override {
    check(dst, bytes, "copy");
    check(src, bytes, "copy");
    work([=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes); });
  }
  bool host_addressable() const override { return true; }
  void fill(DevicePtr dst, uint8_t byte, size_t bytes) override {
    check(dst, bytes, "fill");
    work([=] { std::memset(reinterpret_cast<void*>(dst), byte, bytes); });
  }
  void synchronize() override { not_capturing("synchronize"); }

  // The module's CUDA source over shim.h, compiled once per source into the cache.
  void load_kernels(const Module& m) override {
    std::string src = m.fb().kernel_source() ? m.fb().kernel_source()->str() : "";
    if (src.empty()) throw Error(m.source() + ": no kernel source to emulate");
    const char* cxx_env = std::getenv("CXX");
    const std::string cxx = cxx_env && *cxx_env ? cxx_env : "c++";
    std::string flags = "-std=c++20 -O1 -U_FORTIFY_SOURCE -fPIC -shared -w";
    // KEMU_SANITIZE=1: the kernels under AddressSanitizer and UndefinedBehaviorSanitizer (each
    // __shared__ array with its own redzones; no stack instrumentation, which the fibers' stack
    // switches would confuse: -fsanitize=bounds checks the local arrays). The process must have
    // the ASan runtime first (run.sh SANITIZE=1 preloads it into the driver).
    if (sanitize()) {
      if (!dlsym(RTLD_DEFAULT, "__asan_init"))
        throw Error("emulated device: KEMU_SANITIZE=1 needs the AddressSanitizer runtime in the process "
                    "(LD_PRELOAD=$(c++ -print-file-name=libasan.so))");
      flags += " -fsanitize=address,undefined,float-cast-overflow -fsanitize-sections=kemu_shared"
               " -fno-omit-frame-pointer -g --param asan-stack=0";
      // The operands' fence (fence()), unless KEMU_FENCE=0: poisoning is for the whole process, so
      // where another thread reads device memory while kernels run (a data-parallel run's
      // communicator sending a finished bucket, as it overlaps the backward pass on a GPU) ASan
      // would report those reads.
      const char* no_fence = std::getenv("KEMU_FENCE");
      if (!(no_fence && std::string(no_fence) == "0")) {
        poison_ = reinterpret_cast<RegionFn>(dlsym(RTLD_DEFAULT, "__asan_poison_memory_region"));
        unpoison_ = reinterpret_cast<RegionFn>(dlsym(RTLD_DEFAULT, "__asan_unpoison_memory_region"));
        if (!poison_ || !unpoison_) throw Error("emulated device: the AddressSanitizer runtime lacks manual poisoning");
      }
      // Each generated function's operands in bytes, as the module gives its kernel (fence()).
      if (const auto* kernels = m.fb().kernels())
        for (const fb::Kernel* k : *kernels) {
          std::vector<size_t> bytes;
          for (uint32_t i = 0; i < k->operand_numel()->size(); ++i)
            bytes.push_back(size_t(k->operand_numel()->Get(i)) * dtype_bytes(fb::DType(k->operand_dtype()->Get(i))));
          if (k->cuda_scratch_bytes()) bytes.push_back(size_t(k->cuda_scratch_bytes()));  // b[operands]
          if (k->cuda_functions())
            for (const fb::CudaFunction* f : *k->cuda_functions()) {
              auto [it, fresh] = operand_bytes_.emplace(f->symbol()->str(), bytes);
              if (!fresh && it->second != bytes)
                throw Error(m.source() + ": function " + f->symbol()->str() + " serves kernels of different operands");
            }
        }
    }
    // KEMU_PROBE=1 (with the fence): every generated function first reads the byte just past its
    // first operand, which the fence must report at the first such launch: the test that it is up.
    if (const char* probe = std::getenv("KEMU_PROBE"); probe && std::string(probe) == "1") {
      if (!poison_) throw Error("emulated device: KEMU_PROBE=1 needs KEMU_SANITIZE=1 with the fence");
      // The definition's head, after "void " or "__launch_bounds__(N) " (block > 256, attention).
      size_t probed = 0;
      for (const auto& [fn, bytes] : operand_bytes_) {
        const std::string head = " " + fn + "(void* const* b, const long long* range) {";
        const size_t at = src.find(head);
        if (at == std::string::npos || bytes.empty()) continue;
        src.insert(at + head.size(), " { const volatile char* kemu_probe = (const char*)b[0]; (void)kemu_probe[" +
                                         std::to_string(bytes[0]) + "]; }");
        ++probed;
      }
      if (!probed) throw Error(m.source() + ": KEMU_PROBE=1: no generated function's definition found to probe");
      std::fprintf(stderr, "emulated device: KEMU_PROBE: %zu of %zu generated functions read one byte past their first operand\n",
                   probed, operand_bytes_.size());
    }
    const char* cache_env = std::getenv("KILN_EMU_CACHE");
    const char* tmp = std::getenv("TMPDIR");
    const fs::path cache = cache_env && *cache_env ? fs::path(cache_env)
                                                   : fs::path(tmp && *tmp ? tmp : "/tmp") / "kiln-emu-cache";
    fs::create_directories(cache);
    // The key covers the emulation itself (shim.h, kernels_tu.cpp), so a changed shim recompiles.
    std::string emulation;
    for (const char* f : {KILN_EMU_DIR "/shim.h", KILN_EMU_DIR "/kernels_tu.cpp"}) {
      std::ifstream in(f, std::ios::binary);
      emulation.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    char key[32];
    std::snprintf(key, sizeof key, "%016zx", std::hash<std::string>()(src + emulation + cxx + flags + KILN_EMU_DIR));
    const fs::path cu = cache / (std::string(key) + ".cu"), so = cache / (std::string(key) + ".so");
    if (!fs::exists(so)) {
      const std::string pid = std::to_string(getpid());
      { std::ofstream(cu.string() + "." + pid) << src; }
      fs::rename(cu.string() + "." + pid, cu);
      // (Not the compiler under the driver's preloaded ASan runtime.)
      const std::string cmd = std::string(sanitize() ? "env -u LD_PRELOAD " : "") + cxx + " " + flags +
                              " -I" KILN_EMU_DIR " -DKILN_KERNELS_CU='\"" + cu.string() + "\"' " +
                              KILN_EMU_DIR "/kernels_tu.cpp -o " + so.string() + "." + pid;
      std::fprintf(stderr, "emulated device: compiling the module's kernels (%s)\n", so.c_str());
      if (std::system(cmd.c_str()) != 0) throw Error("emulated device: cannot compile the kernels: " + cmd);
      fs::rename(so.string() + "." + pid, so);
    }
    lib_ = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) throw Error("emulated device: cannot load " + so.string() + ": " + dlerror());
    launch_ = reinterpret_cast<LaunchFn>(dlsym(lib_, "kemu_launch"));
    stats_ = reinterpret_cast<StatsFn>(dlsym(lib_, "kemu_stats"));
    if (!launch_) throw Error("emulated device: " + so.string() + " lacks kemu_launch");
  }
  Function function(const std::string& symbol) override {
    void* f = lib_ ? dlsym(lib_, symbol.c_str()) : nullptr;
    if (!f) throw Error("emulated device: the kernels lack function " + symbol);
    names_[f] = symbol;
    return f;
  }
  void launch(Function f, unsigned grid, unsigned block, DevicePtr operands, DevicePtr ranges) override {
    const char* name = names_.at(f).c_str();
    auto fn = reinterpret_cast<KernelFn>(const_cast<void*>(f));
    LaunchFn launch = launch_;
    work([=, this] {
      clock_ += 1e-3;
      auto b = reinterpret_cast<void* const*>(operands);
      auto r = reinterpret_cast<const long long*>(ranges);
      if (poison_) fence(name, b, r);
      try {
        launch(fn, name, grid, block, b, r);
      } catch (...) {
        if (poison_) unfence();
        throw;
      }
      if (poison_) unfence();
      hazards(name);
    });
  }

  Matmul plan_matmul(const MatmulSpec& s) override {
    (void)epilogue_flags(s.epilogue, s.where);  // a name cuBLASLt has
    // KILN_EMU_PLAIN_CUBLASLT=1: a cuBLASLt without fused epilogues (tests the runtime's fallback).
    const char* plain = std::getenv("KILN_EMU_PLAIN_CUBLASLT");
    if (plain && std::string(plain) == "1" && s.epilogue != "DEFAULT")
      throw MatmulUnsupported(s.where + ": cuBLASLt has no algorithm for this product (emulated: epilogue " +
                              s.epilogue + ")");
    // What cuBLASLt accepts (cublasLt.h): A and B of one type, the bias and the GELU auxiliary
    // matrix in D's type (C has D's type by construction).
    auto name = [](fb::DType t) { return std::string(dtype_name(t)); };
    if (s.a_type != s.b_type)
      throw MatmulUnsupported(s.where + ": cuBLASLt A is " + name(s.a_type) + ", B " + name(s.b_type));
    if (s.bias && s.bias_type != s.d_type)
      throw MatmulUnsupported(s.where + ": cuBLASLt bias is " + name(s.bias_type) + ", D " + name(s.d_type));
    if (s.aux && s.aux_type != s.d_type)
      throw MatmulUnsupported(s.where + ": cuBLASLt aux is " + name(s.aux_type) + ", D " + name(s.d_type));
    // Each operand whole in its allocation at its own element size (it checked 2 bytes an element):
    // C and aux of D's shape, the bias one value per row of D.
    for (auto [p, n, t] : {std::tuple{s.a, s.m * s.k, s.a_type}, {s.b, s.k * s.n, s.b_type}, {s.d, s.m * s.n, s.d_type},
                           {s.c, s.m * s.n, s.d_type}, {s.bias, s.m, s.bias_type}, {s.aux, s.m * s.n, s.aux_type}})
      if (p) check(p, size_t(n) * dtype_bytes(t), "matmul operand");
    matmuls_.push_back(s);
    return matmuls_.size() - 1;
  }
  void matmul(Matmul m) override {
    work([this, m] {
      clock_ += 10e-3;
      emulate_matmul(matmuls_.at(m));
    });
  }

  // KEMU_CLOCK=launches: profiling reads a clock that only kernels move, 1 ms per launched
  // function and 10 ms per product (clears and copies: none), so a test can check which step
  // each timing is given to; otherwise the host clock (Device's own).
  void start_timing(size_t marks) override {
    virtual_clock_ = std::getenv("KEMU_CLOCK") && std::string(std::getenv("KEMU_CLOCK")) == "launches";
    if (!virtual_clock_) return Device::start_timing(marks);
    marks_.assign(marks, 0.0);
  }
  void mark(size_t i) override {
    if (!virtual_clock_) return Device::mark(i);
    marks_.at(i) = clock_;
  }
  double seconds(size_t i, size_t j) override {
    return virtual_clock_ ? marks_.at(j) - marks_.at(i) : Device::seconds(i, j);
  }

  bool begin_capture() override {
    not_capturing("begin_capture");
    capturing_ = true;
    graphs_.emplace_back();
    return true;
  }
  Graph end_capture() override {
    if (!capturing_) throw Error("emulated device: end_capture without begin_capture");
    // KEMU_CAPTURE_FAIL=1: every capture is invalidated, as a CUDA stream capture is by a call
    // it does not allow (tests the runtime's fall-back to eager runs).
    const char* fail = std::getenv("KEMU_CAPTURE_FAIL");
    if (fail && std::string(fail) == "1")
      throw Error("cudaStreamEndCapture: operation not permitted when stream is capturing (emulated)");
    capturing_ = false;
    return graphs_.size() - 1;
  }
  void abort_capture() noexcept override {
    if (!capturing_) return;
    capturing_ = false;
    graphs_.pop_back();
  }
  void launch_graph(Graph g) override {
    not_capturing("launch_graph");
    for (auto& w : graphs_.at(g)) w();
  }

 private:
  static bool sanitize() {
    static const bool on = std::getenv("KEMU_SANITIZE") && std::string(std::getenv("KEMU_SANITIZE")) == "1";
    return on;
  }
  // KEMU_SANITIZE: the arena is one allocation, so ASan alone misses a kernel that runs from one
  // operand into the next buffer. Around each launch every allocation but the one holding the
  // operand table is poisoned (ASan's manual poisoning) and only the launch's operands are
  // unpoisoned: for a generated function, operand_numel elements at each operand's address and
  // its kernel's workspace; for the support kernels (compiler/kernel_prelude.cpp), what their
  // ranges say they touch. ASan tracks 8-byte granules, a granule's first k bytes addressable:
  // each range's end is exact, and its start is too when 8-aligned (every buffer is 256-aligned;
  // a range starting inside a granule, a ZeRO-1 slice, opens all of that granule).
  void fence(const char* name, void* const* b, const long long* r) {
    const std::string fn = name;
    std::vector<std::pair<DevicePtr, size_t>> touch;
    auto add = [&](const void* p, long long begin, long long end, size_t elem) {
      if (end > begin) touch.push_back({DevicePtr(p) + DevicePtr(begin) * elem, size_t(end - begin) * elem});
    };
    if (fn == "kiln_sum_squares" || fn == "kiln_norm_finish") {  // {g_0 .. g_n-1, accumulator, norm}
      const long long n = r[0];
      for (long long t = 0; t < n; t++) add(b[t], r[1 + 2 * t], r[2 + 2 * t], 4);
      add(b[n], 0, 1, 8), add(b[n + 1], 0, 1, 4);
    } else if (fn == "kiln_round_copies") {  // {value_0, copy_0, ...}
      for (long long t = 0; t < r[0]; t++)
        add(b[2 * t], r[1 + 2 * t], r[2 + 2 * t], 4), add(b[2 * t + 1], r[1 + 2 * t], r[2 + 2 * t], 2);
    } else if (fn == "kiln_matmul_epilogue") {  // {product, bias, aux, D}; flags 1 bias, 4 aux written, 8 aux read
      auto size = [](long long t) { return dtype_bytes(fb::DType(t)); };
      const long long n = r[0], flags = r[2];
      if (!(flags & 4)) add(b[0], 0, n, size(r[3]));
      if (flags & 1) add(b[1], 0, r[1], size(r[4]));
      if (flags & 12) add(b[2], 0, n, size(r[5]));
      add(b[3], 0, n, size(r[3]));
    } else {
      const std::vector<size_t>& bytes = operand_bytes_.at(fn);
      for (size_t i = 0; i < bytes.size(); i++) add(b[i], 0, (long long)bytes[i], 1);
    }
    const DevicePtr table = DevicePtr(b);
    for (auto [p, n] : allocations_)
      if (table < p || table >= p + n) poison_(reinterpret_cast<void*>(p), n);
    for (auto [p, n] : allocations_)  // each range as it lies in an allocation (never a redzone)
      for (auto [q, len] : touch) {
        const DevicePtr lo = std::max(p, q), hi = std::min(p + n, q + len);
        if (lo < hi) unpoison_(reinterpret_cast<void*>(lo), hi - lo);
      }
  }
  void unfence() {
    for (auto [p, n] : allocations_) unpoison_(reinterpret_cast<void*>(p), n);
  }
  // What the GPU leaves undefined and the emulation noticed in the launch just run: a shuffle
  // (full mask) in a warp some of whose lanes had returned, __syncthreads reached from
  // different lines in one round.
  void hazards(const char* kernel) {
    if (!stats_) return;
    long long s[6] = {};
    stats_(s);
    if (s[4] > seen_[0] || s[5] > seen_[1]) {
      const bool shfl = s[4] > seen_[0];
      seen_[0] = s[4], seen_[1] = s[5];
      throw Error(std::string("emulated device: kernel ") + kernel + ": " +
                  (shfl ? "a warp-wide operation in a warp some of whose lanes had returned"
                        : "__syncthreads reached from different lines in one round") +
                  " (undefined on a GPU)");
    }
  }
  // Runs work now, or records it into the graph being captured.
  void work(std::function<void()> w) {
    if (capturing_) graphs_.back().push_back(std::move(w));
    else w();
  }
  void not_capturing(const char* what) const {
    if (capturing_) throw Error(std::string("emulated device: ") + what + " during a graph capture (CUDA refuses it)");
  }
  // An address range inside one allocation.
  void check(DevicePtr p, size_t bytes, const char* what) const {
    auto it = allocations_.upper_bound(p);
    if (it == allocations_.begin() || p + bytes > std::prev(it)->first + std::prev(it)->second)
      throw Error(std::string("emulated device: ") + what + " outside any allocation");
  }
  std::map<DevicePtr, size_t> allocations_;
  void* lib_ = nullptr;
  LaunchFn launch_ = nullptr;
  StatsFn stats_ = nullptr;
  RegionFn poison_ = nullptr, unpoison_ = nullptr;  // KEMU_SANITIZE (fence)
  std::map<std::string, std::vector<size_t>> operand_bytes_;  // by generated function
  long long seen_[2] = {};  // hazards counted so far: shuffles with returned lanes, divergent barriers
  std::map<const void*, std::string> names_;
  std::vector<MatmulSpec> matmuls_;
  std::vector<std::vector<std::function<void()>>> graphs_;
  bool capturing_ = false;
  bool virtual_clock_ = false;
  double clock_ = 0;  // seconds of kernel work (KEMU_CLOCK=launches)
  std::vector<double> marks_;
};

}  // namespace

std::unique_ptr<Device> make_emulated_device() { return std::make_unique<EmulatedDevice>(); }

}  // namespace kiln
