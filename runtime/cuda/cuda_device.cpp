// The Device of runtime/device/device.h on a real NVIDIA GPU: GPU 0, one non-blocking compute
// stream that carries everything (copies, clears, the module's kernels, cuBLASLt products, graph
// replays), so stream order is the only order the executor has to think about.
//
// Which CUDA pieces, and why:
// - Memory, copies, streams and graphs use the CUDA runtime (libcudart).
// - The module's kernels are cubins (kilnc compiles them with NVRTC per architecture; PTX for
//   GPUs newer than those, runtime/cuda/cuda_image.h), loaded
//   with the driver's module API: cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel. We do
//   not link libcuda: the driver's functions are looked up through the runtime's
//   cudaGetDriverEntryPointByVersion, so the runtime library links (and its start-up error is
//   clear) on machines without a driver, and the driver's version is checked per function.
//   <cuda.h> is included for its types only; no cu* function is called directly.
// - Matrix products use cuBLASLt, planned once per product (descriptors, layouts, algorithm)
//   and run with no host work beyond the call, so they can also be captured in a CUDA graph.
//
// All calls are expected from one thread: cudaSetDevice at construction makes the GPU's primary
// context current on it, which the driver calls rely on. The GPU is the current one: 0, or the
// one the NCCL communicator chose for this rank (local rank % GPUs) before the executor starts.
#include "runtime/comm/communicator.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/cuda_image.h"

#include <cublasLt.h>
#include <cuda.h>  // types only: CUresult, CUmodule, CUfunction, CUstream, CUdeviceptr
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/cuda/shared_library.h"
#include "runtime/device/lt_product.h"
#include "runtime/error.h"
#include "runtime/module.h"

#ifndef KILN_CUDA_LIBRARY_DIR
#define KILN_CUDA_LIBRARY_DIR "/usr/local/cuda/lib64"
#endif

namespace kiln {
namespace {

// cuBLASLt, opened at run time (runtime/cuda/shared_library.h): the toolkit's copy, then the
// loader's search.
#define KILN_CUBLASLT_FUNCTIONS(F)                                                                     \
  F(cublasLtCreate) F(cublasLtDestroy) F(cublasLtGetStatusString) F(cublasLtMatmul)                   \
  F(cublasLtMatmulAlgoGetHeuristic) F(cublasLtMatmulDescCreate) F(cublasLtMatmulDescDestroy)           \
  F(cublasLtMatmulDescSetAttribute) F(cublasLtMatmulPreferenceCreate) F(cublasLtMatmulPreferenceDestroy) \
  F(cublasLtMatmulPreferenceSetAttribute) F(cublasLtMatrixLayoutCreate) F(cublasLtMatrixLayoutDestroy)
struct CublasLtApi {
  KILN_CUBLASLT_FUNCTIONS(KILN_API_MEMBER)
};
const CublasLtApi& lt() {
  static const CublasLtApi loaded = [] {
    CublasLtApi api;
    const std::string what = "cuBLASLt", major = std::to_string(CUDART_VERSION / 1000);
    void* library = open_library({std::string(KILN_CUDA_LIBRARY_DIR) + "/libcublasLt.so." + major,
                                  "libcublasLt.so." + major, "libcublasLt.so"},
                                 what);
    KILN_CUBLASLT_FUNCTIONS(KILN_API_LOAD)
    return api;
  }();
  return loaded;
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's scratch, allocated once
// The driver API version whose function signatures we use (all five exist unchanged since).
constexpr unsigned kDriverApiVersion = 12000;

// The driver functions we use, with the signatures of <cuda.h>.
using CuGetErrorString = CUresult(CUDAAPI*)(CUresult error, const char** str);
using CuModuleLoadData = CUresult(CUDAAPI*)(CUmodule* module, const void* image);
using CuModuleUnload = CUresult(CUDAAPI*)(CUmodule module);
using CuModuleGetFunction = CUresult(CUDAAPI*)(CUfunction* f, CUmodule module, const char* name);
using CuLaunchKernel = CUresult(CUDAAPI*)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                                          unsigned block_x, unsigned block_y, unsigned block_z,
                                          unsigned shared_bytes, CUstream stream, void** params, void** extra);

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", double(bytes) / double(size_t(1) << 30));
  return buf;
}

std::string number(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(x));
  return buf;
}

void* ptr(DevicePtr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw Error(std::string(call) + ": " + cudaGetErrorString(e));
}

