#include "runtime/data_loader.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/params.h"

// Shards are little-endian and read as-is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kiln assumes a little-endian host");

namespace kiln {
namespace {

constexpr int32_t kMagic = 20240520;
constexpr int32_t kVersion = 1;
constexpr int32_t kLlama3Magic = 20240801;  // llm.c's Llama 3 shards (version 7, uint32 ids)
constexpr int32_t kEvalMagic = 20240522;    // llm.c's eval files (HellaSwag's examples)
constexpr int kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

// What one next() call needs from a shard, spelled out for error messages; {} needs nothing.
struct StepNeed {
  int64_t B = 0, T = 0, world_size = 0;
  int64_t tokens() const { return B * T * world_size + 1; }
};

const char* const kTextData = ": is text, not an llm.c token shard (kiln-data prepare tokenizes text files into shards)";

// Opens a shard and checks its header against the file; returns its token count. With
// `tokens` non-null also reads the tokens.
int64_t open_shard(const std::string& path, const StepNeed& need, std::vector<uint16_t>* tokens) {
  const RegularFile file(path, "shard's file");
  const int64_t size = int64_t(file.size());
  if (size < kHeaderBytes) {
    uint8_t head[kHeaderBytes];
    if (size > 0) file.read_at(head, size_t(size), 0, "header");
    if (looks_like_text(head, size_t(size))) throw Error(path + kTextData);
    throw Error(path + ": header: file is " + std::to_string(size) + (size == 1 ? " byte" : " bytes") +
                ", shorter than the " +
                std::to_string(kHeaderBytes) + "-byte header (not an llm.c token shard)");
  }

  int32_t header[kHeaderInts];
  file.read_at(header, sizeof(header), 0, "header");
  if (header[0] != kMagic) {
    // A file Kiln wrote (a checkpoint or weights in a folder the data's glob reaches): say so.
    if (const std::string kind = file_kind(path); !kind.empty())
      throw Error(path + ": is " + kind + ", not an llm.c token shard (does a --data or --val-data pattern reach "
                  "further than the shards?)");
    // llm.c's Llama 3 shards: the same header, uint32 ids.
    if (header[0] == kLlama3Magic)
      throw Error(path + ": header: magic " + std::to_string(kLlama3Magic) +
                  " is an llm.c Llama 3 shard's (uint32 token ids); Kiln reads GPT-2 shards (magic " +
                  std::to_string(kMagic) + ", uint16 token ids)");
    if (header[0] == kEvalMagic)
      throw Error(path + ": header: magic " + std::to_string(kEvalMagic) +
                  " is an llm.c evaluation file's (multiple-choice examples such as HellaSwag's), not a token shard's");
    if (looks_like_text(reinterpret_cast<const uint8_t*>(header), kHeaderBytes)) throw Error(path + kTextData);
    throw Error(path + ": header: magic " + std::to_string(header[0]) + " is not " +
                std::to_string(kMagic) + " (not an llm.c token shard)");
  }
  if (header[1] != kVersion)
    throw Error(path + ": header: version " + std::to_string(header[1]) + " is not " +
                std::to_string(kVersion) + " (unsupported llm.c shard version)");
  const int64_t count = header[2];
  if (count < 0)
    throw Error(path + ": header: token count " + std::to_string(count) + " is negative");
  const int64_t expected = kHeaderBytes + count * static_cast<int64_t>(sizeof(uint16_t));
  if (size != expected)
    throw Error(path + ": size: header says " + std::to_string(count) +
                " tokens, so the file should be " + std::to_string(expected) +
                " bytes, but it is " + std::to_string(size) + " bytes (" +
                (count > 0 && size == kHeaderBytes + 4 * count
                     ? "4 bytes a token: int32 or uint32 ids? llm.c's GPT-2 shards hold uint16 ones)"
                 : size > expected ? "bytes past its tokens: something appended, or two shards run together?)"
                                   : "truncated or corrupt)"));
  if (count < need.tokens() && need.B > 0)
    throw Error(path + ": holds " + std::to_string(count) + (count == 1 ? " token" : " tokens") + ", but one batch (B=" +
                std::to_string(need.B) + " x T=" + std::to_string(need.T) +
                " x world_size=" + std::to_string(need.world_size) + ", plus 1 target) needs " +
                std::to_string(need.tokens()));
  if (tokens) {
    tokens->resize(static_cast<size_t>(count));
    file.read_at(tokens->data(), tokens->size() * sizeof(uint16_t), kHeaderBytes, "tokens");
  }
  return count;
}

// The staging folder that a kiln-data prepare killed (on this machine) while it swapped its
// shards into `dir` left there, with older shards moved aside into old/; "" when there is none.
// Its shards are then part of one data set and part of another, or missing.
std::string interrupted_prepare(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir.empty() ? "." : dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code old;
    if (is_orphaned_prepare_staging(it->path().filename().string()) && fs::is_directory(it->path() / "old", old))
      return it->path().string();
  }
  return "";
}

std::string rerun_prepare(const std::string& dir) {
  return "run that prepare again with --out " + (dir.empty() ? std::string(".") : dir) +
         " (it first finishes or undoes that swap)";
}

// Shards beside such a folder are not one data set: refused rather than trained on.
void refuse_half_swapped(const std::string& given, const std::vector<std::string>& files) {
  std::set<std::string> dirs;
  for (const std::string& f : files) dirs.insert(std::filesystem::path(f).parent_path().string());
  for (const std::string& dir : dirs)
    if (const std::string staging = interrupted_prepare(dir); !staging.empty())
      throw Error(given + ": " + staging + " was left by a kiln-data prepare killed while it swapped shards in, so "
                  "the shards beside it are not one data set: " + rerun_prepare(dir));
}

}  // namespace

