// What ranks compare at start to find out that they were given different things (see
// rank_agreement.h).
#include "runtime/rank_agreement.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

#include "runtime/data_loader.h"
#include "runtime/error.h"
#include "runtime/executor.h"

namespace kiln {

// 64-bit FNV-1a over words (the tail bytewise): a fingerprint, not a cryptographic hash.
uint64_t fingerprint(const void* data, size_t n, uint64_t h) {
  const auto* c = static_cast<const uint8_t*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, c + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

uint64_t weights_fingerprint(const Module& module, Executor& ex) {
  uint64_t weights = fingerprint(nullptr, 0);
  for (const fb::Parameter* p : *module.fb().parameters())
    weights = fingerprint(ex.f32(p->value()), module.buffer(p->value()).size(), weights);
  return weights;
}

uint64_t data_fingerprint(const DataLoader& data) {
  const std::vector<int64_t>& counts = data.shard_tokens();
  uint64_t tokens = fingerprint(counts.data(), counts.size() * sizeof(int64_t));
  return fingerprint(data.current_tokens().data(), data.current_tokens().size() * sizeof(uint16_t), tokens);
}

void require_ranks_agree(Communicator& comm, const std::vector<bool>& this_one, const std::vector<std::string>& what,
                         const std::string& who) {
  std::vector<double> differ(this_one.size());
  for (size_t i = 0; i < differ.size(); ++i) differ[i] = this_one[i] ? 1 : 0;
  comm.all_reduce_sum(differ.data(), int64_t(differ.size()));
  for (size_t i = 0; i < differ.size(); ++i)
    if (differ[i] > 0)
      throw Error(who + ": " + std::to_string(int(differ[i])) + " rank(s) disagree with rank 0 about " + what[i] +
                  (this_one[i] ? ", this one among them" : "") + "; every rank must run the same command");
}

// Every rank must run the same module with the same options from the same weights, or the
// ranks drift apart (or deadlock on different collectives). Checked once at start; every rank
// learns the outcome, so they all stop together.
void check_ranks_agree(Communicator& comm, const Module& module, const TrainOptions& o, int64_t total,
                       int64_t first_step, Executor& ex, const DataLoader& data, const DataLoader* val,
                       int64_t val_steps, bool compiled_buckets) {
  const uint8_t* bytes = flatbuffers::GetBufferStartFromRootPointer(&module.fb());
  const uint64_t weights = weights_fingerprint(module, ex);
  // The data: each rank reads its own windows of the same shards, so the shards' sizes and the
  // tokens of the one being read must agree (the paths may differ from machine to machine).
  const uint64_t tokens = data_fingerprint(data);
  // So must the validation data's, and the batches each evaluation reads of it (--val-steps cut
  // to what one pass holds): the logged validation loss is the mean of the ranks' means.
  const uint64_t val_tokens = val ? fingerprint(&val_steps, sizeof val_steps, data_fingerprint(*val)) : 0;
  // Rank 0 alone writes --save and --log and prints --sample-every's samples: one that another
  // rank has and rank 0 lacks would be dropped without a word (rank 0 may have them alone).
  const uint64_t outputs = (o.save.empty() ? 0 : 1) | (o.log.empty() ? 0 : 2) | (o.sample_every > 0 ? 4 : 0);
  uint64_t mine[5] = {fingerprint(bytes, module.size_bytes()), weights, tokens, val_tokens, outputs};
  uint64_t root[5];
  std::memcpy(root, mine, sizeof root);
  comm.broadcast(root, sizeof root, 0);
  // The options, compared one by one: everything that decides which collectives run (evaluation,
  // gradient dumps, checkpoints: a ZeRO-1 run gathers its moments for each), --resume and the step
  // it resumes at (a difference would show only as other weights), and --bucket-mb only where it
  // places the buckets (not in a module with compiled ones). Each one that differs is named, with
  // rank 0's value and (where it differs) this rank's: every rank learns the same list, so that
  // each one's message names them. (These collectives run before the module is compared: ranks
  // of runtimes that differ would fail here, or hang, rather than be told so; every rank runs the
  // same executable.)
  static const char* const given[] = {"not given", "given"};
  static const char* const schedules[] = {"cosine", "constant"};
  static const char* const whole[] = {nullptr};  // a count: printed as a whole number
  const struct {
    const char* name;
    double value;
    const char* const* words;  // the values' words, for an option given or not, or a choice
  } named[] = {{"--steps", double(o.steps), whole},
               {"the step resumed at", double(first_step), whole},
               {"--total-batch (tokens per step)", double(total), whole},
               {"--zero", double(o.zero), whole},
               {"--bucket-mb", compiled_buckets ? 0.0 : o.bucket_mb, nullptr},
               {"--lr", o.schedule.lr, nullptr},
               {"--lr-schedule", o.schedule.kind == "constant" ? 1.0 : 0.0, schedules},
               {"--warmup-steps", double(o.schedule.warmup_steps), whole},
               {"--min-lr-ratio", o.schedule.min_lr_ratio, nullptr},
               {"--weight-decay", o.weight_decay, nullptr},
               {"--beta1", o.beta1, nullptr},
               {"--beta2", o.beta2, nullptr},
               {"--eps", o.eps, nullptr},
               {"--grad-clip", o.grad_clip, nullptr},
               {"--val-data", o.val_data.empty() ? 0.0 : 1.0, given},
               {"--val-every", double(o.val_every), whole},
               {"--val-steps", double(o.val_steps), whole},
               {"--dump-grads", o.dump_grads.empty() ? 0.0 : 1.0, given},
               {"--checkpoint-dir", o.checkpoint_dir.empty() ? 0.0 : 1.0, given},
               {"--checkpoint-every", double(o.checkpoint_every), whole},
               {"--resume", o.resume ? 1.0 : 0.0, given}};
  const size_t n = std::size(named);
  std::vector<double> values(n), at_root(n), differ(n);
  for (size_t i = 0; i < n; ++i) values[i] = named[i].value;
  at_root = values;
  comm.broadcast(at_root.data(), n * sizeof(double), 0);
  bool options_differ = false;
  for (size_t i = 0; i < n; ++i) {
    differ[i] = std::memcmp(&values[i], &at_root[i], sizeof(double)) != 0;
    options_differ = options_differ || differ[i] > 0;
  }
  comm.all_reduce_sum(differ.data(), int64_t(n));
  auto shown = [&](size_t i, double v) {
    char buf[40];
    if (named[i].words == whole) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
      return std::string(buf);
    }
    if (named[i].words) return std::string(named[i].words[v != 0]);
    for (int digits = 6; digits <= 17; ++digits) {  // the fewest that read back as the value
      std::snprintf(buf, sizeof buf, "%.*g", digits, v);
      if (std::strtod(buf, nullptr) == v) break;
    }
    return std::string(buf);
  };
  std::string which;
  for (size_t i = 0; i < n; ++i)
    if (differ[i] > 0)
      which += (which.empty() ? ": " : ", ") + std::string(named[i].name) + " (rank 0: " + shown(i, at_root[i]) +
               (values[i] != at_root[i] ? ", this one: " + shown(i, values[i]) : "") + ")";
  const std::vector<bool> this_one = {mine[0] != root[0], options_differ, mine[1] != root[1], mine[2] != root[2],
                                      mine[3] != root[3], (outputs & ~root[4]) != 0};
  // (`which` names an option wherever some rank's options differ, the only case its words are said.)
  require_ranks_agree(comm, this_one,
                      {"the module (a different executable?)", "the training options" + which,
                       first_step > 0 ? "the weights resumed (checkpoints that differ: a --checkpoint-dir that is not "
                                  "the same folder on every rank?)"
                                : "the initial weights (a different --seed, or --init files that differ)",
                       "the training data (--data: other shards, or shards of other sizes)",
                       "the validation data (--val-data: other shards, or shards of other sizes)",
                       "the outputs (--save, --log or --sample-every, which rank 0 alone writes or prints, given to "
                       "another rank but not to it)"},
                      "data parallel");
}

}  // namespace kiln