// A cuBLASLt call that failed: while describing a product, cuBLASLt refusing it (the executor
// then runs the epilogue separately); elsewhere an error.
void check_lt(cublasStatus_t st, const std::string& where, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS) throw Error(where + ": " + call + ": " + lt().cublasLtGetStatusString(st));
}
void check_lt_plan(cublasStatus_t st, const std::string& where, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw MatmulUnsupported(where + ": " + call + ": " + lt().cublasLtGetStatusString(st));
}

// One driver function, for the driver API of kDriverApiVersion.
template <typename F>
F driver_function(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, kDriverApiVersion, cudaEnableDefault, &status);
  if (e != cudaSuccess)
    throw Error(std::string("cannot reach the CUDA driver's ") + symbol + ": " + cudaGetErrorString(e) +
                " (cudaGetDriverEntryPointByVersion)");
  if (status != cudaDriverEntryPointSuccess || fn == nullptr)
    throw Error(std::string("cannot reach the CUDA driver's ") + symbol + ": " +
                (status == cudaDriverEntryPointVersionNotSufficent ? "the driver's version is too old"
                                                                   : "the driver does not have it") +
                " (cudaGetDriverEntryPointByVersion, CUDA " + std::to_string(kDriverApiVersion) + ")");
  return reinterpret_cast<F>(fn);
}

cudaDataType_t cuda_type(fb::DType t, const std::string& where, const char* role) {
  switch (t) {
    case fb::DType::F32:
      return CUDA_R_32F;
    case fb::DType::BF16:
      return CUDA_R_16BF;
    default:
      throw Error(where + ": cuBLASLt " + role + " type " + fb::EnumNameDType(t) + " is not F32 or BF16");
  }
}

