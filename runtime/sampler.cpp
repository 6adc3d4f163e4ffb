#include "runtime/sampler.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "runtime/cpu/bf16.h"
#include "runtime/error.h"
#include "runtime/rng.h"

namespace kiln {
std::string sample_string(const std::vector<int32_t>& ids,
                          const std::function<std::string(const std::vector<int32_t>&)>& text) {
  if (text) return text(ids);
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) out += (k ? " " : "") + std::to_string(ids[k]);
  return out;
}

void check_sample_size(int64_t prompt_tokens, const SampleOptions& o, const std::string& what) {
  int64_t tokens = 0;
  if (__builtin_add_overflow(prompt_tokens, o.max_new_tokens, &tokens) ||
      __builtin_mul_overflow(o.num_samples, tokens, &tokens) ||
      tokens > (int64_t(1) << 31))
    throw Error(what + std::to_string(o.num_samples) + (o.num_samples == 1 ? " sample of " : " samples of ") +
                std::to_string(prompt_tokens) + " + " +
                std::to_string(o.max_new_tokens) + " tokens are more than the 2^31 tokens the sampler keeps");
  // Each sample is a vector of its tokens (about 48 bytes besides them): found here, not by
  // running out of memory once sampling starts (in train, after steps of work).
  const double bytes = double(o.num_samples) * 48.0 + 4.0 * double(tokens);
  double memory = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));  // (ulimit -v too)
  if (rlimit as{}; ::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) memory = std::min(memory, double(as.rlim_cur));
  if (memory > 0 && bytes > memory / 2) {
    char text[160];
    std::snprintf(text, sizeof text, " sample%s of %lld + %lld tokens need %.1f GiB, more than half of the %.1f GiB this process may use",
                  o.num_samples == 1 ? "" : "s", (long long)prompt_tokens, (long long)o.max_new_tokens, bytes / double(1 << 30), memory / double(1 << 30));
    throw Error(what + std::to_string(o.num_samples) + text);
  }
}

int64_t prefill_cost(const Module& m, int64_t M) {
  const fb::Model& model = *m.fb().model();
  double layer_weights = 0, decode_bytes = 0;
  for (const fb::Parameter* p : *m.fb().parameters()) {
    const std::string name = p->name()->str();
    const double n = double(numel(m.buffer(p->value())));
    if (name != "wte.weight" && name != "wpe.weight") layer_weights += n;
    if (name != "wpe.weight") decode_bytes += n * (p->compute_copy() >= 0 ? 2 : 4);  // (one wpe row)
  }
  // FLOPs a device does per byte it reads at full speed: a CPU core's vector units against its share
  // of the memory bandwidth (twice as many FLOPs in bf16 products), an H100's or H200's tensor
  // cores against HBM.
  const bool cuda = model.target() && model.target()->str() == "cuda";
  const bool bf16 = model.precision() && model.precision()->str() == "bf16";
  const double balance = cuda ? 200 : bf16 ? 20 : 10;
  const double prefill_flops = 2.0 * double(model.batch_size()) * double(M) * layer_weights;
  const double calls = std::ceil(prefill_flops / std::max(1.0, decode_bytes * balance));
  return std::clamp<int64_t>(int64_t(std::min(calls, 1e9)), 2, std::max<int64_t>(2, M));
}

std::vector<size_t> plan_prefill(int64_t n, const std::vector<std::pair<int64_t, int64_t>>& programs) {
  // cost[i]: the least cost of reading i positions; how[i]: the call that reads the last of them
  // (-1: @decode). A call of M reads min(M, i) (the first call of a prompt may be part-filled).
  std::vector<int64_t> cost(size_t(std::max<int64_t>(n, 0) + 1), 0);
  std::vector<int> how(cost.size(), -1);
  for (size_t i = 1; i < cost.size(); ++i) {
    cost[i] = cost[i - 1] + 1;
    for (size_t p = 0; p < programs.size(); ++p) {
      const int64_t c = cost[size_t(std::max<int64_t>(0, int64_t(i) - programs[p].first))] + programs[p].second;
      // On a tie, a prefill call over @decode calls, and the call of fewer positions (prices
      // clamped to 2 tie where the smaller call is cheaper still).
      if (c < cost[i] || (c == cost[i] && (how[i] < 0 || programs[p].first < programs[size_t(how[i])].first)))
        cost[i] = c, how[i] = int(p);
    }
  }
  std::vector<size_t> calls;
  for (int64_t i = n; i > 0;)
    if (how[size_t(i)] < 0) {
      --i;
    } else {
      calls.push_back(size_t(how[size_t(i)]));
      i = std::max<int64_t>(0, i - programs[calls.back()].first);
    }
  std::stable_sort(calls.begin(), calls.end(), [&](size_t a, size_t b) { return programs[a].first > programs[b].first; });
  return calls;
}

