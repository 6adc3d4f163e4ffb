// The training loop: data, schedule, micro-steps with accumulation, optimizer step, logging.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/lr_schedule.h"
#include "runtime/module.h"
#include "runtime/sampler.h"

namespace kiln {

class DataLoader;
class Executor;

struct TrainOptions {
  std::vector<std::string> data;  // llm.c token shard(s): files or globs (their union, by path)
  int64_t steps = 0;
  std::string init;             // safetensors to start from; otherwise seeded init
  std::string init_as_given;    // --init as given, where it named a checkpoint folder or its latest (init is the file)
  uint64_t seed = 1337;
  LrSchedule schedule;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
  int64_t total_batch = 0;      // tokens per optimizer step; 0 = B * T (no accumulation)
  std::string log;              // JSONL, one line per step
  std::string save;             // safetensors written at the end
  std::string dump_grads;       // safetensors of step 0's accumulated gradients
  int64_t print_every = 0;      // 0 = about 50 lines per run
  bool profile = false;         // per-kernel time table at the end
  // Evaluation: every val_every steps (and at the end) the mean loss of val_steps batches of
  // val_data, logged as "val_loss".
  std::vector<std::string> val_data;
  int64_t val_every = 0, val_steps = 10;
  // Checkpoints (runtime/checkpoint.h): every checkpoint_every steps into checkpoint_dir,
  // keeping the newest `keep`; resume continues from the latest one there.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep = -1;  // -1: not given: the resumed checkpoint's run's (else 3)
  bool resume = false;
  // Samples while training: after the update of every step s with s % sample_every == 0, and of
  // the last, rank 0 draws sample.num_samples continuations of sample_prompt (the sampler's
  // programs write only their own inputs and activations: no parameter, gradient or moment), prints
  // them (as sample_text makes them, else as ids) and logs them as "samples". Other ranks ignore it.
  int64_t sample_every = 0;
  std::vector<int32_t> sample_prompt;
  SampleOptions sample;
  std::function<std::string(const std::vector<int32_t>&)> sample_text;
  double peak_tflops = 0;       // each rank's, for the MFU column; 0 = a GPU's datasheet rate or a CPU estimate
  // Data parallelism (runtime/data_parallel.h): ranks come from the launcher (mpirun, srun, or
  // RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT); total_batch then counts the tokens of all ranks.
  int zero = 0;                 // 1: ZeRO-1, the optimizer step sharded across ranks
  double bucket_mb = 25;        // gradient all-reduce bucket size (MB)
  bool bucket_mb_given = false; // --bucket-mb on the command line (a module with compiled buckets ignores it)
  std::string comm = "auto";    // communicator: auto, single, mpi, tcp, nccl
  // The files this process runs, (what, path): the outputs must not overwrite them.
  std::vector<std::pair<std::string, std::string>> self;
};

// The mean loss of the next `batches` batches of `data` through the forward program, with the
// executor's weights as they are; progress(done) after each batch. Token ids outside the
// vocabulary are a kiln::Error naming the shard.
double mean_forward_loss(Executor& ex, DataLoader& data, int64_t batches,
                         const std::function<void(int64_t)>& progress = {});

// CPU ranks on one machine share its CPUs: each takes an equal part of them (OpenMP threads),
// unless OMP_NUM_THREADS chose; `root` prints a note when it does.
void share_cpus(int local_ranks, bool root);

// Runs the loop; throws kiln::Error on bad input. Returns the last step's loss. Only rank 0
// prints progress and writes --log, --save and --dump-grads.
double train(const Module& module, const TrainOptions& options, Communicator& comm);
// The same with the communicator options.comm selects from the environment.
double train(const Module& module, const TrainOptions& options);

}  // namespace kiln
