// kilnc: compiles a GPT-2 spec (or kiln IR) into a training executable, a module, or IR.
//
//   kilnc SPEC.toml -o gpt2                 training executable (runtime + module)
//   kilnc SPEC.toml --emit=module -o m.kiln the module alone, for kiln-run / kiln-inspect
//   kilnc SPEC.toml --emit=graph|step|plan  the IR after that stage (stdout, or -o FILE)
//   kilnc edited.mlir -o gpt2               resume from IR a user dumped and edited
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <unistd.h>

#include "Kiln/KilnDialect.h"
#include "compiler/attention_cuda.h"
#include "compiler/module_writer.h"
#include "compiler/pipeline.h"
#include "compiler/spec.h"
#include "runtime/version.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"
#include "models/gpt2_builder.h"
#include "runtime/embedded.h"
#include "runtime/cli_parse.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/replaceable_output.h"
#include "runtime/module.h"
#include "runtime/params.h"

using namespace mlir;

namespace {

// The runtime binary that becomes the executable: kiln-run beside kilnc, or --runtime.
std::string findRuntime(const std::string& given) {
  if (!given.empty()) return given;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  std::filesystem::path beside = self.parent_path() / "kiln-run";
  if (std::filesystem::exists(beside)) return beside.string();
  throw kiln::Error("kilnc: cannot find the runtime 'kiln-run' next to " + self.string() +
                    "; pass --runtime PATH");
}

void writeText(const std::string& out, const std::string& text) {
  if (!out.empty() && out != "-") return kiln::write_file_atomic(out, {{text.data(), text.size()}});
  llvm::outs() << text;
  llvm::outs().flush();
  if (llvm::outs().has_error()) {  // (a full disk, a closed pipe): said here, not as LLVM's fatal error at exit
    const std::string why = llvm::outs().error().message();
    llvm::outs().clear_error();
    throw kiln::Error("stdout: write failed: " + why);
  }
}

// A diagnostic's text as one line of at most 300 bytes before escaping: MLIR's own messages may hold a newline
// (a quoted string) or a whole printed op ("block with no terminator, has ...").
// kilnc's own messages ("kilnc: ...") are kept whole: a kernel compile's error carries the
// compiler's log lines on purpose.
std::string diagnosticText(Diagnostic& d) {
  const std::string text = d.str();
  if (llvm::StringRef(text).starts_with("kilnc: ")) return text;
  return kiln::one_line(kiln::clipped(text, 300));
}

// Errors in an input IR file: each with its source line and caret, and its notes.
struct InputDiagnostics : SourceMgrDiagnosticHandler {
  InputDiagnostics(llvm::SourceMgr& sm, MLIRContext* ctx) : SourceMgrDiagnosticHandler(sm, ctx) {
    setHandler([this](Diagnostic& d) {
      emitDiagnostic(d.getLocation(), diagnosticText(d), d.getSeverity());
      for (Diagnostic& note : d.getNotes()) emitDiagnostic(note.getLocation(), diagnosticText(note), note.getSeverity());
      return success();
    });
  }
};

// Errors of the passes and checks after parsing: one line each, "LOC: error: MESSAGE".
LogicalResult printOneLine(Diagnostic& d) {
  std::string loc;
  llvm::raw_string_ostream os(loc);
  // A place in an input file as compilers print it (file:line:col), any other location as MLIR does.
  if (auto file = d.getLocation()->findInstanceOf<FileLineColLoc>())
    os << file.getFilename().getValue() << ":" << file.getLine() << ":" << file.getColumn() << ": ";
  else if (!isa<UnknownLoc>(d.getLocation()))
    os << d.getLocation() << ": ";
  const char* severity = d.getSeverity() == DiagnosticSeverity::Error     ? "error"
                         : d.getSeverity() == DiagnosticSeverity::Warning ? "warning"
                         : d.getSeverity() == DiagnosticSeverity::Note    ? "note"
                                                                           : "remark";
  llvm::errs() << os.str() << severity << ": " << diagnosticText(d) << "\n";
  return success();
}

// The passes kilnc can run, in pipeline order: the stages built for the widest spec (bf16, cuda,
// recompute, fusion), for --print-ir-after's names.
std::vector<std::string> pipelinePassNames() {
  OpPassManager step(ModuleOp::getOperationName()), plan(ModuleOp::getOperationName());
  kiln::buildStepPipeline(step, "bf16");
  kiln::buildPlanPipeline(plan, "cheap", 25.0, /*fusion=*/true, /*singleOps=*/true);
  std::vector<std::string> names;
  for (OpPassManager* pm : {&step, &plan})
    for (Pass& p : pm->getPasses()) names.push_back(p.getArgument().str());
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::start_process();  // Ctrl-C or a full disk while writing leaves no temporary
  CLI::App app{"kilnc: compile a GPT-2 spec into a Kiln training executable"};
  app.set_version_flag("--version", kiln::version_text("kilnc", "MLIR/LLVM " KILN_LLVM_VERSION
#ifdef KILN_HAVE_NVRTC
                                                       "; cuda specs' kernels by NVRTC (CUDA " KILN_CUDA_VERSION ")"
#else
                                                       "; no CUDA toolkit: cuda specs are refused"
#endif
                                                       ));
  std::string input, output, emit = "exe", runtime, recompute = "none";
  double bucketMB = 25.0;
  bool debugInfo = false, printAfterAll = false, noFusion = false, singleOps = false, simtAttention = false,
       timing = false, printPipeline = false, cudaLineInfo = false;
  std::vector<std::string> printAfter;
  int attentionRows = 0;
  std::string dumpKernels;
  app.add_option("input", input, "model spec (.toml) or kiln IR (.mlir, or - to read it from standard input)")->required()->check(kiln::cli::non_empty());
  app.add_option("-o,--output", output, "output file (default: stdout for IR)")->check(kiln::cli::non_empty());
  app.add_option("--emit", emit, "what to produce: graph, step, plan (IR), module, exe")
      ->capture_default_str()->check(CLI::IsMember({"graph", "step", "plan", "module", "exe"}));
  app.add_option("--recompute", recompute,
                 "recompute activations in the backward pass instead of keeping them: none, "
                 "cheap (GELU and layer-norm outputs)")
      ->capture_default_str()->check(CLI::IsMember({"none", "cheap"}));
  app.add_option("--bucket-mb", bucketMB,
                 "gradient buckets averaged across ranks while the backward pass goes on, in MB")
      ->capture_default_str()->check(kiln::cli::positive_finite());
  app.add_flag("--no-fusion", noFusion,
               "one kernel per graph op: no fusion regions, no generated kernels (for debugging and comparison)");
  app.add_flag("--fuse-single-ops", singleOps,
               "give lone ops generated kernels too, as the cuda target does (runs its templates on the CPU)");
  app.add_option("--dump-kernels", dumpKernels,
                 "write the generated kernels' source (kernels.cpp or kernels.cu) and a manifest (kernels.tsv) to DIR")
      ->type_name("DIR")
      ->check(kiln::cli::non_empty());
  app.add_flag("--cuda-simt-attention", simtAttention,
               "cuda target: attention on the SIMT kernels (fp32 FMAs) even where the tensor-core ones apply "
               "(bf16, head size a multiple of 16)");
  app.add_option("--cuda-attention-rows", attentionRows,
                 "cuda target: query rows per warp of the tensor-core attention forward, 16 or 32 (default: 32 "
                 "for head sizes up to 64 and sequences over 64, else 16)")
      // (CLI::IsMember of ints says only "abc" for a word that is no number.)
      ->check(CLI::Validator([](std::string& v) { return v == "16" || v == "32" ? std::string() : v + " is not 16 or 32"; },
                             "16|32"));
  app.add_flag("--cuda-line-info", cudaLineInfo,
               "cuda target: compile the generated kernels with NVRTC's --generate-line-info, so that compute-sanitizer "
               "and the profilers name their source lines (the cubins grow about 3x; kiln-inspect says it)");
  app.add_option("--runtime", runtime, "runtime binary to embed the module in (default: kiln-run beside kilnc)")
      ->check(kiln::cli::non_empty());
  app.add_flag("--debug-info", debugInfo, "print IR with locations (the layer names kiln-inspect reports by; IR without them compiles back with the file's line numbers instead)");
  app.add_flag("--print-ir-after-all", printAfterAll, "print the IR after every pass that changes it (stderr)");
  app.add_option("--print-ir-after", printAfter,
                 "print the IR after the named passes (stderr; comma-separated or repeated), changed or not; "
                 "--print-pipeline lists the passes")
      ->type_name("PASS")
      ->delimiter(',');
  app.add_flag("--print-pipeline", printPipeline,
               "print the passes this compile runs, one line per stage in kiln-opt's --pass-pipeline form "
               "(stdout), and compile nothing");
  app.add_flag("--timing", timing,
               "print where the compile's time went (stderr): building or parsing the IR, each pass, lowering, "
               "generating and compiling the kernels, writing the output");
  if (const int rc = kiln::cli::parse(app, argc, argv); rc >= 0) return rc;

  // A missing input first: any other complaint about the command line would hide it.
  const bool fromStdin = input == "-";  // kiln IR, as kiln-opt prints it
  if (std::error_code ec; !fromStdin && !std::filesystem::exists(input, ec)) {
    std::fprintf(stderr, "error: %s: no such file\n", kiln::one_line(input).c_str());
    return 1;
  }
  if (!printAfter.empty()) {
    const std::vector<std::string> known = pipelinePassNames();
    for (const std::string& name : printAfter)
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        std::fprintf(stderr, "error: --print-ir-after: no pass '%s' in kilnc's pipeline; the passes: %s\n",
                     kiln::one_line(name).c_str(), llvm::join(known, ", ").c_str());
        return 1;
      }
    if (printAfterAll) {  // (the one would hide the other)
      std::fprintf(stderr, "error: --print-ir-after: --print-ir-after-all prints every pass already; give one of the two\n");
      return 1;
    }
  }
  // --print-pipeline writes the pass list and nothing else: -o and the outputs' checks do not apply.
  if (printPipeline && (!output.empty() || !dumpKernels.empty())) {
    std::fprintf(stderr, "error: --print-pipeline: prints the passes and compiles nothing; leave out %s\n",
                 output.empty() ? "--dump-kernels" : "-o");
    return 1;
  }
  // --dump-kernels alone (no -o) compiles to read the kernels and writes nothing else.
  if ((emit == "exe" || emit == "module") && output.empty() && dumpKernels.empty() && !printPipeline) {
    std::fprintf(stderr, "error: --emit=%s needs -o FILE (or --dump-kernels DIR to write only the kernels)\n",
                 emit.c_str());
    return 1;
  }
  if (cudaLineInfo && emit != "exe" && emit != "module") {
    std::fprintf(stderr, "error: --cuda-line-info: kernels are compiled with --emit=module or exe, not %s\n", emit.c_str());
    return 1;
  }
  if (!dumpKernels.empty() && emit != "exe" && emit != "module") {
    std::fprintf(stderr, "error: --dump-kernels: kernels are generated with --emit=module or exe, not %s\n",
                 emit.c_str());
    return 1;
  }
  // The options kilnc's planning (kiln-plan-pipeline) reads.
  const char* const planningFlags[] = {"--recompute", "--bucket-mb", "--no-fusion", "--fuse-single-ops"};
  // They act after --emit=graph and step stop: the IR would be the same without them (and step IR
  // compiled on would not recompute, as --recompute asked).
  if (emit == "graph" || emit == "step")
    for (const char* flag : planningFlags)
      if (app.count(flag)) {
        std::fprintf(stderr, "error: %s: acts when the step is planned, after --emit=%s stops, so it would change nothing "
                     "here; give it to the kilnc that compiles this IR further (or use --emit=plan)\n", flag, emit.c_str());
        return 1;
      }
  if (singleOps && noFusion) {  // (the module would be --no-fusion's, the flag silently unused)
    std::fprintf(stderr, "error: --fuse-single-ops: gives lone ops generated kernels, which --no-fusion "
                 "leaves out; give one of the two\n");
    return 1;
  }
  if (!dumpKernels.empty() && noFusion) {
    std::fprintf(stderr, "error: --dump-kernels: --no-fusion generates no kernels\n");
    return 1;
  }
  // Two files go into the folder: "-" would make a folder of that name.
  if (dumpKernels == "-") {
    std::fprintf(stderr, "error: --dump-kernels -: writes a folder (the source and kernels.tsv); give its name, or "
                 "print a module's source with kiln-inspect --kernel-source -\n");
    return 1;
  }
  // A module or an executable is a file, not text for a terminal.
  if ((emit == "exe" || emit == "module") && output == "-") {
    std::fprintf(stderr, "error: -o -: --emit=%s writes a binary file; give it a name\n", emit.c_str());
    return 1;
  }
  // Nor may it replace the runtime it is built from, or this compiler.
  try {
    std::error_code ec;
    kiln::refuse_overwriting("-o", output, {{"this compiler", std::filesystem::read_symlink("/proc/self/exe", ec).string()}});
    if (emit == "exe" && !output.empty()) {
      const std::string embeds = findRuntime(runtime);
      kiln::refuse_overwriting("-o", output, {{"the runtime it embeds", embeds}});
      kiln::check_kiln_runtime(embeds);
    }
    // Before the compile, not after it: the output can be written where it is named.
    if (!output.empty() && output != "-") kiln::check_output_file("-o", output);
    // The dumped kernels' files go into a folder (made if missing), and must not replace the
    // input or the output.
    if (std::error_code ec; !dumpKernels.empty() && std::filesystem::exists(dumpKernels, ec) &&
                            !std::filesystem::is_directory(dumpKernels, ec))
      throw kiln::Error("--dump-kernels: " + dumpKernels + ": not a folder (the kernels' files are written into one)");
    // A folder to be made needs a parent to make it in: said now, not after the compile.
    if (std::error_code ec; !dumpKernels.empty() && !std::filesystem::exists(dumpKernels, ec)) {
      std::filesystem::path parent = std::filesystem::path(dumpKernels).parent_path();
      while (!parent.empty() && !std::filesystem::exists(parent, ec) && parent != parent.parent_path())
        parent = parent.parent_path();  // (missing folders between are made too)
      const std::string where = parent.empty() ? "." : parent.string();
      if (!std::filesystem::is_directory(where, ec))
        throw kiln::Error("--dump-kernels: " + dumpKernels + ": cannot make the folder: " + where + " is not a folder");
      if (::access(where.c_str(), W_OK | X_OK) != 0)
        throw kiln::Error("--dump-kernels: " + dumpKernels + ": cannot make the folder in " + where + ": " +
                          std::strerror(errno));
    }
    if (!dumpKernels.empty())
      for (const char* name : {"kernels.cpp", "kernels.cu", "kernels.tsv"}) {
        const std::string file = (std::filesystem::path(dumpKernels) / name).string();
        kiln::refuse_overwriting("--dump-kernels", file, {{"the input", input}, {"-o's file", output}});
        kiln::check_replaceable("--dump-kernels", file,
                                std::strcmp(name, "kernels.tsv") == 0 ? kiln::Writes::KernelTable
                                                                      : kiln::Writes::KernelSource);
      }
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }
  // Writing over the input would lose the spec (or the IR) it was compiled from. Another name
  // for the same file (a link, ./x) counts too.
  std::error_code sameError;
  if (!output.empty() && output != "-" && !fromStdin &&
      (output == input || (std::filesystem::exists(output, sameError) &&
                           std::filesystem::equivalent(input, output, sameError)))) {
    std::fprintf(stderr, "error: -o %s names the input file; it would be overwritten\n",
                 kiln::one_line(output).c_str());
    return 1;
  }
  // A name that says another kind of file than this writes is likely a slip: said, not refused.
  {
    const llvm::StringRef out(output);
    const bool binary = emit == "exe" || emit == "module";
    if (binary && (out.ends_with(".mlir") || out.ends_with(".toml")))
      std::fprintf(stderr, "kilnc: warning: -o %s: --emit=%s writes a binary %s, not text (--emit=plan writes IR)\n",
                   kiln::one_line(output).c_str(), emit.c_str(), emit == "exe" ? "executable" : "Kiln module");
    else if (!binary && out.ends_with(".kiln"))
      std::fprintf(stderr, "kilnc: warning: -o %s: --emit=%s writes MLIR text, not a Kiln module (--emit=module writes one)\n",
                   kiln::one_line(output).c_str(), emit.c_str());
  }
  // Nor another kind of file than it writes (a mistyped name: a program, data, notes).
  try {
    kiln::check_replaceable("-o", output, emit == "exe"      ? kiln::Writes::KilnExecutable
                                          : emit == "module" ? kiln::Writes::KilnModule
                                                             : kiln::Writes::MlirText);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }

