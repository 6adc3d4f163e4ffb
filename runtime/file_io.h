// Whole-file reads and crash-safe writes.
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// Reads a whole file; kiln::Error naming it on failure. A device that is not a terminal is
// refused, as check_not_a_device does. With `max_bytes`, reading stops once more than that has
// come (a pipe without end is not read to its end): more than max_bytes bytes means "too large".
std::vector<uint8_t> read_file(const std::string& path, size_t max_bytes = SIZE_MAX);

// The first `n` bytes of a regular file (fewer when it is shorter); "" when it is no regular file
// or cannot be read. For telling what kind of file a name holds before reading or replacing it.
std::string read_head(const std::string& path, size_t n);
// Whether a file's first `n` bytes look like text (a document, a spec or IR given in place of a
// binary file): some bytes, and no control bytes but tabs and line ends (UTF-8's are >= 0x80).
bool looks_like_text(const uint8_t* bytes, size_t n);
// The last n bytes of the regular file at `path` (all of it when shorter; "" when it cannot be read).
std::string read_tail(const std::string& path, size_t n);

// open(path, flags) for an output written in place (a FIFO, a device, a log appended to): a
// FIFO that nothing reads is waited on for 5 s at most, then fails with ENXIO. O_CLOEXEC added.
int open_in_place(const std::string& path, int flags, mode_t mode = 0644);
// fsync of a folder, so that the names made or removed in it last through a power cut. Best
// effort: some file systems refuse it. "" is the working folder.
void sync_folder(const std::string& folder);
// strerror, but a FIFO without a reader (ENXIO from open_in_place) said as such.
std::string open_error(const std::string& path, int error);

// For an output named by a FIFO that must not be refused for want of a reader within
// open_in_place's 5 s (a run's weights at its end): opens the FIFO for writing once a reader has
// it open, waiting (with a line on stderr) until then or until give_up() says to stop. The open
// descriptor (-1 if none, or if `path` is no FIFO) keeps the reader from seeing an end of file
// before the output is written through another; close it after.
int wait_for_reader(const std::string& path, const std::function<bool()>& give_up);
bool is_fifo(const std::string& path);  // (through links)

