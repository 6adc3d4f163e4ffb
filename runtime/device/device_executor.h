// Runs a cuda module's programs on a Device (runtime/device/device.h): the arena lives on the
// GPU; the runtime keeps a host copy of the state region (parameters, gradients, AdamW moments,
// inputs, hyperparameters) that it fills and reads between steps. Used by kiln::Executor, which
// owns the host copy and decides when it moves (push_state after weights are initialised or
// loaded, pull_state before they are saved).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/arena_layout.h"
#include "runtime/device/device.h"
#include "runtime/module.h"
#include "runtime/profile.h"

namespace kiln {

class DeviceExecutor {
 public:
  // Plans every instruction of `programs` once: operand tables, cuBLASLt products and launches
  // against one arena laid out as `layout` says (the state region, then the largest program's
  // activations), allocated here. The layout must outlive this executor.
  DeviceExecutor(const Module& module, const ArenaLayout& layout, const std::vector<std::string>& programs);
  // The host copy of the state region (layout.state_bytes), before the first run or transfer.
  void set_host_state(uint8_t* host_state) { host_state_ = host_state; }
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  // Uploads the inputs and hyperparameters, runs the program (replaying its CUDA graph from its
  // second run on) and returns the first element of its result buffer (read() gives the rest).
  // With `profile`, runs eagerly and adds each kernel's wall time (seconds, calls) by name.
  // KILN_CUDA_POISON=1 fills the activations with NaN bytes before every run, so that a kernel
  // reading what no kernel wrote shows (the emulation tests run so); not decode's key/value
  // caches, which hold what earlier runs stored.
  float run(const std::string& program, Profile* profile);
  void push_state();  // the host copy of the state region -> the device
  void pull_state();  // the device's state region -> the host copy
  void zero_grads();  // clears the gradient accumulators on the device
  // Data parallelism: ReduceGradients instructions call reduce(bucket) and WaitGradients wait(),
  // on the host, as the program is issued (stream-ordered work they enqueue, e.g. NCCL, follows
  // the kernels before them); drain() waits for what they started (with the communicator's
  // timeout) before a program that started any blocks on the stream. Programs with such
  // instructions then run eagerly: a graph would replay none of it.
  void set_gradient_hooks(std::function<void(int64_t)> reduce, std::function<void()> wait,
                          std::function<void()> drain);
  // ZeRO-1: the optimizer updates elements [begin, end) of the parameter whose value and
  // gradient buffers these are (its AdamW kernel's ranges, GlobalNorm's sum of squares), and
  // GlobalNorm's sum of squares goes through reduce() (the sum over ranks) before the square root:
  // the host reads it and writes the result back between the two norm kernels, so the optimizer
  // program then runs eagerly.
  void set_parameter_slice(uint32_t value, uint32_t grad, int64_t begin, int64_t end);
  void set_norm_reducer(std::function<double(double)> reduce);
  // ZeRO-1, after the other ranks' parameter pieces were gathered: rounds the bf16 compute copy of
  // every element outside this rank's slices (kiln_round_copies), in stream order.
  void round_other_compute_copies();
  // Device copies in stream order; address() is an arena offset's device address.
  DevicePtr address(uint64_t offset) const { return arena_ + offset; }
  void copy(DevicePtr dst, DevicePtr src, size_t bytes) { device_->copy(dst, src, bytes); }
  void download(void* dst, DevicePtr src, size_t bytes) { device_->download(dst, src, bytes); }
  void* stream() const { return device_->stream(); }
  bool host_addressable() const { return device_->host_addressable(); }
  // Bytes [offset, offset + bytes) of the arena, to the host.
  void read(uint64_t offset, size_t bytes, void* dst) { device_->download(dst, arena_ + offset, bytes); }
  const std::string& device_name() const { return device_name_; }
  size_t device_bytes() const { return device_->allocated_bytes(); }  // all it holds on the GPU

