// End-to-end check of a cuda module on the runtime's device executor without a GPU.
//
//   driver CPU.kiln CUDA.kiln [--steps N] [--seed S] [--verbose]
//
// CPU.kiln and CUDA.kiln are the same spec compiled for target = "cpu" and "cuda". The cpu module
// runs on the CPU executor; the cuda module runs on kiln::Executor's GPU path (runtime/device:
// operand tables, cuBLASLt plans, launches, the gradient norm, CUDA graphs from the second run,
// the host copy of the state) over the CUDA emulation (emulated_device.h: the generated kernels
// compiled over shim.h, cuBLASLt's products and epilogues as loops). Both start from the same
// parameters (seeded, then perturbed so that no bias or LayerNorm weight is trivially 0 or 1)
// and the same tokens; after each micro_step and optimizer_step every state buffer (gradients,
// parameters, AdamW moments, compute copies) and the program's result are compared by name; the
// optimizer step also from the same gradients, comparing each parameter's and moment's change.
// The activations are filled with NaN bytes before every program (KILN_CUDA_POISON=1), so a
// kernel that reads what no kernel wrote shows. Exit status 0 when everything is within tolerance.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "emulated_device.h"
#include "runtime/cpu/bf16.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/module.h"
#include "runtime/params.h"

using namespace kiln;
using O = fb::OpCode;