int32_t pick_token(const std::vector<float>& row, int64_t k, float temperature, double top_p, Rng& rng,
                   std::vector<int32_t>& order, std::vector<double>& weights) {
  // Top-k by logit (ties to the lower id), then softmax over those k at the temperature.
  order.resize(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
  });
  // exp(x - top) <= 1: no overflow, and the largest weight is exactly 1. The temperature is taken
  // as given (positive): however small, (x - top) / temperature is 0 or negative, never NaN.
  const double top = row[size_t(order[0])];
  weights.resize(size_t(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i)
    sum += weights[size_t(i)] = std::exp((row[size_t(order[size_t(i)])] - top) / double(temperature));
  if (top_p < 1) {
    // The nucleus: candidates are kept while the weight before them is below top_p of the whole.
    // (The running sum adds in the order `sum` did, so top_p 1 would keep every nonzero weight.)
    double kept = 0;
    int64_t n = 0;
    while (n < k && kept < top_p * sum) kept += weights[size_t(n++)];
    k = n, sum = kept;
  }
  // Inverse CDF: the first candidate whose running sum passes u (the last if rounding leaves some).
  double u = rng.uniform() * sum;
  int64_t pick = k - 1;
  for (int64_t i = 0; i < k; ++i)
    if ((u -= weights[size_t(i)]) < 0) { pick = i; break; }
  return order[size_t(pick)];
}

