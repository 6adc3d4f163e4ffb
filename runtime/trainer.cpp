#include "runtime/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <thread>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "runtime/batch_tokens.h"
#include "runtime/checkpoint.h"
#include "runtime/cpu/matmul_bf16.h"
#include "runtime/data_loader.h"
#include "runtime/data_parallel.h"
#include "runtime/device/device.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/file_io.h"
#include "runtime/gpu_peak.h"
#include "runtime/params.h"
#include "runtime/rank_agreement.h"
#include "runtime/run_outputs.h"
#include "runtime/stop_signals.h"
#include "runtime/terminal_progress.h"
#include "runtime/token_scan.h"

namespace kiln {
namespace {

// A number as it was typed: the shortest decimal that reads back as the same double (1e-320,
// where %g prints the subnormal as 9.99989e-321).
std::string shortest(double v) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
}

// Model FLOPs per token of a training step: 6 per parameter (forward and backward matrix
// products) plus attention's 12 L C T (the rule of the lecture and of PaLM's MFU). N counts every
// parameter, as llm.c does: the position embeddings (which no product multiplies) and the
// vocabulary's padding rows (the head's product does) too: GPT-2 124M: 0.6% more than nanoGPT's
// count without wpe.
double flops_per_token(const Module& m) {
  const fb::Model& model = *m.fb().model();
  double params = 0;
  for (const fb::Parameter* p : *m.fb().parameters()) params += double(numel(m.buffer(p->value())));
  return 6.0 * params + 12.0 * model.n_layer() * model.n_embd() * double(model.seq_len());
}

// A peak for this process's CPU threads when none is given: threads x 2.5 GHz x the FLOPs per
// cycle of what runs the matrix products: for fp32, two FMA units 16 wide with AVX-512 (64), else
// 8 wide (32); for bf16, oneDNN's AMX tiles (1024) or AVX-512 BF16 dot products (128) where it
// has them. A rough yardstick for the MFU column, labelled as an estimate.
struct CpuPeak {
  double flops;
  std::string how;
};
CpuPeak estimated_cpu_peak(bool bf16) {
  const int bf16_rate = bf16 ? cpu::bf16_flops_per_cycle() : 0;
  const int per_cycle = bf16_rate > 0 ? bf16_rate : __builtin_cpu_supports("avx512f") ? 64 : 32;
  const std::string unit = bf16_rate == 1024 ? "bf16 FLOPs per cycle (AMX)"
                           : bf16_rate > 0   ? "bf16 FLOPs per cycle (AVX-512 BF16)"
                           : bf16            ? "fp32 FLOPs per cycle: with no AMX or AVX-512 BF16 in use, the bf16 "
                                               "products run on fp32 copies"
                                             : "fp32 FLOPs per cycle";
  const int threads = omp_get_max_threads();
  return {double(threads) * 2.5e9 * per_cycle, std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
                                                   " x 2.5 GHz x " + std::to_string(per_cycle) + " " + unit};
}

// `v` rounded to `digits` significant decimal digits, for the log: the nearest double to that.
double significant(double v, int digits) {
  if (!std::isfinite(v) || v == 0) return v;
  char text[32];
  std::snprintf(text, sizeof text, "%.*g", digits, v);
  return std::strtod(text, nullptr);
}

// A signal as a number the ranks add up (1 for a SIGINT, 2^17 for rank 0's closed stdout, 2^34
// for a SIGHUP, 2^51 for a SIGTERM: each above what all 65536 ranks' signals below it sum to),
// and the signal a sum stands for: any SIGTERM wins, then SIGHUP, then SIGPIPE.
double signal_code(int sig) {
  return sig == SIGINT ? 1.0 : sig == SIGPIPE ? 0x1p17 : sig == SIGHUP ? 0x1p34 : sig ? 0x1p51 : 0.0;
}
int signal_of_sum(double sum) {
  return sum >= 0x1p51 ? SIGTERM : sum >= 0x1p34 ? SIGHUP : sum >= 0x1p17 ? SIGPIPE : sum > 0 ? SIGINT : 0;
}

// What differs, when a run resumes, from the run that wrote the checkpoint (its extra_json holds
// that run's --steps and shard sizes), and checkpoints past the one resumed from: said, not
// refused (a longer run, or other data, may be meant).
void note_resume_changes(const std::string& checkpoint, const nlohmann::json& extra, const TrainOptions& o,
                         const DataLoader& data, int64_t step, const nlohmann::json& settings, bool data_said) {
  if (!extra.is_object()) return;
  // Other hyperparameters than the checkpoint's run had (its settings, where it records them).
  if (const auto had = extra.find("settings"); had != extra.end() && had->is_object()) {
    std::string changed;
    auto shown = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
    for (const auto& [flag, value] : settings.items()) {
      // (--seed, on resume, is only the samples' seed: said where this run samples.)
      if (flag == "--seed" && o.sample_every <= 0) continue;
      // (Checkpoints of earlier versions hold the default --total-batch as "B*T*ranks": at their
      // rank count, unknown here, and not compared.)
      if (const auto it = had->find(flag); it != had->end() && *it != value && *it != "B*T*ranks")
        changed += (changed.empty() ? "" : ", ") + flag + " " + shown(value) + " (it had " + shown(*it) + ")";
    }
    if (!changed.empty())
      std::fprintf(stderr, "note: this run's settings differ from those of the run that wrote %s: %s\n",
                   checkpoint.c_str(), changed.c_str());
  }
  if (const auto steps = extra.find("steps"); steps != extra.end() && steps->is_number_integer() &&
                                              steps->get<int64_t>() != o.steps)
    std::fprintf(stderr, "note: --steps %lld, where the run that wrote %s had %lld: the learning-rate schedule is now "
                 "that of %lld steps\n", (long long)o.steps, checkpoint.c_str(), (long long)steps->get<int64_t>(),
                 (long long)o.steps);
  // (Every file's count where the checkpoint has them: those left out differ with B and T.)
  // (Other shards, where the position was found by the shard's name, were said with it; a finished
  // run resumed, a requeued job, reads none.)
  const bool every_file = extra.contains("all_shard_tokens");
  if (const auto counts = extra.find(every_file ? "all_shard_tokens" : "shard_tokens"); counts != extra.end() &&
      counts->is_array() && *counts != nlohmann::json(every_file ? data.all_shard_tokens() : data.shard_tokens()) &&
      !data_said && step < o.steps)
    std::fprintf(stderr, "note: --data is not the data of the run that wrote %s (its shards held other numbers of "
                 "tokens): the run goes on at token %lld of %s\n", checkpoint.c_str(), (long long)data.position(),
                 data.files()[data.shard()].c_str());
  // Later checkpoints (of a run resumed from an older `latest`, or written just before a kill
  // cut the update of `latest`): --keep counts them.
  std::string later;
  const auto all = list_checkpoints(std::filesystem::path(checkpoint).parent_path().string());
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->first > step) later += (later.empty() ? "" : ", ") + it->second;
  if (!later.empty())
    std::fprintf(stderr, "note: %s also holds checkpoints past the one resumed from (%s); --keep counts them\n",
                 std::filesystem::path(checkpoint).parent_path().string().c_str(), later.c_str());
}

// Mean loss of `steps` batches of the validation data through the forward program, averaged
// over ranks. One process ends it where `stopped()` says so between batches (none): a scheduler's
// grace period may be shorter than an evaluation, as sampling's. Ranks finish it (they agree after it).
std::optional<double> evaluate(Executor& ex, DataLoader& val, int64_t steps, Communicator& comm,
                               const std::function<bool()>& stopped) {
  if (comm.world_size() > 1) return comm.all_reduce_sum(mean_forward_loss(ex, val, steps)) / double(comm.world_size());
  struct Stopped {};
  try {
    return mean_forward_loss(ex, val, steps, [&](int64_t) {
      if (stopped()) throw Stopped{};
    });
  } catch (const Stopped&) {
    return std::nullopt;
  }
}