namespace {

// A typed view of an operand.
struct View {
  void* p = nullptr;
  fb::DType t = fb::DType::F32;
  float get(int64_t i) const {
    switch (t) {
      case fb::DType::F32: return static_cast<const float*>(p)[i];
      case fb::DType::BF16: return cpu::from_bf16(static_cast<const uint16_t*>(p)[i]);
      default: return float(static_cast<const int32_t*>(p)[i]);
    }
  }
  void set(int64_t i, float v) const {
    switch (t) {
      case fb::DType::F32: static_cast<float*>(p)[i] = v; break;
      case fb::DType::BF16: static_cast<uint16_t*>(p)[i] = cpu::to_bf16(v); break;
      default: static_cast<int32_t*>(p)[i] = int32_t(v);
    }
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
  double most_flips = 0;  // the largest share of elements let through by the slack
  std::string most_flips_name;
};

// max |emu - ref| / max |ref| over a buffer; any non-finite emulated element fails. With slack > 0
// (parameters after AdamW), up to 1% of the elements may instead be off by at most slack: AdamW
// moves a parameter by about lr * sign(g) whatever |g|, so a gradient that is 0 up to rounding
// (bf16, or summation order) may move it the other way; flip_share sets how many.
void compare(Result& r, const std::string& what, View emu, View ref, int64_t n, double tol, bool verbose,
             double slack = 0, double flip_share = 0.01) {
  double mag = 0;
  for (int64_t i = 0; i < n; i++) mag = std::max(mag, std::fabs(double(ref.get(i))));
  const double scale = mag > 1e-30 ? mag : 1.0;
  double err = 0, err_all = 0;
  int64_t bad = 0, at = -1, at_all = -1, flips = 0;
  for (int64_t i = 0; i < n; i++) {
    const double a = emu.get(i), b = ref.get(i), d = std::fabs(a - b);
    if (!std::isfinite(a) && std::isfinite(b)) { bad++; continue; }
    if (d > err_all) err_all = d, at_all = i;
    if (slack > 0 && d > tol * scale && d <= slack) { flips++; continue; }
    if (d > err) err = d, at = i;
  }
  const bool few_flips = flips <= std::max<int64_t>(1, int64_t(double(n) * flip_share));
  if (!few_flips) err = err_all, at = at_all;  // too many to be flips: report them as errors
  const double rel = err / scale;
  const bool ok = bad == 0 && rel <= tol && few_flips;
  r.checked++;
  if (!ok) r.failed++;
  if (rel > r.worst) r.worst = rel, r.worst_name = what;
  if (double(flips) / double(n) > r.most_flips) r.most_flips = double(flips) / double(n), r.most_flips_name = what;
  if (!ok || verbose)
    std::printf("  %-4s %-44s n=%-7lld max|err| %-10.3g at %-6lld max|ref| %-9.3g rel %-10.3g non-finite %lld%s\n",
                ok ? "ok" : "FAIL", what.c_str(), (long long)n, err, (long long)at, mag, rel, (long long)bad,
                flips ? (" lr-flips " + std::to_string(flips)).c_str() : "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CPU.kiln CUDA.kiln [--steps N] [--seed S] [--verbose]\n", argv[0]);
    return 2;
  }
  int steps = 2;
  uint64_t seed = 1;
  bool verbose = false;
  for (int i = 3; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--verbose") verbose = true;
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  try {
    set_device_factory(make_emulated_device, /*host_addressable=*/true);
    setenv("KILN_CUDA_POISON", "1", 0);  // NaN activations before every program (device_executor.h)
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

    Executor gpu(cuda_m, {"micro_step", "optimizer_step"});
    std::printf("device: %s\n", gpu.device_name().c_str());
    // The host copy of the state region, by name: parameters, moments, gradients, inputs, hypers,
    // compute copies; refresh_compute_copies uploads it.
    auto copy_state = [&] {
      int copied = 0;
      for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
        const fb::Buffer& b = cuda_m.buffer(i);
        if (b.kind() == fb::BufferKind::Activation) continue;
        const int j = find(cpu_m, b.kind(), b.name()->str());
        if (j < 0) throw Error("the cpu module has no " + std::string(fb::EnumNameBufferKind(b.kind())) + " " + b.name()->str());
        const fb::Buffer& cb = cpu_m.buffer(uint32_t(j));
        if (cb.size() != b.size() || cb.dtype() != b.dtype()) throw Error("buffer " + b.name()->str() + " differs between the modules");
        std::memcpy(gpu.f32(i), cpu.f32(uint32_t(j)), b.size());
        copied++;
      }
      gpu.refresh_compute_copies();
      return copied;
    };
    std::printf("copied %d state buffers\n", copy_state());

    auto set_hyper = [&](const std::string& name, float v) {
      cpu.set_hyper(name, v);
      gpu.set_hyper(name, v);
    };
    const float lr = 1e-3f;
    auto compare_state = [&](Result& r, bool grads_only) {
      gpu.sync_to_host();
      for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
        const fb::Buffer& b = cuda_m.buffer(i);
        const bool grad = b.kind() == fb::BufferKind::Gradient;
        const bool state = grad || b.kind() == fb::BufferKind::Parameter || b.kind() == fb::BufferKind::AdamM ||
                           b.kind() == fb::BufferKind::AdamV || b.kind() == fb::BufferKind::ComputeCopy;
        if (!state || (grads_only && !grad)) continue;
        const int j = find(cpu_m, b.kind(), b.name()->str());
        const bool value = b.kind() == fb::BufferKind::Parameter || b.kind() == fb::BufferKind::ComputeCopy;
        // AdamW's second moment holds squared gradients (after one step (1 - beta2) g^2): twice
        // their relative error.
        const double buffer_tol = b.kind() == fb::BufferKind::AdamV ? 2 * tol : tol;
        compare(r, std::string(fb::EnumNameBufferKind(b.kind())) + " " + b.name()->str(), View{gpu.f32(i), b.dtype()},
                View{cpu.f32(uint32_t(j)), b.dtype()}, numel(b), buffer_tol, verbose, value ? 2.5 * lr : 0.0);
        // A compute copy is its own master value rounded to nearest even, bit for bit (the tolerance
        // above would let a truncating or stale copy through).
        const std::string name = b.name()->str();
        // A bf16 bias gradient is its column total rounded once: where the cpu module's (one
        // micro-step from zero) holds bf16 values only, so must the cuda module's (the tolerance
        // above would let an unrounded total through).
        if (grads_only && grad && name.size() > 10 && name.compare(name.size() - 10, 10, ".bias.grad") == 0) {
          const float* c = cpu.f32(uint32_t(j));
          const float* e = gpu.f32(i);
          bool exact = true, nonzero = false;
          for (int64_t k = 0; k < numel(b) && exact; k++)
            exact = c[k] == cpu::from_bf16(cpu::to_bf16(c[k])), nonzero |= c[k] != 0.0f;
          if (exact && nonzero) {
            int64_t wrong = 0, first = -1;
            for (int64_t k = 0; k < numel(b); k++)
              if (e[k] != cpu::from_bf16(cpu::to_bf16(e[k])) && wrong++ == 0) first = k;
            r.checked++;
            if (wrong) {
              r.failed++;
              std::printf("  FAIL %-44s %lld elements not bf16 values, as the cpu module's are (first at %lld)\n",
                          ("bf16 bias gradient " + name).c_str(), (long long)wrong, (long long)first);
            }
          }
        }
        const int m = b.kind() == fb::BufferKind::ComputeCopy && name.size() > 5
                          ? find(cuda_m, fb::BufferKind::Parameter, name.substr(0, name.size() - 5)) : -1;
        if (m >= 0) {
          const float* master = gpu.f32(uint32_t(m));
          const uint16_t* copy = reinterpret_cast<const uint16_t*>(gpu.f32(i));
          int64_t wrong = 0, first = -1;
          for (int64_t k = 0; k < numel(b); k++)
            if (copy[k] != cpu::to_bf16(master[k]) && wrong++ == 0) first = k;
          r.checked++;
          if (wrong) {
            r.failed++;
            std::printf("  FAIL %-44s %lld elements not their master rounded to bf16 (first at %lld)\n",
                        ("ComputeCopy rounding " + name).c_str(), (long long)wrong, (long long)first);
          }
        }
      }
    };
    auto scalar = [&](Result& r, const std::string& what, float e, float c, double t) {
      float ev = e, cv = c;
      compare(r, what, View{&ev, fb::DType::F32}, View{&cv, fb::DType::F32}, 1, t, true);
    };

