// Fused-kernel source generation (see kernel_codegen.h).
//
// Every kernel has the signature `void SYMBOL(void* const* b, const int64_t* range)`: b[k] is the
// k-th buffer (inputs, results, state writes) and `range` gives the [begin, end) slice of each
// parameter an optimizer kernel updates (ZeRO-1); other kernels ignore it. Shapes are constants
// in the source, so the host compiler can unroll and vectorise.
//
// Element expressions: every value of the region can be read at a flat element index; a
// broadcast reads its input at `index % size`, a gather (kiln.embedding) reads its table row
// `ids[index / C]`, and a value whose type is bf16 is rounded to bf16 where it is produced
// (`rb`), so fused and unfused programs round at the same points.
#include "compiler/kernel_codegen.h"

#include <cassert>
#include <map>

#include "compiler/source_template.h"
#include "runtime/op_list.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;

namespace kiln {
namespace {

// The most bytes of __constant__ tables the optimizer kernel declares: a module has 64 KB, and
// nothing else of Kiln's puts data there (216 layers' tables fit, as before global tables).
constexpr size_t kCudaConstantTableBytes = 62 * 1024;

RankedTensorType tensorOf(Value v) { return cast<RankedTensorType>(v.getType()); }
int64_t numel(Value v) { return tensorOf(v).getNumElements(); }

// FLOPs an elementwise op does per element: GELU's tanh form about 8 (the convention kiln-inspect
// counts a built-in GELU by), anything else 1.
double flopsPerElement(Operation* op) { return isa<GeluOp>(op) ? 8.0 : 1.0; }
bool isBF16(Value v) { return tensorOf(v).getElementType().isBF16(); }
bool isI32(Value v) { return tensorOf(v).getElementType().isInteger(32); }
std::string ctype(Value v) { return isI32(v) ? "int32_t" : isBF16(v) ? "bf16" : "float"; }

// A name from the IR (a parameter's symbol, which may hold any bytes) as the text of a C string
// literal, and so also safe in a line comment: quotes and backslashes escaped, and bytes outside
// printable ASCII as three octal digits. Unescaped, a name could end the literal or the comment
// and put code of its own into the generated source.
std::string cEscaped(StringRef name) {
  std::string out;
  for (unsigned char c : name) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      const char octal[] = {'\\', char('0' + (c >> 6)), char('0' + ((c >> 3) & 7)), char('0' + (c & 7)), 0};
      out += octal;
    }
  }
  return out;
}

class Emitter {
 public:
  Emitter(FusionOp f, Target t, const std::function<bool(StringRef)>& hasCopy)
      : f_(f), t_(t), hasCopy_(hasCopy) {}

  FailureOr<GeneratedKernel> run(const std::string& symbol) {
    symbol_ = symbol;
    declare();
    StringRef kind = f_.getKind();
    LogicalResult ok = kind == "elementwise"       ? elementwise()
                       : kind == "matmul"          ? matmul()
                       : kind == "layer_norm"      ? layerNorm()
                       : kind == "layer_norm_grad" ? layerNormGrad()
                       : kind == "classifier"      ? classifier()
                       : kind == "embedding_grad"  ? embeddingGrad()
                       : kind == "optimizer"       ? optimizer()
                       : kind == "reduce_sum"      ? reduceSum()
                                                   : LogicalResult(f_.emitError() << "kilnc: no kernel template for '" << kind << "'");
    if (failed(ok)) return failure();
    if (unreadable_)
      return unreadable_->emitError() << "kilnc: the " << kind << " kernel '" << f_.getKernel()
                                      << "' would read this op's result at one element, which its template cannot";
    if (failed(checkEverythingWritten(kind))) return failure();
    // One block a row: a grid's x dimension holds 2^31 - 1 blocks.
    if (t_ == Target::Cuda && !body_.empty() && grid_ > unsigned(INT32_MAX))
      return f_.emitError() << "kilnc: CUDA: the " << kind << " kernel launches " << grid_
                            << " blocks, more than a grid holds (2^31 - 1): a smaller batch_size or seq_len";
    GeneratedKernel k;
    std::vector<std::string> names;
    for (Operation& op : f_.getFusedOps()) names.push_back(op.getName().stripDialect().str());
    const std::string ops = op_list(names, ", ");
    std::string sig = t_ == Target::Cpu ? "extern \"C\" void " + symbol + "(void* const* b, const int64_t* range)"
                                        : "extern \"C\" __global__ void " + launchBounds() + symbol +
                                              "(void* const* b, const long long* range)";
    std::string head = "// " + f_.getKind().str() + " kernel: " + ops + "\n// at " + location() + "\n";
    if (!cublasLt_.empty()) head += "// cuBLASLt: " + cublasLt_ + "\n";
    k.source = body_.empty() ? head + "// (no generated function " + symbol + ": the library call does all of it)\n"
                             : head + preamble_ + sig + " {\n" + decls_ + body_ + "}\n";
    k.flops = flops_;
    k.tensorFlops = tensorFlops_;
    k.cpuBf16Matmul = bf16Matmul_;
    k.cudaGrid = grid_;
    k.cudaBlock = block_;
    k.cublasLt = cublasLt_;
    k.matmul = call_;
    k.zeroOperands = zero_;
    if (t_ == Target::Cuda && !body_.empty()) k.functions.push_back({symbol, grid_, block_});
    k.launches = (cublasLt_.empty() ? 0 : 1) + (body_.empty() ? 0 : 1);
    return k;
  }

 private:
  // Each kind's template computes the ops it knows: one it leaves out would leave a result (or
  // a gradient accumulation) unwritten, a wrong number rather than an error. Every yielded value
  // and accumulator must be written by the generated function or by the library call.
  // FusionOp::verify admits only regions the templates compute, so this guards against the two
  // drifting apart: its errors are the compiler's, not the input's.
  LogicalResult checkEverythingWritten(StringRef kind) {
    const std::string code = preamble_ + body_;
    auto identChar = [](char c) { return llvm::isAlnum(c) || c == '_'; };
    auto mentioned = [&](const std::string& name) {  // as a whole identifier ("out1", not "out10")
      for (size_t at = code.find(name); at != std::string::npos; at = code.find(name, at + 1)) {
        const size_t end = at + name.size();
        if ((at == 0 || !identChar(code[at - 1])) && (end == code.size() || !identChar(code[end]))) return true;
      }
      return false;
    };
    auto byCall = [&](const std::string& name) {
      const auto it = index_.find(name);
      return call_ && it != index_.end() && (call_->d == it->second || call_->aux == it->second || call_->c == it->second);
    };
    auto yield = cast<YieldOp>(f_.getBlock().getTerminator());
    for (auto [i, v] : llvm::enumerate(yield.getValues())) {
      const std::string name = "out" + num(i);
      if (mentioned(name) || byCall(name)) continue;
      Operation* op = v.getDefiningOp();
      return (op ? op->emitError() : f_.emitError())
             << "kilnc internal error: the " << kind << " kernel '" << f_.getKernel()
             << "' does not compute this value (its template leaves the op out, which the fusion verifier should "
             << "have refused), so the region's result #" << i << " would never be written";
    }
    for (Operation& op : f_.getFusedOps())
      if (isa<AccumulateGradOp>(op) && !mentioned(state_[&op][0]) && !byCall(state_[&op][0]))
        return op.emitError() << "kilnc internal error: the " << kind << " kernel '" << f_.getKernel()
                              << "' does not compute this accumulation (its template leaves the op out, which the "
                              << "fusion verifier should have refused)";
    return success();
  }

  std::string location() {
    std::string s;
    llvm::raw_string_ostream os(s);
    f_.getLoc().print(os);
    return s;
  }

  // --- Buffers -----------------------------------------------------------------------------
  // The optimizer's per-tensor buffers (each AdamW's gradient, value, moments and compute copy)
  // get no local of their own: its kernel reads them from b[] through a table of operands, so
  // that its source and compile time stay small however many parameters there are.
  void declare() {
    unsigned k = 0;
    bool tabled = false;  // some operand is read through the optimizer's table
    for (BlockArgument a : f_.getBlock().getArguments()) {
      std::string name = "in" + num(a.getArgNumber());
      ptr_[a] = name;
      index_[name] = int(k);
      const bool onlyAdamGrad = !a.use_empty() && llvm::all_of(a.getUses(), [](OpOperand& u) {
        auto adam = dyn_cast<AdamWOp>(u.getOwner());
        return adam && &u == &adam.getGradMutable();
      });
      if (!onlyAdamGrad) decls_ += "  const " + ctype(a) + "* " + name + " = (const " + ctype(a) + "*)b[" + num(k) + "];\n";
      tabled |= onlyAdamGrad;
      ++k;
    }
    if (tabled) decls_ += "  // (The parameters' gradients, values and moments: through the optimizer's table of operands.)\n";
    auto yield = cast<YieldOp>(f_.getBlock().getTerminator());
    for (auto [i, v] : llvm::enumerate(yield.getValues())) {
      std::string name = "out" + num(i);
      outs_[v].push_back(name);
      index_[name] = int(k);
      decls_ += "  " + ctype(v) + "* " + name + " = (" + ctype(v) + "*)b[" + num(k++) + "];\n";
    }
    for (Operation& op : f_.getFusedOps()) {
      if (auto acc = dyn_cast<AccumulateGradOp>(op)) {
        std::string name = "grad" + num(k);
        state_[&op] = {name};
        index_[name] = int(k);
        decls_ += "  float* " + name + " = (float*)b[" + num(k++) + "];  // " + cEscaped(acc.getName()) + ".grad\n";
      } else if (auto adam = dyn_cast<AdamWOp>(op)) {
        std::vector<std::string> names;
        for (const char* role : {"p", "m", "v"}) {
          names.push_back(role + num(k));
          index_[names.back()] = int(k++);
        }
        if (hasCopy_(adam.getName())) {
          names.push_back("copy" + num(k));
          index_[names.back()] = int(k++);
        }
        state_[&op] = names;
      }
    }
  }

