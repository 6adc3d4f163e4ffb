// Training checkpoints (format in checkpoint.h). Saving hands write_file_atomic pointers straight
// into the arena, so a checkpoint costs no extra copy of the model; loading maps the whole file
// and validates all of it before the first byte reaches the executor.
#include "runtime/checkpoint.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/crc32.h"
#include "runtime/error.h"
#include "runtime/json_object.h"
#include "runtime/shape.h"
#include "runtime/file_io.h"
#include "runtime/params.h"

// The file is little-endian and tensor bytes are copied as they lie in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kiln assumes a little-endian host");

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keeps key order, so headers and extra_json read as written

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kPrefixBytes = 32;   // magic, version, reserved, header_len, file_size
constexpr size_t kTrailerBytes = 4;   // CRC-32
constexpr size_t kDataAlign = 64;     // the data starts at a multiple of this
const char* const kSuffix = ".kiln-ckpt";

// ---- Checksums ---------------------------------------------------------------------------------

// FNV-1a 64: tiny and fully specified, so the fingerprint never depends on the standard library.
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// ---- Small helpers -----------------------------------------------------------------------------

std::vector<int64_t> shape_of(const fb::Parameter& p) { return {p.shape()->begin(), p.shape()->end()}; }



template <class T>
T get_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void put_le(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::string checkpoint_name(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "ckpt_%08" PRId64 "%s", step, kSuffix);
  return buf;
}

// The step of "ckpt_<digits>.kiln-ckpt", or nullopt for any other name (temporaries included).
std::optional<int64_t> step_of(const std::string& name) {
  const size_t pre = 5, suf = std::strlen(kSuffix);
  if (name.size() <= pre + suf || name.compare(0, pre, "ckpt_") != 0 ||
      name.compare(name.size() - suf, suf, kSuffix) != 0)
    return std::nullopt;
  const std::string digits = name.substr(pre, name.size() - pre - suf);
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

}  // namespace

bool is_checkpoint_file_name(const std::string& name) { return name == "latest" || step_of(name).has_value(); }

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (auto step = step_of(name); step && it->is_regular_file(ec)) found.emplace_back(*step, name);
  }
  // (A folder not there holds none: a signal before the first step removes the one the run made.)
  if (ec && ec != std::errc::no_such_file_or_directory) throw Error(dir + ": listing checkpoints: " + ec.message());
  std::sort(found.begin(), found.end(), std::greater<>());
  return found;
}

namespace {

fs::path dir_path(const std::string& dir) { return dir.empty() ? fs::path(".") : fs::path(dir); }

// Temporaries ("ckpt_00000100.kiln-ckpt.tmp.HOST.4242", "latest.tmp.HOST.4242") that a process
// killed while writing left behind (up to a model's state each): removed when their writer ran on
// this machine and no longer runs (temporary_is_orphaned).
bool is_stale_temporary(const std::string& name) {
  const size_t tmp = name.find(".tmp.");
  if (tmp == std::string::npos || !(name.compare(0, tmp, "latest") == 0 || step_of(name.substr(0, tmp)))) return false;
  return temporary_is_orphaned(name.substr(tmp + 5));
}

void remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!is_stale_temporary(it->path().filename().string())) continue;
    std::error_code rm;
    fs::remove(it->path(), rm);  // best effort: a temporary never stands for a checkpoint
  }
}

}  // namespace

uint64_t stale_temporary_bytes(const std::string& dir) {
  uint64_t sum = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir_path(dir), ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (is_stale_temporary(it->path().filename().string()) && ::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      sum += uint64_t(st.st_blocks) * 512;  // (the blocks it holds: what removing it frees)
  }
  return sum;
}

