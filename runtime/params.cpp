#include "runtime/params.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <map>
#include <set>

#include "runtime/cpu/bf16.h"
#include "runtime/checkpoint.h"
#include "runtime/embedded.h"
#include "runtime/cpu/kernels.h"
#include "runtime/data_loader.h"
#include "runtime/error.h"
#include "runtime/rng.h"
#include "runtime/shape.h"
#include "runtime/file_io.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

const std::string kPrefix = "transformer.";
const char* const kCheckpointKind = "a Kiln checkpoint (train --resume reads it)";

// The rows of a parameter that files hold. The module stores wte.weight as [Vp, C], the
// vocabulary padded to a multiple of 128 (models/gpt2_builder.cpp); files (Hugging Face's and
// ours) hold the real [V, C], and the padded rows V..Vp-1 are zero. Every other parameter is
// stored whole.
int64_t stored_rows(const Module& m, const fb::Parameter& p) {
  const int64_t rows = p.shape()->size() ? p.shape()->Get(0) : 1;
  const int64_t V = m.fb().model()->vocab_size();
  return p.name()->str() == "wte.weight" && p.shape()->size() == 2 && V > 0 && rows > V ? V : rows;
}

// The shape a file holds for the parameter: its own with the padded rows dropped.
std::vector<int64_t> stored_shape(const Module& m, const fb::Parameter& p) {
  std::vector<int64_t> s(p.shape()->begin(), p.shape()->end());
  if (!s.empty()) s[0] = stored_rows(m, p);
  return s;
}

// Values per row (1 for a 0-d parameter).
int64_t row_size(const fb::Parameter& p) {
  int64_t n = 1;
  for (size_t i = 1; i < p.shape()->size(); ++i) n *= p.shape()->Get(uint32_t(i));
  return n;
}

// init_parameters, drawing the normal parameters when `draw`, else setting them to 0.
void fill_parameters(Executor& ex, uint64_t seed, bool draw) {
  const auto& params = *ex.module().fb().parameters();
  for (uint32_t i = 0; i < params.size(); ++i) {
    const fb::Parameter* p = params.Get(i);
    const int64_t n = numel(ex.module().buffer(p->value()));
    // Only the stored rows take the declared init; padded vocabulary rows start (and stay) 0.
    const int64_t used = std::min(n, stored_rows(ex.module(), *p) * row_size(*p));
    float* w = ex.f32(p->value());
    switch (p->init()) {
      case fb::Init::Zeros: cpu::fill(w, 0.0f, used); break;
      case fb::Init::Ones: cpu::fill(w, 1.0f, used); break;
      case fb::Init::Normal: {
        if (!draw) {
          cpu::fill(w, 0.0f, used);
          break;
        }
        // Box-Muller; one stream per parameter so adding a layer leaves the others unchanged.
        Rng rng{seed * 0x100000001B3ull + i};
        for (int64_t k = 0; k < used; k += 2) {
          double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
          double r = std::sqrt(-2.0 * std::log(u1)) * p->init_std();
          w[k] = float(r * std::cos(2 * M_PI * u2));
          if (k + 1 < used) w[k + 1] = float(r * std::sin(2 * M_PI * u2));
        }
        break;
      }
    }
    cpu::fill(w + used, 0.0f, n - used);
    for (uint32_t moment : {p->adam_m(), p->adam_v()})  // ZeRO-1: the slice this rank keeps
      cpu::fill(ex.f32_held(moment), 0.0f, ex.held(moment).second - ex.held(moment).first);
  }
  ex.zero_grads();
}

}  // namespace

void init_parameters(Executor& ex, uint64_t seed) { fill_parameters(ex, seed, true); }
void clear_parameters(Executor& ex) { fill_parameters(ex, 0, false); }

