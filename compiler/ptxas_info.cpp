#include "compiler/ptxas_info.h"

#include <cctype>
#include <cstdint>
#include <sstream>

namespace kiln {

std::vector<CudaFunctionResources> parsePtxasInfo(const std::string& log) {
  std::vector<CudaFunctionResources> out;
  std::istringstream in(log);
  std::string line, propertiesOf;
  // The number before `what` on the line ("36864 bytes smem" -> 36864), if any.
  auto before = [&](const std::string& what, unsigned& value) {
    const size_t at = line.find(what);
    if (at == std::string::npos) return;
    size_t b = at;
    while (b > 0 && line[b - 1] == ' ') --b;
    size_t a = b;
    while (a > 0 && std::isdigit(static_cast<unsigned char>(line[a - 1]))) --a;
    if (a < b) value = unsigned(std::stoul(line.substr(a, b - a)));
  };
  auto quoted = [&](const std::string& after) {
    const size_t at = line.find(after);
    if (at == std::string::npos) return std::string();
    const size_t a = at + after.size(), b = line.find('\'', a);
    return b == std::string::npos ? std::string() : line.substr(a, b - a);
  };
  while (std::getline(in, line)) {
    if (std::string f = quoted("Compiling entry function '"); !f.empty()) {
      out.push_back({});
      out.back().symbol = f;
      continue;
    }
    if (line.find("Function properties for ") != std::string::npos) {
      const size_t at = line.find("Function properties for ") + 24;
      propertiesOf = line.substr(at);
      while (!propertiesOf.empty() && std::isspace(static_cast<unsigned char>(propertiesOf.back()))) propertiesOf.pop_back();
      continue;
    }
    if (out.empty()) continue;
    CudaFunctionResources& r = out.back();
    if (line.find("bytes stack frame") != std::string::npos) {
      if (propertiesOf != r.symbol) continue;  // a device function's, not the entry's
      before("bytes stack frame", r.stackBytes);
      before("bytes spill stores", r.spillStoreBytes);
      before("bytes spill loads", r.spillLoadBytes);
    } else if (line.find("Used ") != std::string::npos && line.find(" registers") != std::string::npos) {
      before("registers", r.registers);
      before("bytes smem", r.sharedBytes);
    }
  }
  return out;
}

std::string launchResourceProblem(const CudaFunctionResources& r, unsigned blockThreads) {
  constexpr unsigned kMaxThreads = 1024, kBlockRegisters = 65536, kWarpRegisterUnit = 256, kStaticShared = 48 * 1024;
  if (blockThreads == 0 || blockThreads > kMaxThreads)
    return "a block of " + std::to_string(blockThreads) + " threads (1 to 1024 launch)";
  const unsigned warps = (blockThreads + 31) / 32;
  const unsigned perWarp = (r.registers * 32 + kWarpRegisterUnit - 1) / kWarpRegisterUnit * kWarpRegisterUnit;
  if (uint64_t(warps) * perWarp > kBlockRegisters)
    return "a block of " + std::to_string(blockThreads) + " threads at " + std::to_string(r.registers) +
           " registers each needs " + std::to_string(uint64_t(warps) * perWarp) + " registers, above the " +
           std::to_string(kBlockRegisters) + " one block may hold";
  if (r.sharedBytes > kStaticShared)
    return std::to_string(r.sharedBytes) + " bytes of static shared memory, above the " +
           std::to_string(kStaticShared) + " a block may declare";
  return "";
}

}  // namespace kiln