namespace {

// The whole file, mapped read-only. Mapping rather than reading keeps the bytes in the page cache
// instead of a second heap copy of the model (19 GB for GPT-2 XL's values and moments). Safe to
// validate and then copy from: checkpoints are replaced by rename, never rewritten in place.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const RegularFile file(path, "checkpoint's file");
    size_ = static_cast<size_t>(file.size());
    if (size_ > 0) {  // mmap refuses length 0; an empty file fails the magic check instead
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
      if (p == MAP_FAILED) throw Error(path + ": mmap: " + std::strerror(errno));
      data_ = static_cast<const uint8_t*>(p);
    }
  }  // the mapping keeps the file open
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// ---- Header ------------------------------------------------------------------------------------

// The model fields that enter the fingerprint, in a fixed order (also recorded in the header so a
// mismatch can say what differs).
Json model_json(const Module& m) {
  const fb::Model& md = *m.fb().model();
  return Json{{"n_layer", md.n_layer()},       {"n_head", md.n_head()},
              {"n_embd", md.n_embd()},         {"vocab_size", md.vocab_size()},
              {"block_size", md.block_size()}, {"precision", md.precision() ? md.precision()->str() : ""}};
}

struct Span {
  uint64_t offset = 0, bytes = 0;  // within the data section
};

struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  bool decay = false;
  Span value, adam_m, adam_v;
};

// Everything a load needs, validated against the file's size.
struct Parsed {
  TrainingState state;
  Json model;
  std::vector<Entry> entries;
  const uint8_t* data = nullptr;
};

[[noreturn]] void bad_header(const std::string& path, const std::string& what) {
  throw Error(path + ": header: " + what);
}

const Json& member(const Json& obj, const char* key, const std::string& path, const std::string& at = "") {
  if (!obj.contains(key)) bad_header(path, at + "missing \"" + key + "\"");
  return obj[key];
}

int64_t as_int64(const Json& j, const std::string& path, const std::string& what) {
  if (!j.is_number_integer() || (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)))
    bad_header(path, what + " " + j.dump() + " is not a 64-bit integer");
  return j.get<int64_t>();
}

uint64_t as_uint64(const Json& j, const std::string& path, const std::string& what) {
  if (!j.is_number_unsigned()) bad_header(path, what + " " + j.dump() + " is not an integer >= 0");
  return j.get<uint64_t>();
}

int as_int(const Json& j, const std::string& path, const std::string& what) {
  const int64_t v = as_int64(j, path, what);
  if (v < INT32_MIN || v > INT32_MAX) bad_header(path, what + " " + j.dump() + " is out of range");
  return int(v);
}

// One of an entry's [offset, bytes] pairs, checked to lie inside the data and to hold the shape.
Span parse_span(const Json& j, uint64_t numel, uint64_t data_size, const std::string& path,
                const std::string& at) {
  if (!j.is_array() || j.size() != 2 || !j[0].is_number_unsigned() || !j[1].is_number_unsigned())
    bad_header(path, at + j.dump() + " is not [offset, bytes]");
  Span s{j[0].get<uint64_t>(), j[1].get<uint64_t>()};
  uint64_t end = 0;
  if (__builtin_add_overflow(s.offset, s.bytes, &end) || end > data_size)
    bad_header(path, at + j.dump() + " runs past the end of the data (" + std::to_string(data_size) + " bytes)");
  if (s.bytes != numel * 4)
    bad_header(path, at + "holds " + std::to_string(s.bytes) + " bytes, the shape needs " + std::to_string(numel * 4));
  if (s.offset % 4 != 0) bad_header(path, at + j.dump() + " does not start at a multiple of 4 bytes (fp32)");
  return s;
}