std::string duration(double seconds) {
  char buf[32];
  const long s = long(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

}  // namespace

// CPU ranks on one machine share its CPUs: each takes an equal part of them (at least one
// thread), unless OMP_NUM_THREADS chose or a launcher bound the rank to fewer CPUs already.
// OpenMP threads that outnumber the cores spin against each other: two gpt2-mini ranks on 2 cores
// ran 1.8x slower with 2 threads each than with 1 (bench/ranks_cpu_threads.sh).
void share_cpus(int local_ranks, bool root) {
  if (local_ranks <= 1 || std::getenv("OMP_NUM_THREADS")) return;
  const int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cpus / local_ranks);
  if (omp_get_max_threads() <= share) return;
  omp_set_num_threads(share);
  if (root)
    std::fprintf(stderr, "note: %d ranks share this machine's %d CPUs: %d OpenMP thread%s each (OMP_NUM_THREADS sets "
                 "another count)\n", local_ranks, cpus, share, share == 1 ? "" : "s");
}

double mean_forward_loss(Executor& ex, DataLoader& data, int64_t batches, const std::function<void(int64_t)>& progress) {
  const fb::Model& model = *ex.module().fb().model();
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    next_batch(ex, data, int64_t(model.batch_size()) * model.seq_len(), model.vocab_size());
    sum += ex.run("forward");
    if (progress) progress(i + 1);
  }
  return sum / double(batches);
}

double train(const Module& module, const TrainOptions& o) {
  auto comm = make_communicator(parse_comm_backend(o.comm), module.fb().model()->target()->str());
  return train(module, o, *comm);
}

