// Runs a module's programs over one arena allocated at start: on the CPU (target "cpu"), or on
// a GPU through runtime/device (target "cuda"), where the host keeps a copy of the state region.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/arena_layout.h"
#include "runtime/module.h"
#include "runtime/profile.h"

namespace kiln {

class DeviceExecutor;

class Executor {
 public:
  // Allocates the arena (zeroed) for the state and the activations of `programs` (all programs
  // when empty: sampling needs no backward buffers) and checks their instructions' operands.
  // `state` (a data-parallel rank's, arena_layout.h): gradients and values in bucket order, and
  // with moment_slices (ZeRO-1) the optimizer updates only those elements of each parameter and
  // the arena keeps only those elements of its AdamW moments.
  explicit Executor(const Module& module, std::vector<std::string> programs = {}, const StatePlan& state = {});
  ~Executor();

  // Runs a program ("forward", "micro_step", "optimizer_step"); returns its scalar result.
  float run(const std::string& program);

  // The host memory of a buffer. On a GPU only the state region has a host copy: inputs and
  // hyperparameters (written here, uploaded by run()), and parameters, gradients and moments,
  // readable after sync_to_host() (kiln::Error while the GPU holds newer values), writable before
  // refresh_compute_copies() uploads them.
  // kiln::Error for a moment this rank keeps only a slice of (see held()).
  float* f32(uint32_t buffer);
  int32_t* i32(uint32_t buffer);
  // The elements [begin, end) of a buffer this executor stores (all, but for ZeRO-1's moments),
  // and the host memory of element `begin` (as f32() otherwise).
  std::pair<int64_t, int64_t> held(uint32_t buffer) const { return layout_.held[buffer]; }
  float* f32_held(uint32_t buffer);
  // Copies bytes [offset, offset + bytes) of a buffer to dst: any buffer, also an activation on
  // the GPU (a program's result, e.g. the logits).
  void read(uint32_t buffer, size_t offset, size_t bytes, void* dst);
  // Scalars and inputs by name; kiln::Error when the module has none of that name.
  void set_hyper(const std::string& name, float value);
  bool has_hyper(const std::string& name) const;
  int32_t* input(const std::string& name);
  // Zeroes every gradient accumulator (start of an optimizer step).
  void zero_grads();
  // Rounds every parameter into its bf16 compute copy (after initialising or loading weights;
  // AdamW keeps them fresh afterwards). On a GPU, then uploads the whole state.
  void refresh_compute_copies();
  // On a GPU: downloads the state (weights, moments, gradients) into the host copy that f32()
  // shows, before it is saved or compared. Nothing to do on the CPU.
  void sync_to_host();
  // "cpu", or the GPU the module runs on ("NVIDIA H200 (sm_90, 139.8 GiB)").
  std::string device_name() const;
  // Bytes the GPU holds for this executor (arena, workspaces, tables); 0 on the CPU.
  size_t device_bytes() const;
  // Bytes of the arena: the state region and the largest program's activations (on a GPU, in
  // its memory), and of its state region.
  uint64_t arena_bytes() const { return layout_.arena_bytes(module_, programs_); }
  uint64_t state_bytes() const { return layout_.state_bytes; }
  // Bytes of host memory the CPU's kernels and bf16 operands hold outside the arena (scratch,
  // grown to the largest need so far and kept: its high-water mark); -1 where the module's
  // kernels do not report theirs (compiled before they did). 0 on a GPU.
  int64_t host_scratch_bytes() const;

  // Per-opcode wall time of every instruction run since profiling was enabled.
  void enable_profiling(bool on) { profile_ = on; }
  void reset_profile() { profile_by_op_.clear(); }
  void print_profile() const;
  // print_profile's rows, the longest total first: name (a kernel's symbol, or a built-in op's
  // opcode) and its totals.
  std::vector<std::pair<std::string, KernelTime>> profile_rows() const;

  const Module& module() const { return module_; }
  // Whether this executor loaded the program (run() may run it).
  bool has_program(const std::string& name) const {
    return std::find(programs_.begin(), programs_.end(), name) != programs_.end();
  }

