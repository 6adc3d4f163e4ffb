// Spec parsing with toml++: every key is known, typed and range-checked, and every error
// names the file, the line and the key.
#include "compiler/spec.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <sstream>
#include <system_error>

#include "runtime/error.h"
#include "runtime/file_io.h"

namespace kiln {
namespace {

struct IntegerKey {
  const char* table;
  const char* key;
  SpecRange range;
};
const IntegerKey kIntegerKeys[] = {
    {"model", "n_layer", {1, 1024}},        {"model", "n_head", {1, 1024}},
    {"model", "n_embd", {1, 1 << 16}},      {"model", "vocab_size", {2, 1 << 16, " (llm.c's token shards hold uint16 ids)"}},
    {"model", "block_size", {1, 1 << 20}},  {"compile", "batch_size", {1, 1 << 16}},
    {"compile", "seq_len", {1, 1 << 20}},
};

// A character a model name may hold: the module's symbol is printed quoted where needed, and
// read back (no control characters, quotes or backslashes).
bool is_name_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x20 && u != 0x7F && c != '"' && c != '\\';
}

// A string as TOML writes it, quotes and backslashes escaped (gpt\\2 for the name gpt\2; the
// error line escapes control characters itself).
std::string toml_string(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

// The table a key belongs to ("model" or "compile").
std::string table_of(const std::string& key) {
  for (const IntegerKey& k : kIntegerKeys)
    if (key == k.key) return k.table;
  return "compile";
}

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

  // An integer key within its spec_range; required unless `fallback` is given.
  int integer(const std::string& key, const int* fallback = nullptr) const {
    const auto [lo, hi, why] = spec_range(key);
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
                            std::to_string(lo) + ", " + std::to_string(hi) + "]" + why);
    return static_cast<int>(*v);
  }

  std::string choice(const std::string& key, const std::string& fallback) const {
    const std::set<std::string>& allowed = spec_choices(key);
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

SpecRange spec_range(const std::string& key) {
  for (const IntegerKey& k : kIntegerKeys)
    if (key == k.key) return k.range;
  throw Error("spec_range: unknown key '" + key + "'");
}

const std::set<std::string>& spec_choices(const std::string& key) {
  static const std::set<std::string> precisions{"fp32", "bf16"}, targets{"cpu", "cuda"};
  if (key == "precision") return precisions;
  if (key == "target") return targets;
  throw Error("spec_choices: unknown key '" + key + "'");
}

bool is_spec_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), is_name_char);
}

std::optional<std::pair<std::string, std::string>> spec_relation_error(
    const ModelSpec& s, const std::function<std::string(const std::string&)>& name) {
  auto problem = [](const std::string& key, const std::string& text) { return std::pair{key, text}; };
  if (s.n_embd % s.n_head != 0)
    return problem("n_embd", name("n_embd") + " = " + std::to_string(s.n_embd) +
                                 " is not divisible by n_head = " + std::to_string(s.n_head));
  if (s.seq_len > s.block_size)
    return problem("seq_len", name("seq_len") + " = " + std::to_string(s.seq_len) + " exceeds " +
                                  name("block_size") + " = " + std::to_string(s.block_size));
  // The widest activation: the MLP's [B*T, 4C] or the logits' [B*T, Vp], the vocabulary padded
  // to a multiple of 128 as the model builder pads it (each key's range alone allows 2^52 and more).
  const int64_t rows = int64_t(s.batch_size) * s.seq_len, padded = (int64_t(s.vocab_size) + 127) / 128 * 128;
  const int64_t width = std::max<int64_t>(4 * int64_t(s.n_embd), padded);
  if (rows * width > kMaxTensorElements)
    return problem("batch_size", name("batch_size") + " x " + name("seq_len") + " x " +
                                     (width == padded ? name("vocab_size") + " (padded to " + std::to_string(padded) + ")"
                                                      : "4 x " + name("n_embd")) +
                                     " = " + std::to_string(rows * width) +
                                     " elements in one activation, above 2^48, the most a Kiln tensor holds");
  // The cuda target's kernels have room for so much, found here rather than by NVRTC's ptxas.
  if (s.target == "cuda") {
    if (s.n_embd / s.n_head > kCudaMaxHeadSize)
      return problem("n_head", "target \"cuda\": the head size " + name("n_embd") + " / " + name("n_head") + " = " +
                                   std::to_string(s.n_embd / s.n_head) + " is above " + std::to_string(kCudaMaxHeadSize) +
                                   ", the most its attention kernels take");
    // The attention kernels' limit (attention_cuda.cpp headSize).
    const int64_t rows = int64_t(s.batch_size) * s.n_head * s.seq_len;
    if (rows > (int64_t(1) << 31))
      return problem("batch_size", "target \"cuda\": " + name("batch_size") + " x " + name("n_head") + " x " +
                                       name("seq_len") + " = " + std::to_string(rows) +
                                       " attention rows, above 2^31, the most its attention kernels index");
    // (Their other limit, B x T x 3C <= 2^40, follows: 3C x B x T = 3 x head size x B x H x T.)
    if (s.n_embd > kCudaMaxEmbd)
      return problem("n_embd", "target \"cuda\": " + name("n_embd") + " = " + std::to_string(s.n_embd) + " is above " +
                                   std::to_string(kCudaMaxEmbd) +
                                   ", the most its layer-norm gradient kernels sum in 48 KB of shared memory");
  }
  return std::nullopt;
}