// Validates the frame and the header; nothing here touches an executor.
Parsed parse(const std::string& path, const MappedFile& bytes) {
  const uint64_t size = bytes.size();
  if (size == 0) throw Error(path + ": is empty (0 bytes), not a Kiln checkpoint");
  if (size < sizeof kMagic && std::memcmp(bytes.data(), kMagic, size_t(size)) == 0)
    throw Error(path + ": a Kiln checkpoint cut short (truncated: only " + std::to_string(size) +
                (size == 1 ? " byte)" : " bytes)"));
  if (size < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    throw Error(path + ": not a Kiln checkpoint (no KILNCKPT magic)");
  if (size < kPrefixBytes + kTrailerBytes)
    throw Error(path + ": checksum mismatch (file corrupt or truncated: only " + std::to_string(size) + " bytes)");

  // The checksum first: a corrupt file should say "corrupt", not whichever field the damage hit.
  const uint32_t stored = get_le<uint32_t>(bytes.data() + size - kTrailerBytes);
  const uint32_t actual = crc32_update(0, bytes.data() + sizeof kMagic, size - sizeof kMagic - kTrailerBytes);
  const uint64_t recorded_size = get_le<uint64_t>(bytes.data() + 24);
  if (stored != actual) {
    std::string hint;
    if (recorded_size != size)
      hint = ": " + std::to_string(size) + " bytes, the header says " + std::to_string(recorded_size);
    throw Error(path + ": checksum mismatch (file corrupt or truncated" + hint + ")");
  }

  const uint32_t version = get_le<uint32_t>(bytes.data() + 8);
  if (version != kVersion)
    throw Error(path + ": checkpoint version " + std::to_string(version) + " is not supported (this build reads version " +
                std::to_string(kVersion) + ")");
  if (recorded_size != size)
    throw Error(path + ": length: the header says " + std::to_string(recorded_size) + " bytes, the file has " +
                std::to_string(size));
  if (const uint32_t reserved = get_le<uint32_t>(bytes.data() + 12); reserved != 0)
    throw Error(path + ": prefix: reserved bytes 12-15 hold " + std::to_string(reserved) + ", not 0");
  const uint64_t header_len = get_le<uint64_t>(bytes.data() + 16);
  if (header_len > size - kPrefixBytes - kTrailerBytes)
    throw Error(path + ": length: header length " + std::to_string(header_len) + " runs past the end of the file");
  const uint64_t data_start = kPrefixBytes + header_len;
  if (data_start % kDataAlign != 0)  // the writer pads the header so; a length edited by hand shifts every tensor
    throw Error(path + ": length: the data starts at byte " + std::to_string(data_start) + ", not at a multiple of " +
                std::to_string(kDataAlign));
  const uint64_t data_size = size - kTrailerBytes - data_start;
  // The writer pads the JSON with spaces; the parser would stop at a NUL and ignore the rest.
  if (std::memchr(bytes.data() + kPrefixBytes, 0, header_len))
    bad_header(path, "holds a NUL byte (the JSON is padded with spaces)");

  const Json h = parse_json_unique_keys(reinterpret_cast<const char*>(bytes.data()) + kPrefixBytes,
                                       reinterpret_cast<const char*>(bytes.data()) + data_start, path + ": header");
  if (!h.is_object()) bad_header(path, "is not a JSON object");
  if (member(h, "format", path) != "kiln-checkpoint") bad_header(path, "format is not \"kiln-checkpoint\"");

  Parsed p;
  TrainingState& st = p.state;
  st.step = as_int64(member(h, "step", path), path, "step");
  if (st.step < 0) bad_header(path, "step " + std::to_string(st.step) + " is negative");
  // `latest`, --keep and the notes go by the file's name: it must say the step the file holds.
  if (auto named = step_of(fs::path(path).filename().string()); named && *named != st.step)
    bad_header(path, "step " + std::to_string(st.step) + " is not the step " + std::to_string(*named) +
                         " its name says (a renamed copy? name it by its step, or other than ckpt_N.kiln-ckpt)");
  st.data_shard = as_uint64(member(h, "data_shard", path), path, "data_shard");
  st.data_position = as_int64(member(h, "data_position", path), path, "data_position");
  if (st.data_position < 0) bad_header(path, "data_position " + std::to_string(st.data_position) + " is negative");
  // rng_state is a hex string: JSON readers that use doubles (jq, JavaScript) would round a number.
  const Json& rng = member(h, "rng_state", path);
  const std::string rng_text = rng.is_string() ? rng.get<std::string>() : "";
  if (rng_text.size() != 16 || rng_text.find_first_not_of("0123456789abcdef") != std::string::npos)
    bad_header(path, "rng_state " + rng.dump() + " is not 16 lowercase hex digits");
  st.rng_state = std::stoull(rng_text, nullptr, 16);
  st.world_size = as_int(member(h, "world_size", path), path, "world_size");
  if (st.world_size < 1) bad_header(path, "world_size " + std::to_string(st.world_size) + " is not a rank count (1 or more)");
  st.zero_stage = as_int(member(h, "zero_stage", path), path, "zero_stage");
  if (st.zero_stage != 0 && st.zero_stage != 1)
    bad_header(path, "zero_stage " + std::to_string(st.zero_stage) + " is not 0 or 1 (--zero)");
  const Json& fp = member(h, "fingerprint", path);
  if (!fp.is_string()) bad_header(path, "fingerprint is not a string");
  st.spec_fingerprint = fp.get<std::string>();
  const Json& extra = member(h, "extra", path);
  if (!extra.is_object()) bad_header(path, "extra is not a JSON object");
  st.extra_json = extra.dump();
  p.model = member(h, "model", path);
  if (!p.model.is_object()) bad_header(path, "model is not a JSON object");

  const Json& params = member(h, "parameters", path);
  if (!params.is_array()) bad_header(path, "parameters is not an array");
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Json& j = params[i];
    std::string at = "parameters[" + std::to_string(i) + "]: ";
    if (!j.is_object()) bad_header(path, at + "is not a JSON object");
    Entry e;
    const Json& name = member(j, "name", path, at);
    if (!name.is_string()) bad_header(path, at + "name is not a string");
    e.name = name.get<std::string>();
    at = "parameter '" + e.name + "': ";
    if (!seen.emplace(e.name, i).second) bad_header(path, at + "appears twice");
    const Json& shape = member(j, "shape", path, at);
    if (!shape.is_array()) bad_header(path, at + "shape is not an array");
    for (const Json& d : shape) e.shape.push_back(as_int64(d, path, at + "shape entry"));
    uint64_t numel = 0;
    if (!checked_numel(e.shape, &numel) || numel > (UINT64_MAX >> 2))
      bad_header(path, at + "shape " + shape_str(e.shape) + " is negative or too large");
    const Json& decay = member(j, "decay", path, at);
    if (!decay.is_boolean()) bad_header(path, at + "decay is not true or false");
    e.decay = decay.get<bool>();
    e.value = parse_span(member(j, "value", path, at), numel, data_size, path, at + "value ");
    e.adam_m = parse_span(member(j, "adam_m", path, at), numel, data_size, path, at + "adam_m ");
    e.adam_v = parse_span(member(j, "adam_v", path, at), numel, data_size, path, at + "adam_v ");
    p.entries.push_back(std::move(e));
  }
  // Each tensor's bytes are its own: spans that overlap would load one tensor's values as another's.
  std::vector<std::pair<Span, std::string>> spans;
  for (const Entry& e : p.entries)
    for (const auto& [s, what] : {std::pair{e.value, "value"}, {e.adam_m, "adam_m"}, {e.adam_v, "adam_v"}})
      if (s.bytes) spans.push_back({s, "parameter '" + e.name + "' " + what});
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.first.offset < b.first.offset; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first.offset < spans[i - 1].first.offset + spans[i - 1].first.bytes)
      bad_header(path, spans[i].second + " overlaps " + spans[i - 1].second);
  p.data = bytes.data() + data_start;
  return p;
}