  MLIRContext ctx;
  ctx.loadDialect<kiln::KilnDialect, func::FuncDialect>();
  // A verifier's error on an input file is its line, not the whole op it found (a func.func, or a
  // fusion region, printed in generic form: hundreds of lines).
  ctx.printOpOnDiagnostic(false);
  ScopedDiagnosticHandler oneLine(&ctx, printOneLine);
  // --timing: MLIR's report (a tree, to stderr) when the compile ends; each stage a scope, each
  // pass one within its stage.
  DefaultTimingManager timer;
  timer.setEnabled(timing);
  TimingScope total = timer.getRootScope();
  try {
    OwningOpRef<ModuleOp> module;
    kiln::ModelSpec spec;
    const bool fromIR = fromStdin || llvm::StringRef(input).ends_with(".mlir");
    TimingScope reading = total.nest(fromIR ? "parse the IR" : "read the spec and build the graph IR");
    if (fromIR) {
      bool blank = true;  // the text holds nothing but white space and comments
      {
        llvm::SourceMgr sm;
        std::unique_ptr<llvm::MemoryBuffer> text;
        if (fromStdin) {
          auto in = llvm::MemoryBuffer::getSTDIN();
          if (!in) throw kiln::Error("<stdin>: cannot read: " + in.getError().message());
          text = std::move(*in);
        } else {
          // Read by read_file, which refuses a device or a FIFO no one writes to (LLVM's reader
          // would read /dev/zero until memory runs out, or wait for a writer for ever).
          if (const std::string kind = kiln::file_kind(input); !kind.empty())
            throw kiln::Error(input + ": is " + kind + ", not kiln IR (.mlir)");
          const std::vector<uint8_t> bytes = kiln::read_file(input);
          text = llvm::MemoryBuffer::getMemBufferCopy(
              llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size()), input);
        }
        // A binary file (named .mlir, or through a pipe) would be printed as the parser's
        // context: text holds no NUL byte.
        if (const size_t nul = text->getBuffer().find('\0'); nul != llvm::StringRef::npos)
          throw kiln::Error((fromStdin ? std::string("<stdin>") : input) + ": holds binary data (a NUL byte at offset " +
                            std::to_string(nul) + "), not MLIR text");
        sm.AddNewSourceBuffer(std::move(text), llvm::SMLoc());
        InputDiagnostics handler(sm, &ctx);
        module = parseSourceFile<ModuleOp>(sm, ParserConfig(&ctx));
        if (sm.getNumBuffers()) {
          llvm::SmallVector<llvm::StringRef> lines;
          sm.getMemoryBuffer(sm.getMainFileID())->getBuffer().split(lines, '\n');
          for (llvm::StringRef line : lines)
            if (llvm::StringRef code = line.trim(); !code.empty() && !code.starts_with("//")) blank = false;
        }
      }
      if (!module) return 1;
      // An empty file parses as an empty module; say that, not that its spec is missing.
      if (module->getBody()->empty() && (*module)->getAttrs().empty()) {
        std::fprintf(stderr, "error: %s: holds %s (expected what kilnc --emit=graph or --emit=step writes)\n",
                     fromStdin ? "<stdin>" : input.c_str(), blank ? "no IR" : "an empty module");
        return 1;
      }
      // IR without its `module` line is wrapped in one at line 0 ("FILE:0:0: error: ..." about the
      // module): placed at the file's start instead.
      if (auto at = dyn_cast<FileLineColLoc>((*module)->getLoc()); at && at.getLine() == 0)
        (*module)->setLoc(FileLineColLoc::get(at.getFilename(), 1, 1));
      // Outside the handler's scope: one line each, like the errors of the passes.
      auto s = kiln::getModuleSpec(*module);
      if (failed(s) || failed(kiln::verifyEntryPoints(*module))) return 1;
      spec = *s;
    } else {
      // A binary file given by mistake (a shard, a module, weights) is named, not parsed as TOML.
      kiln::check_not_a_device(input);
      if (const std::string kind = kiln::file_kind(input); !kind.empty())
        throw kiln::Error(input + ": is " + kind + ", not a model spec (.toml) or kiln IR (.mlir)");
      spec = kiln::parse_spec(input);
      module = kiln::buildGPT2(ctx, spec);
      if (failed(verify(*module))) return 1;
    }
    reading.stop();
    if (noFusion && spec.target == "cuda") {
      std::fprintf(stderr, "error: %s: --no-fusion: target \"cuda\" runs only generated kernels; "
                   "compare fusion on a \"cpu\" spec\n", input.c_str());
      return 1;
    }
    if (spec.target != "cuda" && (simtAttention || attentionRows || cudaLineInfo)) {
      std::fprintf(stderr, "error: %s: %s is for target \"cuda\"; this spec's target is \"%s\"\n", input.c_str(),
                   simtAttention ? "--cuda-simt-attention" : attentionRows ? "--cuda-attention-rows" : "--cuda-line-info",
                   spec.target.c_str());
      return 1;
    }
    if (attentionRows && !kiln::cudaAttentionUsesTensorCores({spec.batch_size, spec.seq_len, spec.n_embd, spec.n_head,
                                                              spec.precision == "bf16", simtAttention})) {
      const std::string why = simtAttention ? "--cuda-simt-attention asks for the SIMT kernels"
                              : spec.precision != "bf16"
                                  ? "precision \"" + spec.precision + "\" runs the SIMT kernels (fp32 FMAs)"
                                  : "head size " + std::to_string(spec.n_embd / spec.n_head) +
                                        " is no multiple of 16 up to 128, so the SIMT kernels run";
      std::fprintf(stderr, "error: %s: --cuda-attention-rows sets the tensor-core attention's rows, and this module "
                   "has none: %s\n", input.c_str(), why.c_str());
      return 1;
    }