namespace {

// llm.c's model file: 256 int32 header ([0] 20240326, [1] 3 = fp32 or 5 = bf16, [2] maxT,
// [3] V, [4] L, [5] heads, [6] C, [7] padded V), then the tensors in llm.c's order with
// nn.Linear weights stored [out, in] (transposed against Hugging Face's Conv1D [in, out]) and
// every layer's tensor of one kind stacked. The file's wte has its own padded vocabulary (its
// [7], which need not be the module's): its first V rows are read and the module's padded rows
// are set to zero.
constexpr int32_t kLlmcModelMagic = 20240326;  // an llm.c model file's first int32

void load_llmc_bin(Executor& ex, const std::string& path) {
  // The header first, and the size it calls for checked against the file's before the tensors
  // are read: a file of another model (gpt2-xl's 6 GB for a small one) is refused at once.
  const RegularFile file(path, "weights' file");
  const uint64_t file_size = file.size();
  if (file_size < 1024) throw Error(path + ": too short for an llm.c model header");
  int32_t h[256];
  file.read_at(h, sizeof h, 0, "header");
  if (h[0] != kLlmcModelMagic)
    throw Error(path + ": header: magic " + std::to_string(h[0]) + " is not " + std::to_string(kLlmcModelMagic) +
                " (not an llm.c model file)");
  if (h[1] != 3 && h[1] != 5) throw Error(path + ": header: version " + std::to_string(h[1]) + " (expected 3 = fp32 or 5 = bf16)");
  const fb::Model& m = *ex.module().fb().model();
  const int64_t maxT = h[2], V = h[3], L = h[4], NH = h[5], C = h[6], Vp = h[7];
  if (maxT != m.block_size() || V != m.vocab_size() || L != m.n_layer() || NH != m.n_head() || C != m.n_embd())
    throw Error(path + ": header: model L=" + std::to_string(L) + " H=" + std::to_string(NH) + " C=" + std::to_string(C) +
                " V=" + std::to_string(V) + " Tmax=" + std::to_string(maxT) + " does not match the compiled model (L=" +
                std::to_string(m.n_layer()) + " H=" + std::to_string(m.n_head()) + " C=" + std::to_string(m.n_embd()) +
                " V=" + std::to_string(m.vocab_size()) + " Tmax=" + std::to_string(m.block_size()) + ")");
  if (Vp < V)
    throw Error(path + ": header: padded vocabulary " + std::to_string(Vp) + " is smaller than the vocabulary " +
                std::to_string(V));
  const bool bf16 = h[1] == 5;
  const size_t elem = bf16 ? 2 : 4;
  // The values the header's sizes call for: wte (Vp x C), wpe, per layer two layer norms (4C),
  // c_attn (3C x C + 3C), c_proj (C x C + C), c_fc (4C x C + 4C), the MLP's c_proj (4C x C + C),
  // and ln_f. Checked first, so a cut file (or a wrong Vp) is said with the sizes, not midway.
  const unsigned __int128 values = (unsigned __int128)(Vp + maxT) * C + (unsigned __int128)L * (12 * C * C + 13 * C) + 2 * C;
  if (1024 + values * elem != file_size) {
    const double need = 1024.0 + double(values) * double(elem);
    char text[96];
    std::snprintf(text, sizeof text, "%.0f bytes", need);
    throw Error(path + ": header: its sizes (Vp=" + std::to_string(Vp) + " Tmax=" + std::to_string(maxT) + " L=" +
                std::to_string(L) + " C=" + std::to_string(C) + ", " + (bf16 ? "bf16" : "fp32") + ") call for " + text +
                ", the file has " + std::to_string(file_size) +
                (need > double(file_size) ? " (truncated?)" : " (bytes after the last tensor: not this model?)"));
  }
  std::vector<uint8_t> bytes(file_size);
  file.read_at(bytes.data(), bytes.size(), 0, "tensors");
  size_t pos = 1024;
  // Reads n values starting at the cursor, widening bf16 (the file's length was checked above).
  auto take = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (bf16) {
        uint16_t x;
        std::memcpy(&x, bytes.data() + pos + size_t(i) * 2, 2);
        v[size_t(i)] = cpu::from_bf16(x);
      } else {
        std::memcpy(&v[size_t(i)], bytes.data() + pos + size_t(i) * 4, 4);
      }
    }
    pos += size_t(n) * elem;
    return v;
  };
  // A module compiled from edited IR may name or shape its parameters otherwise than GPT-2 does:
  // each is checked before any is written (the copies below go by the file's sizes).
  std::map<std::string, const fb::Parameter*> param;
  for (const fb::Parameter* p : *ex.module().fb().parameters()) param[p->name()->str()] = p;
  auto slot = [&](const std::string& name) { return param.at(name)->value(); };  // (checked below)
  {
    auto want = [&](const std::string& name, std::vector<int64_t> shape) {
      const auto it = param.find(name);
      if (it == param.end())
        throw Error(path + ": the module has no parameter '" + name +
                    "' (an llm.c model file holds GPT-2's parameters, by GPT-2's names)");
      const std::vector<int64_t> has(it->second->shape()->begin(), it->second->shape()->end());
      // wte's rows are the module's padded vocabulary, at least V.
      const bool ok = name == "wte.weight" ? has.size() == 2 && has[0] >= V && has[1] == C : has == shape;
      if (!ok)
        throw Error(path + ": the module's parameter '" + name + "' has shape " + shape_str(has) +
                    "; the llm.c model file's is " + shape_str(shape));
    };
    want("wte.weight", {V, C});
    want("wpe.weight", {maxT, C});
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      want(p + "ln_1.weight", {C});
      want(p + "ln_1.bias", {C});
      want(p + "attn.c_attn.weight", {C, 3 * C});
      want(p + "attn.c_attn.bias", {3 * C});
      want(p + "attn.c_proj.weight", {C, C});
      want(p + "attn.c_proj.bias", {C});
      want(p + "ln_2.weight", {C});
      want(p + "ln_2.bias", {C});
      want(p + "mlp.c_fc.weight", {C, 4 * C});
      want(p + "mlp.c_fc.bias", {4 * C});
      want(p + "mlp.c_proj.weight", {4 * C, C});
      want(p + "mlp.c_proj.bias", {C});
    }
    want("ln_f.weight", {C});
    want("ln_f.bias", {C});
  }
  auto put = [&](const std::string& name, const float* src, int64_t n) {
    std::memcpy(ex.f32(slot(name)), src, size_t(n) * sizeof(float));
  };
  // Stores layer l's [out, in] slice transposed into the Conv1D [in, out] parameter.
  auto put_t = [&](const std::string& name, const float* src, int64_t out, int64_t in) {
    float* dst = ex.f32(slot(name));
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) dst[i * out + o] = src[o * in + i];
  };
  auto layers = [&](const char* suffix, int64_t per_layer, int64_t out, int64_t in) {
    std::vector<float> all = take(L * per_layer);
    for (int64_t l = 0; l < L; ++l) {
      std::string name = "h." + std::to_string(l) + "." + suffix;
      if (in) put_t(name, all.data() + l * per_layer, out, in);
      else put(name, all.data() + l * per_layer, per_layer);
    }
  };
  std::vector<float> wte = take(Vp * C);
  {
    // The file's padded rows V..Vp-1 are dropped; the module's (V..its own Vp-1) are zero.
    const uint32_t b = slot("wte.weight");
    put("wte.weight", wte.data(), V * C);
    cpu::fill(ex.f32(b) + V * C, 0.0f, numel(ex.module().buffer(b)) - V * C);
  }
  std::vector<float> wpe = take(maxT * C);
  put("wpe.weight", wpe.data(), maxT * C);
  layers("ln_1.weight", C, 0, 0);
  layers("ln_1.bias", C, 0, 0);
  layers("attn.c_attn.weight", 3 * C * C, 3 * C, C);
  layers("attn.c_attn.bias", 3 * C, 0, 0);
  layers("attn.c_proj.weight", C * C, C, C);
  layers("attn.c_proj.bias", C, 0, 0);
  layers("ln_2.weight", C, 0, 0);
  layers("ln_2.bias", C, 0, 0);
  layers("mlp.c_fc.weight", 4 * C * C, 4 * C, C);
  layers("mlp.c_fc.bias", 4 * C, 0, 0);
  layers("mlp.c_proj.weight", C * 4 * C, C, 4 * C);
  layers("mlp.c_proj.bias", C, 0, 0);
  std::vector<float> lnf = take(2 * C);
  put("ln_f.weight", lnf.data(), C);
  put("ln_f.bias", lnf.data() + C, C);
}

}  // namespace