// The first field the fingerprint hashes where the header's model (saved) differs from `m`'s:
// "n_head: the checkpoint's 5, this module's 4"; empty when none does.
std::string model_difference(const Json& saved, const Module& m) {
  const Json mine = model_json(m);  // named: items() of a temporary would dangle
  for (const auto& [key, value] : mine.items()) {
    const bool has = saved.is_object() && saved.contains(key);
    if (!has || saved[key] != value) return key + (has ? ": the checkpoint's " + saved[key].dump() : std::string(": not in the checkpoint")) +
                                                  ", this module's " + value.dump();
  }
  return "";
}

// The first difference between the checkpoint's parameter table and `m`'s parameters (name,
// shape, weight decay); empty when none.
std::string table_difference(const Parsed& p, const Module& m) {
  std::map<std::string, const Entry*> file;
  for (const Entry& e : p.entries) file[e.name] = &e;
  for (const fb::Parameter* q : *m.fb().parameters()) {
    const std::string name = q->name()->str();
    auto it = file.find(name);
    if (it == file.end()) return "parameter '" + name + "' is not in the checkpoint";
    if (it->second->shape != shape_of(*q))
      return "parameter '" + name + "' shape: the checkpoint's " + shape_str(it->second->shape) + ", this module's " +
             shape_str(shape_of(*q));
    if (it->second->decay != q->decay())
      return std::string("parameter '") + name + "' weight decay: the checkpoint's " + (it->second->decay ? "true" : "false") +
             ", this module's " + (q->decay() ? "true" : "false");
    file.erase(it);
  }
  if (!file.empty()) return "parameter '" + file.begin()->first + "' is not in this module";
  return "";
}

