// kiln-opt: runs kiln passes (and upstream ones) on .mlir files, like mlir-opt.
#include "Kiln/KilnDialect.h"
#include "compiler/pipeline.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/ToolOutputFile.h"
#include "passes/Passes.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/params.h"
#include "runtime/replaceable_output.h"
#include "runtime/version.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {
// -o as given and the temporary written for it, for the fatal-error handler.
std::string g_output, g_temporary;

// LLVM ends the process on an output stream's failure (a full disk, a file-size limit): one line
// naming the file (-o, or stdout for -o - and --help), and the temporary removed, instead of
// LLVM's "LLVM ERROR" line.
void on_fatal_error(void*, const char* reason, bool) {
  static const char kIo[] = "IO failure on output stream: ";
  if (!g_temporary.empty()) ::unlink(g_temporary.c_str());
  if (std::strncmp(reason, kIo, sizeof kIo - 1) == 0)
    std::fprintf(stderr, "error: %s%s: %s\n", g_output.empty() ? "" : "-o: ",
                 g_output.empty() ? "stdout" : g_output.c_str(), reason + sizeof kIo - 1);
  else
    std::fprintf(stderr, "error: %s\n", reason);
  std::fflush(stderr);
  ::_exit(1);
}
}  // namespace

// IR that carries locations (kilnc --debug-info: the layer names kiln-inspect reports) keeps them
// in the output: MLIR prints them only when given --mlir-print-debuginfo, and would drop them
// without a word. An explicit --mlir-print-debuginfo=false still drops them.
void keep_locations(int argc, char** argv, const std::string& input, const llvm::MemoryBuffer* piped) {
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "mlir-print-debuginfo")) return;
  const std::string head = piped ? piped->getBuffer().take_front(size_t(1) << 20).str() : kiln::read_head(input, size_t(1) << 20);
  // A location alias (#loc3 = loc("h.0.attn"(...))) or an inline name, outside comments.
  bool named = false;
  for (llvm::StringRef rest = head; !rest.empty() && !named;) {
    auto [line, next] = rest.split('\n');
    rest = next;
    line = line.ltrim();
    named = !line.starts_with("//") && (line.starts_with("#loc") || line.contains("loc(\"") || line.contains("loc(#loc"));
  }
  if (!named) return;
  auto& options = llvm::cl::getRegisteredOptions();
  if (auto it = options.find("mlir-print-debuginfo"); it != options.end())
    if (auto* flag = static_cast<llvm::cl::opt<bool>*>(it->getValue())) flag->setValue(true);
}

// MlirOptMain on the input file, or on the bytes of a pipe already read (as MLIR's own driver
// does with the file it opens: the output kept only when the passes succeed).
mlir::LogicalResult run_opt(std::vector<char*>& args, const std::string& input, const std::string& output,
                            mlir::DialectRegistry& registry, std::unique_ptr<llvm::MemoryBuffer> piped) {
  // --show-dialects prints the dialects on stdout and writes nothing: -o is not opened (the paths
  // below would open it: a file it names emptied, a FIFO waited on).
  if (mlir::MlirOptMainConfig::createFromCLOptions().shouldShowDialects())
    return mlir::MlirOptMain(int(args.size()), args.data(), input, "-", registry);
  std::error_code ec;
  const bool toFifo = output != "-" && std::filesystem::is_fifo(output, ec);
  if (!piped && !toFifo) return mlir::MlirOptMain(int(args.size()), args.data(), input, output, registry);
  std::string error;
  if (!piped && !(piped = mlir::openInputFile(input, &error))) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return mlir::failure();
  }
  if (toFifo) {
    // -o FIFO: opened without blocking, so that one nothing reads is refused after 5 s rather
    // than waited on for ever (as LLVM's open would).
    const int fd = kiln::open_in_place(output, O_WRONLY);
    if (fd < 0) {
      std::fprintf(stderr, "error: -o: %s: cannot open for writing: %s\n", output.c_str(),
                   kiln::open_error(output, errno).c_str());
      return mlir::failure();
    }
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    return mlir::MlirOptMain(os, std::move(piped), registry, mlir::MlirOptMainConfig::createFromCLOptions());
  }
  std::unique_ptr<llvm::ToolOutputFile> out = mlir::openOutputFile(output, &error);
  if (!out) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return mlir::failure();
  }
  if (mlir::failed(mlir::MlirOptMain(out->os(), std::move(piped), registry, mlir::MlirOptMainConfig::createFromCLOptions())))
    return mlir::failure();
  out->keep();
  return mlir::success();
}

