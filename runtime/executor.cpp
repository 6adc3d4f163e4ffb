// The CPU executor: one kernel call per instruction.
//
// Operand layout of each opcode (inputs -> outputs; ints; floats), as the module writer emits:
//   Embedding        table, idx -> out;                 n, V, C
//   EmbeddingGrad    dout, idx -> dtable;               n, V, C
//   Matmul           a, b -> c;                         M, N, K, transA, transB
//   Add, Mul         a, b -> out;                       n
//   Scale            x, s -> out;                       n
//   Gelu             x -> out;  GeluGrad  dout, x -> dx; n
//   Broadcast        x[K] -> out[R, K];  ReduceSum  x[R, K] -> out[K];   R, K
//   Copy             x -> out;                          n
//   Transpose        x[M, K] -> out[K, M];              M, K
//   Split            x[R, K] -> y_i[R, w_i];  Concat  x_i[R, w_i] -> y[R, K];  R, K, w_0, w_1...
//   Zeros            -> out;  Iota  -> out (i32);       n
//   LayerNorm        x, w, b -> y, mean, rstd;          N, C;  eps
//   LayerNormGrad    dy, x, w, mean, rstd -> dx, dw, db; N, C
//   Attention        qkv -> y, lse;                     B, T, C, H
//   AttentionGrad    dy, qkv, y, lse -> dqkv;           B, T, C, H
//   CrossEntropy     logits, targets -> loss, lse;      N, Vp, V
//   CrossEntropyGrad dloss, logits, lse, targets -> dlogits; N, Vp, V
//                    (rows of Vp columns; the classes are the first V, the rest padding that
//                    takes no part in the softmax and gets a zero gradient)
//   AccumulateGrad   g -> grad (+=);                    n
//   GlobalNorm       g_0, g_1... -> norm;               n_0, n_1...
//   ClipCoef         norm, max_norm -> coef
//   AdamW            g, coef, lr, beta1, beta2, eps, wd, step -> p, m, v [, bf16 copy];  n, decay
//   Cast             x -> out (fp32 <-> bf16);          n
//   ReduceGradients  grad_0, grad_1... -> (none);       bucket, n_0, n_1...
//   WaitGradients    (none)
//   Kernel           a generated fused kernel: its inputs, results, then the state it writes
//                    (see Module.kernels);        kernel index
#include "runtime/executor.h"
#include "runtime/instr_flops.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "runtime/cpu/bf16.h"
#include "runtime/cpu/matmul_bf16.h"
#include "runtime/cpu/kernels.h"
#include "runtime/device/device_executor.h"
#include "runtime/error.h"

namespace kiln {
namespace {

using O = fb::OpCode;

struct Shape {
  std::vector<int64_t> in, out;  // required element counts
};

// The element count each operand must hold, derived from the instruction's ints.
// Returns false when the instruction's operand or int counts are wrong.
bool expected(const fb::Instr& ins, Shape& s) {
  const auto& v = *ins.ints();
  const int want = instr_int_count(ins.op());
  if (want >= 0 ? int(v.size()) != want : int(v.size()) < -want) return false;
  for (int64_t x : v)
    if (x < 0) return false;
  if ((ins.op() == O::Attention || ins.op() == O::AttentionGrad) && (v[3] == 0 || v[2] % v[3] != 0)) return false;
  if ((ins.op() == O::CrossEntropy || ins.op() == O::CrossEntropyGrad) && (v[2] == 0 || v[2] > v[1])) return false;
  if (ins.op() == O::DecodeAttention && (v[2] == 0 || v[1] % v[2] != 0 || v[3] == 0 || v[4] == 0 || v[4] > v[3])) return false;
  // Products of sizes, -1 on overflow (which no buffer satisfies).
  auto mul = [](int64_t a, int64_t b) {
    int64_t r;
    return a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) ? int64_t(-1) : r;
  };
  auto P = [&](auto... xs) {
    int64_t r = 1;
    ((r = mul(r, int64_t(xs))), ...);
    return r;
  };
  auto I = [&](size_t i) { return i < v.size() ? v[i] : -1; };
  const size_t nin = ins.inputs()->size(), nout = ins.outputs()->size();
  switch (ins.op()) {
    case O::Embedding: s.in = {P(I(1), I(2)), I(0)}; s.out = {P(I(0), I(2))}; break;
    case O::EmbeddingGrad: s.in = {P(I(0), I(2)), I(0)}; s.out = {P(I(1), I(2))}; break;
    case O::Matmul: s.in = {P(I(0), I(2)), P(I(2), I(1))}; s.out = {P(I(0), I(1))}; break;
    case O::Add: case O::Mul: s.in = {I(0), I(0)}; s.out = {I(0)}; break;
    case O::Scale: s.in = {I(0), 1}; s.out = {I(0)}; break;
    case O::Gelu: case O::Copy: s.in = {I(0)}; s.out = {I(0)}; break;
    case O::GeluGrad: s.in = {I(0), I(0)}; s.out = {I(0)}; break;
    case O::Broadcast: s.in = {I(1)}; s.out = {P(I(0), I(1))}; break;
    case O::ReduceSum: s.in = {P(I(0), I(1))}; s.out = {I(1)}; break;
    case O::Transpose: s.in = {P(I(0), I(1))}; s.out = {P(I(0), I(1))}; break;
    case O::Split: case O::Concat: {
      std::vector<int64_t> pieces;
      int64_t total = 0;
      for (size_t i = 2; i < v.size(); ++i) {
        pieces.push_back(P(I(0), v[i]));
        if (__builtin_add_overflow(total, v[i], &total)) return false;
      }
      if (total != I(1)) return false;
      if (ins.op() == O::Split) { s.in = {P(I(0), I(1))}; s.out = pieces; }
      else { s.in = pieces; s.out = {P(I(0), I(1))}; }
      break;
    }
    case O::Zeros: case O::Iota: s.in = {}; s.out = {I(0)}; break;
    case O::LayerNorm: s.in = {P(I(0), I(1)), I(1), I(1)}; s.out = {P(I(0), I(1)), I(0), I(0)}; break;
    case O::LayerNormGrad:
      s.in = {P(I(0), I(1)), P(I(0), I(1)), I(1), I(0), I(0)};
      s.out = {P(I(0), I(1)), I(1), I(1)};
      break;
    case O::Attention: s.in = {P(I(0), I(1), 3, I(2))}; s.out = {P(I(0), I(1), I(2)), P(I(0), I(3), I(1))}; break;
    case O::DecodeAttention:  // B, C, H, S, M
      s.in = {P(I(0), I(4), 3, I(1)), P(2, I(0), I(1), I(3)), 1};
      s.out = {P(I(0), I(4), I(1))};
      break;
    case O::AttentionGrad:
      s.in = {P(I(0), I(1), I(2)), P(I(0), I(1), 3, I(2)), P(I(0), I(1), I(2)), P(I(0), I(3), I(1))};
      s.out = {P(I(0), I(1), 3, I(2))};
      break;
    case O::CrossEntropy: s.in = {P(I(0), I(1)), I(0)}; s.out = {1, I(0)}; break;
    case O::CrossEntropyGrad: s.in = {1, P(I(0), I(1)), I(0), I(0)}; s.out = {P(I(0), I(1))}; break;
    case O::AccumulateGrad: s.in = {I(0)}; s.out = {I(0)}; break;
    case O::GlobalNorm: s.in.assign(v.begin(), v.end()); s.out = {1}; break;
    case O::ClipCoef: s.in = {1, 1}; s.out = {1}; break;
    case O::AdamW:
      s.in = {I(0), 1, 1, 1, 1, 1, 1, 1};
      s.out = {I(0), I(0), I(0)};
      if (nout == 4) s.out.push_back(I(0));  // the bf16 compute copy
      break;
    case O::Cast: s.in = {I(0)}; s.out = {I(0)}; break;
    case O::ReduceGradients: s.in.assign(v.begin() + std::min<size_t>(1, v.size()), v.end()); s.out = {}; break;
    case O::WaitGradients: s.in = {}; s.out = {}; break;
    case O::Kernel: return false;  // checked against its kernel's operand table
  }
  return s.in.size() == nin && s.out.size() == nout;
}

// Which inputs hold i32 token ids.
bool is_index_input(O op, size_t i) {
  return (op == O::Embedding && i == 1) || (op == O::EmbeddingGrad && i == 1) ||
         (op == O::CrossEntropy && i == 1) || (op == O::CrossEntropyGrad && i == 3) ||
         (op == O::DecodeAttention && i == 2);
}

}  // namespace

