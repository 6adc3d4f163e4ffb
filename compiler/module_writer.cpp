// The module writer: assigns buffers, then emits one instruction per op with the sizes the
// runtime kernel needs (see the opcode table in runtime/executor.cpp).
#include "compiler/module_writer.h"

#include <cstdio>
#include <map>
#include <sstream>

#include "compiler/attention_cpu.h"
#include "compiler/attention_cuda.h"
#include "compiler/attention_decode.h"
#include "compiler/kernel_build.h"
#include "compiler/kernel_codegen.h"
#include "compiler/pipeline.h"

#include "Kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/raw_ostream.h"
#include "runtime/module.h"
#include "runtime/version.h"
#include "schema/module_generated.h"

using namespace mlir;

namespace kiln {
namespace {

constexpr uint64_t kAlign = 256;  // cuBLASLt and 16-byte vector access are both happy
uint64_t alignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Buf {
  std::string name;
  fb::BufferKind kind;
  fb::DType dtype;
  std::vector<int64_t> shape;
  uint64_t size = 0, offset = 0;  // activations: planned offset within the activation region
};

struct Ins {
  fb::OpCode op;
  std::vector<uint32_t> in, out;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::string loc;
  fb::Phase phase = fb::Phase::Forward;
};

int64_t numel(Value v) { return cast<RankedTensorType>(v.getType()).getNumElements(); }
ArrayRef<int64_t> shape(Value v) { return cast<RankedTensorType>(v.getType()).getShape(); }

std::string locString(Location loc) {
  std::string s;
  llvm::raw_string_ostream os(s);
  loc.print(os);
  return s;
}

// "h.0.attn" from NameLoc("h.0.attn"(...)), else the op name.
std::string valueName(Operation* op) {
  if (auto n = dyn_cast<NameLoc>(op->getLoc())) return n.getName().str() + "/" + op->getName().stripDialect().str();
  return op->getName().stripDialect().str();
}

class Writer {
 public:
  Writer(ModuleOp module, const ModelSpec& spec, const WriteOptions& options)
      : module_(module), spec_(spec), options_(options),
        target_(spec.target == "cuda" ? Target::Cuda : Target::Cpu) {}

  FailureOr<std::vector<uint8_t>> run() {
    for (ParameterOp p : module_.getOps<ParameterOp>()) declareParameter(p);
    // Every bf16 read of a parameter reads its compute copy, which the optimizer refreshes: known
    // before any program is lowered, so the optimizer's kernel writes every copy some program reads.
    module_.walk([&](ParamOp p) {
      ParamBuffers& pb = paramBufs_.at(p.getName().str());
      if (cast<RankedTensorType>(p.getType()).getElementType().isBF16() && pb.copy < 0)
        pb.copy = int32_t(addBuffer(p.getName().str() + ".bf16", fb::BufferKind::ComputeCopy, p.getType()));
    });
    std::vector<std::pair<std::string, std::vector<Ins>>> programs;
    std::vector<uint32_t> results;
    std::vector<uint64_t> sizes;
    uint64_t activations = 0, naive = 0;
    TimingScope lowering = nest("lower programs to instructions");
    for (StringRef name : kProgramNames) {
      auto f = module_.lookupSymbol<func::FuncOp>(name);
      if (!f) continue;
      auto planned = f->getAttrOfType<IntegerAttr>("kiln.arena_size");
      if (!planned)
        return f.emitError() << "kilnc: @" << name << " has no buffer plan (run kiln-plan-buffers)";
      activations = std::max(activations, uint64_t(planned.getInt()));
      sizes.push_back(uint64_t(planned.getInt()));
      const size_t firstBuffer = bufs_.size();
      std::vector<Ins> code;
      uint32_t result = 0;
      if (failed(lowerFunction(f, code, result))) return failure();
      uint64_t sum = 0, end = 0;
      for (size_t i = firstBuffer; i < bufs_.size(); ++i)
        if (bufs_[i].kind == fb::BufferKind::Activation) {
          sum += alignUp(bufs_[i].size);
          end = std::max(end, bufs_[i].offset + alignUp(bufs_[i].size));
        }
      // kiln-plan-buffers sets the size to where its buffers end: an edited one either leaves
      // buffers outside the arena or asks for memory no buffer uses.
      if (planned.getInt() < 0 || uint64_t(planned.getInt()) != end)
        return f.emitError() << "kilnc: @" << name << " has kiln.arena_size = " << planned.getInt()
                             << " but its planned buffers (kiln.offsets) end at " << end
                             << " bytes (kiln-plan-buffers sets it to that)";
      naive = std::max(naive, sum);
      programs.emplace_back(name.str(), std::move(code));
      results.push_back(result);
    }
    lowering.stop();
    if (failed(buildKernels())) return failure();
    TimingScope serializing = nest("serialize the module");
    for (auto& [name, code] : programs)
      for (Ins& ins : code)
        if (ins.op == fb::OpCode::Kernel) ins.ints[0] = int64_t(fusionToKernel_[size_t(ins.ints[0])]);
    // The state region first, in declaration order; planned activations after it.
    uint64_t state = 0;
    for (Buf& b : bufs_)
      if (b.kind != fb::BufferKind::Activation) b.offset = state, state += alignUp(b.size);
    for (Buf& b : bufs_)
      if (b.kind == fb::BufferKind::Activation) b.offset += state;
    return serialize(programs, results, sizes, state, activations, naive);
  }