bool has_checkpoint_name(const std::string& path) {
  return path.size() > 10 && path.compare(path.size() - 10, 10, ".kiln-ckpt") == 0;
}

std::string file_kind(const std::string& path) {
  // read_head reads only a regular file: a FIFO's bytes (a process substitution's) are its reader's to take.
  const std::string head = read_head(path, 16);
  const auto* b = reinterpret_cast<const unsigned char*>(head.data());
  const size_t got = head.size();
  int32_t magic = 0;
  if (got >= 4) std::memcpy(&magic, b, 4);
  // A checkpoint cut short within its magic is one still (its reader says it is truncated): 4 or
  // more of the magic's bytes, or fewer under a checkpoint's name.
  if ((got >= 4 || has_checkpoint_name(path)) && std::memcmp(b, "KILNCKPT", std::min<size_t>(got, 8)) == 0) return kCheckpointKind;
  if (got >= 8 && std::memcmp(b + 4, "KILN", 4) == 0) return kModuleKind;
  if (got >= 4 && std::memcmp(b, "\x7f" "ELF", 4) == 0)
    return read_tail(path, 8) == std::string(kEmbeddedMagic, 8) ? kExecutableKind : "a program";
  if (starts_like_token_shard(path)) return "an llm.c token shard (training data)";
  if (got >= 4 && magic == kLlmcModelMagic) return kLlmcModelKind;
  // safetensors: the header's length (little-endian u64, within the file), then its JSON.
  uint64_t header = 0;
  if (got >= 9) std::memcpy(&header, b, 8);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (got >= 9 && b[8] == '{' && header >= 2 && !ec && header <= size - 8) return kSafetensorsKind;
  return "";
}

