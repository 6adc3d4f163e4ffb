#include "runtime/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include "runtime/comm/communicator.h"
#include "runtime/embedded.h"
#include "runtime/error.h"
#include "runtime/module.h"
#include "runtime/trainer.h"

namespace kiln {
namespace {

void add_train_options(CLI::App& train, TrainOptions& o) {
  train.add_option("--data", o.data, "llm.c token shard(s): a file or a quoted glob")->required();
  train.add_option("--steps", o.steps, "optimizer steps to run")->required()->check(CLI::PositiveNumber);
  train.add_option("--init", o.init, "start from these weights (Hugging Face GPT-2 safetensors)");
  train.add_option("--seed", o.seed, "seed of the initialisation when --init is not given")->capture_default_str();
  train.add_option("--lr", o.schedule.lr, "maximum learning rate")->capture_default_str()->check(CLI::NonNegativeNumber);
  train.add_option("--lr-schedule", o.schedule.kind, "learning-rate schedule after warm-up")
      ->capture_default_str()->check(CLI::IsMember({"cosine", "constant"}));
  train.add_option("--warmup-steps", o.schedule.warmup_steps, "linear warm-up steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  train.add_option("--min-lr-ratio", o.schedule.min_lr_ratio, "cosine floor as a fraction of --lr")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  train.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (2-D weights only)")->capture_default_str()->check(CLI::NonNegativeNumber);
  train.add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  train.add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  train.add_option("--eps", o.eps, "AdamW epsilon")->capture_default_str()->check(CLI::PositiveNumber);
  train.add_option("--grad-clip", o.grad_clip, "global gradient-norm clip (0 disables)")->capture_default_str()->check(CLI::NonNegativeNumber);
  train.add_option("--total-batch", o.total_batch, "tokens per optimizer step (default B*T*ranks: no accumulation)")->check(CLI::NonNegativeNumber);
  train.add_option("--log", o.log, "append one JSON line per step to this file");
  train.add_option("--save", o.save, "write the final weights (safetensors)");
  train.add_option("--dump-grads", o.dump_grads, "write step 0's accumulated gradients (safetensors)");
  train.add_option("--print-every", o.print_every, "print progress every N steps (default: about 50 lines)");
  train.add_flag("--profile", o.profile, "print the time spent in each kind of kernel at the end");
  // Data parallelism: the ranks come from the launcher (mpirun/srun, or torchrun's RANK,
  // WORLD_SIZE, MASTER_ADDR, MASTER_PORT); see runtime/comm/communicator.h.
  train.add_option("--zero", o.zero, "1: ZeRO-1, shard AdamW state and the update across ranks (same results)")
      ->capture_default_str()->check(CLI::Range(0, 1));
  train.add_option("--bucket-mb", o.bucket_mb, "gradient all-reduce bucket size in MB (data parallel)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  train.add_option("--comm", o.comm, "communicator: auto (MPI under mpirun/srun, TCP with WORLD_SIZE > 1, "
                                     "else one process), single, mpi, tcp, nccl (GPU targets only)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "single", "mpi", "tcp", "nccl"}));
}

}  // namespace

int run_main(int argc, char** argv) {
  std::optional<std::vector<uint8_t>> embedded;
  try {
    embedded = read_embedded_module("/proc/self/exe");
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }

  CLI::App app{embedded ? "A Kiln training executable: GPT-2 compiled by kilnc."
                        : "kiln-run: run a compiled Kiln module (.kiln)."};
  app.require_subcommand(1);
  std::string module_path;
  if (!embedded) app.add_option("module", module_path, "module file written by kilnc --emit=module")->required();
  TrainOptions train_opts;
  CLI::App* train = app.add_subcommand("train", "train the model on token shards");
  add_train_options(*train, train_opts);
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<Communicator> comm;  // outlives the module: MPI_Finalize last
  try {
    Module module = embedded ? Module::from_bytes(std::move(*embedded), argv[0]) : Module::load(module_path);
    if (train->parsed()) {
      const fb::Model& model = *module.fb().model();
      comm = make_communicator(parse_comm_backend(train_opts.comm), model.target() ? model.target()->str() : "cpu");
      kiln::train(module, train_opts, *comm);
    }
    return 0;
  } catch (const Error& e) {
    // One failing rank ends them all, at once, rather than leaving them waiting in a collective.
    if (comm && comm->world_size() > 1) {
      const std::string msg = e.what();
      comm->abort(msg.rfind("rank ", 0) == 0 ? msg
                                             : "rank " + std::to_string(comm->rank()) + " of " +
                                                   std::to_string(comm->world_size()) + ": " + msg);
    }
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace kiln
