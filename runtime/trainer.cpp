#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/data_loader.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/params.h"

namespace kiln {

double train(const Module& module, const TrainOptions& o) {
  const fb::Model& model = *module.fb().model();
  const int64_t B = model.batch_size(), T = model.seq_len(), world = 1;
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

  DataLoader loader(o.data, B, T);
  Executor ex(module);
  ex.enable_profiling(o.profile);
  init_parameters(ex, o.seed);  // also clears gradients and AdamW state
  if (!o.init.empty()) load_parameters(ex, o.init);
  ex.refresh_compute_copies();

  std::ofstream log;
  if (!o.log.empty()) {
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
  ex.set_hyper("loss_weight", float(1.0 / double(accum)));

  const int64_t every = o.print_every > 0 ? o.print_every : std::max<int64_t>(1, o.steps / 50);
  std::fprintf(stderr, "training %s: %lld steps, B=%lld T=%lld, %lld micro-step(s) of %lld tokens per step\n",
               module.source().c_str(), (long long)o.steps, (long long)B, (long long)T,
               (long long)accum, (long long)tokens_per_micro);
  double loss = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    ex.zero_grads();
    loss = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      loader.next(ex.input("idx"), ex.input("targets"));
      loss += ex.run("micro_step");
    }
    loss /= double(accum);
    if (step == 0 && !o.dump_grads.empty()) save_parameters(ex, o.dump_grads, ParamField::Grad);

    const double lr = learning_rate(schedule, step);
    ex.set_hyper("lr", float(lr));
    ex.set_hyper("step", float(step + 1));
    const double norm = ex.run("optimizer_step");
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = double(total) / dt;

    if (!std::isfinite(loss) || !std::isfinite(norm))
      throw Error("step " + std::to_string(step) + ": loss " + std::to_string(loss) + ", grad norm " +
                  std::to_string(norm) + " is not finite; stopping (lower --lr or check the data)");
    if (log) {
      nlohmann::json j = {{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                          {"dt_ms", dt * 1e3}, {"tokens_per_s", tok_s}};
      log << j.dump() << '\n' << std::flush;
    }
    if (step % every == 0 || step + 1 == o.steps)
      std::printf("step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s\n",
                  (long long)step + 1, (long long)o.steps, loss, lr, norm, dt * 1e3, tok_s),
          std::fflush(stdout);
  }
  if (o.profile) ex.print_profile();
  if (!o.save.empty()) {
    save_parameters(ex, o.save);
    std::fprintf(stderr, "saved %s\n", o.save.c_str());
  }
  return loss;
}

}  // namespace kiln