// What this process may still allocate: the kernel's estimate of available memory, under the
// address-space limit (ulimit -v) and the container's memory limit (cgroup v2), when set; 0 when
// none is known.
static uint64_t available_memory() {
  uint64_t avail = 0;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    std::fclose(f);
    avail = uint64_t(kb) * 1024;
  }
  auto at_most = [&](uint64_t limit) { avail = avail ? std::min(avail, limit) : limit; };
  if (rlimit as{}; ::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) at_most(uint64_t(as.rlim_cur));
  // The container's limit less its anonymous memory (page cache, which it also counts, is given
  // back under pressure).
  unsigned long long limit = 0, anon = 0;
  bool has_limit = false, has_anon = false;
  if (std::FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r")) {
    has_limit = std::fscanf(f, "%llu", &limit) == 1;  // "max" (no limit) reads as no number
    std::fclose(f);
  }
  if (std::FILE* f = has_limit ? std::fopen("/sys/fs/cgroup/memory.stat", "r") : nullptr) {
    char line[256];
    while (!has_anon && std::fgets(line, sizeof line, f)) has_anon = std::sscanf(line, "anon %llu", &anon) == 1;
    std::fclose(f);
  }
  if (has_limit && has_anon) at_most(limit > anon ? limit - anon : 0);
  return avail;
}

Executor::Executor(const Module& module, std::vector<std::string> programs, const StatePlan& state)
    : module_(module), layout_(layout_arena(module, state)), programs_(std::move(programs)) {
  const std::string target = module_.fb().model()->target() ? module_.fb().model()->target()->str() : "cpu";
  if (target != "cpu" && target != "cuda")
    throw Error(module_.source() + ": the module's kernels target '" + target + "', which this runtime cannot run");
  if (programs_.empty())
    for (const fb::Program* p : *module.fb().programs()) programs_.push_back(p->name()->str());
  uint64_t activations = 0;
  for (const std::string& name : programs_) {
    const fb::Program* p = module.program(name);
    if (!p) throw Error(module.source() + ": the module has no program '" + name + "'");
    activations = std::max(activations, p->activation_size());
  }
  // On a GPU the host holds only a copy of the state region; the activations live there.
  const bool gpu = target == "cuda";
  const uint64_t bytes = std::max<uint64_t>(layout_.state_bytes + (gpu ? 0 : activations), 256);
  auto gib = [](uint64_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.4g GiB", double(b) / double(1ull << 30));
    return std::string(text);
  };
  // Linux overcommits: check before allocating rather than die touching the pages.
  const uint64_t avail = available_memory();
  if (avail && bytes > avail) {
    // What would help depends on whether the state fits alone: the activations shrink with the
    // batch and with recomputation, the state (weights, gradients, AdamW moments) only with the
    // model or, on several ranks, with --zero 1.
    const uint64_t acts = gpu ? 0 : activations;
    const std::string parts = " (state " + gib(layout_.state_bytes) + ", activations " + gib(acts) + ")";
    const std::string advice = layout_.state_bytes <= avail
                                   ? "compile with a smaller batch_size, or with --recompute=cheap"
                                   : "the model's weights, gradients and AdamW moments alone do not fit: a smaller "
                                     "model, or (to train) several ranks with --zero 1";
    throw Error(module.source() + ": the arena needs " + std::to_string(bytes) + " bytes (" + gib(bytes) + ")" +
                parts + " but only " + gib(avail) + " of memory is available; " + advice);
  }
  for (const std::string& name : programs_) check(*module.program(name));
  if (layout_.sliced)
    for (const std::string& name : programs_) check_sliced_moments(*module.program(name));
  // The GPU first: without one, nothing is allocated here.
  if (gpu) device_ = std::make_unique<DeviceExecutor>(module_, layout_, programs_);
  // Anonymous pages start zeroed and cost nothing until touched: the buffers a run never uses
  // (sample's gradients and AdamW moments, gigabytes for GPT-2 124M) are never cleared.
  arena_mapped_ = (bytes + 4095) / 4096 * 4096;
  void* mapped = ::mmap(nullptr, arena_mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED)
    throw Error(module.source() + ": cannot allocate the " + std::to_string(bytes) + "-byte arena: " +
                std::strerror(errno));
  arena_ = static_cast<uint8_t*>(mapped);
  if (gpu) device_->set_host_state(arena_);
  else load_kernels();
  for (size_t p = 0; p < state.moment_slices.size(); ++p)
    set_parameter_slice(p, state.moment_slices[p].first, state.moment_slices[p].second);
}

