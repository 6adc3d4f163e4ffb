// StopSignals: the first SIGINT/SIGTERM/SIGHUP asks the run to stop, the same signal sent twice at once
// (as `timeout` does) counts once, a later one ends the process and says so; a closed pipe is an
// EPIPE the caller sees instead of a SIGPIPE that ends the process.
#include "runtime/stop_signals.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "runtime/file_io.h"
#include "temp_dir_fixture.h"

namespace {

// A signal's default disposition while in scope. A process started ignoring it (nohup ignores
// SIGHUP; a shell's background job SIGINT) keeps ignoring it under StopSignals, by design: the
// tests that raise one must not depend on how the test binary was started.
struct DefaultDisposition {
  int sig;
  struct sigaction old {};
  explicit DefaultDisposition(int s) : sig(s) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(sig, &dfl, &old);
  }
  ~DefaultDisposition() { ::sigaction(sig, &old, nullptr); }
};

TEST(StopSignals, FirstSignalIsRequestedAndTheSameOneAtOnceCountsOnce) {
  DefaultDisposition term(SIGTERM);
  kiln::StopSignals signals(0, 1, {"stopping"});
  EXPECT_EQ(signals.requested(), 0);
  ::raise(SIGTERM);
  EXPECT_EQ(signals.requested(), SIGTERM);
  ::raise(SIGTERM);  // timeout's second copy: the process goes on
  EXPECT_EQ(signals.requested(), SIGTERM);
}

// A closed terminal (SIGHUP) stops the run as the others do, and says so.
TEST(StopSignals, AClosedTerminalAsksToStop) {
  DefaultDisposition hup(SIGHUP);
  testing::internal::CaptureStderr();
  {
    kiln::StopSignals signals(0, 1, {"stopping after this step"});
    ::raise(SIGHUP);
    EXPECT_EQ(signals.requested(), SIGHUP);
  }
  // (No new line first: stderr is a file here, not a terminal that echoed ^C.)
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "kiln: SIGHUP: stopping after this step (again to stop now)\n");
  EXPECT_STREQ(kiln::signal_name(SIGHUP), "SIGHUP");
}

// On a terminal the message starts a line of its own (the echoed ^C ends the one it cut).
TEST(StopSignals, OnATerminalTheMessageStartsANewLine) {
  DefaultDisposition hup(SIGHUP);
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(terminal, 0);
  const int saved = ::dup(2);
  ::dup2(terminal, 2);
  {
    kiln::StopSignals signals(0, 1, {"stopping after this step"});
    ::raise(SIGHUP);
  }
  ::dup2(saved, 2);
  ::close(saved);
  ::close(terminal);
  std::string got;
  char buf[256];
  pollfd p{master, POLLIN, 0};
  while (::poll(&p, 1, 1000) > 0 && (p.revents & POLLIN)) {
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, size_t(n));
    if (got.find("now)") != std::string::npos) break;
  }
  ::close(master);
  got.erase(std::remove(got.begin(), got.end(), '\r'), got.end());  // (a terminal writes each new line as \r\n)
  EXPECT_EQ(got, "\nkiln: SIGHUP: stopping after this step (again to stop now)\n");
}

TEST(StopSignals, RequestStopsAsASignalWouldUnlessOneCameFirst) {
  {
    kiln::StopSignals signals(0, 1, {"stopping"});
    EXPECT_TRUE(signals.request(SIGPIPE));
    EXPECT_EQ(signals.requested(), SIGPIPE);
    EXPECT_FALSE(signals.request(SIGTERM));
    EXPECT_EQ(signals.requested(), SIGPIPE);
  }
  kiln::StopSignals again(0, 1, {"stopping"});  // a new run starts with none
  EXPECT_EQ(again.requested(), 0);
  EXPECT_STREQ(kiln::signal_name(SIGPIPE), "SIGPIPE");
}

// A signal the process was started ignoring (nohup's SIGHUP) stays ignored: no request.
TEST(StopSignals, ASignalIgnoredAtTheStartStaysIgnored) {
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGHUP, &ignore, &old);
  {
    kiln::StopSignals signals(0, 1, {"stopping"});
    ::raise(SIGHUP);
    EXPECT_EQ(signals.requested(), 0);
  }
  ::sigaction(SIGHUP, &old, nullptr);
}