double train(const Module& module, const TrainOptions& o, Communicator& comm) {
  const fb::Model& model = *module.fb().model();
  const int64_t world = comm.world_size();
  const int rank = comm.rank();
  const bool root = rank == 0;  // the only rank that prints, logs and writes files
  const int64_t B = model.batch_size(), T = model.seq_len();
  const int64_t tokens_per_micro = B * T * world;
  const int64_t total = o.total_batch ? o.total_batch : tokens_per_micro;
  if (o.steps <= 0) throw Error("--steps: must be at least 1");
  // Before anything is allocated on the GPUs: what the GPU path's data parallelism cannot do.
  const bool cuda = model.target() && model.target()->str() == "cuda";
  if (world > 1 && cuda && !comm.device_memory() && !devices_host_addressable())
    throw Error(module.source() + ": data parallel: the gradients of a cuda module are in GPU memory, which " +
                comm.describe() + " cannot reduce; use --comm nccl (the default under a launcher)");
  if (total % tokens_per_micro != 0) {
    const int64_t below = total / tokens_per_micro * tokens_per_micro, above = below + tokens_per_micro;
    throw Error("--total-batch: " + std::to_string(total) + " is not a multiple of B*T*ranks = " +
                std::to_string(tokens_per_micro) + " (" +
                (below > 0 ? "the nearest are " + std::to_string(below) + " and " : "the smallest is ") +
                std::to_string(above) + ")");
  }
  const int64_t accum = total / tokens_per_micro;
  // The settings a checkpoint records, so that a resume with others says so (flag -> value).
  const nlohmann::json settings = {{"--lr", o.schedule.lr},
                                   {"--lr-schedule", o.schedule.kind},
                                   {"--warmup-steps", o.schedule.warmup_steps},
                                   {"--min-lr-ratio", o.schedule.min_lr_ratio},
                                   {"--weight-decay", o.weight_decay},
                                   {"--beta1", o.beta1},
                                   {"--beta2", o.beta2},
                                   {"--eps", o.eps},
                                   {"--grad-clip", o.grad_clip},
                                   // (tokens per step however given: the default's grows with the ranks)
                                   {"--total-batch", total},
                                   {"B*T (the module's)", B * T},
                                   // (a resumed run's weights are the checkpoint's: its samples' seed)
                                   {"--seed", o.seed}};
  // The hyperparameters reach the step as 32-bit floats: one that overflows would become an infinity.
  for (const auto& [flag, v] : {std::pair{"--lr", o.schedule.lr}, {"--beta1", o.beta1}, {"--beta2", o.beta2},
                                {"--eps", o.eps}, {"--weight-decay", o.weight_decay}, {"--grad-clip", o.grad_clip}})
    if (!std::isfinite(v) || !std::isfinite(float(v)))
      throw Error(std::string(flag) + ": " + shortest(v) + " does not fit a 32-bit float (the step computes in them)");
  // A positive one that rounds to 0 there would train nothing while the log shows it.
  for (const auto& [flag, v] : {std::pair{"--lr", o.schedule.lr}, {"--weight-decay", o.weight_decay}})
    if (v > 0 && float(v) == 0)
      throw Error(std::string(flag) + ": " + shortest(v) + " is 0 as a 32-bit float (the step computes in them)");
  // AdamW divides by sqrt(v_hat) + eps (v is 0 where a gradient always is) and by 1 - beta^t.
  if (!(float(o.eps) > 0)) throw Error("--eps: must be positive as a 32-bit float (the step computes in them)");
  for (const auto& [flag, beta] : {std::pair{"--beta1", o.beta1}, {"--beta2", o.beta2}})
    if (!(float(beta) >= 0 && float(beta) < 1))
      throw Error(std::string(flag) + ": must be in [0, 1) as a 32-bit float (AdamW divides by 1 - beta^t)");
  // Ctrl-C, SIGTERM or SIGHUP: finish the step, checkpoint, save, and exit 128 + signal (stop_signals.h).
  // A step of several micro-steps stops at the end of the micro-step instead (the ranks agree
  // after each), and is left undone (the weights and moments are those of the step before;
  // --resume redoes it): a scheduler's grace period may be shorter than a step.
  // Installed before any folder is made: one that comes before the first step ends the run there,
  // and the folders it made go with it.
  const bool cut_steps = accum > 1;
  // What a stopped run still writes (also said when its stdout fails).
  const std::string what_is_kept = !o.checkpoint_dir.empty() && !o.save.empty() ? ", with a checkpoint and --save"
                                   : !o.checkpoint_dir.empty()                 ? ", with a checkpoint"
                                   : !o.save.empty()                           ? ", with --save"
                                                                               : "";
  const std::string what_stops =
      std::string(cut_steps ? "stopping at the end of this micro-step (a step cut short is left undone)"
                            : "stopping after this step") +
      what_is_kept;
  // What the handler says: before the first step (where one process stops at once; ranks go on
  // to the first step's end, or its first micro-step's), during the first step, and after.
  const char* in_first_step = cut_steps ? "stopping at the end of this micro-step: the first step is left undone, and "
                                          "nothing is written"
                                        : what_stops.c_str();
  // Ranks before the first step: no step is "this" one yet.
  const std::string before_first = cut_steps ? in_first_step : "stopping after the first step" + what_is_kept;
  // (and the last: while --save waits for a FIFO's reader, after training)
  StopSignals signals(rank, int(world),
                      {world == 1 ? "stopping before the first step" : before_first.c_str(), in_first_step, what_stops.c_str(),
                       "no longer waiting for a reader of --save's pipe: the weights are not written"},
                      /*keep_on_broken_pipe=*/true);
  MadeFolders made;
  check_output_paths(o, root, made);
  signals.remove_on_signal(made.folders);
  for (const char* p : {"micro_step", "optimizer_step"})
    if (!module.program(p))
      throw Error(module.source() + ": has no '" + std::string(p) + "' program (not a training module)");

  if (!(o.bucket_mb > 0)) throw Error("--bucket-mb: must be positive");
  // Resume: the latest checkpoint, when there is one, gives the weights (--init is not read then).
  if (o.resume && o.checkpoint_dir.empty()) throw Error("--resume: needs --checkpoint-dir");
  // A damaged latest checkpoint (or `latest` itself) is refused; the error says which older one
  // is whole, and how to go on from it.
  auto or_older = [&](const Error& e, const std::string& damaged) -> Error {
    const auto older = newest_whole_checkpoint(o.checkpoint_dir, damaged);
    if (!older) return e;
    const std::string name = std::filesystem::path(*older).filename().string();
    return Error(std::string(e.what()) + "; " + *older + " is whole: to go on from it, write " + name + " into " +
                 (std::filesystem::path(o.checkpoint_dir) / "latest").string());
  };
  std::optional<std::string> latest;
  try {
    if (o.resume) latest = latest_checkpoint(o.checkpoint_dir);
  } catch (const Error& e) {
    throw or_older(e, "");
  }
  const bool initializing = !o.init.empty() && !latest;
  if (initializing && root && !o.init_as_given.empty())
    std::fprintf(stderr, "note: --init %s: reads %s\n", o.init_as_given.c_str(), o.init.c_str());
  if (initializing) check_weights_file(o.init);  // before the executor starts a cuda module's GPU
  DataLoader loader(o.data, B, T, rank, int(world));
  // The programs it runs; the sampler's only for --sample-every (the arena holds the largest
  // program's activations, and their key/value caches may be larger than a step's).
  std::vector<std::string> programs{"micro_step", "optimizer_step"};
  if (module.program("forward")) programs.push_back("forward");
  if (o.sample_every < 0) throw Error("--sample-every: must not be negative");
  // Rank 0 alone samples, so only its arena holds the sampler's programs.
  const bool sampling = o.sample_every > 0 && root;
  if (sampling) {
    if (!module.program("logits"))
      throw Error(module.source() + ": has no 'logits' program to sample with (compile it again with this kilnc)");
    if (o.sample_prompt.empty()) throw Error("--sample-prompt: needs at least one token");
    check_sample_size(int64_t(o.sample_prompt.size()), o.sample, "--sample-count, --sample-tokens: ");
    programs.push_back("logits");
    if (module.program("decode")) programs.push_back("decode");
    for (const char* prefill : kPrefillPrograms)
      if (module.program("decode") && module.program(prefill)) programs.push_back(prefill);
  }
  if (o.zero != 0 && o.zero != 1) throw Error("--zero: " + std::to_string(o.zero) + " is not 0 or 1");
  // Data parallel: the gradients and values in bucket order (reduced in place), and under ZeRO-1
  // only the AdamW moments of the elements this rank updates.
  const int64_t bucket_bytes = int64_t(o.bucket_mb * 1e6);
  if (!cuda && world > 1) share_cpus(ranks_on_this_machine(comm), root);
  Executor ex(module, programs, world > 1 ? data_parallel_state(module, int(world), rank, o.zero, bucket_bytes) : StatePlan{});
  ex.enable_profiling(o.profile);
  // (Also clears gradients and AdamW state.) --init's weights replace every value.
  if (initializing) clear_parameters(ex);
  else init_parameters(ex, o.seed);
  if (initializing) load_finite_parameters(ex, o.init, "every loss would be NaN");
  ex.refresh_compute_copies();
  DataParallel dp(ex, comm, o.zero, bucket_bytes);

  const bool gpu = ex.device_name() != "cpu";
  const std::string precision = module.fb().model()->precision() ? module.fb().model()->precision()->str() : "fp32";
  // Resume: weights, AdamW state, the step and the data position from the latest checkpoint.
  int64_t first_step = 0;
  std::string resumed_from;  // the checkpoint, when one was loaded
  // Checkpoints kept: --keep, else the number the resumed run kept (a resume must not prune
  // those a `--keep 0` run was told to keep), else 3.
  int keep = o.keep >= 0 ? o.keep : 3;
  bool keep_known = o.keep >= 0;  // (given, or the checkpoint's: else a finished run prunes none)
  // Log lines not written yet (the checkpoint's, or this run's after a write failed): written
  // before the next line, and kept in the checkpoint when the run stops.
  std::vector<std::string> log_pending;
  if (o.resume) {
    if (latest) {
      TrainingState st;
      try {
        st = load_checkpoint(*latest, ex);
      } catch (const Error& e) {
        if (is_whole_checkpoint(*latest)) throw;  // (another model's: the older ones are too)
        throw or_older(e, *latest);
      }
      // The rank count decides which tokens each step reads; --zero does not change the file
      // (a ZeRO-1 run gathers its moments before it saves), so either may resume the other's.
      if (st.world_size != int(world))
        throw Error(*latest + ": written by " + std::to_string(st.world_size) + " rank(s); this run has " +
                    std::to_string(world) + " rank(s) (which decide the tokens each step reads): run it with " +
                    std::to_string(st.world_size) + ", or start afresh from its weights with --init " +
                    (std::filesystem::path(o.checkpoint_dir) / "latest").string() + " and another --checkpoint-dir");
      // A finished run resumed with the same command (a requeued job) has nothing left to do;
      // one past --steps was asked for fewer steps than it already has.
      if (st.step > o.steps)
        throw Error(*latest + ": is at step " + std::to_string(st.step) + ", past --steps " +
                    std::to_string(o.steps) + " (give more steps to go on training)");
      const auto extra = nlohmann::json::parse(st.extra_json, nullptr, false);
      // The position is the checkpoint's, so a bad one is said of it (other --data, or a
      // checkpoint that was edited).
      size_t shard = size_t(std::min<uint64_t>(st.data_shard, SIZE_MAX));
      int64_t position = int64_t(std::min<uint64_t>(st.data_position, INT64_MAX));
      // With the same files, the shard is found by its index among all of them: another B, T or
      // rank count (a recompiled module) leaves other short files out. Where the rest of the file
      // holds no step of this size, the run goes on at the next shard's start.
      const auto file = extra.is_object() ? extra.find("data_file") : extra.end();
      const auto file_name = extra.is_object() ? extra.find("data_file_name") : extra.end();
      std::string data_note;  // said once the position is found in this --data
      // Whether the rest of a shard from `pos` holds no step of this module's size any more.
      const auto holds_no_step = [&](size_t s, int64_t pos) {
        return pos > loader.shard_tokens()[s] - loader.tokens_per_call() - 1;
      };
      bool same_data = file != extra.end() && file->is_number_unsigned() && extra.contains("all_shard_tokens") &&
                       extra["all_shard_tokens"] == nlohmann::json(loader.all_shard_tokens());
      if (file_name != extra.end() && file_name->is_string()) {
        // The shard the checkpoint was reading, by its name (the same file however spelled): the
        // files may have changed with the same token counts, and an index would name another.
        // It is looked for among every file --data matched: one this module leaves out as too
        // short for its batch is among them, and the run goes on at the next shard's start.
        const std::string name = file_name->get<std::string>();
        const auto& files = loader.files();
        const auto& all_files = loader.all_files();
        std::optional<size_t> named;  // its index among every file matched
        for (size_t f = 0; f < all_files.size() && !named; ++f) {
          std::error_code ec;
          if (all_files[f] == name || std::filesystem::equivalent(all_files[f], name, ec)) named = f;
        }
        if (same_data) same_data = named == file->get<size_t>();
        if (!same_data) {
          std::string where;
          if (named) {
            const auto [at, kept] = loader.shard_from_file(*named);  // (the next kept one, where left out)
            shard = at;
            if (!kept) {
              position = 0;
              where = "it was reading " + one_line(all_files[*named]) + ", which holds no step of " +
                      std::to_string(loader.tokens_per_call() + 1) +
                      " tokens for this module: it goes on at the start of " + one_line(files[shard]);
            } else {
              where = "it goes on in " + one_line(files[shard]) + ", the shard it was reading";
              if (holds_no_step(shard, position)) {  // (as below)
                shard = (shard + 1) % files.size();
                position = 0;
                where += ", at the start of " + one_line(files[shard]) + " (the rest of it holds no step)";
              } else {
                where += ", at token " + std::to_string(position);
              }
            }
          } else {
            where = one_line(name) + ", the shard it was reading, is not among them: it goes on at shard " +
                    std::to_string(shard) + (shard < files.size() ? " (" + one_line(files[shard]) + ")" : "") +
                    ", at token " + std::to_string(position);
          }
          if (root && st.step < o.steps)
            data_note = "note: " + *latest + ": --data matches other shards than the run that wrote it read; " + where;
        }
      }
      if (same_data) {
        const auto [found, same_file] = loader.shard_from_file(file->get<size_t>());
        shard = found;
        if (!same_file || holds_no_step(shard, position)) {
          if (same_file) shard = (shard + 1) % loader.files().size();
          if (root && st.step < o.steps)
            std::fprintf(stderr, "note: %s: %s holds no step of %lld tokens for this module; the run goes on at the "
                         "start of %s\n", latest->c_str(), same_file ? "the rest of its shard" : "its shard",
                         (long long)loader.tokens_per_call() + 1, loader.files()[shard].c_str());
          position = 0;
        }
      }
      try {
        loader.seek(shard, position);
      } catch (const Error& e) {
        // What the writing run read, where the checkpoint says: the way on is its --data again.
        std::string had;
        if (const auto all = extra.is_object() ? extra.find("all_shard_tokens") : extra.end();
            all != extra.end() && all->is_array())
          had = "; give the --data of the run that wrote it (" + std::to_string(all->size()) + " shard" +
                (all->size() == 1 ? "" : "s") + ")";
        throw Error(*latest + ": its data position (shard " + std::to_string(st.data_shard) + ", token " +
                    std::to_string(st.data_position) + ") is not in this run's --data: " + e.what() + had);
      }
      if (!data_note.empty()) std::fprintf(stderr, "%s\n", data_note.c_str());
      first_step = st.step;
      resumed_from = *latest;
      // A checkpoint folder that cannot take files: refused where the run has steps left to save.
      if (root && first_step < o.steps && !made.unwritable.empty()) throw Error(made.unwritable);
      // The BLAS (fp32) and oneDNN (bf16) split a product's work among the threads they have,
      // and another thread count rounds it otherwise: OpenBLAS's fp32 products of gpt2-mini differ
      // in the last bits between 1 and 2 threads.
      const auto saved = extra.find("cpu_threads");  // end() also when the text is no JSON object
      if (root && !gpu && first_step < o.steps && saved != extra.end() && saved->is_number_integer() &&
          saved->get<int>() != omp_get_max_threads())
        std::fprintf(stderr, "kiln: warning: %s was written by a run with %d CPU thread(s), this one has %d: its "
                     "matrix products round differently, so it is not bitwise the run it resumes (OMP_NUM_THREADS=%d "
                     "would be)\n", latest->c_str(), saved->get<int>(), omp_get_max_threads(), saved->get<int>());
      if (root) std::fprintf(stderr, "resuming from %s at step %lld%s\n", latest->c_str(), (long long)first_step,
                             st.zero_stage == o.zero ? "" : st.zero_stage ? " (written with --zero 1)" : " (written with --zero 0)");
      if (root && first_step == o.steps)
        std::fprintf(stderr, "the run is already at --steps %lld: nothing left to train\n", (long long)o.steps);
      if (root && !o.init.empty())
        std::fprintf(stderr, "note: --init %s is not used: the weights are the checkpoint's\n",
                     (o.init_as_given.empty() ? o.init : o.init_as_given).c_str());
      if (root) note_resume_changes(*latest, extra, o, loader, first_step, settings, !data_note.empty());
      if (const auto had = extra.is_object() ? extra.find("keep") : extra.end();
          had != extra.end() && had->is_number_integer() && had->get<int64_t>() >= 0 && had->get<int64_t>() <= INT32_MAX) {
        const int before = int(had->get<int64_t>());
        auto count = [](int k) { return k == 0 ? std::string("0 (all)") : std::to_string(k); };
        keep_known = true;
        if (o.keep < 0) keep = before;
        else if (root && o.keep != before && first_step < o.steps)
          std::fprintf(stderr, "note: --keep %s, where the run that wrote %s kept %s: %s\n", count(o.keep).c_str(),
                       latest->c_str(), count(before).c_str(),
                       o.keep == 0 ? "this run deletes none" : "older checkpoints past the newest ones are deleted as it saves");
      }
      // Log lines the run that wrote it could not write (a full disk): this run writes them first.
      // They go into the log as they are: each must be one of the records a run writes (one line of
      // JSON with a whole "step"), or a checkpoint edited by hand would put another run's lines, or
      // no log's, into it (which kiln-inspect plot then refuses).
      if (const auto lines = extra.find("log_pending"); root && lines != extra.end()) {
        if (!lines->is_array())
          throw Error(*latest + ": header: extra.log_pending is not an array of log lines (a checkpoint edited by hand?)");
        for (size_t i = 0; i < lines->size(); ++i) {
          const auto& line = (*lines)[i];
          const std::string text = line.is_string() ? line.get<std::string>() : std::string();
          const std::optional<int64_t> step = log_record_step(text);
          if (!line.is_string() || text.find_first_of("\r\n") != std::string::npos || !step || *step < 0)
            throw Error(*latest + ": header: extra.log_pending[" + std::to_string(i) + "] '" +
                        one_line(clipped(line.is_string() ? text : line.dump())) +
                        "' is not a training log line (one JSON record with \"step\"; a checkpoint edited by hand?)");
          log_pending.push_back(text);
        }
        if (!o.log.empty()) drop_logged_lines(o.log, log_pending);
        if (o.log.empty() && !log_pending.empty()) {
          std::fprintf(stderr, "note: %s holds %zu log line(s) its run could not write; without --log they are not "
                       "written\n", latest->c_str(), log_pending.size());
          log_pending.clear();
        }
      }
    } else if (root) {
      std::fprintf(stderr, "no checkpoint in %s yet: starting from step 0\n", o.checkpoint_dir.c_str());
    }
  }
  if (!o.dump_grads.empty() && first_step > 0)
    throw Error("--dump-grads: writes step 0's gradients, but this run resumes at step " + std::to_string(first_step) +
                " from " + resumed_from);
  if (o.checkpoint_every < 0 || (o.checkpoint_every > 0 && o.checkpoint_dir.empty()))
    throw Error("--checkpoint-every: needs --checkpoint-dir");
  if (o.val_every > 0 && o.val_data.empty()) throw Error("--val-every: needs --val-data");
  std::unique_ptr<DataLoader> val;
  int64_t val_steps = o.val_steps;
  if (!o.val_data.empty()) {
    if (!module.program("forward")) throw Error(module.source() + ": has no 'forward' program to evaluate with");
    if (o.val_steps <= 0) throw Error("--val-steps: must be at least 1");
    val = std::make_unique<DataLoader>(o.val_data, B, T, rank, int(world));
    // More batches than the data holds would read some twice: one pass is all there is.
    if (val_steps > val->batches_per_pass()) {
      val_steps = val->batches_per_pass();
      if (root)
        std::fprintf(stderr, "note: --val-steps %lld: the validation data holds %lld batch%s of B x T%s; each evaluation "
                     "reads those\n", (long long)o.val_steps, (long long)val_steps, val_steps == 1 ? "" : "es",
                     world > 1 ? " on each rank" : "");
    }
    if (root && !val->skipped().empty()) std::fprintf(stderr, "note: --val-data: %s\n", val->skipped_note().c_str());
    // Allowed (a smoke test), but then the validation loss is no measure of generalisation.
    for (const std::string& v : val->files())
      for (const std::string& t : loader.files())
        if (root && same_place(v, t)) {
          std::fprintf(stderr, "note: --val-data: %s is also training data (--data %s): the validation loss is "
                       "measured on data the model trains on\n", v.c_str(), t.c_str());
          break;
        }
    check_resident_tokens(*val, model.vocab_size(), val_steps);  // each evaluation reads the same batches
  }
  if (root && !loader.skipped().empty()) std::fprintf(stderr, "note: --data: %s\n", loader.skipped_note().c_str());
  check_resident_tokens(loader, model.vocab_size(), micro_steps_left(o.steps, first_step, accum));
  // The other shards the run will read are checked in the background while it trains, by one
  // process per machine (its ranks read the same files): a bad token ends the run at the next step.
  std::unique_ptr<TokenScan> scan;
  if (comm.local_rank() == 0)
    scan = std::make_unique<TokenScan>(shards_to_scan(loader, first_step, o.steps, accum, val.get(), val_steps),
                                       model.vocab_size());
  if (root) check_outputs_spare_inputs(o, loader, val.get());
  if (root) check_output_space(o, module, first_step, keep);
  if (world > 1) check_ranks_agree(comm, module, o, total, first_step, ex, loader, val.get(), val_steps,
                                   dp.compiled_buckets());
  // A kill between the last save and its pruning leaves keep + 1 checkpoints; with steps left the
  // next save prunes them, and a finished run requeued does so here, once every check passed. Not
  // where it cannot write, nor checkpoints past the one resumed from (a `latest` rewound by hand).
  if (root && !resumed_from.empty() && first_step == o.steps && keep_known && made.unwritable.empty()) {
    const auto all = list_checkpoints(o.checkpoint_dir);
    if (!all.empty() && all.front().first <= first_step) try {
      const std::string name = std::filesystem::path(resumed_from).filename().string();
      if (const int removed = prune_checkpoints(o.checkpoint_dir, name, keep, ", the latest, kept by --keep " + std::to_string(keep)))
        std::fprintf(stderr, "deleted %d old checkpoint%s in %s past --keep %d\n", removed, removed == 1 ? "" : "s",
                     o.checkpoint_dir.c_str(), keep);
    } catch (const Error& e) {  // (nothing to train: the run still ends well)
      std::fprintf(stderr, "kiln: warning: %s\n", e.what());
    }
  }

  // The log opens at its first line (checked writable at the start): a run that fails before
  // its first step leaves no empty log behind.
  LogFile log(o.log);
  const bool logging = !o.log.empty() && root;
  // Why a line could not be written: the run stops as a signal stops it, after this step (one
  // process) or the next (ranks agree on it in that step's reduction).
  std::string log_failure;
  bool stdout_failed = false;  // rank 0: its progress lines could not be written
  int stdout_error = 0;        // why (EPIPE: the reader is gone)
  auto pending_text = [&] {
    std::string lines;
    for (const std::string& line : log_pending) lines += (lines.empty() ? "" : "\n") + line;
    return lines;
  };
  // A run resumed at its end (nothing left to train) still owes the lines its checkpoint kept.
  if (logging && first_step == o.steps && !log_pending.empty()) {
    if (const int error = log.append(pending_text()))
      throw Error("--log: " + o.log + ": writing the " + std::to_string(log_pending.size()) + " line(s) " + resumed_from +
                  " kept failed: " + log.describe(error));
    std::fprintf(stderr, "wrote the %zu log line(s) %s kept\n", log_pending.size(), resumed_from.c_str());
    log_pending.clear();
  }
  // A fresh run appends too (its first line says so, for kiln-inspect plot): say so.
  if (logging && resumed_from.empty()) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(o.log, ec) && std::filesystem::file_size(o.log, ec) > 0 && !ec)
      std::fprintf(stderr, "note: --log %s already holds an earlier run's lines; this run's follow them (kiln-inspect "
                   "plot draws each run apart)\n", o.log.c_str());
  }
  // A run resumed from a checkpoint older than the log's last record (`latest` pointed back, or
  // the newest one damaged) trains steps the log holds already: say so.
  if (logging && !resumed_from.empty() && first_step < o.steps) {
    const int64_t last = last_logged_step(o.log);
    const int64_t redone = std::min(last, o.steps - 1);  // the last step logged twice
    if (redone >= first_step)
      std::fprintf(stderr, "note: --log %s already holds the records of %lld step(s) this run trains again (\"step\": "
                   "%lld to %lld); the new ones follow them (kiln-inspect plot keeps each step's last)\n", o.log.c_str(),
                   (long long)(redone - first_step + 1), (long long)first_step, (long long)redone);
    // One that ends before the checkpoint's step (runs since trained with another --log or none)
    // lacks those steps' records, less the lines the checkpoint kept, which go in first.
    int64_t held = last;
    for (const std::string& line : log_pending)  // (each has its step: checked as the checkpoint was read)
      held = std::max(held, log_record_step(line).value_or(held));
    if (held >= 0 && held < first_step - 1)  // (not held + 1: a log's last "step" may be INT64_MAX)
      std::fprintf(stderr, "note: --log %s ends at \"step\" %lld, and this run goes on at %lld: it holds no records "
                   "of steps %lld to %lld (trained with another --log or none)\n", o.log.c_str(), (long long)held,
                   (long long)first_step, (long long)(held + 1), (long long)(first_step - 1));
  }
  LrSchedule schedule = o.schedule;
  schedule.total_steps = o.steps;
  if (root && schedule.warmup_steps > o.steps)
    std::fprintf(stderr, "note: --warmup-steps %lld is more than --steps %lld: the learning rate rises to %.3g at the "
                 "last step, never to --lr %.3g\n", (long long)schedule.warmup_steps, (long long)o.steps,
                 learning_rate(schedule, o.steps - 1), schedule.lr);
  ex.set_hyper("beta1", float(o.beta1));
  ex.set_hyper("beta2", float(o.beta2));
  ex.set_hyper("eps", float(o.eps));
  ex.set_hyper("weight_decay", float(o.weight_decay));
  ex.set_hyper("max_norm", float(o.grad_clip));
  // Each micro-step contributes loss / (accum * world): the sum over ranks is then the average.
  ex.set_hyper("loss_weight", float(1.0 / double(accum * world)));

  // A signal during the start (loading, checks): nothing trained, nothing to save. One after
  // this, in the first step (whose start the next line announces), is the loop's.
  if (world == 1 && signals.requested()) {
    if (signals.keep_folders()) made.folders.clear();  // (gone: a folder there now is another run's)
    std::fprintf(stderr, "%s: stopped before the first step\n", signal_name(signals.requested()));
    throw Interrupted{signals.requested()};
  }
  signals.phase(1);
  const int64_t every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.steps / 50);
  if (root && world > 1)
    std::fprintf(stderr, "data parallel: rank %d of %lld over %s; %s\n", rank, (long long)world,
                 comm.describe().c_str(), dp.describe().c_str());
  // Options of data parallelism, given to one process: said rather than silently unused.
  if (world == 1 && o.zero == 1)
    std::fprintf(stderr, "note: --zero 1 has no effect in one process: ZeRO-1 splits the AdamW moments between ranks\n");
  if (world == 1 && o.bucket_mb_given)
    std::fprintf(stderr, "note: --bucket-mb has no effect in one process: buckets are the pieces ranks average the gradients in\n");
  if (root && world > 1 && o.bucket_mb_given && dp.compiled_buckets())
    std::fprintf(stderr, "note: --bucket-mb is not used: this module's buckets were placed by kilnc (kilnc --bucket-mb sets them)\n");
  int64_t data_tokens = 0;
  for (int64_t n : loader.shard_tokens()) data_tokens += n;
  const std::string data = std::to_string(loader.files().size()) + (loader.files().size() == 1 ? " shard, " : " shards, ") +
                           std::to_string(data_tokens) + " tokens";
  const bool training = first_step < o.steps;  // (a finished run resumed again has nothing to do)
  if (root && training) {
    const std::string per_step = world == 1 ? std::to_string(tokens_per_micro) + " tokens per step"
                                            : std::to_string(B * T) + " tokens on each of " + std::to_string(world) +
                                                  " ranks: " + std::to_string(total) + " tokens per step";
    std::fprintf(stderr, "training %s on %s: %lld step%s, B=%lld T=%lld, %lld micro-step(s) of %s; data: %s\n",
                 module.source().c_str(), ex.device_name().c_str(), (long long)o.steps, o.steps == 1 ? "" : "s",
                 (long long)B, (long long)T, (long long)accum, per_step.c_str(), data.c_str());
  }
  const double step_flops = flops_per_token(module) * double(total);
  // Each rank's peak (its GPU, or its CPU threads), times the ranks: without --peak-tflops, a CPU
  // estimate or a known GPU's datasheet rate (else the H100's).
  const CpuPeak cpu_peak = estimated_cpu_peak(precision == "bf16");
  const std::optional<GpuPeak> gpu_peak = gpu ? nominal_gpu_peak(ex.device_name(), precision == "bf16") : std::nullopt;
  const double peak = double(world) * (o.peak_tflops > 0 ? o.peak_tflops * 1e12
                                       : gpu             ? (gpu_peak ? gpu_peak->flops : 989e12)
                                                         : cpu_peak.flops);
  double loss = 0, elapsed = 0, first_dt = 0;  // (first_dt: this run's first step, for the ETA)
  // The time evaluations, samples and checkpoints took, and how many there were: the ETA counts
  // those still to come at their mean (a --val-every 10 whose evaluation takes as long as 10
  // steps would otherwise make every ETA half the time left).
  struct Periodic {
    double seconds = 0;
    int64_t count = 0;
    void took_since(std::chrono::steady_clock::time_point t) {
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      ++count;
    }
    // (`guess`: one's seconds until one has been timed.)
    double left(int64_t n, double guess = 0) const { return (count > 0 ? seconds / double(count) : guess) * double(n); }
  } evals, samplings, checkpoints;
  // The checkpoint of `steps` done, whose next batch is at `shard`, `position` (rank 0 writes it;
  // every rank gathers a ZeRO-1 run's moments).
  int64_t checkpointed = resumed_from.empty() ? -1 : first_step;
  std::string checkpoint_written;  // the last this run wrote (rank 0): it holds the weights --save gets
  // The weights to --save. A FIFO is written once its reader comes, however late (a `cat`
  // started after the run's end gets the weights); a signal meanwhile gives up waiting, and at
  // the run's end (`last`) ends the run as that signal (elsewhere the error says it).
  auto save_weights = [&](bool last) {
    const int before = signals.requested();
    const bool fifo = is_fifo(o.save);
    const int was = fifo ? signals.phase(3) : 0;
    const int reader = fifo ? wait_for_reader(o.save, [&] { return signals.requested() != before; }) : -1;
    const int error = errno;
    if (fifo) signals.phase(was);
    if (fifo && reader < 0) {
      if (signals.requested() == before)
        throw Error("--save: " + o.save + ": not written: cannot open for writing: " + std::strerror(error));
      const std::string why = "--save: " + o.save + ": not written: " + signal_name(signals.requested()) +
                              " came before a reader of the pipe";
      if (!last) throw Error(why);
      std::fprintf(stderr, "kiln: %s\n", why.c_str());
      throw Interrupted{signals.requested()};
    }
    try {
      save_parameters(ex, "--save", o.save);
    } catch (...) {
      if (reader >= 0) ::close(reader);
      throw;
    }
    if (reader >= 0) ::close(reader);
  };
  auto write_checkpoint = [&](int64_t steps, size_t shard, int64_t position) {
    WholeMoments moments = dp.gather_optimizer_state();  // ZeRO-1: gathered to rank 0 for the checkpoint only
    // Rank 0 tells the others whether its write worked, so that a failed one stops every rank at
    // once, each saying why (they would otherwise find rank 0 gone in the next collective).
    auto tell_ranks = [&](bool ok) {
      if (world == 1) return ok;
      char flag = ok ? 1 : 0;
      comm.broadcast(&flag, 1, 0);
      return flag != 0;
    };
    if (!root) {
      if (!tell_ranks(true))
        throw Error("data parallel: rank 0 could not write the checkpoint of step " + std::to_string(steps) +
                    "; stopped after step " + std::to_string(steps) + " of " + std::to_string(o.steps) +
                    " (rank 0 says why)");
      checkpointed = steps;
      return;
    }
    try {
      TrainingState st;
      st.step = steps;
      st.data_shard = shard;
      st.data_position = position;
      st.rng_state = o.seed;  // training draws no random numbers; the seed is kept for the record
      st.world_size = int(world);
      st.zero_stage = o.zero;
      // What a resumed run compares with its own (note_resume_changes), and the log lines it owes.
      nlohmann::json extra = {{"steps", o.steps},
                              {"settings", settings},
                              {"keep", keep},
                              {"shard_tokens", loader.shard_tokens()},
                              {"data_file", loader.file_index(shard)},
                              {"data_file_name", loader.files()[shard]},
                              {"all_shard_tokens", loader.all_shard_tokens()}};
      if (!gpu) extra["cpu_threads"] = omp_get_max_threads();
      if (!log_pending.empty()) extra["log_pending"] = log_pending;
      st.extra_json = extra.dump();
      made.keep_lock(o.checkpoint_dir);
      const std::string path = save_checkpoint(o.checkpoint_dir, ex, st, keep, moments);
      std::fprintf(stderr, "saved checkpoint %s (step %lld)\n", path.c_str(), (long long)steps);
      checkpoint_written = path;
    } catch (const std::exception& failed) {  // (kiln::Error: a full disk; or memory ran out)
      tell_ranks(false);
      const std::string error = dynamic_cast<const std::bad_alloc*>(&failed) ? "out of memory" : failed.what();
      // The run stops here; its weights still go to --save, which may lie on another file
      // system, and the message says where --resume would go on.
      std::optional<std::string> kept;
      try {
        kept = latest_checkpoint(o.checkpoint_dir);
      } catch (const Error&) {  // (a `latest` that cannot be read counts as none here)
      }
      std::string what = error + "; stopped after step " + std::to_string(steps) + " of " +
                         std::to_string(o.steps) + ", and " +
                         (kept ? "the latest checkpoint is " + *kept + " (--resume goes on from there)"
                               : std::string("no checkpoint was written"));
      if (!o.save.empty()) {
        try {
          save_weights(false);
          what += "; saved " + o.save + " (the weights after step " + std::to_string(steps) + ")";
        } catch (const Error& s) {
          what += "; saving failed too: " + std::string(s.what());  // ("--save: FILE: ...")
        }
      }
      if (!log_failure.empty()) what += "; and before it " + log_failure;  // (the log's, which stopped the run)
      throw Error(what);
    }
    tell_ranks(true);
    checkpointed = steps;
  };
  // "; checkpoint ckpt_N written: ...", or what a run without a checkpoint folder could do.
  auto where_stopped = [&] {
    return o.checkpoint_dir.empty() ? std::string(" (no --checkpoint-dir: a run with one can go on with --resume)")
                                    : "; checkpoint " + latest_checkpoint(o.checkpoint_dir).value_or("?") +
                                          " written: the same command with --resume goes on from there";
  };
  // The data failed in step + 1, which began at (shard, position): the finished steps' checkpoint
  // and --save are written, then the error says where the run stopped.
  auto stop_for_data = [&](int64_t step, size_t shard, int64_t position, const std::string& error) {
    std::string what = error + "; stopped in step " + std::to_string(step + 1) + " of " + std::to_string(o.steps);
    if (step == first_step) throw Error(what + (resumed_from.empty() ? " (nothing was trained)" : ""));
    if (!o.checkpoint_dir.empty()) {
      if (checkpointed != step) write_checkpoint(step, shard, position);
      what += "; checkpoint " + latest_checkpoint(o.checkpoint_dir).value_or("?") +
              " written (--resume goes on from there once the data is back)";
    }
    if (!o.save.empty()) {
      save_weights(false);
      what += "; saved " + o.save + " (the weights after step " + std::to_string(step) + ")";
    }
    throw Error(what);
  };
  int interrupted = 0;
  int64_t profiled_from = first_step + 1, last_started = first_step;  // 1-based steps
  for (int64_t step = first_step; step < o.steps; ++step) {
    last_started = step + 1;
    // The run's first step warms up (first touch of the arena, threads, library heuristics, graph
    // capture): --profile's table is of the steps after it, where there are any.
    if (o.profile && step == first_step + 1 && o.steps > first_step + 1) {
      ex.reset_profile();
      profiled_from = step + 1;
    }
    if (scan && !scan->error().empty()) {
      if (world > 1) throw Error(scan->error());
      stop_for_data(step, loader.shard(), loader.position(), scan->error());
    }
    auto t0 = std::chrono::steady_clock::now();
    ex.zero_grads();
    loss = 0;
    // A step of many micro-steps (a large --total-batch on a CPU: minutes) shows how far it is,
    // on a terminal, once it has taken a few seconds.
    const std::string step_name = "step " + std::to_string(step + 1);
    TerminalProgress within(step_name.c_str(), "micro-steps");
    const size_t step_shard = loader.shard();
    const int64_t step_position = loader.position();
    int64_t cut = 0;  // the micro-steps done when a signal cut the step short
    for (int64_t micro = 0; micro < accum; ++micro) {
      if (micro + 1 == accum) signals.phase(2);  // the step's last micro-step: the step will be finished
      try {
        next_batch(ex, loader, B * T, model.vocab_size());
      } catch (const Error& e) {
        // A shard gone or cut short mid-run (one process; ranks would wait on this one): the
        // steps done are kept as a signal keeps them, then the error.
        if (world > 1) throw;
        stop_for_data(step, step_shard, step_position, e.what());
      }
      dp.arm(micro + 1 == accum);  // the last backward starts the gradient buckets
      loss += ex.run("micro_step");
      if (root && within.on() && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(3))
        within.update(micro + 1, accum);
      if (cut_steps && micro + 1 < accum) {
        // Ranks agree on it here, as after a step (one that got the signal stops by it).
        int sig = signals.requested();
        if (world > 1) {
          double code = signal_code(sig);
          comm.all_reduce_sum(&code, 1);
          sig = sig ? sig : signal_of_sum(code);
        }
        if (sig) {
          cut = micro + 1;
          interrupted = sig;
          break;
        }
      }
    }
    within.clear();
    if (cut) {
      // Nothing of the step is kept: its checkpoint reads on from where the step began, the
      // gradients are dropped, and the weights and moments are still those after the step before.
      const std::string undone = "step " + std::to_string(step + 1) + " was cut short after micro-step " +
                                 std::to_string(cut) + " of " + std::to_string(accum) + " and is left undone";
      if (step == first_step) {
        if (root)
          std::fprintf(stderr, "%s: stopped before the first step ended (%s): nothing was trained\n",
                       signal_name(interrupted), undone.c_str());
        throw Interrupted{interrupted};
      }
      if (!o.checkpoint_dir.empty() && checkpointed != step) write_checkpoint(step, step_shard, step_position);
      if (root)
        std::fprintf(stderr, "%s: stopped after step %lld of %lld (%s)%s\n", signal_name(interrupted),
                     (long long)step, (long long)o.steps, undone.c_str(), where_stopped().c_str());
      break;
    }
    dp.arm(false);
    // The last micro-step's backward is done: start averaging the gradients, bucket by bucket.
    dp.start_gradient_reduction();
    loss /= double(accum);
    // The ranks agree on stopping in the loss's reduction, so that all stop after the same step
    // however the signals reached them (signal_code); rank 0 says there whether its log failed
    // at the step before.
    int stop = 0;
    bool log_stop = false;
    if (world > 1) {
      const int mine = signals.requested();
      double sums[3] = {loss, signal_code(mine), log_failure.empty() ? 0.0 : 1.0};
      comm.all_reduce_sum(sums, 3);
      loss = sums[0] / double(world);
      stop = mine ? mine : signal_of_sum(sums[1]);
      log_stop = sums[2] > 0;
    }
    dp.finish_gradient_reduction();
    // The step's results are written from here on (--dump-grads, the log, the checkpoint): the
    // folders a signal removed before (under mpirun SIGKILL follows; ranks go on to this step's
    // end) are made again, and a signal no longer removes them.
    if (step == first_step && signals.keep_folders()) made.keep_lock(o.checkpoint_dir, /*warn=*/false);
    if (step == 0 && !o.dump_grads.empty()) {
      dp.gather_gradients();  // ZeRO-1: each rank holds only its pieces
      if (root) {
        save_parameters(ex, "--dump-grads", o.dump_grads, ParamField::Grad);
        std::fprintf(stderr, "saved step 0's gradients to %s\n", o.dump_grads.c_str());
      }
    }

    const double lr = learning_rate(schedule, step);
    ex.set_hyper("lr", float(lr));
    ex.set_hyper("step", float(step + 1));
    const double norm = ex.run("optimizer_step");  // the same on every rank: averaged gradients
    dp.gather_parameters();                         // ZeRO-1: the pieces other ranks updated
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = double(total) / dt;
    const double mfu = step_flops / dt / peak;
    elapsed += dt;
    if (step == first_step) first_dt = dt;

    // A diverged step stops the run before anything is logged or checkpointed from it.
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      // What to look at: on the first step nothing has been updated yet, so the weights came in so.
      std::string hint = "lower --lr or check the data";
      if (step == first_step && !resumed_from.empty()) hint = resumed_from + " may hold a NaN or an infinity";
      else if (step == first_step && !o.init.empty()) hint = "the weights of --init " + o.init + " overflow on these data";
      bool kept = false;  // a good checkpoint there (a `latest` that cannot be read counts as none here)
      try {
        kept = !o.checkpoint_dir.empty() && latest_checkpoint(o.checkpoint_dir).has_value();
      } catch (const Error&) {
      }
      // (NaN without the sign bit a NaN's arithmetic leaves: "-nan" reads as something else.)
      auto value = [](double x) { return std::isnan(x) ? std::string("nan") : std::to_string(x); };
      throw Error("step " + std::to_string(step + 1) + ": loss " + value(loss) + ", grad norm " + value(norm) +
                  " is not finite; stopping" +
                  (o.checkpoint_dir.empty() ? ""
                   : kept                   ? " without writing a checkpoint (the last good one is kept)"
                                            : " without writing a checkpoint") +
                  " (" + hint + ")");
    }
    const bool last = step + 1 == o.steps;
    // Evaluations, samples and checkpoints come after every N-th update (the step printed as N,
    // 2N, ...; step + 1 updates done), and after the last: a checkpoint's validation loss is its
    // step's.
    double val_loss = NAN;
    bool val_stopped = false;
    if (val && ((o.val_every > 0 && (step + 1) % o.val_every == 0) || last)) {
      const auto t_eval = std::chrono::steady_clock::now();
      val->reset();  // the same batches every time, so evaluations compare
      ex.enable_profiling(false);  // --profile's table is the training step's
      const std::optional<double> loss = evaluate(ex, *val, val_steps, comm, [&] { return signals.requested() != 0; });
      val_stopped = !loss;
      val_loss = loss.value_or(NAN);
      ex.enable_profiling(o.profile);
      if (!val_stopped) evals.took_since(t_eval);
    }
    // Rank 0 alone samples (every rank holds the whole weights); the others wait for it in the
    // next step's reduction (a long sampling counts against KILN_COMM_TIMEOUT there). The same
    // seed every time, so that samples of steps compare.
    std::vector<std::vector<int32_t>> samples;
    bool samples_stopped = false;
    if (sampling && ((step + 1) % o.sample_every == 0 || last)) {
      const auto t_sample = std::chrono::steady_clock::now();
      ex.enable_profiling(false);  // --profile's table is the training step's
      // A signal during sampling ends it at once; one process stops after this step (ranks agree
      // on it in the next step's reduction).
      SampleOptions so = o.sample;
      so.stop = [&] { return signals.requested() != 0; };
      so.stopped = &samples_stopped;
      try {
        samples = sample(ex, o.sample_prompt, so);
      } catch (const Error& e) {  // (logits a NaN: the next step's loss says whether training diverged)
        std::fprintf(stderr, "kiln: warning: step %lld: sampling failed: %s; training goes on\n", (long long)step + 1,
                     one_line(e.what()).c_str());
      }
      if (samples_stopped) samples.clear();  // cut short: the log and the terminal say so instead
      ex.enable_profiling(o.profile);
      if (!samples_stopped) samplings.took_since(t_sample);  // (one cut short says nothing of the others)
    }
    if (world == 1) stop = signals.requested();  // read after evaluation and sampling: one during them counts
    if (logging) {
      // The schedule's lr to 10 digits (6e-4, not 0.0005999999999999998; the kernels read a
      // float), the time to the microsecond.
      nlohmann::json j = {{"step", step}, {"loss", loss}, {"lr", significant(lr, 10)}, {"grad_norm", norm},
                          {"dt_ms", std::round(dt * 1e6) / 1e3}, {"tokens_per_s", significant(tok_s, 6)},
                          {"mfu", significant(mfu, 6)}};
      // A run's first line says how it started, so that kiln-inspect plot keeps a fresh run
      // appended to an older one's log apart from it, and a resumed one with it.
      if (step == first_step) j["start"] = resumed_from.empty() ? "fresh" : "resume";
      if (!std::isnan(val_loss)) j["val_loss"] = val_loss;
      if (val_stopped) j["val_stopped"] = signal_name(signals.requested());
      if (samples_stopped) j["samples_stopped"] = signal_name(signals.requested());
      if (!samples.empty()) {
        nlohmann::json& list = j["samples"] = nlohmann::json::array();
        for (const auto& ids : samples) {
          if (o.sample_text) list.push_back(o.sample_text(ids));
          else list.push_back(ids);
        }
      }
      // A sample's text may end inside a UTF-8 sequence (tokens are bytes): replaced, not refused.
      log_pending.push_back(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      if (const int error = log.append(pending_text())) {
        if (log_failure.empty())
          log_failure = "--log: " + o.log + ": writing step " + std::to_string(step + 1) + "'s line failed: " +
                        log.describe(error);
      } else {
        log_pending.clear();
      }
    }
    // The first step's line (a resumed run's too), then every N-th (printed N, 2N, ...) and the last.
    if (root && (step == first_step || (step + 1) % every == 0 || last || !std::isnan(val_loss) || !samples.empty() ||
                 samples_stopped || val_stopped)) {
      // The steps left, and the evaluations, samples and checkpoints after them (this step's
      // checkpoint is still to be written).
      const double step_s = eta_seconds(elapsed, first_dt, step + 1 - first_step, 1);
      const double eta = step_s * double(o.steps - step - 1) +
                         (val ? evals.left(periodic_left(step + 1, o.steps, o.val_every),
                                           evaluation_guess_seconds(step_s, accum, val_steps))
                              : 0) +
                         (sampling ? samplings.left(periodic_left(step + 1, o.steps, o.sample_every)) : 0) +
                         (o.checkpoint_dir.empty() ? 0 : checkpoints.left(periodic_left(step, o.steps, o.checkpoint_every)));
      std::printf("step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | MFU %.1f%% | ETA %s",
                  (long long)step + 1, (long long)o.steps, loss, lr, norm, dt * 1e3, tok_s, 100 * mfu,
                  duration(eta).c_str());
      if (!std::isnan(val_loss)) std::printf(" | val loss %.4f", val_loss);
      std::printf("\n");
      if (val_stopped) std::printf("--- evaluation at step %lld stopped by %s ---\n", (long long)step + 1,
                                   signal_name(signals.requested()));
      if (samples_stopped) std::printf("--- sampling at step %lld stopped by %s ---\n", (long long)step + 1,
                                       signal_name(signals.requested()));
      for (size_t i = 0; i < samples.size(); ++i) {
        std::printf("--- sample %zu at step %lld ---\n", i + 1, (long long)step + 1);
        const std::string text = sample_string(samples[i], o.sample_text);
        std::fwrite(text.data(), 1, text.size(), stdout);  // bytes: token 188 decodes to a NUL
        std::printf("\n");
      }
      // A stdout that cannot be written (`train ... | head` after head is done, a full disk)
      // stops the run as a signal would: after this step, with its checkpoint and --save.
      if ((std::fflush(stdout) != 0 || std::ferror(stdout)) && !stdout_failed) {
        stdout_failed = true;
        stdout_error = errno;
        if (signals.request(SIGPIPE)) {
          std::fprintf(stderr, "kiln: stdout: %s: stopping after %s%s\n",
                       stdout_error == EPIPE ? "closed (the reader is gone)" : std::strerror(stdout_error),
                       last ? "this step, the last" : world == 1 ? "this step" : "the next step (the ranks agree on it there)",
                       what_is_kept.c_str());
          if (world == 1) stop = SIGPIPE;
        }
      }
    }
    // A log that failed stops the run as a signal does: one process after this step, ranks after
    // the step whose reduction told them (or the last).
    const bool log_stops = world == 1 ? !log_failure.empty() : log_stop || ((last || stop) && !log_failure.empty());
    // A checkpoint folder alone means one checkpoint, at the end (or where a signal stops the run).
    if (!o.checkpoint_dir.empty() &&
        ((o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) || last || stop || log_stops)) {
      const auto t_checkpoint = std::chrono::steady_clock::now();
      write_checkpoint(step + 1, loader.shard(), loader.position());
      checkpoints.took_since(t_checkpoint);
    }
    // One process: a signal that came since stop was read (while the log, the progress line or
    // the checkpoint was written) stops the run after this step, with its checkpoint, not after
    // one more. (Ranks agree on it in the next step's reduction.)
    if (world == 1 && !stop && !log_stops && (stop = signals.requested()) && !last && !o.checkpoint_dir.empty() &&
        checkpointed != step + 1)
      write_checkpoint(step + 1, loader.shard(), loader.position());
    if (log_stops) {
      // This step's checkpoint is written (above) and --save (below); then the error.
      const std::string at = "; stopped after step " + std::to_string(step + 1) + " of " + std::to_string(o.steps);
      const std::string ckpt = o.checkpoint_dir.empty() ? "" : latest_checkpoint(o.checkpoint_dir).value_or("?");
      if (!root) {
        log_failure = "data parallel: rank 0 could not write its --log" + at;
      } else {
        log_failure += at;
        if (!ckpt.empty())
          log_failure += " with checkpoint " + ckpt + " (--resume goes on from there" +
                         (log_pending.empty() ? ")" : ", and writes the log's missing lines first)");
      }
      break;
    }
    if (stop && !last) {
      interrupted = stop;
      if (root)
        std::fprintf(stderr, "%s: stopped after step %lld of %lld%s\n",
                     stop == SIGPIPE && stdout_failed && stdout_error != EPIPE ? "stdout" : signal_name(stop), (long long)step + 1,
                     (long long)o.steps, where_stopped().c_str());
      break;
    }
  }
  if (root && elapsed > 0)
    std::fprintf(stderr, "MFU is against %s%.3g TFLOP/s (%s%s)\n", o.peak_tflops > 0 ? "" : "an estimated ",
                 peak / 1e12, world > 1 ? (std::to_string(world) + " ranks x ").c_str() : "",
                 o.peak_tflops > 0 ? "--peak-tflops"
                 : gpu_peak ? gpu_peak->how.c_str()
                 : gpu      ? "a GPU this runtime has no datasheet figure for: the H100's dense bf16 rate; give --peak-tflops"
                            : cpu_peak.how.c_str());
  if (root && ex.device_bytes())
    std::fprintf(stderr, "device memory: %.1f MiB held by Kiln (the arena %.1f MiB, the rest workspaces and tables)\n",
                 double(ex.device_bytes()) / double(1 << 20), double(ex.arena_bytes()) / double(1 << 20));
  if (root && !ex.device_bytes()) {
    // The CPU's kernels hold scratch memory outside the arena, grown to their largest need.
    const int64_t scratch = ex.host_scratch_bytes();
    if (scratch >= 0)
      std::fprintf(stderr, "host memory: %.1f MiB held by Kiln's arena and scratch (the arena %.1f MiB, the kernels' scratch "
                   "%.1f MiB at its most)\n", double(uint64_t(scratch) + ex.arena_bytes()) / double(1 << 20),
                   double(ex.arena_bytes()) / double(1 << 20), double(scratch) / double(1 << 20));
    else
      std::fprintf(stderr, "host memory: the arena %.1f MiB, plus kernel scratch that this module's kernels do not "
                   "report (compiled before they did)\n", double(ex.arena_bytes()) / double(1 << 20));
  }
  if (o.profile && root) {
    const std::string steps = last_started > profiled_from
                                  ? "steps " + std::to_string(profiled_from) + "-" + std::to_string(last_started)
                                  : "step " + std::to_string(profiled_from);
    if (profiled_from > first_step + 1)
      std::fprintf(stderr, "profile of %s (step %lld, the first, warms up; it is left out)\n", steps.c_str(),
                   (long long)first_step + 1);
    else
      std::fprintf(stderr, "profile of step %lld (the run's only step: it includes the warm-up)\n", (long long)last_started);
    ex.print_profile();
    // The log gets the table too, as one record without "step" (readers of the steps pass it
    // over): its kernels are named as kiln-inspect --json names them, its steps as the log's.
    if (const auto rows = ex.profile_rows(); logging && log_failure.empty() && !rows.empty()) {
      nlohmann::ordered_json kernels = nlohmann::ordered_json::array();  // (in docs/training.md's order)
      for (const auto& [name, t] : rows)
        kernels.push_back({{"kernel", name}, {"total_ms", std::round(t.seconds * 1e6) / 1e3}, {"calls", t.calls},
                           {"flops", std::llround(t.flops)}});
      const nlohmann::ordered_json j = {{"profile", {{"steps", {profiled_from - 1, last_started - 1}},
                                             {"warm_up_included", profiled_from == first_step + 1},
                                             {"kernels", kernels}}}};
      if (const int error = log.append(j.dump()))
        log_failure = "--log: " + o.log + ": writing the profile's line failed: " + log.describe(error);
    }
  }
  // An interrupted run saves the weights it has too (its log says how far it got).
  if (!o.save.empty() && root) {
    try {
      save_weights(true);
    } catch (const Error& e) {
      // (every run that gets here with a checkpoint folder wrote its weights there last)
      const std::string kept =
          checkpoint_written.empty() ? "" : " (the same weights are in " + checkpoint_written + ", which --init reads)";
      if (log_failure.empty()) throw Error(e.what() + kept);
      // (the log's failure stopped the run: it comes first, or it would go unsaid)
      throw Error(log_failure + "; saving failed too: " + e.what() + kept);
    }
    std::fprintf(stderr, "saved %s%s\n", o.save.c_str(), interrupted || !log_failure.empty() ? " (the weights of the interrupted run)" : "");
  }
  if (!log_failure.empty()) throw Error(log_failure);
  // A stdout that failed at the last step ends the run as one that failed before it: a closed
  // pipe by SIGPIPE (the shell's way), another failure (a full disk) as an error.
  if (stdout_failed && (!interrupted || interrupted == SIGPIPE)) {
    if (stdout_error != EPIPE)
      throw Error("stdout: " + std::string(std::strerror(stdout_error)) + ": the progress lines could not be written");
    interrupted = SIGPIPE;
  }
  if (interrupted) throw Interrupted{interrupted};
  return loss;
}

}  // namespace kiln