 private:
  // A phase of the writer under kilnc --timing (a no-op scope without it).
  TimingScope nest(const char* name) { return options_.timing ? options_.timing->nest(name) : TimingScope(); }

  uint32_t addBuffer(std::string name, fb::BufferKind kind, Type type, uint64_t offset = 0) {
    auto t = cast<RankedTensorType>(type);
    Buf b{std::move(name), kind, dtypeOf(t.getElementType()), t.getShape().vec()};
    b.offset = offset;
    b.size = uint64_t(t.getNumElements()) * (b.dtype == fb::DType::BF16 ? 2 : 4);
    bufs_.push_back(b);
    return uint32_t(bufs_.size() - 1);
  }
  static fb::DType dtypeOf(Type t) {
    if (t.isInteger(32)) return fb::DType::I32;
    if (t.isBF16()) return fb::DType::BF16;
    return fb::DType::F32;
  }

  struct ParamBuffers {
    uint32_t value, grad, m, v;
    int32_t copy = -1;
    int64_t numel = 0;
  };
  void declareParameter(ParameterOp p) {
    std::string n = p.getSymName().str();
    ParamBuffers pb{addBuffer(n, fb::BufferKind::Parameter, p.getType()),
                    addBuffer(n + ".grad", fb::BufferKind::Gradient, p.getType()),
                    addBuffer(n + ".adam_m", fb::BufferKind::AdamM, p.getType()),
                    addBuffer(n + ".adam_v", fb::BufferKind::AdamV, p.getType())};
    pb.numel = p.getTensorType().getNumElements();
    params_.push_back(p);
    paramBufs_[n] = pb;
  }

  uint32_t named(std::map<std::string, uint32_t>& table, const std::string& name,
                 fb::BufferKind kind, Type type) {
    auto it = table.find(name);
    if (it != table.end()) return it->second;
    return table[name] = addBuffer(name, kind, type);
  }

  // A planned offset is the buffer's place in the arena. The dialect's verifier holds every
  // offset to a multiple of kAlign or -1, the mark of state kept outside the arena, which an op
  // the runtime runs cannot carry.
  static LogicalResult checkOffset(Operation* op, DenseI64ArrayAttr offsets, unsigned i, const char* whose) {
    const int64_t o = offsets[i];
    if (o >= 0) return success();
    return op->emitError() << "kilnc: kiln.offsets[" << i << "] = " << o << " is negative (" << whose
                           << " place in the arena; run kiln-plan-buffers)";
  }

