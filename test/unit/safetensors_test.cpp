#include "runtime/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "runtime/error.h"
#include "test/unit/temp_dir_fixture.h"

namespace fs = std::filesystem;

namespace {

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class SafetensorsTest : public kiln::testing::TempDirTest {
 protected:

  // A file laid out by hand: u64 length, header text as given, data bytes.
  std::string raw(const std::string& name, const std::string& header, size_t data_bytes = 0) {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(data_bytes, '\x01');
    return p;
  }
};

// `stmt` must throw kiln::Error: one line containing every given part.
#define EXPECT_KILN_ERROR(stmt, ...)                                                \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "no kiln::Error from " #stmt;                                \
    } catch (const kiln::Error& e) {                                                \
      const std::string msg = e.what();                                             \
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;                          \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__})         \
        EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg; \
    }                                                                               \
  } while (0)

TEST_F(SafetensorsTest, RoundTripKeepsOrderDtypesAndBytes) {
  std::vector<kiln::SafeTensor> in = {
      {"wte", "F32", {2, 3}, bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6})},
      {"b.bias", "BF16", {3}, bytes_of(std::vector<uint16_t>{0x3f80, 0xc000, 0x0000})},
      {"a.index", "I32", {2}, bytes_of(std::vector<int32_t>{-7, 42})},
      {"step", "I64", {}, bytes_of(std::vector<int64_t>{123456789012345})},
      {"empty", "F32", {0, 4}, {}},
      {"h16", "F16", {1}, bytes_of(std::vector<uint16_t>{0x3c00})},
  };
  const std::string p = path("model.safetensors");
  kiln::write_safetensors(p, in);
  std::vector<kiln::SafeTensor> out = kiln::read_safetensors(p);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].name, in[i].name);
    EXPECT_EQ(out[i].dtype, in[i].dtype);
    EXPECT_EQ(out[i].shape, in[i].shape);
    EXPECT_EQ(out[i].bytes, in[i].bytes);
  }
  // The data starts 8-byte aligned: the header length is a multiple of 8.
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_TRUE(kiln::read_safetensors_metadata(p).empty());
}

TEST_F(SafetensorsTest, MetadataRoundTrip) {
  const std::string p = path("ckpt.safetensors");
  std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "1000"}, {"note", "a \"q\""}};
  kiln::write_safetensors(p, {{"x", "F32", {1}, bytes_of(std::vector<float>{3.5f})}}, meta);
  EXPECT_EQ(kiln::read_safetensors_metadata(p), meta);
  auto t = kiln::read_safetensors(p);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(kiln::to_f32(t[0]), std::vector<float>{3.5f});
}

TEST_F(SafetensorsTest, ReadsForeignFileWithoutPadding) {
  // As another writer may lay it out: unpadded header, keys not in data order.
  std::string header =
      R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})";
  const std::string p = path("foreign.safetensors");
  {
    std::ofstream f(p, std::ios::binary);
    uint64_t n = header.size();
    float data[2] = {1.5f, -2.0f};
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    f.write(reinterpret_cast<const char*>(data), 8);
  }
  auto t = kiln::read_safetensors(p);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "a");  // data order
  EXPECT_EQ(kiln::to_f32(t[0]), std::vector<float>{1.5f});
  EXPECT_EQ(kiln::to_f32(t[1]), std::vector<float>{-2.0f});
  EXPECT_EQ(kiln::read_safetensors_metadata(p).at("k"), "v");
}

TEST_F(SafetensorsTest, DtypeSize) {
  EXPECT_EQ(kiln::dtype_size("F32"), 4u);
  EXPECT_EQ(kiln::dtype_size("BF16"), 2u);
  EXPECT_EQ(kiln::dtype_size("F16"), 2u);
  EXPECT_EQ(kiln::dtype_size("I64"), 8u);
  EXPECT_EQ(kiln::dtype_size("U8"), 1u);
  EXPECT_KILN_ERROR(kiln::dtype_size("F33"), "F33");
}

