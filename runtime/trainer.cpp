#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/data_loader.h"
#include "runtime/data_parallel.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/params.h"

namespace kiln {
namespace {

// 64-bit FNV-1a over words (the tail bytewise): a fingerprint, not a cryptographic hash.
uint64_t fingerprint(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
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

// Every rank must run the same module with the same options from the same weights, or the
// ranks drift apart (or deadlock on different collectives). Checked once at start; every rank
// learns the outcome, so they all stop together.
void check_ranks_agree(Communicator& comm, const Module& module, const TrainOptions& o, int64_t total,
                       Executor& ex) {
  const uint8_t* bytes = flatbuffers::GetBufferStartFromRootPointer(&module.fb());
  std::string opts = o.schedule.kind;
  for (double x : {double(o.steps), double(total), double(o.zero), o.bucket_mb, double(o.schedule.lr),
                   double(o.schedule.warmup_steps), double(o.schedule.min_lr_ratio), o.weight_decay, o.beta1, o.beta2,
                   o.eps, o.grad_clip}) {
    char buf[40];
    std::snprintf(buf, sizeof buf, " %.17g", x);
    opts += buf;
  }
  uint64_t weights = fingerprint(nullptr, 0);
  for (const fb::Parameter* p : *module.fb().parameters())
    weights = fingerprint(ex.f32(p->value()), module.buffer(p->value()).size(), weights);
  uint64_t mine[3] = {fingerprint(bytes, module.size_bytes()), fingerprint(opts.data(), opts.size()), weights};
  uint64_t root[3];
  std::memcpy(root, mine, sizeof root);
  comm.broadcast(root, sizeof root, 0);
  double differ[3];
  for (int i = 0; i < 3; ++i) differ[i] = mine[i] != root[i] ? 1 : 0;
  comm.all_reduce_sum(differ, 3);
  const char* what[3] = {"the module (a different executable?)",
                         "the training options (--steps, --total-batch, --zero, --bucket-mb, the schedule or AdamW)",
                         "the initial weights (a different --seed, or --init files that differ)"};
  for (int i = 0; i < 3; ++i)
    if (differ[i] > 0)
      throw Error("data parallel: " + std::to_string(int(differ[i])) + " rank(s) disagree with rank 0 about " +
                  what[i] + (mine[i] != root[i] ? ", this one among them" : "") +
                  "; every rank must run the same command");
}

}  // namespace

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
  if (total % tokens_per_micro != 0)
    throw Error("--total-batch: " + std::to_string(total) + " is not a multiple of B*T*ranks = " +
                std::to_string(tokens_per_micro));
  const int64_t accum = total / tokens_per_micro;
  for (const char* p : {"micro_step", "optimizer_step"})
    if (!module.program(p))
      throw Error(module.source() + ": has no '" + std::string(p) + "' program (not a training module)");

  if (!(o.bucket_mb > 0)) throw Error("--bucket-mb: must be positive");
  DataLoader loader(o.data, B, T, rank, int(world));
  Executor ex(module);
  ex.enable_profiling(o.profile);
  init_parameters(ex, o.seed);  // also clears gradients and AdamW state
  if (!o.init.empty()) load_parameters(ex, o.init);
  ex.refresh_compute_copies();
  DataParallel dp(ex, comm, o.zero, int64_t(o.bucket_mb * 1e6));
  if (world > 1) check_ranks_agree(comm, module, o, total, ex);

  std::ofstream log;
  if (!o.log.empty() && root) {
    log.open(o.log, std::ios::app);
    if (!log) throw Error(o.log + ": cannot open for appending");
  }
  LrSchedule schedule = o.schedule;
  schedule.total_steps = o.steps;
  ex.set_hyper("beta1", float(o.beta1));
  ex.set_hyper("beta2", float(o.beta2));
  ex.set_hyper("eps", float(o.eps));
  ex.set_hyper("weight_decay", float(o.weight_decay));
  ex.set_hyper("max_norm", float(o.grad_clip));
  // Each micro-step contributes loss / (accum * world): the sum over ranks is then the average.
  ex.set_hyper("loss_weight", float(1.0 / double(accum * world)));

  const int64_t every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.steps / 50);
  if (root && world > 1)
    std::fprintf(stderr, "data parallel: rank %d of %lld over %s; %s\n", rank, (long long)world,
                 comm.describe().c_str(), dp.describe().c_str());
  if (root && world == 1)
    std::fprintf(stderr, "training %s: %lld steps, B=%lld T=%lld, %lld micro-step(s) of %lld tokens per step\n",
                 module.source().c_str(), (long long)o.steps, (long long)B, (long long)T,
                 (long long)accum, (long long)tokens_per_micro);
  if (root && world > 1)
    std::fprintf(stderr, "training %s: %lld steps, B=%lld T=%lld, %lld micro-step(s) of %lld tokens on each of %lld "
                 "ranks: %lld tokens per step\n", module.source().c_str(), (long long)o.steps, (long long)B,
                 (long long)T, (long long)accum, (long long)(B * T), (long long)world, (long long)total);
  double loss = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    ex.zero_grads();
    loss = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      loader.next(ex.input("idx"), ex.input("targets"));
      loss += ex.run("micro_step");
    }
    // The last micro-step's backward is done: start averaging the gradients, bucket by bucket.
    dp.start_gradient_reduction();
    loss /= double(accum);
    if (world > 1) loss = comm.all_reduce_sum(loss) / double(world);
    dp.finish_gradient_reduction();
    if (step == 0 && !o.dump_grads.empty()) {
      dp.gather_gradients();  // ZeRO-1: each rank holds only its pieces
      if (root) save_parameters(ex, o.dump_grads, ParamField::Grad);
    }

    const double lr = learning_rate(schedule, step);
    ex.set_hyper("lr", float(lr));
    ex.set_hyper("step", float(step + 1));
    const double norm = ex.run("optimizer_step");  // the same on every rank: averaged gradients
    dp.gather_parameters();                         // ZeRO-1: the pieces other ranks updated
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = double(total) / dt;

    if (!std::isfinite(loss) || !std::isfinite(norm))
      throw Error("step " + std::to_string(step) + ": loss " + std::to_string(loss) + ", grad norm " +
                  std::to_string(norm) + " is not finite; stopping (lower --lr or check the data)");
    if (log.is_open()) {
      nlohmann::json j = {{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                          {"dt_ms", dt * 1e3}, {"tokens_per_s", tok_s}};
      log << j.dump() << '\n' << std::flush;
    }
    if (root && (step % every == 0 || step + 1 == o.steps))
      std::printf("step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s\n",
                  (long long)step + 1, (long long)o.steps, loss, lr, norm, dt * 1e3, tok_s),
          std::fflush(stdout);
  }
  if (o.profile && root) ex.print_profile();
  if (!o.save.empty() && root) {
    save_parameters(ex, o.save);
    std::fprintf(stderr, "saved %s\n", o.save.c_str());
  }
  return loss;
}

}  // namespace kiln
