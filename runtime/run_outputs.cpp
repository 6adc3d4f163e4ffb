// The outputs of a training run, checked and written (see run_outputs.h).
#include "runtime/run_outputs.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>

#include "runtime/checkpoint.h"
#include "runtime/data_loader.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/params.h"
#include "runtime/replaceable_output.h"

namespace kiln {

namespace {

// An existing file starts as a training log does, with a JSON record ({"...), whose first line,
// when it ends within the first 64 KiB, is an object with "step": appending to it loses nothing,
// and a mistyped --log must not end weights, data or a checkpoint with JSON lines. (A first line
// longer than that holds samples; one cut short was a killed run's.) An empty file, a device or
// a FIFO passes.
void check_appendable_log(const std::string& path) {
  // Another run appending to it holds its lock (LogFile takes it with the first line): the two
  // runs' steps would interleave in one log, which plot would draw as one run.
  if (const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); fd >= 0) {
    struct stat st {};
    const bool held = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_SH | LOCK_NB) != 0 &&
                      errno == EWOULDBLOCK;
    ::close(fd);
    if (held)
      throw Error("--log: " + path + ": another run is appending to it (it holds the log's lock); give another file, "
                  "or wait for that run to end");
  }
  const std::string head = read_head(path, 64 << 10);
  if (head.empty()) return;
  const size_t end = head.find('\n');
  bool log = head.compare(0, 2, "{\"") == 0;
  if (log && end != std::string::npos) {
    const auto j = nlohmann::json::parse(head.substr(0, end), nullptr, false);
    log = !j.is_discarded() && j.is_object() && j.contains("step");
  }
  if (log) return;
  // Say what it is where Kiln knows (weights, data, a checkpoint or the `latest` naming one).
  std::string kind = file_kind(path);
  try {
    if (kind.empty() && !checkpoint_named_by(path).empty())
      kind = "a checkpoint folder's 'latest' (the name of the checkpoint --resume reads)";
  } catch (const Error&) {  // (a `latest` naming no checkpoint: the plain message)
  }
  if (!kind.empty()) throw Error("--log: " + path + ": is " + kind + ", and the log is appended to: name another file");
  throw Error("--log: " + path + ": holds something other than a training log (its first line is no JSON record "
              "with \"step\"), and the log is appended to: name another file");
}

// Whether `pattern` (a --data glob) matches the file `path` will be: compared as written where
// both are relative or both absolute, else both made absolute (the working folder's own glob
// characters escaped).
bool pattern_reaches(const std::string& pattern, const std::string& path) {
  namespace fs = std::filesystem;
  if (pattern.find_first_of("*?[") == std::string::npos) return false;  // a file's name: same_place's
  std::string p = fs::path(pattern).lexically_normal().string(), f = fs::path(path).lexically_normal().string();
  if (fs::path(pattern).is_absolute() != fs::path(path).is_absolute()) {
    std::error_code ec;
    std::string cwd = fs::current_path(ec).string(), escaped;
    if (ec) return false;
    for (char c : cwd) {
      if (c == '*' || c == '?' || c == '[' || c == '\\') escaped += '\\';
      escaped += c;
    }
    if (!fs::path(pattern).is_absolute()) p = (fs::path(escaped) / p).lexically_normal().string();
    if (!fs::path(path).is_absolute()) f = (fs::path(cwd) / f).lexically_normal().string();
  }
  return ::fnmatch(p.c_str(), f.c_str(), FNM_PATHNAME | FNM_PERIOD) == 0;
}

// An output a --data or --val-data glob matches would be read as a shard by the next run with
// the same command (which then stops at its header): refused before the first step.
void check_outputs_outside_data(const TrainOptions& o) {
  std::vector<std::pair<std::string, std::string>> outputs = {{"--save", o.save}, {"--dump-grads", o.dump_grads}, {"--log", o.log}};
  if (!o.checkpoint_dir.empty())
    for (const char* name : {"ckpt_00000001.kiln-ckpt", "latest"})
      outputs.push_back({"--checkpoint-dir", (std::filesystem::path(o.checkpoint_dir) / name).string()});
  for (const auto& [flag, path] : outputs) {
    if (path.empty() || path == "-") continue;
    const bool folder = flag == "--checkpoint-dir";
    for (const auto& [what, patterns] : {std::pair{"--data", &o.data}, {"--val-data", &o.val_data}})
      for (const std::string& pattern : *patterns)
        if (pattern_reaches(pattern, path))
          throw Error(flag + ": " + (folder ? o.checkpoint_dir + ": its checkpoints (" + path + ") match " : path + " matches ") +
                      what + "'s pattern '" + pattern + "': a later run with it would read " +
                      (folder ? "them as token shards; give another folder" : "the file as a token shard; name it otherwise") +
                      ", or narrow the pattern");
  }
}