// The first difference between the checkpoint's model and `m`, for the fingerprint error; empty
// when none shows (the fingerprint itself was edited, or hashes a field the header lacks).
std::string first_difference(const Parsed& p, const Module& m) {
  if (std::string diff = model_difference(p.model, m); !diff.empty()) return diff;
  return table_difference(p, m);
}


}  // namespace

std::string module_fingerprint(const Module& m) {
  // A canonical text of the compatible-checkpoint contract, hashed. Parameters sorted by name, so
  // the compiler may reorder them (or re-plan their buffers) without orphaning checkpoints.
  const fb::Model& md = *m.fb().model();
  std::string text = "kiln-checkpoint-fingerprint 1\n";
  text += "model " + std::to_string(md.n_layer()) + " " + std::to_string(md.n_head()) + " " +
          std::to_string(md.n_embd()) + " " + std::to_string(md.vocab_size()) + " " +
          std::to_string(md.block_size()) + " " + (md.precision() ? md.precision()->str() : "") + "\n";
  std::vector<std::string> lines;
  for (const fb::Parameter* p : *m.fb().parameters()) {
    std::string line = "param " + std::to_string(p->name()->size()) + ":" + p->name()->str() + " " +
                       shape_str(shape_of(*p)) + (p->decay() ? " decay" : " no-decay") + "\n";
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());
  for (const std::string& line : lines) text += line;
  return hex64(fnv1a64(text));
}

uint64_t checkpoint_data_bytes(const Module& m) {
  uint64_t bytes = 0;
  for (const fb::Parameter* p : *m.fb().parameters())
    for (uint32_t b : {p->value(), p->adam_m(), p->adam_v()}) bytes += m.buffer(b).size();
  return bytes;
}

