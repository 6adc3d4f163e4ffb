// End-to-end check of a cuda module's generated kernels without a GPU.
//
//   driver CPU.kiln CUDA.kiln KERNELS.so [--steps N] [--seed S] [--zero-activations] [--verbose]
//
// CPU.kiln and CUDA.kiln are the same spec compiled for target = "cpu" and "cuda"; KERNELS.so is
// the cuda module's kernels.cu compiled over shim.h (kernels_tu.cpp). The cpu module runs on the
// normal runtime (kiln::Executor). The cuda module runs here, instruction by instruction, on a
// host arena: a Kernel instruction clears its zero_operands, runs its cuBLASLt call (MatmulCall,
// emulated by a loop below) and launches its generated functions in order through the emulator
// (kemu_launch); GlobalNorm is computed on the host; ReduceGradients/WaitGradients do nothing.
// Both start from the same parameters (seeded, then perturbed so that no bias or LayerNorm
// weight is trivially 0 or 1) and the same tokens; after each micro_step and optimizer_step every
// state buffer (gradients, parameters, AdamW moments, compute copies) and the program's result
// are compared by name. Activations of the cuda arena are filled with NaN before every program,
// so a kernel that reads what nobody wrote (or accumulates into an uncleared buffer) shows.
// Exit status 0 when everything is within tolerance.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/module.h"
#include "runtime/params.h"

using namespace kiln;
using O = fb::OpCode;

namespace {

typedef void (*KernelFn)(void* const*, const long long*);
typedef void (*LaunchFn)(KernelFn, const char*, unsigned, unsigned, void* const*, const long long*);
typedef void (*StatsFn)(long long*);

float bf2f(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float gelu(float u) { return 0.5f * u * (1.0f + std::tanh(0.7978845608028654f * (u + 0.044715f * u * u * u))); }
float gelu_grad(float dy, float u) {
  const float th = std::tanh(0.7978845608028654f * (u + 0.044715f * u * u * u));
  return (0.5f * (1.0f + th) +
          0.5f * u * (1.0f - th * th) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * u * u)) *
         dy;
}

// A typed view of an operand.
struct View {
  void* p = nullptr;
  fb::DType t = fb::DType::F32;
  float get(int64_t i) const {
    switch (t) {
      case fb::DType::F32: return static_cast<const float*>(p)[i];
      case fb::DType::BF16: return bf2f(static_cast<const uint16_t*>(p)[i]);
      default: return float(static_cast<const int32_t*>(p)[i]);
    }
  }
  void set(int64_t i, float v) const {
    switch (t) {
      case fb::DType::F32: static_cast<float*>(p)[i] = v; break;
      case fb::DType::BF16: static_cast<uint16_t*>(p)[i] = f2bf(v); break;
      default: static_cast<int32_t*>(p)[i] = int32_t(v);
    }
  }
};

// The cuda module, run on a host arena with the emulated kernels.
struct Emulator {
  const Module& m;
  uint8_t* arena = nullptr;
  void* lib = nullptr;
  LaunchFn launch = nullptr;
  std::vector<std::vector<KernelFn>> fns;  // by kernel, by cuda function
  bool zero_activations = false;
  bool verbose = false;
  std::map<std::string, int> matmul_epilogues;

  Emulator(const Module& mod, const std::string& so) : m(mod) {
    arena = static_cast<uint8_t*>(std::aligned_alloc(4096, (m.fb().arena_size() + 4095) / 4096 * 4096));
    std::memset(arena, 0, m.fb().arena_size());
    lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw Error("cannot load " + so + ": " + dlerror());
    launch = reinterpret_cast<LaunchFn>(dlsym(lib, "kemu_launch"));
    if (!launch) throw Error(so + " lacks kemu_launch");
    if (m.fb().kernels())
      for (const fb::Kernel* k : *m.fb().kernels()) {
        fns.emplace_back();
        if (k->cuda_functions())
          for (const fb::CudaFunction* f : *k->cuda_functions()) {
            void* fn = dlsym(lib, f->symbol()->c_str());
            if (!fn) throw Error(so + " lacks generated function " + f->symbol()->str());
            fns.back().push_back(reinterpret_cast<KernelFn>(fn));
          }
        if (!k->has_function() && k->cuda_functions() && k->cuda_functions()->size())
          std::printf("WARNING: kernel %s: has_function = false, but it has %u cuda functions (launched anyway)\n",
                      k->symbol()->c_str(), k->cuda_functions()->size());
        if (!k->matmul() && (!k->cuda_functions() || k->cuda_functions()->size() == 0))
          throw Error(k->symbol()->str() + ": neither a library call nor a generated function");
      }
  }
  ~Emulator() { std::free(arena); }

