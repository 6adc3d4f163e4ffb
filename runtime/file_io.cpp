// Whole-file reads and crash-safe writes, shared by every writer of the runtime and compiler.
#include "runtime/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "runtime/error.h"

namespace kiln {
namespace {

void write_all(int fd, const void* src, size_t n, const std::string& path) {
  auto* p = static_cast<const uint8_t*>(src);
  while (n > 0) {
    ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) throw Error(path + ": write: " + std::strerror(errno));
    p += put;
    n -= static_cast<size_t>(put);
  }
}

}  // namespace

bool is_fifo(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

int open_in_place(const std::string& path, int flags, mode_t mode) {
  // O_NONBLOCK: the open of a FIFO no one reads fails (ENXIO) instead of waiting, in a call that
  // a signal does not end. A reader that opens it within 5 s (one started after the writer) is
  // waited for, by opening again. (Another ENXIO, a socket's or a device's, is not waited on.)
  int fd;
  for (int waited_ms = 0;; waited_ms += 50) {
    while ((fd = ::open(path.c_str(), flags | O_NONBLOCK | O_CLOEXEC, mode)) < 0 && errno == EINTR) {
    }
    if (fd >= 0 || errno != ENXIO || waited_ms >= 5000 || !is_fifo(path)) break;
    ::usleep(50 * 1000);
  }
  if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // writes may wait for the reader
  return fd;
}

int wait_for_reader(const std::string& path, const std::function<bool()>& give_up) {
  if (!is_fifo(path)) return -1;
  int fd = -1;
  for (bool told = false; (fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0 && !give_up();) {
    if (errno != ENXIO && errno != EINTR) break;
    if (!told && errno == ENXIO)
      std::fprintf(stderr, "kiln: %s is a pipe that nothing reads yet: waiting for a reader (Ctrl-C or SIGTERM gives up)\n",
                   path.c_str()), told = true;
    ::usleep(100 * 1000);
  }
  return fd;
}

// The temporaries of `path` ("PATH.tmp.HOST.PID") that writers killed on this host left
// (SIGKILL, a power cut: up to a model's weights each) go when `path` is written again.
static void remove_orphaned_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  // Names as temporary_path makes them on this host ("NAME.tmp.HOST.", then a pid), shortened
  // names too; never a name without the host, which could be a file of the user's.
  const std::string mine = fs::path(temporary_path(path)).filename().string();
  const std::string prefix = mine.substr(0, mine.rfind('.') + 1);
  const std::string host = prefix.substr(prefix.rfind(".tmp.") + 5);  // "HOST."
  std::error_code ec;
  const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code rm;
    if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
        it->symlink_status(rm).type() == fs::file_type::regular &&
        temporary_is_orphaned(host + name.substr(prefix.size())))
      fs::remove(it->path(), rm);
  }
}

void sync_folder(const std::string& folder) {
  if (const int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::string open_error(const std::string& path, int error) {
  return error == ENXIO && is_fifo(path) ? "a pipe that nothing reads (no reader came within 5 s)" : std::strerror(error);
}

namespace {

// gethostname() as a file-name part: letters, digits, '-' and '_' kept, anything else '_'
// (a dot would blur where the pid starts). "host" when it is unknown.
const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return std::string("host");
    std::string h(buf);
    for (char& c : h)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
    return h.substr(0, 64);
  }();
  return name;
}

const int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// The sections running (on any thread), and whether a handler is ending the process.
std::atomic<int> g_sections{0}, g_ending{0};
// This thread's sections: one nested in another goes on, since the handler waits for the outer.
thread_local int t_depth = 0;

}  // namespace

SignalsHeld::SignalsHeld() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kCleanupSignals) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, &previous_);
  g_sections.fetch_add(1);
  if (t_depth == 0 && g_ending.load()) {  // a handler on another thread is ending the process: let it
    g_sections.fetch_sub(1);
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    for (;;) ::pause();
  }
  ++t_depth;
}

