#include "runtime/params.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "runtime/cpu/kernels.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

// splitmix64: a tiny, portable generator, so a seed gives the same weights everywhere.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

const std::string kPrefix = "transformer.";

}  // namespace

void init_parameters(Executor& ex, uint64_t seed) {
  const auto& params = *ex.module().fb().parameters();
  for (uint32_t i = 0; i < params.size(); ++i) {
    const fb::Parameter* p = params.Get(i);
    const int64_t n = numel(ex.module().buffer(p->value()));
    float* w = ex.f32(p->value());
    switch (p->init()) {
      case fb::Init::Zeros: cpu::fill(w, 0.0f, n); break;
      case fb::Init::Ones: cpu::fill(w, 1.0f, n); break;
      case fb::Init::Normal: {
        // Box-Muller; one stream per parameter so adding a layer leaves the others unchanged.
        Rng rng{seed * 0x100000001B3ull + i};
        for (int64_t k = 0; k < n; k += 2) {
          double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
          double r = std::sqrt(-2.0 * std::log(u1)) * p->init_std();
          w[k] = float(r * std::cos(2 * M_PI * u2));
          if (k + 1 < n) w[k + 1] = float(r * std::sin(2 * M_PI * u2));
        }
        break;
      }
    }
    cpu::fill(ex.f32(p->adam_m()), 0.0f, n);
    cpu::fill(ex.f32(p->adam_v()), 0.0f, n);
  }
  ex.zero_grads();
}

void load_parameters(Executor& ex, const std::string& path) {
  std::map<std::string, SafeTensor> file;
  for (SafeTensor& t : read_safetensors(path)) {
    std::string name = t.name.rfind(kPrefix, 0) == 0 ? t.name.substr(kPrefix.size()) : t.name;
    file[name] = std::move(t);
  }
  std::set<std::string> used;
  for (const fb::Parameter* p : *ex.module().fb().parameters()) {
    const std::string name = p->name()->str();
    auto it = file.find(name);
    if (it == file.end()) throw Error(path + ": missing tensor '" + name + "' (or 'transformer." + name + "')");
    const SafeTensor& t = it->second;
    std::vector<int64_t> want(p->shape()->begin(), p->shape()->end());
    if (t.shape != want) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      throw Error(path + ": tensor '" + t.name + "' has shape " + str(t.shape) + ", the model needs " + str(want));
    }
    std::vector<float> values = to_f32(t);
    std::memcpy(ex.f32(p->value()), values.data(), values.size() * sizeof(float));
    used.insert(name);
  }
  for (const auto& [name, t] : file) {
    if (used.count(name)) continue;
    bool mask = name.size() > 9 && (name.rfind(".attn.bias") == name.size() - 10 ||
                                    name.rfind(".attn.masked_bias") == name.size() - 17);
    if (mask) continue;
    if (name == "lm_head.weight" && file.count("wte.weight")) {
      if (to_f32(t) != to_f32(file.at("wte.weight")))
        throw Error(path + ": lm_head.weight differs from wte.weight; Kiln's GPT-2 ties them");
      continue;
    }
    throw Error(path + ": unexpected tensor '" + t.name + "' (not a parameter of this model)");
  }
}

void save_parameters(Executor& ex, const std::string& path, ParamField field) {
  std::vector<SafeTensor> out;
  for (const fb::Parameter* p : *ex.module().fb().parameters()) {
    uint32_t b = field == ParamField::Value ? p->value() : p->grad();
    SafeTensor t{kPrefix + p->name()->str(), "F32", {p->shape()->begin(), p->shape()->end()}, {}};
    const size_t bytes = size_t(numel(ex.module().buffer(b))) * sizeof(float);
    const auto* src = reinterpret_cast<const uint8_t*>(ex.f32(b));
    t.bytes.assign(src, src + bytes);
    out.push_back(std::move(t));
  }
  write_safetensors(path, out, {{"format", "pt"}});
}

}  // namespace kiln