TEST_F(SafetensorsTest, ToF32ConvertsHalfFormats) {
  const float inf = std::numeric_limits<float>::infinity();
  // BF16: 1, -2, 3.140625, -inf
  auto bf = kiln::to_f32(
      {"bf", "BF16", {4}, bytes_of(std::vector<uint16_t>{0x3f80, 0xc000, 0x4049, 0xff80})});
  EXPECT_EQ(bf, (std::vector<float>{1.0f, -2.0f, 3.140625f, -inf}));
  // F16: 1, -2.5, 65504 (max), 2^-24 (smallest subnormal), -0, inf
  auto h = kiln::to_f32(
      {"h",
       "F16",
       {6},
       bytes_of(std::vector<uint16_t>{0x3c00, 0xc100, 0x7bff, 0x0001, 0x8000, 0x7c00})});
  EXPECT_EQ(h, (std::vector<float>{1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24), -0.0f, inf}));
  EXPECT_TRUE(std::signbit(h[4]));
  EXPECT_TRUE(
      std::isnan(kiln::to_f32({"n", "F16", {1}, bytes_of(std::vector<uint16_t>{0x7e00})})[0]));
  EXPECT_KILN_ERROR(kiln::to_f32({"idx", "I32", {1}, bytes_of(std::vector<int32_t>{1})}), "idx",
                    "I32");
  EXPECT_KILN_ERROR(kiln::to_f32({"short", "F32", {2}, bytes_of(std::vector<float>{1})}), "short");
}

TEST_F(SafetensorsTest, CorruptFilesNameFileAndTensor) {
  const std::string ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  struct Case {
    const char* what;
    std::string header;
    size_t data;
    std::vector<const char*> parts;  // besides the file name
  };
  std::vector<Case> cases = {
      {"bad json", R"({"w":{)", 0, {"JSON parse error"}},
      {"not an object", "[1,2]", 0, {"not a JSON object"}},
      {"entry not an object", R"({"w":3})", 0, {"'w'", "not a JSON object"}},
      {"missing dtype", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "dtype"}},
      {"missing shape", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8, {"'w'", "shape"}},
      {"missing offsets", R"({"w":{"dtype":"F32","shape":[2]}})", 8, {"'w'", "data_offsets"}},
      {"unknown dtype",
       R"({"w":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})",
       8,
       {"'w'", "F31"}},
      {"negative dim",
       R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
       8,
       {"'w'", "shape"}},
      {"negative offset", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", 8, {"'w'"}},
      {"offsets out of range", "{\"w\":{" + ok + "}}", 4, {"'w'", "past the end"}},
      {"begin after end",
       R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})",
       8,
       {"'w'", "begin > end"}},
      {"size mismatch",
       R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       8,
       {"'w'", "needs 12"}},
      {"shape overflow",
       R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
       8,
       {"'w'"}},
      // Zero elements need zero bytes, however large the other dimensions: not "more than 2^64".
      {"empty tensor with a huge dimension",
       R"({"w":{"dtype":"F32","shape":[4611686018427387904,8,0],"data_offsets":[0,8]}})",
       8,
       {"'w'", "needs 0"}},
      {"overlap",
       "{\"a\":{" + ok + R"(},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12,
       {"'a'", "'b'", "overlaps"}},
      {"hole",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8,
       {"'w'", "no tensor"}},
      {"trailing bytes", "{\"w\":{" + ok + "}}", 12, {"cover 8"}},
      {"bad metadata", R"({"__metadata__":{"k":1}})", 0, {"__metadata__", "'k'"}},
      {"nul padding", "{\"w\":{" + ok + std::string("}}\0\0", 4), 8, {"a NUL byte at offset"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string p = raw("bad.safetensors", c.header, c.data);
    EXPECT_KILN_ERROR(kiln::read_safetensors(p), p);
    for (const char* part : c.parts) EXPECT_KILN_ERROR(kiln::read_safetensors(p), part);
    EXPECT_KILN_ERROR(kiln::read_safetensors_metadata(p), p);
  }
}