    // --print-ir-after: a named pass that did not run (a bf16 pass on fp32, fusion under
    // --no-fusion, a stage the input is past or --emit stops before) printed nothing: said.
    std::set<std::string> printedAfter;
    auto warnUnprinted = [&] {
      for (const std::string& name : printAfter)
        if (!printedAfter.count(name))
          std::fprintf(stderr, "kilnc: warning: --print-ir-after=%s: the pass did not run in this compile (the spec, "
                       "the flags or the input's stage leave it out; --print-pipeline lists the passes that run)\n",
                       name.c_str());
      printedAfter.insert(printAfter.begin(), printAfter.end());  // (said once)
    };
    auto print = [&](ModuleOp m) {
      warnUnprinted();
      TimingScope printing = total.nest("print the IR");
      std::string text;
      llvm::raw_string_ostream os(text);
      OpPrintingFlags flags;
      if (debugInfo) flags.enableDebugInfo();
      m.print(os, flags);
      os << "\n";
      writeText(output, text);
      // As --emit=module and exe say what they wrote (stdout needs no word).
      if (!output.empty() && output != "-")
        std::fprintf(stderr, "kilnc: wrote %s (%s IR, %zu lines)\n", output.c_str(), emit.c_str(),
                     size_t(std::count(text.begin(), text.end(), '\n')));
      return 0;
    };
    // The input's stage: graph IR (no @micro_step), step IR, or planned step IR (--emit=plan).
    // Plan IR plans every function: one plan taken out (an edited --emit=plan file) is said as such,
    // not left to a step pass that refuses the functions still planned.
    func::FuncOp withPlan, withoutPlan;
    for (auto f : module->getOps<func::FuncOp>()) {
      if (f.isExternal()) continue;  // (a declaration has nothing to plan)
      if (f->hasAttr("kiln.arena_size") && !withPlan) withPlan = f;
      if (!f->hasAttr("kiln.arena_size") && !withoutPlan) withoutPlan = f;
    }
    if (withPlan && withoutPlan) {
      withoutPlan.emitError() << "@" << withoutPlan.getName() << " has no buffer plan (kiln.arena_size), but @"
                              << withPlan.getName() << " has one: plan IR plans every function (give the plan "
                              << "IR whole, or step IR with none)";
      return 1;
    }
    auto step = module->lookupSymbol<func::FuncOp>("micro_step");
    const bool planned = step && withPlan;  // (then every function is planned, @micro_step too)
    // kilnc runs its stages forward only: IR past the stage asked for would be printed unchanged
    // under the earlier stage's name.
    if (step && (emit == "graph" || (emit == "step" && planned))) {
      std::fprintf(stderr, "error: %s: --emit=%s: the IR is %s IR already (kilnc runs its stages forward only); "
                   "give the spec or an earlier stage's IR\n", input.c_str(), emit.c_str(), planned ? "plan" : "step");
      return 1;
    }
    // The stages this compile runs, built as below, for kiln-opt --pass-pipeline.
    if (printPipeline) {
      auto line = [](const char* stage, auto build) {
        OpPassManager pm(ModuleOp::getOperationName());
        build(pm);
        std::string text;
        llvm::raw_string_ostream os(text);
        pm.printAsTextualPipeline(os);
        std::printf("%s: %s\n", stage, text.c_str());
      };
      const bool steps = !step && emit != "graph", plans = !planned && emit != "graph" && emit != "step";
      if (steps) line("step", [&](OpPassManager& pm) { kiln::buildStepPipeline(pm, spec.precision); });
      if (plans)
        line("plan", [&](OpPassManager& pm) {
          kiln::buildPlanPipeline(pm, recompute, bucketMB, !noFusion, singleOps || spec.target == "cuda");
        });
      if (!steps && !plans)
        std::fprintf(stderr, "kilnc: --print-pipeline: no passes run: this input needs none for --emit=%s\n",
                     emit.c_str());
      return 0;
    }
    if (emit == "graph") return print(*module);