 private:
  // One thing a program does on the device, planned at load.
  struct Step {
    enum Kind { Zero, Matmul, Launch, Reduce, Wait, Norm } kind;  // Reduce, Wait, Norm: the host hooks
    std::string name;              // for the profile: the kernel's name
    double flops = 0;              // for the profile: the arithmetic it does
    DevicePtr ptr = 0;             // Zero: what to clear
    size_t bytes = 0;
    Device::Matmul matmul = 0;     // Matmul: the planned product
    Device::Function fn = nullptr; // Launch: the function, its shape, its tables (word offsets)
    unsigned grid = 0, block = 0;
    size_t operands = 0, ranges = 0;
    bool has_ranges = false;
    DevicePtr table = 0;           // Launch: the table block the offsets are in (0: tables_)
    int64_t bucket = 0;            // Reduce: the gradient bucket
  };
  struct Program {
    const fb::Program* fb = nullptr;
    std::vector<Step> steps;
    int runs = 0;
    bool host_hooks = false;  // has Reduce or Wait steps
    bool norm_step = false;   // has a Norm step (GlobalNorm)
    bool graph_ready = false;
    Device::Graph graph = 0;
    std::vector<std::pair<uint64_t, uint64_t>> kept;  // [offset, end) of decode's key/value caches
  };
  float run_program(Program& p, Profile* profile);
  void plan(Program& p);
  void plan_kernel(Program& p, const fb::Instr& ins, const std::string& where);
  void plan_norm(Program& p, const fb::Instr& ins, const std::string& where);
  void plan_unfused_epilogue(Program& p, MatmulSpec m, const std::string& name, const std::string& why);
  DevicePtr at(uint32_t buffer) const { return arena_ + layout_.at[buffer]; }  // element 0's
  size_t add_words(const std::vector<uint64_t>& words);  // to the table block; its word offset
  void issue(const Program& p);
  void replay(Program& p);
  void issue(const Step& s);

  const Module& module_;
  const ArenaLayout& layout_;
  uint8_t* host_state_ = nullptr;
  std::unique_ptr<Device> device_;
  std::string device_name_;
  DevicePtr arena_ = 0, tables_ = 0, scratch_ = 0;
  DevicePtr workspace_ = 0;  // the kernels' workspace (module.fbs cuda_scratch_bytes), one for all
  std::vector<uint64_t> table_words_;  // operand address tables and ranges, uploaded once
  std::map<std::string, Program> programs_;
  Program zero_grads_;  // the gradient clears of zero_grads()
  std::vector<std::pair<uint64_t, uint64_t>> host_written_;  // [offset, end) of inputs and hypers
  bool graphs_ = true, poison_ = false;
  bool fused_epilogues_ = true;  // KILN_CUBLASLT_EPILOGUES=0: every epilogue as Kiln's own kernel
  uint64_t activation_bytes_ = 0;
  std::function<void(int64_t)> reduce_hook_;
  std::function<void()> wait_hook_, drain_hook_;
  std::function<double(double)> norm_hook_;
  // ZeRO-1's slices: table words holding a [begin, end) pair, by the buffer they slice (AdamW's
  // value buffers, GlobalNorm's gradients); the slices set, by value buffer.
  std::vector<std::pair<size_t, uint32_t>> slice_words_;
  std::map<uint32_t, std::pair<int64_t, int64_t>> slices_;
  Program round_copies_;  // round_other_compute_copies(), planned at its first call
  bool round_planned_ = false;
  DevicePtr round_tables_ = 0;
  // Host sources of uploads made after load, kept until the next: cudaMemcpyAsync from pageable
  // memory is documented only as "may" stage the bytes before it returns.
  std::vector<uint64_t> round_words_;
  double norm_sum_ = 0;
  Device::Function round_fn_ = nullptr;  // kiln_round_copies, looked up with the first slice
  bool in_hook_ = false;  // an error thrown by a hook passes through run() as it is
  int unfused_epilogues_ = 0;  // products whose epilogue cuBLASLt refused to fuse
  std::string unfused_reason_;
};

}  // namespace kiln
