#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/cpu/bf16.h"
#include "runtime/error.h"
#include "runtime/rng.h"

namespace kiln {
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

  std::vector<std::vector<int32_t>> out(static_cast<size_t>(o.num_samples), prompt);
  Rng rng{o.seed};
  std::vector<float> row(static_cast<size_t>(V));
  std::vector<int32_t> order(static_cast<size_t>(V));
  const int64_t passes = (o.num_samples + B - 1) / B * o.max_new_tokens;
  int64_t passes_done = 0;
  for (int64_t first = 0; first < o.num_samples; first += B) {
    const int64_t rows = std::min(B, o.num_samples - first);
    for (int64_t step = 0; step < o.max_new_tokens; ++step) {
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
      for (int64_t r = 0; r < rows; ++r) {
        // Only the row sampled from is read (on a GPU, only it is copied to the host).
        const int64_t at = (r * T + last[size_t(r)]) * Vp;
        if (bf16) {
          std::vector<uint16_t> h(static_cast<size_t>(V));
          ex.read(program->result(), size_t(at) * 2, size_t(V) * 2, h.data());
          cpu::widen_bf16(row.data(), h.data(), V);
        } else {
          ex.read(program->result(), size_t(at) * 4, size_t(V) * 4, row.data());
        }
        for (float& x : row)
          if (std::isnan(x)) x = -INFINITY;  // a strict weak order for the sort
        // Top-k by logit (ties to the lower id), then softmax over those k at the temperature.
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
        });
        const double top = row[size_t(order[0])];
        std::vector<double> p(static_cast<size_t>(k));
        double sum = 0;
        for (int64_t i = 0; i < k; ++i)
          sum += p[size_t(i)] = std::exp((row[size_t(order[size_t(i)])] - top) / std::max(o.temperature, 1e-6f));
        double u = rng.uniform() * sum;
        int64_t pick = k - 1;
        for (int64_t i = 0; i < k; ++i)
          if ((u -= p[size_t(i)]) < 0) { pick = i; break; }
        out[size_t(first + r)].push_back(order[size_t(pick)]);
      }
      if (o.progress) o.progress(++passes_done, passes);
    }
  }
  return out;
}

}  // namespace kiln