    // The parameters and moments (by cuda buffer index) before an optimizer step, on each side.
    auto is_adam_state = [&](const fb::Buffer& b) {
      return b.kind() == fb::BufferKind::Parameter || b.kind() == fb::BufferKind::AdamM || b.kind() == fb::BufferKind::AdamV;
    };
    std::map<uint32_t, std::vector<float>> before_e, before_c;
    auto snapshot = [&] {
      gpu.sync_to_host();
      for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
        const fb::Buffer& b = cuda_m.buffer(i);
        if (!is_adam_state(b)) continue;
        const uint32_t j = uint32_t(find(cpu_m, b.kind(), b.name()->str()));
        const View e{gpu.f32(i), b.dtype()}, c{cpu.f32(j), b.dtype()};
        auto& be = before_e[i] = std::vector<float>(size_t(numel(b)));
        auto& bc = before_c[i] = std::vector<float>(size_t(numel(b)));
        for (int64_t k = 0; k < numel(b); k++) be[size_t(k)] = e.get(k), bc[size_t(k)] = c.get(k);
      }
    };
    // Each parameter's and moment's change over the optimizer step, relative to the largest change
    // of that buffer: the value comparison is relative to max |value|, where a wrong weight decay
    // (lr * wd * |p|, 1e-4 |p|) or a bias correction that shrinks the update hides. Both sides
    // start from the same state and gradients, so the changes agree to rounding (1.5e-5 of the
    // largest in every config of run.sh, fp32 and bf16, and no element off by more); one element per
    // tensor whose moment is 0 up to rounding may still move the other way (slack as above).
    const double utol = 1e-3;
    auto compare_updates = [&](Result& r) {
      for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
        const fb::Buffer& b = cuda_m.buffer(i);
        if (!is_adam_state(b)) continue;
        const uint32_t j = uint32_t(find(cpu_m, b.kind(), b.name()->str()));
        const View e{gpu.f32(i), b.dtype()}, c{cpu.f32(j), b.dtype()};
        const int64_t n = numel(b);
        std::vector<float> de(static_cast<size_t>(n)), dc(static_cast<size_t>(n));
        for (int64_t k = 0; k < n; k++)
          de[size_t(k)] = float(double(e.get(k)) - before_e[i][size_t(k)]),
          dc[size_t(k)] = float(double(c.get(k)) - before_c[i][size_t(k)]);
        const bool value = b.kind() == fb::BufferKind::Parameter;
        compare(r, "change of " + std::string(fb::EnumNameBufferKind(b.kind())) + " " + b.name()->str(),
                View{de.data(), fb::DType::F32}, View{dc.data(), fb::DType::F32}, n, utol, verbose,
                value ? 2.5 * lr : 0.0, 0.0);
      }
    };

    // Runs a program on both, then compares its result and the state (gradients only, or all).
    auto compare_program = [&](int step, const char* program, const char* result, bool grads_only,
                               bool same_grads = false) {
      if (!grads_only) snapshot();
      const float c = cpu.run(program), e = gpu.run(program);
      Result r;
      std::printf("step %d %s: %s cpu %.7g emulated cuda %.7g\n", step, program, result, c, e);
      scalar(r, result, e, c, tol);
      compare_state(r, grads_only);
      // The cuda module's global norm against its gradient buffers, summed here in double: the
      // comparison with the cpu module has the bf16 tolerance, which a norm kernel that drops or
      // reads a stale partial sum passes.
      if (!grads_only) {
        double ss = 0;
        for (uint32_t i = 0; i < cuda_m.fb().buffers()->size(); i++) {
          const fb::Buffer& b = cuda_m.buffer(i);
          if (b.kind() != fb::BufferKind::Gradient) continue;
          const View g{gpu.f32(i), b.dtype()};
          for (int64_t k = 0; k < numel(b); k++) ss += double(g.get(k)) * double(g.get(k));
        }
        scalar(r, "grad_norm of the cuda gradients", e, float(std::sqrt(ss)), 1e-5);
      }
      if (same_grads) {
        Result u;
        compare_updates(u);
        std::printf("  %s changes: %d buffers, %d failed, worst rel %.3g (%s), tolerance %.3g; most flips %.3g%% (%s)\n",
                    program, u.checked, u.failed, u.worst, u.worst_name.c_str(), utol, 100 * u.most_flips,
                    u.most_flips_name.c_str());
        r.checked += u.checked, r.failed += u.failed;
      }
      std::printf("  %s: %d buffers, %d failed, worst rel %.3g (%s)\n", program, r.checked, r.failed, r.worst,
                  r.worst_name.c_str());
      return r;
    };
    Result total;
    for (int s = 1; s <= steps; s++) {
      cpu.zero_grads();
      gpu.zero_grads();
      const Result r = compare_program(s, "micro_step", "loss", true);
      set_hyper("lr", lr);
      set_hyper("step", float(s));
      // Step 1's optimizer step reads the cuda module's own gradients (errors in many small ones
      // move AdamW's early, sign-like updates by about lr); later ones start from the cpu module's
      // gradients too, so that the two steps' changes agree to rounding (compare_updates).
      const bool same_grads = s > 1;
      if (same_grads) copy_state();
      const Result q = compare_program(s, "optimizer_step", "grad_norm", false, same_grads);
      for (const Result* x : {&r, &q}) {
        total.checked += x->checked, total.failed += x->failed;
        if (x->worst > total.worst) total.worst = x->worst, total.worst_name = x->worst_name;
      }
      // Continue from the reference state, so that an error does not compound over steps (the
      // uploads happen outside the graphs, which replay from step 2 on).
      copy_state();
    }
    std::printf("%s: %d comparisons, %d failed, worst rel %.3g (%s), tolerance %.3g\n",
                total.failed ? "FAIL" : "PASS", total.checked, total.failed, total.worst, total.worst_name.c_str(), tol);
    return total.failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
