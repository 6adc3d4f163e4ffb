// What a training run writes besides its weights in memory, checked before the first step:
// the checkpoint folder (made and locked for the run), the --log file (appended a whole line at a
// time), and outputs that must not replace the run's inputs or a user's other files.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/trainer.h"

namespace kiln {

class DataLoader;
class Module;

// The folders a run made for --checkpoint-dir: when it ends, those still empty go (it failed
// before its first checkpoint).
struct MadeFolders {
  std::vector<std::string> folders;  // outermost first (missing_folders)
  int lock = -1;  // the checkpoint folder, opened and locked (flock) while this run writes there
  std::string dir;  // (its path)
  // --resume into a folder of checkpoints that cannot take files (a read-only mount): why, for the
  // trainer to refuse a run with steps left; a finished run requeued there writes nothing.
  std::string unwritable;
  // Before each checkpoint: a folder removed (rm -rf) or replaced while the run trains is made
  // again, and locked again, so that another run cannot take it meanwhile unseen (with a
  // warning; without, where a signal removed it before the first step's end:
  // StopSignals::remove_on_signal). kiln::Error when another run holds the folder now there.
  void keep_lock(const std::string& dir, bool warn = true);
  MadeFolders() = default;
  MadeFolders(const MadeFolders&) = delete;
  MadeFolders& operator=(const MadeFolders&) = delete;
  ~MadeFolders();
};

// Where the run will write, checked before the first step rather than found unusable after the
// last: --save's and --dump-grads' names are not llm.c's (.bin), each output can be
// created where it is named, and the checkpoint folder is (or can be made) a folder that takes
// files. A fresh run (no --resume) into a folder of checkpoints would prune them: refused. Only the
// root rank writes.
void check_output_paths(const TrainOptions& o, bool root, MadeFolders& made);

// Drops the lines the log at `path` already holds whole in its last 64 MiB: a checkpoint's lines
// that an earlier run resumed from it wrote (a requeued job, or one killed before its next
// checkpoint) are not written again.
void drop_logged_lines(const std::string& path, std::vector<std::string>& lines);

// The whole "step" of one log line, a JSON object; none for other lines.
std::optional<int64_t> log_record_step(std::string_view line);

// The "step" of the last record in the log at `path` that has one (read from its last MiB), or -1.
int64_t last_logged_step(const std::string& path);

// The outputs must not overwrite the run's inputs (the data, --init; the executable and module
// were refused by check_output_paths) or one another.
void check_outputs_spare_inputs(const TrainOptions& o, const DataLoader& data, const DataLoader* val);

// The free space each output's file system has, checked against what the run will write there
// (weights, gradients, checkpoints; outputs sharing a file system add up): kiln::Error where not
// even the first write would fit, so that no run trains for hours and then cannot save; a
// warning where the checkpoints kept by the end (with --keep, from `first_step`) would not.
void check_output_space(const TrainOptions& o, const Module& m, int64_t first_step, int keep);

// The --log file, opened at its first line (a run that fails before its first step leaves no
// empty log) and appended to a line at a time. A line is written whole or not at all: a write
// that fails (a full disk) is cut off again, so no later append follows half a record. An earlier
// run's last line that was cut short (a killed run) is ended before this run's first.
class LogFile {
 public:
  explicit LogFile(std::string path) : path_(std::move(path)) {}
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  // 0, or the error (errno) that kept the line from being written; the file is then as it was.
  // EWOULDBLOCK: another run locked the log between this run's check and its first line.
  // A log removed or moved away since the last line is started anew at its name (with a warning).
  int append(const std::string& line);
  // What append's error means for the user: EWOULDBLOCK is another run holding the log's lock.
  std::string describe(int error) const;

 private:
  std::string path_;
  int fd_ = -1;
  bool newline_first_ = false;
};


}  // namespace kiln
