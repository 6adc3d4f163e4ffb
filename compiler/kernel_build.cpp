// Host-compiler and NVRTC builds of generated kernels (see kernel_build.h).
#include "compiler/kernel_build.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/file_io.h"

#ifdef KILN_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace kiln {
namespace {

// The compiler CMake used and the flags for generated kernels: optimised for this machine,
// vectorised, parallel over its cores with OpenMP.
const char* hostCompiler() {
  const char* env = std::getenv("KILN_CXX");
  return env && *env ? env : KILN_HOST_CXX;
}
// KILN_MARCH picks another -march (e.g. x86-64-v3) for executables that move to other machines.
std::string cpuCompileFlags() {
  const char* march = std::getenv("KILN_MARCH");
  return std::string("-std=c++17 -O3 -march=") + (march && *march ? march : "native") +
         " -fno-math-errno -fopenmp -fPIC -shared -I" + KILN_CBLAS_INCLUDE_DIR;
}

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::optional<std::vector<uint8_t>> readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string cacheDir() {
  if (const char* env = std::getenv("KILN_KERNEL_CACHE")) return std::strcmp(env, "off") == 0 ? "" : env;
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

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::optional<std::vector<uint8_t>> compileCpuKernels(const std::string& source, std::string& error) {
  const std::string cxx = hostCompiler(), kCpuFlags = cpuCompileFlags();
  const std::string dir = cacheDir();
  char key[32];
  std::snprintf(key, sizeof key, "%016llx", (unsigned long long)fnv1a(cxx + "\n" + kCpuFlags + "\n" + cpuFlags() + "\n" + source));
  const std::string cached = dir.empty() ? "" : dir + "/" + key + ".so";
  if (!cached.empty())
    if (auto hit = readAll(cached)) return hit;

  char tmpl[] = "/tmp/kilnc-kernels-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    error = std::string("cannot create a temporary directory: ") + std::strerror(errno);
    return std::nullopt;
  }
  const std::string work = tmpl, src = work + "/kernels.cpp", lib = work + "/kernels.so", log = work + "/log";
  {
    std::ofstream out(src);
    out << source;
  }
  const std::string cmd = quote(cxx) + " " + kCpuFlags + " -o " + quote(lib) + " " + quote(src) + " >" + quote(log) + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::optional<std::vector<uint8_t>> bytes;
  if (status != 0 || !(bytes = readAll(lib))) {
    std::ifstream in(log);
    std::string line, first;
    for (int n = 0; n < 6 && std::getline(in, line); ++n) first += "\n  " + line;
    error = cxx + " exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status) + first;
    bytes.reset();
  } else if (!cached.empty() && makeDirs(dir)) {
    try {
      write_file_atomic(cached, {{bytes->data(), bytes->size()}});
    } catch (...) {
      // A cache that cannot be written only costs time.
    }
  }
  std::remove(src.c_str());
  std::remove(lib.c_str());
  std::remove(log.c_str());
  ::rmdir(work.c_str());
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

std::optional<std::vector<CudaImageBuild>> compileCudaKernels(const std::string& source, std::string& error) {
#ifdef KILN_HAVE_NVRTC
  std::vector<CudaImageBuild> images;
  for (const char* arch : {"sm_80", "sm_90"}) {
    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, source.c_str(), "kernels.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) {
      error = "nvrtcCreateProgram failed";
      return std::nullopt;
    }
    const std::string archOpt = std::string("--gpu-architecture=") + arch;
    const char* opts[] = {archOpt.c_str(), "--std=c++17", "-default-device", "--ptxas-options=-v"};
    const nvrtcResult r = nvrtcCompileProgram(prog, 4, opts);
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    if (r != NVRTC_SUCCESS) {
      error = std::string(arch) + ": " + nvrtcGetErrorString(r) + "\n" + errorLines(log);
      nvrtcDestroyProgram(&prog);
      return std::nullopt;
    }
    size_t size = 0;
    nvrtcGetCUBINSize(prog, &size);
    std::vector<uint8_t> cubin(size);
    nvrtcGetCUBIN(prog, reinterpret_cast<char*>(cubin.data()));
    nvrtcDestroyProgram(&prog);
    images.push_back({arch, std::move(cubin), parsePtxasInfo(log)});
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
  if (!makeDirs(dir)) {
    error = dir + ": " + std::strerror(errno);
    return false;
  }
  try {
    const std::string name = dir + (target == Target::Cpu ? "/kernels.cpp" : "/kernels.cu");
    write_file_atomic(name, {{reinterpret_cast<const uint8_t*>(source.data()), source.size()}});
    write_file_atomic(dir + "/kernels.tsv", {{reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size()}});
  } catch (const std::exception& e) {
    error = e.what();
    return false;
  }
  return true;
}

}  // namespace kiln