// The cuBLASLt epilogue of a spec's epilogue name.
cublasLtEpilogue_t lt_epilogue(const EpilogueFlags& f) {
  if (f.dgelu) return CUBLASLT_EPILOGUE_DGELU;
  if (f.gelu && f.aux_out) return f.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (f.gelu) return f.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  return f.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// "m=64 n=2304 k=768 trans_a=0 trans_b=1 epilogue=BIAS types A=BF16 B=BF16 D=F32 bias=F32": for messages.
std::string product(const MatmulSpec& s) {
  std::string r = "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                  " trans_a=" + std::to_string(int(s.trans_a)) + " trans_b=" + std::to_string(int(s.trans_b)) +
                  " epilogue=" + s.epilogue + " beta=" + number(s.beta) + " types A=" +
                  fb::EnumNameDType(s.a_type) + " B=" + fb::EnumNameDType(s.b_type) + " D=" +
                  fb::EnumNameDType(s.d_type);
  if (s.epilogue.find("BIAS") != std::string::npos) r += std::string(" bias=") + fb::EnumNameDType(s.bias_type);
  if (s.epilogue.find("AUX") != std::string::npos || s.epilogue == "DGELU")
    r += std::string(" aux=") + fb::EnumNameDType(s.aux_type);
  return r;
}

// The largest power of two up to 256 that divides the address: cuBLASLt's heuristic assumes
// 256-byte aligned matrices unless told otherwise, and arena buffers may be less aligned.
uint32_t alignment(DevicePtr p) {
  uint32_t a = 256;
  while (a > 1 && p % a != 0) a /= 2;
  return a;
}

class CudaDevice final : public Device {
 public:
  CudaDevice();
  ~CudaDevice() override { release(); }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string describe() const override {
    return std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) + ", " +
           gib(prop_.totalGlobalMem) + " GiB)";
  }

  DevicePtr alloc(size_t bytes, const std::string& what) override;
  void free(DevicePtr p) override;
  size_t allocated_bytes() const override {
    size_t n = workspace_ ? kWorkspaceBytes : 0;
    for (const auto& [p, bytes] : allocations_) n += bytes;
    return n;
  }
  void upload(DevicePtr dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    // In stream order. From pageable memory the driver stages the bytes before it returns, in
    // practice; the documentation says only "may", so callers keep `src` until the next upload.
    check_cuda(cudaMemcpyAsync(ptr(dst), src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
  }
  void download(void* dst, DevicePtr src, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, ptr(src), bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");
  }
  void copy(DevicePtr dst, DevicePtr src, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(ptr(dst), ptr(src), bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (copy)");
  }
  void* stream() const override { return stream_; }
  void fill(DevicePtr dst, uint8_t byte, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaMemsetAsync(ptr(dst), byte, bytes, stream_), "cudaMemsetAsync");
  }
  void synchronize() override { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void load_kernels(const Module& m) override;
  Function function(const std::string& symbol) override;
  void launch(Function f, unsigned grid, unsigned block, DevicePtr operands, DevicePtr ranges) override;

  Matmul plan_matmul(const MatmulSpec& s) override;
  void matmul(Matmul i) override;
  std::string planning_note() const override;

  bool begin_capture() override;
  Graph end_capture() override;
  void abort_capture() noexcept override {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  }
  void launch_graph(Graph g) override;

  // Profiling marks are CUDA events on the stream: GPU time between them (the host's launch gaps
  // count only where the GPU waits for the host).
  void start_timing(size_t marks) override {
    while (timing_.size() < marks) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreate(&e), "cudaEventCreate (profiling)");
      timing_.push_back(e);
    }
  }
  void mark(size_t i) override { check_cuda(cudaEventRecord(timing_.at(i), stream_), "cudaEventRecord (profiling)"); }
  double seconds(size_t i, size_t j) override {
    check_cuda(cudaEventSynchronize(timing_.at(j)), "cudaEventSynchronize (profiling)");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, timing_.at(i), timing_.at(j)), "cudaEventElapsedTime (profiling)");
    return ms * 1e-3;
  }

 private:
  // A planned cuBLASLt product. cuBLASLt's first operand is our B, its second our A (see
  // plan_matmul); C and D share one layout.
  struct MatmulPlan {
    MatmulSpec spec;
    LtProduct lt;  // cuBLASLt's operands and layouts (lt_product)
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
    cublasLtMatmulAlgo_t algo{};
    const void* c = nullptr;  // C's address: s.c when beta != 0, else D's (not read)
  };
  // The algorithm chosen for one product shape (product() and the operands' alignments), shared
  // by every plan of that shape; with tuning, the times of the first candidate that ran and of
  // the chosen one (ms per call), and how many plans use it.
  struct Choice {
    cublasLtMatmulAlgo_t algo{};
    float first_ms = 0.0f, best_ms = 0.0f;
    int candidates = 1, uses = 0;
    bool timed = false;    // several candidates ran and were timed
    bool changed = false;  // another candidate than the first that ran
  };
  Choice choose(const MatmulPlan& p, const cublasLtMatmulHeuristicResult_t* r, int n);
  static void destroy(MatmulPlan& p) noexcept;
  std::string cu_error(CUresult r) const;
  void release() noexcept;

  cudaDeviceProp prop_{};
  cudaStream_t stream_ = nullptr;  // the one compute stream (a CUstream for the driver)
  std::unordered_map<DevicePtr, size_t> allocations_;  // bytes; freed at destruction if the executor did not

  CuGetErrorString get_error_string_ = nullptr;
  CuModuleLoadData module_load_data_ = nullptr;
  CuModuleUnload module_unload_ = nullptr;
  CuModuleGetFunction module_get_function_ = nullptr;
  CuLaunchKernel launch_kernel_ = nullptr;
  CUmodule module_ = nullptr;
  // The loaded image, kept until the module is unloaded: with lazy loading (the default since
  // CUDA 12.2) a kernel is loaded at cuModuleGetFunction, after cuModuleLoadData has returned.
  std::vector<uint64_t> module_image_;
  std::string module_name_;  // "<source> (sm_90 image)", for messages
  std::unordered_map<std::string, CUfunction> functions_;
  std::unordered_map<CUfunction, std::string> symbols_;  // back, for launch errors

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::vector<MatmulPlan> plans_;
  std::unordered_map<std::string, Choice> choices_;
  bool tune_ = true;  // KILN_CUBLASLT_TUNE=0: the heuristic's first candidate that runs, untimed
  std::vector<cudaGraphExec_t> graphs_;
  std::vector<cudaEvent_t> timing_;  // profiling marks
};