std::string check_weights_file(const std::string& path) {
  check_not_a_device(path);
  // (A folder of checkpoints was replaced by its latest one before: checkpoint_named_by.)
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw Error(path + ": is a folder with no Kiln checkpoint (ckpt_*.kiln-ckpt) in it; give a weights file "
                "(safetensors, an llm.c model .bin), a checkpoint, or a folder of checkpoints");
  RegularFile(path, "weights' file");  // opens it, refusing a folder, a pipe or a FIFO
  const std::string kind = file_kind(path);
  if (!kind.empty() && kind != kSafetensorsKind && kind != kLlmcModelKind && kind != kCheckpointKind)
    throw Error(path + ": is " + kind + ", not weights (safetensors, an llm.c model .bin or a Kiln checkpoint)");
  return kind;
}

std::string checkpoint_named_by(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) return "";
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return latest_checkpoint(path).value_or("");
  // A file named latest that holds a checkpoint's name (not weights that happen to be called so),
  // in the folder of the file it is (a symbolic link to one elsewhere reads that folder).
  if (p.filename() == "latest" && fs::is_regular_file(p, ec) && file_kind(path).empty()) {
    fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if (fs::is_symlink(p, ec))
      if (const fs::path real = fs::canonical(p, ec); !ec) dir = real.parent_path();
    return latest_checkpoint(dir.string()).value_or("");
  }
  return "";
}