ModelSpec parse_spec(const std::string& path) {
  // toml++ reads a folder as an empty file, which would be reported as a spec without tables.
  if (std::filesystem::is_directory(path)) throw Error(path + ": is a folder, not a spec file");
  // Read here rather than by toml++, whose message for a file it cannot open gives no reason
  // (and by read_file, which refuses a device, or a FIFO no one writes to, instead of reading
  // for ever).
  if (!std::filesystem::exists(path)) throw Error(path + ": no such file");
  // A spec is a few hundred bytes. One far larger is refused before it is read whole (a file of
  // gigabytes was read into memory, then parsed for minutes) or parsed: toml++ recurses once per
  // level of a dotted key or table header ([a.a.a...]), which its nesting limit does not count,
  // and some 150,000 levels overflowed the stack. 64 KiB holds at most 32,768.
  constexpr uintmax_t kMaxSpecBytes = 64 << 10;
  std::error_code size_error;
  if (std::filesystem::is_regular_file(path, size_error)) {
    const uintmax_t size = std::filesystem::file_size(path, size_error);
    if (!size_error && size > kMaxSpecBytes)
      throw Error(path + ": is " + std::to_string(size) + " bytes, more than a spec's " +
                  std::to_string(kMaxSpecBytes) + " (is it a model spec?)");
  }
  const std::vector<uint8_t> bytes = read_file(path, kMaxSpecBytes);
  if (bytes.size() > kMaxSpecBytes)  // (a pipe, which has no size until read)
    throw Error(path + ": holds more than a spec's " + std::to_string(kMaxSpecBytes) + " bytes (is it a model spec?)");
  const std::string text(bytes.begin(), bytes.end());
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    // A file named otherwise may be no spec at all (kilnc reads .mlir as IR, anything else as TOML).
    const bool toml_name = std::filesystem::path(path).extension() == ".toml";
    throw Error(where(path, e.source()) + ": " + std::string(e.description()) +
                (toml_name ? "" : " (read as a TOML spec: kilnc takes a .toml spec or .mlir IR)"));
  }
  ModelSpec s;
  s.path = path;
  s.name = std::filesystem::path(path).stem().string();
  // The default from the file's name follows the same rule (it is written into the IR and read back).
  std::replace_if(s.name.begin(), s.name.end(), [](char c) { return !is_name_char(c); }, '_');
  if (s.name.empty()) s.name = "gpt2";

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
    if (!is_spec_name(s.name))
      fail(path, *n, "[model] name = " + toml_string(s.name) +
                         " must be non-empty, without control characters, quotes or backslashes");
  }
  s.model_line = model.table.source().begin.line ? model.table.source().begin.line : 1;
  s.n_layer = model.integer("n_layer");
  s.n_head = model.integer("n_head");
  s.n_embd = model.integer("n_embd");
  s.vocab_size = model.integer("vocab_size");
  s.block_size = model.integer("block_size");

  TableReader compile{path, *root["compile"].as_table(), "compile"};
  compile.no_unknown_keys({"batch_size", "seq_len", "precision", "target"});
  s.batch_size = compile.integer("batch_size");
  s.seq_len = compile.integer("seq_len", &s.block_size);
  s.precision = compile.choice("precision", "fp32");
  s.target = compile.choice("target", "cpu");

  auto named = [](const std::string& k) { return "[" + table_of(k) + "] " + k; };
  if (auto bad = spec_relation_error(s, named)) {
    const toml::table& t = table_of(bad->first) == "model" ? model.table : compile.table;
    fail(path, t.get(bad->first) ? *t.get(bad->first) : t, bad->second);  // seq_len may be implicit
  }
  return s;
}

}  // namespace kiln
