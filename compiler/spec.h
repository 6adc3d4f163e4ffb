// A model spec (TOML): the model's shape and how to compile it. No MLIR here.
#pragma once
#include <string>

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

}  // namespace kiln
