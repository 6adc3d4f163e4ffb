// A training run's outputs (runtime/run_outputs.h): the records a resumed run finds in its --log,
// and the checkpoint folder it made and locked.
#include "runtime/run_outputs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "temp_dir_fixture.h"

namespace {

class RunOutputs : public kiln::testing::TempDirTest {
 protected:
  void write(const std::string& name, const std::string& text) { std::ofstream(path(name), std::ios::binary) << text; }
};

// A record's step is a whole number: one with a fraction is no record (plot and resume count steps).
TEST(LogRecordStep, AStepIsAnInteger) {
  EXPECT_EQ(kiln::log_record_step(R"({"step":3,"loss":1.5})"), 3);
  EXPECT_EQ(kiln::log_record_step(R"({"step":1.5})"), std::nullopt);
  EXPECT_EQ(kiln::log_record_step(R"({"loss":1})"), std::nullopt);
  EXPECT_EQ(kiln::log_record_step("not json"), std::nullopt);
}

// The last record with a step, from the file's first line on (a log of one line) and passing over
// lines after it that have none.
TEST_F(RunOutputs, TheLastLoggedStepIsTheLastRecordsOne) {
  write("one.jsonl", "{\"step\":4,\"loss\":1}\n");
  EXPECT_EQ(kiln::last_logged_step(path("one.jsonl")), 4);
  write("two.jsonl", "{\"step\":4}\n{\"step\":5}\n{\"samples\":[]}\n{\"step\":6,\"lo");
  EXPECT_EQ(kiln::last_logged_step(path("two.jsonl")), 5);
  write("none.jsonl", "");
  EXPECT_EQ(kiln::last_logged_step(path("none.jsonl")), -1);
}

// A line is dropped only where the log holds it whole, as a line of its own: not where it ends a
// longer line, nor where the log's last line was cut short.
TEST_F(RunOutputs, OnlyWholeLinesTheLogHoldsAreDropped) {
  write("run.jsonl", "{\"step\":1}\nx{\"step\":2}\n{\"step\":3}");
  std::vector<std::string> lines = {R"({"step":1})", R"({"step":2})", R"({"step":3})"};
  kiln::drop_logged_lines(path("run.jsonl"), lines);
  EXPECT_EQ(lines, (std::vector<std::string>{R"({"step":2})", R"({"step":3})"}));
}

// A checkpoint folder removed while the run trains is made again and locked: with a warning, or
// without (warn false: a signal removed it before the first step's end).
TEST_F(RunOutputs, AFolderRemovedIsMadeAndLockedAgain) {
  namespace fs = std::filesystem;
  for (const bool warn : {true, false}) {
    const std::string dir = path(warn ? "warned" : "quiet");
    fs::create_directories(dir);
    kiln::MadeFolders made;
    made.lock = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    made.dir = dir;
    fs::remove(dir);
    testing::internal::CaptureStderr();
    made.keep_lock(dir, warn);
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(fs::is_directory(dir));
    EXPECT_EQ(said.find("was removed or replaced while the run trained") != std::string::npos, warn) << said;
  }
}

// A folder the run made and that is gone when it ends may have been made again by another run:
// that one stays.
TEST_F(RunOutputs, AFolderMadeAgainByAnotherRunStays) {
  namespace fs = std::filesystem;
  const std::string dir = path("ck");
  fs::create_directories(dir);
  {
    kiln::MadeFolders made;
    made.folders = {dir};
    made.lock = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    made.dir = dir;
    fs::remove(dir);
    fs::create_directories(dir);  // (another run's now)
  }
  EXPECT_TRUE(fs::is_directory(dir));
  {
    kiln::MadeFolders made;  // the run's own, still empty: removed
    made.folders = {dir};
    made.lock = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    made.dir = dir;
  }
  EXPECT_FALSE(fs::exists(dir));
}

// An earlier run's last line cut short is ended before this run's first line, once.
TEST_F(RunOutputs, ACutLineIsEndedOnce) {
  write("cut.jsonl", "{\"step\":0}\n{\"step\":1,\"lo");
  kiln::LogFile log(path("cut.jsonl"));
  EXPECT_EQ(log.append(R"({"step":1})"), 0);
  EXPECT_EQ(log.append(R"({"step":2})"), 0);
  std::ifstream in(path("cut.jsonl"));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"step\":0}\n{\"step\":1,\"lo\n{\"step\":1}\n{\"step\":2}\n");
}

// A log moved away with another file made at its name (a rotation): the lines go on into that one.
TEST_F(RunOutputs, ARotatedLogGoesOnAtItsName) {
  kiln::LogFile log(path("run.jsonl"));
  EXPECT_EQ(log.append(R"({"step":0})"), 0);
  std::filesystem::rename(path("run.jsonl"), path("run.jsonl.1"));
  write("run.jsonl", "");
  testing::internal::CaptureStderr();
  EXPECT_EQ(log.append(R"({"step":1})"), 0);
  testing::internal::GetCapturedStderr();
  std::ifstream in(path("run.jsonl"));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"step\":1}\n");
}

}  // namespace