Executor::~Executor() {
  device_.reset();
  if (arena_) ::munmap(arena_, arena_mapped_);
  if (kernel_library_) dlclose(kernel_library_);
  if (kernel_library_fd_ >= 0) ::close(kernel_library_fd_);
}

// Generated kernels: the module carries them as a shared library built by kilnc's host
// compiler; it is written to a temporary file, loaded, and the file removed at once.
void Executor::load_kernels() {
  const auto* kernels = module_.fb().kernels();
  if (!kernels || kernels->size() == 0) return;
  const auto* lib = module_.fb().cpu_library();
  if (!lib || lib->size() == 0)
    throw Error(module_.source() + ": the module has " + std::to_string(kernels->size()) +
                " generated kernels but no compiled library for them");
  // An anonymous in-memory file (no temporary file to clean up, and no noexec /tmp to trip on);
  // a file in $TMPDIR, removed once loaded, where memfd_create is missing.
  std::string path;
  int fd = memfd_create("kiln-kernels", MFD_CLOEXEC);
  if (fd >= 0) {
    path = "/proc/self/fd/" + std::to_string(fd);
  } else {
    const char* tmpdir = std::getenv("TMPDIR");
    path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/kiln-kernels-XXXXXX";
    fd = mkstemp(path.data());
    if (fd < 0) throw Error(module_.source() + ": cannot create a temporary file for its kernels in " + path);
  }
  const bool on_disk = path.rfind("/proc/", 0) != 0;
  const uint8_t* p = lib->data();
  size_t left = lib->size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int error = w < 0 ? errno : ENOSPC;
      ::close(fd);
      if (on_disk) ::unlink(path.c_str());
      throw Error(module_.source() + ": cannot write its kernel library (" + std::to_string(lib->size()) +
                  " bytes) to " + (on_disk ? path : "an in-memory file") + ": " + std::strerror(error) +
                  (error == EFBIG ? " (the file-size limit, ulimit -f, is below that)" : ""));
    }
    p += w, left -= size_t(w);
  }
  kernel_library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  // Under KILN_CPU_FENCE the in-memory file stays open while the library is loaded: ASan's
  // symbolizer reads the kernels' names from /proc/self/fd/N.
  const char* fence = std::getenv("KILN_CPU_FENCE");
  const bool fenced = fence && std::strcmp(fence, "1") == 0;
  if (fenced && kernel_library_ && !on_disk) kernel_library_fd_ = fd;
  else ::close(fd);
  if (on_disk) ::unlink(path.c_str());
  if (!kernel_library_)
    throw Error(module_.source() + ": cannot load its kernel library: " + std::string(dlerror()));
  for (const fb::Kernel* k : *kernels) {
    void* fn = k->symbol() ? dlsym(kernel_library_, k->symbol()->c_str()) : nullptr;
    if (!fn)
      throw Error(module_.source() + ": its kernel library lacks kernel '" +
                  (k->symbol() ? k->symbol()->str() : std::string("?")) + "'");
    kernel_fns_.push_back(reinterpret_cast<KernelFn>(fn));
  }
  // (absent from a library compiled before the kernels reported their scratch)
  kernel_scratch_bytes_ = reinterpret_cast<long long (*)()>(dlsym(kernel_library_, "kiln_scratch_bytes"));
  if (fenced) setup_fence();
}

// KILN_CPU_FENCE=1: the arena is one allocation, so AddressSanitizer alone misses a generated
// kernel that runs from one operand into the neighbouring buffer. With the fence, around each
// generated-kernel call the whole arena is poisoned (ASan's manual poisoning) and only the call's
// operands are unpoisoned: operand_numel elements of operand_dtype at each operand's address, as
// the module gives the kernel (a ZeRO-1 moment: the slice this executor holds). An instrumented
// kernel touching any other arena byte is reported (use-after-poison). Afterwards the whole arena
// is addressable again, so the built-in ops (BLAS products, oneDNN, the runtime's own kernels),
// the loader and the communicator run unfenced; a kernel's scratch (kernel_prelude.cpp's
// scratch(), malloc'ed by the instrumented library) is ASan's ordinary heap. Only useful with
// kernels compiled under ASan (kilnc with KILN_CXX naming a wrapper that adds
// -fsanitize=address,undefined; the ASan runtime preloaded into the run: test/e2e/cpu_fence.sh
// does both). OpenMP threads inside a kernel are fine (poisoning is process-wide, done on
// the calling thread before and after the parallel region); a data-parallel run's communicator
// thread is not (it reads and writes the arena while kernels run): set_gradient_hooks refuses the
// fence when there are several ranks. Off, it costs one branch a kernel call.
void Executor::setup_fence() {
  const std::string why = module_.source() + ": KILN_CPU_FENCE=1: ";
  poison_ = reinterpret_cast<RegionFn>(dlsym(RTLD_DEFAULT, "__asan_poison_memory_region"));
  unpoison_ = reinterpret_cast<RegionFn>(dlsym(RTLD_DEFAULT, "__asan_unpoison_memory_region"));
  if (!poison_ || !unpoison_)
    throw Error(why + "the process has no AddressSanitizer runtime (run it with "
                      "LD_PRELOAD=$(c++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0)");
  // A library built without ASan names none of its functions: the fence would check nothing.
  const auto* lib = module_.fb().cpu_library();
  static const char asan[] = "__asan_";
  if (!memmem(lib->data(), lib->size(), asan, sizeof asan - 1))
    throw Error(why + "the module's kernels are not compiled with AddressSanitizer (compile it with KILN_CXX "
                      "naming a wrapper that adds -fsanitize=address,undefined, and KILN_KERNEL_CACHE=off)");
  const char* probe = std::getenv("KILN_CPU_FENCE_PROBE");
  fence_probe_ = probe && std::strcmp(probe, "1") == 0;
  if (fence_probe_)
    std::fprintf(stderr, "%s: KILN_CPU_FENCE_PROBE: the last byte of each generated kernel's first operand stays "
                         "fenced; the first kernel that touches all of it must be reported\n", module_.source().c_str());
}

