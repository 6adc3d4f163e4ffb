// write_file_atomic under a signal: the temporary goes with the process (remove_pending_temporary).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/file_io.h"
#include "temp_dir_fixture.h"

namespace kiln {
namespace {

using FileIo = testing::TempDirTest;

// A child writes 512 MB; SIGTERM reaches it once its temporary exists. It ends by the signal and
// leaves neither the temporary nor the file.
TEST_F(FileIo, ASignalDuringAWriteLeavesNoTemporary) {
  std::vector<uint8_t> chunk(64 << 20, 0x5a);
  const std::vector<std::pair<const void*, size_t>> pieces(8, {chunk.data(), chunk.size()});
  const std::string out = path("big.bin");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    remove_temporaries_on_signals();
    try {
      write_file_atomic(out, pieces);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);  // finished before the signal came: the test below says so
  }
  const auto start = std::chrono::steady_clock::now();
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    for (const std::string& name : listing()) seen = seen || name.find(".tmp.") != std::string::npos;
    if (!seen) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(child, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(seen) << "the temporary never appeared";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child was not ended by the signal (exit status "
                                   << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ": the write finished first)";
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(listing(), std::vector<std::string>{});
}

// A signal the process was started ignoring (nohup) stays ignored; the others get the handler.
TEST(FileIoSignals, IgnoredSignalsStayIgnored) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGHUP, SIG_IGN);
    ::signal(SIGTERM, SIG_DFL);
    remove_temporaries_on_signals();
    struct sigaction hup{}, term{};
    sigaction(SIGHUP, nullptr, &hup);
    sigaction(SIGTERM, nullptr, &term);
    ::_exit(hup.sa_handler == SIG_IGN && term.sa_handler != SIG_DFL && term.sa_handler != SIG_IGN ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Runs `body` in a child process and returns its wait status (a handler that ends the process
// must not end the test's).
template <typename F>
int in_child(F body) {
  const pid_t child = ::fork();
  if (child == 0) {
    body();
    ::_exit(0);
  }
  int status = -1;
  ::waitpid(child, &status, 0);
  return status;
}

// Between writes there is nothing to remove, and a finished write keeps its file.
// read_head and read_tail: the first and last bytes, all of a shorter file, "" for a missing one.
TEST_F(FileIo, HeadAndTail) {
  const std::string f = path("f.txt");
  const std::string text = "{\"step\":0}\n{\"step\":1}\n";
  write_file_atomic(f, {{text.data(), text.size()}});
  EXPECT_EQ(read_head(f, 4), "{\"st");
  EXPECT_EQ(read_tail(f, 11), "{\"step\":1}\n");
  EXPECT_EQ(read_tail(f, 1000), text);
  EXPECT_EQ(read_tail(f, 0), "");
  EXPECT_EQ(read_tail(path("missing"), 4), "");
  EXPECT_EQ(read_tail(dir_.string(), 4), "");  // a folder
}

TEST_F(FileIo, NothingPendingAfterAWrite) {
  const std::string out = path("small.txt");
  const int status = in_child([&] {
    const char text[] = "kept";
    write_file_atomic(out, {{text, 4}});
    remove_pending_temporary();
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(listing(), std::vector<std::string>{"small.txt"});
  EXPECT_EQ(read_file(out).size(), 4u);
}

// Temporaries of the same file that a killed writer on this host left go when it is written
// again; a live writer's, another host's, a name without a host (a user's file, perhaps) and
// another file's stay.
TEST_F(FileIo, AWriteRemovesItsFilesOrphanedTemporaries) {
  const std::string out = path("w.safetensors");
  const std::string mine = temporary_path(out);                  // "...w.safetensors.tmp.HOST.PID"
  const std::string host = mine.substr(0, mine.rfind('.') + 1);  // "...w.safetensors.tmp.HOST."
  const std::string dead = host + "999999999";
  const std::string live = host + std::to_string(::getppid());  // (this process's is the write's own)
  for (const std::string& name : {dead, live, out + ".tmp.elsewhere.999999999", out + ".tmp.999999999",
                                   path("other.safetensors.tmp.999999999")})
    write_file_atomic(name, {{"x", 1}});  // (a file by that name, whatever the writer)
  write_file_atomic(out, {{"kept", 4}});
  std::vector<std::string> left{"other.safetensors.tmp.999999999", "w.safetensors", "w.safetensors.tmp.999999999",
                                "w.safetensors.tmp.elsewhere.999999999", live.substr(live.rfind('/') + 1)};
  std::sort(left.begin(), left.end());
  EXPECT_EQ(listing(), left);
}

// A handler on one thread waits for another thread's section (SignalsHeld) to end before it
// ends the process: the section's last act (a file) is there although the signal came first.
// The folders making a path creates, "." and ".." aside, and only those removed again (empty).
TEST_F(FileIo, MissingFoldersAreThoseMakingAPathCreates) {
  std::filesystem::create_directories(path("there"));
  std::filesystem::create_symlink("nowhere", path("dangling"));
  EXPECT_EQ(missing_folders(path("there/a/b")), (std::vector<std::string>{path("there/a"), path("there/a/b")}));
  EXPECT_EQ(missing_folders(path("up/../down/")), (std::vector<std::string>{path("up"), path("down")}));
  // An existing folder reached through one yet to be made is not among them.
  EXPECT_EQ(missing_folders(path("new/../there/x")), (std::vector<std::string>{path("new"), path("there/x")}));
  EXPECT_EQ(missing_folders(path("a/b/../c")), (std::vector<std::string>{path("a"), path("a/b"), path("a/c")}));
  EXPECT_EQ(missing_folders(path("dangling/x")), (std::vector<std::string>{path("dangling/x")}));
  EXPECT_TRUE(missing_folders(path("there/.")).empty());
  const auto made = missing_folders(path("up/../down/deeper"));
  std::filesystem::create_directories(path("up/../down/deeper"));
  write_file_atomic(path("down/kept"), {});  // (a file taken since: its folder stays)
  remove_empty_folders(made);
  EXPECT_EQ(listing(), (std::vector<std::string>{"dangling", "down", "there"}));
  EXPECT_FALSE(std::filesystem::exists(path("down/deeper")));
}

TEST_F(FileIo, AHandlerWaitsForAnotherThreadsSection) {
  const std::string done = path("section-done");
  const int status = in_child([&] {
    remove_temporaries_on_signals();
    std::atomic<bool> inside{false};
    std::thread worker([&] {
      SignalsHeld held;
      inside.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const char text[] = "done";
      write_file_atomic(done, {{text, 4}});  // a section nested in this one
    });
    while (!inside.load()) std::this_thread::yield();
    ::raise(SIGTERM);  // handled on this thread, which holds no section
    worker.join();     // not reached
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(listing(), std::vector<std::string>{"section-done"});
}

// Once a handler has begun to end the process, a section that starts on another thread never
// runs its work.
TEST(FileIoSignals, NoSectionStartsOnceAHandlerEndsTheProcess) {
  const int status = in_child([] {
    settle_signals_held();  // as a handler does first
    std::atomic<bool> ran{false};
    std::thread worker([&] {
      SignalsHeld held;
      ran.store(true);
    });
    worker.detach();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::_exit(ran.load() ? 1 : 0);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the section ran";
}

// A FIFO's reader that comes after the writer (within 5 s) is waited for, and the descriptor
// handed back blocks, so that a write waits for the reader instead of failing with EAGAIN.
TEST_F(FileIo, OpenInPlaceWaitsForALateReaderAndBlocks) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::close(fd);
  });
  const int fd = open_in_place(fifo, O_WRONLY);
  EXPECT_GE(fd, 0) << open_error(fifo, errno);
  if (fd >= 0) {
    EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    ::close(fd);
  }
  done.store(true);
  reader.join();
}

// wait_for_reader is for FIFOs only; open_error calls an ENXIO a missing reader only on a FIFO.
TEST_F(FileIo, WaitForReaderAndOpenErrorTellAFifoFromAFile) {
  const std::string file = path("file");
  write_file_atomic(file, {{"x", 1}});
  EXPECT_EQ(wait_for_reader(file, [] { return true; }), -1);
  EXPECT_EQ(open_error(file, ENXIO), std::strerror(ENXIO));
}

// The sweep removes only regular files: a link named as a dead writer's temporary stays.
TEST_F(FileIo, TheSweepLeavesALinkNamedAsATemporary) {
  const std::string out = path("w.bin");
  const std::string mine = temporary_path(out);
  const std::string dead = mine.substr(0, mine.rfind('.') + 1) + "999999999";
  std::filesystem::create_symlink("w.bin", dead);
  write_file_atomic(out, {{"x", 1}});
  EXPECT_TRUE(std::filesystem::is_symlink(dead));
}

// While a staging folder is tracked, a write elsewhere still sweeps its own orphans.
TEST_F(FileIo, TheSweepRunsOutsideATrackedStagingFolder) {
  std::filesystem::create_directories(path("stage"));
  const std::string out = path("w.bin");
  const std::string mine = temporary_path(out);
  const std::string dead = mine.substr(0, mine.rfind('.') + 1) + "999999999";
  write_file_atomic(dead, {{"x", 1}});
  track_staging_folder(path("stage"), "");
  write_file_atomic(out, {{"x", 1}});
  untrack_staging_folder();
  EXPECT_EQ(listing(), (std::vector<std::string>{"stage", "w.bin"}));
}

// A tracked staging folder goes with its files, and the output folder made for it when empty.
TEST_F(FileIo, TheHandlerRemovesAStagingFolderAndItsCreatedParent) {
  const std::string parent = path("out"), stage = path("out/stage");
  std::filesystem::create_directories(stage);
  write_file_atomic(stage + "/a", {{"x", 1}});
  write_file_atomic(stage + "/b", {{"x", 1}});
  const int status = in_child([&] {
    track_staging_folder(stage, parent);
    remove_pending_temporary();
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(listing(), std::vector<std::string>{});
}

// start_process opens each of descriptors 0-2 that the process lacks on /dev/null, stderr too.
TEST(FileIoProcess, StartProcessOpensAMissingStderr) {
  const int status = in_child([] {
    ::close(2);
    start_process();
    ::_exit(::fcntl(2, F_GETFD) >= 0 ? 0 : 1);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "stderr stays closed";
}

// A temporary's file name is at most 255 bytes: a name with room for the suffix keeps it all, a
// longer one keeps its first bytes, up to exactly 255.
TEST_F(FileIo, TemporaryNamesFitTheFileNameLimit) {
  const size_t suffix = temporary_path("x").size() - 1;
  const std::string fits = path(std::string(255 - suffix, 'a'));
  EXPECT_EQ(temporary_path(fits), fits + temporary_path("x").substr(1));
  const std::string tmp = temporary_path(path(std::string(250, 'b')));
  EXPECT_EQ(std::filesystem::path(tmp).filename().string().size(), 255u);
  EXPECT_EQ(tmp.substr(0, path("").size() + 10), path(std::string(10, 'b')));
}

// Links are followed a few deep, a relative target from the link's own folder.
TEST_F(FileIo, LinkTargetFollowsRelativeLinksFromTheirFolder) {
  std::filesystem::create_directories(path("sub"));
  std::filesystem::create_symlink("second", path("sub/first"));
  std::filesystem::create_symlink("file", path("sub/second"));
  EXPECT_EQ(link_target(path("sub/first")), path("sub/file"));
}

// A FIFO takes no disk space: no free space is told for it; a regular file's is.
TEST_F(FileIo, FreeSpaceIsToldForFilesNotFifos) {
  const std::string fifo = path("fifo"), file = path("file");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  write_file_atomic(file, {{"x", 1}});
  EXPECT_FALSE(free_space_for(fifo).has_value());
  EXPECT_TRUE(free_space_for(file).has_value());
}

// "-" (stdout) and a device are written through: an input of the same name is not overwritten.
TEST(FileIoOutputs, StdoutAndDevicesMayShareAnInputsName) {
  EXPECT_NO_THROW(refuse_overwriting("--out", "-", {{"the input", "-"}}));
  EXPECT_NO_THROW(refuse_overwriting("--out", "/dev/null", {{"the input", "/dev/null"}}));
  EXPECT_THROW(refuse_overwriting("--out", "/tmp/x", {{"the input", "/tmp/x"}}), Error);
}

// check_output_file takes a name of exactly the file system's limit, and leaves no probe.
TEST_F(FileIo, CheckOutputFileTakesALongestNameAndLeavesNothing) {
  const long name_max = ::pathconf(dir_.c_str(), _PC_NAME_MAX);
  ASSERT_GT(name_max, 0);
  EXPECT_NO_THROW(check_output_file("--out", path(std::string(size_t(name_max), 'n'))));
  EXPECT_THROW(check_output_file("--out", path(std::string(size_t(name_max) + 1, 'n'))), Error);
  EXPECT_EQ(listing(), std::vector<std::string>{});
}

// A log opened to append only has to open: its folder need not take new files (/proc's don't).
TEST(FileIoOutputs, AnAppendedFileNeedsNoRoomBesideIt) {
  EXPECT_NO_THROW(check_output_file("--log", "/proc/self/comm", /*append=*/true));
  EXPECT_THROW(check_output_file("--log", "/proc/self/comm"), Error);
}

TEST(FileIoText, LooksLikeText) {
  const std::string text = "a b\tc\r\n", binary = std::string("a\0b", 3);
  EXPECT_TRUE(looks_like_text(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  EXPECT_FALSE(looks_like_text(reinterpret_cast<const uint8_t*>(binary.data()), binary.size()));
  EXPECT_FALSE(looks_like_text(reinterpret_cast<const uint8_t*>(text.data()), 0));
}

// A stream that has sent exactly max_bytes is read on: more than max_bytes is "too large",
// which a stream that stopped at max_bytes would hide.
TEST(FileIoRead, AStreamPastItsLimitReadsPastIt) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "0123456789", 10), 10);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(::write(fds[1], "more", 4), 4);
    ::close(fds[1]);
  });
  const auto bytes = read_file("/proc/self/fd/" + std::to_string(fds[0]), 10);
  writer.join();
  ::close(fds[0]);
  EXPECT_GT(bytes.size(), 10u);
}

// A pipe whose writer closes it without writing is refused, not read as an empty file.
TEST(FileIoRead, APipeClosedWithoutBytesIsRefused) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::close(fds[1]);
  });
  EXPECT_THROW(read_file("/proc/self/fd/" + std::to_string(fds[0])), Error);
  writer.join();
  ::close(fds[0]);
}

TEST(FileIoRead, ADeviceIsRefused) { EXPECT_THROW(read_file("/dev/null"), Error); }

// RegularFile::read_at past the end says so instead of leaving the rest unread.
TEST_F(FileIo, ReadAtPastTheEndIsRefused) {
  write_file_atomic(path("f"), {{"abc", 3}});
  RegularFile f(path("f"), "file");
  char buf[4];
  EXPECT_THROW(f.read_at(buf, 4, 0, "all"), Error);
}

// A replaced file keeps its permissions; a replaced link's new file gets the mode asked for.
TEST_F(FileIo, ReplacedFilesKeepTheirModeAndReplacedLinksDoNot) {
  const std::string file = path("private");
  write_file_atomic(file, {{"x", 1}}, 0600);
  ::chmod(file.c_str(), 0600);
  write_file_atomic(file, {{"y", 1}}, 0644);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::filesystem::create_symlink("private", path("link"));
  const mode_t mask = ::umask(0);
  ::umask(mask);
  write_file_atomic(path("link"), {{"z", 1}}, 0644, Links::Replace);
  ASSERT_EQ(::lstat(path("link").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0644u & ~mask);
}

// A write that fails leaves neither its temporary nor a file.
TEST_F(FileIo, AFailedWriteLeavesNoTemporary) {
  EXPECT_THROW(write_file_atomic(path("out"), {{nullptr, 16}}), Error);  // write(): EFAULT
  EXPECT_EQ(listing(), std::vector<std::string>{});
}

// A '..' after a folder that exists is left to the kernel (through a link it is the parent of
// the link's target): only a '..' right after a folder this makes is taken out.
TEST_F(FileIo, MissingFoldersKeepADotDotAfterAnExistingFolder) {
  std::filesystem::create_directories(path("there"));
  EXPECT_EQ(missing_folders(path("new/../there/../y")), (std::vector<std::string>{path("new"), path("there/../y")}));
}

// A temporary is another process's leftover only when it is this host's and its writer is gone;
// a name without a host is taken as this host's.
TEST(FileIoTemporaries, OnlyThisHostsDeadWritersAreOrphans) {
  const std::string mine = temporary_path("x");  // "x.tmp.HOST.PID"
  const std::string host = mine.substr(6, mine.rfind('.') - 6);
  EXPECT_TRUE(temporary_is_orphaned(host + ".999999999"));
  EXPECT_TRUE(temporary_is_orphaned("999999999"));
  EXPECT_FALSE(temporary_is_orphaned("elsewhere.999999999"));
  EXPECT_FALSE(temporary_is_orphaned(host + "." + std::to_string(::getppid())));
}

// A write that runs while another thread's write holds the handler's slot does not let it go:
// a signal afterwards still removes the first write's temporary.
TEST_F(FileIo, ASecondWriteKeepsTheFirstWritesTemporaryTracked) {
  std::vector<uint8_t> chunk(64 << 20, 0x5a);
  const std::vector<std::pair<const void*, size_t>> pieces(8, {chunk.data(), chunk.size()});
  const std::string big = path("big.bin"), small = path("small.txt");
  const int status = in_child([&] {
    remove_temporaries_on_signals();
    std::thread writer([&] { write_file_atomic(big, pieces); });
    for (bool seen = false; !seen; std::this_thread::sleep_for(std::chrono::microseconds(200)))
      for (const std::string& name : listing()) seen = seen || name.find(".tmp.") != std::string::npos;
    write_file_atomic(small, {{"x", 1}});
    ::raise(SIGTERM);
    writer.join();  // not reached unless the big write finished first
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "the big write finished before the signal";
  EXPECT_EQ(listing(), std::vector<std::string>{"small.txt"});
}

}  // namespace
}  // namespace kiln