  uint8_t* at(uint32_t b) { return arena + m.buffer(b).offset(); }

  void matmul(const fb::Kernel& k, const std::vector<void*>& args) {
    const fb::MatmulCall& c = *k.matmul();
    auto view = [&](int i) {
      View v;
      if (i < 0) return v;
      if (size_t(i) >= args.size()) throw Error(k.symbol()->str() + ": matmul operand out of range");
      v.p = args[size_t(i)];
      v.t = static_cast<fb::DType>(k.operand_dtype()->Get(uint32_t(i)));
      return v;
    };
    const View A = view(c.a()), B = view(c.b()), bias = view(c.bias()), aux = view(c.aux()), C = view(c.c()),
               D = view(c.d());
    const std::string epi = c.epilogue() ? c.epilogue()->str() : "DEFAULT";
    matmul_epilogues[epi]++;
    const bool has_bias = epi == "BIAS" || epi == "GELU_BIAS" || epi == "GELU_AUX_BIAS";
    const bool has_gelu = epi == "GELU" || epi == "GELU_AUX" || epi == "GELU_BIAS" || epi == "GELU_AUX_BIAS";
    const bool aux_out = epi == "GELU_AUX" || epi == "GELU_AUX_BIAS", dgelu = epi == "DGELU";
    if (!A.p || !B.p || !D.p) throw Error(k.symbol()->str() + ": matmul without A, B or D");
    if (has_bias != (bias.p != nullptr)) throw Error(k.symbol()->str() + ": epilogue " + epi + " and bias operand disagree");
    if ((aux_out || dgelu) != (aux.p != nullptr)) throw Error(k.symbol()->str() + ": epilogue " + epi + " and aux operand disagree");
    if ((c.beta() != 0.0f) != (C.p != nullptr)) throw Error(k.symbol()->str() + ": beta and C disagree");
    const int64_t M = c.m(), N = c.n(), K = c.k();
    // Operand sizes against what the call reads and writes.
    auto need = [&](int i, int64_t n, const char* what) {
      if (i >= 0 && k.operand_numel()->Get(uint32_t(i)) < n)
        throw Error(k.symbol()->str() + ": matmul " + what + " operand holds " +
                    std::to_string(k.operand_numel()->Get(uint32_t(i))) + " elements, needs " + std::to_string(n));
    };
    need(c.a(), M * K, "A"), need(c.b(), K * N, "B"), need(c.d(), M * N, "D"), need(c.c(), M * N, "C");
    need(c.aux(), M * N, "aux"), need(c.bias(), N, "bias");
    std::vector<float> out(size_t(M * N));
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double acc = 0;
        for (int64_t p = 0; p < K; p++)
          acc += double(A.get(c.trans_a() ? p * M + i : i * K + p)) * double(B.get(c.trans_b() ? j * K + p : p * N + j));
        float x = float(acc);
        if (C.p) x += c.beta() * C.get(i * N + j);
        if (has_bias) x += bias.get(j);
        if (aux_out) aux.set(i * N + j, x);
        if (has_gelu) x = gelu(x);
        if (dgelu) x = gelu_grad(x, aux.get(i * N + j));
        out[size_t(i * N + j)] = x;
      }
    for (int64_t i = 0; i < M * N; i++) D.set(i, out[size_t(i)]);
  }