    // Runs one stage's passes; IR that already went through a stage (an edited --emit=step or
    // --emit=plan file) skips it.
    auto runStage = [&](const char* stage, auto build) {
      TimingScope scope = total.nest(stage);
      PassManager pm(&ctx);
      if (printAfterAll || !printAfter.empty()) {
        ctx.disableMultithreading();
        // With --debug-info the dumps carry the locations (layer names) too, as the output does.
        OpPrintingFlags flags;
        if (debugInfo) flags.enableDebugInfo();
        // After all: the passes that change the IR. After named ones: those, changed or not (as
        // MLIR's -mlir-print-ir-after), noted for the warning about a pass that did not run.
        pm.enableIRPrinting([](Pass*, Operation*) { return false; },
                            [&](Pass* pass, Operation*) {
                              if (printAfterAll) return true;
                              const std::string name = pass->getArgument().str();
                              if (std::find(printAfter.begin(), printAfter.end(), name) == printAfter.end()) return false;
                              printedAfter.insert(name);
                              return true;
                            },
                            /*printModuleScope=*/true, /*printAfterOnlyOnChange=*/printAfterAll,
                            /*printAfterOnlyOnFailure=*/false, llvm::errs(), flags);
      }
      if (timing) pm.enableTiming(scope);  // (after the printing: its passes' times leave it out)
      build(pm);
      return pm.run(*module);
    };
    // Graph IR (no @micro_step yet) that went through a planning pass (those passes refuse graph
    // IR with its kiln.spec, but not IR whose spec was added after them, or edited IR): autodiff
    // would differentiate fusion regions and copy stale offsets into the step. The planning passes
    // run on step IR.
    if (!step) {
      Operation* plannedOp = nullptr;
      module->walk([&](Operation* op) {
        if (isa<kiln::FusionOp>(op) || op->hasAttr("kiln.offsets") || op->hasAttr("kiln.arena_size")) {
          plannedOp = op;
          return WalkResult::interrupt();
        }
        return WalkResult::advance();
      });
      if (plannedOp) {
        plannedOp->emitError() << "graph IR (no @micro_step) with "
                             << (isa<kiln::FusionOp>(plannedOp) ? "fusion regions ('kiln.fusion')" : "planned offsets")
                             << ": the planning passes run after kiln-autodiff; run them on step IR "
                                "(kilnc --emit=step, or kiln-opt -kiln-step-pipeline first)";
        return 1;
      }
    }
    if (!step &&
        failed(runStage("step pipeline", [&](PassManager& pm) { kiln::buildStepPipeline(pm, spec.precision); })))
      return 1;
    if (!step && failed(kiln::verifyMicroStepInputs(*module))) return 1;
    if (emit == "step") return print(*module);

