// Host-compiler and NVRTC builds of generated kernels (see kernel_build.h).
#include "compiler/kernel_build.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/file_io.h"

#ifdef KILN_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace kiln {
namespace {

// The compiler CMake used and the flags for generated kernels: optimised for this machine,
// vectorised, parallel over its cores with OpenMP. -fno-trapping-math lets GCC turn the kernels'
// float comparisons (exp_f's clamp, maxima) into blends, so loops calling exp_f vectorise (4x
// faster cross entropy). Nothing reads the floating-point flags; but the `omp simd reduction`
// sums over exp_f (attention's softmax) now vectorise too, and add in another order: results
// move by rounding (still the same from run to run).
const char* hostCompiler() {
  const char* env = std::getenv("KILN_CXX");
  return env && *env ? env : KILN_HOST_CXX;
}
// KILN_MARCH picks another -march (e.g. x86-64-v3) for executables that move to other machines.
std::string cpuCompileFlags() {
  const char* march = std::getenv("KILN_MARCH");
  return std::string("-std=c++17 -O3 -march=") + (march && *march ? march : "native") +
         " -fno-math-errno -fno-trapping-math -fopenmp -fPIC -shared -I" + KILN_CBLAS_INCLUDE_DIR
#ifdef KILN_HAVE_DNNL
         + " -I" + KILN_DNNL_INCLUDE_DIR
#endif
      ;
}

// Libraries named after the source: oneDNN, for the bf16 products (kernelPrelude), linked only
// when the kernels call it (--as-needed), from where CMake found it (also where the loader looks,
// outside the system's folders).
std::string cpuLinkFlags() {
#ifdef KILN_HAVE_DNNL
  const std::string dir = KILN_DNNL_LIBRARY_DIR;
  const bool system = dir.rfind("/usr/lib", 0) == 0 || dir.rfind("/lib", 0) == 0;
  return "-Wl,--as-needed -L" + dir + (system ? "" : " -Wl,-rpath," + dir) + " -ldnnl";
#else
  return "";
#endif
}

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::optional<std::vector<uint8_t>> readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// KILN_KERNEL_CACHE where set and not empty (an empty one is as if unset, as an empty
// XDG_CACHE_HOME is: `off` alone turns the cache off).
const char* cacheVariable() {
  const char* env = std::getenv("KILN_KERNEL_CACHE");
  return env && *env ? env : nullptr;
}

std::string cacheDir() {
  if (const char* env = cacheVariable()) return std::strcmp(env, "off") == 0 ? "" : env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/kiln/kernels";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kiln/kernels";
  return "";
}

bool makeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') {
      std::string p = path.substr(0, i);
      if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  return true;
}

// -march=native code runs only on CPUs like this one: the cache key includes its feature flags.
std::string cpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return line;
  return "";
}

}  // namespace