  // Reads `v` at flat element `idx` (an expression). Values computed in the current loop
  // iteration at element `i` are locals.
  std::string at(Value v, const std::string& idx) {
    if (idx == "i")
      if (auto it = local_.find(v); it != local_.end()) return it->second;
    if (auto a = dyn_cast<BlockArgument>(v)) return "ld(" + ptr_[a] + ", " + idx + ")";
    Operation* op = v.getDefiningOp();
    auto sub = [&](Value x) { return at(x, idx); };
    std::string e = llvm::TypeSwitch<Operation*, std::string>(op)
        .Case([&](AddOp o) { return "(" + sub(o.getLhs()) + " + " + sub(o.getRhs()) + ")"; })
        .Case([&](MulOp o) { return "(" + sub(o.getLhs()) + " * " + sub(o.getRhs()) + ")"; })
        .Case([&](ScaleOp o) { return "(" + sub(o->getOperand(0)) + " * " + at(o->getOperand(1), "0") + ")"; })
        .Case([&](GeluOp o) { return "gelu_f(" + sub(o->getOperand(0)) + ")"; })
        .Case([&](GeluGradOp o) { return "gelu_grad_f(" + sub(o->getOperand(0)) + ", " + sub(o->getOperand(1)) + ")"; })
        .Case([&](CastOp o) { return sub(o->getOperand(0)); })
        .Case([&](BroadcastOp o) {
          return at(o.getInput(), "(" + idx + ") % " + num(numel(o.getInput())));
        })
        .Case([&](EmbeddingOp o) {
          const int64_t C = tensorOf(o.getTable()).getShape().back();
          std::string row = "(int64_t)" + at(o.getIndices(), "(" + idx + ") / " + num(C));
          return at(o.getTable(), row + " * " + num(C) + " + (" + idx + ") % " + num(C));
        })
        .Case([&](IotaOp) { return "(int32_t)(" + idx + ")"; })
        .Case([&](ZerosOp) { return std::string("0.0f"); })
        .Default([&](Operation* o) {
          // A value this kernel cannot compute at an element (a column sum read in the row loop):
          // the region is refused rather than given a wrong number.
          if (!unreadable_) unreadable_ = o;
          return std::string("0");
        });
    if (isa<EmbeddingOp, IotaOp, CastOp>(op) && !isBF16(v)) return e;
    if (isBF16(v) && !isa<BroadcastOp, EmbeddingOp>(op)) return "rb(" + e + ")";
    return e;
  }

  // Emits `const float vN = ...;` at element i for each op in `ops` whose result is read later.
  void locals(ArrayRef<Operation*> ops, const std::string& indent) {
    for (Operation* op : ops)
      for (Value r : op->getResults()) {
        if (isI32(r)) continue;
        std::string name = "v" + num(next_++);
        body_ += indent + "const float " + name + " = " + at(r, "i") + ";\n";
        local_[r] = name;
      }
  }

  // Stores of the yielded values and gradient accumulations among `ops`, at element i.
  void stores(ArrayRef<Operation*> ops, const std::string& indent) {
    for (Operation* op : ops) {
      for (Value r : op->getResults())
        for (const std::string& o : outs_.lookup(r))
          body_ += indent + "st(" + o + ", i, " + (isI32(r) ? at(r, "i") : local_[r]) + ");\n";
      if (auto acc = dyn_cast<AccumulateGradOp>(op))
        body_ += indent + state_[op][0] + "[i] += " + at(acc.getGradient(), "i") + ";\n";
    }
  }

  // --- Kinds -------------------------------------------------------------------------------
  // A flat loop over the root's elements.
  LogicalResult elementwise() {
    const int64_t n = f_.getLoopSize();
    SmallVector<Operation*> ops;
    for (Operation& op : f_.getFusedOps()) ops.push_back(&op);
    // Only values over all n elements become locals; smaller ones (broadcast or gathered
    // inputs) are read where they are used.
    SmallVector<Operation*> full;
    for (Operation* op : ops)
      if (op->getNumResults() && numel(op->getResult(0)) == n && !isa<IotaOp>(op)) full.push_back(op);
    for (Operation* op : full) flops_ += double(n) * flopsPerElement(op);
    loop(n, [&](const std::string& ind) {
      locals(full, ind);
      stores(ops, ind);
    });
    return success();
  }

  // for i in [0, n): body. Parallel on the CPU, grid-stride on the GPU.
  void loop(int64_t n, const std::function<void(const std::string&)>& inner) {
    if (t_ == Target::Cpu) {
      body_ += n >= (1 << 14) ? "#pragma omp parallel for simd schedule(static)\n" : "#pragma omp simd\n";
      body_ += "  for (int64_t i = 0; i < " + num(n) + "; ++i) {\n";
    } else {
      block_ = 256;
      grid_ = unsigned(std::min<int64_t>((n + 255) / 256, 132 * 16));
      body_ += "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < " + num(n) +
               "; i += (long long)gridDim.x * blockDim.x) {\n";
    }
    inner("    ");
    body_ += "  }\n";
  }

  // The matrix product by the BLAS (cuBLASLt on the GPU), then the epilogue over its result.
  LogicalResult matmul() {
    MatmulOp mm;
    SmallVector<Operation*> epilogue, columns;
    for (Operation& op : f_.getFusedOps()) {
      if (auto m = dyn_cast<MatmulOp>(op)) mm = m;
      else if (isa<ReduceSumOp>(op) || (!columns.empty() && (isa<CastOp, AccumulateGradOp>(op)) &&
                                         dependsOnColumns(&op, columns)))
        columns.push_back(&op);
      else
        epilogue.push_back(&op);
    }
    auto out = tensorOf(mm.getResult()).getShape();
    auto lhs = tensorOf(mm.getLhs()).getShape();
    const int64_t M = out[0], N = out[1], K = mm.getTransposeLhs() ? lhs[0] : lhs[1];
    const bool tA = mm.getTransposeLhs(), tB = mm.getTransposeRhs();
    const double product = 2.0 * double(M) * double(N) * double(K);
    // bf16 products run on tensor cores; fp32 ones (compute 32F, no TF32) on the CUDA cores.
    tensorFlops_ = tensorOf(mm.getLhs()).getElementType().isBF16() ? product : 0.0;
    flops_ = product;
    for (Operation* op : epilogue) flops_ += double(M * N) * flopsPerElement(op);
    if (t_ == Target::Cuda) return cudaMatmulNote(mm, epilogue, columns, M, N, K);

    auto operandF32 = [&](Value v, const char* name) {
      auto a = cast<BlockArgument>(v);
      if (!isBF16(a)) return "  const float* " + std::string(name) + " = " + ptr_[a] + ";\n";
      return "  const float* " + std::string(name) + " = widen(" + ptr_[a] + ", " + num(numel(a)) + ", " +
             (name[0] == 'A' ? "0" : "1") + ");\n";
    };
    const std::string what = "C[" + num(M) + ", " + num(N) + "] = " + (tA ? "A^T" : "A") + " " +
                             (tB ? "B^T" : "B") + " with K = " + num(K);
    const std::string scratchC = "  float* C = scratch(2, " + num(M * N) + ");\n";
#ifdef KILN_HAVE_DNNL
    const bool byDnnl = isBF16(mm.getLhs()) && isBF16(mm.getRhs());
#else
    const bool byDnnl = false;
#endif
    if (byDnnl) {
      bf16Matmul_ = true;
      body_ += "  // " + what + ", bf16 operands, by oneDNN into fp32 scratch.\n" + scratchC;
      body_ += "  static Bf16Matmul product;\n";
      body_ += "  bf16_matmul(&product, " + num(tA) + ", " + num(tB) + ", " + num(M) + ", " + num(N) + ", " + num(K) +
               ", " + ptr_[cast<BlockArgument>(mm.getLhs())] + ", " + ptr_[cast<BlockArgument>(mm.getRhs())] + ", C);\n";
    } else {
      body_ += "  // " + what + ", by the BLAS into fp32 scratch.\n";
      body_ += operandF32(mm.getLhs(), "A") + operandF32(mm.getRhs(), "B") + scratchC;
      body_ += "  cblas_sgemm(CblasRowMajor, " + std::string(tA ? "CblasTrans" : "CblasNoTrans") + ", " +
               (tB ? "CblasTrans" : "CblasNoTrans") + ", " + num(M) + ", " + num(N) + ", " + num(K) + ", 1.0f, A, " +
               num(tA ? M : K) + ", B, " + num(tB ? K : N) + ", 0.0f, C, " + num(N) + ");\n";
    }
    if (!epilogue.empty() || !outs_.lookup(mm.getResult()).empty()) {
      body_ += "  // Epilogue, element by element over C.\n";
      loop(M * N, [&](const std::string& ind) {
        std::string mv = "v" + num(next_++);
        body_ += ind + "const float " + mv + " = " + (isBF16(mm.getResult()) && !biasBeforeRounding(mm, N) ? "rb(C[i])" : "C[i]") + ";\n";
        local_[mm.getResult()] = mv;
        SmallVector<Operation*> full;
        for (Operation* op : epilogue)
          if (op->getNumResults() && numel(op->getResult(0)) == M * N) full.push_back(op);
        locals(full, ind);
        SmallVector<Operation*> all{mm.getOperation()};
        all.append(epilogue.begin(), epilogue.end());
        stores(all, ind);
      });
    }
    if (!columns.empty()) columnSums(columns);
    return success();
  }

  // A bf16 product whose one use is the add of a bias (one value per column) in this kernel: the
  // bias is added to the fp32 product and the sum rounded to bf16 once, as PyTorch's addmm under
  // autocast and cuBLASLt's bias epilogue do (rounding the product first would round twice).
  bool biasBeforeRounding(MatmulOp mm, int64_t N) {
    Value product = mm.getResult();
    if (!product.hasOneUse() || !outs_.lookup(product).empty()) return false;
    auto add = dyn_cast<AddOp>(*product.getUsers().begin());
    if (!add || add->getBlock() != mm->getBlock()) return false;
    Value other = add.getLhs() == product ? add.getRhs() : add.getLhs();
    auto b = other.getDefiningOp<BroadcastOp>();
    return b && numel(b.getInput()) == N;
  }

  static bool dependsOnColumns(Operation* op, ArrayRef<Operation*> columns) {
    for (Value v : op->getOperands())
      if (llvm::is_contained(columns, v.getDefiningOp())) return true;
    return false;
  }

  // Bias gradients: column sums of a [R, K] operand (kiln.reduce_sum), then their consumers.
  void columnSums(ArrayRef<Operation*> ops) {
    auto sum = cast<ReduceSumOp>(ops.front());
    const int64_t K = numel(sum.getResult()), R = numel(sum.getInput()) / K;
    flops_ += double(R * K);
    body_ += "  // Column sums of the right operand (the bias gradient), in double.\n";
    if (K * R >= (1 << 14)) body_ += "#pragma omp parallel for schedule(static)\n";
    body_ += "  for (int64_t i = 0; i < " + num(K) + "; ++i) {\n";
    body_ += "    double acc = 0.0;\n";
    body_ += "    for (int64_t r = 0; r < " + num(R) + "; ++r) acc += " + at(sum.getInput(), "r * " + num(K) + " + i") + ";\n";
    std::string name = "v" + num(next_++);
    body_ += "    const float " + name + " = " + (isBF16(sum.getResult()) ? "rb((float)acc)" : "(float)acc") + ";\n";
    local_[sum.getResult()] = name;
    locals(columnsWide(ops.drop_front(), K), "    ");
    stores(ops, "    ");
    body_ += "  }\n";
  }

  // The ops over the K columns, which become locals of the column loop; smaller values (a scalar
  // factor) are read where they are used, at their own index.
  static SmallVector<Operation*> columnsWide(ArrayRef<Operation*> ops, int64_t K) {
    SmallVector<Operation*> wide;
    for (Operation* op : ops)
      if (op->getNumResults() && numel(op->getResult(0)) == K) wide.push_back(op);
    return wide;
  }