void load_parameters(Executor& ex, const std::string& path) {
  // By content where it says, else by name (whose reader then says what is wrong).
  const std::string kind = check_weights_file(path);
  // A checkpoint's values (its AdamW moments and data position are --resume's). One whose magic
  // is damaged is still read as a checkpoint by its name, whose reader says what is wrong.
  if (kind == kCheckpointKind || (kind.empty() && has_checkpoint_name(path))) {
    load_checkpoint(path, ex, true);
    return;
  }
  if (kind == kLlmcModelKind || (kind.empty() && path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0))
    return load_llmc_bin(ex, path);
  // Hugging Face's causal-mask buffers (h.N.attn.bias, h.N.attn.masked_bias) are not weights;
  // some transformers versions store them as BOOL or U8.
  auto mask_buffer = [](const std::string& name) {
    for (const std::string suffix : {".attn.bias", ".attn.masked_bias"})
      if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
    return false;
  };
  std::map<std::string, std::string> meta;
  std::vector<SafeTensor> tensors = read_safetensors(path, &meta);
  std::map<std::string, SafeTensor> file;
  for (SafeTensor& t : tensors) {
    std::string name = t.name.rfind(kPrefix, 0) == 0 ? t.name.substr(kPrefix.size()) : t.name;
    if (mask_buffer(name)) continue;
    if (auto it = file.find(name); it != file.end())
      throw Error(path + ": tensor '" + name + "' appears twice (as '" + it->second.name + "' and '" + t.name + "')");
    // Before any value is converted: the error names the file (to_f32's cannot).
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
      throw Error(path + ": tensor '" + t.name + "' is " + t.dtype + "; weights are read as F32, BF16 or F16");
    file[name] = std::move(t);
  }
  // A file of another depth fails on its first missing or extra layer: say both depths.
  const int64_t model_layers = ex.module().fb().model()->n_layer();
  auto depths = [&] {
    int64_t layers = 0;
    for (const auto& [name, t] : file)
      if (name.rfind("h.", 0) == 0) {
        // (strtoll, not atoll: "h.99999999999999999999.x" is out of range, which atoll leaves undefined)
        const long long l = std::strtoll(name.c_str() + 2, nullptr, 10);
        if (l >= 0 && l < INT32_MAX) layers = std::max<int64_t>(layers, l + 1);
      }
    // (none at all: another model's names, or a prefix other than transformer.; not said)
    return layers == model_layers || layers == 0 ? std::string()
                                  : "; the file holds " + std::to_string(layers) + " layer" + (layers == 1 ? "" : "s") +
                                        " (h.0 ..), the model " + std::to_string(model_layers);
  };
  std::set<std::string> used;
  for (const fb::Parameter* p : *ex.module().fb().parameters()) {
    const std::string name = p->name()->str();
    auto it = file.find(name);
    if (it == file.end())
      throw Error(path + ": missing tensor '" + one_line(name) + "' (or 'transformer." + one_line(name) + "')" + depths());
    const SafeTensor& t = it->second;
    const std::vector<int64_t> want = stored_shape(ex.module(), *p);  // wte: [V, C], not padded
    if (t.shape != want) {
      // nanoGPT's nn.Linear keeps [out, in]; Hugging Face's GPT-2 (Conv1D), which Kiln reads, [in, out].
      // (The embeddings are [rows, C] in both.)
      const bool linear = name.find(".c_attn.") != std::string::npos || name.find(".c_fc.") != std::string::npos ||
                          name.find(".c_proj.") != std::string::npos;
      const bool transposed = linear && t.shape.size() == 2 && want.size() == 2 && t.shape[0] == want[1] &&
                              t.shape[1] == want[0];
      throw Error(path + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + ", the model needs " +
                  shape_str(want) +
                  (transposed ? " (transposed: Kiln reads Hugging Face's GPT-2 layout, [in, out]; nanoGPT's "
                                "nn.Linear weights are [out, in])"
                              : ""));
    }
    std::vector<float> values = to_f32(t);
    float* dst = ex.f32(p->value());
    std::memcpy(dst, values.data(), values.size() * sizeof(float));
    // Padded vocabulary rows (wte's V..Vp-1) are zero.
    cpu::fill(dst + values.size(), 0.0f, numel(ex.module().buffer(p->value())) - int64_t(values.size()));
    used.insert(name);
  }
  for (const auto& [name, t] : file) {
    if (used.count(name)) continue;
    if (name == "lm_head.weight" && file.count("wte.weight")) {
      const SafeTensor& wte = file.at("wte.weight");
      if (t.shape != wte.shape)
        throw Error(path + ": lm_head.weight has shape " + shape_str(t.shape) + ", wte.weight " + shape_str(wte.shape) +
                    "; Kiln's GPT-2 ties them");
      if (to_f32(t) != to_f32(wte))
        throw Error(path + ": lm_head.weight differs from wte.weight; Kiln's GPT-2 ties them");
      continue;
    }
    throw Error(path + ": unexpected tensor '" + t.name + "' (not a parameter of this model" + depths() + ")");
  }
  // Kiln's --save records n_head; Hugging Face's files have no such key, and are not checked.
  // Checked once every shape has agreed (another model's file fails on a shape first, as it says).
  const int64_t n_head = ex.module().fb().model()->n_head();
  if (meta.count("n_head") && meta.at("n_head") != std::to_string(n_head))
    throw Error(path + ": written for a model with n_head " + one_line(meta.at("n_head")) + " (its __metadata__), this "
                "one has " + std::to_string(n_head) + ": the shapes agree, but the heads would split attention otherwise");
}