// An interrupted build (Ctrl-C, Ctrl-\\, SIGTERM, a closed terminal) takes its compiler and its
// temporary folder with it. The compiler runs in a process group of its own, so a terminal's
// signal reaches kilnc alone; the handler stops the group with SIGTERM (GCC and Clang then delete
// their own temporaries; SIGKILL after 3 s), waits for it, deletes the folder and lets the signal
// end kilnc. Signals kilnc was started ignoring (nohup) stay ignored, by the compiler too.
namespace {

const int kBuildSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
constexpr int kNumBuildSignals = 4;
// The handler may run on any of kilnc's threads while the building thread goes on. So the
// building thread makes the folder, writes the source and starts and reaps the compiler in
// file_io's sections (SignalsHeld), which the handler settles first: either it sees what a
// section did, or the section never starts.
std::atomic<pid_t> g_compiler{0};  // the compiler's pid (= its process group), while it runs
char g_work[4][4096];              // the source, library, log and folder to delete

void removeWork() {
  for (int i = 0; i < 3; ++i)
    if (g_work[i][0]) ::unlink(g_work[i]);
  if (g_work[3][0]) ::rmdir(g_work[3]);
}

void onBuildSignal(int sig) {  // async-signal-safe calls only
  settle_signals_held();
  if (const pid_t pid = g_compiler.load(); pid > 0) {
    ::kill(-pid, SIGTERM);
    int status;
    bool ended = false;
    for (int i = 0; i < 300 && !ended; ++i) {  // 3 s, then SIGKILL
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      ended = w == pid || (w < 0 && errno == ECHILD);  // ECHILD: the building thread reaped it
      if (!ended) ::poll(nullptr, 0, 10);
    }
    if (!ended) {
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  removeWork();
  remove_pending_temporary();  // the kernel cache's entry, when it was being written
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// The handlers for the build's lifetime (not over a signal ignored); the previous ones after.
struct BuildSignalGuard {
  struct sigaction previous[kNumBuildSignals];
  bool installed[kNumBuildSignals] = {};
  BuildSignalGuard() {
    struct sigaction sa{};
    sa.sa_handler = onBuildSignal;
    sigfillset(&sa.sa_mask);  // one handler at a time
    for (int i = 0; i < kNumBuildSignals; ++i) {
      sigaction(kBuildSignals[i], nullptr, &previous[i]);
      if (previous[i].sa_handler == SIG_IGN) continue;
      sigaction(kBuildSignals[i], &sa, nullptr);
      installed[i] = true;
    }
  }
  ~BuildSignalGuard() {
    for (int i = 0; i < kNumBuildSignals; ++i)
      if (installed[i]) sigaction(kBuildSignals[i], &previous[i], nullptr);
    g_compiler.store(0);
    for (auto& p : g_work) p[0] = 0;
  }
};

// Runs argv[0] (looked up in PATH) with stdout and stderr into `log`, in a process group of its
// own; its wait status, or -1 with `error` set when it cannot start.
int runCompiler(const std::vector<std::string>& args, const std::string& log, std::string& error) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  // The compiler starts with kilnc's mask from before the section; caught signals are reset
  // to their default by exec, ignored ones stay ignored.
  pid_t pid = 0;
  int rc;
  {
    SignalsHeld held;
    posix_spawnattr_setsigmask(&attr, &held.previous_mask());
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    rc = posix_spawnp(&pid, argv[0], &files, &attr, argv.data(), environ);
    if (rc == 0) g_compiler.store(pid);
  }
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    const char* named = std::getenv("KILN_CXX");
    error = args[0] + ": cannot run: " + std::strerror(rc) +
            (named && *named && args[0] == named ? " (the host compiler KILN_CXX names)" : "");
    return -1;
  }
  // Waits for the end without reaping, then reaps and forgets the pid in one section: a handler
  // must not signal the process group of a reaped pid (the number may be reused).
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  int status = 0;
  {
    SignalsHeld held;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    g_compiler.store(0);
  }
  return status;
}

std::string temporaryRoot() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

// A 64-bit ELF file as long as its header says: its section headers, which the linker writes
// last, lie within it (a file cut short loses them, and would fault when loaded).
bool isWholeElf(const std::vector<uint8_t>& f) {
  if (f.size() < 64 || std::memcmp(f.data(), "\x7f" "ELF", 4) != 0 || f[4] != 2) return false;
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0;
  std::memcpy(&shoff, f.data() + 0x28, 8);
  std::memcpy(&shentsize, f.data() + 0x3A, 2);
  std::memcpy(&shnum, f.data() + 0x3C, 2);
  return shoff <= f.size() && uint64_t(shentsize) * shnum <= f.size() - shoff;
}

// The source without its whole-line comments: where in the model a kernel comes from (`// at
// loc(...)`, which moves with the spec's path and lines) changes no instruction, so the cache key
// leaves it out. (A comment line ending in a backslash would continue onto the next: it stays.)
std::string withoutCommentLines(const std::string& source) {
  std::string code;
  code.reserve(source.size());
  for (size_t at = 0; at < source.size();) {
    size_t end = source.find('\n', at);
    end = end == std::string::npos ? source.size() : end + 1;
    const std::string_view line(source.data() + at, end - at);
    const size_t first = line.find_first_not_of(" \t"), last = line.find_last_not_of("\r\n");
    const bool comment = first != std::string_view::npos && line.substr(first, 2) == "//" && line[last] != '\\';
    if (!comment) code.append(line);
    at = end;
  }
  return code;
}

}  // namespace

namespace {

// The host compiler as the cache key holds it: its name, and the contents of the file it names
// (found on PATH as posix_spawnp finds it, symbolic links followed), so that a compiler upgraded
// in place or a KILN_CXX wrapper edited at the same path builds the kernels again. (A wrapper's own
// contents: a compiler that a wrapper runs is in the key only through the wrapper.)
std::string compilerIdentity(const std::string& cxx) {
  std::string path;
  if (cxx.find('/') != std::string::npos) {
    path = cxx;
  } else if (const char* dirs = std::getenv("PATH")) {
    for (std::string_view rest = dirs; path.empty();) {
      const size_t colon = rest.find(':');
      const std::string dir(rest.substr(0, colon));
      const std::string candidate = (dir.empty() ? "." : dir) + "/" + cxx;
      if (::access(candidate.c_str(), X_OK) == 0) path = candidate;
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  std::error_code ec;
  const std::filesystem::path real = path.empty() ? std::filesystem::path() : std::filesystem::canonical(path, ec);
  const auto bytes = path.empty() || ec ? std::nullopt : readAll(real.string());
  if (!bytes) return cxx;  // (not found: the compile fails and nothing is cached)
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016llx",
                (unsigned long long)fnv1a(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size())));
  return cxx + " = " + real.string() + " " + hash;
}

// The kernel cache's file for this source, compiler and flags ("" with the cache off). The
// compiler's identity is read once per process (a miss looks the entry up, then compiles into it).
std::string cachedLibraryPath(const std::string& source) {
  const std::string dir = cacheDir();
  if (dir.empty()) return "";
  static std::mutex mutex;
  static std::map<std::string, std::string> identities;  // by hostCompiler()
  std::string identity;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const std::string cxx = hostCompiler();
    auto it = identities.find(cxx);
    if (it == identities.end()) it = identities.emplace(cxx, compilerIdentity(cxx)).first;
    identity = it->second;
  }
  char key[32];
  std::snprintf(key, sizeof key, "%016llx",
                (unsigned long long)fnv1a(identity + "\n" + cpuCompileFlags() + " " + cpuLinkFlags() +
                                          "\n" + cpuFlags() + "\n" + withoutCommentLines(source)));
  return dir + "/" + key + ".so";
}

}  // namespace