  void run_kernel(const fb::Instr& ins) {
    const uint32_t ki = uint32_t(ins.ints()->Get(0));
    const fb::Kernel& k = *m.fb().kernels()->Get(ki);
    std::vector<void*> args;
    std::vector<uint32_t> bufs;
    for (uint32_t b : *ins.inputs()) bufs.push_back(b);
    for (uint32_t b : *ins.outputs()) bufs.push_back(b);
    if (bufs.size() != k.operand_numel()->size())
      throw Error(k.symbol()->str() + ": instruction has " + std::to_string(bufs.size()) + " operands, kernel " +
                  std::to_string(k.operand_numel()->size()));
    for (size_t i = 0; i < bufs.size(); i++) {
      const fb::Buffer& b = m.buffer(bufs[i]);
      if (b.dtype() != static_cast<fb::DType>(k.operand_dtype()->Get(uint32_t(i))) ||
          numel(b) < k.operand_numel()->Get(uint32_t(i)))
        throw Error(k.symbol()->str() + ": operand " + std::to_string(i) + " does not fit buffer " + b.name()->str());
      args.push_back(at(bufs[i]));
    }
    std::vector<long long> ranges;
    if (k.adamw_params())
      for (uint32_t v : *k.adamw_params()) ranges.insert(ranges.end(), {0LL, (long long)numel(m.buffer(v))});
    if (k.zero_operands())
      for (uint32_t z : *k.zero_operands()) {
        if (z >= bufs.size()) throw Error(k.symbol()->str() + ": zero operand out of range");
        std::memset(args[z], 0,
                    size_t(k.operand_numel()->Get(z)) *
                        dtype_bytes(static_cast<fb::DType>(k.operand_dtype()->Get(z))));
      }
    if (k.matmul()) matmul(k, args);
    for (size_t f = 0; f < fns[ki].size(); f++) {
      const fb::CudaFunction& cf = *k.cuda_functions()->Get(uint32_t(f));
      if (verbose) std::fprintf(stderr, "  launch %s <<<%u, %u>>>\n", cf.symbol()->c_str(), cf.grid(), cf.block());
      launch(fns[ki][f], cf.symbol()->c_str(), cf.grid(), cf.block(), args.data(), ranges.data());
    }
  }

  float run(const std::string& name) {
    const fb::Program* prog = m.program(name);
    if (!prog) throw Error("the cuda module has no program " + name);
    // Activations: garbage (NaN) unless a kernel writes them.
    std::memset(arena + m.fb().state_size(), zero_activations ? 0 : 0xff, m.fb().arena_size() - m.fb().state_size());
    for (const fb::Instr* ins : *prog->instrs()) {
      switch (ins->op()) {
        case O::Kernel: run_kernel(*ins); break;
        case O::GlobalNorm: {
          double s = 0;
          for (uint32_t i = 0; i < ins->inputs()->size(); i++) {
            const uint32_t b = ins->inputs()->Get(i);
            const int64_t n = ins->ints()->Get(i);
            View v{at(b), m.buffer(b).dtype()};
            for (int64_t e = 0; e < n; e++) s += double(v.get(e)) * double(v.get(e));
          }
          View o{at(ins->outputs()->Get(0)), m.buffer(ins->outputs()->Get(0)).dtype()};
          o.set(0, float(std::sqrt(s)));
          break;
        }
        case O::ReduceGradients:
        case O::WaitGradients: break;
        default:
          throw Error("program " + name + ": the cuda module has a " + fb::EnumNameOpCode(ins->op()) +
                      " instruction, which the emulator does not run");
      }
    }
    return View{at(prog->result()), m.buffer(prog->result()).dtype()}.get(0);
  }
};

int find(const Module& m, fb::BufferKind kind, const std::string& name) {
  for (uint32_t i = 0; i < m.fb().buffers()->size(); i++)
    if (m.buffer(i).kind() == kind && m.buffer(i).name() && m.buffer(i).name()->str() == name) return int(i);
  return -1;
}

struct Result {
  int checked = 0, failed = 0;
  double worst = 0;
  std::string worst_name;
};