CudaDevice::CudaDevice() {
  // No driver, a driver too old for this runtime, or no GPU all surface here.
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver)  // also what the runtime says when there is no driver at all
    throw Error("no CUDA GPU is usable: no NVIDIA driver, or one older than this CUDA " +
                std::to_string(CUDART_VERSION / 1000) + " runtime needs (cudaGetDeviceCount: " +
                cudaGetErrorString(e) + ")");
  if (e != cudaSuccess)
    throw Error(std::string("no CUDA GPU is usable: ") + cudaGetErrorString(e) +
                " (cudaGetDeviceCount); a cuda module needs an NVIDIA GPU and its driver");
  if (count == 0)
    throw Error("no CUDA GPU is usable: the driver reports no device (cudaGetDeviceCount); a cuda module needs "
                "an NVIDIA GPU and its driver");
  // Creates the GPU's primary context and makes it current (a busy exclusive-mode GPU fails here).
  int device = 0;
  (void)cudaGetDevice(&device);
  e = cudaSetDevice(device);
  if (e != cudaSuccess)
    throw Error(std::string("no CUDA GPU is usable: ") + cudaGetErrorString(e) + " (cudaSetDevice " +
                std::to_string(device) + "); a cuda module needs an NVIDIA GPU and its driver");
  check_cuda(cudaGetDeviceProperties(&prop_, device), "cudaGetDeviceProperties");
  const char* tune = std::getenv("KILN_CUBLASLT_TUNE");
  tune_ = !(tune && std::string(tune) == "0");
  try {
    // Non-blocking: the legacy default stream, which libraries may use, never waits for it.
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    get_error_string_ = driver_function<CuGetErrorString>("cuGetErrorString");
    module_load_data_ = driver_function<CuModuleLoadData>("cuModuleLoadData");
    module_unload_ = driver_function<CuModuleUnload>("cuModuleUnload");
    module_get_function_ = driver_function<CuModuleGetFunction>("cuModuleGetFunction");
    launch_kernel_ = driver_function<CuLaunchKernel>("cuLaunchKernel");
    check_lt(lt().cublasLtCreate(&lt_), "cuBLASLt", "cublasLtCreate");
    e = cudaMalloc(&workspace_, kWorkspaceBytes);
    if (e != cudaSuccess) {
      workspace_ = nullptr;
      throw Error(std::string("cannot allocate the cuBLASLt workspace (32 MiB) on ") + prop_.name + ": " +
                  cudaGetErrorString(e) + " (cudaMalloc)");
    }
  } catch (...) {
    release();
    throw;
  }
}

std::string CudaDevice::cu_error(CUresult r) const {
  const char* s = nullptr;
  if (get_error_string_ && get_error_string_(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUDA driver error " + std::to_string(int(r));
}

void CudaDevice::destroy(MatmulPlan& p) noexcept {
  if (p.out) lt().cublasLtMatrixLayoutDestroy(p.out);
  if (p.second) lt().cublasLtMatrixLayoutDestroy(p.second);
  if (p.first) lt().cublasLtMatrixLayoutDestroy(p.first);
  if (p.desc) lt().cublasLtMatmulDescDestroy(p.desc);
  p.out = p.second = p.first = nullptr;
  p.desc = nullptr;
}

// Everything the device holds, tolerating a half-built device and a broken context: errors are
// ignored (a destructor must not throw, and after a device fault every call fails anyway).
void CudaDevice::release() noexcept {
  if (stream_) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone) {
      cudaGraph_t graph = nullptr;  // a capture left open by an exception
      if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
    }
    (void)cudaStreamSynchronize(stream_);
  }
  for (cudaEvent_t e : timing_) (void)cudaEventDestroy(e);
  timing_.clear();
  for (cudaGraphExec_t g : graphs_) (void)cudaGraphExecDestroy(g);
  graphs_.clear();
  for (MatmulPlan& p : plans_) destroy(p);
  plans_.clear();
  if (lt_) (void)lt().cublasLtDestroy(lt_);
  lt_ = nullptr;
  if (workspace_) (void)cudaFree(workspace_);
  workspace_ = nullptr;
  for (const auto& [p, bytes] : allocations_) (void)cudaFree(ptr(p));
  allocations_.clear();
  if (module_ && module_unload_) (void)module_unload_(module_);
  module_ = nullptr;
  module_image_.clear();
  functions_.clear();
  symbols_.clear();
  if (stream_) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
  (void)cudaGetLastError();
}

DevicePtr CudaDevice::alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);  // device memory only: never managed memory
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory is not a sticky error: clear it and report
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error("cannot allocate " + std::to_string(bytes) + " bytes (" + gib(bytes) + " GiB) for " + what + " on " +
                prop_.name + ": " + cudaGetErrorString(e) + "; " + std::to_string(free_bytes) + " of " +
                std::to_string(total_bytes) + " bytes free (cudaMemGetInfo)");
  }
  DevicePtr d = reinterpret_cast<uintptr_t>(p);
  if (d) allocations_[d] = bytes;
  return d;
}