bool cpuKernelCacheEnabled() { return !cacheDir().empty(); }

std::optional<std::vector<uint8_t>> cachedCpuKernels(const std::string& source) {
  const std::string cached = cachedLibraryPath(source);
  // A cache entry that is no shared library (emptied, cut short, another file) is built again.
  if (!cached.empty())
    if (auto hit = readAll(cached); hit && isWholeElf(*hit)) return hit;
  return std::nullopt;
}

std::optional<std::vector<uint8_t>> compileCpuKernels(const std::string& source, std::string& error) {
  const std::string cxx = hostCompiler(), compileFlags = cpuCompileFlags(), linkFlags = cpuLinkFlags();
  const std::string dir = cacheDir(), cached = cachedLibraryPath(source);

  BuildSignalGuard guard;
  std::string tmpl = temporaryRoot() + "/kilnc-kernels-XXXXXX";
  std::string work, src, lib, log;
  {
    SignalsHeld held;  // the folder is known to the handler as soon as it exists
    if (!::mkdtemp(tmpl.data())) {
      error = "cannot create a temporary directory in " + temporaryRoot() + ": " + std::strerror(errno);
      return std::nullopt;
    }
    work = tmpl, src = work + "/kernels.cpp", lib = work + "/kernels.so", log = work + "/log";
    const std::string* paths[4] = {&src, &lib, &log, &work};
    for (int i = 0; i < 4; ++i) std::snprintf(g_work[i], sizeof g_work[i], "%s", paths[i]->c_str());
    std::ofstream out(src);  // not beside a handler deleting the folder
    out << source;
    out.close();
    if (!out) {  // (a full disk: the compiler would report the cut-short source's syntax)
      error = "cannot write the generated kernel source to " + src + ": " + std::strerror(errno);
      removeWork();
      return std::nullopt;
    }
  }
  std::vector<std::string> args{cxx};
  std::istringstream flags(compileFlags), links(linkFlags);
  for (std::string f; flags >> f;) args.push_back(f);
  for (const std::string& a : {std::string("-o"), lib, src}) args.push_back(a);
  for (std::string f; links >> f;) args.push_back(f);
  const int status = runCompiler(args, log, error);
  std::optional<std::vector<uint8_t>> bytes;
  if (status < 0) {
    // error says why it did not start
  } else if (status != 0 || !(bytes = readAll(lib))) {
    std::ifstream in(log);
    std::string line, first;
    for (int n = 0; n < 6 && std::getline(in, line); ++n) first += "\n  " + line;
    error = cxx + (WIFSIGNALED(status) ? " was ended by signal " + std::to_string(WTERMSIG(status))
                   : status == 0           ? " exited with status 0 but wrote no " + lib
                                           : " exited with status " + std::to_string(WEXITSTATUS(status))) + first;
    bytes.reset();
  } else if (!cached.empty()) {
    // A cache that cannot be written only costs time; but then every run compiles again, which
    // the user should know of (a KILN_KERNEL_CACHE that names a file, say).
    std::string why;
    if (!makeDirs(dir)) {
      why = dir + ": cannot make the folder: " + std::strerror(errno);
    } else {
      try {
        write_file_atomic(cached, {{bytes->data(), bytes->size()}});
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty())
      std::fprintf(stderr, "kilnc: warning: the kernel cache%s is not written (%s): the kernels are compiled again on every run (KILN_KERNEL_CACHE=off: no cache, no warning)\n",
                   cacheVariable() ? " (KILN_KERNEL_CACHE)" : "", one_line(why).c_str());
  }
  removeWork();
  return bytes;
}

#ifdef KILN_HAVE_NVRTC
// The part of a compiler log worth showing: its error lines (a log of warnings can bury the one
// error, e.g. ptxas's at the end), else its first 2000 characters.
static std::string errorLines(const std::string& log) {
  std::string out, line;
  std::istringstream in(log);
  int n = 0;
  while (std::getline(in, line))
    if (line.find("error") != std::string::npos && n++ < 20) out += line + "\n";
  return out.empty() ? log.substr(0, 2000) : out;
}
#endif

std::optional<std::vector<CudaImageBuild>> compileCudaKernels(const std::string& source, std::string& error,
                                                              bool lineInfo) {
#ifdef KILN_HAVE_NVRTC
  // One NVRTC program per architecture, compiled on threads of their own (NVRTC's calls may run
  // concurrently on distinct programs): the two take about as long as one. Then sm_90's PTX.
  const char* archs[] = {"sm_80", "sm_90"};
  std::vector<CudaImageBuild> images(2);
  CudaImageBuild ptxImage;
  std::string errors[2];
  auto build = [&](size_t i) {
    const char* arch = archs[i];
    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, source.c_str(), "kernels.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) {
      errors[i] = "nvrtcCreateProgram failed";
      return;
    }
    const std::string archOpt = std::string("--gpu-architecture=") + arch;
    const char* opts[] = {archOpt.c_str(), "--std=c++17", "-default-device", "--ptxas-options=-v", "--generate-line-info"};
    const nvrtcResult r = nvrtcCompileProgram(prog, lineInfo ? 5 : 4, opts);
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    // The log ends in a NUL (counted in its size) and may hold others between its parts: none
    // reaches the error message as a raw byte.
    while (!log.empty() && log.back() == '\0') log.pop_back();
    for (char& c : log)
      if (c == '\0') c = '\n';
    if (r != NVRTC_SUCCESS) {
      errors[i] = std::string(arch) + ": " + nvrtcGetErrorString(r) + "\n" + errorLines(log);
      nvrtcDestroyProgram(&prog);
      return;
    }
    size_t size = 0;
    nvrtcGetCUBINSize(prog, &size);
    std::vector<uint8_t> cubin(size);
    nvrtcGetCUBIN(prog, reinterpret_cast<char*>(cubin.data()));
    if (i == 1) {
      // The newest architecture's PTX too, without its closing NUL: a GPU of a later major
      // version (which no cubin runs on) has its driver compile that.
      size_t n = 0;
      nvrtcGetPTXSize(prog, &n);
      std::vector<uint8_t> ptx(n);
      nvrtcGetPTX(prog, reinterpret_cast<char*>(ptx.data()));
      while (!ptx.empty() && ptx.back() == 0) ptx.pop_back();
      ptxImage = {"compute_90", std::move(ptx), {}};
    }
    nvrtcDestroyProgram(&prog);
    images[i] = {arch, std::move(cubin), parsePtxasInfo(log)};
  };
  std::thread second(build, 1);
  build(0);
  second.join();
  images.push_back(std::move(ptxImage));
  for (const std::string& e : errors)
    if (!e.empty()) {
      error = e;
      return std::nullopt;
    }
  return images;
#else
  (void)source;
  error = "this kilnc was built without CUDA's NVRTC (install CUDA at /usr/local/cuda and rebuild)";
  return std::nullopt;
#endif
}

