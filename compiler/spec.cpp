// Spec parsing with toml++: every key is known, typed and range-checked, and every error
// names the file, the line and the key.
#include "compiler/spec.h"

#include <toml++/toml.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "runtime/error.h"

namespace kiln {
namespace {

std::string where(const std::string& path, const toml::source_region& src) {
  std::ostringstream os;
  os << path;
  if (src.begin.line) os << ":" << src.begin.line << ":" << src.begin.column;
  return os.str();
}

[[noreturn]] void fail(const std::string& path, const toml::node& node, const std::string& msg) {
  throw Error(where(path, node.source()) + ": " + msg);
}

struct TableReader {
  const std::string& path;
  const toml::table& table;
  std::string name;

  // An integer key in [lo, hi]; required unless `fallback` is given.
  int integer(const std::string& key, long lo, long hi, const int* fallback = nullptr) const {
    const toml::node* node = table.get(key);
    if (!node) {
      if (fallback) return *fallback;
      throw Error(where(path, table.source()) + ": [" + name + "] is missing the key '" + key + "'");
    }
    auto v = node->value<int64_t>();
    if (!node->is_integer() || !v)
      fail(path, *node, "[" + name + "] " + key + " must be an integer");
    if (*v < lo || *v > hi)
      fail(path, *node, "[" + name + "] " + key + " = " + std::to_string(*v) + " is out of range [" +
                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<int>(*v);
  }

  std::string choice(const std::string& key, const std::set<std::string>& allowed,
                     const std::string& fallback) const {
    const toml::node* node = table.get(key);
    if (!node) return fallback;
    if (!node->is_string()) fail(path, *node, "[" + name + "] " + key + " must be a string");
    std::string v = *node->value<std::string>();
    if (!allowed.count(v)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
      fail(path, *node, "[" + name + "] " + key + " = \"" + v + "\" is not one of " + list);
    }
    return v;
  }

  void no_unknown_keys(const std::set<std::string>& known) const {
    for (const auto& [k, node] : table)
      if (!known.count(std::string(k.str())))
        throw Error(where(path, k.source()) + ": unknown key '" + std::string(k.str()) + "' in [" +
                    name + "]");
  }
};

}  // namespace

ModelSpec parse_spec(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    if (!std::filesystem::exists(path)) throw Error(path + ": no such file");
    throw Error(where(path, e.source()) + ": " + std::string(e.description()));
  }
  ModelSpec s;
  s.path = path;
  s.name = std::filesystem::path(path).stem().string();

  for (const auto& [k, node] : root)
    if (k.str() != "model" && k.str() != "compile")
      throw Error(where(path, k.source()) + ": unknown table or key '" + std::string(k.str()) +
                  "' (a spec has [model] and [compile])");
  for (const char* t : {"model", "compile"}) {
    const toml::node* n = root.get(t);
    if (!n) throw Error(path + ": missing the table [" + std::string(t) + "]");
    if (!n->is_table()) fail(path, *n, std::string(t) + " must be a table [" + t + "]");
  }

  TableReader model{path, *root["model"].as_table(), "model"};
  model.no_unknown_keys({"name", "n_layer", "n_head", "n_embd", "vocab_size", "block_size"});
  if (const toml::node* n = model.table.get("name")) {
    if (!n->is_string()) fail(path, *n, "[model] name must be a string");
    s.name = *n->value<std::string>();
  }
  s.model_line = model.table.source().begin.line ? model.table.source().begin.line : 1;
  s.n_layer = model.integer("n_layer", 1, 1024);
  s.n_head = model.integer("n_head", 1, 1024);
  s.n_embd = model.integer("n_embd", 1, 1 << 16);
  s.vocab_size = model.integer("vocab_size", 2, 1 << 20);
  s.block_size = model.integer("block_size", 1, 1 << 20);

  TableReader compile{path, *root["compile"].as_table(), "compile"};
  compile.no_unknown_keys({"batch_size", "seq_len", "precision", "target"});
  s.batch_size = compile.integer("batch_size", 1, 1 << 16);
  s.seq_len = compile.integer("seq_len", 1, 1 << 20, &s.block_size);
  s.precision = compile.choice("precision", {"fp32", "bf16"}, "fp32");
  s.target = compile.choice("target", {"cpu", "cuda"}, "cpu");

  if (s.n_embd % s.n_head != 0)
    fail(path, *model.table.get("n_embd"),
         "[model] n_embd = " + std::to_string(s.n_embd) + " is not divisible by n_head = " +
             std::to_string(s.n_head));
  if (s.seq_len > s.block_size)
    fail(path, compile.table.get("seq_len") ? *compile.table.get("seq_len") : compile.table,
         "[compile] seq_len = " + std::to_string(s.seq_len) + " exceeds [model] block_size = " +
             std::to_string(s.block_size));
  if (s.vocab_size > 65536)
    fail(path, *model.table.get("vocab_size"),
         "[model] vocab_size = " + std::to_string(s.vocab_size) +
             " does not fit llm.c's uint16 token shards (at most 65536)");
  return s;
}

}  // namespace kiln