  // --- Data-parallel hooks (ZeRO-1; used by runtime/data_parallel.cpp) ---------------------
  // Restricts the optimizer program to elements [begin, end) of parameter `param` (its index in
  // the module's parameter list): AdamW updates only those elements of the value and moments,
  // and GlobalNorm sums only their squared gradients. begin == end leaves it to other ranks.
  // kiln::Error for another slice than the constructor's moment_slices, when it had them.
  void set_parameter_slice(size_t param, int64_t begin, int64_t end);
  // GlobalNorm passes its sum of squares through `reduce` (the sum over ranks) before the sqrt.
  void set_norm_reducer(std::function<double(double)> reduce);
  // After the values other ranks updated were gathered into this rank's parameters: their bf16
  // compute copies (on a GPU by a kernel, in stream order; AdamW refreshed this rank's slices).
  void refresh_gathered_compute_copies();
  // ReduceGradients instructions call `reduce(bucket)`; WaitGradients calls `wait()`. Unset, both
  // do nothing (a single process). On a GPU they run as the program is issued (the kernels
  // before them are queued, not done: what they enqueue must follow them on the stream).
  // drain(): waits for what reduce() started; a GPU program calls it before it blocks on its
  // stream (so a dead peer ends the run on the communicator's timeout). Unused on the CPU.
  void set_gradient_hooks(std::function<void(int64_t)> reduce, std::function<void()> wait,
                          std::function<void()> drain = {});
  // Element 0 of a buffer where the communicator can reduce it in place: host memory, or on a
  // GPU its device address (arena_layout.h: a sliced moment's element 0 is not its storage).
  float* comm_address(uint32_t buffer) const;
  // The communicator wrote state buffers in place: on a GPU, the host copy is older now.
  void state_written_in_place() { host_stale_ = device_ != nullptr || host_stale_; }
  // Elements [offset, offset + n) of a buffer to n floats at `dst`, an address of comm_address's
  // kind (on a GPU in stream order); and n floats at such an address to host memory (on a GPU
  // after the work queued before).
  void copy_elements(uint32_t buffer, int64_t offset, int64_t n, float* dst);
  void read_floats(const float* at, int64_t n, float* dst);
  // On a GPU whose memory the host cannot address: the communicator must take device memory
  // (NCCL), on this stream (a cudaStream_t).
  bool comm_needs_device_memory() const;
  void* device_stream() const;

 private:
  void check(const fb::Program& prog) const;
  void check_kernel(const fb::Instr& ins, const std::string& where) const;
  void check_sliced_moments(const fb::Program& prog) const;
  void load_kernels();
  void run_generated(const fb::Instr& ins);
  using KernelFn = void (*)(void* const* buffers, const int64_t* ranges);
  void* kernel_library_ = nullptr;   // dlopen handle of the module's generated kernels
  std::vector<KernelFn> kernel_fns_;  // by kernel index
  std::vector<void*> kernel_args_;
  std::vector<int64_t> kernel_ranges_;
  // KILN_CPU_FENCE=1 (see run_fenced): AddressSanitizer's manual poisoning, null when off.
  using RegionFn = void (*)(const volatile void*, size_t);
  RegionFn poison_ = nullptr, unpoison_ = nullptr;
  bool fence_probe_ = false;     // KILN_CPU_FENCE_PROBE=1: the first operand's last byte stays fenced
  int kernel_library_fd_ = -1;  // under the fence its in-memory file, kept open for ASan's symbolizer
  void setup_fence();
  void run_fenced(KernelFn fn, const fb::Kernel& k, const fb::Instr& ins);
  void exec(const fb::Instr& ins);
  template <typename In, typename IIn, typename Out>
  void run_kernel(const fb::Instr& ins, const flatbuffers::Vector<int64_t>& ints, In in, IIn iin, Out out);
  // fp32 view of an operand: the arena itself, or a widened scratch copy of a bf16 buffer.
  float* operand(uint32_t buffer, size_t slot, bool is_output);
  void flush_outputs();  // rounds scratch outputs into their bf16 buffers
  uint8_t* addr(uint32_t buffer) const { return arena_ + layout_.at[buffer]; }  // element 0's
  const Module& module_;
  ArenaLayout layout_;
  std::unique_ptr<DeviceExecutor> device_;  // target "cuda": the GPU runs the programs
  bool host_stale_ = false;  // the GPU has changed the state since the last sync_to_host()
  std::vector<std::string> programs_;  // the programs this executor may run
  uint8_t* arena_ = nullptr;
  size_t arena_mapped_ = 0;  // bytes mapped at arena_
  std::map<size_t, std::vector<float>> scratch_;          // by operand slot
  long long (*kernel_scratch_bytes_)() = nullptr;         // the kernel library's, where it has it
  std::vector<std::pair<uint32_t, size_t>> pending_;      // bf16 outputs to round after a kernel
  bool profile_ = false;
  Profile profile_by_op_;
  // Data-parallel hooks: slice [begin, end) by parameter value and gradient buffer index.
  std::unordered_map<uint32_t, std::pair<int64_t, int64_t>> slice_by_buffer_;
  std::function<double(double)> norm_reducer_;
  std::function<void(int64_t)> reduce_hook_;
  std::function<void()> wait_hook_;
};

}  // namespace kiln