void Executor::run_fenced(KernelFn fn, const fb::Kernel& k, const fb::Instr& ins) {
  struct Unfence {  // also when the kernel throws
    Executor& ex;
    ~Unfence() { ex.unpoison_(ex.arena_, ex.arena_mapped_); }
  } unfence{*this};
  poison_(arena_, arena_mapped_);
  const uint32_t nin = ins.inputs()->size(), n = nin + ins.outputs()->size();
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t b = i < nin ? ins.inputs()->Get(i) : ins.outputs()->Get(i - nin);
    const size_t elem = dtype_bytes(fb::DType(k.operand_dtype()->Get(i)));
    // check_kernel: operand_numel is the buffer's numel; the arena holds layout_.held of it.
    const auto [lo, hi] = layout_.held[b];
    size_t bytes = size_t(hi - lo) * elem;
    if (fence_probe_ && i == 0 && bytes > 0) --bytes;
    // ASan tracks 8-byte granules, each open for a prefix of its bytes: the end is exact, the
    // start too (buffers start 256-aligned; a ZeRO-1 slice starting inside a granule opens it all).
    unpoison_(addr(b) + size_t(lo) * elem, bytes);
  }
  fn(kernel_args_.data(), kernel_ranges_.data());
}

void Executor::check(const fb::Program& prog) const {
  for (uint32_t k = 0; k < prog.instrs()->size(); ++k) {
    const fb::Instr& ins = *prog.instrs()->Get(k);
    std::string where = module_.source() + ": program " + prog.name()->str() + ", instr " +
                        std::to_string(k) + " (" + fb::EnumNameOpCode(ins.op()) + ")";
    if (ins.op() == O::Kernel) {
      check_kernel(ins, where);
      continue;
    }
    if (ins.op() == O::Matmul && ins.ints()->size() == 5 && (ins.ints()->Get(3) > 1 || ins.ints()->Get(4) > 1))  // flags
      throw Error(where + ": transpose flags " + std::to_string(ins.ints()->Get(3)) + ", " +
                  std::to_string(ins.ints()->Get(4)) + " are not 0 or 1");
    Shape s;
    if (!expected(ins, s)) throw Error(where + ": wrong number of operands or size attributes");
    // Float operands may be fp32 or bf16 (bf16 is widened to fp32 around the kernel); token ids
    // are i32; optimizer state and gradient accumulators are fp32.
    auto fits = [&](uint32_t idx, int64_t need, bool index, bool fp32_only, const char* role) {
      const fb::Buffer& b = module_.buffer(idx);
      const bool type_ok = index ? b.dtype() == fb::DType::I32
                                 : b.dtype() == fb::DType::F32 || (!fp32_only && b.dtype() == fb::DType::BF16);
      if (need < 0 || numel(b) != need || !type_ok)
        throw Error(where + ": " + role + " buffer " + std::to_string(idx) + " holds " +
                    std::to_string(numel(b)) + " " + dtype_name(b.dtype()) + ", needs " +
                    std::to_string(need) + (index ? " I32" : fp32_only ? " F32" : " F32 or BF16"));
    };
    const bool state_op = ins.op() == O::AccumulateGrad || ins.op() == O::AdamW || ins.op() == O::ReduceGradients;
    for (size_t i = 0; i < s.in.size(); ++i)
      fits(ins.inputs()->Get(i), s.in[i], is_index_input(ins.op(), i), state_op, "input");
    for (size_t i = 0; i < s.out.size(); ++i) {
      const bool copy = ins.op() == O::AdamW && i == 3;
      fits(ins.outputs()->Get(i), s.out[i], ins.op() == O::Iota, state_op && !copy, "output");
      if (copy && module_.buffer(ins.outputs()->Get(i)).dtype() != fb::DType::BF16)
        throw Error(where + ": the compute copy must be BF16");
    }
    if (ins.op() == O::LayerNorm && (!ins.floats() || ins.floats()->size() != 1))
      throw Error(where + ": needs its epsilon");
  }
}