std::string save_checkpoint(const std::string& dir, Executor& ex, const TrainingState& st, int keep,
                     const WholeMoments& moments) {
  const fs::path d = dir_path(dir);
  if (st.step < 0) throw Error(d.string() + ": cannot save a checkpoint for step " + std::to_string(st.step));
  Json extra;
  try {
    extra = Json::parse(st.extra_json);
  } catch (const Json::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    throw Error(d.string() + ": checkpoint extra_json: " + msg);
  }
  if (!extra.is_object()) throw Error(d.string() + ": checkpoint extra_json is not a JSON object");

  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec || !fs::is_directory(d))
    throw Error(d.string() + ": cannot create the checkpoint directory" + (ec ? ": " + ec.message() : ""));

  // The header and the list of data pieces (pointers into the arena, or on a GPU into the host
  // copy of its state, brought up to date here), in the same order.
  ex.sync_to_host();
  // A loss and gradient norm can be finite while the update they led to is not (a huge --lr):
  // such a state is never saved, so the last good checkpoint stays the latest.
  // (the executor's moments unless gathered ones are given, which are checked below)
  std::string bad = first_non_finite(ex, moments.empty());
  const Module& m = ex.module();
  const size_t n_params = m.fb().parameters()->size();
  if (!moments.empty() && (moments.adam_m.size() != n_params || moments.adam_v.size() != n_params))
    throw Error(d.string() + ": the gathered moments are " + std::to_string(moments.adam_m.size()) + " first and " +
                std::to_string(moments.adam_v.size()) + " second for " + std::to_string(n_params) + " parameters");
  // The gathered moments, else the executor's own (kiln::Error when it keeps slices of them).
  auto moment = [&](uint32_t p, bool second) -> const float* {
    const fb::Parameter& prm = *m.fb().parameters()->Get(p);
    if (moments.empty()) return ex.f32(second ? prm.adam_v() : prm.adam_m());
    return second ? moments.adam_v[p] : moments.adam_m[p];
  };
  for (uint32_t p = 0; bad.empty() && !moments.empty() && p < n_params; ++p)
    for (bool second : {false, true}) {
      const int64_t n = numel(m.buffer(m.fb().parameters()->Get(p)->value()));
      const float* x = moment(p, second);
      if (std::any_of(x, x + n, [](float f) { return !std::isfinite(f); }))
        bad = "parameter '" + m.fb().parameters()->Get(p)->name()->str() + (second ? "' (AdamW v)" : "' (AdamW m)");
    }
  if (!bad.empty())
    throw Error((d / checkpoint_name(st.step)).string() + ": not written: " + bad +
                " holds a NaN or an infinity after step " + std::to_string(st.step) +
                "'s update; the last good checkpoint is kept (lower --lr or check the data)");
  remove_stale_temporaries(d);
  std::vector<std::pair<const void*, size_t>> tensors;
  Json params = Json::array();
  uint64_t offset = 0;
  for (uint32_t i = 0; i < n_params; ++i) {
    const fb::Parameter* p = m.fb().parameters()->Get(i);
    Json e = {{"name", p->name()->str()}, {"shape", shape_of(*p)}, {"decay", p->decay()}};
    const std::pair<const char*, uint32_t> fields[] = {
        {"value", p->value()}, {"adam_m", p->adam_m()}, {"adam_v", p->adam_v()}};
    for (const auto& [key, idx] : fields) {
      const uint64_t bytes = m.buffer(idx).size();
      e[key] = {offset, bytes};
      tensors.emplace_back(idx == p->value() ? ex.f32(idx) : moment(i, idx == p->adam_v()), size_t(bytes));
      offset += bytes;
    }
    params.push_back(std::move(e));
  }
  Json model = model_json(m);
  model["spec"] = m.fb().model()->spec() ? m.fb().model()->spec()->str() : "";  // for people, not checked
  const Json header = {{"format", "kiln-checkpoint"},
                       {"step", st.step},
                       {"data_shard", st.data_shard},
                       {"data_position", st.data_position},
                       {"rng_state", hex64(st.rng_state)},
                       {"world_size", st.world_size},
                       {"zero_stage", st.zero_stage},
                       {"fingerprint", module_fingerprint(m)},
                       {"model", model},
                       {"parameters", params},
                       {"extra", extra}};
  std::string text = header.dump(-1, ' ', false, Json::error_handler_t::replace);  // a spec path need not be UTF-8
  text.append((kDataAlign - (kPrefixBytes + text.size()) % kDataAlign) % kDataAlign, ' ');

  uint8_t prefix[kPrefixBytes] = {};
  std::memcpy(prefix, kMagic, sizeof kMagic);
  put_le<uint32_t>(prefix + 8, kVersion);
  put_le<uint64_t>(prefix + 16, text.size());
  put_le<uint64_t>(prefix + 24, kPrefixBytes + text.size() + offset + kTrailerBytes);

  std::vector<std::pair<const void*, size_t>> pieces = {{prefix, sizeof prefix}, {text.data(), text.size()}};
  pieces.insert(pieces.end(), tensors.begin(), tensors.end());
  uint32_t crc = crc32_update(0, prefix + sizeof kMagic, sizeof prefix - sizeof kMagic);
  for (size_t i = 1; i < pieces.size(); ++i) crc = crc32_update(crc, pieces[i].first, pieces[i].second);
  uint8_t trailer[kTrailerBytes];
  put_le<uint32_t>(trailer, crc);
  pieces.emplace_back(trailer, sizeof trailer);

  // Order matters for a crash at any point: the new file is complete before `latest` names it,
  // and old files go only once `latest` no longer can.
  const std::string name = checkpoint_name(st.step);
  // The folder's names are Kiln's: a link among them is replaced, never written through.
  write_file_atomic((d / name).string(), pieces, 0644, Links::Replace);
  const std::string latest = name + "\n";
  write_file_atomic((d / "latest").string(), {{latest.data(), latest.size()}}, 0644, Links::Replace);

  prune_checkpoints(d.string(), name, keep, " was saved");
  return (d / name).string();
}