void CudaDevice::free(DevicePtr p) {
  if (!p) return;
  if (allocations_.erase(p) == 0) {
    char address[32];
    std::snprintf(address, sizeof address, "0x%llx", static_cast<unsigned long long>(p));
    throw Error(std::string("cudaFree: device address ") + address + " was not allocated here, or was freed twice");
  }
  check_cuda(cudaFree(ptr(p)), "cudaFree");
}

void CudaDevice::load_kernels(const Module& m) {
  const std::string arch = "sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor);
  const auto* images = m.fb().cuda_images();
  if (!images || images->size() == 0) {
    // Fine when nothing is to be launched (every product is a library call, or no kernels).
    size_t launches = 0;
    if (const auto* kernels = m.fb().kernels())
      for (const fb::Kernel* k : *kernels)
        if (k->cuda_functions()) launches += k->cuda_functions()->size();
    if (launches == 0) return;
    throw Error(m.source() + ": the module has " + std::to_string(launches) +
                " GPU functions to launch but no compiled kernels (cuda_images); recompile it with a kilnc "
                "that targets CUDA");
  }

  const CudaImageChoice pick = pick_cuda_image(m, prop_.major, prop_.minor, prop_.name);
  const auto* cubin = pick.image->cubin();
  // (Once per job, not once per rank; an environment the launcher check refuses is said elsewhere.)
  const auto rank_zero = [] {
    try {
      return launcher_rank().first == 0;
    } catch (const Error&) {
      return true;
    }
  };
  if (pick.jit && rank_zero())
    std::fprintf(stderr, "note: %s: no cubin for this GPU (%s, %s); the driver compiles the module's %s PTX for it\n",
                 m.source().c_str(), prop_.name, arch.c_str(), pick.image->arch()->c_str());

  if (module_) {  // a second module replaces the first
    (void)module_unload_(module_);
    module_ = nullptr;
    functions_.clear();
    symbols_.clear();
  }
  // The flatbuffer's bytes carry no alignment guarantee; the driver parses the ELF in place.
  // The zero word at the end would also terminate a PTX image.
  module_image_.assign(cubin->size() / 8 + 1, 0);
  std::memcpy(module_image_.data(), cubin->data(), cubin->size());
  module_name_ = m.source() + " (" + pick.image->arch()->str() + " kernels)";
  CUresult r = module_load_data_(&module_, module_image_.data());
  if (r != CUDA_SUCCESS) {
    module_ = nullptr;
    module_image_.clear();
    // A driver older than the NVRTC that compiled the kernels cannot read their PTX (nor, for
    // another architecture, their ELF): its version says whether that may be the cause.
    int driver = 0;
    const std::string supports = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0
                                     ? "the driver supports CUDA " + std::to_string(driver / 1000) + "." +
                                           std::to_string(driver % 1000 / 10)
                                     : "the driver's CUDA version is unknown";
    throw Error(module_name_ + ": cuModuleLoadData on " + prop_.name + ": " + cu_error(r) + " (" + supports +
                "; kernels NVRTC compiled for a later CUDA need a later driver)");
  }
}

Device::Function CudaDevice::function(const std::string& symbol) {
  auto it = functions_.find(symbol);
  if (it != functions_.end()) return it->second;
  if (!module_) throw Error("GPU function " + symbol + ": no kernels are loaded (load_kernels)");
  CUfunction f = nullptr;
  CUresult r = module_get_function_(&f, module_, symbol.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) throw Error(module_name_ + ": there is no function " + symbol);
  if (r != CUDA_SUCCESS) throw Error(module_name_ + ": cuModuleGetFunction " + symbol + ": " + cu_error(r));
  functions_.emplace(symbol, f);
  symbols_.emplace(f, symbol);
  return f;
}

void CudaDevice::launch(Function fn, unsigned grid, unsigned block, DevicePtr operands, DevicePtr ranges) {
  // The kernels are extern "C" __global__ void k(void* const* b, const long long* range): the
  // driver takes the address of each argument's value.
  CUfunction f = static_cast<CUfunction>(const_cast<void*>(fn));
  CUdeviceptr b = operands, range = ranges;
  void* params[] = {&b, &range};
  CUresult r = launch_kernel_(f, grid, 1, 1, block, 1, 1, 0, stream_, params, nullptr);
  if (r != CUDA_SUCCESS) {
    auto it = symbols_.find(f);
    throw Error(module_name_ + ": cuLaunchKernel " + (it != symbols_.end() ? it->second : std::string("?")) +
                " (grid " + std::to_string(grid) + ", block " + std::to_string(block) + "): " + cu_error(r));
  }
}