bool is_orphaned_prepare_staging(const std::string& name) {
  const std::string prefix = ".kiln-data-prepare.";
  if (name.rfind(prefix, 0) != 0) return false;
  std::string suffix = name.substr(prefix.size());
  if (suffix.rfind("tmp.", 0) == 0) suffix = suffix.substr(4);  // (without "tmp.": before the host was named)
  return temporary_is_orphaned(suffix);
}

std::vector<std::string> expand_data_pattern(const std::string& file_or_glob) {
  if (file_or_glob.empty()) throw Error("an empty path names no shard file");
  // A path that names something is that, glob characters in its name or not ("run[1]/a.bin").
  struct stat st;
  if (::stat(file_or_glob.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      throw Error(file_or_glob + ": is a folder; give its shard files, or a glob such as '" + file_or_glob +
                  (file_or_glob.back() == '/' ? "" : "/") + "train_*.bin'");
    refuse_half_swapped(file_or_glob, {file_or_glob});
    return {file_or_glob};
  }
  glob_t g;
  // GLOB_MARK appends '/' to directories so they can be dropped below.
  const int rc = ::glob(file_or_glob.c_str(), GLOB_MARK, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::string p = g.gl_pathv[i];
      if (p.empty() || p.back() != '/') files.push_back(std::move(p));
    }
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH)
    throw Error(file_or_glob + ": glob failed (" +
                (rc == GLOB_NOSPACE ? "out of memory" : "read error") + ")");
  if (files.empty()) {
    const std::string dir = std::filesystem::path(file_or_glob).parent_path().string();
    const std::string staging = dir.find_first_of("*?[") == std::string::npos ? interrupted_prepare(dir) : "";
    throw Error(file_or_glob + ": no file matches this path or pattern" +
                (staging.empty() ? "" : "; but " + staging + " holds the shards of a kiln-data prepare killed while it "
                                        "swapped them in: " + rerun_prepare(dir)));
  }
  refuse_half_swapped(file_or_glob, files);
  // Byte order, not glob's locale-dependent order: every rank and run sees the same sequence.
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> expand_data_patterns(const std::vector<std::string>& files_or_globs) {
  if (files_or_globs.empty()) throw Error("no data: give a shard file or a glob");
  std::vector<std::string> files;
  for (const std::string& p : files_or_globs) {
    std::vector<std::string> more = expand_data_pattern(p);
    files.insert(files.end(), more.begin(), more.end());
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  // A file named twice by different paths ("a.bin" and "./a.bin", a link) is read once too: at
  // the first of its names in path order.
  std::set<std::pair<dev_t, ino_t>> seen;
  std::vector<std::string> once;
  for (std::string& f : files) {
    struct stat st;
    if (::stat(f.c_str(), &st) != 0 || seen.insert({st.st_dev, st.st_ino}).second) once.push_back(std::move(f));
  }
  return once;
}

bool starts_like_token_shard(const std::string& path) {
  const std::string head = read_head(path, sizeof(int32_t));
  int32_t magic = 0;
  if (head.size() == sizeof magic) std::memcpy(&magic, head.data(), sizeof magic);
  return magic == kMagic;
}

void read_shard_tokens(const std::string& path, int64_t first, int64_t n, uint16_t* out) {
  RegularFile(path, "shard's file")
      .read_at(out, size_t(n) * sizeof(uint16_t), kHeaderBytes + first * int64_t(sizeof(uint16_t)), "tokens");
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw Error(path + ": " + std::to_string(tokens.size()) +
                " tokens do not fit the int32 count of an llm.c shard");
  int32_t header[kHeaderInts] = {kMagic, kVersion, static_cast<int32_t>(tokens.size())};
  write_file_atomic(path,
                    {{header, sizeof(header)}, {tokens.data(), tokens.size() * sizeof(uint16_t)}});
}

// The patterns as one name for messages: "data/train_*.bin", or "a.bin b.bin".
static std::string joined(const std::vector<std::string>& patterns) {
  std::string s;
  for (const std::string& p : patterns) s += (s.empty() ? "" : " ") + p;
  return s;
}

DataLoader::DataLoader(const std::vector<std::string>& files_or_globs, int64_t B, int64_t T, int rank,
                       int world_size)
    : pattern_(joined(files_or_globs)), B_(B), T_(T), rank_(rank), world_size_(world_size) {
  const std::string at = pattern_ + ": DataLoader: ";
  if (B <= 0 || T <= 0)
    throw Error(at + "B=" + std::to_string(B) + " and T=" + std::to_string(T) +
                " must be positive");
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    throw Error(at + "rank " + std::to_string(rank) +
                " is not in [0, world_size=" + std::to_string(world_size) + ")");
  int64_t bt = 0;
  if (__builtin_mul_overflow(B, T, &bt) || __builtin_mul_overflow(bt, world_size, &step_) ||
      step_ > INT32_MAX)
    throw Error(at + "B*T*world_size is larger than any llm.c shard can hold");

  // Every header is checked. A shard too short for one step holds no batch (the loader would
  // move past it at once, as past a used-up one): it is left out, and said (skipped()), unless
  // no shard is long enough.
  const StepNeed need{B_, T_, world_size_};
  for (std::string& f : expand_data_patterns(files_or_globs)) {
    const FileId id = file_id(f);  // (before the header read: a change after it is seen at load)
    const int64_t count = open_shard(f, {}, nullptr);
    all_counts_.push_back(count);
    all_files_.push_back(f);
    if (count < need.tokens()) {
      skipped_.push_back({std::move(f), count});
      continue;
    }
    ids_.push_back(id);
    files_.push_back(std::move(f));
    counts_.push_back(count);
    index_.push_back(all_counts_.size() - 1);
  }
  if (files_.empty()) open_shard(skipped_.front().first, need, nullptr);  // throws: too short
  load(0);  // checks shard 0 as it reads it
}

std::pair<size_t, bool> DataLoader::shard_from_file(size_t file_index) const {
  for (size_t s = 0; s < index_.size(); ++s)
    if (index_[s] >= file_index) return {s, index_[s] == file_index};
  return {0, false};
}

std::string DataLoader::skipped_note() const {
  if (skipped_.empty()) return "";
  std::string s = std::to_string(skipped_.size()) + (skipped_.size() == 1 ? " shard" : " shards") +
                  " too short for one batch (B=" + std::to_string(B_) + " x T=" + std::to_string(T_) + " x " +
                  std::to_string(world_size_) + (world_size_ == 1 ? " rank" : " ranks") + ", plus 1 target: " +
                  std::to_string(step_ + 1) + " tokens) left out:";
  for (size_t i = 0; i < skipped_.size() && i < 3; ++i)
    s += (i ? ", " : " ") + skipped_[i].first + " (" + std::to_string(skipped_[i].second) +
         (skipped_[i].second == 1 ? " token)" : " tokens)");
  if (skipped_.size() > 3) s += " and " + std::to_string(skipped_.size() - 3) + " more";
  return s;
}

int64_t DataLoader::batches_per_pass() const {
  int64_t n = 0;
  for (int64_t tokens : counts_) n += (tokens - 1) / step_;  // positions 0, step_, ... <= tokens - step_ - 1
  return n;
}

DataLoader::FileId DataLoader::file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // (open_shard then says why it cannot be read)
  return {uint64_t(st.st_dev), uint64_t(st.st_ino), uint64_t(st.st_size),
          int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

void DataLoader::load(size_t shard) {
  const FileId id = file_id(files_[shard]);
  std::vector<uint16_t> tokens;
  open_shard(files_[shard], {B_, T_, world_size_}, &tokens);
  // A shard rewritten since it was last read (a data pipeline replacing it while the run goes
  // on) is read as it is now, and said: the run no longer trains on what it started with. Its
  // count follows, for the positions checkpoints record.
  if (id != ids_[shard] && rank_ == 0) {
    const int64_t before = counts_[shard], now = int64_t(tokens.size());
    const std::string counts = now == before ? std::to_string(now) + " tokens, as before"
                                             : std::to_string(now) + " tokens, " + std::to_string(before) + " before";
    std::fprintf(stderr, "kiln: warning: %s was replaced or rewritten while the run read its shards (%s); it is "
                 "read as it is now\n", files_[shard].c_str(), counts.c_str());
  }
  adopt(shard, id, std::move(tokens));  // only now: a failed load leaves the loader as it was
}

void DataLoader::adopt(size_t shard, const FileId& id, std::vector<uint16_t> tokens) {
  ids_[shard] = id;
  counts_[shard] = int64_t(tokens.size());
  all_counts_[index_[shard]] = counts_[shard];
  tokens_ = std::move(tokens);
  shard_ = shard;
}

void DataLoader::next(int32_t* x, int32_t* y) {
  if (advance_) {
    const size_t next_shard = (shard_ + 1) % files_.size();
    if (next_shard != shard_) load(next_shard);  // one shard: it is already resident
    pos_ = 0;
    advance_ = false;
  }
  const int64_t n = B_ * T_;
  const uint16_t* buf = tokens_.data() + pos_ + rank_ * n;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = buf[i];
    y[i] = buf[i + 1];
  }
  pos_ += step_;
  advance_ = pos_ + step_ + 1 > tokens_in_current_shard();
}

std::vector<std::pair<size_t, int64_t>> DataLoader::shards_ahead(int64_t batches) const {
  std::vector<std::pair<size_t, int64_t>> ahead;
  if (batches <= 0) return ahead;
  size_t s = shard();
  int64_t pos = position(), call = 0;
  if (s != shard_) ahead.push_back({s, 0});  // the next call reads it
  for (size_t walked = 1; walked < files_.size(); ++walked) {
    // A shard of c tokens holds the batches at positions pos, pos + step_, ... up to c - step_ - 1.
    call += calls_from(s, pos);
    if (call >= batches) break;
    s = (s + 1) % files_.size();
    pos = 0;
    if (s == shard_) break;  // round to the resident shard: every other one is in `ahead`
    ahead.push_back({s, call});
  }
  return ahead;
}

void DataLoader::reset() {
  if (shard_ != 0) load(0);
  pos_ = 0;
  advance_ = false;
}

void DataLoader::seek(size_t shard, int64_t position) {
  if (shard >= files_.size())
    throw Error(pattern_ + ": seek: shard " + std::to_string(shard) + " is out of range (" +
                std::to_string(files_.size()) + " shards)");
  // Check everything before touching the state, so a bad seek leaves the loader usable.
  std::vector<uint16_t> tokens;
  FileId id{};
  int64_t count = 0;
  if (shard == shard_) {
    count = tokens_in_current_shard();
  } else {
    id = file_id(files_[shard]);  // (before the read, as in load())
    count = open_shard(files_[shard], {B_, T_, world_size_}, &tokens);
  }
  if (position < 0 || position > count - step_ - 1)  // (not position + step_ + 1: it may overflow)
    throw Error(files_[shard] + ": seek: position " + std::to_string(position) +
                " leaves no room for one step of " + std::to_string(step_ + 1) + " tokens in " +
                std::to_string(count) + " tokens");
  if (shard != shard_) adopt(shard, id, std::move(tokens));  // (a resume's own read: no change to warn of)
  pos_ = position;
  advance_ = false;
}

}  // namespace kiln
