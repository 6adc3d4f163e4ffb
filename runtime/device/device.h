// The GPU a cuda module runs on, as the runtime's device executor (runtime/device/device_executor)
// sees it: memory, the module's compiled kernels, cuBLASLt products and CUDA graphs, all on one
// compute stream. runtime/cuda/cuda_device.cpp implements it with the CUDA driver (reached
// through the runtime's cudaGetDriverEntryPointByVersion) and cuBLASLt; the end-to-end tests run
// the same executor on an emulation of this interface (test/e2e/cuda_emulation). No CUDA header
// is included here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/error.h"

#include "runtime/module.h"

namespace kiln {

using DevicePtr = uint64_t;  // a device address (CUdeviceptr)

// One cuBLASLt product of a Kernel instruction, row-major like the module's MatmulCall:
//   D[m, n] = epilogue(op(A) op(B) + beta * C),  op(A) = A[m, k] or A^T (A stored [k, m]), ...
// with the instruction's addresses, so it is planned once at load and run without host work.
struct MatmulSpec {
  std::string where;  // for messages: "kernel k12_matmul_broadcast_add (program micro_step)"
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  fb::DType a_type = fb::DType::F32, b_type = fb::DType::F32, d_type = fb::DType::F32;
  fb::DType bias_type = fb::DType::F32, aux_type = fb::DType::F32;
  std::string epilogue;  // DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU
  float beta = 0.0f;     // C (same type and layout as D) is read when beta != 0
  DevicePtr a = 0, b = 0, c = 0, d = 0, bias = 0, aux = 0;  // 0: none
};

// What a cuBLASLt epilogue name (MatmulSpec::epilogue) does after the product, in this order:
// adds the bias, writes the pre-GELU value to aux, applies GELU; or multiplies by the GELU
// derivative at aux (DGELU). Throws kiln::Error for a name that is none of them.
struct EpilogueFlags {
  bool bias = false, aux_out = false, gelu = false, dgelu = false;
  bool reads_aux() const { return aux_out || dgelu; }
};
EpilogueFlags epilogue_flags(const std::string& epilogue, const std::string& where);

// What plan_matmul throws when cuBLASLt has no algorithm for a product as asked (typically its
// epilogue for these types): the executor then runs the product plain and the epilogue after it.
// Any other error (a CUDA fault while timing candidates) is not a refusal and stops the load.
struct MatmulUnsupported : Error {
  using Error::Error;
};

class Device {
 public:
  virtual ~Device() = default;
  // "NVIDIA H200 (sm_90, 139.8 GiB)": for the log.
  virtual std::string describe() const = 0;

  // Memory. alloc throws kiln::Error naming `what` and the bytes needed when it cannot.
  virtual DevicePtr alloc(size_t bytes, const std::string& what) = 0;
  virtual void free(DevicePtr p) = 0;
  // Bytes of device memory held now: alloc's blocks and the device's own (library workspaces).
  virtual size_t allocated_bytes() const = 0;
  // Host to device, in stream order. The host buffer may change once this returns (CUDA stages
  // pageable bytes before it returns), though the executor keeps its sources alive regardless.
  virtual void upload(DevicePtr dst, const void* src, size_t bytes) = 0;
  // Device to host: waits for the stream's work before it, and for the copy.
  virtual void download(void* dst, DevicePtr src, size_t bytes) = 0;
  virtual void copy(DevicePtr dst, DevicePtr src, size_t bytes) = 0;   // device to device, in stream order
  virtual void fill(DevicePtr dst, uint8_t byte, size_t bytes) = 0;  // in stream order
  void zero(DevicePtr dst, size_t bytes) { fill(dst, 0, bytes); }
  virtual void synchronize() = 0;                       // waits for the stream
  // The compute stream as the CUDA runtime knows it (a cudaStream_t), for libraries that join it
  // (NCCL); null where there is none.
  virtual void* stream() const { return nullptr; }
  // Whether device addresses are host addresses too and work is done by the time a call returns
  // (the emulation), so that host code such as an MPI or TCP communicator may read and write
  // device memory.
  virtual bool host_addressable() const { return false; }

  // The module's generated kernels (its cuda_images for this GPU's architecture).
  virtual void load_kernels(const Module& module) = 0;
  // A loaded function by symbol; throws kiln::Error when the kernels lack it.
  using Function = const void*;
  virtual Function function(const std::string& symbol) = 0;
  // Every generated function takes (void* const* b, const long long* range): device addresses
  // of an operand table and of the [begin, end) ranges (0 when it reads none).
  virtual void launch(Function f, unsigned grid, unsigned block, DevicePtr operands, DevicePtr ranges) = 0;

  // cuBLASLt: plans a product once (layouts, epilogue, algorithm); throws kiln::Error naming
  // spec.where when the library has no algorithm for it. Planning may run the product on its
  // operands (to time algorithms): plan before the arena holds anything worth keeping.
  using Matmul = size_t;
  virtual Matmul plan_matmul(const MatmulSpec& spec) = 0;
  virtual void matmul(Matmul m) = 0;
  // One line on how the products were planned ("" when there is nothing to say), for the log.
  virtual std::string planning_note() const { return ""; }

  // CUDA graphs: the work issued between begin_capture and end_capture is recorded, not run,
  // and replayed by launch_graph. Returns false (and records nothing) where unsupported.
  using Graph = size_t;
  virtual bool begin_capture() = 0;
  virtual Graph end_capture() = 0;
  // Ends a capture that failed half way, recording nothing (no error of its own).
  virtual void abort_capture() noexcept = 0;
  virtual void launch_graph(Graph g) = 0;

  // Profiling: timing marks in stream order. start_timing(n) readies marks 0..n-1; mark(i)
  // records mark i after the work issued so far; seconds(i, j) waits for mark j and gives the
  // device's time between marks i and j. This default times on the host, waiting for the
  // stream at each mark (right for a device whose work is done when a call returns).
  virtual void start_timing(size_t marks) { host_marks_.assign(marks, 0.0); }
  virtual void mark(size_t i);
  virtual double seconds(size_t i, size_t j) { return host_marks_.at(j) - host_marks_.at(i); }

 private:
  std::vector<double> host_marks_;
};

// The device cuda modules run on: the current CUDA GPU (0, or the one a communicator chose for
// this rank), unless a test substituted its own factory.
// Throws kiln::Error with the reason when there is none (no driver, no GPU, a runtime built
// without CUDA).
std::unique_ptr<Device> make_device();
// Tests: run cuda modules on another implementation (the CUDA emulation), whose memory the host
// may address (host_addressable) or not.
void set_device_factory(std::function<std::unique_ptr<Device>()> factory, bool host_addressable = false);
// Whether make_device()'s devices have host-addressable memory (before any is made).
bool devices_host_addressable();

}  // namespace kiln