// The spec is row-major; lt_product says how column-major cuBLASLt is asked for it (its A is our
// B), and every operand, transpose and layout below is read from that.
Device::Matmul CudaDevice::plan_matmul(const MatmulSpec& s) {
  const EpilogueFlags ep = epilogue_flags(s.epilogue, s.where);
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) throw Error(s.where + ": empty matrix product (" + product(s) + ")");
  if (!s.a || !s.b || !s.d) throw Error(s.where + ": matrix product without A, B or D (" + product(s) + ")");
  if (s.beta != 0.0f && !s.c) throw Error(s.where + ": matrix product with beta != 0 but no C (" + product(s) + ")");
  if (ep.bias && !s.bias) throw Error(s.where + ": epilogue " + s.epilogue + " without a bias vector");
  if (ep.reads_aux() && !s.aux) throw Error(s.where + ": epilogue " + s.epilogue + " without an aux matrix");
  const LtProduct lp = lt_product(s);
  // (Named as the spec names them: cuBLASLt's A is our B.)
  const cudaDataType_t first_type = cuda_type(lp.a.type, s.where, "B");
  const cudaDataType_t second_type = cuda_type(lp.b.type, s.where, "A");
  const cudaDataType_t d_type = cuda_type(lp.d.type, s.where, "D");

  MatmulPlan p;
  p.spec = s;
  p.lt = lp;
  p.c = ptr(lp.c);
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    // CUBLAS_COMPUTE_32F: fp32 accumulation, and for fp32 inputs true fp32 products, not TF32
    // (that would be CUBLAS_COMPUTE_32F_FAST_TF32): the parity tests compare with fp32 references.
    check_lt_plan(lt().cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), s.where,
                  "cublasLtMatmulDescCreate");
    // One attribute of the product's descriptor, by value; `name` for the message.
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value, const char* name) {
      check_lt_plan(lt().cublasLtMatmulDescSetAttribute(p.desc, attr, &value, sizeof value), s.where,
                    (std::string("cublasLtMatmulDescSetAttribute ") + name).c_str());
    };
    set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(lp.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N), "TRANSA");
    set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(lp.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N), "TRANSB");
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(lt_epilogue(ep)), "EPILOGUE");
    if (ep.bias) {
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(ptr(s.bias)), "BIAS_POINTER");
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_type(s.bias_type, s.where, "bias")), "BIAS_DATA_TYPE");
    }
    if (ep.reads_aux()) {
      // The pre-GELU matrix, shaped like D.
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ptr(s.aux), "EPILOGUE_AUX_POINTER");
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, lp.aux_ld, "EPILOGUE_AUX_LD");
      // The default is D's type. Set only when it differs (kilnc never asks for that): the header
      // documents the attribute for fp8 products and an unsupported setting fails the call.
      const cudaDataType_t aux_type = cuda_type(s.aux_type, s.where, "aux");
      if (aux_type != d_type) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, int32_t(aux_type), "EPILOGUE_AUX_DATA_TYPE");
    }

    // Column-major layouts of what is stored, before the transposes.
    check_lt_plan(lt().cublasLtMatrixLayoutCreate(&p.first, first_type, lp.a.rows, lp.a.cols, lp.a.ld), s.where,
                  "cublasLtMatrixLayoutCreate (B)");
    check_lt_plan(lt().cublasLtMatrixLayoutCreate(&p.second, second_type, lp.b.rows, lp.b.cols, lp.b.ld), s.where,
                  "cublasLtMatrixLayoutCreate (A)");
    // C and D: one layout, so that in-place accumulation (C == D) has identical layouts.
    check_lt_plan(lt().cublasLtMatrixLayoutCreate(&p.out, d_type, lp.d.rows, lp.d.cols, lp.d.ld), s.where,
                  "cublasLtMatrixLayoutCreate (D)");

    check_lt_plan(lt().cublasLtMatmulPreferenceCreate(&pref), s.where, "cublasLtMatmulPreferenceCreate");
    const uint64_t workspace = kWorkspaceBytes;
    check_lt_plan(lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                            sizeof workspace),
                  s.where, "cublasLtMatmulPreferenceSetAttribute MAX_WORKSPACE_BYTES");
    const uint32_t align[4] = {alignment(lp.a.ptr), alignment(lp.b.ptr), alignment(lp.c), alignment(lp.d.ptr)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
      check_lt_plan(lt().cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]), s.where,
                    "cublasLtMatmulPreferenceSetAttribute MIN_ALIGNMENT");

    // The heuristic's candidates, best guess first; one product shape is planned once.
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    cublasStatus_t st = lt().cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.first, p.second, p.out, p.out, pref,
                                                            kCandidates, results, &found);
    int usable = 0;
    for (int i = 0; i < found; i++)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) results[usable++] = results[i];
    if (st != CUBLAS_STATUS_SUCCESS || usable == 0)
      throw MatmulUnsupported(s.where + ": cuBLASLt has no algorithm for this product (" + product(s) +
                              "; cublasLtMatmulAlgoGetHeuristic: " +
                              (st != CUBLAS_STATUS_SUCCESS ? lt().cublasLtGetStatusString(st)
                               : found == 0                ? "no result"
                                                           : lt().cublasLtGetStatusString(results[0].state)) +
                              ")");
    (void)lt().cublasLtMatmulPreferenceDestroy(pref);
    pref = nullptr;
    // One choice per shape (the product, and the alignments of every matrix and vector it reads
    // or writes), used by a later plan only if its own candidates include it.
    std::string shape = product(s) + " align";
    for (DevicePtr q : {s.a, s.b, DevicePtr(reinterpret_cast<uintptr_t>(p.c)), s.d, s.bias, s.aux})
      shape += " " + std::to_string(q ? alignment(q) : 0);
    auto known = choices_.find(shape);
    if (known != choices_.end()) {
      bool candidate = false;
      for (int i = 0; i < usable && !candidate; i++)
        candidate = std::memcmp(&results[i].algo, &known->second.algo, sizeof results[i].algo) == 0;
      if (!candidate) known = choices_.end();
    }
    if (known == choices_.end()) known = choices_.insert_or_assign(shape, choose(p, results, usable)).first;
    known->second.uses++;
    p.algo = known->second.algo;
  } catch (...) {
    if (pref) (void)lt().cublasLtMatmulPreferenceDestroy(pref);
    destroy(p);
    throw;
  }
  plans_.push_back(p);
  return plans_.size() - 1;
}