// A sliced moment (ZeRO-1) holds only the elements the optimizer updates: only its own
// parameter's AdamW may name it (output 1 or 2 of the built-in op; in a fused optimizer kernel's
// outputs, right after that parameter's value, as kilnc writes them), or an update would write
// past its storage.
void Executor::check_sliced_moments(const fb::Program& prog) const {
  std::unordered_map<uint32_t, std::pair<uint32_t, int>> owner;  // moment -> (value, 1 m or 2 v)
  for (const fb::Parameter* p : *module_.fb().parameters())
    if (!layout_.whole(p->adam_m()) || !layout_.whole(p->adam_v()))
      owner[p->adam_m()] = {p->value(), 1}, owner[p->adam_v()] = {p->value(), 2};
  for (uint32_t k = 0; k < prog.instrs()->size(); ++k) {
    const fb::Instr& ins = *prog.instrs()->Get(k);
    const auto& outs = *ins.outputs();
    auto fits = [&](uint32_t i) {
      const auto [value, slot] = owner.at(outs.Get(i));
      if (ins.op() == O::AdamW) return i == uint32_t(slot) && outs.Get(0) == value;
      if (ins.op() != O::Kernel || i < uint32_t(slot) || outs.Get(i - uint32_t(slot)) != value) return false;
      const fb::Kernel& kern = *module_.fb().kernels()->Get(uint32_t(ins.ints()->Get(0)));
      return kern.kind()->str() == "optimizer" && kern.adamw_params() &&
             std::find(kern.adamw_params()->begin(), kern.adamw_params()->end(), value) != kern.adamw_params()->end();
    };
    bool ok = std::none_of(ins.inputs()->begin(), ins.inputs()->end(), [&](uint32_t b) { return owner.count(b) > 0; });
    for (uint32_t i = 0; ok && i < outs.size(); ++i) ok = !owner.count(outs.Get(i)) || fits(i);
    if (!ok)
      throw Error(module_.source() + ": program " + prog.name()->str() + ", instr " + std::to_string(k) + " (" +
                  fb::EnumNameOpCode(ins.op()) + "): --zero 1 keeps a slice of the AdamW moments, and this instruction "
                  "uses one other than as its parameter's AdamW update");
  }
}

// Module::verify has checked the kernel index, the operand tables' lengths and adamw_params;
// here, each operand's buffer against what the kernel was compiled for.
void Executor::check_kernel(const fb::Instr& ins, const std::string& where) const {
  const fb::Kernel& k = *module_.fb().kernels()->Get(uint32_t(ins.ints()->Get(0)));
  const size_t n = ins.inputs()->size() + ins.outputs()->size();
  for (size_t i = 0; i < n; ++i) {
    const uint32_t idx = i < ins.inputs()->size() ? ins.inputs()->Get(uint32_t(i))
                                                  : ins.outputs()->Get(uint32_t(i - ins.inputs()->size()));
    const fb::Buffer& b = module_.buffer(idx);
    const auto dtype = static_cast<fb::DType>(k.operand_dtype()->Get(uint32_t(i)));
    if (numel(b) != k.operand_numel()->Get(uint32_t(i)) || b.dtype() != dtype)
      throw Error(where + ": kernel " + k.symbol()->str() + " operand " + std::to_string(i) + " needs " +
                  std::to_string(k.operand_numel()->Get(uint32_t(i))) + " " + dtype_name(dtype) + ", buffer " +
                  std::to_string(idx) + " holds " + std::to_string(numel(b)) + " " + dtype_name(b.dtype()));
  }
}

// A generated kernel gets the arena address of every operand, and for an optimizer kernel the
// [begin, end) slice of each parameter this rank updates (all of it unless ZeRO-1 set slices).
void Executor::run_generated(const fb::Instr& ins) {
  const fb::Kernel& k = *module_.fb().kernels()->Get(uint32_t(ins.ints()->Get(0)));
  kernel_args_.clear();
  for (uint32_t b : *ins.inputs()) kernel_args_.push_back(addr(b));
  for (uint32_t b : *ins.outputs()) kernel_args_.push_back(addr(b));
  kernel_ranges_.clear();
  if (k.adamw_params())
    for (uint32_t v : *k.adamw_params()) {
      auto s = slice_by_buffer_.find(v);
      if (s != slice_by_buffer_.end()) kernel_ranges_.insert(kernel_ranges_.end(), {s->second.first, s->second.second});
      else kernel_ranges_.insert(kernel_ranges_.end(), {0, numel(module_.buffer(v))});
    }
  const KernelFn fn = kernel_fns_[size_t(ins.ints()->Get(0))];
  if (poison_) return run_fenced(fn, k, ins);  // KILN_CPU_FENCE=1
  fn(kernel_args_.data(), kernel_ranges_.data());
}

float* Executor::f32(uint32_t b) {
  if (!layout_.whole(b))
    throw Error(module_.source() + ": this rank keeps elements [" + std::to_string(layout_.held[b].first) + ", " +
                std::to_string(layout_.held[b].second) + ") of " + module_.buffer(b).name()->str() +
                " only (ZeRO-1), not all " + std::to_string(layout_.numel[b]));
  return f32_held(b);
}

float* Executor::f32_held(uint32_t b) {
  const fb::Buffer& buf = module_.buffer(b);
  if (device_) {
    if (buf.kind() == fb::BufferKind::Activation)
      throw Error(module_.source() + ": buffer " + buf.name()->str() +
                  " lives on the GPU (only the state region has a host copy; read() copies others)");
    const bool host_written = buf.kind() == fb::BufferKind::Input || buf.kind() == fb::BufferKind::Hyper;
    if (host_stale_ && !host_written)
      throw Error(module_.source() + ": the host copy of " + buf.name()->str() +
                  " is older than the GPU's (sync_to_host() first)");
  }
  return reinterpret_cast<float*>(addr(b)) + layout_.held[b].first;
}

void Executor::read(uint32_t b, size_t offset, size_t bytes, void* dst) {
  const fb::Buffer& buf = module_.buffer(b);
  if (offset > buf.size() || bytes > buf.size() - offset)
    throw Error(module_.source() + ": read of bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                ") of buffer " + buf.name()->str() + ", which has " + std::to_string(buf.size()));
  if (!layout_.whole(b)) throw Error(module_.source() + ": read of " + buf.name()->str() + ", which this rank keeps a slice of");
  if (device_) return device_->read(layout_.at[b] + offset, bytes, dst);
  std::memcpy(dst, addr(b) + offset, bytes);
}
int32_t* Executor::i32(uint32_t b) { return reinterpret_cast<int32_t*>(f32(b)); }

std::string Executor::device_name() const { return device_ ? device_->device_name() : "cpu"; }
size_t Executor::device_bytes() const { return device_ ? device_->device_bytes() : 0; }

void Executor::sync_to_host() {
  if (!device_ || !host_stale_) return;
  device_->pull_state();
  host_stale_ = false;
}