TEST(StopSignals, ARealSignalAfterARequestIsTheFirstSignal) {
  DefaultDisposition intr(SIGINT), term(SIGTERM);
  kiln::StopSignals signals(0, 1, {"stopping"});
  EXPECT_TRUE(signals.request(SIGPIPE));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ::raise(SIGINT);  // no "second signal": the process goes on, and stops by SIGINT
  EXPECT_EQ(signals.requested(), SIGINT);
  ::raise(SIGTERM);  // another signal at once: still one request
  EXPECT_EQ(signals.requested(), SIGINT);
}

TEST(StopSignalsDeathTest, ASecondSignalLaterEndsTheProcessAndSaysSo) {
  EXPECT_EXIT(
      {
        kiln::StopSignals signals(1, 2, {"stopping after this step"});
        ::raise(SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 0.3 s of one signal sent twice
        ::raise(SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::_Exit(0);  // not reached
      },
      testing::KilledBySignal(SIGTERM),
      "kiln: rank 1: SIGTERM: stopping after this step \\(again to stop now\\)\n"  // (stderr is no terminal)
      "kiln: rank 1: SIGTERM, a second signal: stopping now, without a checkpoint or --save");
}

TEST(StopSignalsDeathTest, AClosedPipeIsAnErrorNotASignalWhileKeptOn) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // the reader is gone
  {
    kiln::StopSignals signals(0, 1, {"stopping"}, /*keep_on_broken_pipe=*/true);
    errno = 0;
    EXPECT_EQ(::write(fds[1], "x", 1), -1);
    EXPECT_EQ(errno, EPIPE);
  }
  // Afterwards SIGPIPE's own action is back (here: still the default, so a write would end the
  // process; checked in a child).
  EXPECT_EXIT(
      {
        ssize_t n = ::write(fds[1], "x", 1);
        (void)n;
        std::_Exit(0);
      },
      testing::KilledBySignal(SIGPIPE), "");
  ::close(fds[1]);
}

}  // namespace

namespace {

// The folders a run made before its first step: the first signal removes those still empty
// (under mpirun, SIGKILL follows a rank's SIGTERM before any destructor runs); once the first
// step starts (keep_folders) a signal leaves them, and the run learns whether they went.
class StopSignalsFolders : public kiln::testing::TempDirTest {};

TEST_F(StopSignalsFolders, TheFirstSignalBeforeTheFirstStepRemovesTheEmptyFoldersMade) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  const std::string outer = path("ck"), inner = path("ck/run"), other = path("other");
  fs::create_directories(inner);
  fs::create_directories(other);
  testing::internal::CaptureStderr();
  kiln::StopSignals signals(0, 2, {"stopping"});
  signals.remove_on_signal({outer, inner});
  ::raise(SIGTERM);
  testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(outer));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(signals.keep_folders());  // removed: the run makes them again for the first step
  EXPECT_FALSE(signals.keep_folders());  // (said once)
}

TEST_F(StopSignalsFolders, AFolderThatHoldsAFileStays) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  const std::string outer = path("ck"), inner = path("ck/run");
  fs::create_directories(inner);
  { std::ofstream(path("ck/notes.txt")) << "kept"; }
  testing::internal::CaptureStderr();
  kiln::StopSignals signals(0, 2, {"stopping"});
  signals.remove_on_signal({outer, inner});
  ::raise(SIGTERM);
  testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(inner));
  EXPECT_TRUE(fs::exists(path("ck/notes.txt")));
}

TEST_F(StopSignalsFolders, FromTheFirstStepOnASignalLeavesThem) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  const std::string outer = path("ck");
  fs::create_directories(outer);
  testing::internal::CaptureStderr();
  kiln::StopSignals signals(0, 2, {"stopping"});
  signals.remove_on_signal({outer});
  EXPECT_FALSE(signals.keep_folders());  // no signal yet: the folders stay from now on
  ::raise(SIGTERM);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(signals.requested(), SIGTERM);
  EXPECT_TRUE(fs::exists(outer));
}