// cuBLASLt's heuristic guesses from a performance model, and a product it offers algorithms for
// may still be refused by the call itself (cublasLt.h: an unsupported EPILOGUE_AUX_DATA_TYPE
// "calling cublasLtMatmul() will return CUBLAS_INVALID_VALUE"), so every choice is tried on the
// plan's own operands first. Without tuning the first candidate that runs is kept. With tuning,
// each candidate that runs is timed (its trial call is the warm-up, then kTimed calls between two
// events) and the fastest is kept if it beats the first that ran by more than kMargin (timing
// noise alone must not change the choice, and with it the rounding, from one run to the next).
// If none runs, the product is refused (MatmulUnsupported: the executor then runs it plain, with
// the epilogue as a kernel of its own). Plans are made at load, before the arena holds anything
// (device.h), so what these calls write is overwritten before it is read.
CudaDevice::Choice CudaDevice::choose(const MatmulPlan& p, const cublasLtMatmulHeuristicResult_t* r, int n) {
  constexpr int kTimed = 5;
  constexpr float kMargin = 0.03f;
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start) (void)cudaEventDestroy(start);
      if (stop) (void)cudaEventDestroy(stop);
    }
  } ev;
  const float alpha = 1.0f, beta = p.spec.beta;
  auto call = [&](const cublasLtMatmulAlgo_t& algo) {
    return lt().cublasLtMatmul(lt_, p.desc, &alpha, ptr(p.lt.a.ptr), p.first, ptr(p.lt.b.ptr), p.second, &beta, p.c,
                               p.out, ptr(p.lt.d.ptr), p.out, &algo, workspace_, kWorkspaceBytes, stream_);
  };
  Choice c;
  c.candidates = n;
  cublasStatus_t refusal = CUBLAS_STATUS_SUCCESS;  // the first candidate's refusal, for the message
  int first = -1, best_i = -1, ran = 0;
  float best = -1.0f;
  for (int i = 0; i < n; i++) {
    const cublasStatus_t st = call(r[i].algo);
    if (st != CUBLAS_STATUS_SUCCESS) {
      if (refusal == CUBLAS_STATUS_SUCCESS) refusal = st;
      continue;
    }
    if (first < 0) first = i;
    ++ran;
    if (!tune_) break;
    if (!ev.start) {
      check_cuda(cudaEventCreate(&ev.start), "cudaEventCreate");
      check_cuda(cudaEventCreate(&ev.stop), "cudaEventCreate");
    }
    check_cuda(cudaEventRecord(ev.start, stream_), "cudaEventRecord");
    bool ok = true;
    for (int k = 0; k < kTimed && ok; k++) ok = call(r[i].algo) == CUBLAS_STATUS_SUCCESS;
    check_cuda(cudaEventRecord(ev.stop, stream_), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(ev.stop), "cudaEventSynchronize (timing cuBLASLt algorithms)");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime");
    if (!ok) continue;
    ms /= kTimed;
    if (i == first) c.first_ms = ms;
    if (best < 0.0f || ms < best) {
      best = ms;
      best_i = i;
    }
  }
  if (first < 0)
    throw MatmulUnsupported(p.spec.where + ": cuBLASLt refused each of the " + std::to_string(n) +
                            " algorithms its heuristic offered for this product (" + product(p.spec) +
                            "; cublasLtMatmul: " + lt().cublasLtGetStatusString(refusal) + ")");
  // A fault in a trial call shows here, while loading, rather than in the first step.
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (trying cuBLASLt algorithms)");
  c.algo = r[first].algo;
  if (best_i < 0 || ran < 2) return c;  // untimed, or nothing to compare: the first that ran
  if (best_i != first && c.first_ms > 0.0f && best > (1.0f - kMargin) * c.first_ms) best_i = first, best = c.first_ms;
  if (c.first_ms == 0.0f) c.first_ms = best;  // the first that ran failed its timed calls: no comparison
  c.algo = r[best_i].algo;
  c.best_ms = best;
  c.timed = true;
  c.changed = best_i != first;
  return c;
}