SignalsHeld::~SignalsHeld() {
  --t_depth;
  g_sections.fetch_sub(1);
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

void settle_signals_held() {
  g_ending.store(1);
  while (g_sections.load() > 0) {
  }
}

namespace {

// The temporary write_file_atomic is writing (one writer at a time holds the slot; another
// thread's concurrent write is not tracked), for a signal handler to remove. It is claimed,
// created and let go in sections (SignalsHeld), so that a handler on another thread never reads
// a name being replaced, nor unlinks one an open() then creates.
char g_pending[4096];
std::atomic<bool> g_pending_set{false};
std::atomic<bool> g_pending_claimed{false};

// Claims the slot for `tmp` (false when another write holds it or the name does not fit).
bool track_temporary(const std::string& tmp) {
  if (tmp.size() >= sizeof g_pending || g_pending_claimed.exchange(true)) return false;
  std::memcpy(g_pending, tmp.c_str(), tmp.size() + 1);
  g_pending_set.store(true);
  return true;
}
void untrack_temporary(bool tracked) {
  if (!tracked) return;
  SignalsHeld held;
  g_pending_set.store(false);
  g_pending_claimed.store(false);
}

// A staging folder of files (kiln-data prepare's shards before they are swapped in) and the
// output folder it lies in when the command created that, for a signal handler to remove.
char g_staging[4096], g_staging_parent[4096];
std::atomic<bool> g_staging_set{false};

// Async-signal-safe (system calls only): unlinks the folder's files, then the folder, then the
// parent if it is empty. Subfolders stay, and with them the folder.
void remove_staging_folder() {
  if (!g_staging_set.load()) return;
  const int fd = ::open(g_staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    // Passes until one removes nothing: unlinking while the listing is read may skip names.
    for (bool removed = true; removed;) {
      removed = false;
      ::lseek(fd, 0, SEEK_SET);
      alignas(8) char buf[4096];
      for (ssize_t n; (n = ::getdents64(fd, buf, sizeof buf)) > 0;)
        for (ssize_t at = 0; at < n;) {
          const auto* d = reinterpret_cast<const struct dirent64*>(buf + at);
          at += d->d_reclen;
          if (d->d_type != DT_DIR && ::unlinkat(fd, d->d_name, 0) == 0) removed = true;
        }
    }
    ::close(fd);
  }
  ::rmdir(g_staging);
  if (g_staging_parent[0]) ::rmdir(g_staging_parent);
}

void remove_temporary_and_end(int sig) {  // async-signal-safe
  remove_pending_temporary();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void remove_pending_temporary() {
  settle_signals_held();
  if (g_pending_set.load()) ::unlink(g_pending);
  remove_staging_folder();
}

void track_staging_folder(const std::string& folder, const std::string& created_parent) {
  if (folder.size() >= sizeof g_staging || created_parent.size() >= sizeof g_staging_parent)
    throw Error(folder + ": the path is too long to be removed on a signal");
  SignalsHeld held;
  g_staging_set.store(false);
  std::memcpy(g_staging, folder.c_str(), folder.size() + 1);
  std::memcpy(g_staging_parent, created_parent.c_str(), created_parent.size() + 1);
  g_staging_set.store(true);
}

void untrack_staging_folder() {
  SignalsHeld held;
  g_staging_set.store(false);
}

namespace {
// The process's umask, read once (umask() can only be read by setting it).
mode_t process_umask() {
  static const mode_t mask = [] {
    const mode_t m = ::umask(022);
    ::umask(m);
    return m;
  }();
  return mask;
}
}  // namespace

void start_process() {
  // A descriptor among 0-2 that the process was started without would be the next file opened
  // (a log, weights), and stdout's or stderr's lines would be written into it.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int null = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null >= 0 && null != fd) {
        ::dup2(null, fd);
        ::close(null);
      }
    }
  // A file-size limit (ulimit -f) then fails the write with EFBIG, which is reported and its
  // temporary removed, instead of ending the process with SIGXFSZ.
  ::signal(SIGXFSZ, SIG_IGN);
  (void)process_umask();  // read before any thread could create a file meanwhile
  remove_temporaries_on_signals();
}

void remove_temporaries_on_signals() {
  struct sigaction sa{};
  sa.sa_handler = remove_temporary_and_end;
  sigemptyset(&sa.sa_mask);
  for (int sig : kCleanupSignals) {
    struct sigaction previous{};
    sigaction(sig, nullptr, &previous);
    if (previous.sa_handler == SIG_IGN) continue;  // nohup: stays ignored
    sigaction(sig, &sa, nullptr);
  }
}

std::string temporary_path(const std::string& path) {
  const std::string suffix = ".tmp." + host_name() + "." + std::to_string(::getpid());
  // A name near the file system's limit (255 bytes) would leave no room for the suffix: such a
  // name's temporary keeps only its first bytes.
  const size_t slash = path.rfind('/'), start = slash == std::string::npos ? 0 : slash + 1;
  if (path.size() - start + suffix.size() <= 255) return path + suffix;
  return path.substr(0, start + (255 - std::min<size_t>(suffix.size(), 255))) + suffix;
}

std::string link_target(const std::string& given) {
  std::string path = given;
  struct stat st {};
  for (int hops = 0; hops < 8 && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode); ++hops) {
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
    if (ec) break;
    path = (target.is_absolute() ? target : std::filesystem::path(path).parent_path() / target).string();
  }
  return path;
}