void Executor::set_gradient_hooks(std::function<void(int64_t)> reduce, std::function<void()> wait,
                                  std::function<void()> drain) {
  if (device_) return device_->set_gradient_hooks(std::move(reduce), std::move(wait), std::move(drain));
  // (set only with several ranks: data_parallel.cpp)
  if (poison_)
    throw Error(module_.source() + ": KILN_CPU_FENCE=1 runs one process only: a data-parallel run's communicator "
                "thread reads and writes the arena while the fenced kernels run, which ASan would report");
  reduce_hook_ = std::move(reduce);
  wait_hook_ = std::move(wait);
}

void Executor::copy_elements(uint32_t buffer, int64_t offset, int64_t n, float* dst) {
  const fb::Buffer& b = module_.buffer(buffer);
  const auto [lo, hi] = layout_.held[buffer];
  if (b.dtype() != fb::DType::F32 || offset < lo || n < 0 || offset + n > hi)
    throw Error(module_.source() + ": elements [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                ") of " + b.name()->str() + " are not fp32 elements this rank holds");
  const size_t bytes = size_t(n) * sizeof(float);
  if (device_) {
    host_stale_ = true;  // `dst` may be state too (DataParallel gathers the moments in the gradients)
    const DevicePtr at = device_->address(layout_.at[buffer] + uint64_t(offset) * sizeof(float));
    return device_->copy(DevicePtr(reinterpret_cast<uintptr_t>(dst)), at, bytes);
  }
  std::memcpy(dst, reinterpret_cast<float*>(addr(buffer)) + offset, bytes);
}

float* Executor::comm_address(uint32_t buffer) const {
  if (device_) return reinterpret_cast<float*>(uintptr_t(device_->address(layout_.at[buffer])));
  return reinterpret_cast<float*>(addr(buffer));
}

void Executor::read_floats(const float* at, int64_t n, float* dst) {
  if (device_) return device_->download(dst, DevicePtr(reinterpret_cast<uintptr_t>(at)), size_t(n) * sizeof(float));
  std::memcpy(dst, at, size_t(n) * sizeof(float));
}

bool Executor::comm_needs_device_memory() const { return device_ && !device_->host_addressable(); }
void* Executor::device_stream() const { return device_ ? device_->stream() : nullptr; }

static int find_buffer(const Module& m, fb::BufferKind kind, const std::string& name) {
  for (uint32_t i = 0; i < m.fb().buffers()->size(); ++i) {
    const fb::Buffer& b = m.buffer(i);
    if (b.kind() == kind && b.name() && b.name()->str() == name) return int(i);
  }
  return -1;
}

bool Executor::has_hyper(const std::string& name) const {
  return find_buffer(module_, fb::BufferKind::Hyper, name) >= 0;
}

void Executor::set_hyper(const std::string& name, float value) {
  int b = find_buffer(module_, fb::BufferKind::Hyper, name);
  if (b >= 0) *f32(uint32_t(b)) = value;  // a program that does not read it has no slot
}

int32_t* Executor::input(const std::string& name) {
  int b = find_buffer(module_, fb::BufferKind::Input, name);
  if (b < 0) throw Error(module_.source() + ": the module has no input named '" + name + "'");
  return i32(uint32_t(b));
}

void Executor::zero_grads() {
  if (device_) return device_->zero_grads();  // the host copy keeps its (unused) gradients
  for (const fb::Parameter* p : *module_.fb().parameters())
    cpu::fill(f32(p->grad()), 0.0f, numel(module_.buffer(p->grad())));
}

float Executor::run(const std::string& name) {
  const fb::Program* prog = module_.program(name);
  if (!prog || std::find(programs_.begin(), programs_.end(), name) == programs_.end())
    throw Error(module_.source() + ": program '" + name + "' is not loaded in this executor");
  if (device_) {
    host_stale_ = true;
    return device_->run(name, profile_ ? &profile_by_op_ : nullptr);
  }
  for (const fb::Instr* ins : *prog->instrs()) {
    if (!profile_) {
      exec(*ins);
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    exec(*ins);
    const std::string key = ins->op() == O::Kernel
                                ? module_.fb().kernels()->Get(uint32_t(ins->ints()->Get(0)))->symbol()->str()
                                : std::string(fb::EnumNameOpCode(ins->op()));
    KernelTime& t = profile_by_op_[key];
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.flops += instr_flops(module_, *ins);
    ++t.calls;
  }
  return *f32(prog->result());
}

// --- Data-parallel hooks (ZeRO-1) ------------------------------------------------------------
void Executor::set_parameter_slice(size_t param, int64_t begin, int64_t end) {
  const auto& params = *module_.fb().parameters();
  if (param >= params.size())
    throw Error(module_.source() + ": set_parameter_slice: parameter " + std::to_string(param) + " of " +
                std::to_string(params.size()));
  const fb::Parameter& p = *params.Get(uint32_t(param));
  const int64_t n = numel(module_.buffer(p.value()));
  if (begin < 0 || begin > end || end > n)
    throw Error(module_.source() + ": set_parameter_slice: [" + std::to_string(begin) + ", " +
                std::to_string(end) + ") is not within parameter " + p.name()->str() + " of " +
                std::to_string(n) + " elements");
  // The arena keeps the moments of the constructor's slices only.
  if (layout_.sliced && layout_.held[p.adam_m()] != std::pair{begin, end})
    throw Error(module_.source() + ": set_parameter_slice: [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") of parameter " + p.name()->str() + ", but this executor keeps its moments [" +
                std::to_string(layout_.held[p.adam_m()].first) + ", " + std::to_string(layout_.held[p.adam_m()].second) + ")");
  if (device_) return device_->set_parameter_slice(p.value(), p.grad(), begin, end);
  slice_by_buffer_[p.value()] = {begin, end};
  slice_by_buffer_[p.grad()] = {begin, end};
}

void Executor::set_norm_reducer(std::function<double(double)> reduce) {
  if (device_) return device_->set_norm_reducer(std::move(reduce));
  norm_reducer_ = std::move(reduce);
}

void Executor::refresh_gathered_compute_copies() {
  if (!device_) return refresh_compute_copies();  // every copy: cheap next to the update
  device_->round_other_compute_copies();
  host_stale_ = true;
}

std::vector<std::pair<std::string, KernelTime>> Executor::profile_rows() const {
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [op, t] : profile_by_op_) order.push_back({t.seconds, op});
  std::sort(order.rbegin(), order.rend());
  std::vector<std::pair<std::string, KernelTime>> rows;
  for (const auto& [sec, op] : order) rows.emplace_back(op, profile_by_op_.at(op));
  return rows;
}