TEST_F(StopSignalsFolders, ARunThatEndedLeavesItsFoldersToTheNextOneInTheProcess) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  const std::string outer = path("ck");
  fs::create_directories(outer);
  {
    kiln::StopSignals first(0, 2, {"stopping"});
    first.remove_on_signal({outer});  // ended (an error at start) before its first step
  }
  testing::internal::CaptureStderr();
  kiln::StopSignals second(0, 2, {"stopping"});  // made no folders of its own
  ::raise(SIGTERM);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(second.requested(), SIGTERM);
  EXPECT_TRUE(fs::exists(outer));
  EXPECT_FALSE(second.keep_folders());
}

// Up to 16 folders (a --checkpoint-dir 16 levels below any folder there was) are removed by the
// signal; more are left to the run's destructor (the handler's fixed storage).
TEST_F(StopSignalsFolders, SixteenFoldersAreRemovedSeventeenAreNot) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  for (const int n : {16, 17}) {
    const std::string top = path("n" + std::to_string(n));
    std::vector<std::string> folders;
    std::string p = top;
    for (int i = 0; i < n; ++i, p += "/d") folders.push_back(p);
    fs::create_directories(folders.back());
    testing::internal::CaptureStderr();
    {
      kiln::StopSignals signals(0, 2, {"stopping"});
      signals.remove_on_signal(folders);
      ::raise(SIGTERM);
      EXPECT_EQ(signals.requested(), SIGTERM);
    }
    testing::internal::GetCapturedStderr();
    EXPECT_EQ(fs::exists(top), n > 16) << n << " folders";
  }
}

// A second run in the process arms its own folders only, not the first run's too.
TEST_F(StopSignalsFolders, TheNextRunArmsItsOwnFoldersOnly) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  const std::string first = path("first"), second = path("second");
  fs::create_directories(first);
  fs::create_directories(second);
  {
    kiln::StopSignals signals(0, 2, {"stopping"});
    signals.remove_on_signal({first});
    EXPECT_FALSE(signals.keep_folders());  // its first step started: the folder stays
  }
  testing::internal::CaptureStderr();
  {
    kiln::StopSignals signals(0, 2, {"stopping"});
    signals.remove_on_signal({second});
    ::raise(SIGTERM);
    EXPECT_EQ(signals.requested(), SIGTERM);
  }
  testing::internal::GetCapturedStderr();
  EXPECT_TRUE(fs::exists(first));
  EXPECT_FALSE(fs::exists(second));
}

}  // namespace

namespace {

// The handler runs between any two instructions of the training loop's thread: errno as it was
// (an rmdir of a folder that holds a file fails, setting it), the handlers before put back at the
// end, and reads and writes the signal cut carry on rather than fail with EINTR.
TEST_F(StopSignalsFolders, TheHandlerKeepsErrno) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  fs::create_directories(path("ck"));
  { std::ofstream(path("ck/notes.txt")) << "kept"; }  // (its rmdir fails: ENOTEMPTY)
  testing::internal::CaptureStderr();
  kiln::StopSignals signals(0, 1, {"stopping"});
  signals.remove_on_signal({path("ck")});
  errno = EDOM;
  ::raise(SIGTERM);
  const int after = errno;
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(signals.requested(), SIGTERM);
  EXPECT_EQ(after, EDOM);
}

void own_handler(int) {}

TEST(StopSignals, TheHandlersBeforeAreBackAfterAndReadsRestart) {
  struct sigaction mine {}, old[3] {};
  mine.sa_handler = own_handler;
  sigemptyset(&mine.sa_mask);
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; ++i) ::sigaction(sigs[i], &mine, &old[i]);
  {
    kiln::StopSignals signals(0, 1, {"stopping"});
    for (const int sig : sigs) {
      struct sigaction now {};
      ::sigaction(sig, nullptr, &now);
      EXPECT_NE(now.sa_handler, own_handler) << kiln::signal_name(sig);
      EXPECT_TRUE(now.sa_flags & SA_RESTART) << kiln::signal_name(sig);
    }
  }
  for (int i = 0; i < 3; ++i) {
    struct sigaction now {};
    ::sigaction(sigs[i], &old[i], &now);
    EXPECT_EQ(now.sa_handler, own_handler) << kiln::signal_name(sigs[i]);
  }
}

