#include "tools/kiln-inspect/cuda_report.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <elf.h>
#include <string_view>
#include <map>
#include <string>

#include "runtime/cuda/cuda_image.h"
#include "runtime/error.h"

namespace kiln {
namespace {

// Per-SM limits of the architectures kilnc compiles for (CUDA C++ Programming Guide, "Compute
// Capabilities"): 64K 32-bit registers allocated per warp in units of 256, 2048 threads, 32
// blocks, and the shared memory an SM has for blocks (1 KB of it reserved per block).
unsigned sm_shared_bytes(const std::string& arch) { return arch == "sm_80" ? 164 * 1024 : 228 * 1024; }

// Blocks of `block` threads one SM holds at once with these resources, and what limits it.
std::pair<unsigned, std::string> resident_blocks(const std::string& arch, unsigned block, unsigned registers,
                                                 unsigned shared) {
  const unsigned warps = (block + 31) / 32;
  const unsigned warp_registers = (std::max(registers, 1u) * 32 + 255) / 256 * 256;
  const unsigned by_registers = 65536 / warp_registers / warps;
  const unsigned by_threads = 2048 / (warps * 32);
  const unsigned by_shared = shared ? sm_shared_bytes(arch) / ((shared + 127) / 128 * 128 + 1024) : 32;
  unsigned n = std::min({by_registers, by_threads, by_shared, 32u});
  // Every limit that gives n (a tie with threads: fewer registers would not add a block).
  std::string why;
  for (const auto& [limit, what] : {std::pair{by_registers, "registers"}, {by_shared, "shared memory"},
                                    {by_threads, "threads"}, {32u, "blocks"}})
    if (limit == n) why += (why.empty() ? "" : " and ") + std::string(what);
  return {n, why};
}

// Whether a cubin (an ELF file) has a line table: kilnc --cuda-line-info (NVRTC's
// --generate-line-info) adds .debug_line and .nv_debug_line_sass. The module records no flag for
// it: the image says it. Anything that is not a well-formed ELF64 image (PTX text) has none.
bool cubin_has_line_info(const uint8_t* data, size_t size) {
  Elf64_Ehdr h;
  if (size < sizeof h || std::memcmp(data, ELFMAG, SELFMAG) != 0 || data[EI_CLASS] != ELFCLASS64) return false;
  std::memcpy(&h, data, sizeof h);  // (little-endian, as cubins and this host are)
  if (h.e_shentsize != sizeof(Elf64_Shdr) || h.e_shoff > size ||
      h.e_shnum > (size - h.e_shoff) / sizeof(Elf64_Shdr) || h.e_shstrndx >= h.e_shnum)
    return false;
  auto section = [&](unsigned i) {
    Elf64_Shdr s;
    std::memcpy(&s, data + h.e_shoff + i * sizeof s, sizeof s);
    return s;
  };
  const Elf64_Shdr names = section(h.e_shstrndx);
  if (names.sh_offset > size || names.sh_size > size - names.sh_offset) return false;
  const std::string_view table(reinterpret_cast<const char*>(data + names.sh_offset), names.sh_size);
  for (unsigned i = 0; i < h.e_shnum; ++i) {
    const size_t at = section(i).sh_name;
    if (at >= table.size()) continue;
    const std::string_view name = table.substr(at, table.find('\0', at) - at);  // (no NUL: to the end)
    if (name == ".debug_line" || name == ".nv_debug_line_sass") return true;
  }
  return false;
}

}  // namespace

void add_cuda_report(const Module& m, nlohmann::ordered_json& j) {
  const auto* images = m.fb().cuda_images();
  if (!images || images->size() == 0) return;
  // The newest architecture's cubin ("sm_90" over "sm_80", by number; PTX has no ptxas figures).
  const fb::CudaImage* image = nullptr;
  int newest = -1;
  for (const fb::CudaImage* i : *images)
    if (const int v = cuda_arch_number(i->arch() ? i->arch()->str() : "", "sm_"); v > newest) image = i, newest = v;
  if (!image) return;
  const std::string arch = image->arch() ? image->arch()->str() : "";
  // Block sizes of the functions the module launches (support kernels: the runtime chooses).
  std::map<std::string, unsigned> blocks;
  if (const auto* kernels = m.fb().kernels())
    for (const fb::Kernel* k : *kernels)
      if (k->cuda_functions())
        for (const fb::CudaFunction* f : *k->cuda_functions()) blocks[f->symbol()->str()] = f->block();
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  if (image->resources())
    for (const fb::FunctionResources* r : *image->resources()) {
      const std::string symbol = r->symbol() ? r->symbol()->str() : "";
      nlohmann::ordered_json f = {{"symbol", symbol}, {"registers", r->registers()},
                                  {"shared_bytes", r->shared_bytes()}, {"stack_bytes", r->stack_bytes()},
                                  {"spill_store_bytes", r->spill_store_bytes()},
                                  {"spill_load_bytes", r->spill_load_bytes()}};
      if (auto b = blocks.find(symbol); b != blocks.end() && b->second) {
        auto [n, why] = resident_blocks(arch, b->second, r->registers(), r->shared_bytes());
        f["block"] = b->second;
        f["blocks_per_sm"] = n;
        f["warps_per_sm"] = n * ((b->second + 31) / 32);
        f["limited_by"] = why;
      }
      list.push_back(f);
    }
  uint64_t workspace = 0;  // the runtime allocates the largest kernel's (module.fbs)
  if (const auto* kernels = m.fb().kernels())
    for (const fb::Kernel* k : *kernels) workspace = std::max<uint64_t>(workspace, k->cuda_scratch_bytes());
  const bool line_info = image->cubin() && cubin_has_line_info(image->cubin()->data(), image->cubin()->size());
  j["cuda"] = {{"arch", arch}, {"workspace_bytes", workspace}, {"line_info", line_info}, {"functions", list}};
}

void print_cuda_summary(const nlohmann::ordered_json& j) {
  if (!j.contains("cuda")) return;
  const auto& c = j["cuda"];
  const auto& fns = c["functions"];
  if (fns.empty()) {
    std::printf("cuda       %s: no resources recorded (a module from an older kilnc)\n",
                c["arch"].get<std::string>().c_str());
    return;
  }
  std::string most, spills;
  unsigned most_registers = 0;
  for (const auto& f : fns) {
    if (f["registers"].get<unsigned>() > most_registers)
      most_registers = f["registers"].get<unsigned>(), most = f["symbol"].get<std::string>();
    if (f["spill_store_bytes"].get<unsigned>() || f["spill_load_bytes"].get<unsigned>())
      spills += (spills.empty() ? "" : ", ") + f["symbol"].get<std::string>();
  }
  std::printf("cuda       %s (ptxas): %zu functions; most registers %u (%s); spills: %s "
              "(kiln-inspect --cuda-resources lists them)\n",
              c["arch"].get<std::string>().c_str(), fns.size(), most_registers, most.c_str(),
              spills.empty() ? "none" : spills.c_str());
  if (c["line_info"].get<bool>())
    std::printf("  line info: the cubins carry source lines (kilnc --cuda-line-info), for compute-sanitizer and the profilers\n");
  if (c["workspace_bytes"].get<uint64_t>())
    std::printf("  kernel workspace %llu bytes, outside the arena (the runtime allocates it once)\n",
                (unsigned long long)c["workspace_bytes"].get<uint64_t>());
}

void check_cuda_resources_view(const nlohmann::ordered_json& j) {
  // As --roofline: a cpu module has no GPU code to report on.
  if (!j.contains("cuda"))
    throw Error(j["module"].get<std::string>() + ": --cuda-resources is for cuda modules (it lists what ptxas made "
                "of their kernels); this one's target is " + j["model"]["target"].get<std::string>());
}

void print_cuda_resources(const nlohmann::ordered_json& j) {
  check_cuda_resources_view(j);
  const auto& c = j["cuda"];
  std::printf("%s, as ptxas compiled them; resident blocks and warps per SM (of 64) from the block size the\n"
              "module launches with (support kernels: chosen by the runtime, not shown)\n",
              c["arch"].get<std::string>().c_str());
  std::printf("%-56s %5s %5s %8s %6s %6s %6s %7s  %s\n", "function", "block", "regs", "smem", "stack", "spill",
              "blocks", "warps", "limited by");
  for (const auto& f : c["functions"]) {
    const unsigned spill = f["spill_store_bytes"].get<unsigned>() + f["spill_load_bytes"].get<unsigned>();
    if (f.contains("block"))
      std::printf("%-56s %5u %5u %8u %6u %6u %6u %7u  %s\n", f["symbol"].get<std::string>().c_str(),
                  f["block"].get<unsigned>(), f["registers"].get<unsigned>(), f["shared_bytes"].get<unsigned>(),
                  f["stack_bytes"].get<unsigned>(), spill, f["blocks_per_sm"].get<unsigned>(),
                  f["warps_per_sm"].get<unsigned>(), f["limited_by"].get<std::string>().c_str());
    else
      std::printf("%-56s %5s %5u %8u %6u %6u %6s %7s\n", f["symbol"].get<std::string>().c_str(), "-",
                  f["registers"].get<unsigned>(), f["shared_bytes"].get<unsigned>(), f["stack_bytes"].get<unsigned>(),
                  spill, "-", "-");
  }
}

}  // namespace kiln