// The checkpoint folder opened and locked (flock) for this run: its descriptor, or -1 with errno
// EWOULDBLOCK when another run holds the lock (other failures give a descriptor without a lock,
// or -1: the checkpoint's own writes report those).
int lock_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    errno = EWOULDBLOCK;
    return -1;
  }
  return fd;
}

}  // namespace

// Where the run will write, checked before the first step rather than found unusable after the
// last: --save's and --dump-grads' names are not llm.c's (.bin), each output can be
// created where it is named, and the checkpoint folder is (or can be made) a folder that takes
// files. A fresh run (no --resume) into a folder of checkpoints would prune them: refused. Only the
// root rank writes.
void check_output_paths(const TrainOptions& o, bool root, MadeFolders& made) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!root) return;  // (other ranks' machines may lack rank 0's folders)
  // The checkpoint folder first: the other outputs may be named inside it.
  if (!o.checkpoint_dir.empty()) {
    fs::path dir = o.checkpoint_dir;
    if (!dir.has_filename()) dir = dir.parent_path();  // "ck/"
    if (std::error_code link; fs::is_symlink(dir, link) && !fs::exists(dir, ec))
      throw Error("--checkpoint-dir: " + o.checkpoint_dir + ": is a symbolic link to " + fs::read_symlink(dir, link).string() +
                  (ec.value() == ELOOP ? ", one of a loop of links that reach no folder: give another"
                                       : ", which does not exist: make that folder, or give another"));
    // A checkpoint named where its folder goes (to go on from that one): say how.
    if (std::error_code file; fs::is_regular_file(dir, file) && is_checkpoint_file_name(dir.filename().string())) {
      const std::string folder = dir.has_parent_path() ? dir.parent_path().string() : ".";
      throw Error("--checkpoint-dir: " + o.checkpoint_dir + ": is a checkpoint, not a folder: give its folder " + folder +
                  " (--resume goes on from the checkpoint its latest names: write " + dir.filename().string() +
                  " into " + (fs::path(folder) / "latest").string() + " to go on from this one; or start afresh from its weights with --init " +
                  o.checkpoint_dir + " and another --checkpoint-dir)");
    }
    made.folders = missing_folders(dir.string());
    fs::create_directories(o.checkpoint_dir, ec);
    if (std::error_code is; !fs::is_directory(o.checkpoint_dir, is))
      throw Error("--checkpoint-dir: " + o.checkpoint_dir + ": is not a folder and cannot be made one" +
                  (ec ? ": " + ec.message() : is ? ": " + is.message() : ""));
    try {
      check_output_file("--checkpoint-dir", (fs::path(o.checkpoint_dir) / "latest").string(), false, Links::Replace);
    } catch (const Error& e) {
      // (Deferred only where the folder takes no files at all and holds a checkpoint to resume:
      // any other problem with `latest` is said now.)
      std::optional<std::string> found;
      if (o.resume && ::access(o.checkpoint_dir.c_str(), W_OK) != 0) try {
        found = latest_checkpoint(o.checkpoint_dir);
      } catch (const Error&) {
      }
      if (!found) throw;
      made.unwritable = e.what();
    }
    // Two runs writing one folder would prune each other's checkpoints and swap `latest`: the
    // folder is locked for the run (the kernel lets go when the process ends, however it ends).
    made.lock = lock_folder(o.checkpoint_dir);
    made.dir = o.checkpoint_dir;
    if (made.lock < 0 && errno == EWOULDBLOCK) {
      made.folders.clear();  // (the other run's folder now, though this one made it)
      throw Error("--checkpoint-dir: " + o.checkpoint_dir + ": another run is writing checkpoints there (it holds the "
                  "folder's lock); wait for it to end, or give another folder");
    }
    if (!o.resume)
      if (auto found = latest_checkpoint(o.checkpoint_dir))
        throw Error("--checkpoint-dir: " + o.checkpoint_dir + " already holds checkpoints (the latest: " + *found +
                    "); give --resume to go on from them, or another folder (a new run would overwrite latest "
                    "and mix its checkpoints with them)");
  }
  for (const auto& [flag, path] : {std::pair{"--save", o.save}, {"--dump-grads", o.dump_grads}, {"--log", o.log}}) {
    if (path.empty()) continue;
    // A checkpoint's or latest's name in the checkpoint folder: the output would replace a
    // checkpoint (perhaps the one resumed from), or a save would replace or prune the output.
    const fs::path target = link_target(path);
    if (!o.checkpoint_dir.empty() && is_checkpoint_file_name(target.filename().string()) &&
        fs::equivalent(target.has_parent_path() ? target.parent_path() : ".", o.checkpoint_dir, ec))
      throw Error(std::string(flag) + ": " + path + ": is a name the checkpoints in --checkpoint-dir " + o.checkpoint_dir +
                  " use; name the output otherwise");
    if (std::string(flag) != "--log" && path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0)
      throw Error(std::string(flag) + ": " + path + ": writes Hugging Face safetensors, but .bin names llm.c's model "
                  "and token files (llm.c's tools would misread it); name it .safetensors");
    // The running program and its module (which would only say "Text file busy" when opened below).
    refuse_overwriting(flag, path, o.self);
    check_output_file(flag, path, std::string(flag) == "--log");  // the log is appended to
  }
}