void Executor::print_profile() const {
  double total = 0;
  const auto rows = profile_rows();
  for (const auto& [op, t] : rows) total += t.seconds;
  int width = 40;  // the name column fits the longest name (fused kernels list their ops)
  for (const auto& [op, t] : rows) width = std::max(width, int(op.size()));
  // GFLOP/s: the row's arithmetic (kiln-inspect's count) over its time; "-" where it only moves data.
  std::fprintf(stderr, "%-*s %10s %7s %10s %10s\n", width, "kernel", "total ms", "share", "calls", "GFLOP/s");
  for (const auto& [op, t] : rows) {
    char rate[32] = "-";
    if (const double g = t.seconds > 0 ? t.flops / t.seconds * 1e-9 : 0; g > 0)
      std::snprintf(rate, sizeof rate, g >= 100 ? "%.0f" : g >= 1 ? "%.1f" : "%.2g", g);
    std::fprintf(stderr, "%-*s %10.3f %6.1f%% %10lld %10s\n", width, op.c_str(), t.seconds * 1e3,
                 100 * t.seconds / total, (long long)t.calls, rate);
  }
}

int64_t Executor::host_scratch_bytes() const {
  if (device_) return 0;
  if (kernel_library_ && !kernel_scratch_bytes_) return -1;
  int64_t bytes = kernel_scratch_bytes_ ? int64_t(kernel_scratch_bytes_()) : 0;
  for (const auto& [slot, v] : scratch_) bytes += int64_t(v.capacity() * sizeof(float));
  return bytes;
}

// bf16 operands: kernels compute in fp32, so a bf16 input is widened into a scratch buffer and
// a bf16 output is computed in scratch and rounded (to nearest even) into its buffer after the
// kernel. Storage is bf16, arithmetic fp32: the numerics of the GPU kernels.
float* Executor::operand(uint32_t buffer, size_t slot, bool is_output) {
  const fb::Buffer& b = module_.buffer(buffer);
  // Element 0's address: a sliced moment is read and written only in its slice (AdamW).
  if (b.dtype() != fb::DType::BF16) return reinterpret_cast<float*>(addr(buffer));
  std::vector<float>& scratch = scratch_[slot];
  scratch.resize(size_t(numel(b)));
  if (!is_output) {
    cpu::widen_bf16(scratch.data(), reinterpret_cast<const uint16_t*>(addr(buffer)), numel(b));
  } else {
    pending_.push_back({buffer, slot});
  }
  return scratch.data();
}

void Executor::flush_outputs() {
  for (auto [buffer, slot] : pending_) {
    const fb::Buffer& b = module_.buffer(buffer);
    cpu::narrow_bf16(reinterpret_cast<uint16_t*>(addr(buffer)), scratch_[slot].data(), numel(b));
  }
  pending_.clear();
}

void Executor::refresh_compute_copies() {
  for (const fb::Parameter* p : *module_.fb().parameters())
    if (p->compute_copy() >= 0) {
      const fb::Buffer& copy = module_.buffer(uint32_t(p->compute_copy()));
      cpu::narrow_bf16(reinterpret_cast<uint16_t*>(addr(uint32_t(p->compute_copy()))), f32(p->value()), numel(copy));
    }
  if (device_) device_->push_state();
}

void Executor::exec(const fb::Instr& ins) {
  if (ins.op() == O::Kernel) return run_generated(ins);
  const auto& v = *ins.ints();
  if (ins.op() == O::Matmul) {  // bf16 operands: oneDNN reads and writes the buffers themselves
    auto is_bf16 = [&](uint32_t buffer) { return module_.buffer(buffer).dtype() == fb::DType::BF16; };
    const uint32_t a = ins.inputs()->Get(0), b = ins.inputs()->Get(1), c = ins.outputs()->Get(0);
    if (is_bf16(a) && is_bf16(b) &&
        cpu::matmul_bf16(addr(c), is_bf16(c), reinterpret_cast<const uint16_t*>(addr(a)),
                         reinterpret_cast<const uint16_t*>(addr(b)), v[0], v[1], v[2], v[3] != 0, v[4] != 0))
      return;
  }
  const size_t nin = ins.inputs()->size();
  auto in = [&](size_t i) { return operand(ins.inputs()->Get(i), i, false); };
  auto iin = [&](size_t i) { return i32(ins.inputs()->Get(i)); };
  auto out = [&](size_t i) { return operand(ins.outputs()->Get(i), nin + i, true); };
  run_kernel(ins, v, in, iin, out);
  flush_outputs();
}

// The built-in embedding and cross-entropy kernels index rows by the ids they read: an id past the
// instruction's V (its table's rows, the logits' columns) would read or write outside the buffer.
// The loader checks the data's ids against the model's vocabulary only, and a module's V per
// instruction is its own, so each instruction checks its ids (n of them: cheap beside the op).
static void check_ids(const std::string& source, const fb::Instr& ins, const int32_t* ids, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= V)
      throw Error(source + ": " + fb::EnumNameOpCode(ins.op()) + " (" + (ins.loc() ? one_line(ins.loc()->str()) : "") +
                  "): id " + std::to_string(ids[i]) + " at element " + std::to_string(i) + " is not in [0, " +
                  std::to_string(V) + ") (a damaged module, or one whose sizes disagree with the model's)");
}

