// The training loop: data, schedule, micro-steps with accumulation, optimizer step, logging.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/lr_schedule.h"
#include "runtime/module.h"

namespace kiln {

struct TrainOptions {
  std::string data;             // llm.c token shard(s): a file or a glob
  int64_t steps = 0;
  std::string init;             // safetensors to start from; otherwise seeded init
  uint64_t seed = 1337;
  LrSchedule schedule;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
  int64_t total_batch = 0;      // tokens per optimizer step; 0 = B * T (no accumulation)
  std::string log;              // JSONL, one line per step
  std::string save;             // safetensors written at the end
  std::string dump_grads;       // safetensors of step 0's accumulated gradients
  int64_t print_every = 0;      // 0 = about 50 lines per run
  bool profile = false;         // per-kernel time table at the end
};

// Runs the loop; throws kiln::Error on bad input. Returns the last step's loss.
double train(const Module& module, const TrainOptions& options);

}  // namespace kiln