  LogicalResult lowerFunction(func::FuncOp f, std::vector<Ins>& code, uint32_t& result) {
    llvm::DenseMap<Value, uint32_t> buf;
    auto of = [&](Value v) { return buf.lookup(v); };
    Block& body = f.getBody().front();
    // Phases: in @micro_step the backward pass follows the op that defines the loss.
    Operation* loss = f.getName() == "micro_step" ? body.getTerminator()->getOperand(0).getDefiningOp() : nullptr;
    bool backward = false;
    for (Operation& op : body) {
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        result = of(ret.getOperand(0));
        continue;
      }
      // Values that name existing storage.
      if (auto p = dyn_cast<ParamOp>(op)) {
        // A bf16 read is the parameter's compute copy (made in run()).
        ParamBuffers& pb = paramBufs_.at(p.getName().str());
        if (cast<RankedTensorType>(p.getType()).getElementType().isBF16()) {
          buf[p] = uint32_t(pb.copy);
        } else {
          buf[p] = pb.value;
        }
        continue;
      }
      if (auto g = dyn_cast<GradOp>(op)) { buf[g] = paramBufs_.at(g.getName().str()).grad; continue; }
      if (auto in = dyn_cast<InputOp>(op)) {
        buf[in] = named(inputs_, in.getInputName().str(), fb::BufferKind::Input, in.getType());
        continue;
      }
      if (auto h = dyn_cast<HyperOp>(op)) {
        buf[h] = named(hypers_, h.getHyperName().str(), fb::BufferKind::Hyper, h.getType());
        continue;
      }
      if (auto r = dyn_cast<ReshapeOp>(op)) { buf[r] = of(r.getInput()); continue; }
      // A key/value cache is storage the plan keeps for the whole call; no kernel fills it.
      if (auto kv = dyn_cast<KvCacheOp>(op)) {
        auto offsets = op.getAttrOfType<DenseI64ArrayAttr>("kiln.offsets");
        if (!offsets || offsets.size() != 1) return op.emitError() << "kilnc: " << op.getName() << " has no planned offsets ('kiln.offsets'): run kiln-plan-buffers";
        if (failed(checkOffset(&op, offsets, 0, "the cache's"))) return failure();
        buf[kv] = addBuffer(kv.getCacheName().str() + "/kv_cache", fb::BufferKind::Activation, kv.getType(),
                            uint64_t(offsets[0]));
        continue;
      }
      // Ops inside fusion regions must not be planned: only the region's results are buffers.

      Ins ins;
      ins.loc = locString(op.getLoc());
      ins.phase = f.getName() == "optimizer_step" ? fb::Phase::Optimizer
                  : op.hasAttr("kiln.recomputed")  ? fb::Phase::Recompute
                  : backward                       ? fb::Phase::Backward
                                                   : fb::Phase::Forward;
      if (&op == loss) backward = true;
      for (Value v : op.getOperands()) ins.in.push_back(of(v));
      auto offsets = op.getAttrOfType<DenseI64ArrayAttr>("kiln.offsets");
      if (op.getNumResults() && (!offsets || offsets.size() != int64_t(op.getNumResults())))
        return op.emitError() << "kilnc: " << op.getName() << " has no planned offsets ('kiln.offsets'): run kiln-plan-buffers";
      for (Value r : op.getResults()) {
        const unsigned i = cast<OpResult>(r).getResultNumber();
        std::string name = valueName(&op);
        // A backward op keeps its forward op's location: its buffers are named as the backward's
        // ("head/backward/matmul", the gradient of the head's input, beside "head/matmul").
        if (ins.phase == fb::Phase::Backward)
          name.insert(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1, "backward/");
        if (op.getNumResults() > 1) name += "#" + std::to_string(i);
        if (failed(checkOffset(&op, offsets, i, "the result's"))) return failure();
        uint32_t b = addBuffer(name, fb::BufferKind::Activation, r.getType(), uint64_t(offsets[i]));
        buf[r] = b;
        ins.out.push_back(b);
      }
      if (failed(encode(op, ins))) return failure();
      code.push_back(std::move(ins));
    }
    return success();
  }

  // A fusion region: its generated kernel, with the state its ops write as extra outputs.
  LogicalResult encodeFusion(FusionOp f, Ins& ins) {
    for (const StateWrite& w : stateWrites(f, hasCopy())) {
      const ParamBuffers& pb = paramBufs_.at(w.param);
      switch (w.role) {
        case StateWrite::Grad: ins.out.push_back(pb.grad); break;
        case StateWrite::Value: ins.out.push_back(pb.value); break;
        case StateWrite::AdamM: ins.out.push_back(pb.m); break;
        case StateWrite::AdamV: ins.out.push_back(pb.v); break;
        case StateWrite::ComputeCopy: ins.out.push_back(uint32_t(pb.copy)); break;
      }
    }
    ins.op = fb::OpCode::Kernel;
    ins.ints = {int64_t(fusions_.size())};
    fusions_.push_back({f, nullptr, ins.in, ins.out});
    return success();
  }

  std::function<bool(llvm::StringRef)> hasCopy() const {
    return [this](llvm::StringRef name) {
      auto it = paramBufs_.find(name.str());
      return it != paramBufs_.end() && it->second.copy >= 0;
    };
  }