// A regular file open for reading at offsets (shards, weights, checkpoints: read by their size,
// seeked in or mapped). Opened O_NONBLOCK, so that a FIFO is refused at once instead of waiting
// for a writer. kiln::Error names the path: "PATH: cannot open: REASON", "PATH: is a folder; give
// the WHAT", "PATH: not a regular file (a pipe or a device?); give the WHAT".
class RegularFile {
 public:
  RegularFile(const std::string& path, const std::string& what);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // Exactly n bytes at `offset`: "PATH: reading PART: unexpected end of file" when fewer are there.
  void read_at(void* dst, size_t n, uint64_t offset, const std::string& part) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Refuses an input that is a character device other than a terminal (/dev/zero and
// /dev/urandom never end; /dev/null holds nothing): kiln::Error "PATH: is a device, not a file".
// A missing or unreadable path passes, for the reader's own message.
void check_not_a_device(const std::string& path);

// Flushes stdout; kiln::Error "stdout: write failed" when anything written there was lost (a
// full disk, a closed pipe), so that cut-short output does not pass for whole.
void flush_stdout();

// The name a writer of this process uses for `path` before renaming: path + ".tmp.<host>.<pid>"
// (a file name too long for that keeps its first bytes before the suffix).
// The host is in it so that processes on machines sharing a folder (a network file system)
// neither collide on a pid nor judge each other's temporaries by a pid that is not theirs.
std::string temporary_path(const std::string& path);

// For a temporary's name after ".tmp." ("<host>.<pid>", or "<pid>" as Kiln wrote before the host
// was added, taken as this machine's): true when its writer ran on this machine and no longer
// runs, so the file is left over from a killed process and may go.
bool temporary_is_orphaned(const std::string& suffix);

// True when the two names reach one file, whether or not it exists yet: another name, a link to
// it, "./x", "sub/../x", a linked folder on the way (and a hard link, when both exist).
bool same_place(const std::string& a, const std::string& b);

// Refuses an output that names one of a command's inputs (the same file by another name or link
// counts too): kiln::Error "FLAG: OUTPUT is WHAT; it would be overwritten". `inputs` holds (what,
// path) pairs, such as {"--init's weights", "w.safetensors"}; empty paths are skipped.
void refuse_overwriting(const std::string& flag, const std::string& output,
                        const std::vector<std::pair<std::string, std::string>>& inputs);

// The file a symbolic link names (relative to the link's folder; through a few links at most),
// whether or not it exists yet; `path` itself when it is no link.
std::string link_target(const std::string& path);

// Where an output file will take disk space: the file system (st_dev) of the folder its name
// (through links) lies in, and the bytes free there to this process (root's reserve counts for root). Nothing (nullopt)
// where that cannot be told: the folder is missing, the name is a FIFO or device (written in
// place, no space taken), or the file system reports no size (some network and FUSE ones).
struct FreeSpace {
  uint64_t device = 0, bytes = 0;
};
std::optional<FreeSpace> free_space_for(const std::string& path);
// The same for files written into `folder` itself (a checkpoint folder's, whatever links in it name).
std::optional<FreeSpace> free_space_in(const std::string& folder);

// The folders on the way to `folder` (itself included) that do not exist yet, outermost first:
// what making it creates ("a/../b" makes a and b). A link, dangling or not, counts as there.
std::vector<std::string> missing_folders(const std::string& folder);
// Removes those of `folders` that are (still) empty, innermost first: a failed command's
// folders go again, and one that has since taken a file stays.
void remove_empty_folders(const std::vector<std::string>& folders);

// How an output's symbolic link is taken. Follow: the file it names is written. Replace: the link
// itself is replaced by the file, dangling or not; for the files Kiln keeps in a folder of its own
// (a checkpoint folder's), so that nothing outside the folder is written.
enum class Links { Follow, Replace };

// Before any long work: an output file can be written where it is named (through links). Not a
// folder; an existing file opens for writing; and unless `append` (a log opened to append), a
// file can be created beside it for write_file_atomic's rename (a probe, removed at once). A
// device or pipe only has to open, and a FIFO is not opened (its reader would take that for the
// whole output). kiln::Error "FLAG: PATH: ..." otherwise.
// With Links::Replace, a link at `path` counts as no file: the folder it lies in is checked.
void check_output_file(const std::string& flag, const std::string& path, bool append = false,
                       Links links = Links::Follow);
// Its first check alone, for an output that must not be opened beforehand (a FIFO would hand its
// reader an end of file): the folder the name (through links) lies in exists. Returns that name.
std::string check_output_folder(const std::string& flag, const std::string& path);

// Atomically replaces `path` with the concatenation of `pieces` (pointer, size): write to
// temporary_path(path), fsync, rename, fsync the directory. On failure the temporary file is
// removed and `path` is left as it was. A symbolic link is followed (the file it names is
// replaced, the link stays); an existing path that is not a regular file or a folder (a device
// such as /dev/null, a FIFO) is written in place, since a rename would replace it with a file.
// Links::Replace: see Links.
void write_file_atomic(const std::string& path,
                       const std::vector<std::pair<const void*, size_t>>& pieces, int mode = 0644,
                       Links links = Links::Follow);

// A process that a signal ends while write_file_atomic writes would leave its temporary behind.
// The temporary being written is kept where a handler can reach it: remove_pending_temporary()
// (async-signal-safe) unlinks it. remove_temporaries_on_signals() installs handlers for SIGINT,
// SIGTERM, SIGHUP and SIGQUIT (not over one the process was started ignoring) that do so and then
// end the process by the signal, as it would have ended; a tool's main() calls it first (start_process).
// Handlers of one's own (the training loop's, kilnc's compiler guard) call remove_pending_temporary
// when they end the process, and only then: sections started afterwards never finish.
void remove_pending_temporary();
void remove_temporaries_on_signals();
// What a tool's main() does first: descriptors 0-2 that the process was started without are
// opened on /dev/null (else the next file opened takes one, and messages land in it); SIGXFSZ is
// ignored (a file-size limit fails the write with EFBIG, reported, and the temporary removed);
// remove_temporaries_on_signals().
void start_process();

// A staging folder a command fills with files (no subfolders) before it moves them into place:
// remove_pending_temporary() also unlinks its files and removes it, and `created_parent` too
// when that is given (the output folder the command made) and then empty. One at a time.
void track_staging_folder(const std::string& folder, const std::string& created_parent);
void untrack_staging_folder();

// While one lives, SIGINT, SIGTERM, SIGHUP and SIGQUIT wait (on this thread): for work that a
// signal must not cut in half, such as creating a file a handler would remove, or swapping a set
// of files into place. They are delivered when it goes. A handler on another thread that ends the
// process calls settle_signals_held() first: it waits for the sections that are running, and a
// section that starts after it waits for the end instead of running (as in Dekker's algorithm,
// either the handler sees what a section did or the section never starts). Sections nest.
class SignalsHeld {
 public:
  SignalsHeld();
  ~SignalsHeld();
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;
  // The mask before the section, for a child process started within it (in a nested section
  // that is the outer one's, with the signals blocked: start children from an outer section).
  const sigset_t& previous_mask() const { return previous_; }

 private:
  sigset_t previous_;
};

// For a handler about to end the process (async-signal-safe); remove_pending_temporary() calls it.
void settle_signals_held();

}  // namespace kiln