template <typename In, typename IIn, typename Out>
void Executor::run_kernel(const fb::Instr& ins, const flatbuffers::Vector<int64_t>& v, In in, IIn iin, Out out) {
  switch (ins.op()) {
    case O::Embedding:
      check_ids(module_.source(), ins, iin(1), v[0], v[1]);
      cpu::embedding_fwd(out(0), iin(1), in(0), v[0], v[2]);
      break;
    case O::EmbeddingGrad:
      check_ids(module_.source(), ins, iin(1), v[0], v[1]);
      cpu::embedding_bwd(out(0), iin(1), in(0), v[0], v[1], v[2]);
      break;
    case O::Matmul: cpu::matmul(out(0), in(0), in(1), v[0], v[1], v[2], v[3], v[4]); break;
    case O::Add: cpu::add(out(0), in(0), in(1), v[0]); break;
    case O::Mul: cpu::mul(out(0), in(0), in(1), v[0]); break;
    case O::Scale: cpu::scale(out(0), in(0), *in(1), v[0]); break;
    case O::Gelu: cpu::gelu_fwd(out(0), in(0), v[0]); break;
    case O::GeluGrad: cpu::gelu_bwd(out(0), in(1), in(0), v[0]); break;
    case O::Broadcast: cpu::broadcast_rows(out(0), in(0), v[0], v[1]); break;
    case O::ReduceSum: cpu::sum_rows(out(0), in(0), v[0], v[1]); break;
    case O::Copy: cpu::copy(out(0), in(0), v[0]); break;
    case O::Transpose: cpu::transpose(out(0), in(0), v[0], v[1]); break;
    case O::Split: {
      int64_t offset = 0;
      for (size_t i = 2; i < v.size(); ++i) {
        cpu::slice_cols(out(i - 2), in(0), v[0], v[1], offset, v[i]);
        offset += v[i];
      }
      break;
    }
    case O::Concat: {
      int64_t offset = 0;
      for (size_t i = 2; i < v.size(); ++i) {
        cpu::insert_cols(out(0), in(i - 2), v[0], v[1], offset, v[i]);
        offset += v[i];
      }
      break;
    }
    case O::Zeros: cpu::fill(out(0), 0.0f, v[0]); break;
    case O::Iota: {
      int32_t* o = i32(ins.outputs()->Get(0));
      for (int64_t i = 0; i < v[0]; ++i) o[i] = int32_t(i);
      break;
    }
    case O::LayerNorm:
      cpu::layernorm_fwd(out(0), out(1), out(2), in(0), in(1), in(2), v[0], v[1], ins.floats()->Get(0));
      break;
    case O::LayerNormGrad:
      cpu::layernorm_bwd(out(0), out(1), out(2), in(0), in(1), in(2), in(3), in(4), v[0], v[1]);
      break;
    case O::Attention: cpu::attention_fwd(out(0), out(1), in(0), v[0], v[1], v[2], v[3]); break;
    case O::DecodeAttention: {  // B, C, H, S, M; the cache (fp32 by Module::verify) is written in place
      const int64_t p = *iin(2);
      if (p < 0 || p >= v[3]) throw Error(module_.source() + ": decode attention: position " + std::to_string(p) + " is not in [0, " + std::to_string(v[3]) + ")");
      cpu::decode_attention(out(0), in(1), in(0), p, v[0], v[1], v[2], v[3], v[4]);
      break;
    }
    case O::AttentionGrad:
      cpu::attention_bwd(out(0), in(0), in(1), in(2), in(3), v[0], v[1], v[2], v[3]);
      break;
    case O::CrossEntropy:
      check_ids(module_.source(), ins, iin(1), v[0], v[2]);
      cpu::cross_entropy_fwd(out(0), out(1), in(0), iin(1), v[0], v[1], v[2]);
      break;
    case O::CrossEntropyGrad:
      check_ids(module_.source(), ins, iin(3), v[0], v[2]);
      cpu::cross_entropy_bwd(out(0), in(0), in(1), in(2), iin(3), v[0], v[1], v[2]);
      break;
    case O::AccumulateGrad: cpu::accumulate(out(0), in(0), v[0]); break;
    case O::GlobalNorm: {
      double sum = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        auto s = slice_by_buffer_.find(ins.inputs()->Get(i));  // data-parallel hook (ZeRO-1)
        if (s == slice_by_buffer_.end()) sum += cpu::sum_squares(in(i), v[i]);
        else sum += cpu::sum_squares(in(i) + s->second.first, s->second.second - s->second.first);
      }
      if (norm_reducer_) sum = norm_reducer_(sum);  // data-parallel hook (ZeRO-1)
      *out(0) = float(std::sqrt(sum));
      break;
    }
    case O::ClipCoef: {
      // coef = max_norm / (norm + 1e-6), applied only when it shrinks the gradients.
      const float norm = *in(0), max_norm = *in(1);
      float coef = 1.0f;
      if (max_norm > 0.0f) coef = std::min(1.0f, max_norm / (norm + 1e-6f));
      *out(0) = coef;
      break;
    }
    case O::AdamW: {
      int64_t b = 0, n = v[0];  // data-parallel hook (ZeRO-1): only this rank's slice
      auto s = slice_by_buffer_.find(ins.outputs()->Get(0));
      if (s != slice_by_buffer_.end()) b = s->second.first, n = s->second.second - s->second.first;
      cpu::adamw(out(0) + b, in(0) + b, out(1) + b, out(2) + b, n, *in(1), *in(2), *in(3), *in(4), *in(5),
                 v[1] ? *in(6) : 0.0f, int64_t(*in(7)));
      if (ins.outputs()->size() == 4)  // refresh the bf16 compute copy from the new master value
        cpu::copy(out(3), out(0), v[0]);
      break;
    }
    case O::Cast: cpu::copy(out(0), in(0), v[0]); break;  // the rounding happens in flush_outputs
    case O::ReduceGradients:
      if (reduce_hook_) reduce_hook_(v[0]);
      break;
    case O::WaitGradients:
      if (wait_hook_) wait_hook_();
      break;
    case O::Kernel: break;  // run_generated
  }
}

}  // namespace kiln
