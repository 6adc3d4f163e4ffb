// A model spec (TOML): the model's shape and how to compile it. No MLIR here.
#pragma once
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace kiln {

struct ModelSpec {
  std::string path;          // the file it came from (for messages and locations)
  std::string name;          // [model] name, or the file's stem
  int n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, block_size = 0;
  int batch_size = 0, seq_len = 0;
  std::string precision = "fp32";  // "fp32" | "bf16"
  std::string target = "cpu";      // "cpu" | "cuda"
  int model_line = 1;              // line of the [model] table, for IR locations
};

// Parses and checks a spec; throws kiln::Error ("FILE:LINE:COL: [table] key: problem").
ModelSpec parse_spec(const std::string& path);

// The rules every spec obeys, shared by parse_spec and the check of a module's `kiln.spec`
// attribute (compiler/pipeline.cpp), so an edited .mlir file cannot carry sizes a TOML spec
// could not.
struct SpecRange {
  long lo, hi;
  const char* why = "";  // said after the range when it is not plain ("" or " (...)")
};
// What the cuda target's generated kernels have room for: the attention kernels' head size and
// the layer-norm gradient's column sums (3 x n_embd floats of static shared memory, at most 48 KB).
constexpr int kCudaMaxHeadSize = 128, kCudaMaxEmbd = 4096;
// The range of an integer key (n_layer, ..., batch_size, seq_len).
SpecRange spec_range(const std::string& key);
// The values a string key (precision, target) may take.
const std::set<std::string>& spec_choices(const std::string& key);
// A model name is non-empty, without control characters, quotes or backslashes: it becomes the
// module's symbol (quoted by MLIR where needed), which must print and parse back.
bool is_spec_name(const std::string& name);
// The most elements a Kiln tensor holds (the dialect's types say so too; 1 PiB of fp32).
constexpr int64_t kMaxTensorElements = int64_t(1) << 48;
// The first relation between keys `s` breaks, as {the key to blame, the problem}; `name` spells
// a key as its source does ("[model] n_embd" in a TOML spec).
std::optional<std::pair<std::string, std::string>> spec_relation_error(
    const ModelSpec& s, const std::function<std::string(const std::string&)>& name);

}  // namespace kiln