std::optional<FreeSpace> free_space_for(const std::string& path) {
  const std::filesystem::path target = link_target(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return std::nullopt;  // FIFO, device
  return free_space_in(target.has_parent_path() ? target.parent_path().string() : ".");
}

std::optional<FreeSpace> free_space_in(const std::string& folder) {
  struct stat st {};
  struct statvfs fs {};
  if (::stat(folder.c_str(), &st) != 0 || ::statvfs(folder.c_str(), &fs) != 0 || fs.f_blocks == 0) return std::nullopt;
  // (root may use the blocks a file system reserves for it; others may not)
  return FreeSpace{uint64_t(st.st_dev), uint64_t(::geteuid() == 0 ? fs.f_bfree : fs.f_bavail) * uint64_t(fs.f_frsize)};
}

std::vector<std::string> missing_folders(const std::string& folder) {
  namespace fs = std::filesystem;
  std::vector<std::string> missing;
  fs::path prefix;
  for (const fs::path& part : fs::path(folder)) {
    if (part.empty() || part == ".") continue;
    // A folder this makes is a real one: its ".." is the folder it lies in ("new/../E" is E, which
    // may be there already and is not this one's to remove).
    if (part == ".." && !missing.empty() && prefix == missing.back()) {
      prefix = prefix.parent_path();
      continue;
    }
    prefix /= part;
    std::error_code ec;
    if (part != ".." && fs::symlink_status(prefix, ec).type() == fs::file_type::not_found) missing.push_back(prefix.string());
  }
  return missing;
}

void remove_empty_folders(const std::vector<std::string>& folders) {
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) ::rmdir(it->c_str());  // (fails unless empty)
}

bool same_place(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  if (a == b) return true;
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) return fs::equivalent(a, b, ea) && !ea;
  // One (or both) is yet to be made: where each name would be created. weakly_canonical resolves
  // the links in the part that exists ("sub/.." after a linked sub) and tidies the rest.
  const fs::path pa = fs::weakly_canonical(fs::absolute(link_target(a), ea), ea);
  const fs::path pb = fs::weakly_canonical(fs::absolute(link_target(b), eb), eb);
  return !ea && !eb && pa == pb;
}

void refuse_overwriting(const std::string& flag, const std::string& output,
                        const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (output.empty() || output == "-") return;
  // A device, FIFO or pipe is written through, not replaced: two outputs may share one.
  std::error_code kind;
  if (std::filesystem::exists(output, kind) && !std::filesystem::is_regular_file(output, kind)) return;
  for (const auto& [what, input] : inputs) {
    if (input.empty()) continue;
    if (same_place(output, input))
      throw Error(flag + ": " + output + " is " + what + (output == input ? "" : " (" + input + ")") +
                  "; it would be overwritten");
  }
}