  // A kernel's source without what only names its region: the location line and the comments
  // after a declaration (`float* grad2 = (float*)b[2];  // h.3.mlp.c_fc.weight.grad`).
  static std::string sharedCode(const std::string& source) {
    std::string out;
    std::istringstream in(source);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("// at ", 0) == 0) continue;
      if (size_t c = line.find(";  // "); c != std::string::npos && line.find("= (") != std::string::npos)
        line.erase(c + 1);
      out += line + "\n";
    }
    return out;
  }

  // Generates every fusion region's source for the target and compiles it. Regions that
  // generate the same code (the same kernel in every layer) share one kernel.
  LogicalResult buildKernels() {
    if (fusions_.empty()) return success();
    TimingScope generating = nest("generate kernel sources");
    bool bf16Products = false;  // some kernel calls the prelude's bf16_matmul
    std::map<std::string, uint32_t> byCode;
    std::vector<std::string> texts;  // per kernel
    std::vector<size_t> uses;        // fusion regions per kernel
    const std::string placeholder = "KILN_KERNEL_SYMBOL";
    for (size_t k = 0; k < fusions_.size(); ++k) {
      Fusion& fu = fusions_[k];
      FailureOr<GeneratedKernel> gen;
      KernelInfo info;
      if (fu.attention) {
        gen = attentionKernel(fu.attention, placeholder);
        if (failed(gen)) return failure();
        {  // the location line the other kernels have, under the first ("shared by" refers to it)
          std::string loc;
          llvm::raw_string_ostream os(loc);
          fu.attention->getLoc().print(os);
          gen->source.insert(gen->source.find('\n') + 1, "// at " + loc + "\n");
        }
        info.name = info.kind = fu.attention->getName().stripDialect().str();
        info.ops = {info.name};
      } else {
        gen = generateKernel(fu.op, placeholder, target_, hasCopy());
        if (failed(gen)) return failure();  // it said why, at the op it cannot take
        info.name = fu.op.getKernel().str();
        info.kind = fu.op.getKind().str();
        for (Operation& op : fu.op.getFusedOps()) info.ops.push_back(op.getName().stripDialect().str());
      }
      const std::string& name = info.name;
      info.flops = gen->flops;
      info.tensorFlops = gen->tensorFlops;
      info.grid = gen->cudaGrid;
      info.block = gen->cudaBlock;
      info.cublasLt = gen->cublasLt;
      info.matmul = gen->matmul;
      info.hasFunction = target_ == Target::Cuda ? !gen->functions.empty()
                                                 : gen->source.find(placeholder + "(") != std::string::npos;
      info.launches = gen->launches;
      info.zero = gen->zeroOperands;
      info.functions = gen->functions;
      info.scratch = gen->cudaScratchBytes;
      bf16Products |= gen->cpuBf16Matmul;
      for (uint32_t b : fu.in) info.numel.push_back(int64_t(bufs_[b].size / (bufs_[b].dtype == fb::DType::BF16 ? 2 : 4))),
                               info.dtype.push_back(bufs_[b].dtype);
      for (uint32_t b : fu.out) info.numel.push_back(int64_t(bufs_[b].size / (bufs_[b].dtype == fb::DType::BF16 ? 2 : 4))),
                                info.dtype.push_back(bufs_[b].dtype);
      if (fu.op)
        for (const StateWrite& w : stateWrites(fu.op, hasCopy()))
          if (w.role == StateWrite::Value) info.adamw.push_back(paramBufs_.at(w.param).value);
      // The code without the comments that name its region's buffers decides whether an
      // earlier kernel is the same (then it runs on this region's operand table). The kernels
      // whose adamw_params list this region's parameters stay apart.
      std::string code = sharedCode(gen->source);
      for (uint32_t b : info.adamw) code += "\n// adamw " + std::to_string(b);
      if (auto it = byCode.find(code); it != byCode.end()) {
        fusionToKernel_.push_back(it->second);
        ++uses[it->second];
        continue;
      }
      const uint32_t index = uint32_t(kernels_.size());
      info.symbol = "k" + std::to_string(index) + "_" + name;
      if (info.symbol.size() > 120) info.symbol = info.symbol.substr(0, 120);
      byCode[code] = index;
      fusionToKernel_.push_back(index);
      std::string text = gen->source;
      for (size_t at = text.find(placeholder); at != std::string::npos; at = text.find(placeholder, at))
        text.replace(at, placeholder.size(), info.symbol);
      for (CudaKernelLaunch& f : info.functions)
        if (f.symbol.compare(0, placeholder.size(), placeholder) == 0)
          f.symbol = info.symbol + f.symbol.substr(placeholder.size());
      texts.push_back(std::move(text));
      uses.push_back(1);
      kernels_.push_back(std::move(info));
    }
    std::string source = kernelPrelude(target_, bf16Products);
    for (size_t k = 0; k < texts.size(); ++k) {
      if (uses[k] > 1) {  // said under the location line (else the first line), which is the first region's
        size_t at = texts[k].find("\n// at ");
        at = texts[k].find('\n', at == std::string::npos ? 0 : at + 1) + 1;
        texts[k].insert(at, "// shared by " + std::to_string(uses[k]) +
                                " regions; the location above is the first one's\n");
      }
      source += texts[k] + "\n";
    }
    kernelSource_ = source;
    if (!options_.dumpKernelsDir.empty()) {
      std::string error;
      if (!dumpKernelSource(options_.dumpKernelsDir, target_, source, kernelManifest(), error))
        return emitError(UnknownLoc::get(module_.getContext())) << "--dump-kernels: " << error;
    }
    generating.stop();
    // (--timing names where the time went: a CPU library from the kernel cache compiles nothing.)
    std::optional<std::vector<uint8_t>> cachedLibrary;
    const bool cache = target_ == Target::Cpu && cpuKernelCacheEnabled();
    if (cache) {
      TimingScope lookup = nest("look up the kernel cache");
      cachedLibrary = cachedCpuKernels(source);
    }
    TimingScope compiling = nest(target_ != Target::Cpu ? "compile kernels (NVRTC, for sm_80 and sm_90 at once)"
                                 : cachedLibrary        ? "compile kernels: none (the kernel cache had their library)"
                                 : cache                ? "compile kernels (host C++ compiler; the kernel cache had none)"
                                                        : "compile kernels (host C++ compiler; no kernel cache: KILN_KERNEL_CACHE=off or no HOME)");
    std::string error;
    // The one slow step of a compile (seconds for GPT-2 124M): said before it starts, unless the
    // kernel cache has the CPU library already.
    auto say = [&] {
      std::fprintf(stderr, "kilnc: compiling %zu generated kernels (%s)\n", kernels_.size(),
                   target_ == Target::Cpu ? "host C++ compiler" : "NVRTC, for sm_80 and sm_90");
    };
    if (target_ == Target::Cpu) {
      if (!cachedLibrary) say();
      auto lib = cachedLibrary ? std::move(cachedLibrary) : compileCpuKernels(source, error);
      if (!lib) return module_.emitError() << "kilnc: compiling the generated CPU kernels failed: " << error;
      cpuLibrary_ = std::move(*lib);
    } else {
      say();
      auto images = compileCudaKernels(source, error, options_.cudaLineInfo);
      if (!images) return module_.emitError() << "kilnc: compiling the generated CUDA kernels failed: " << error;
      cudaImages_ = std::move(*images);
      // Each launch against what ptxas made of its function, so that a kernel the GPU would
      // refuse ("too many resources requested") is found here, on a machine without one.
      for (const CudaImageBuild& image : cudaImages_)
        for (const KernelInfo& k : kernels_)
          for (const CudaKernelLaunch& f : k.functions)
            for (const CudaFunctionResources& r : image.resources)
              if (r.symbol == f.symbol)
                if (const std::string problem = launchResourceProblem(r, f.block); !problem.empty())
                  return module_.emitError() << "kilnc: CUDA kernel " << f.symbol << " (" << k.name << ") cannot launch on "
                                             << image.arch << ": " << problem;
    }
    return success();
  }

  static flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::CudaFunction>>> cudaFunctions(
      flatbuffers::FlatBufferBuilder& fbb, const std::vector<CudaKernelLaunch>& fns) {
    if (fns.empty()) return 0;
    std::vector<flatbuffers::Offset<fb::CudaFunction>> v;
    for (const CudaKernelLaunch& f : fns) v.push_back(fb::CreateCudaFunctionDirect(fbb, f.symbol.c_str(), f.grid, f.block));
    return fbb.CreateVector(v);
  }

  // Flash-style attention kernels for one attention op (compiler/attention_cpu.cpp and
  // compiler/attention_cuda.cpp).
  FailureOr<GeneratedKernel> attentionKernel(Operation* op, const std::string& symbol) {
    if (auto d = dyn_cast<DecodeAttentionOp>(op)) return decodeAttentionKernel(d, symbol);
    Value qkv = isa<AttentionOp>(op) ? op->getOperand(0) : op->getOperand(1);
    auto t = cast<RankedTensorType>(qkv.getType());
    const int64_t heads = isa<AttentionOp>(op) ? int64_t(cast<AttentionOp>(op).getNumHeads())
                                               : int64_t(cast<AttentionGradOp>(op).getNumHeads());
    AttentionShape shape{t.getDimSize(0), t.getDimSize(1), t.getDimSize(2) / 3, heads, t.getElementType().isBF16(),
                         options_.simtAttention, options_.attentionRows};
    try {
      GeneratedKernel k;
      const std::string head =
          "// " + op->getName().stripDialect().str() + " kernel (flash style: the T x T scores are never stored)\n";
      if (target_ == Target::Cpu) {
        k.source = head + (isa<AttentionOp>(op) ? cpuAttentionForward(symbol, shape) : cpuAttentionBackward(symbol, shape));
      } else {
        AttentionSource src = isa<AttentionOp>(op) ? cudaAttentionForward(symbol, shape) : cudaAttentionBackward(symbol, shape);
        k.source = head + src.source;
        k.functions = src.launches;
        k.launches = unsigned(src.launches.size());
        k.cudaScratchBytes = src.scratch_bytes;
        k.tensorFlops = src.tensor_flops;
      }
      const double B = double(shape.B), T = double(shape.T), C = double(shape.C);
      k.flops = (isa<AttentionOp>(op) ? 4.0 : 8.0) * B * T * T * C;  // the convention of kiln-inspect
      if (!k.functions.empty()) k.cudaGrid = k.functions[0].grid, k.cudaBlock = k.functions[0].block;
      return k;
    } catch (const std::exception& e) {
      return op->emitError() << "kilnc: CUDA: " << op->getName() << ": " << e.what();
    }
  }

  FailureOr<GeneratedKernel> decodeAttentionKernel(DecodeAttentionOp op, const std::string& symbol) {
    auto qkv = cast<RankedTensorType>(op.getQkv().getType());
    auto cache = cast<RankedTensorType>(op.getCache().getType());
    const int64_t rows = cache.getDimSize(1);
    DecodeAttentionShape shape{rows, qkv.getDimSize(1) / 3, int64_t(op.getNumHeads()), cache.getDimSize(3),
                               qkv.getElementType().isBF16(), qkv.getDimSize(0) / rows};
    try {
      GeneratedKernel k;
      const std::string head = shape.M == 1
                                   ? "// decode_attention kernel (one new position per row against the key/value cache)\n"
                                   : "// decode_attention kernel (" + std::to_string(shape.M) +
                                         " new positions per row against the key/value cache: a prompt read in)\n";
      if (target_ == Target::Cpu) {
        k.source = head + cpuDecodeAttention(symbol, shape);
      } else {
        CudaKernelLaunch launch;
        k.source = head + cudaDecodeAttention(symbol, shape, launch);
        k.functions = {launch};
        k.cudaGrid = launch.grid, k.cudaBlock = launch.block;
      }
      k.flops = decodeAttentionFlops(shape);
      return k;
    } catch (const std::exception& e) {
      return op.emitError() << "kilnc: " << e.what();
    }
  }

  // A header, then one line per kernel: symbol, kind and the ops it fuses (written beside dumped
  // sources).
  std::string kernelManifest() const {
    std::string text = "symbol\tkind\tfused ops\n";
    for (const KernelInfo& k : kernels_) {
      text += k.symbol + "\t" + k.kind + "\t";
      for (size_t i = 0; i < k.ops.size(); ++i) text += (i ? " " : "") + k.ops[i];
      text += "\n";
    }
    return text;
  }

  // Opcode and size attributes of one op; the layouts match runtime/executor.cpp.
  LogicalResult encode(Operation& op, Ins& ins) {
    using O = fb::OpCode;
    if (auto f = dyn_cast<FusionOp>(op)) return encodeFusion(f, ins);
    // Attention: a template kernel (fused CPU path and CUDA); --no-fusion runs the built-in one.
    if ((target_ == Target::Cuda || options_.fusion) && isa<AttentionOp, AttentionGradOp, DecodeAttentionOp>(op)) {
      ins.op = fb::OpCode::Kernel;
      ins.ints = {int64_t(fusions_.size())};
      fusions_.push_back({FusionOp(), &op, ins.in, ins.out});
      return success();
    }
    auto set = [&](O code, std::vector<int64_t> ints) {
      ins.op = code;
      ins.ints = std::move(ints);
      return success();
    };
    return llvm::TypeSwitch<Operation*, LogicalResult>(&op)
        .Case([&](EmbeddingOp o) {
          return set(O::Embedding, {numel(o.getIndices()), shape(o.getTable())[0], shape(o.getTable())[1]});
        })
        .Case([&](EmbeddingGradOp o) {
          return set(O::EmbeddingGrad, {numel(o.getIndices()), shape(o.getResult())[0], shape(o.getResult())[1]});
        })
        .Case([&](MatmulOp o) {
          auto c = shape(o.getResult());
          auto a = shape(o.getLhs());
          int64_t k = o.getTransposeLhs() ? a[0] : a[1];
          return set(O::Matmul, {c[0], c[1], k, o.getTransposeLhs(), o.getTransposeRhs()});
        })
        .Case([&](AddOp o) { return set(O::Add, {numel(o.getResult())}); })
        .Case([&](MulOp o) { return set(O::Mul, {numel(o.getResult())}); })
        .Case([&](ScaleOp o) { return set(O::Scale, {numel(o.getResult())}); })
        .Case([&](GeluOp o) { return set(O::Gelu, {numel(o.getResult())}); })
        .Case([&](GeluGradOp o) { return set(O::GeluGrad, {numel(o.getResult())}); })
        .Case([&](BroadcastOp o) {
          int64_t k = numel(o.getInput());
          return set(O::Broadcast, {numel(o.getResult()) / k, k});
        })
        .Case([&](ReduceSumOp o) {
          int64_t k = numel(o.getResult());
          return set(O::ReduceSum, {numel(o.getInput()) / k, k});
        })
        .Case([&](TransposeOp o) { return set(O::Transpose, {shape(o.getInput())[0], shape(o.getInput())[1]}); })
        .Case([&](SplitOp o) {
          int64_t k = shape(o.getInput()).back();
          std::vector<int64_t> ints{numel(o.getInput()) / k, k};
          for (Value r : o.getResults()) ints.push_back(shape(r).back());
          return set(O::Split, ints);
        })
        .Case([&](ConcatOp o) {
          int64_t k = shape(o.getResult()).back();
          std::vector<int64_t> ints{numel(o.getResult()) / k, k};
          for (Value v : o.getInputs()) ints.push_back(shape(v).back());
          return set(O::Concat, ints);
        })
        .Case([&](ZerosOp o) { return set(O::Zeros, {numel(o.getResult())}); })
        .Case([&](CastOp o) { return set(O::Cast, {numel(o.getResult())}); })
        .Case([&](IotaOp o) { return set(O::Iota, {numel(o.getResult())}); })
        .Case([&](LayerNormOp o) {
          int64_t c = shape(o.getInput()).back();
          ins.floats = {o.getEpsilon().convertToFloat()};
          return set(O::LayerNorm, {numel(o.getInput()) / c, c});
        })
        .Case([&](LayerNormGradOp o) {
          int64_t c = shape(o.getInput()).back();
          return set(O::LayerNormGrad, {numel(o.getInput()) / c, c});
        })
        .Case([&](AttentionOp o) {
          auto s = shape(o.getResult());
          return set(O::Attention, {s[0], s[1], s[2], int64_t(o.getNumHeads())});
        })
        .Case([&](DecodeAttentionOp o) {  // B, C, H, S, M
          auto s = shape(o.getResult());
          auto cache = shape(o.getCache());
          return set(O::DecodeAttention, {cache[1], s[1], int64_t(o.getNumHeads()), cache[3], s[0] / cache[1]});
        })
        .Case([&](AttentionGradOp o) {
          auto s = shape(o.getResult());
          return set(O::AttentionGrad, {s[0], s[1], s[2], int64_t(o.getNumHeads())});
        })
        .Case([&](CrossEntropyOp o) {  // N, Vp (row stride), V (real classes)
          auto s = shape(o.getLogits());
          return set(O::CrossEntropy, {s[0], s[1], int64_t(o.getNumClasses().value_or(s[1]))});
        })
        .Case([&](CrossEntropyGradOp o) {
          auto s = shape(o.getLogits());
          return set(O::CrossEntropyGrad, {s[0], s[1], int64_t(o.getNumClasses().value_or(s[1]))});
        })
        .Case([&](AccumulateGradOp o) {
          ins.out = {paramBufs_.at(o.getName().str()).grad};
          return set(O::AccumulateGrad, {numel(o.getGradient())});
        })
        .Case([&](GlobalNormOp o) {
          std::vector<int64_t> ints;
          for (Value v : o.getInputs()) ints.push_back(numel(v));
          return set(O::GlobalNorm, ints);
        })
        .Case([&](ClipCoefOp) { return set(O::ClipCoef, {}); })
        .Case([&](ReduceGradientsOp o) {
          std::vector<int64_t> ints{int64_t(o.getBucket())};
          for (Attribute a : o.getParams()) {
            const ParamBuffers& pb = paramBufs_.at(cast<FlatSymbolRefAttr>(a).getValue().str());
            ins.in.push_back(pb.grad);
            ints.push_back(pb.numel);
          }
          return set(O::ReduceGradients, ints);
        })
        .Case([&](WaitGradientsOp) { return set(O::WaitGradients, {}); })
        .Case([&](AdamWOp o) {
          const ParamBuffers& pb = paramBufs_.at(o.getName().str());
          ins.out = {pb.value, pb.m, pb.v};
          if (pb.copy >= 0) ins.out.push_back(uint32_t(pb.copy));  // refreshed in the same kernel
          return set(O::AdamW, {numel(o.getGrad()), o.getDecay() ? 1 : 0});
        })
        .Default([&](Operation* other) {
          return other->emitError() << "kilnc: no runtime kernel for '" << other->getName() << "'";
        });
  }

  std::vector<uint8_t> serialize(const std::vector<std::pair<std::string, std::vector<Ins>>>& programs,
                                 const std::vector<uint32_t>& results,
                                 const std::vector<uint64_t>& sizes, uint64_t state,
                                 uint64_t activations, uint64_t naive) {
    flatbuffers::FlatBufferBuilder fbb(1 << 16);
    std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
    for (const Buf& b : bufs_)
      buffers.push_back(fb::CreateBufferDirect(fbb, b.name.c_str(), b.kind, b.dtype, &b.shape, b.offset, b.size));
    std::vector<flatbuffers::Offset<fb::Parameter>> params;
    for (ParameterOp p : params_) {
      const ParamBuffers& pb = paramBufs_.at(p.getSymName().str());
      std::vector<int64_t> s = p.getTensorType().getShape().vec();
      fb::Init init = p.getInit() == "normal" ? fb::Init::Normal
                      : p.getInit() == "ones" ? fb::Init::Ones : fb::Init::Zeros;
      params.push_back(fb::CreateParameterDirect(fbb, p.getSymName().str().c_str(), &s, init,
                                                 p.getInitStd().convertToFloat(), p.getDecay(),
                                                 pb.value, pb.grad, pb.m, pb.v, pb.copy));
    }
    std::vector<flatbuffers::Offset<fb::Program>> progs;
    for (size_t i = 0; i < programs.size(); ++i) {
      std::vector<flatbuffers::Offset<fb::Instr>> instrs;
      for (const Ins& in : programs[i].second)
        instrs.push_back(fb::CreateInstrDirect(fbb, in.op, &in.in, &in.out, &in.ints, &in.floats,
                                               in.loc.c_str(), in.phase));
      progs.push_back(fb::CreateProgramDirect(fbb, programs[i].first.c_str(), &instrs, results[i], sizes[i]));
    }
    auto model = fb::CreateModelDirect(fbb, spec_.n_layer, spec_.n_head, spec_.n_embd, spec_.vocab_size,
                                       spec_.block_size, spec_.batch_size, spec_.seq_len,
                                       spec_.precision.c_str(), spec_.target.c_str(), spec_.path.c_str());
    std::vector<flatbuffers::Offset<fb::Kernel>> kernels;
    for (const KernelInfo& k : kernels_) {
      std::vector<flatbuffers::Offset<flatbuffers::String>> ops;
      for (const std::string& o : k.ops) ops.push_back(fbb.CreateString(o));
      std::vector<fb::DType> dtypes(k.dtype.begin(), k.dtype.end());
      std::vector<std::underlying_type_t<fb::DType>> rawDtypes;
      for (fb::DType d : dtypes) rawDtypes.push_back(static_cast<std::underlying_type_t<fb::DType>>(d));
      kernels.push_back(fb::CreateKernel(
          fbb, fbb.CreateString(k.symbol), fbb.CreateString(k.name), fbb.CreateString(k.kind), fbb.CreateVector(ops),
          k.flops, fbb.CreateVector(k.numel),
          fbb.CreateVector(reinterpret_cast<const fb::DType*>(rawDtypes.data()), rawDtypes.size()),
          fbb.CreateVector(k.adamw), k.grid, k.block, k.cublasLt.empty() ? 0 : fbb.CreateString(k.cublasLt),
          k.launches,
          k.matmul ? fb::CreateMatmulCall(fbb, k.matmul->m, k.matmul->n, k.matmul->k, k.matmul->transA,
                                          k.matmul->transB, k.matmul->a, k.matmul->b, k.matmul->bias,
                                          k.matmul->aux, k.matmul->c, k.matmul->d, k.matmul->beta,
                                          fbb.CreateString(k.matmul->epilogue))
                   : 0,
          k.hasFunction, cudaFunctions(fbb, k.functions), k.zero.empty() ? 0 : fbb.CreateVector(k.zero),
          k.scratch, k.tensorFlops));
    }
    std::vector<flatbuffers::Offset<fb::CudaImage>> images;
    for (const CudaImageBuild& image : cudaImages_) {
      std::vector<flatbuffers::Offset<fb::FunctionResources>> resources;
      for (const CudaFunctionResources& r : image.resources)
        resources.push_back(fb::CreateFunctionResourcesDirect(fbb, r.symbol.c_str(), r.registers, r.sharedBytes,
                                                               r.stackBytes, r.spillStoreBytes, r.spillLoadBytes));
      images.push_back(fb::CreateCudaImageDirect(fbb, image.arch.c_str(), &image.cubin, &resources));
    }
    auto root = fb::CreateModuleDirect(fbb, kModuleFormatVersion, ("kilnc " + kiln::version()).c_str(), model,
                                       state + activations, &buffers, &params, &progs, state,
                                       activations, naive, options_.recompute.c_str(),
                                       kernels_.empty() ? nullptr : &kernels,
                                       kernels_.empty() ? nullptr : kernelSource_.c_str(),
                                       cpuLibrary_.empty() ? nullptr : &cpuLibrary_,
                                       images.empty() ? nullptr : &images, options_.fusion,
                                       /*crc32=*/1);  // present, to be sealed below
    fb::FinishModuleBuffer(fbb, root);
    std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    seal_module(bytes);  // the runtime refuses a module whose bytes do not match (module.fbs)
    return bytes;
  }

  // A generated kernel to build: a fusion region, or (cuda) an attention op's template.
  struct Fusion {
    FusionOp op;
    Operation* attention = nullptr;
    std::vector<uint32_t> in, out;
  };
  struct KernelInfo {
    std::string symbol, name, kind;
    std::vector<std::string> ops;
    double flops = 0, tensorFlops = 0;
    unsigned grid = 0, block = 0, launches = 1;
    std::string cublasLt;
    std::optional<MatmulCall> matmul;
    bool hasFunction = true;
    std::vector<unsigned> zero;
    std::vector<CudaKernelLaunch> functions;
    uint64_t scratch = 0;
    std::vector<int64_t> numel;
    std::vector<fb::DType> dtype;
    std::vector<uint32_t> adamw;
  };

  ModuleOp module_;
  const ModelSpec& spec_;
  WriteOptions options_;
  Target target_;
  std::vector<Fusion> fusions_;
  std::vector<KernelInfo> kernels_;
  std::vector<uint32_t> fusionToKernel_;  // fusion region (in program order) -> kernel
  std::string kernelSource_;
  std::vector<uint8_t> cpuLibrary_;
  std::vector<CudaImageBuild> cudaImages_;
  std::vector<Buf> bufs_;
  std::vector<ParameterOp> params_;
  std::map<std::string, ParamBuffers> paramBufs_;
  std::map<std::string, uint32_t> inputs_, hypers_;
};

}  // namespace

FailureOr<std::vector<uint8_t>> writeModule(ModuleOp module, const ModelSpec& spec,
                                            const WriteOptions& options) {
  return Writer(module, spec, options).run();
}

}  // namespace kiln
