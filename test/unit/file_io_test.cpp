// write_file_atomic under a signal: the temporary goes with the process (remove_pending_temporary).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace kiln