bool dumpKernelSource(const std::string& dir, Target target, const std::string& source,
                      const std::string& manifest, std::string& error) {
  namespace fs = std::filesystem;
  // The folders this call makes go again if nothing is written. A link counts as there (a
  // dangling one is not the call's to remove).
  fs::path folder(dir);
  if (!folder.has_filename()) folder = folder.parent_path();  // "kd/"
  const std::vector<std::string> made = missing_folders(folder.string());
  auto removeMade = [&] { remove_empty_folders(made); };
  std::error_code ec;
  if (!makeDirs(folder.string())) {
    error = dir + ": cannot make the folder: " + std::strerror(errno);
    removeMade();
    return false;
  }
  // The source and its manifest are replaced together: signals wait, and if the manifest cannot
  // be replaced the older source is written back (or the new one removed, when there was
  // none), so that a source is never left beside another's manifest.
  const std::string name = folder.string() + (target == Target::Cpu ? "/kernels.cpp" : "/kernels.cu");
  SignalsHeld held;
  std::optional<std::vector<uint8_t>> older;
  if (fs::is_regular_file(name, ec)) {
    try {
      older = read_file(name);
    } catch (const std::exception& e) {
      error = e.what();
      return false;
    }
  }
  bool sourceWritten = false;
  try {
    write_file_atomic(name, {{reinterpret_cast<const uint8_t*>(source.data()), source.size()}});
    sourceWritten = true;
    write_file_atomic(folder.string() + "/kernels.tsv", {{reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size()}});
  } catch (const std::exception& e) {
    error = e.what();
    if (sourceWritten) {
      try {
        if (older) write_file_atomic(name, {{older->data(), older->size()}});
        else fs::remove(name, ec);
      } catch (const std::exception& restore) {
        error += std::string("; and the older source could not be written back: ") + restore.what();
      }
    }
    removeMade();
    return false;
  }
  return true;
}

}  // namespace kiln