    auto fused = [&] { return module->walk([](kiln::FusionOp) { return WalkResult::interrupt(); }).wasInterrupted(); };
    // Planned IR (--emit=plan) has its kernels, buckets and buffers: the planning options would
    // change nothing, and would be recorded in the module as if they had.
    if (planned)
      for (const char* flag : planningFlags)
        if (app.count(flag)) {
          std::fprintf(stderr, "error: %s: %s: the IR is planned already (--emit=plan), so the option would change "
                       "nothing; give the spec or its step IR\n", input.c_str(), flag);
          return 1;
        }
    // Step IR that kiln-opt -kiln-fuse-kernels fused: --no-fusion would keep its regions, and the
    // module would say it was not fused.
    if (!planned && noFusion && fused()) {
      std::fprintf(stderr, "error: %s: --no-fusion: the IR is fused already (kiln.fusion regions); give the step IR "
                   "before kiln-fuse-kernels\n", input.c_str());
      return 1;
    }
    if (!planned &&
        failed(runStage("plan pipeline", [&](PassManager& pm) {
          kiln::buildPlanPipeline(pm, recompute, bucketMB, !noFusion, singleOps || spec.target == "cuda");
        })))
      return 1;
    if (emit == "plan") return print(*module);

    kiln::WriteOptions options;
    // Planned IR says itself whether it recomputes (kiln-recompute's clones are marked; "cheap"
    // is the one mode that makes them) and whether it was fused; so does step IR that
    // kiln-opt -kiln-recompute went over (the module would say "none" beside its recompute kernels).
    const bool recomputes = module->walk([](Operation* op) {
      return op->hasAttr("kiln.recomputed") ? WalkResult::interrupt() : WalkResult::advance();
    }).wasInterrupted();
    options.recompute = recomputes ? "cheap" : planned ? "none" : recompute;
    options.fusion = planned ? fused() : !noFusion;
    options.dumpKernelsDir = dumpKernels;
    options.simtAttention = simtAttention;
    options.attentionRows = attentionRows;
    options.cudaLineInfo = cudaLineInfo;
    warnUnprinted();
    TimingScope writing = total.nest("write the module");
    options.timing = &writing;
    auto bytes = kiln::writeModule(*module, spec, options);
    if (failed(bytes)) return 1;
    writing.stop();
    // What kiln-run and kiln-inspect check when they load it (runtime/module.cpp, the memory plan):
    // hand-edited plan IR (offsets, sizes) can pass the IR verifiers and still make a module the
    // runtime would refuse, which is then refused here, before anything is written.
    TimingScope checking = total.nest("check the module as the runtime loads it");
    const kiln::Module checked = kiln::Module::from_bytes(*bytes, input + ": the module built from it");
    checking.stop();
    // The memory the run plans, as kiln-inspect reports it: one arena of the state (parameters,
    // gradients, optimizer moments) and the largest program's activations (one process).
    const std::string memory = "arena " + kiln::human_bytes(double(checked.fb().arena_size())) + ": state " +
                               kiln::human_bytes(double(checked.fb().state_size())) + " + activations " +
                               kiln::human_bytes(double(checked.fb().activation_size()));
    if (output.empty()) {
      std::fprintf(stderr, "kilnc: wrote the generated kernels to %s (no -o: nothing else)\n", dumpKernels.c_str());
      return 0;
    }
    TimingScope output_scope = total.nest(emit == "exe" ? "write the executable" : "write the module file");
    if (emit == "module") {
      kiln::write_file_atomic(output, {{bytes->data(), bytes->size()}});
    } else {
      kiln::write_executable(output, findRuntime(runtime), *bytes);
    }
    if (emit == "exe")
      std::fprintf(stderr, "kilnc: wrote %s (a training executable; its module is %zu bytes; %s)\n", output.c_str(),
                   bytes->size(), memory.c_str());
    else
      std::fprintf(stderr, "kilnc: wrote %s (a module of %zu bytes; %s)\n", output.c_str(), bytes->size(), memory.c_str());
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }
}