// Header entries of the wrong JSON type, each refused with what is wrong (not accepted as the
// nearest value, nor left to the JSON library's exception).
TEST_F(SafetensorsTest, MistypedHeaderEntriesAreSaid) {
  struct Case {
    const char* what;
    std::string header;
    size_t data;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"dtype a number", R"({"w":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", 8, "dtype is not a string"},
      {"fractional dim", R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8,
       "shape [2.0] has an entry that is not an integer >= 0"},
      {"three offsets", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8,
       "is not [begin, end] with integers >= 0"},
      {"negative end", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,-1]}})", 0,
       "is not [begin, end] with integers >= 0"},
      // Its element count does not fit 64 bits: no byte count matches it, 0 neither.
      {"shape overflow, no bytes",
       R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
       "needs more than 2^64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string p = raw("bad.safetensors", c.header, c.data);
    EXPECT_KILN_ERROR(kiln::read_safetensors(p), p, "tensor 'w'", c.says);
  }
  // The NUL's offset is the file's (the header starts after the 8-byte length).
  const std::string header = std::string(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})") + '\0';
  const std::string p = raw("nul.safetensors", header);
  EXPECT_KILN_ERROR(kiln::read_safetensors(p), "a NUL byte at offset " + std::to_string(8 + header.size() - 1) + " ");
}

TEST_F(SafetensorsTest, TruncatedFilesNameFile) {
  const std::string tiny = path("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary) << "abcd";
  EXPECT_KILN_ERROR(kiln::read_safetensors(tiny), tiny, "too short");

  const std::string p = path("long_header.safetensors");
  {
    std::ofstream f(p, std::ios::binary);
    uint64_t n = 1000;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  EXPECT_KILN_ERROR(kiln::read_safetensors(p), p, "beyond the end");

  // A real file cut short loses tensor data.
  const std::string full = path("full.safetensors");
  kiln::write_safetensors(full, {{"w", "F32", {4}, bytes_of(std::vector<float>{1, 2, 3, 4})}});
  fs::resize_file(full, fs::file_size(full) - 3);
  EXPECT_KILN_ERROR(kiln::read_safetensors(full), full, "'w'");

  const std::string missing = path("missing.safetensors");
  EXPECT_KILN_ERROR(kiln::read_safetensors(missing), missing);
}

TEST_F(SafetensorsTest, AtomicWriteLeavesNoTmpFiles) {
  const std::string p = path("model.safetensors");
  kiln::write_safetensors(p, {{"w", "F32", {1}, bytes_of(std::vector<float>{1})}});
  kiln::write_safetensors(p, {{"w", "F32", {1}, bytes_of(std::vector<float>{2})}});  // overwrite
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(kiln::to_f32(kiln::read_safetensors(p)[0]), std::vector<float>{2});

  // Invalid tensors: error naming file and tensor; the old file stays, no tmp left behind.
  EXPECT_KILN_ERROR(
      kiln::write_safetensors(p, {{"w", "F32", {2}, bytes_of(std::vector<float>{9})}}), p, "'w'");
  EXPECT_KILN_ERROR(kiln::write_safetensors(p, {{"w", "X9", {1}, {0}}}), p, "X9");
  EXPECT_KILN_ERROR(kiln::write_safetensors(p, {{"w", "U8", {1}, {0}}, {"w", "U8", {1}, {0}}}), p,
                    "twice");
  EXPECT_KILN_ERROR(kiln::write_safetensors(p, {{"__metadata__", "U8", {1}, {0}}}), p);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(kiln::to_f32(kiln::read_safetensors(p)[0]), std::vector<float>{2});

  // Rename fails (target is a non-empty directory): the tmp file is removed.
  fs::create_directory(path("blocked"));
  std::ofstream(path("blocked/x")) << "x";
  EXPECT_KILN_ERROR(kiln::write_safetensors(path("blocked"), {}), path("blocked"));
  EXPECT_EQ(listing(), (std::vector<std::string>{"blocked", "model.safetensors"}));

  // Unwritable location: error, nothing created.
  const std::string nodir = path("no/such/dir/m.safetensors");
  EXPECT_KILN_ERROR(kiln::write_safetensors(nodir, {}), nodir);
}

TEST_F(SafetensorsTest, EmptyFileRoundTrip) {
  const std::string p = path("empty.safetensors");
  kiln::write_safetensors(p, {});
  EXPECT_TRUE(kiln::read_safetensors(p).empty());
}

}  // namespace
