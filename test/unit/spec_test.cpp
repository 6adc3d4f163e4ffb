// parse_spec and the rules it shares with a module's kiln.spec (compiler/spec.h): the defaults it
// fills in, each integer key's range, and the errors test/lit/tools/kilnc-spec-errors.test does
// not reach, each as its exact message.
#include "compiler/spec.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <tuple>

#include "runtime/error.h"
#include "temp_dir_fixture.h"

namespace kiln {
namespace {

// A valid spec; each test changes a line of it.
constexpr const char* kSpec =
    "[model]\n"
    "n_layer = 1\n"
    "n_head = 2\n"
    "n_embd = 8\n"
    "vocab_size = 16\n"
    "block_size = 8\n"
    "[compile]\n"
    "batch_size = 2\n";

// `text` with the line starting with `from` replaced by `to` ("" removes it).
std::string replace_line(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find("\n" + from) + 1;
  const size_t end = text.find('\n', at) + 1;
  return text.replace(at, end - at, to.empty() ? "" : to + "\n");
}

class Spec : public testing::TempDirTest {
 protected:
  // Writes `text` to the file `name` in the test's folder; returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
    return path(name);
  }
  // parse_spec's error for `text`, without the file's path.
  std::string error(const std::string& text) const {
    const std::string file = write("spec.toml", text);
    try {
      parse_spec(file);
    } catch (const Error& e) {
      const std::string message = e.what();
      return message.rfind(file, 0) == 0 ? message.substr(file.size()) : message;
    }
    return "(no error)";
  }
};

TEST_F(Spec, KeysLeftOutTakeTheirDefaults) {
  const ModelSpec s = parse_spec(write("small.toml", kSpec));
  EXPECT_EQ(s.name, "small");
  EXPECT_EQ(s.seq_len, 8);  // block_size
  EXPECT_EQ(s.precision, "fp32");
  EXPECT_EQ(s.target, "cpu");
  EXPECT_EQ(s.model_line, 1);
}

// The keys' values where given, and the line of [model] (for IR locations).
TEST_F(Spec, KeysGivenAreRead) {
  const std::string text = "# a comment\n\n" + std::string(kSpec) + "seq_len = 4\nprecision = \"bf16\"\ntarget = \"cuda\"\n";
  const ModelSpec s = parse_spec(write("given.toml", replace_line(text, "[model]", "[model]\nname = \"GPT-2 small\"")));
  EXPECT_EQ(s.name, "GPT-2 small");
  EXPECT_EQ(s.model_line, 3);
  EXPECT_EQ(std::tuple(s.n_layer, s.n_head, s.n_embd, s.vocab_size, s.block_size), std::tuple(1, 2, 8, 16, 8));
  EXPECT_EQ(std::tuple(s.batch_size, s.seq_len, s.precision, s.target), std::tuple(2, 4, "bf16", "cuda"));
}

// The name taken from the file's stem follows the rule of [model] name: a quote or backslash
// becomes '_' (a space stays).
TEST_F(Spec, TheNameFromTheFileReplacesWhatANameMayNotHold) {
  EXPECT_EQ(parse_spec(write("my \"gpt\\2.toml", kSpec)).name, "my _gpt_2");
}

// Each integer key's range, one past either end.
TEST_F(Spec, IntegerKeysOutOfRange) {
  const struct {
    const char* line;
    const char* message;
  } cases[] = {
      {"n_layer = 1025", ":2:11: [model] n_layer = 1025 is out of range [1, 1024]"},
      {"n_head = 1025", ":3:10: [model] n_head = 1025 is out of range [1, 1024]"},
      {"n_embd = 0", ":4:10: [model] n_embd = 0 is out of range [1, 65536]"},
      {"n_embd = 65537", ":4:10: [model] n_embd = 65537 is out of range [1, 65536]"},
      {"vocab_size = 1",
       ":5:14: [model] vocab_size = 1 is out of range [2, 65536] (llm.c's token shards hold uint16 ids)"},
      {"block_size = 0", ":6:14: [model] block_size = 0 is out of range [1, 1048576]"},
      {"block_size = 1048577", ":6:14: [model] block_size = 1048577 is out of range [1, 1048576]"},
      {"batch_size = 0", ":8:14: [compile] batch_size = 0 is out of range [1, 65536]"},
      {"batch_size = 65537", ":8:14: [compile] batch_size = 65537 is out of range [1, 65536]"},
  };
  for (const auto& c : cases) {
    const std::string key = std::string(c.line).substr(0, std::string(c.line).find(' '));
    EXPECT_EQ(error(replace_line(kSpec, key, c.line)), c.message) << c.line;
  }
  EXPECT_EQ(error(std::string(kSpec) + "seq_len = 0\n"), ":9:11: [compile] seq_len = 0 is out of range [1, 1048576]");
  EXPECT_EQ(error(std::string(kSpec) + "seq_len = 1048577\n"),
            ":9:11: [compile] seq_len = 1048577 is out of range [1, 1048576]");
}

// A float or boolean is not an integer, even where toml++ would convert it (2.0, true).
TEST_F(Spec, AnIntegerKeyTakesOnlyAnInteger) {
  EXPECT_EQ(error(replace_line(kSpec, "n_layer", "n_layer = 2.0")), ":2:11: [model] n_layer must be an integer");
  EXPECT_EQ(error(replace_line(kSpec, "batch_size", "batch_size = true")),
            ":8:14: [compile] batch_size must be an integer");
}

TEST_F(Spec, BothTablesAreRequired) {
  EXPECT_EQ(error(replace_line(kSpec, "[compile]", "")), ": missing the table [compile]");
  EXPECT_EQ(error("[compile]\nbatch_size = 2\n"), ": missing the table [model]");
}

// The vocabulary is padded to a multiple of 128 for the widest activation (65409 to 65536).
TEST(SpecRelations, TheLogitsWidthIsTheVocabularyPadded) {
  ModelSpec s;
  s.n_layer = 1, s.n_head = 1, s.n_embd = 64, s.vocab_size = 65409, s.block_size = s.seq_len = 1 << 20;
  s.batch_size = 65536;
  const auto bad = spec_relation_error(s, [](const std::string& key) { return key; });
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->first, "batch_size");
  EXPECT_EQ(bad->second,
            "batch_size x seq_len x vocab_size (padded to 65536) = 4503599627370496 elements in one activation, "
            "above 2^48, the most a Kiln tensor holds");
}

}  // namespace
}  // namespace kiln