  // CUDA: the product and the epilogues cuBLASLt has (bias, GELU with its pre-activation as the
  // auxiliary output, GELU backward from that auxiliary input, a residual or accumulator as C with
  // beta = 1) are one cuBLASLt call; a generated function adds what it has not (further
  // accumulated terms, the bias gradient's column sums).
  LogicalResult cudaMatmulNote(MatmulOp mm, ArrayRef<Operation*> epilogue, ArrayRef<Operation*> columns, int64_t M,
                               int64_t N, int64_t K) {
    // cuBLASLt computes D = act(A B + beta C + bias): C and the bias are added before the
    // activation (GELU, or DGELU: the GELU backward) and everything after it is added to D by the
    // generated function.
    std::string epi = "DEFAULT";
    bool bias = false, gelu = false, beta = false, termBeforeAct = false;
    auto activated = [&] { return gelu || epi == "DGELU"; };
    Value cur = mm.getResult();
    std::string c = "none", aux = "none", biasIn = "none", d;
    SmallVector<Value> extraTerms;
    Value residual, biasValue;
    AccumulateGradOp acc;
    for (Operation* op : epilogue) {
      // An op off the product's chain computes an operand of a later one, which says whether
      // cuBLASLt or the generated function can take it.
      if (isa<BroadcastOp>(op) || !llvm::is_contained(op->getOperands(), cur)) continue;
      if (auto add = dyn_cast<AddOp>(op)) {
        Value other = add.getLhs() == cur ? add.getRhs() : add.getLhs();
        // The bias is one value per column of D: a broadcast of N elements.
        if (auto b = other.getDefiningOp<BroadcastOp>(); b && numel(b.getInput()) == N && !bias && !activated() && !beta) {
          bias = true;
          biasValue = b.getInput();
          if (!isa<BlockArgument>(biasValue))
            return f_.emitError() << "kilnc: CUDA: cuBLASLt reads the bias from memory; this one is computed "
                                     "in the region";
          biasIn = ptr_[cast<BlockArgument>(biasValue)];
        } else if (!beta && !activated()) {
          beta = true;
          residual = other;
          if (!isa<BlockArgument>(other))
            return f_.emitError() << "kilnc: CUDA: cuBLASLt reads the added term from memory; this one is "
                                     "computed in the region";
          c = ptr_[cast<BlockArgument>(other)];
        } else {
          termBeforeAct |= !activated();
          extraTerms.push_back(other);
        }
      } else if (isa<GeluOp>(op) && !activated()) {
        if (termBeforeAct)
          return op->emitError() << "kilnc: CUDA: cuBLASLt adds one term and a bias before its GELU; this product has more";
        gelu = true;
        if (!outs_.lookup(cur).empty()) aux = outs_.lookup(cur).front();
      } else if (auto gg = dyn_cast<GeluGradOp>(op); gg && !activated() && !bias && !beta && !termBeforeAct &&
                                                     gg->getOperand(0) == cur && isa<BlockArgument>(gg->getOperand(1))) {
        epi = "DGELU";
        aux = ptr_[cast<BlockArgument>(gg->getOperand(1))];
      } else if (auto a = dyn_cast<AccumulateGradOp>(op)) {
        acc = a;
      } else if (!isa<CastOp>(op)) {
        return f_.emitError() << "kilnc: CUDA: cuBLASLt has no epilogue for '" << op->getName() << "' after a matmul";
      }
      if (op->getNumResults()) cur = op->getResult(0);
    }
    // cuBLASLt's bias has D's type: a bf16 bias added to an fp32 D (a residual written in fp32)
    // is added by the generated function instead.
    std::string extraBias;
    const bool dIsBF16 = !acc && isBF16(cur);
    if (bias && isBF16(biasValue) != dIsBF16) {
      if (gelu) return f_.emitError() << "kilnc: CUDA: a bias added before a GELU must have the product's output type (cuBLASLt adds it in that type)";
      bias = false;
      extraBias = biasIn;
      biasIn = "none";
    }
    if (bias && gelu) epi = aux == "none" ? "GELU_BIAS" : "GELU_AUX_BIAS";
    else if (bias) epi = "BIAS";
    else if (gelu) epi = aux == "none" ? "GELU" : "GELU_AUX";
    if (acc) {
      // C is the accumulator, added before the activation: only a plain product (and bias) adds
      // to a gradient in the same call.
      if (activated())
        return acc->emitError() << "kilnc: CUDA: cuBLASLt would add the accumulator before its "
                                << (gelu ? "GELU" : "GELU backward") << "; accumulate the result in a region of its own";
      // A residual term is added by the generated function instead.
      if (residual) extraTerms.insert(extraTerms.begin(), residual);
      d = state_[acc.getOperation()][0];
      c = d;
      beta = true;
    } else {
      auto o = outs_.lookup(cur);
      if (o.empty()) return f_.emitError() << "kilnc: CUDA: the matmul region must yield its last value (cuBLASLt writes D there) or accumulate it";
      d = o.front();
      // cuBLASLt's C has D's type; a term of the other type is added by the generated function.
      if (residual && isBF16(residual) != isBF16(cur)) {
        if (activated())
          return f_.emitError() << "kilnc: CUDA: a term added before a GELU must have the product's output type "
                                   "(cuBLASLt adds it as C, in D's type)";
        extraTerms.insert(extraTerms.begin(), residual);
        c = "none";
        beta = false;
      }
    }
    // cuBLASLt gives D and the auxiliary output only: every other result must be one of them.
    for (auto& [v, names] : outs_)
      for (const std::string& n : names)
        if (n != d && n != aux)
          return f_.emitError() << "kilnc: CUDA: the matmul region gives a value cuBLASLt does not produce";
    auto idx = [&](const std::string& name) { return index_.count(name) ? index_[name] : -1; };
    MatmulCall call;
    call.m = M, call.n = N, call.k = K;
    call.transA = mm.getTransposeLhs(), call.transB = mm.getTransposeRhs();
    call.a = idx(ptr_[cast<BlockArgument>(mm.getLhs())]), call.b = idx(ptr_[cast<BlockArgument>(mm.getRhs())]);
    call.bias = idx(biasIn), call.aux = idx(aux), call.c = idx(c), call.d = idx(d);
    call.beta = beta ? 1.0f : 0.0f;
    call.epilogue = epi;
    call_ = call;
    cublasLt_ = "epilogue=" + epi + " M=" + num(M) + " N=" + num(N) + " K=" + num(K) + " transA=" +
                num(mm.getTransposeLhs()) + " transB=" + num(mm.getTransposeRhs()) + " A=" +
                ptr_[cast<BlockArgument>(mm.getLhs())] + " B=" + ptr_[cast<BlockArgument>(mm.getRhs())] +
                " bias=" + biasIn + " aux=" + aux + " C=" + c + " beta=" + (beta ? "1" : "0") + " D=" + d;
    const bool addTerms = !extraTerms.empty() || !extraBias.empty();
    if (addTerms || !columns.empty()) {
      block_ = 256;
      grid_ = unsigned(std::min<int64_t>((std::max(addTerms ? M * N : 0, N) + 255) / 256, 2112));
    }
    if (addTerms) {
      body_ += "  // Terms cuBLASLt cannot add (it accumulated the product into " + d + ").\n";
      body_ += "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < " + num(M * N) +
               "; i += (long long)gridDim.x * blockDim.x) {\n";
      std::string sum = extraBias.empty() ? "" : "ld(" + extraBias + ", i % " + num(N) + ")";
      for (Value v : extraTerms) sum += (sum.empty() ? "" : " + ") + at(v, "i");
      body_ += "    st(" + d + ", i, ld(" + d + ", i) + " + sum + ");\n  }\n";
    }
    // The bias gradient, when it is only summed (and cast) into its fp32 accumulator: each thread
    // sums a chunk of rows of one column and adds it with an atomic, so the whole GPU reads the
    // operand (a thread per column leaves most of it idle); a bf16 total is rounded once, at the
    // end. The order of the additions varies from run to run.
    AccumulateGradOp colAcc;
    bool onlyCasts = !columns.empty();
    for (Operation* op : columns.empty() ? ArrayRef<Operation*>() : columns.drop_front()) {
      if (auto a = dyn_cast<AccumulateGradOp>(op)) colAcc = a;
      else if (!isa<CastOp>(op)) onlyCasts = false;
    }
    if (onlyCasts && colAcc) {
      auto red = cast<ReduceSumOp>(columns.front());
      const int64_t R = numel(red.getInput()) / numel(red.getResult()), Kc = numel(red.getResult());
      const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(R / 128, (262144 + Kc - 1) / Kc));
      const int64_t rowsPerChunk = (R + chunks - 1) / chunks;
      grid_ = unsigned(std::min<int64_t>((std::max(addTerms ? M * N : 0, Kc * chunks) + 255) / 256, 2112));
      const std::string grad = state_[colAcc.getOperation()][0];
      body_ += "  // The bias gradient: column sums of the right operand in " + num(chunks) + " chunks of " +
               num(rowsPerChunk) + " rows, each added to the " + (isBF16(red.getResult()) ? "fp32 totals" : "accumulator") +
               " with an atomic.\n";
      body_ += "  for (long long w = blockIdx.x * (long long)blockDim.x + threadIdx.x; w < " + num(Kc * chunks) +
               "; w += (long long)gridDim.x * blockDim.x) {\n";
      body_ += "    const long long i = w % " + num(Kc) + ", r0 = w / " + num(Kc) + " * " + num(rowsPerChunk) + ";\n";
      body_ += "    const long long r1 = r0 + " + num(rowsPerChunk) + " < " + num(R) + " ? r0 + " + num(rowsPerChunk) +
               " : " + num(R) + ";\n";
      body_ += "    float acc = 0.0f;\n";
      body_ += "    for (long long r = r0; r < r1; ++r) acc += " + at(red.getInput(), "r * " + num(Kc) + " + i") + ";\n";
      // A bf16 bias gradient is its whole column sum rounded once: the last block rounds the totals.
      const bool round = isBF16(red.getResult());
      const std::string ws = symbolPrefix() + "column_totals";
      body_ += "    atomicAdd(&" + (round ? ws : grad) + "[i], acc);\n  }\n";
      if (round) cudaRoundColumnTotals(ws, Kc, {SmallVector<Operation*>(columns.begin(), columns.end())});
    } else if (!columns.empty()) {
      auto red = cast<ReduceSumOp>(columns.front());
      const int64_t R = numel(red.getInput()) / numel(red.getResult()), Kc = numel(red.getResult());
      body_ += "  // The bias gradient: column sums of the right operand, accumulated.\n";
      body_ += "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < " + num(Kc) +
               "; i += (long long)gridDim.x * blockDim.x) {\n";
      body_ += "    float acc = 0.0f;\n";
      body_ += "    for (long long r = 0; r < " + num(R) + "; ++r) acc += " + at(red.getInput(), "r * " + num(Kc) + " + i") + ";\n";
      std::string name = "v" + num(next_++);
      body_ += "    const float " + name + " = " + (isBF16(red.getResult()) ? "rb(acc)" : "acc") + ";\n";
      local_[red.getResult()] = name;
      SmallVector<Operation*> rest(columns.drop_front());
      SmallVector<Operation*> vals;
      for (Operation* op : rest)
        if (op->getNumResults()) vals.push_back(op);
      locals(vals, "    ");
      stores(columns, "    ");
      body_ += "  }\n";
    }
    return success();
  }

  // Layer norm over rows of C, with the residual add before it and casts after it.
  LogicalResult layerNorm() {
    LayerNormOp ln;
    for (Operation& op : f_.getFusedOps())
      if (auto l = dyn_cast<LayerNormOp>(op)) ln = l;
    const int64_t C = tensorOf(ln.getInput()).getShape().back(), N = numel(ln.getInput()) / C;
    const float eps = ln.getEpsilon().convertToFloat();
    flops_ = 8.0 * double(N * C);
    Value x = ln.getInput();
    if (t_ == Target::Cuda) return cudaLayerNorm(ln, N, C, eps);
    body_ += "  // One row per iteration: x (stored when read elsewhere), mean and rstd in double, y.\n";
    body_ += "#pragma omp parallel for schedule(static)\n";
    body_ += "  for (int64_t r = 0; r < " + num(N) + "; ++r) {\n";
    body_ += "    float x[" + num(C) + "];\n";
    body_ += "    for (int64_t c = 0; c < " + num(C) + "; ++c) {\n      const int64_t i = r * " + num(C) + " + c;\n";
    body_ += "      x[c] = " + at(x, "i") + ";\n";
    if (Operation* add = x.getDefiningOp())
      for (const std::string& o : outs_.lookup(add->getResult(0))) body_ += "      st(" + o + ", i, x[c]);\n";
    body_ += "    }\n";
    body_ += "    double sum = 0.0;\n    for (int64_t c = 0; c < " + num(C) + "; ++c) sum += x[c];\n";
    body_ += "    const double m = sum / " + num(C) + ".0;\n";
    body_ += "    double ssq = 0.0;\n    for (int64_t c = 0; c < " + num(C) + "; ++c) { const double d = x[c] - m; ssq += d * d; }\n";
    body_ += "    const float mf = (float)m, s = (float)(1.0 / sqrt(ssq / " + num(C) + ".0 + (double)" + floatLiteral(eps) + "));\n";
    body_ += "    for (int64_t c = 0; c < " + num(C) + "; ++c) {\n      const int64_t i = r * " + num(C) + " + c;\n";
    layerNormOutput(ln, "(x[c] - mf) * s * " + at(ln.getWeight(), "c") + " + " + at(ln.getBias(), "c"), "      ");
    body_ += "    }\n";
    layerNormStats(ln, "mf", "s", "    ");
    body_ += "  }\n";
    return success();
  }

  // y at element i from its expression, the casts of it, and their stores.
  void layerNormOutput(LayerNormOp ln, std::string y, const std::string& ind) {
    if (isBF16(ln.getResult())) y = "rb(" + y + ")";
    body_ += ind + "const float y = " + y + ";\n";
    local_[ln.getResult()] = "y";
    SmallVector<Operation*> after;  // casts of the output (a cast before the add is in x already)
    for (Operation& op : f_.getFusedOps())
      if (isa<CastOp>(op) && op.getOperand(0) == ln.getResult()) after.push_back(&op);
    locals(after, ind);
    for (const std::string& o : outs_.lookup(ln.getResult())) body_ += ind + "st(" + o + ", i, y);\n";
    stores(after, ind);
  }
  // Row r's mean and rstd, where they are read later.
  void layerNormStats(LayerNormOp ln, const std::string& mean, const std::string& rstd, const std::string& ind) {
    for (const std::string& o : outs_.lookup(ln.getMean())) body_ += ind + "st(" + o + ", r, " + mean + ");\n";
    for (const std::string& o : outs_.lookup(ln.getRstd())) body_ += ind + "st(" + o + ", r, " + rstd + ");\n";
  }

  // The loop of a warp over its row r of C: column c and element i = r * C + c per iteration;
  // inRegisters: iteration k (c = lane + 32 k, fully unrolled, so arrays indexed by k stay in
  // registers), else a loop over c.
  static std::string cudaRowLoop(int64_t C, bool inRegisters, const std::string& ind) {
    if (inRegisters)
      return "#pragma unroll\n" + ind + "for (int k = 0; k < " + num(C / 32) + "; ++k) {\n" + ind +
             "  const long long c = lane + 32 * k, i = r * " + num(C) + " + c;\n";
    return ind + "for (long long c = lane; c < " + num(C) + "; c += 32) {\n" + ind + "  const long long i = r * " +
           num(C) + " + c;\n";
  }

  // CUDA: one warp per row. When C is a multiple of 32 (up to 1024) each lane keeps its C / 32
  // elements of x in registers, so x (and the residual add before it) is read and computed once;
  // otherwise x is read again for each pass.
  LogicalResult cudaLayerNorm(LayerNormOp ln, int64_t N, int64_t C, float eps) {
    Value x = ln.getInput();
    const bool inRegisters = C % 32 == 0 && C <= 1024;
    block_ = 256;
    grid_ = unsigned((N + 7) / 8);
    body_ += "  const long long r = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;\n";
    body_ += "  const int lane = threadIdx.x % 32;\n  if (r >= " + num(N) + ") return;\n";
    const std::string rowLoop = cudaRowLoop(C, inRegisters, "  ");
    if (inRegisters) body_ += "  float xr[" + num(C / 32) + "];  // x[r, lane + 32 k]\n";
    body_ += "  float sum = 0.0f;\n";
    body_ += rowLoop;
    body_ += "    const float xv = " + at(x, "i") + ";\n";
    if (Operation* add = x.getDefiningOp())
      for (const std::string& o : outs_.lookup(add->getResult(0))) body_ += "    st(" + o + ", i, xv);\n";
    if (inRegisters) body_ += "    xr[k] = xv;\n";
    body_ += "    sum += xv;\n  }\n";
    body_ += "  const float m = warp_sum(sum) / " + num(C) + ".0f;\n";
    body_ += "  float ssq = 0.0f;\n";
    const std::string xAt = inRegisters ? "xr[k]" : at(x, "i");
    body_ += inRegisters ? "#pragma unroll\n  for (int k = 0; k < " + num(C / 32) + "; ++k) {\n" : rowLoop;
    body_ += "    const float d = " + xAt + " - m;\n    ssq += d * d;\n  }\n";
    body_ += "  const float s = rsqrtf(warp_sum(ssq) / " + num(C) + ".0f + " + floatLiteral(eps) + ");\n";
    body_ += rowLoop;
    layerNormOutput(ln, "(" + xAt + " - m) * s * " + at(ln.getWeight(), "c") + " + " + at(ln.getBias(), "c"), "    ");
    body_ += "  }\n";
    // The row's mean and rstd, when the backward reads them (it may recompute them instead).
    if (!outs_.lookup(ln.getMean()).empty() || !outs_.lookup(ln.getRstd()).empty()) {
      body_ += "  if (lane == 0) {\n";
      layerNormStats(ln, "m", "s", "    ");
      body_ += "  }\n";
    }
    return success();
  }

  // Layer-norm backward: dx per row, dw and db as per-chunk column sums added in a fixed order;
  // the residual gradient add, casts and accumulations fused.
  LogicalResult layerNormGrad() {
    LayerNormGradOp lg;
    SmallVector<ReduceSumOp> sums;  // bias gradients: column sums of the gradient that leaves
    for (Operation& op : f_.getFusedOps()) {
      if (auto l = dyn_cast<LayerNormGradOp>(op)) lg = l;
      if (auto r = dyn_cast<ReduceSumOp>(op)) sums.push_back(r);
    }
    Value dy = lg->getOperand(0), x = lg->getOperand(1), w = lg->getOperand(2), mean = lg->getOperand(3),
          rstd = lg->getOperand(4);
    const int64_t C = tensorOf(x).getShape().back(), N = numel(x) / C;
    flops_ = (14.0 + sums.size()) * double(N * C);
    if (t_ == Target::Cuda) return cudaLayerNormGrad(lg, sums, N, C);
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(N, 32));
    const int64_t width = (2 + int64_t(sums.size())) * C;  // per chunk: dw | db | column sums
    body_ += "  // Per-chunk partial column sums: partial[chunk] = [dw(C) | db(C)" +
             std::string(sums.empty() ? "" : " | sum of the outgoing gradient (C)") + "].\n";
    body_ += "  float* partial = scratch(0, " + num(chunks * width) + ");\n";
    body_ += "#pragma omp parallel for schedule(static)\n";
    body_ += "  for (int64_t ch = 0; ch < " + num(chunks) + "; ++ch) {\n";
    body_ += "    float* pdw = partial + ch * " + num(width) + ";\n    float* pdb = pdw + " + num(C) + ";\n";
    for (size_t k = 0; k < sums.size(); ++k)
      body_ += "    float* pcs" + num(k) + " = pdw + " + num((2 + int64_t(k)) * C) + ";\n";
    body_ += "    for (int64_t c = 0; c < " + num(width) + "; ++c) pdw[c] = 0.0f;\n";
    body_ += "    for (int64_t r = " + num(N) + " * ch / " + num(chunks) + "; r < " + num(N) + " * (ch + 1) / " +
             num(chunks) + "; ++r) {\n";
    body_ += "      const float m = " + at(mean, "r") + ", s = " + at(rstd, "r") + ";\n";
    body_ += "      // With xhat = (x - mean) rstd and g = dy w: dx = rstd (g - mean(g) - xhat mean(g xhat)).\n";
    body_ += "      double sum_g = 0.0, sum_gx = 0.0;\n";
    body_ += "      for (int64_t c = 0; c < " + num(C) + "; ++c) {\n        const int64_t i = r * " + num(C) + " + c;\n";
    body_ += "        const float xhat = (" + at(x, "i") + " - m) * s, g = " + at(dy, "i") + " * " + at(w, "c") + ";\n";
    body_ += "        sum_g += g;\n        sum_gx += (double)g * xhat;\n      }\n";
    body_ += "      const float mean_g = (float)(sum_g / " + num(C) + ".0), mean_gx = (float)(sum_gx / " + num(C) + ".0);\n";
    body_ += "      for (int64_t c = 0; c < " + num(C) + "; ++c) {\n        const int64_t i = r * " + num(C) + " + c;\n";
    layerNormGradElement(lg, N * C, "        ");
    body_ += "        pdw[c] += d * xhat;\n        pdb[c] += d;\n";
    for (size_t k = 0; k < sums.size(); ++k) body_ += "        pcs" + num(k) + "[c] += " + at(sums[k].getInput(), "i") + ";\n";
    body_ += "      }\n    }\n  }\n";
    body_ += "  // Chunk partials added in order: the same result whatever the thread count.\n";
    body_ += "  for (int64_t c = 0; c < " + num(C) + "; ++c) {\n";
    body_ += "    float sw = 0.0f, sb = 0.0f;\n";
    for (size_t k = 0; k < sums.size(); ++k) body_ += "    float sc" + num(k) + " = 0.0f;\n";
    body_ += "    for (int64_t ch = 0; ch < " + num(chunks) + "; ++ch) {\n";
    body_ += "      sw += partial[ch * " + num(width) + " + c];\n      sb += partial[ch * " + num(width) + " + " + num(C) + " + c];\n";
    for (size_t k = 0; k < sums.size(); ++k)
      body_ += "      sc" + num(k) + " += partial[ch * " + num(width) + " + " + num((2 + int64_t(k)) * C) + " + c];\n";
    body_ += "    }\n";
    for (unsigned k : {1u, 2u}) {
      Value r = lg->getResult(k);
      std::string v = k == 1 ? "sw" : "sb";
      if (isBF16(r)) v = "rb(" + v + ")";
      for (const std::string& o : outs_.lookup(r)) body_ += "    st(" + o + ", c, " + v + ");\n";
      for (Operation* u : r.getUsers())
        if (isa<AccumulateGradOp>(u) && state_.count(u)) body_ += "    " + state_[u][0] + "[c] += " + v + ";\n";
    }
    // Each bias gradient's chain (cast, accumulation) over the C column sums, at element c.
    body_ += "    const int64_t i = c;\n";
    for (size_t k = 0; k < sums.size(); ++k) {
      std::string name = "v" + num(next_++);
      body_ += "    const float " + name + " = " + (isBF16(sums[k].getResult()) ? "rb(sc" + num(k) + ")" : "sc" + num(k)) + ";\n";
      local_[sums[k].getResult()] = name;
      SmallVector<Operation*> chain;
      for (Operation* u = soleUserOf(sums[k].getResult()); u; u = u->getNumResults() ? soleUserOf(u->getResult(0)) : nullptr)
        chain.push_back(u);
      SmallVector<Operation*> vals;
      for (Operation* op : chain)
        if (op->getNumResults()) vals.push_back(op);
      locals(vals, "    ");
      SmallVector<Operation*> all{sums[k].getOperation()};
      all.append(chain.begin(), chain.end());
      stores(all, "    ");
    }
    body_ += "  }\n";
    return success();
  }

  // CUDA: one warp per row for dx; each block sums its rows' dw, db and bias-gradient columns in
  // shared memory and adds them to the accumulators with atomics at the end (bf16 bias-gradient
  // columns to an fp32 workspace, which the last block rounds: cudaRoundColumnTotals). When C is a multiple
  // of 32 (up to 1024) each lane keeps dy and xhat of its C / 32 columns in registers between
  // the two passes over the row; otherwise they are read again.
  LogicalResult cudaLayerNormGrad(LayerNormGradOp lg, SmallVector<ReduceSumOp>& sums, int64_t N, int64_t C) {
    Value dy = lg->getOperand(0), x = lg->getOperand(1), w = lg->getOperand(2), mean = lg->getOperand(3),
          rstd = lg->getOperand(4);
    std::vector<std::string> targets;  // where dw, db and each bias gradient are summed into
    for (unsigned k : {1u, 2u}) {
      Operation* u = soleUserOf(lg->getResult(k));
      if (u && isa<AccumulateGradOp>(u) && state_.count(u)) {
        targets.push_back(state_[u][0]);  // the accumulator: blocks add to it
        continue;
      }
      auto outs = outs_.lookup(lg->getResult(k));
      if (outs.empty() || isBF16(lg->getResult(k)))
        return f_.emitError() << "kilnc: CUDA: the layer-norm backward's weight gradients must be fp32 results or accumulated";
      targets.push_back(outs.front());  // a result: the runtime clears it, blocks add to it
      zero_.push_back(unsigned(index_[outs.front()]));
    }
    // A bf16 bias gradient is its whole column sum rounded once (as the CPU kernel and PyTorch's bf16
    // sum give it): blocks add to an fp32 workspace, and the last block rounds (cudaRoundColumnTotals).
    SmallVector<SmallVector<Operation*>> rounded;  // each one's chain: the sum, its casts, its accumulation
    const std::string ws = symbolPrefix() + "column_totals";
    for (ReduceSumOp r : sums) {
      SmallVector<Operation*> chain{r};
      Operation* u = soleUserOf(r.getResult());
      for (; u && isa<CastOp>(u); u = soleUserOf(u->getResult(0))) chain.push_back(u);
      if (!u || !isa<AccumulateGradOp>(u)) return f_.emitError() << "kilnc: CUDA: a bias gradient (kiln.reduce_sum) in a layer-norm backward region must be accumulated as it is (through casts only)";
      chain.push_back(u);
      if (!isBF16(r.getResult())) {
        targets.push_back(state_[u][0]);
        continue;
      }
      targets.push_back("(" + ws + " + " + num(int64_t(rounded.size()) * C) + ")");
      rounded.push_back(std::move(chain));
    }
    const int64_t width = int64_t(targets.size()) * C;
    block_ = 256;
    grid_ = unsigned(std::min<int64_t>((N + 7) / 8, 264));
    body_ += "  __shared__ float part[" + num(width) + "];  // dw | db | bias-gradient columns\n";
    body_ += "  for (int c = threadIdx.x; c < " + num(width) + "; c += blockDim.x) part[c] = 0.0f;\n";
    body_ += "  __syncthreads();\n";
    body_ += "  const int lane = threadIdx.x % 32;\n";
    body_ += "  for (long long r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < " + num(N) +
             "; r += gridDim.x * (blockDim.x / 32)) {\n";
    const bool inRegisters = C % 32 == 0 && C <= 1024;
    const std::string rowLoop = cudaRowLoop(C, inRegisters, "    ");
    body_ += "    const float m = " + at(mean, "r") + ", s = " + at(rstd, "r") + ";\n";
    if (inRegisters) body_ += "    float dr[" + num(C / 32) + "], xr[" + num(C / 32) + "];  // dy and xhat at [r, lane + 32 k]\n";
    body_ += "    float sg = 0.0f, sgx = 0.0f;\n";
    body_ += rowLoop;
    body_ += "      const float d = " + at(dy, "i") + ", xhat = (" + at(x, "i") + " - m) * s, g = d * " + at(w, "c") + ";\n";
    if (inRegisters) body_ += "      dr[k] = d;\n      xr[k] = xhat;\n";
    body_ += "      sg += g;\n      sgx += g * xhat;\n    }\n";
    body_ += "    const float mean_g = warp_sum(sg) / " + num(C) + ".0f, mean_gx = warp_sum(sgx) / " + num(C) + ".0f;\n";
    body_ += rowLoop;
    layerNormGradElement(lg, N * C, "      ", inRegisters);
    body_ += "      atomicAdd(&part[c], d * xhat);\n      atomicAdd(&part[" + num(C) + " + c], d);\n";
    for (size_t k = 0; k < sums.size(); ++k)
      body_ += "      atomicAdd(&part[" + num((2 + int64_t(k)) * C) + " + c], " + at(sums[k].getInput(), "i") + ");\n";
    body_ += "    }\n  }\n  __syncthreads();\n";
    body_ += "  for (int c = threadIdx.x; c < " + num(C) + "; c += blockDim.x) {\n";
    for (size_t k = 0; k < targets.size(); ++k)
      body_ += "    atomicAdd(&" + targets[k] + "[c], part[" + num(int64_t(k) * C) + " + c]);\n";
    body_ += "  }\n";
    // (The last-block flag goes in part[0], read out by now: at n_embd = 4096, part's 3 C floats fill
    // the 48 KB of static shared memory, and a __shared__ flag of its own would be a byte too many.)
    if (!rounded.empty()) cudaRoundColumnTotals(ws, C, rounded, "part");
    return success();
  }

  // CUDA, at the end of a kernel whose blocks have added their partial column sums of bf16 bias
  // gradients to the fp32 workspace `ws` (chains[j]'s C totals at ws + j C; chains[j] is the
  // kiln.reduce_sum and its casts and accumulation): the last block to finish rounds each total to
  // bf16 once, computes the chain and clears the workspace and the block counter for the next launch.
  // Its cost: a counter atomic per block, then C reads, adds and clears per chain in one block.
  // `flagSlot`, when given, is a __shared__ float array the kernel is done with, whose first element
  // holds the last-block flag instead of a __shared__ variable of its own.
  void cudaRoundColumnTotals(const std::string& ws, int64_t C, ArrayRef<SmallVector<Operation*>> chains,
                             const std::string& flagSlot = "") {
    const std::string done = symbolPrefix() + "blocks_done";
    preamble_ += "__device__ float " + ws + "[" + num(C * int64_t(chains.size())) + "];  // zero between launches\n" +
                 "__device__ unsigned " + done + " = 0;\n";
    body_ += "  // The last block to finish rounds the column totals (bf16 bias gradients) and clears them.\n";
    if (flagSlot.empty()) {
      body_ += "  __shared__ bool last;\n  __threadfence();\n  __syncthreads();\n";
      body_ += "  if (threadIdx.x == 0) last = atomicAdd(&" + done + ", 1u) == gridDim.x - 1;\n";
      body_ += "  __syncthreads();\n  if (!last) return;\n";
    } else {
      body_ += "  __threadfence();\n  __syncthreads();\n";
      body_ += "  if (threadIdx.x == 0) " + flagSlot + "[0] = atomicAdd(&" + done + ", 1u) == gridDim.x - 1 ? 1.0f : 0.0f;\n";
      body_ += "  __syncthreads();\n  if (" + flagSlot + "[0] == 0.0f) return;\n";
    }
    body_ += "  for (long long c = threadIdx.x; c < " + num(C) + "; c += blockDim.x) {\n";
    body_ += "    const long long i = c;\n";
    for (size_t j = 0; j < chains.size(); ++j) {
      const std::string cell = ws + "[" + num(int64_t(j) * C) + " + c]";
      std::string name = "v" + num(next_++);
      body_ += "    const float " + name + " = rb(atomicAdd(&" + cell + ", 0.0f));  // read past the L1\n";
      body_ += "    " + cell + " = 0.0f;\n";
      local_[chains[j].front()->getResult(0)] = name;
      SmallVector<Operation*> vals;
      for (Operation* op : ArrayRef<Operation*>(chains[j]).drop_front())
        if (op->getNumResults()) vals.push_back(op);
      locals(vals, "    ");
      stores(chains[j], "    ");
    }
    body_ += "  }\n  if (threadIdx.x == 0) " + done + " = 0;\n";
  }

  // Element i of a row of the layer-norm backward (m, s, mean_g and mean_gx known): dx, then the
  // residual add and casts that follow it, and their stores. Leaves d and xhat for the column sums.
  // With inRegisters, d and xhat come from the row's registers dr[k], xr[k].
  void layerNormGradElement(LayerNormGradOp lg, int64_t n, const std::string& ind, bool inRegisters = false) {
    Value dy = lg->getOperand(0), x = lg->getOperand(1), w = lg->getOperand(2);
    const std::string d = inRegisters ? "dr[k]" : at(dy, "i"), xhat = inRegisters ? "xr[k]" : "(" + at(x, "i") + " - m) * s";
    body_ += ind + "const float d = " + d + ", xhat = " + xhat + ", g = d * " + at(w, "c") + ";\n";
    std::string dx = "s * (g - mean_g - xhat * mean_gx)";
    if (isBF16(lg->getResult(0))) dx = "rb(" + dx + ")";
    body_ += ind + "const float dx = " + dx + ";\n";
    local_[lg->getResult(0)] = "dx";
    SmallVector<Operation*> after;  // row-domain ops after the backward: residual add, casts
    // Not what follows a column sum: with one row (B T = 1) a bias gradient's cast has n elements too.
    llvm::DenseSet<Value> columns;
    for (Operation& op : f_.getFusedOps()) {
      if (isa<ReduceSumOp>(op) || llvm::any_of(op.getOperands(), [&](Value v) { return columns.contains(v); })) {
        columns.insert(op.getResults().begin(), op.getResults().end());
        continue;
      }
      if (isa<AddOp, CastOp>(op) && lg->isBeforeInBlock(&op) && numel(op.getResult(0)) == n) after.push_back(&op);
    }
    locals(after, ind);
    for (const std::string& o : outs_.lookup(lg->getResult(0))) body_ += ind + "st(" + o + ", i, dx);\n";
    stores(after, ind);
  }

  static Operation* soleUserOf(Value v) {
    Operation* user = nullptr;
    for (Operation* u : v.getUsers()) {
      if (user && u != user) return nullptr;
      user = u;
    }
    return user && !isa<YieldOp>(user) ? user : nullptr;
  }

  // Mean cross-entropy and its gradient in one pass per row; the probabilities are never stored.
  LogicalResult classifier() {
    CrossEntropyOp ce;
    CrossEntropyGradOp cg;
    for (Operation& op : f_.getFusedOps()) {
      if (auto c = dyn_cast<CrossEntropyOp>(op)) ce = c;
      if (auto g = dyn_cast<CrossEntropyGradOp>(op)) cg = g;
    }
    if (!ce) return f_.emitError() << "kilnc: a classifier region needs cross_entropy";
    if (!cg) return lossOnly(ce);
    Value logits = ce.getLogits(), targets = ce.getTargets(), dloss = cg->getOperand(0);
    const int64_t N = tensorOf(logits).getShape()[0], V = tensorOf(logits).getShape()[1];
    const int64_t valid = ce.getNumClasses() ? int64_t(*ce.getNumClasses()) : V;
    flops_ = 6.0 * double(N * V);
    auto lossOut = outs_.lookup(ce.getLoss());
    auto gradOut = outs_.lookup(cg->getResult(0));
    assert(!gradOut.empty() && "the fusion verifier: a classifier's ops are yielded, not read in the region");
    const std::string dl = gradOut.front();
    if (t_ == Target::Cuda)
      return cudaClassifier(logits, targets, dloss, N, V, valid, lossOut, dl, isBF16(cg->getResult(0)));
    body_ += "  // Row i: lse = max + log sum exp(x - max) over the " + num(valid) + " classes; loss_i = lse - x[t];\n";
    body_ += "  // dlogits = dloss / N * (softmax - onehot(t)), written over the logits when they share storage.\n";
    body_ += "  double* row_loss = (double*)scratch(1, " + num(2 * N) + ");\n";
    body_ += "  float* exps = scratch(3, (int64_t)omp_get_max_threads() * " + num(valid) + ");  // a row's exp(x - max), per thread\n";
    body_ += "  const float g = " + at(dloss, "0") + " / " + num(N) + ".0f;\n";
    body_ += "#pragma omp parallel for schedule(static)\n";
    body_ += "  for (int64_t r = 0; r < " + num(N) + "; ++r) {\n";
    body_ += "    const int64_t row = r * " + num(V) + ";\n";
    body_ += "    const int32_t t = " + at(targets, "r") + ";\n";
    body_ += "    float* e = exps + (int64_t)omp_get_thread_num() * " + num(valid) + ";\n";
    // The row's exponentials stay in e (in the core's cache) for the gradient: each logit is
    // exponentiated once.
    cpuRowMaxSum(logits, valid, true);
    body_ += "    row_loss[r] = (double)mx + log((double)sum) - (double)" + at(logits, "row + t") + ";\n";
    body_ += "    const float gs = g / sum;  // softmax = e / sum\n";
    body_ += "    for (int64_t j = 0; j < " + num(valid) + "; ++j) st(" + dl + ", row + j, gs * e[j]);\n";
    body_ += "    if (t >= 0 && t < " + num(valid) + ") st(" + dl + ", row + t, gs * e[t] - g);\n";
    if (valid < V) body_ += "    for (int64_t j = " + num(valid) + "; j < " + num(V) + "; ++j) st(" + dl + ", row + j, 0.0f);  // padding\n";
    body_ += "  }\n";
    body_ += "  double total = 0.0;\n  for (int64_t r = 0; r < " + num(N) + "; ++r) total += row_loss[r];\n";
    for (const std::string& o : lossOut) body_ += "  st(" + o + ", 0, (float)(total / " + num(N) + ".0));\n";
    return success();
  }

  // CPU: a logits row's max and sum of exp(x - max) over its `valid` classes (mx, sum; e[j] the
  // exponentials when keepExps). omp simd reductions: vectorised (the lanes' partial maxima and
  // sums, then combined), in the same order in every run.
  void cpuRowMaxSum(Value logits, int64_t valid, bool keepExps) {
    body_ += "    float mx = -INFINITY, sum = 0.0f;\n";
    body_ += "#pragma omp simd reduction(max : mx)\n";
    body_ += "    for (int64_t j = 0; j < " + num(valid) + "; ++j) { const float v = " + at(logits, "row + j") + "; mx = v > mx ? v : mx; }\n";
    body_ += "#pragma omp simd reduction(+ : sum)\n";
    const std::string x = "exp_f(" + at(logits, "row + j") + " - mx)";
    body_ += "    for (int64_t j = 0; j < " + num(valid) + "; ++j) " +
             (keepExps ? "{ e[j] = " + x + "; sum += e[j]; }\n" : "sum += " + x + ";\n");
  }

  // Blocks over 256 threads tell ptxas their size, which then keeps registers within what such a
  // block may hold (64 per thread for 1024; without it the launch could fail). Smaller blocks get
  // ptxas's own choice, which may hold 255 registers a thread.
  std::string launchBounds() const { return block_ > 256 ? "__launch_bounds__(" + num(block_) + ") " : ""; }

  // The mean loss alone (evaluation), and the rows' log-sum-exp where it is read later: the same
  // row pass as the training classifier without the gradient.
  LogicalResult lossOnly(CrossEntropyOp ce) {
    Value logits = ce.getLogits(), targets = ce.getTargets();
    const int64_t N = tensorOf(logits).getShape()[0], V = tensorOf(logits).getShape()[1];
    const int64_t valid = ce.getNumClasses() ? int64_t(*ce.getNumClasses()) : V;
    flops_ = 3.0 * double(N * V);
    auto lossOut = outs_.lookup(ce.getLoss());
    auto lseOut = outs_.lookup(ce.getLse());
    if (t_ == Target::Cpu) {
      body_ += "  double* row_loss = (double*)scratch(1, " + num(2 * N) + ");\n";
      body_ += "#pragma omp parallel for schedule(static)\n";
      body_ += "  for (int64_t r = 0; r < " + num(N) + "; ++r) {\n";
      body_ += "    const int64_t row = r * " + num(V) + ";\n";
      cpuRowMaxSum(logits, valid, false);
      body_ += "    const double l = (double)mx + log((double)sum);\n";
      for (const std::string& o : lseOut) body_ += "    st(" + o + ", r, (float)l);\n";
      body_ += "    row_loss[r] = l - (double)" + at(logits, "row + " + at(targets, "r")) + ";\n  }\n";
      body_ += "  double total = 0.0;\n  for (int64_t r = 0; r < " + num(N) + "; ++r) total += row_loss[r];\n";
      for (const std::string& o : lossOut) body_ += "  st(" + o + ", 0, (float)(total / " + num(N) + ".0));\n";
      return success();
    }
    block_ = 256;
    grid_ = unsigned(N);
    preamble_ = lossTotalState();
    body_ += "  __shared__ float smx[32], ssum[32];\n";
    body_ += "  const long long r = blockIdx.x, row = r * " + num(V) + ";\n";
    cudaRowMaxSum(logits, valid);
    body_ += "  }\n";
    body_ += "  if (threadIdx.x == 0) {\n";
    body_ += "    const float lse = (mx + log2f(sum)) * 0.693147181f;\n";
    for (const std::string& o : lseOut) body_ += "    st(" + o + ", r, lse);\n";
    cudaLossTotal("lse - " + at(logits, "row + " + at(targets, "r")), lossOut, N);
    return success();
  }

  // Column sums of a [R, K] tensor (a bias gradient left on its own), then their consumers.
  LogicalResult reduceSum() {
    SmallVector<Operation*> ops;
    for (Operation& op : f_.getFusedOps()) ops.push_back(&op);
    if (t_ == Target::Cpu) {
      columnSums(ops);
      return success();
    }
    auto sum = cast<ReduceSumOp>(ops.front());
    const int64_t K = numel(sum.getResult()), R = numel(sum.getInput()) / K;
    flops_ = double(R * K);
    block_ = 256;
    grid_ = unsigned((K + 255) / 256);
    body_ += "  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n";
    body_ += "  if (i >= " + num(K) + ") return;\n";
    body_ += "  float acc = 0.0f;\n";
    body_ += "  for (long long r = 0; r < " + num(R) + "; ++r) acc += " + at(sum.getInput(), "r * " + num(K) + " + i") + ";\n";
    std::string name = "v" + num(next_++);
    body_ += "  const float " + name + " = " + (isBF16(sum.getResult()) ? "rb(acc)" : "acc") + ";\n";
    local_[sum.getResult()] = name;
    locals(columnsWide(ArrayRef<Operation*>(ops).drop_front(), K), "  ");
    stores(ops, "  ");
    return success();
  }

  // The device variables cudaLossTotal uses: the sum of the rows' losses and the rows done.
  std::string lossTotalState() const {
    return "__device__ double " + symbolPrefix() + "loss_sum = 0.0;\n__device__ unsigned " + symbolPrefix() +
           "rows_done = 0;\n";
  }
  // Thread 0 of a row's block: adds the row's loss (an expression) to loss_sum; the last block to
  // finish writes the mean over the N rows and resets the sum and counter for the next launch.
  void cudaLossTotal(const std::string& rowLoss, const std::vector<std::string>& lossOut, int64_t N) {
    body_ += "    atomicAdd(&" + symbolPrefix() + "loss_sum, (double)(" + rowLoss + "));\n";
    body_ += "    __threadfence();\n";
    body_ += "    if (atomicAdd(&" + symbolPrefix() + "rows_done, 1u) == gridDim.x - 1) {\n";
    body_ += "      const double total = atomicAdd(&" + symbolPrefix() + "loss_sum, 0.0);\n";
    for (const std::string& o : lossOut) body_ += "      st(" + o + ", 0, (float)(total / " + num(N) + ".0));\n";
    body_ += "      " + symbolPrefix() + "loss_sum = 0.0;\n      " + symbolPrefix() + "rows_done = 0;\n    }\n  }\n";
  }

  // After cudaRowMaxSum / cudaBlockMaxSum (warp 0 inside its `if`): the row's log-sum-exp shared
  // with the block as row_lse, then each thread's lse, lse log2(e) and g = dloss / N, the scale of
  // the gradient d = g (softmax - onehot) (`softmax` says how it is computed).
  void cudaRowLseAndScale(Value dloss, int64_t N, const std::string& softmax) {
    body_ += "    if (threadIdx.x == 0) row_lse = (mx + log2f(sum)) * 0.693147181f;\n  }\n";
    body_ += "  __syncthreads();\n";
    body_ += "  // d = g (softmax - onehot), " + softmax + "\n";
    body_ += "  const float lse = row_lse, lse2 = lse * 1.44269504f, g = " + at(dloss, "0") + " / " + num(N) + ".0f;\n";
  }

  // One block per row of logits (r, row = r * V): the row's max mx and sum of exp2(x - mx) over
  // its first `valid` columns, x = logit * log2(e) (log2 units: the row's log-sum-exp is
  // (mx + log2(sum)) * ln 2), by the online softmax per thread, then across warps; warp 0 ends
  // inside `if (threadIdx.x < 32) {` holding them (the caller closes it). Needs smx, ssum [32].
  void cudaRowMaxSum(Value logits, int64_t valid) {
    body_ += "  float mx = -INFINITY, sum = 0.0f;\n";
    body_ += "#pragma unroll 4\n";
    body_ += "  for (long long j = threadIdx.x; j < " + num(valid) + "; j += blockDim.x) {\n";
    body_ += "    const float v = " + at(logits, "row + j") + " * 1.44269504f;\n";
    body_ += "    if (v > mx) { sum = sum * exp2f(mx - v) + 1.0f; mx = v; } else { sum += exp2f(v - mx); }\n  }\n";
    cudaBlockMaxSum();
  }
  // Each thread's (mx, sum) merged across the block; warp 0 ends inside `if (threadIdx.x < 32) {`
  // holding the block's (the caller closes it). Needs smx, ssum [32].
  void cudaBlockMaxSum() {
    body_ += "  combine_max_sum(mx, sum);\n";
    body_ += "  if (threadIdx.x % 32 == 0) { smx[threadIdx.x / 32] = mx; ssum[threadIdx.x / 32] = sum; }\n";
    body_ += "  __syncthreads();\n";
    body_ += "  if (threadIdx.x < 32) {\n";
    body_ += "    mx = threadIdx.x < blockDim.x / 32 ? smx[threadIdx.x] : -INFINITY;\n";
    body_ += "    sum = threadIdx.x < blockDim.x / 32 ? ssum[threadIdx.x] : 0.0f;\n";
    body_ += "    combine_max_sum(mx, sum);\n";
  }

  // CUDA: one block per row; each thread keeps a running max and sum (online softmax), the block
  // combines them, then writes the gradient over the logits. The mean loss is summed across blocks
  // and the last block to finish writes it (and resets the sum for the next launch).
  LogicalResult cudaClassifier(Value logits, Value targets, Value dloss, int64_t N, int64_t V, int64_t valid,
                               const std::vector<std::string>& lossOut, const std::string& dl, bool dlBF16) {
    auto arg = dyn_cast<BlockArgument>(logits);
    if (arg && isBF16(logits) && dlBF16 && V % 2 == 0 && V <= 2 * kRowThreads * 32)
      return cudaClassifierInRegisters(ptr_[arg], targets, dloss, N, V, valid, lossOut, dl);
    block_ = 256;
    grid_ = unsigned(N);
    preamble_ = lossTotalState();
    body_ += "  __shared__ float smx[32], ssum[32];\n  __shared__ float row_lse, row_xt;\n";
    body_ += "  const long long r = blockIdx.x, row = r * " + num(V) + ";\n";
    body_ += "  const int t = " + at(targets, "r") + ";\n";
    body_ += "  if (threadIdx.x == 0) row_xt = " + at(logits, "row + t") + ";\n";
    cudaRowMaxSum(logits, valid);
    cudaRowLseAndScale(dloss, N, "softmax = exp(x - lse) = exp2(x log2(e) - lse log2(e)).");
    body_ += "#pragma unroll 4\n";
    body_ += "  for (long long j = threadIdx.x; j < " + num(V) + "; j += blockDim.x) {\n";
    body_ += "    float d = j < " + num(valid) + " ? g * exp2f(" + at(logits, "row + j") + " * 1.44269504f - lse2) : 0.0f;\n";
    body_ += "    if (j == t) d -= g;\n";
    body_ += "    st(" + dl + ", row + j, d);\n  }\n";
    body_ += "  if (threadIdx.x == 0) {\n";
    cudaLossTotal("lse - row_xt", lossOut, N);
    return success();
  }

  // The same for bf16 logits and gradient with an even row length (GPT-2's padded vocabulary):
  // a block of kRowThreads per row keeps the row in registers as bf16 pairs (at most 32 per
  // thread), so the logits are read from memory once, not once per pass; the gradient is
  // written over them pair by pair.
  static constexpr int64_t kRowThreads = 1024;
  LogicalResult cudaClassifierInRegisters(const std::string& x, Value targets, Value dloss, int64_t N, int64_t V,
                                          int64_t valid, const std::vector<std::string>& lossOut,
                                          const std::string& dl) {
    const int64_t pairs = (V / 2 + kRowThreads - 1) / kRowThreads;
    block_ = unsigned(kRowThreads);
    grid_ = unsigned(N);
    preamble_ = lossTotalState();
    const std::string each = "#pragma unroll\n  for (int k = 0; k < " + num(pairs) +
                             "; ++k) {\n    const long long j = 2 * (threadIdx.x + " + num(kRowThreads) + " * k);\n";
    body_ += "  __shared__ float smx[32], ssum[32];\n  __shared__ float row_lse;\n";
    body_ += "  const long long r = blockIdx.x, row = r * " + num(V) + ";\n";
    body_ += "  const int t = " + at(targets, "r") + ";\n";
    body_ += "  // This thread's logits: pair k is columns j, j + 1 with j = 2 (threadIdx.x + " + num(kRowThreads) + " k).\n";
    body_ += "  uint32_t x2[" + num(pairs) + "];\n";
    body_ += each + "    x2[k] = j < " + num(V) + " ? ld_pair(" + x + " + row + j) : 0u;\n  }\n";
    body_ += "  const float xt = bf2f(" + x + "[row + t]);\n";
    body_ += "  float mx = -INFINITY, sum = 0.0f;  // log2 units, as cudaRowMaxSum\n";
    body_ += each + "    for (int h = 0; h < 2; ++h) {\n";
    body_ += "      if (j + h >= " + num(valid) + ") break;\n";
    body_ += "      const float v = bf2f((bf16)(h ? x2[k] >> 16 : x2[k] & 0xffffu)) * 1.44269504f;\n";
    body_ += "      if (v > mx) { sum = sum * exp2f(mx - v) + 1.0f; mx = v; } else { sum += exp2f(v - mx); }\n";
    body_ += "    }\n  }\n";
    cudaBlockMaxSum();
    cudaRowLseAndScale(dloss, N, "softmax = exp2(x log2(e) - lse log2(e)); 0 past the classes.");
    body_ += each + "    if (j >= " + num(V) + ") break;\n";
    body_ += "    float d[2];\n";
    body_ += "    for (int h = 0; h < 2; ++h) {\n";
    body_ += "      const float v = bf2f((bf16)(h ? x2[k] >> 16 : x2[k] & 0xffffu));\n";
    body_ += "      d[h] = j + h < " + num(valid) + " ? g * exp2f(v * 1.44269504f - lse2) : 0.0f;\n";
    body_ += "      if (j + h == t) d[h] -= g;\n";
    body_ += "    }\n";
    body_ += "    st_pair(" + dl + " + row + j, pack_bf16(d[0], d[1]));\n  }\n";
    body_ += "  if (threadIdx.x == 0) {\n";
    cudaLossTotal("lse - xt", lossOut, N);
    return success();
  }

  // Scatter-add of rows into the embedding gradient; each thread owns a band of columns.
  LogicalResult embeddingGrad() {
    EmbeddingGradOp eg;
    AccumulateGradOp acc;
    for (Operation& op : f_.getFusedOps()) {
      if (auto e = dyn_cast<EmbeddingGradOp>(op)) eg = e;
      if (auto a = dyn_cast<AccumulateGradOp>(op)) acc = a;
    }
    Value dout = eg->getOperand(0), ids = eg->getOperand(1);
    const int64_t V = tensorOf(eg.getResult()).getShape()[0], C = tensorOf(eg.getResult()).getShape()[1];
    const int64_t n = numel(ids);
    flops_ = double(n * C);
    // The rows go into the gradient accumulator, or into the yielded result, cleared first.
    std::string g;
    if (acc) {
      g = state_[acc.getOperation()][0];
    } else {
      auto outs = outs_.lookup(eg.getResult());
      if (outs.empty() || isBF16(eg.getResult()))
        return f_.emitError() << "kilnc internal error: the embedding backward must be accumulated or yielded as an "
                                 "f32 result (the fusion verifier should have refused it)";
      g = outs.front();
    }
    if (t_ == Target::Cuda) {
      if (!acc) zero_.push_back(unsigned(index_[g]));  // cleared by the runtime, then scattered into
      block_ = 256;
      grid_ = unsigned(std::min<int64_t>((n * C + 255) / 256, 2112));
      body_ += "  // " + g + "[ids[n], c] += dout[n, c] (atomics: rows may repeat).\n";
      body_ += "  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < " + num(n * C) +
               "; e += (long long)gridDim.x * blockDim.x) {\n";
      body_ += "    const long long n = e / " + num(C) + ", c = e % " + num(C) + ";\n";
      body_ += "    atomicAdd(&" + g + "[(long long)" + at(ids, "n") + " * " + num(C) + " + c], " + at(dout, "e") + ");\n  }\n";
      return success();
    }
    if (!acc) body_ += "  for (int64_t i = 0; i < " + num(V * C) + "; ++i) " + g + "[i] = 0.0f;\n";
    body_ += "  // " + g + "[ids[n], c] += dout[n, c], rows in order; columns split across threads.\n";
    body_ += "#pragma omp parallel for schedule(static)\n";
    body_ += "  for (int64_t c = 0; c < " + num(C) + "; ++c)\n";
    body_ += "    for (int64_t n = 0; n < " + num(n) + "; ++n) " + g + "[(int64_t)" + at(ids, "n") + " * " + num(C) +
             " + c] += " + at(dout, "n * " + num(C) + " + c") + ";\n";
    return success();
  }

  // Clipping coefficient and AdamW over every parameter: one table, one loop per tensor.
  LogicalResult optimizer() {
    ClipCoefOp clip;
    SmallVector<AdamWOp> adams;
    for (Operation& op : f_.getFusedOps()) {
      if (auto c = dyn_cast<ClipCoefOp>(op)) clip = c;
      if (auto a = dyn_cast<AdamWOp>(op)) adams.push_back(a);
    }
    AdamWOp first = adams.front();  // (the verifier holds every kiln.adamw here to its hyperparameters)
    auto scalar = [&](Value v) -> std::string {
      if (clip && v == clip.getResult()) return "coef";
      return at(v, "0");
    };
    if (clip) {
      body_ += "  // coef = min(1, max_norm / (norm + 1e-6)) when max_norm > 0: gradient clipping.\n";
      body_ += "  const float norm = " + at(clip->getOperand(0), "0") + ", max_norm = " + at(clip->getOperand(1), "0") + ";\n";
      body_ += "  const float coef = max_norm > 0.0f ? fminf(1.0f, max_norm / (norm + 1e-6f)) : 1.0f;\n";
    }
    body_ += "  const float scale = " + scalar(first->getOperand(1)) + ", lr = " + scalar(first->getOperand(2)) +
             ", beta1 = " + scalar(first->getOperand(3)) + ", beta2 = " + scalar(first->getOperand(4)) +
             ", eps = " + scalar(first->getOperand(5)) + ", wd = " + scalar(first->getOperand(6)) + ";\n";
    body_ += "  const int64_t t = (int64_t)" + scalar(first->getOperand(7)) + ";\n";
    body_ += "  // Bias corrections 1 - beta^t in double.\n";
    body_ += "  const float bc1 = (float)(1.0 - pow((double)beta1, (double)t)), bc2 = (float)(1.0 - pow((double)beta2, (double)t));\n";
    if (t_ == Target::Cuda) return cudaOptimizer(adams);
    body_ += "  // Per tensor: the operand of its gradient, of its value (its moments follow it) and of its\n"
             "  // bf16 compute copy (-1: none); its elements; weight decay; its name.\n";
    body_ += "  struct Tensor { int grad, value, copy; int64_t n; int decay; const char* name; };\n";
    body_ += "  static const Tensor tensors[" + num(adams.size()) + "] = {\n";
    for (AdamWOp a : adams) {
      auto& s = state_[a.getOperation()];
      body_ += "    {" + num(index_[ptr_[cast<BlockArgument>(a.getGrad())]]) + ", " + num(index_[s[0]]) + ", " +
               (s.size() > 3 ? num(index_[s[3]]) : std::string("-1")) + ", " + num(numel(a.getGrad())) + ", " +
               (a.getDecay() ? "1" : "0") + ", \"" + cEscaped(a.getName()) + "\"},\n";
      flops_ += 12.0 * double(numel(a.getGrad()));
    }
    body_ += "  };\n";
    body_ += "  for (int k = 0; k < " + num(adams.size()) + "; ++k) {\n";
    body_ += "    const Tensor& x = tensors[k];\n";
    body_ += "    const float* g = (const float*)b[x.grad];\n";
    body_ += "    float* p = (float*)b[x.value];\n    float* m = (float*)b[x.value + 1];\n    float* v = (float*)b[x.value + 2];\n";
    body_ += "    const float decay = 1.0f - lr * (x.decay ? wd : 0.0f);\n";
    body_ += "    const int64_t begin = range[2 * k], end = range[2 * k + 1];\n";
    body_ += "#pragma omp parallel for schedule(static) if (end - begin >= 16384)\n";
    body_ += "    for (int64_t i = begin; i < end; ++i) {\n";
    body_ += "      const float gi = g[i] * scale;\n";
    body_ += "      const float mi = beta1 * m[i] + (1.0f - beta1) * gi;\n";
    body_ += "      const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;\n";
    body_ += "      m[i] = mi;\n      v[i] = vi;\n";
    body_ += "      p[i] = p[i] * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);\n    }\n";
    body_ += "    if (x.copy >= 0) {  // refresh the bf16 compute copy from the new master value\n";
    body_ += "      bf16* copy = (bf16*)b[x.copy];\n";
    body_ += "#pragma omp parallel for schedule(static) if (x.n >= 16384)\n";
    body_ += "      for (int64_t i = 0; i < x.n; ++i) copy[i] = f2bf(p[i]);\n";
    body_ += "    }\n";
    body_ += "  }\n";
    return success();
  }

  // CUDA: one grid over the elements of every tensor; a thread finds its tensor in a table of
  // offsets (binary search) and updates the element if it is in this rank's slice.
  LogicalResult cudaOptimizer(ArrayRef<AdamWOp> adams) {
    const std::string pre = symbolPrefix();
    std::string offsets = "0", grads, ps, decays, copies;
    int64_t total = 0;
    auto index = [&](const std::string& name) { return num(index_[name]); };
    for (AdamWOp a : adams) {  // (each gradient a region input: FusionOp::verify)
      total += numel(a.getGrad());
      offsets += ", " + num(total);
      auto& st = state_[a.getOperation()];
      grads += (grads.empty() ? "" : ", ") + index(ptr_[cast<BlockArgument>(a.getGrad())]);
      ps += (ps.empty() ? "" : ", ") + index(st[0]);
      copies += std::string(copies.empty() ? "" : ", ") + (st.size() > 3 ? index(st[3]) : "-1");
      decays += std::string(decays.empty() ? "" : ", ") + (a.getDecay() ? "1" : "0");
      flops_ += 12.0 * double(numel(a.getGrad()));
    }
    const std::string K = num(adams.size());
    // Constant memory (one broadcast read for a warp, whose threads mostly share a tensor) holds
    // 64 KB a module; deeper models' tables go to global memory.
    const bool constant = 8 * (adams.size() + 1) + 16 * adams.size() <= kCudaConstantTableBytes;
    const std::string q = constant ? "__constant__ " : "__device__ const ";
    preamble_ = "// Per tensor: first element in the flattened list, operand of its gradient, of its value\n"
                "// (moments follow it), of its bf16 copy (-1: none), weight decay.\n" +
                q + "long long " + pre + "first[" + num(adams.size() + 1) + "] = {" + offsets + "};\n" +
                q + "int " + pre + "grad[" + K + "] = {" + grads + "};\n" +
                q + "int " + pre + "value[" + K + "] = {" + ps + "};\n" +
                q + "int " + pre + "copy[" + K + "] = {" + copies + "};\n" +
                q + "int " + pre + "decay[" + K + "] = {" + decays + "};\n";
    block_ = 256;
    grid_ = unsigned(std::min<int64_t>((total + 255) / 256, 2112));
    body_ += "  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < " + num(total) +
             "; e += (long long)gridDim.x * blockDim.x) {\n";
    body_ += "    int lo = 0, hi = " + K + ";  // the tensor k with first[k] <= e < first[k + 1]\n";
    body_ += "    while (hi - lo > 1) { const int mid = (lo + hi) / 2; if (" + pre + "first[mid] <= e) lo = mid; else hi = mid; }\n";
    body_ += "    const int k = lo;\n    const long long i = e - " + pre + "first[k];\n";
    body_ += "    if (i < range[2 * k] || i >= range[2 * k + 1]) continue;  // another rank's slice\n";
    body_ += "    const float* g = (const float*)b[" + pre + "grad[k]];\n";
    body_ += "    float* p = (float*)b[" + pre + "value[k]];\n    float* m = (float*)b[" + pre + "value[k] + 1];\n";
    body_ += "    float* v = (float*)b[" + pre + "value[k] + 2];\n";
    body_ += "    const float gi = g[i] * scale;\n";
    body_ += "    const float mi = beta1 * m[i] + (1.0f - beta1) * gi, vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;\n";
    body_ += "    m[i] = mi;\n    v[i] = vi;\n";
    body_ += "    const float pi = p[i] * (1.0f - lr * (" + pre + "decay[k] ? wd : 0.0f)) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);\n";
    body_ += "    p[i] = pi;\n";
    body_ += "    if (" + pre + "copy[k] >= 0) ((bf16*)b[" + pre + "copy[k]])[i] = f2bf(pi);\n  }\n";
    return success();
  }

  // A prefix for file-scope names of this kernel.
  std::string symbolPrefix() const { return symbol_ + "_"; }

  FusionOp f_;
  Target t_;
  std::string symbol_, preamble_, cublasLt_;
  std::optional<MatmulCall> call_;
  std::vector<unsigned> zero_;
  std::map<std::string, int> index_;  // argument name -> position in b[]
  const std::function<bool(StringRef)>& hasCopy_;
  llvm::DenseMap<Value, std::string> ptr_, local_;
  llvm::DenseMap<Value, std::vector<std::string>> outs_;
  llvm::DenseMap<Operation*, std::vector<std::string>> state_;
  std::string decls_, body_;
  unsigned next_ = 0;
  double flops_ = 0;
  double tensorFlops_ = 0;
  bool bf16Matmul_ = false;  // the body calls bf16_matmul
  unsigned grid_ = 0, block_ = 0;
  Operation* unreadable_ = nullptr;  // the first op `at` could not read (an error in run)
};

}  // namespace

std::vector<StateWrite> stateWrites(FusionOp fusion, const std::function<bool(StringRef)>& hasComputeCopy) {
  std::vector<StateWrite> w;
  for (Operation& op : fusion.getFusedOps()) {
    if (auto acc = dyn_cast<AccumulateGradOp>(op)) w.push_back({acc.getName().str(), StateWrite::Grad});
    if (auto a = dyn_cast<AdamWOp>(op)) {
      std::string n = a.getName().str();
      w.push_back({n, StateWrite::Value});
      w.push_back({n, StateWrite::AdamM});
      w.push_back({n, StateWrite::AdamV});
      if (hasComputeCopy(n)) w.push_back({n, StateWrite::ComputeCopy});
    }
  }
  return w;
}

FailureOr<GeneratedKernel> generateKernel(FusionOp fusion, const std::string& symbol, Target target,
                                          const std::function<bool(StringRef)>& hasComputeCopy) {
  return Emitter(fusion, target, hasComputeCopy).run(symbol);
}

}  // namespace kiln