int prune_checkpoints(const std::string& dir, const std::string& newest, int keep, const std::string& why) {
  if (keep <= 0) return 0;
  const fs::path d = dir_path(dir);
  std::error_code ec;
  int kept = 1, removed = 0;  // `newest`, even when older files carry higher steps (a rewound run)
  for (const auto& [step, other] : list_checkpoints(d)) {
    if (other == newest) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    if (!fs::remove(d / other, ec) && ec)
      throw Error((d / other).string() + ": cannot delete this old checkpoint (" + newest + why + "): " + ec.message());
    ++removed;
  }
  return removed;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  const fs::path d = dir_path(dir);
  std::error_code ec;
  if (!fs::is_directory(d, ec)) return std::nullopt;
  const fs::path latest = d / "latest";
  if (fs::exists(latest, ec)) {
    const std::vector<uint8_t> bytes = read_file(latest.string());
    std::string name(bytes.begin(), bytes.end());
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    // Only a bare checkpoint name: `latest` must not lead a resume outside DIR.
    if (!step_of(name))  // (clipped and escaped: the file may hold anything)
      throw Error(latest.string() + ": '" + one_line(clipped(name)) + "' is not a checkpoint file name");
    if (!fs::exists(d / name, ec))
      throw Error(latest.string() + ": names " + name + ", which does not exist");
    if (!fs::is_regular_file(d / name, ec))
      throw Error(latest.string() + ": names " + name + ", which is not a regular file (a folder, a pipe or a device)");
    return (d / name).string();
  }
  const auto all = list_checkpoints(d);
  if (all.empty()) return std::nullopt;
  return (d / all.front().second).string();
}