// A line for each phase of the run: phase(i) picks phases[i] (the last one given for those past
// it, and the last phase for an i past kMaxPhases) and says which it was before.
TEST(StopSignals, APhaseSaysItsOwnLine) {
  DefaultDisposition intr(SIGINT);
  testing::internal::CaptureStderr();
  {
    kiln::StopSignals signals(0, 1, {"at the start", "after this step"});
    EXPECT_EQ(signals.phase(1), 0);
    EXPECT_EQ(signals.phase(kiln::StopSignals::kMaxPhases + 5), 1);
    EXPECT_EQ(signals.phase(1), kiln::StopSignals::kMaxPhases - 1);
    EXPECT_EQ(signals.phase(-1), 1);
    EXPECT_EQ(signals.phase(kiln::StopSignals::kMaxPhases - 1), 0);
    ::raise(SIGINT);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "kiln: SIGINT: after this step (again to stop now)\n");
}

// A signal that came while the run made its folders (before remove_on_signal) removes them as
// they are armed; a stop the run asked for itself (a closed stdout) leaves them.
TEST_F(StopSignalsFolders, ASignalWhileTheFoldersWereMadeRemovesThem) {
  DefaultDisposition term(SIGTERM);
  namespace fs = std::filesystem;
  fs::create_directories(path("ck"));
  testing::internal::CaptureStderr();
  kiln::StopSignals signals(0, 1, {"stopping"});
  ::raise(SIGTERM);
  signals.remove_on_signal({path("ck")});
  testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(path("ck")));
  EXPECT_TRUE(signals.keep_folders());
}

TEST_F(StopSignalsFolders, ARequestLeavesThem) {
  namespace fs = std::filesystem;
  fs::create_directories(path("ck"));
  kiln::StopSignals signals(0, 1, {"stopping"});
  EXPECT_TRUE(signals.request(SIGPIPE));
  signals.remove_on_signal({path("ck")});
  EXPECT_TRUE(fs::exists(path("ck")));
  EXPECT_FALSE(signals.keep_folders());
}

// A second signal ends the process without waiting for the write in progress: its temporary
// (here a staging folder's file) is removed first.
TEST_F(StopSignalsFolders, ASecondSignalRemovesTheTemporaryBeingWritten) {
  namespace fs = std::filesystem;
  fs::create_directories(path("staging"));
  { std::ofstream(path("staging/part.bin")) << "half"; }
  EXPECT_EXIT(
      {
        kiln::track_staging_folder(path("staging"), "");
        kiln::StopSignals signals(0, 1, {"stopping"});
        ::raise(SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 0.3 s of one signal sent twice
        ::raise(SIGTERM);
        std::_Exit(0);  // not reached
      },
      testing::KilledBySignal(SIGTERM), "a second signal");
  EXPECT_FALSE(fs::exists(path("staging")));
}

// A stop the run asked for as a signal would (request) is the first signal: a real one later is
// the second, which ends the process.
TEST(StopSignalsDeathTest, ASignalAfterARequestOfItsOwnKindIsTheSecond) {
  EXPECT_EXIT(
      {
        kiln::StopSignals signals(0, 1, {"stopping"});
        signals.request(SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 0.3 s of one signal sent twice
        ::raise(SIGTERM);
        std::_Exit(0);  // not reached
      },
      testing::KilledBySignal(SIGTERM), "SIGTERM, a second signal");
}

// end_by_signal ends the process by the signal even where a handler is still installed or the
// signal is blocked (a section that holds signals).
TEST(StopSignalsDeathTest, EndBySignalEndsTheProcessByIt) {
  EXPECT_EXIT(
      {
        kiln::StopSignals signals(0, 1, {"stopping"});
        sigset_t term;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &term, nullptr);
        kiln::end_by_signal(SIGTERM);
      },
      testing::KilledBySignal(SIGTERM), "");
}

}  // namespace