// Drops the lines the log at `path` already holds whole in its last 64 MiB: a checkpoint's lines
// that an earlier run resumed from it wrote (a requeued job, or one killed before its next
// checkpoint) are not written again.
void drop_logged_lines(const std::string& path, std::vector<std::string>& lines) {
  const std::string tail = "\n" + read_tail(path, size_t(64) << 20);
  lines.erase(std::remove_if(lines.begin(), lines.end(),
                             [&](const std::string& line) { return tail.find("\n" + line + "\n") != std::string::npos; }),
              lines.end());
}

std::optional<int64_t> log_record_step(std::string_view line) {
  const auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
  if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) return j["step"].get<int64_t>();
  return std::nullopt;
}

int64_t last_logged_step(const std::string& path) {
  const std::string tail = read_tail(path, size_t(1) << 20);
  for (size_t end = tail.size(); end > 0;) {
    const size_t start = tail.rfind('\n', end - 1);
    const size_t first = start == std::string::npos ? 0 : start + 1;
    // (the first line of a tail cut mid-line is no JSON, and is passed over)
    if (const auto step = log_record_step(std::string_view(tail).substr(first, end - first))) return *step;
    if (start == std::string::npos) break;
    end = start;
  }
  return -1;
}

// The outputs must not overwrite the run's inputs (the data, --init; the executable and module
// were refused by check_output_paths) or one another.
void check_outputs_spare_inputs(const TrainOptions& o, const DataLoader& data, const DataLoader* val) {
  std::vector<std::pair<std::string, std::string>> inputs = {{"--init's weights", o.init}};
  for (const std::string& f : data.files()) inputs.push_back({"a --data shard", f});
  if (val)
    for (const std::string& f : val->files()) inputs.push_back({"a --val-data shard", f});
  const std::pair<std::string, std::string> outputs[] = {{"--save", o.save}, {"--dump-grads", o.dump_grads}, {"--log", o.log}};
  for (size_t i = 0; i < std::size(outputs); ++i) {
    std::vector<std::pair<std::string, std::string>> others = inputs;
    for (size_t k = 0; k < i; ++k) others.push_back({outputs[k].first + "'s file", outputs[k].second});
    refuse_overwriting(outputs[i].first, outputs[i].second, others);
  }
  check_outputs_outside_data(o);
  // Then what an existing output holds (after the inputs, whose names say more).
  if (!o.log.empty()) check_appendable_log(o.log);
  for (const auto& [flag, path] : {std::pair{"--save", o.save}, {"--dump-grads", o.dump_grads}})
    if (!path.empty()) check_replaceable(flag, path, Writes::Safetensors);
}

namespace {

// "1.5 GiB", "3.2 MiB", "12.0 KiB", "512 bytes".
std::string bytes_text(uint64_t n) {
  char text[32];
  if (n < 1024) std::snprintf(text, sizeof text, "%llu bytes", (unsigned long long)n);
  else if (n < (1ull << 20)) std::snprintf(text, sizeof text, "%.1f KiB", double(n) / 1024.0);
  else if (n < (1ull << 30)) std::snprintf(text, sizeof text, "%.1f MiB", double(n) / double(1 << 20));
  else std::snprintf(text, sizeof text, "%.1f GiB", double(n) / double(1ull << 30));
  return text;
}

}  // namespace