std::string first_non_finite(Executor& ex, bool moments) {
  for (const fb::Parameter* p : *ex.module().fb().parameters()) {
    const std::pair<const char*, uint32_t> fields[] = {{"value", p->value()}, {"AdamW m", p->adam_m()},
                                                       {"AdamW v", p->adam_v()}};
    for (const auto& [what, idx] : fields) {
      if (!moments && idx != p->value()) continue;
      const float* x = ex.f32_held(idx);  // ZeRO-1: this rank's slice of the moments
      const int64_t n = ex.held(idx).second - ex.held(idx).first;
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(x[i])) return "parameter '" + p->name()->str() + "' (" + what + ")";
    }
  }
  return "";
}

void load_finite_parameters(Executor& ex, const std::string& path, const std::string& consequence) {
  load_parameters(ex, path);
  if (const std::string bad = first_non_finite(ex, false); !bad.empty())
    throw Error(path + ": " + bad + " holds a NaN or an infinity (" + consequence + ")");
}

uint64_t saved_parameter_bytes(const Module& m) {
  uint64_t bytes = 0;
  for (const fb::Parameter* p : *m.fb().parameters()) bytes += uint64_t(stored_rows(m, *p) * row_size(*p)) * sizeof(float);
  return bytes;
}

void save_parameters(Executor& ex, const std::string& flag, const std::string& path, ParamField field) {
  ex.sync_to_host();
  if (field == ParamField::Value)
    if (const std::string bad = first_non_finite(ex, false); !bad.empty())
      throw Error(flag + ": " + path + ": not written: " + bad + " holds a NaN or an infinity (the update diverged; lower --lr)");
  std::vector<SafeTensor> out;
  for (const fb::Parameter* p : *ex.module().fb().parameters()) {
    uint32_t b = field == ParamField::Value ? p->value() : p->grad();
    // wte.weight without its padded rows: [V, C], as Hugging Face's GPT-2 files hold it.
    SafeTensor t{kPrefix + p->name()->str(), "F32", stored_shape(ex.module(), *p), {}};
    const size_t bytes = size_t(stored_rows(ex.module(), *p) * row_size(*p)) * sizeof(float);
    const auto* src = reinterpret_cast<const uint8_t*>(ex.f32(b));
    t.bytes.assign(src, src + bytes);
    out.push_back(std::move(t));
  }
  try {
    // n_head is the one setting the shapes do not tell: loading checks it (llm.c's header holds it too).
    write_safetensors(path, out, {{"format", "pt"}, {"n_head", std::to_string(ex.module().fb().model()->n_head())}});
  } catch (const Error& e) {
    throw Error(flag + ": " + e.what());
  }
}

}  // namespace kiln