std::string CudaDevice::planning_note() const {
  int timed = 0, changed = 0;
  double first = 0.0, best = 0.0;
  for (const auto& [shape, c] : choices_) {
    if (!c.timed) continue;
    timed++;
    if (c.changed) changed++;
    first += double(c.first_ms) * c.uses;
    best += double(c.best_ms) * c.uses;
  }
  if (timed == 0) return "";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "cuBLASLt: timed the heuristic's candidates for %d product shapes at load; %d run over 3%% faster "
                "with another than its first guess (all planned products once: %.3f ms instead of %.3f ms; "
                "KILN_CUBLASLT_TUNE=0 keeps its first guess, the same in every run)",
                timed, changed, best, first);
  return buf;
}

void CudaDevice::matmul(Matmul i) {
  if (i >= plans_.size()) throw Error("cuBLASLt product " + std::to_string(i) + " was never planned");
  const MatmulPlan& p = plans_[i];
  // Host scalars (the default CUBLASLT_POINTER_MODE_HOST); cuBLASLt reads them during the call,
  // so a graph capture records their values.
  const float alpha = 1.0f, beta = p.spec.beta;
  cublasStatus_t st = lt().cublasLtMatmul(lt_, p.desc, &alpha, ptr(p.lt.a.ptr), p.first, ptr(p.lt.b.ptr), p.second, &beta,
                                          p.c, p.out, ptr(p.lt.d.ptr), p.out, &p.algo, workspace_, kWorkspaceBytes, stream_);
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(p.spec.where + ": cublasLtMatmul: " + lt().cublasLtGetStatusString(st) + " (" + product(p.spec) + ")");
}

bool CudaDevice::begin_capture() {
  // Thread-local: only this thread's unsafe calls (cudaMalloc, synchronizations) are refused
  // during the capture.
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

Device::Graph CudaDevice::end_capture() {
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph does not need it
  check_cuda(e, "cudaGraphInstantiate");
  graphs_.push_back(exec);
  return graphs_.size() - 1;
}

void CudaDevice::launch_graph(Graph g) {
  if (g >= graphs_.size()) throw Error("CUDA graph " + std::to_string(g) + " was never captured");
  check_cuda(cudaGraphLaunch(graphs_[g], stream_), "cudaGraphLaunch");
}

}  // namespace

std::unique_ptr<Device> make_cuda_device() { return std::make_unique<CudaDevice>(); }

void open_cublaslt() { (void)lt(); }

}  // namespace kiln