void check_output_space(const TrainOptions& o, const Module& m, int64_t first_step, int keep) {
  namespace fs = std::filesystem;
  // What each output takes: `first` before the run can go on (a checkpoint's temporary sits
  // beside the older ones until it is renamed), `all` by the run's end (the checkpoints written,
  // less those pruned, and one temporary).
  struct Need {
    std::string flag, path, what;
    uint64_t first, all;
  };
  std::vector<Need> needs;
  // (with its JSON header: a line of about 100 bytes a tensor)
  const uint64_t tensors = m.fb().parameters()->size(), weights = saved_parameter_bytes(m) + 1024 + 192 * tensors;
  if (!o.checkpoint_dir.empty() && first_step < o.steps) {
    const uint64_t one = checkpoint_data_bytes(m) + 4096 + 320 * tensors;
    // Written every --checkpoint-every steps and after the last.
    const int64_t every = o.checkpoint_every;
    const int64_t written = every > 0 ? o.steps / every - first_step / every + (o.steps % every != 0 ? 1 : 0) : 1;
    const int64_t held = int64_t(list_checkpoints(o.checkpoint_dir).size());
    const int64_t peak = keep > 0 ? std::min<int64_t>(keep, held + written - 1) + 1 : held + written;
    const uint64_t more = uint64_t(std::max<int64_t>(1, peak - held));
    needs.push_back({"--checkpoint-dir", o.checkpoint_dir,
                     more > 1 ? "its checkpoints, " + bytes_text(one) + " each" : "a checkpoint", one, one * more});
  }
  if (!o.save.empty()) needs.push_back({"--save", o.save, "the weights", weights, weights});
  if (!o.dump_grads.empty()) needs.push_back({"--dump-grads", o.dump_grads, "the gradients", weights, weights});
  if (!o.log.empty() && first_step < o.steps) {
    // About 160 bytes a step's line, and a sampled token's: up to 6 as an id, about 12 as text (an
    // early model's rare tokens, JSON-escaped). The log never stops the start (first: 0).
    const int64_t sampled = o.sample_every > 0 ? (o.steps - first_step + o.sample_every - 1) / o.sample_every + 1 : 0;
    const uint64_t lines = uint64_t(o.steps - first_step) * 160 +
                           uint64_t(sampled * o.sample.num_samples * (int64_t(o.sample_prompt.size()) + o.sample.max_new_tokens) *
                                    (o.sample_text ? 12 : 6));
    needs.push_back({"--log", o.log, "its lines", 0, lines});
  }
  // Outputs on one file system share its free space.
  std::vector<std::pair<FreeSpace, std::vector<const Need*>>> places;
  for (const Need& n : needs) {
    auto space = n.flag == "--checkpoint-dir" ? free_space_in(n.path) : free_space_for(n.path);
    if (!space) continue;
    // (a killed run's checkpoint temporary is removed before the first save writes there)
    if (n.flag == "--checkpoint-dir") space->bytes += stale_temporary_bytes(n.path);
    auto at = std::find_if(places.begin(), places.end(), [&](const auto& p) { return p.first.device == space->device; });
    if (at == places.end()) places.push_back({*space, {&n}});
    else at->second.push_back(&n);
  }
  for (const auto& [space, group] : places) {
    // "needs 1.6 MiB (the weights)", or each output's share where several share the file system.
    auto need = [&](bool by_end) {
      uint64_t sum = 0;
      std::string each;
      const auto counted = std::count_if(group.begin(), group.end(), [&](const Need* n) { return (by_end ? n->all : n->first) > 0; });
      for (const Need* n : group) {
        const uint64_t b = by_end ? n->all : n->first;
        if (b == 0) continue;  // (the log, before the run)
        sum += b;
        each += std::string(each.empty() ? "" : ", ") + (counted > 1 ? n->flag + " " : "") + bytes_text(b) +
                " (" + (by_end ? n->what : n->first == n->all ? n->what : "a checkpoint") + ")";
      }
      return std::pair{sum, counted == 1 ? "needs " + each : "the outputs on its file system need " + bytes_text(sum) + ": " + each};
    };
    const std::string head = group[0]->flag + ": " + group[0]->path + ": ";  // (the checkpoints first, where they are)
    if (const auto [first, text] = need(false); space.bytes < first)
      throw Error(head + text + ", but " + bytes_text(space.bytes) + " are free there (the run could not keep what it "
                  "trains); free some space, or name a place on another file system");
    if (const auto [all, text] = need(true); space.bytes < all)
      std::fprintf(stderr, "kiln: warning: %sby the run's end, %s, but %s are free there: a full disk will stop the run "
                   "%s\n", head.c_str(), text.c_str(), bytes_text(space.bytes).c_str(),
                   group[0]->flag != "--checkpoint-dir" ? "at the log line that does not fit"
                   : std::any_of(group.begin(), group.end(), [](const Need* n) { return n->flag == "--log"; })
                       ? "at a checkpoint or a log line that does not fit (the latest whole checkpoint is kept)"
                       : "at a checkpoint (the latest whole one is kept)");
  }
}