// max |emu - ref| / max |ref| over a buffer; any non-finite emulated element fails. With slack > 0
// (parameters after AdamW), up to 1% of the elements may instead be off by at most slack: AdamW
// moves a parameter by about lr * sign(g) whatever |g|, so a gradient that is 0 up to rounding
// (bf16, or summation order) may move it the other way.
void compare(Result& r, const std::string& what, View emu, View ref, int64_t n, double tol, bool verbose,
             double slack = 0) {
  double mag = 0;
  for (int64_t i = 0; i < n; i++) mag = std::max(mag, std::fabs(double(ref.get(i))));
  const double scale = mag > 1e-30 ? mag : 1.0;
  double err = 0;
  int64_t bad = 0, at = -1, flips = 0;
  for (int64_t i = 0; i < n; i++) {
    const double a = emu.get(i), b = ref.get(i), d = std::fabs(a - b);
    if (!std::isfinite(a) && std::isfinite(b)) { bad++; continue; }
    if (slack > 0 && d > tol * scale && d <= slack) { flips++; continue; }
    if (d > err) err = d, at = i;
  }
  const double rel = err / scale;
  const bool ok = bad == 0 && rel <= tol && flips <= std::max<int64_t>(1, n / 100);
  r.checked++;
  if (!ok) r.failed++;
  if (rel > r.worst) r.worst = rel, r.worst_name = what;
  if (!ok || verbose)
    std::printf("  %-4s %-44s n=%-7lld max|err| %-10.3g at %-6lld max|ref| %-9.3g rel %-10.3g non-finite %lld%s\n",
                ok ? "ok" : "FAIL", what.c_str(), (long long)n, err, (long long)at, mag, rel, (long long)bad,
                flips ? (" lr-flips " + std::to_string(flips)).c_str() : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s CPU.kiln CUDA.kiln KERNELS.so [--steps N] [--seed S] [--zero-activations] [--verbose]\n", argv[0]);
    return 2;
  }
  int steps = 2;
  uint64_t seed = 1;
  bool zero_act = false, verbose = false;
  for (int i = 4; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--zero-activations") zero_act = true;
    else if (a == "--verbose") verbose = true;
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  try {
    Module cpu_m = Module::load(argv[1]);
    Module cuda_m = Module::load(argv[2]);
    const bool bf16 = cuda_m.fb().model()->precision()->str() == "bf16";
    const double tol = bf16 ? 3e-2 : 2e-4;
    std::printf("cpu module %s, cuda module %s (%s, %u kernels)\n", argv[1], argv[2],
                cuda_m.fb().model()->precision()->c_str(), cuda_m.fb().kernels() ? cuda_m.fb().kernels()->size() : 0);
    if (cuda_m.fb().model()->target()->str() != "cuda") throw Error(std::string(argv[2]) + " is not a cuda module");

    Executor cpu(cpu_m, {"micro_step", "optimizer_step"});
    init_parameters(cpu, seed);
    // Perturb every parameter so that biases and LayerNorm weights are not 0 and 1; padded
    // vocabulary rows of wte stay 0.
    std::mt19937_64 rng(seed + 17);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const fb::Parameter* p : *cpu_m.fb().parameters()) {
      float* w = cpu.f32(p->value());
      const int64_t n = numel(cpu_m.buffer(p->value()));
      const bool wte = p->name()->str() == "wte.weight";
      const int64_t used = wte ? int64_t(cpu_m.fb().model()->vocab_size()) * cpu_m.fb().model()->n_embd() : n;
      for (int64_t i = 0; i < used; i++) w[i] += (p->init() == fb::Init::Normal ? 0.02f : 0.1f) * nd(rng);
    }
    cpu.refresh_compute_copies();
    const int V = cpu_m.fb().model()->vocab_size();
    std::uniform_int_distribution<int> tok(0, V - 1);
    const int64_t ntok = int64_t(cpu_m.fb().model()->batch_size()) * cpu_m.fb().model()->seq_len();
    for (int64_t i = 0; i < ntok; i++) cpu.input("idx")[i] = tok(rng), cpu.input("targets")[i] = tok(rng);
    const std::map<std::string, float> hypers = {{"beta1", 0.9f}, {"beta2", 0.95f}, {"eps", 1e-8f},
                                                 {"weight_decay", 0.1f}, {"max_norm", 1.0f}, {"loss_weight", 1.0f},
                                                 {"lr", 1e-3f}, {"step", 1.0f}};
    for (auto& [k, v] : hypers) cpu.set_hyper(k, v);

    Emulator emu(cuda_m, argv[3]);
    emu.zero_activations = zero_act;
    // Copy the whole state region by name: parameters, moments, gradients, inputs, hypers, copies.
    int copied = 0;
    for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
      const fb::Buffer& b = cuda_m.buffer(i);
      if (b.kind() == fb::BufferKind::Activation) continue;
      const int j = find(cpu_m, b.kind(), b.name()->str());
      if (j < 0) throw Error("the cpu module has no " + std::string(fb::EnumNameBufferKind(b.kind())) + " " + b.name()->str());
      const fb::Buffer& cb = cpu_m.buffer(uint32_t(j));
      if (cb.size() != b.size() || cb.dtype() != b.dtype()) throw Error("buffer " + b.name()->str() + " differs between the modules");
      std::memcpy(emu.at(i), reinterpret_cast<uint8_t*>(cpu.f32(uint32_t(j))), b.size());
      copied++;
    }
    std::printf("copied %d state buffers\n", copied);

    auto set_hyper = [&](const std::string& name, float v) {
      cpu.set_hyper(name, v);
      const int b = find(cuda_m, fb::BufferKind::Hyper, name);
      if (b >= 0) *reinterpret_cast<float*>(emu.at(uint32_t(b))) = v;
    };
    const float lr = 1e-3f;
    auto compare_state = [&](Result& r, bool grads_only) {
      for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
        const fb::Buffer& b = cuda_m.buffer(i);
        const bool grad = b.kind() == fb::BufferKind::Gradient;
        const bool state = grad || b.kind() == fb::BufferKind::Parameter || b.kind() == fb::BufferKind::AdamM ||
                           b.kind() == fb::BufferKind::AdamV || b.kind() == fb::BufferKind::ComputeCopy;
        if (!state || (grads_only && !grad)) continue;
        const int j = find(cpu_m, b.kind(), b.name()->str());
        const bool value = b.kind() == fb::BufferKind::Parameter || b.kind() == fb::BufferKind::ComputeCopy;
        compare(r, std::string(fb::EnumNameBufferKind(b.kind())) + " " + b.name()->str(), View{emu.at(i), b.dtype()},
                View{cpu.f32(uint32_t(j)), b.dtype()}, numel(b), tol, verbose, value ? 2.5 * lr : 0.0);
      }
    };
    auto scalar = [&](Result& r, const std::string& what, float e, float c) {
      float ev = e, cv = c;
      compare(r, what, View{&ev, fb::DType::F32}, View{&cv, fb::DType::F32}, 1, tol, true);
    };

    Result total;
    for (int s = 1; s <= steps; s++) {
      cpu.zero_grads();
      for (const fb::Parameter* p : *cuda_m.fb().parameters())
        std::memset(emu.at(p->grad()), 0, cuda_m.buffer(p->grad()).size());
      const float cl = cpu.run("micro_step");
      const float el = emu.run("micro_step");
      Result r;
      std::printf("step %d micro_step: loss cpu %.7g emulated cuda %.7g\n", s, cl, el);
      scalar(r, "loss", el, cl);
      compare_state(r, true);
      std::printf("  micro_step: %d buffers, %d failed, worst rel %.3g (%s)\n", r.checked, r.failed, r.worst,
                  r.worst_name.c_str());
      set_hyper("lr", lr);
      set_hyper("step", float(s));
      const float cn = cpu.run("optimizer_step");
      const float en = emu.run("optimizer_step");
      Result q;
      std::printf("step %d optimizer_step: grad norm cpu %.7g emulated cuda %.7g\n", s, cn, en);
      scalar(q, "grad_norm", en, cn);
      compare_state(q, false);
      std::printf("  optimizer_step: %d buffers, %d failed, worst rel %.3g (%s)\n", q.checked, q.failed, q.worst,
                  q.worst_name.c_str());
      for (Result* x : {&r, &q}) {
        total.checked += x->checked, total.failed += x->failed;
        if (x->worst > total.worst) total.worst = x->worst, total.worst_name = x->worst_name;
      }
      // Continue from the reference state, so that an error does not compound over steps.
      for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
        const fb::Buffer& b = cuda_m.buffer(i);
        if (b.kind() == fb::BufferKind::Activation) continue;
        std::memcpy(emu.at(i), cpu.f32(uint32_t(find(cpu_m, b.kind(), b.name()->str()))), b.size());
      }
    }
    long long st[6] = {};
    if (auto stats = reinterpret_cast<StatsFn>(dlsym(emu.lib, "kemu_stats"))) stats(st);
    std::printf("emulator: %lld launches, %lld blocks, %lld __syncthreads rounds, %lld warp shuffle rounds\n", st[0],
                st[1], st[2], st[3]);
    std::printf("cuBLASLt calls by epilogue:");
    for (auto& [e, n] : emu.matmul_epilogues) std::printf(" %s x%d", e.c_str(), n);
    std::printf("\n");
    if (st[4] || st[5])
      std::printf("DIAGNOSTIC: %lld shuffle rounds with returned lanes in the warp, %lld divergent __syncthreads rounds\n",
                  st[4], st[5]);
    std::printf("%s: %d comparisons, %d failed, worst rel %.3g (%s), tolerance %.3g\n",
                total.failed ? "FAIL" : "PASS", total.checked, total.failed, total.worst, total.worst_name.c_str(), tol);
    return total.failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
