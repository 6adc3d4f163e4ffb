// Training data: llm.c token shards (the files dev/data/*.py in llm.c write).
//
// A shard is a header of 256 little-endian int32 ([0] = 20240520 magic, [1] = 1 version,
// [2] = token count) followed by that many uint16 GPT-2 token ids. The loader walks the shards in
// file-name order with llm.c's unshuffled scheme (see next()). Every error is a kiln::Error
// naming the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// A path that names a file is that file (glob characters in it or not); anything else is glob(3)'s
// pattern, its matches sorted by path. kiln::Error when nothing matches, or the path is a folder.
std::vector<std::string> expand_data_pattern(const std::string& file_or_glob);

// True for the name of a staging folder (".kiln-data-prepare.tmp.HOST.PID") that a kiln-data
// prepare on this machine left when it was killed (its process is gone).
bool is_orphaned_prepare_staging(const std::string& name);
// Several patterns (a shell's expansion of an unquoted glob, or files named one by one): the
// union of their files, sorted by path, each file once (whatever its names); kiln::Error naming
// a pattern that matches nothing.
std::vector<std::string> expand_data_patterns(const std::vector<std::string>& files_or_globs);

// Writes an llm.c shard holding `tokens`; atomic (tmp file + rename).
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// Whether the file begins with an llm.c token shard's magic number (20240520).
bool starts_like_token_shard(const std::string& path);

// Reads tokens [first, first + n) of the llm.c shard at `path` (whose header was checked) into
// out; kiln::Error "PATH: reading tokens: ..." when it cannot.
void read_shard_tokens(const std::string& path, int64_t first, int64_t n, uint16_t* out);

class DataLoader {
 public:
  // Every shard's header is checked here, so a bad shard fails the run at start, not hours in.
  // A shard needs at least B*T*world_size + 1 tokens to hold a batch: shorter ones are left out
  // (skipped()), unless every one is short, which is an error.
  DataLoader(const std::string& file_or_glob, int64_t B, int64_t T, int rank = 0,
             int world_size = 1)
      : DataLoader(std::vector<std::string>{file_or_glob}, B, T, rank, world_size) {}
  DataLoader(const std::vector<std::string>& files_or_globs, int64_t B, int64_t T, int rank = 0,
             int world_size = 1);

  // Fills x[B*T] with inputs and y[B*T] with their next tokens. Rank r reads
  // buf = tokens[pos + r*B*T, pos + r*B*T + B*T + 1): x = buf[:-1], y = buf[1:]. Then
  // pos += B*T*world_size, moving to the next shard (cyclically) at pos = 0 when the next step
  // would not fit. That shard is read by the next call, not this one: a pass that ends with a
  // shard (evaluation, the last step of a run) reads no shard it will not use.
  void next(int32_t* x, int32_t* y);
  // Back to shard 0, position 0.
  void reset();

  // Where the next batch comes from, for checkpoints: seek(shard(), position()) resumes exactly.
  size_t shard() const { return advance_ ? (shard_ + 1) % files_.size() : shard_; }
  int64_t position() const { return advance_ ? 0 : pos_; }
  void seek(size_t shard, int64_t position);

  // The shards the next `batches` calls of next() will read other than the resident one, in the
  // order they first do, each once, with the index of the call (from 0) that first reads it.
  std::vector<std::pair<size_t, int64_t>> shards_ahead(int64_t batches) const;
  // Where in the shard a rank's batch starts: shard()'s position() + this.
  int64_t rank_offset() const { return int64_t(rank_) * B_ * T_; }
  // Tokens one call of next() moves on by (B*T of each rank); the ranks read one more than that.
  int64_t tokens_per_call() const { return step_; }
  // The calls of next() a shard holds from `position`: they read positions position + k s up
  // to position + k s + s (s = tokens_per_call()), and what is left after them is never read.
  int64_t calls_from(size_t shard, int64_t position) const { return (counts_[shard] - 1 - position) / step_; }

  // The shard held in memory: shard() unless the next call moves on to another.
  size_t resident_shard() const { return shard_; }
  int64_t tokens_in_current_shard() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<std::string>& files() const { return files_; }
  // Each shard's token count (from its header), and the tokens of the shard now read: what the
  // ranks of a data-parallel run compare, so that one given other data is caught.
  const std::vector<int64_t>& shard_tokens() const { return counts_; }
  const std::vector<uint16_t>& current_tokens() const { return tokens_; }  // the resident shard's
  // Every file the patterns matched, the short ones too, by its index among them: a checkpoint
  // names its shard so, since which files are left out depends on B*T and the rank count.
  const std::vector<int64_t>& all_shard_tokens() const { return all_counts_; }
  const std::vector<std::string>& all_files() const { return all_files_; }
  size_t file_index(size_t shard) const { return index_[shard]; }
  // The first shard read from file `file_index` on (cyclically), and whether it is that file.
  std::pair<size_t, bool> shard_from_file(size_t file_index) const;
  // The shards left out as too short for one step (path, tokens), and a sentence saying so ("" if none).
  const std::vector<std::pair<std::string, int64_t>>& skipped() const { return skipped_; }
  std::string skipped_note() const;
  // How many next() calls one pass over every shard makes.
  int64_t batches_per_pass() const;

 private:
  void load(size_t shard);  // reads and validates the whole shard; the only one resident
  struct FileId;
  // Makes `tokens`, read from the shard's file as `id` says it was, the resident shard.
  void adopt(size_t shard, const FileId& id, std::vector<uint16_t> tokens);

  std::string pattern_;  // the patterns as given, for messages
  std::vector<std::string> files_;
  std::vector<std::string> all_files_;  // every file matched, by its index (as all_counts_)
  int64_t B_, T_;
  int rank_, world_size_;
  int64_t step_;  // B*T*world_size: tokens consumed per next() by all ranks together
  size_t shard_ = 0;
  int64_t pos_ = 0;
  bool advance_ = false;  // shard_ is used up: the next call reads shard() from position 0
  std::vector<uint16_t> tokens_;
  std::vector<int64_t> counts_;
  std::vector<size_t> index_;        // each shard's index among every file matched
  std::vector<int64_t> all_counts_;  // the token counts of every file matched
  std::vector<std::pair<std::string, int64_t>> skipped_;
  // Each shard's file as it was when last read (device, inode, size, modification time): one
  // replaced or rewritten while the run goes on is noticed when it is read again.
  struct FileId {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator!=(const FileId& o) const {
      return dev != o.dev || ino != o.ino || size != o.size || mtime_ns != o.mtime_ns;
    }
  };
  static FileId file_id(const std::string& path);
  std::vector<FileId> ids_;
};

}  // namespace kiln