bool is_whole_checkpoint(const std::string& path) {
  try {
    const MappedFile bytes(path);
    (void)parse(path, bytes);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::optional<std::string> newest_whole_checkpoint(const std::string& dir, const std::string& except) {
  const fs::path d = dir_path(dir);
  std::vector<std::pair<int64_t, std::string>> all;
  try {
    all = list_checkpoints(d.string());
  } catch (const Error&) {
    return std::nullopt;
  }
  for (const auto& [step, name] : all) {
    std::error_code ec;
    if (fs::equivalent(d / name, except, ec)) continue;
    if (is_whole_checkpoint((d / name).string())) return (d / name).string();
  }
  return std::nullopt;
}

TrainingState load_checkpoint(const std::string& path, Executor& ex, bool weights_only) {
  const MappedFile bytes(path);
  const Parsed p = parse(path, bytes);
  const Module& m = ex.module();

  // Weights alone (--init) fit the same model compiled in another precision: the file holds fp32
  // values either way. Then the header's model is compared with the module's precision.
  Json model = p.model;
  const Json mine_model = model_json(m);
  if (weights_only && model.is_object() && model.contains("precision") && mine_model.contains("precision"))
    model["precision"] = mine_model["precision"];
  const std::string mine = module_fingerprint(m);
  if (p.state.spec_fingerprint != mine) {
    const bool same_tables = table_difference(p, m).empty();
    const bool precision_only = model != p.model && model_difference(model, m).empty() && same_tables;
    const std::string diff = first_difference(p, m);
    // A resume of the same model in another precision cannot take its AdamW state and compute
    // copies, but --init takes its weights: say so.
    std::string hint;
    if (!weights_only && model.is_object() && model.contains("precision") && mine_model.contains("precision")) {
      Json weights = model;
      weights["precision"] = mine_model["precision"];
      if (weights != p.model && model_difference(weights, m).empty() && same_tables)
        hint = "; start afresh from its weights in this precision with --init " + path +
               " and another --checkpoint-dir (its AdamW state and step are left)";
    }
    if (!precision_only)
      throw Error(path + ": compiled for a different model (" + (diff.empty() ? "" : diff + "; ") + "the checkpoint's fingerprint " +
                  p.state.spec_fingerprint + ", this module's " + mine + ")" + hint);
  }

  // The fingerprint matched, so the model the header describes must be this one too: it is what
  // kiln-inspect and a mismatch's message show.
  if (const std::string diff = model_difference(model, m); !diff.empty())
    bad_header(path, "model: " + diff + ", yet its fingerprint is this module's");

  // The fingerprint matched, but the table is what we copy from: check it names exactly the
  // module's parameters with their shapes.
  std::map<std::string, const Entry*> by_name;
  for (const Entry& e : p.entries) by_name[e.name] = &e;
  std::vector<std::pair<const fb::Parameter*, const Entry*>> plan;
  for (const fb::Parameter* q : *m.fb().parameters()) {
    const std::string name = q->name()->str();
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error(path + ": parameter '" + name + "' is missing");
    if (it->second->shape != shape_of(*q))
      throw Error(path + ": parameter '" + name + "' has shape " + shape_str(it->second->shape) +
                  " in the checkpoint, " + shape_str(shape_of(*q)) + " in the module");
    if (it->second->decay != q->decay())  // (the fingerprint hashes it: the header was edited)
      bad_header(path, "parameter '" + name + "': decay " + (it->second->decay ? "true" : "false") +
                           ", yet its fingerprint is this module's (" + (q->decay() ? "true" : "false") + ")");
    plan.emplace_back(q, it->second);
    by_name.erase(it);
  }
  if (!by_name.empty()) throw Error(path + ": parameter '" + by_name.begin()->first + "' is not in the module");
  // A run never saves a NaN or an infinity (save_checkpoint refuses), nor a negative second
  // moment: one here was put there by hand, and would end the run a step later, not now.
  for (const auto& [q, e] : plan)
    for (const auto& [span, what, moment2] : {std::tuple{e->value, "value", false}, {e->adam_m, "AdamW m", false},
                                               {e->adam_v, "AdamW v", true}})
      for (uint64_t i = 0; i < span.bytes / 4; ++i) {
        float x;
        std::memcpy(&x, p.data + span.offset + 4 * i, 4);
        if (!std::isfinite(x) || (moment2 && x < 0.0f))
          throw Error(path + ": parameter '" + e->name + "' " + what + " element " + std::to_string(i) + " is " +
                      (std::isnan(x) ? "NaN" : std::isinf(x) ? "infinite" : "negative (a second moment)") +
                      " (a checkpoint edited by hand?)");
      }

  // Everything is validated: from here on nothing in the file can fail, so the executor is never
  // half-loaded (on a GPU the upload below can still fail, and that ends the run).
  for (const auto& [q, e] : plan) {
    std::memcpy(ex.f32(q->value()), p.data + e->value.offset, e->value.bytes);
    if (weights_only) continue;
    // ZeRO-1: the slice of the moments this rank keeps.
    for (const auto& [buffer, span] : {std::pair{q->adam_m(), e->adam_m}, {q->adam_v(), e->adam_v}}) {
      const auto [lo, hi] = ex.held(buffer);
      std::memcpy(ex.f32_held(buffer), p.data + span.offset + uint64_t(lo) * 4, size_t(hi - lo) * 4);
    }
  }
  // bf16 compute copies are derived from the values, so they are not saved; without this the
  // first step after a resume would multiply with the executor's stale copies.
  ex.refresh_compute_copies();
  return p.state;
}

}  // namespace kiln