std::string check_output_folder(const std::string& flag, const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string path = link_target(given);  // where write_file_atomic creates its temporary
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec))
    throw Error(flag + ": " + given + ": " + (path != given ? "is a symbolic link to " + path + ", whose " : "") +
                (fs::exists(dir, ec) ? dir.string() + " is not a folder"
                                     : (path != given ? "folder " : "the folder ") + dir.string() + " does not exist"));
  return path;
}

// That a file can be created at `path` (`given`, resolved) and renamed onto its name: the name
// within the file system's limit, and a probe created and removed beside it.
static void check_can_create(const std::string& flag, const std::string& given, const std::string& path) {
  namespace fs = std::filesystem;
  // The final name too must fit the file system's limit (the probe below has a shortened name):
  // else the run would end, its work done, unable to rename its temporary onto it.
  const fs::path dir = fs::path(path).parent_path();
  const long name_max = ::pathconf(dir.empty() ? "." : dir.c_str(), _PC_NAME_MAX);
  if (const size_t name = fs::path(path).filename().string().size(); name_max > 0 && name > size_t(name_max))
    throw Error(flag + ": " + given + ": its file name is " + std::to_string(name) + " bytes, more than the " +
                std::to_string(name_max) + " its file system takes");
  // The temporary is created beside the file and renamed over it.
  const std::string probe = temporary_path(path + ".probe");  // (within the name limit too)
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(flag + ": " + given + ": cannot create a file there: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_output_file(const std::string& flag, const std::string& given, bool append, Links links) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (given.empty()) throw Error(flag + ": needs a file name");
  if (struct stat st {}; links == Links::Replace && ::lstat(given.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    return check_can_create(flag, given, given);  // (its folder exists: the link lies in it)
  // Links that lead back to themselves reach no file: writing would replace one of the links.
  if (struct stat st {}; ::stat(given.c_str(), &st) != 0 && errno == ELOOP)
    throw Error(flag + ": " + given + ": its symbolic links lead in a loop (or too many deep); name a file");
  // What the name reaches through its links (the kernel follows /dev/stdout to a pipe too).
  if (fs::is_directory(given, ec)) throw Error(flag + ": " + given + ": is a folder");
  // A FIFO is not opened: its reader would take the open and close for the whole output, and the
  // real open would then wait for a reader that is gone.
  if (fs::is_fifo(given, ec)) {
    check_output_folder(flag, given);
    return;
  }
  if (fs::exists(given, ec)) {
    // A device or pipe (/dev/stdout) is written in place; an existing file must open for
    // writing (without truncation here), and with `append` that is all it needs.
    const int fd = ::open(given.c_str(), O_WRONLY | O_CLOEXEC | (append ? O_APPEND : 0));
    if (fd < 0) throw Error(flag + ": " + given + ": cannot open for writing: " + std::strerror(errno));
    ::close(fd);
    if (append || !fs::is_regular_file(given, ec)) return;
  }
  check_can_create(flag, given, check_output_folder(flag, given));
}

bool temporary_is_orphaned(const std::string& suffix) {
  const size_t dot = suffix.rfind('.');
  const std::string pid = dot == std::string::npos ? suffix : suffix.substr(dot + 1);
  if (dot != std::string::npos && suffix.substr(0, dot) != host_name()) return false;  // another machine's
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  const pid_t writer = static_cast<pid_t>(std::stol(pid));
  return writer != ::getpid() && ::kill(writer, 0) != 0 && errno == ESRCH;
}

std::string read_head(const std::string& path, size_t n) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string head(n, '\0');
  ssize_t got = 0;
  while ((got = ::pread(fd, head.data(), n, 0)) < 0 && errno == EINTR) {
  }
  ::close(fd);
  head.resize(got > 0 ? size_t(got) : 0);
  return head;
}

bool looks_like_text(const uint8_t* bytes, size_t n) {
  return n > 0 && std::all_of(bytes, bytes + n, [](uint8_t c) { return c >= 0x20 || c == '\n' || c == '\r' || c == '\t'; });
}

std::string read_tail(const std::string& path, size_t n) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const size_t size = size_t(st.st_size), want = std::min(n, size);
  std::string tail(want, '\0');
  ssize_t got = 0;
  while ((got = ::pread(fd, tail.data(), want, off_t(size - want))) < 0 && errno == EINTR) {
  }
  ::close(fd);
  tail.resize(got > 0 ? size_t(got) : 0);
  return tail;
}

RegularFile::RegularFile(const std::string& path, const std::string& what) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  std::string problem;
  if (::fstat(fd_, &st) != 0) problem = std::string("stat: ") + std::strerror(errno);
  else if (S_ISDIR(st.st_mode)) problem = "is a folder; give the " + what;
  // Read at offsets and by their size: a pipe or a device has neither.
  else if (!S_ISREG(st.st_mode)) problem = "not a regular file (a pipe or a device?); give the " + what;
  if (!problem.empty()) {
    ::close(fd_);
    throw Error(path + ": " + problem);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

void RegularFile::read_at(void* dst, size_t n, uint64_t offset, const std::string& part) const {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(path_ + ": reading " + part + ": " + std::strerror(errno));
    if (got == 0) throw Error(path_ + ": reading " + part + ": unexpected end of file");
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void check_not_a_device(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  const bool terminal = fd >= 0 && ::isatty(fd);
  if (fd >= 0) ::close(fd);
  if (!terminal) throw Error(path + ": is a device, not a file");
}

// Read to the end rather than by the size stat reports: pipes (/dev/stdin, <(...)) and /proc
// files have none, or report 0.
std::vector<uint8_t> read_file(const std::string& path, size_t max_bytes) {
  // Opened O_NONBLOCK: a named FIFO that no one writes to would block the open itself.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> bytes;
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw Error(path + ": stat: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) throw Error(path + ": cannot read: a directory");
    if (S_ISCHR(st.st_mode) && !::isatty(fd)) throw Error(path + ": is a device, not a file");
    // One byte past a regular file's size, so that its end is found without growing the buffer
    // (past max_bytes only by the one byte that says "too large").
    const size_t size = S_ISREG(st.st_mode) && st.st_size > 0 ? static_cast<size_t>(st.st_size) : size_t(1) << 20;
    bytes.resize(std::min(size, max_bytes) + 1);
    size_t n = 0;
    const std::string empty_pipe = path + ": a pipe with nothing to read (no writer, or one that wrote nothing)";
    if (S_ISFIFO(st.st_mode)) {
      // Without a writer a pipe reads as empty at once; with one (a shell's | or <(...)) it has
      // bytes or would block. Only the first would wait for ever, for a writer that may not come:
      // one that opens the FIFO within kFifoWaitMs is waited for (poll wakes when it writes or
      // closes; Linux reports no hang-up before a writer has come), then the pipe is refused.
      constexpr int kFifoWaitMs = 5000;
      auto probe = [&] {
        ssize_t got;
        while ((got = ::read(fd, bytes.data(), bytes.size())) < 0 && errno == EINTR) {
        }
        if (got < 0 && errno != EAGAIN) throw Error(path + ": read: " + std::strerror(errno));
        return got;  // > 0: bytes; 0: no writer now; < 0: a writer, slow to write
      };
      ssize_t got = probe();
      if (got == 0) {
        // Woken or timed out, a second look tells. (A pipe whose writer left before it was
        // opened here reports no hang-up either: it is waited out alike.)
        pollfd p{fd, POLLIN, 0};
        while (::poll(&p, 1, kFifoWaitMs) < 0 && errno == EINTR) {
        }
        if ((got = probe()) == 0) throw Error(empty_pipe);
      }
      n = got > 0 ? size_t(got) : 0;
    }
    // The rest is read blocking: a terminal, or a pipe's writer that is slow to write.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    for (;;) {
      if (n > max_bytes) break;  // (the caller sees more than it takes: a stream is not read to its end)
      if (n == bytes.size()) bytes.resize(2 * bytes.size());
      const ssize_t got = ::read(fd, bytes.data() + n, bytes.size() - n);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw Error(path + ": read: " + std::strerror(errno));
      if (got == 0) break;
      n += static_cast<size_t>(got);
    }
    if (n == 0 && S_ISFIFO(st.st_mode)) throw Error(empty_pipe);  // (as above, whichever came first)
    bytes.resize(n);
  } catch (const std::bad_alloc&) {
    ::close(fd);
    // A stream without end (/dev/zero, a pipe that keeps writing) or a file larger than memory.
    throw Error(path + ": does not fit in memory (" + std::to_string(bytes.size() >> 20) + " MiB read so far)");
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return bytes;
}

void flush_stdout() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;  // (the flush's; a lost earlier line leaves only the stream's error flag)
  if (!flushed || std::ferror(stdout))
    throw Error(std::string("stdout: write failed") + (!flushed && error ? std::string(": ") + std::strerror(error) : ""));
}

void write_file_atomic(const std::string& given,
                       const std::vector<std::pair<const void*, size_t>>& pieces, int mode, Links links) {
  if (given.empty()) throw Error("an output needs a file name, got \"\"");
  struct stat st {};
  const bool replace = links == Links::Replace && ::lstat(given.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  // A name the kernel resolves to a pipe or a device (/dev/stdout into a pipe: its link names
  // "pipe:[N]", no path) is written in place, as below.
  const bool special =
      !replace && ::stat(given.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
  const std::string path = special || replace ? given : link_target(given);
  // (A link to be replaced counts as no file: the new one gets `mode`, not the target's.)
  const bool exists = !replace && ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) throw Error(given + ": cannot write: a directory");
  if (exists && !S_ISREG(st.st_mode)) {
    const int fd = open_in_place(path, O_WRONLY);
    if (fd < 0) throw Error(given + ": cannot open for writing: " + open_error(path, errno));
    try {
      for (const auto& [data, size] : pieces) write_all(fd, data, size, given);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw Error(given + ": close: " + std::strerror(errno));
    return;
  }
  const std::string tmp = temporary_path(path);
  // Tracked before it exists and until it is renamed or removed: a handler then unlinks at
  // worst a name that no longer exists.
  bool tracked;
  int fd, open_errno;
  {
    SignalsHeld held;
    tracked = track_temporary(tmp);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    open_errno = errno;
  }
  if (fd < 0) {
    untrack_temporary(tracked);
    // (Named by the folder, not by the temporary's name, which the user never chose.)
    const std::string dir = std::filesystem::path(path).parent_path().string();
    throw Error(path + ": cannot create a file in " + (dir.empty() ? std::string(".") : dir) + ": " +
                std::strerror(open_errno));
  }
  try {
    for (const auto& [data, size] : pieces) write_all(fd, data, size, path);
    // fsync before rename: otherwise a crash can leave `path` naming an empty file.
    // A file replaced keeps its permissions (private weights stay private); a new one gets
    // `mode` less the umask, as open() gives a file it creates (the temporary may be older).
    ::fchmod(fd, exists ? (st.st_mode & 07777) : (mode_t(mode) & ~process_umask()));
    if (::fsync(fd) != 0) throw Error(path + ": fsync: " + std::strerror(errno));
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw Error(path + ": close: " + std::strerror(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot replace it: " + std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    untrack_temporary(tracked);
    throw;
  }
  untrack_temporary(tracked);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  // (Not in a staging folder this process made: none are there, and prepare writes many files
  // into one, each sweep listing the folder again.)
  if (!g_staging_set.load() || dir != g_staging) remove_orphaned_temporaries(path);
  sync_folder(dir);  // the rename itself made durable
}

}  // namespace kiln