void MadeFolders::keep_lock(const std::string& dir, bool warn) {
  if (lock < 0) return;  // (not the root rank, or the folder could not be opened at the start)
  struct stat held {}, now {};
  std::error_code ec;
  if (::stat(dir.c_str(), &now) != 0) {
    std::filesystem::create_directories(dir, ec);  // (save_checkpoint would make it too, unlocked)
    if (::stat(dir.c_str(), &now) != 0) return;     // (its error is save_checkpoint's to report)
  }
  if (::fstat(lock, &held) == 0 && held.st_ino == now.st_ino && held.st_dev == now.st_dev) return;
  const int fresh = lock_folder(dir);
  if (fresh < 0 && errno == EWOULDBLOCK)
    throw Error("--checkpoint-dir: " + dir + ": the folder was removed or replaced while the run trained, and "
                "another run now writes checkpoints there (it holds the new folder's lock)");
  if (fresh < 0) return;
  ::close(lock);
  lock = fresh;
  if (warn)
    std::fprintf(stderr, "kiln: warning: --checkpoint-dir %s was removed or replaced while the run trained; its "
                 "checkpoints go on into the folder there now\n", dir.c_str());
}

MadeFolders::~MadeFolders() {
  // A folder a signal removed (StopSignals::remove_on_signal) may have been made again by another
  // run since: that one is not this run's to remove.
  bool ours = true;
  if (struct stat held {}, now {}; lock >= 0 && ::fstat(lock, &held) == 0 && ::stat(dir.c_str(), &now) == 0)
    ours = held.st_ino == now.st_ino && held.st_dev == now.st_dev;
  if (lock >= 0) ::close(lock);
  if (ours) remove_empty_folders(folders);
}

LogFile::~LogFile() {
  if (fd_ >= 0) ::close(fd_);
}

int LogFile::append(const std::string& line) {
  // A log removed or moved away (rotated) while the run appends: its lines would go on into a
  // file no name reaches. A new file at the name takes them from here on, and the run says so
  // once it is made (a folder removed with the log: the failed write says why).
  bool replaced = false;
  if (struct stat at_fd {}; fd_ >= 0 && ::fstat(fd_, &at_fd) == 0 && S_ISREG(at_fd.st_mode)) {
    struct stat at_name {};
    if (::stat(path_.c_str(), &at_name) != 0 || at_name.st_ino != at_fd.st_ino || at_name.st_dev != at_fd.st_dev) {
      ::close(fd_);
      fd_ = -1;
      replaced = true;
    }
  }
  if (fd_ < 0) {
    fd_ = open_in_place(path_, O_WRONLY | O_APPEND | O_CREAT);
    if (fd_ < 0) return errno;  // (its folder removed): the run stops as for a failed write
    const std::string last = read_tail(path_, 1);  // "" for an empty file, a FIFO or a device
    newline_first_ = !last.empty() && last != "\n";
    // Held while the run appends, so that another run given the same log refuses to start
    // (check_appendable_log). Two runs that passed that check together race here: the one that
    // locks first appends, the other writes nothing and stops (LogFile::describe says why).
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      ::close(fd_);
      fd_ = -1;
      return EWOULDBLOCK;
    }
    if (replaced)
      std::fprintf(stderr, "kiln: warning: --log %s was removed or moved while the run appended to it; a new %s "
                   "takes the lines from here on\n", path_.c_str(), path_.c_str());
  }
  const std::string text = (newline_first_ ? "\n" : "") + line + "\n";
  struct stat st {};
  const off_t before = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : -1;
  for (size_t at = 0; at < text.size();) {
    const ssize_t put = ::write(fd_, text.data() + at, text.size() - at);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      const int error = put < 0 ? errno : ENOSPC;
      // Back to the lines before (best effort: the write's error is the one to report).
      [[maybe_unused]] const int cut = before >= 0 ? ::ftruncate(fd_, before) : 0;
      return error;
    }
    at += size_t(put);
  }
  newline_first_ = false;
  return 0;
}

std::string LogFile::describe(int error) const {
  if (error == EWOULDBLOCK)
    return "another run started appending to it (it took the log's lock first); give another file, or wait for that "
           "run to end";
  return open_error(path_, error);
}

}  // namespace kiln