std::vector<std::vector<int32_t>> sample(Executor& ex, const std::vector<int32_t>& prompt,
                                         const SampleOptions& o) {
  const fb::Model& model = *ex.module().fb().model();
  const int64_t B = model.batch_size(), T = model.seq_len(), V = model.vocab_size();
  const fb::Program* program = ex.module().program("logits");
  if (!program) throw Error(ex.module().source() + ": no 'logits' program (recompile with this kilnc)");
  // The caller knows where the prompt came from (an option, a file) and checks it there, naming
  // that; these are the sampler's own guards, in terms of its arguments.
  if (prompt.empty()) throw Error("sample: the prompt has no tokens");
  for (int32_t t : prompt)
    if (t < 0 || t >= V) throw Error("sample: prompt token " + std::to_string(t) + " is not in [0, " + std::to_string(V) + ")");
  // NaN would make every weight NaN and the pick always the last of the top k, whatever the seed.
  if (!std::isfinite(o.temperature) || o.temperature <= 0)
    throw Error("sample: temperature " + std::to_string(o.temperature) + " is not a positive finite number");
  if (!(o.top_p > 0 && o.top_p <= 1))  // (0 would keep no candidate)
    throw Error("sample: top_p " + std::to_string(o.top_p) + " is not in (0, 1]");
  const fb::Buffer& logits = ex.module().buffer(program->result());
  const bool bf16 = logits.dtype() == fb::DType::BF16;
  // Rows of the logits are Vp wide (the vocabulary padded to a multiple of 128); only the first
  // V columns are tokens, and only those are sampled from.
  const int64_t Vp = logits.shape() && logits.shape()->size() ? logits.shape()->Get(logits.shape()->size() - 1) : V;
  if (Vp < V || numel(logits) < B * T * Vp)
    throw Error(ex.module().source() + ": the logits program's result holds " + std::to_string(numel(logits)) +
                " values in rows of " + std::to_string(Vp) + ", not " + std::to_string(B * T) +
                " rows of at least " + std::to_string(V) + " (recompile with this kilnc)");
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;

  // @decode (when the module has it and the executor loaded it) runs one position per call over
  // the layers' key/value caches: logits [B, Vp], the rows' next-token scores. It serves while a
  // sequence fits the T positions of the cache; past that, every step runs @logits over the last
  // T tokens, which is what the sampler does throughout without @decode.
  const fb::Program* decode = ex.has_program("decode") ? ex.module().program("decode") : nullptr;
  if (decode) {
    const fb::Buffer& d = ex.module().buffer(decode->result());
    if ((d.dtype() == fb::DType::BF16) != bf16 || numel(d) != B * Vp)
      throw Error(ex.module().source() + ": the decode program's result holds " + std::to_string(numel(d)) +
                  " values, not the " + std::to_string(B) + " rows of " + std::to_string(Vp) +
                  " of the logits (recompile with this kilnc)");
  }

  // Everything is kept until the end: refused up front when it cannot be (not killed half-way).
  // The caps (8 GiB each) are far above any real use.
  check_sample_size(int64_t(prompt.size()), o, "sample: ");
  if (o.logits_out) {
    int64_t n = 0;
    if (__builtin_mul_overflow(o.num_samples, o.max_new_tokens, &n) || __builtin_mul_overflow(n, V, &n) ||
        n > (int64_t(1) << 31))
      throw Error("--logits-out: " + std::to_string(o.num_samples) + " x " + std::to_string(o.max_new_tokens) + " x " +
                  std::to_string(V) + " logits are more than the 2^31 it keeps");
    try {
      o.logits_out->assign(size_t(n), 0.0f);
    } catch (const std::bad_alloc&) {
      char gib[32];  // (4 bytes a logit; one decimal, where a whole count would say 0 below 1 GiB)
      std::snprintf(gib, sizeof gib, "%.1f", double(n) * 4 / double(1ull << 30));
      throw Error("--logits-out: " + std::to_string(o.num_samples) + " x " + std::to_string(o.max_new_tokens) + " x " +
                  std::to_string(V) + " logits (" + gib + " GiB) do not fit in memory");
    }
  }
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(o.num_samples), prompt);
  // A stream of draws per sample, so that sample s is the same whatever --num-samples is (and
  // however the samples are batched into rows); sample 1 draws from the seed itself.
  std::vector<Rng> rng;
  for (int64_t s = 0; s < o.num_samples; ++s)
    rng.push_back(s == 0 ? Rng{o.seed} : Rng{Rng{o.seed ^ (uint64_t(s) * 0xD1B54A32D192ED03ull)}.next()});
  std::vector<float> row(static_cast<size_t>(V));
  std::vector<int32_t> order;  // pick_token's scratch
  std::vector<double> weights;
  const int64_t passes = (o.num_samples + B - 1) / B * o.max_new_tokens;
  int64_t passes_done = 0;
  // Samples the `step`th new token of sample `s` from the V logits at element `at` of `result`'s
  // buffer.
  auto pick_from = [&](uint32_t result, int64_t at, int64_t s, int64_t step) {
    // Only the row sampled from is read (on a GPU, only it is copied to the host).
    if (bf16) {
      std::vector<uint16_t> h(static_cast<size_t>(V));
      ex.read(result, size_t(at) * 2, size_t(V) * 2, h.data());
      cpu::widen_bf16(row.data(), h.data(), V);
    } else {
      ex.read(result, size_t(at) * 4, size_t(V) * 4, row.data());
    }
    // A NaN, or a largest logit that is not finite: +inf, or -inf in every logit (each weight
    // exp(-inf + inf), NaN: the pick the k-th id whatever the seed). A -inf among finite logits
    // is a token never drawn (weight 0).
    bool nan = false;
    float top = -INFINITY;
    for (float x : row) nan |= std::isnan(x), top = std::max(top, x);
    if (nan || !std::isfinite(top))
      throw Error("sample: the logits of sample " + std::to_string(s + 1) + "'s new token " + std::to_string(step + 1) +
                  " hold a NaN or an infinity: the forward pass of these weights overflows");
    if (o.logits_out) std::copy(row.begin(), row.end(), o.logits_out->begin() + (s * o.max_new_tokens + step) * V);
    return pick_token(row, k, o.temperature, o.top_p, rng[size_t(s)], order, weights);
  };
  int32_t* token = decode ? ex.input("token") : nullptr;
  int32_t* position = decode ? ex.input("position") : nullptr;
  // @prefill and @prefill_short (loaded with @decode) read M positions per row and call into the
  // same caches; their result is of no use. plan_prefill picks the calls for the positions a step
  // must read (before the last), priced by prefill_cost; @decode reads the rest.
  struct Prefill {
    std::string name;
    int64_t M = 0;  // Module::verify: 1 <= M <= T
    int32_t* tokens = nullptr;
    int32_t* positions = nullptr;
  };
  std::vector<Prefill> prefills;
  std::vector<std::pair<int64_t, int64_t>> prices;  // {M, cost} for plan_prefill
  for (const std::string name : kPrefillPrograms) {
    if (!decode || !ex.has_program(name)) continue;
    Prefill p{name, 0, ex.input(name + "_tokens"), ex.input(name + "_positions")};
    for (uint32_t i = 0; i < ex.module().fb().buffers()->size(); ++i)
      if (ex.module().buffer(i).kind() == fb::BufferKind::Input && ex.module().buffer(i).name()->str() == name + "_positions")
        p.M = numel(ex.module().buffer(i));
    prices.push_back({p.M, prefill_cost(ex.module(), p.M)});
    if (o.times) o.times->prefill.push_back({name, p.M, prices.back().second});
    prefills.push_back(std::move(p));
  }
  for (int64_t first = 0; first < o.num_samples; first += B) {
    const int64_t rows = std::min(B, o.num_samples - first);
    int64_t cached = 0;  // positions of every row's sequence in the caches (all rows are as long)
    for (int64_t step = 0; step < o.max_new_tokens; ++step) {
      if (o.stop && o.stop()) {
        if (o.stopped) *o.stopped = true;
        out.resize(size_t(first + rows));  // the rows not begun are only their prompt
        return out;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t len = int64_t(out[size_t(first)].size());
      const bool from_caches = decode && len <= T;
      if (o.times) ++(from_caches ? o.times->decode_steps : o.times->logits_steps);
      if (from_caches) {
        // Feed the positions the caches lack (the prompt at the first step, then the last token);
        // the last call's logits are those of position len - 1, so it is @decode's.
        for (size_t call : plan_prefill(len - 1 - cached, prices)) {
          const Prefill& p = prefills[call];
          const int64_t M = p.M, n = std::min(M, len - 1 - cached);
          std::fill(p.tokens, p.tokens + B * M, 0);  // padding: stored past the prompt, overwritten later
          for (int64_t r = 0; r < rows; ++r)
            std::copy_n(out[size_t(first + r)].begin() + cached, n, p.tokens + r * M);
          for (int64_t m = 0; m < M; ++m) p.positions[m] = int32_t(std::min(cached + m, T - 1));
          *position = int32_t(cached);
          ex.run(p.name);
          if (o.times) ++o.times->prefill[call].calls, o.times->prefill[call].positions += n;
          cached += n;
        }
        if (o.times && step == 0) o.times->decode_prompt_positions += len - cached;
        for (; cached < len; ++cached) {
          std::fill(token, token + B, 0);
          for (int64_t r = 0; r < rows; ++r) token[r] = out[size_t(first + r)][size_t(cached)];
          *position = int32_t(cached);
          ex.run("decode");
        }
        for (int64_t r = 0; r < rows; ++r)
          out[size_t(first + r)].push_back(pick_from(decode->result(), r * Vp, first + r, step));
      } else {
        int32_t* idx = ex.input("idx");
        std::fill(idx, idx + B * T, 0);
        std::vector<int64_t> last(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          const auto& seq = out[size_t(first + r)];
          const int64_t n = std::min<int64_t>(int64_t(seq.size()), T);  // the last T tokens
          std::copy(seq.end() - n, seq.end(), idx + r * T);
          last[size_t(r)] = n - 1;
        }
        ex.run("logits");
        for (int64_t r = 0; r < rows; ++r)
          out[size_t(first + r)].push_back(pick_from(program->result(), (r * T + last[size_t(r)]) * Vp, first + r, step));
      }
      if (o.times) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        (step == 0 ? o.times->first_steps_s : o.times->other_steps_s) += s;
        if (step == 0) ++o.times->first_steps;
        if (step > 0) ++o.times->other_steps, o.times->other_tokens += rows;
      }
      if (o.progress) o.progress(++passes_done, passes);
    }
  }
  return out;
}

}  // namespace kiln