int main(int argc, char** argv) {
  kiln::start_process();
  // LLVM's signal handlers (a stack trace on a crash; on SIGINT the output's temporary removed,
  // then ours) are installed here, once, rather than inside MlirOptMain, so that SIGXFSZ can be
  // ignored again after them: a file-size limit then fails the write with EFBIG, reported in one
  // line by on_fatal_error, where LLVM's handler would print a stack trace for it.
  llvm::sys::PrintStackTraceOnErrorSignal(argv[0]);
  ::signal(SIGXFSZ, SIG_IGN);
  llvm::install_fatal_error_handler(on_fatal_error);
  llvm::cl::AddExtraVersionPrinter([](llvm::raw_ostream& os) { os << kiln::version_text("kiln-opt") << "\n"; });
  mlir::DialectRegistry registry;
  registry.insert<kiln::KilnDialect, mlir::func::FuncDialect>();
  mlir::registerTransformsPasses();
  kiln::registerKilnPasses();
  kiln::registerKilnPipelines();
  // A pass error names the op at fault by its location; MLIR would also print the whole module
  // below it. Unless asked for (--mlir-print-op-on-diagnostic), it does not.
  std::vector<char*> args(argv, argv + argc);
  bool asked = false;
  for (int i = 1; i < argc; ++i) asked |= std::strstr(argv[i], "mlir-print-op-on-diagnostic") != nullptr;
  static char quiet[] = "--mlir-print-op-on-diagnostic=false";
  if (!asked) args.insert(args.begin() + 1, quiet);
  // The options registered by now are LLVM's own, most of them its code generators' (libLLVM is
  // linked whole): 400 lines of --help that do nothing to a pass. They are hidden, so --help lists
  // MLIR's options and the passes; --help-hidden still shows them.
  for (auto& entry : llvm::cl::getRegisteredOptions())
    if (!llvm::is_contained({"color", "help", "help-list", "version"}, entry.getKey()))
      entry.getValue()->setHiddenFlag(llvm::cl::Hidden);
  auto [input, output] = mlir::registerAndParseCLIOptions(int(args.size()), args.data(), "Kiln optimizer driver\n", registry);
  // A named pipe is read here, by read_file, which refuses one no one writes to (LLVM's reader
  // would wait for a writer for ever); MLIR then parses the bytes read.
  std::unique_ptr<llvm::MemoryBuffer> piped;
  try {
    // LLVM's options keep the last of two -o; the other tools refuse the second.
    int outputs = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      outputs += a == "-o" || a.rfind("-o=", 0) == 0 || a == "--o" || a.rfind("--o=", 0) == 0;
    }
    if (outputs > 1) throw kiln::Error("-o: given " + std::to_string(outputs) + " times; give it once");
    if (output.empty()) throw kiln::Error("-o: needs a file name");
    if (input == "-") {
      // Read here too, for the NUL check below.
      auto in = llvm::MemoryBuffer::getSTDIN();
      if (!in) throw kiln::Error("<stdin>: cannot read: " + in.getError().message());
      piped = std::move(*in);
      if (const size_t nul = piped->getBuffer().find('\0'); nul != llvm::StringRef::npos)
        throw kiln::Error("<stdin>: holds binary data (a NUL byte at offset " + std::to_string(nul) + "), not MLIR text");
    } else {
      // One line, as the other tools say it (MLIR's reader prints "cannot open input file").
      std::error_code missing;
      if (!std::filesystem::exists(input, missing))
        throw kiln::Error(input + ": " + (missing ? "cannot read: " + missing.message() : std::string("no such file")));
      if (std::filesystem::is_directory(input, missing)) throw kiln::Error(input + ": cannot read: a directory");
      kiln::check_not_a_device(input);  // /dev/zero would be read until memory runs out
      // A binary file Kiln knows (a module, an executable, data, weights) would be printed to the
      // terminal as the parser's error context.
      if (const std::string kind = kiln::file_kind(input); !kind.empty())
        throw kiln::Error(input + ": is " + kind + ", not MLIR text (kiln-inspect reads modules and executables)");
      std::error_code ec;
      std::string head;
      if (std::filesystem::is_fifo(input, ec)) {
        const std::vector<uint8_t> bytes = kiln::read_file(input);
        piped = llvm::MemoryBuffer::getMemBufferCopy(
            llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size()), input);
        head = piped->getBuffer().str();
      } else {
        head = kiln::read_head(input, size_t(1) << 20);  // (the first MiB: the parser reads the rest)
      }
      // Any other binary file (or a known one through a pipe): text holds no NUL byte.
      if (const size_t nul = head.find('\0'); nul != std::string::npos)
        throw kiln::Error(input + ": holds binary data (a NUL byte at offset " + std::to_string(nul) + "), not MLIR text");
      // A spec would fail in MLIR's parser on its first line ("invalid attribute name").
      if (llvm::StringRef(input).ends_with(".toml"))
        throw kiln::Error(input + ": is a model spec (TOML), not MLIR text; kiln-opt runs passes on IR: make it with "
                          "kilnc " + input + " --emit=graph -o graph.mlir (or --emit=step)");
    }
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }
  keep_locations(argc, argv, input, piped.get());
  // -o FILE: written to a temporary beside it (beside the file a link names) and renamed on
  // success, so a failed run leaves an existing FILE as it was; naming the input would lose it.
  // A device, FIFO or pipe (/dev/null, /dev/stdout) is written to directly.
  std::error_code ec;
  const std::string target = kiln::link_target(output);
  if (output == "-" || (std::filesystem::exists(output, ec) && !std::filesystem::is_regular_file(output, ec)))
    return mlir::asMainReturnCode(run_opt(args, input, output, registry, std::move(piped)));
  try {
    kiln::refuse_overwriting("-o", output, {{"the input file", input}});
    kiln::check_output_file("-o", output);
    kiln::check_replaceable("-o", output, kiln::Writes::MlirText);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }
  const std::string tmp = kiln::temporary_path(target);
  g_output = output, g_temporary = tmp;
  const bool ok = mlir::succeeded(run_opt(args, input, tmp, registry, std::move(piped)));
  // Some runs write nothing (--show-dialects, --help of a pass pipeline): then neither does -o.
  if (ok && !std::filesystem::exists(tmp, ec)) return 0;
  if (ok) std::filesystem::rename(tmp, target, ec);
  if (!ok || ec) std::filesystem::remove(tmp);
  if (ec) std::fprintf(stderr, "error: -o: %s: cannot replace it: %s\n", output.c_str(), ec.message().c_str());
  return ok && !ec ? 0 : 1;
}
