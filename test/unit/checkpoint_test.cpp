// Training checkpoints: round trip, retention and `latest`, and refusing (without touching the
// executor) anything corrupt, truncated, forged or saved for another model.
#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/cpu/bf16.h"
#include "runtime/data_parallel.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/file_io.h"
#include "runtime/module.h"
#include "test/unit/param_module.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::ModelSpec;
using testing::ParamSpec;
using testing::param_module;

// Fills every parameter's value, grad and moments with distinct bit patterns, including -0, a
// denormal and the extremes of the finite range, which only a bitwise copy preserves. (No NaN or
// infinity: a state holding one is never saved; nor a negative second moment, which no step makes.)
void fill(Executor& ex, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (const fb::Parameter* p : *ex.module().fb().parameters())
    for (uint32_t idx : {p->value(), p->grad(), p->adam_m(), p->adam_v()}) {
      float* f = ex.f32(idx);
      for (int64_t i = 0; i < numel(ex.module().buffer(idx)); ++i) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        uint32_t bits = x;
        if ((bits & 0x7f800000u) == 0x7f800000u) bits ^= 0x00800000u;  // finite: exponent not all ones
        if (i == 0) bits = 0x80000000u;       // -0.0
        if (i == 1) bits = 0x00000001u;       // smallest denormal
        if (i == 2) bits = 0x7f7fffffu;       // largest finite
        if (i == 3) bits = 0x80800000u;       // -smallest normal
        if (idx == p->adam_v() && i != 0) bits &= 0x7fffffffu;  // v >= 0 (-0.0 is not below 0)
        std::memcpy(&f[i], &bits, 4);
      }
    }
}

// Every byte of every parameter's four buffers, for "nothing changed" checks.
std::vector<uint8_t> snapshot(Executor& ex) {
  std::vector<uint8_t> out;
  for (const fb::Parameter* p : *ex.module().fb().parameters())
    for (uint32_t idx : {p->value(), p->grad(), p->adam_m(), p->adam_v()}) {
      auto* b = reinterpret_cast<const uint8_t*>(ex.f32(idx));
      out.insert(out.end(), b, b + ex.module().buffer(idx).size());
    }
  return out;
}

std::vector<uint8_t> bytes_of(Executor& ex, uint32_t idx) {
  auto* b = reinterpret_cast<const uint8_t*>(ex.f32(idx));
  return {b, b + ex.module().buffer(idx).size()};
}

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

std::string read_text(const fs::path& p) {
  auto b = read_file(p.string());
  return {b.begin(), b.end()};
}

// A plain write: the flip test rewrites the file once per byte and fsync would dominate.
void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()), long(b.size()));
}

// The reference CRC-32 (bit at a time), to check the file's trailer independently.
uint32_t reference_crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0xEDB88320u : 0u);
  }
  return ~c;
}

// Makes the trailer the CRC-32 of the rest again after an edit.
void rechecksum(std::vector<uint8_t>& file) {
  const uint32_t crc = reference_crc32(file.data() + 8, file.size() - 12);
  std::memcpy(&file[file.size() - 4], &crc, 4);
}

// A header's text followed by spaces so that the data starts at a multiple of 64, as the writer pads.
std::string padded(std::string text) {
  text.append((64 - (32 + text.size()) % 64) % 64, ' ');
  return text;
}

// A checkpoint file of `header` and `data` with the prefix of `like` (a saved file) and the
// lengths and the checksum made right, so that whatever else is wrong passes the checksum.
std::vector<uint8_t> framed(const std::vector<uint8_t>& like, const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(like.begin(), like.begin() + 32);
  const uint64_t len = header.size(), size = 32 + len + data.size() + 4;
  std::memcpy(&out[16], &len, 8);
  std::memcpy(&out[24], &size, 8);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  out.resize(out.size() + 4);
  rechecksum(out);
  return out;
}

// The message of the kiln::Error `f` throws (fails the test when it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kiln::Error";
  return "";
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln-ckpt-" + std::to_string(getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  Module module_ = Module::from_bytes(param_module(), "test.kiln");
};

TrainingState sample_state(int64_t step) {
  TrainingState st;
  st.step = step;
  st.data_shard = 3;
  st.data_position = 123456789012;
  st.rng_state = 0xfedcba9876543210ull;  // above 2^53: would not survive a JSON double
  st.world_size = 8;
  st.zero_stage = 1;
  st.extra_json = R"({"lr_scale":0.5,"note":"x"})";
  return st;
}

TEST_F(Checkpoint, RoundTripRestoresValuesMomentsAndStateBitwise) {
  Executor a(module_);
  fill(a, 1);
  save_checkpoint(dir_.string(), a, sample_state(100), 3);
  const fs::path file = dir_ / "ckpt_00000100.kiln-ckpt";
  ASSERT_TRUE(fs::exists(file));

  Executor b(module_);
  fill(b, 2);
  const auto grads_before = [&] {
    std::vector<std::vector<uint8_t>> g;
    for (const fb::Parameter* p : *module_.fb().parameters()) g.push_back(bytes_of(b, p->grad()));
    return g;
  }();
  TrainingState st = load_checkpoint(file.string(), b);
  size_t i = 0;
  for (const fb::Parameter* p : *module_.fb().parameters()) {
    const std::string name = p->name()->str();
    EXPECT_EQ(bytes_of(a, p->value()), bytes_of(b, p->value())) << name;
    EXPECT_EQ(bytes_of(a, p->adam_m()), bytes_of(b, p->adam_m())) << name;
    EXPECT_EQ(bytes_of(a, p->adam_v()), bytes_of(b, p->adam_v())) << name;
    EXPECT_EQ(grads_before[i++], bytes_of(b, p->grad())) << name << ": gradients are not saved or loaded";
  }
  const TrainingState want = sample_state(100);
  EXPECT_EQ(st.step, 100);
  EXPECT_EQ(st.data_shard, want.data_shard);
  EXPECT_EQ(st.data_position, want.data_position);
  EXPECT_EQ(st.rng_state, want.rng_state);
  EXPECT_EQ(st.world_size, 8);
  EXPECT_EQ(st.zero_stage, 1);
  EXPECT_EQ(st.extra_json, want.extra_json);
  EXPECT_EQ(st.spec_fingerprint, module_fingerprint(module_));
}

TEST_F(Checkpoint, LoadRoundsTheBf16ComputeCopiesFromTheLoadedValues) {
  ModelSpec mixed;
  mixed.compute_copy = true;
  mixed.precision = "bf16";
  Module m = Module::from_bytes(param_module(mixed), "mixed.kiln");
  Executor a(m);
  fill(a, 1);
  save_checkpoint(dir_.string(), a, sample_state(1), 0);
  Executor b(m);  // its compute copy is all zeros until the load
  load_checkpoint((dir_ / "ckpt_00000001.kiln-ckpt").string(), b);
  const fb::Parameter& p = *m.fb().parameters()->Get(0);
  ASSERT_GE(p.compute_copy(), 0);
  const auto* copy = reinterpret_cast<const uint16_t*>(b.f32(uint32_t(p.compute_copy())));
  const float* value = b.f32(p.value());
  for (int64_t i = 0; i < numel(m.buffer(p.value())); ++i) ASSERT_EQ(copy[i], cpu::to_bf16(value[i])) << i;
}

TEST_F(Checkpoint, FileIsFramedAndTheTrailerIsTheCrc32OfEverythingAfterTheMagic) {
  Executor ex(module_);
  fill(ex, 1);
  save_checkpoint(dir_.string(), ex, sample_state(7), 0);
  const auto b = read_file((dir_ / "ckpt_00000007.kiln-ckpt").string());
  ASSERT_GT(b.size(), 36u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "KILNCKPT");
  uint32_t version, crc;
  uint64_t header_len, file_size;
  std::memcpy(&version, &b[8], 4);
  std::memcpy(&header_len, &b[16], 8);
  std::memcpy(&file_size, &b[24], 8);
  std::memcpy(&crc, &b[b.size() - 4], 4);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(file_size, b.size());
  EXPECT_EQ((32 + header_len) % 64, 0u);
  EXPECT_EQ(crc, reference_crc32(b.data() + 8, b.size() - 12));
  // Data: value, adam_m, adam_v of each parameter, as the header's table says.
  auto h = nlohmann::json::parse(b.begin() + 32, b.begin() + 32 + long(header_len));
  EXPECT_EQ(h["step"], 7);
  EXPECT_EQ(h["rng_state"], "fedcba9876543210");
  const auto& p0 = h["parameters"][0];
  EXPECT_EQ(p0["name"], "wte.weight");
  EXPECT_EQ(p0["shape"], nlohmann::json({16, 4}));
  const uint64_t off = p0["adam_m"][0];
  EXPECT_EQ(std::memcmp(&b[32 + header_len + off], ex.f32(module_.fb().parameters()->Get(0)->adam_m()), 16 * 4 * 4), 0);
  EXPECT_EQ(32 + header_len + uint64_t(h["parameters"][2]["adam_v"][0]) + 16 + 4, b.size());
}

TEST_F(Checkpoint, KeepLeavesTheNewestKAndLatestPointsAtTheNewest) {
  Executor ex(module_);
  for (int64_t step : {10, 20, 30, 40, 50}) save_checkpoint(dir_.string(), ex, sample_state(step), 2);
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000040.kiln-ckpt", "ckpt_00000050.kiln-ckpt", "latest"}));
  EXPECT_EQ(read_text(dir_ / "latest"), "ckpt_00000050.kiln-ckpt\n");
  EXPECT_EQ(latest_checkpoint(dir_.string()), (dir_ / "ckpt_00000050.kiln-ckpt").string());
  EXPECT_EQ(load_checkpoint(*latest_checkpoint(dir_.string()), ex).step, 50);

  // keep <= 0 keeps everything.
  for (int64_t step : {60, 70}) save_checkpoint(dir_.string(), ex, sample_state(step), 0);
  EXPECT_EQ(listing(dir_).size(), 5u);
  // Steps past 8 digits still sort by number, not by name.
  save_checkpoint(dir_.string(), ex, sample_state(123456789), 2);
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000070.kiln-ckpt", "ckpt_123456789.kiln-ckpt", "latest"}));
}

TEST_F(Checkpoint, KeepNeverDeletesTheCheckpointJustWritten) {
  // A run rewound to an earlier checkpoint saves lower steps than files already there.
  Executor ex(module_);
  save_checkpoint(dir_.string(), ex, sample_state(100), 1);
  save_checkpoint(dir_.string(), ex, sample_state(50), 1);
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000050.kiln-ckpt", "latest"}));
  EXPECT_EQ(latest_checkpoint(dir_.string()), (dir_ / "ckpt_00000050.kiln-ckpt").string());
}

TEST_F(Checkpoint, LatestFallsBackToTheHighestNumberedAndIsNulloptWithoutCheckpoints) {
  EXPECT_EQ(latest_checkpoint((dir_ / "missing").string()), std::nullopt);
  fs::create_directories(dir_);
  EXPECT_EQ(latest_checkpoint(dir_.string()), std::nullopt);
  Executor ex(module_);
  for (int64_t step : {5, 12, 9}) save_checkpoint(dir_.string(), ex, sample_state(step), 0);
  EXPECT_EQ(latest_checkpoint(dir_.string()), (dir_ / "ckpt_00000009.kiln-ckpt").string());  // what latest says
  fs::remove(dir_ / "latest");
  write_bytes(dir_ / "ckpt_00000099.kiln-ckpt.tmp.1", {1, 2, 3});  // a crashed write is no checkpoint
  EXPECT_EQ(latest_checkpoint(dir_.string()), (dir_ / "ckpt_00000012.kiln-ckpt").string());
  // A `latest` naming a missing file, or something that is not a checkpoint name, is an error.
  write_bytes(dir_ / "latest", {'c', 'k', 'p', 't', '_', '1', '.', 'k', 'i', 'l', 'n', '-', 'c', 'k', 'p', 't'});
  EXPECT_NE(error_of([&] { latest_checkpoint(dir_.string()); }).find("latest: names ckpt_1.kiln-ckpt, which does not exist"),
            std::string::npos);
  // ...and one naming a folder or a pipe is not called missing.
  fs::create_directory(dir_ / "ckpt_2.kiln-ckpt");
  write_bytes(dir_ / "latest", {'c', 'k', 'p', 't', '_', '2', '.', 'k', 'i', 'l', 'n', '-', 'c', 'k', 'p', 't'});
  EXPECT_NE(error_of([&] { latest_checkpoint(dir_.string()); })
                .find("latest: names ckpt_2.kiln-ckpt, which is not a regular file (a folder, a pipe or a device)"),
            std::string::npos);
  fs::remove(dir_ / "ckpt_2.kiln-ckpt");
  write_bytes(dir_ / "latest", {'.', '.', '/', 'x'});
  EXPECT_NE(error_of([&] { latest_checkpoint(dir_.string()); }).find("is not a checkpoint file name"), std::string::npos);
}

TEST_F(Checkpoint, FlippedByteAnywhereIsAChecksumErrorAndLoadsNothing) {
  Executor a(module_);
  fill(a, 1);
  save_checkpoint(dir_.string(), a, sample_state(100), 0);
  const fs::path file = dir_ / "ckpt_00000100.kiln-ckpt";
  const auto good = read_file(file.string());
  Executor b(module_);
  fill(b, 2);
  const auto before = snapshot(b);
  const fs::path bad = dir_ / "ckpt_00000100.kiln-ckpt";
  // Every byte after the magic: the frame, the header, the data and the checksum itself.
  for (size_t i = 8; i < good.size(); ++i) {
    auto corrupt = good;
    corrupt[i] ^= uint8_t(1u << (i % 8));
    write_bytes(bad, corrupt);
    const std::string msg = error_of([&] { load_checkpoint(bad.string(), b); });
    ASSERT_NE(msg.find("ckpt_00000100.kiln-ckpt: checksum mismatch (file corrupt or truncated"), std::string::npos)
        << "byte " << i << ": " << msg;
  }
  // The magic is outside the checksum: a damaged one is "not a checkpoint".
  auto corrupt = good;
  corrupt[3] ^= 0x20;
  write_bytes(bad, corrupt);
  EXPECT_NE(error_of([&] { load_checkpoint(bad.string(), b); }).find("not a Kiln checkpoint"), std::string::npos);
  EXPECT_EQ(snapshot(b), before);
}

TEST_F(Checkpoint, TruncatedFileIsAnErrorAndLoadsNothing) {
  Executor a(module_);
  fill(a, 1);
  save_checkpoint(dir_.string(), a, sample_state(100), 0);
  const auto good = read_file((dir_ / "ckpt_00000100.kiln-ckpt").string());
  Executor b(module_);
  fill(b, 2);
  const auto before = snapshot(b);
  const fs::path cut = dir_ / "cut.kiln-ckpt";
  for (size_t len : {size_t(0), size_t(5), size_t(8), size_t(35), size_t(36), good.size() / 2, good.size() - 4,
                     good.size() - 1}) {
    write_bytes(cut, std::vector<uint8_t>(good.begin(), good.begin() + long(len)));
    const std::string msg = error_of([&] { load_checkpoint(cut.string(), b); });
    EXPECT_NE(msg.find("cut.kiln-ckpt: "), std::string::npos) << len << ": " << msg;
    if (len >= 8) {
      EXPECT_NE(msg.find("(file corrupt or truncated"), std::string::npos) << len << ": " << msg;
    }
    if (len >= 36) {  // the frame is whole, so the message can say how much is missing
      EXPECT_NE(msg.find(std::to_string(len) + " bytes, the header says " + std::to_string(good.size())), std::string::npos)
          << msg;
    }
  }
  EXPECT_EQ(snapshot(b), before);
  EXPECT_NE(error_of([&] { load_checkpoint((dir_ / "absent.kiln-ckpt").string(), b); }).find("absent.kiln-ckpt: cannot open"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_checkpoint(dir_.string(), b); }).find("is a folder; give the checkpoint's file"), std::string::npos);
  // A FIFO is refused at once, not waited on for a writer.
  ASSERT_EQ(::mkfifo((dir_ / "fifo.kiln-ckpt").c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { load_checkpoint((dir_ / "fifo.kiln-ckpt").string(), b); }).find("fifo.kiln-ckpt: not a regular file (a pipe or a device?); give the checkpoint's file"),
            std::string::npos);
  EXPECT_EQ(snapshot(b), before);
}

TEST_F(Checkpoint, OtherModelIsAFingerprintErrorAndLoadsNothing) {
  Executor a(module_);
  fill(a, 1);
  save_checkpoint(dir_.string(), a, sample_state(100), 0);
  const std::string file = (dir_ / "ckpt_00000100.kiln-ckpt").string();

  ModelSpec wider;
  wider.n_embd = 8;
  wider.params = {{"wte.weight", {16, 8}, true}, {"h.0.attn.c_attn.weight", {8, 24}, true}, {"ln_f.weight", {8}, false}};
  Module other = Module::from_bytes(param_module(wider), "wide.kiln");
  Executor b(other);
  fill(b, 2);
  const auto before = snapshot(b);
  const std::string msg = error_of([&] { load_checkpoint(file, b); });
  EXPECT_NE(msg.find("ckpt_00000100.kiln-ckpt: compiled for a different model (n_embd: the checkpoint's 4, this module's 8; "
                     "the checkpoint's fingerprint " + module_fingerprint(module_) + ", this module's " + module_fingerprint(other) + ")"),
            std::string::npos)
      << msg;
  EXPECT_EQ(snapshot(b), before);

  // Same sizes, one parameter's decay group differs: the message names it.
  ModelSpec nodecay;
  nodecay.params[1].decay = false;
  Module third = Module::from_bytes(param_module(nodecay), "nodecay.kiln");
  Executor c(third);
  EXPECT_NE(error_of([&] { load_checkpoint(file, c); }).find("parameter 'h.0.attn.c_attn.weight' weight decay: the checkpoint's true, this module's false"),
            std::string::npos);

  // Same sizes, one parameter's shape differs: the message says which is the checkpoint's.
  ModelSpec reshaped;
  reshaped.params[1].shape = {12, 4};
  Module fourth = Module::from_bytes(param_module(reshaped), "reshaped.kiln");
  Executor d(fourth);
  EXPECT_NE(error_of([&] { load_checkpoint(file, d); })
                .find("parameter 'h.0.attn.c_attn.weight' shape: the checkpoint's [4, 12], this module's [12, 4]"),
            std::string::npos);
}

TEST_F(Checkpoint, FingerprintCoversSizesNamesShapesDecayAndPrecisionButNotThePlan) {
  const std::string base = module_fingerprint(module_);
  EXPECT_EQ(base.size(), 16u);
  EXPECT_EQ(base, "0eac560d6ad208e0");  // pinned (checked in Python): a change orphans every checkpoint
  auto fp = [](const ModelSpec& s) { return module_fingerprint(Module::from_bytes(param_module(s), "x.kiln")); };
  ModelSpec replanned;
  replanned.reverse_layout = true;  // other buffer offsets
  replanned.batch_size = 4;         // run configuration, not the model
  std::reverse(replanned.params.begin(), replanned.params.end());  // other parameter order
  EXPECT_EQ(fp(replanned), base);
  ModelSpec s;
  s.precision = "bf16";
  EXPECT_NE(fp(s), base);
  s = {};
  s.params[2].decay = true;
  EXPECT_NE(fp(s), base);
  s = {};
  s.params[0].name = "lm_head.weight";
  EXPECT_NE(fp(s), base);
  s = {};
  s.params[1].shape = {12, 4};  // same element count
  EXPECT_NE(fp(s), base);
}

TEST_F(Checkpoint, LoadsAReplannedModuleByName) {
  Executor a(module_);
  fill(a, 1);
  save_checkpoint(dir_.string(), a, sample_state(3), 0);
  ModelSpec replanned;
  replanned.reverse_layout = true;
  std::reverse(replanned.params.begin(), replanned.params.end());
  Module other = Module::from_bytes(param_module(replanned), "replanned.kiln");
  Executor b(other);
  load_checkpoint((dir_ / "ckpt_00000003.kiln-ckpt").string(), b);
  for (const fb::Parameter* p : *module_.fb().parameters())
    for (const fb::Parameter* q : *other.fb().parameters())
      if (p->name()->str() == q->name()->str()) {
        EXPECT_EQ(bytes_of(a, p->value()), bytes_of(b, q->value()));
        EXPECT_EQ(bytes_of(a, p->adam_v()), bytes_of(b, q->adam_v()));
      }
}

// A header that passes the checksum (rewritten and re-checksummed) is still validated in full.
TEST_F(Checkpoint, ValidatesAForgedHeaderThatPassesTheChecksum) {
  Executor a(module_);
  fill(a, 1);
  save_checkpoint(dir_.string(), a, sample_state(100), 0);
  const auto good = read_file((dir_ / "ckpt_00000100.kiln-ckpt").string());
  uint64_t header_len;
  std::memcpy(&header_len, &good[16], 8);
  const nlohmann::ordered_json header =
      nlohmann::ordered_json::parse(good.begin() + 32, good.begin() + 32 + long(header_len));
  std::vector<uint8_t> data(good.begin() + 32 + long(header_len), good.end() - 4);

  // `first`: text put right after the header's opening brace (JSON the dump cannot hold).
  auto forge = [&](const nlohmann::ordered_json& h, int64_t misalign = 0, const std::string& first = "") {
    std::string text = h.dump();
    text.insert(1, first);
    const fs::path p = dir_ / "forged.kiln-ckpt";
    write_bytes(p, framed(good, padded(text) + std::string(size_t(64 + misalign), ' '), data));
    return p.string();
  };
  Executor b(module_);
  fill(b, 2);
  const auto before = snapshot(b);
  auto expect_error = [&](const nlohmann::ordered_json& h, const std::string& want) {
    const std::string msg = error_of([&] { load_checkpoint(forge(h), b); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  };
  EXPECT_EQ(load_checkpoint(forge(header), b).step, 100);  // the forger itself is right
  fill(b, 2);

  auto h = header;
  h["parameters"][2]["adam_v"][0] = data.size();
  expect_error(h, "header: parameter 'ln_f.weight': adam_v [");
  h = header;
  h["parameters"][0]["value"][1] = 4;
  expect_error(h, "parameter 'wte.weight': value holds 4 bytes, the shape needs 256");
  h = header;
  h["parameters"].erase(1);
  expect_error(h, "parameter 'h.0.attn.c_attn.weight' is missing");
  h = header;
  h["parameters"].push_back(header["parameters"][0]);
  expect_error(h, "parameter 'wte.weight': appears twice");
  h = header;
  h["parameters"][0]["shape"] = {4, 16};  // same bytes, other shape
  expect_error(h, "parameter 'wte.weight' has shape [4, 16] in the checkpoint, [16, 4] in the module");
  // A key given twice (JSON would keep the last) is refused, not read as either.
  {
    const std::string msg = error_of([&] { load_checkpoint(forge(header, 0, "\"step\":7,"), b); });
    EXPECT_NE(msg.find("forged.kiln-ckpt: header: 'step' appears twice"), std::string::npos) << msg;
  }
  h = header;
  h["parameters"][0]["decay"] = !header["parameters"][0]["decay"].get<bool>();
  expect_error(h, "header: parameter 'wte.weight': decay ");
  h = header;
  h["rng_state"] = 12;
  expect_error(h, "header: rng_state 12 is not 16 lowercase hex digits");
  h = header;
  h.erase("step");
  expect_error(h, "header: missing \"step\"");
  h = header;
  h["model"]["n_head"] = 5;  // the fingerprint is the module's; the description must agree with it
  expect_error(h, "header: model: n_head: the checkpoint's 5, this module's 1, yet its fingerprint is this module's");
  h = header;
  h.erase("model");
  expect_error(h, "header: missing \"model\"");
  h = header;
  h["zero_stage"] = 7;
  expect_error(h, "header: zero_stage 7 is not 0 or 1 (--zero)");
  // Read as a rank count and a token offset, a 0 or a -1 once gave "written by 0 rank(s)" and a
  // seek to token 2^63 - 1.
  h = header;
  h["world_size"] = 0;
  expect_error(h, "header: world_size 0 is not a rank count (1 or more)");
  h = header;
  h["data_position"] = -1;
  expect_error(h, "header: data_position -1 is negative");
  h = header;
  h["parameters"][1]["adam_m"][0] = uint64_t(header["parameters"][1]["adam_m"][0]) + 2;
  expect_error(h, "] does not start at a multiple of 4 bytes (fp32)");
  EXPECT_NE(error_of([&] { load_checkpoint(forge(header, 1), b); }).find("length: the data starts at byte"),
            std::string::npos);
  // Values no run saves: a NaN, an infinity, a negative second moment.
  for (const auto& [field, bits, want] :
       {std::tuple{"value", 0x7fc00000u, "parameter 'h.0.attn.c_attn.weight' value element 5 is NaN"},
        {"adam_m", 0xff800000u, "'h.0.attn.c_attn.weight' AdamW m element 5 is infinite"},
        {"adam_v", 0xbf800000u, "'h.0.attn.c_attn.weight' AdamW v element 5 is negative (a second moment)"}}) {
    const std::vector<uint8_t> kept = data;
    std::memcpy(&data[uint64_t(header["parameters"][1][field][0]) + 20], &bits, 4);
    expect_error(header, want);
    data = kept;
  }
  // The name says the step: `latest` and --keep go by it.
  fs::copy_file(dir_ / "ckpt_00000100.kiln-ckpt", dir_ / "ckpt_00000007.kiln-ckpt");
  EXPECT_NE(error_of([&] { load_checkpoint((dir_ / "ckpt_00000007.kiln-ckpt").string(), b); })
                .find("ckpt_00000007.kiln-ckpt: header: step 100 is not the step 7 its name says"),
            std::string::npos);
  EXPECT_EQ(snapshot(b), before);
}

TEST_F(Checkpoint, NoTemporaryFilesAreLeftBehindEvenWhenASaveFails) {
  Executor ex(module_);
  save_checkpoint(dir_.string(), ex, sample_state(1), 0);
  save_checkpoint(dir_.string(), ex, sample_state(2), 1);
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000002.kiln-ckpt", "latest"}));
  // A directory in the way makes the rename fail: the save throws, leaves no temporary file,
  // and `latest` still names the last good checkpoint.
  fs::create_directories(dir_ / "ckpt_00000003.kiln-ckpt");
  EXPECT_NE(error_of([&] { save_checkpoint(dir_.string(), ex, sample_state(3), 1); }).find("ckpt_00000003.kiln-ckpt"),
            std::string::npos);
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000002.kiln-ckpt", "ckpt_00000003.kiln-ckpt", "latest"}));
  EXPECT_EQ(latest_checkpoint(dir_.string()), (dir_ / "ckpt_00000002.kiln-ckpt").string());
  // Bad input fails before anything is written.
  TrainingState st = sample_state(4);
  st.extra_json = "[1]";
  EXPECT_NE(error_of([&] { save_checkpoint(dir_.string(), ex, st, 1); }).find("extra_json is not a JSON object"),
            std::string::npos);
  st = sample_state(-1);
  EXPECT_THROW(save_checkpoint(dir_.string(), ex, st, 1), Error);
  EXPECT_EQ(listing(dir_).size(), 3u);
}

// A finite loss can lead to an update that is not (a huge learning rate): such a state is
// refused, so the last good checkpoint stays the latest and nothing else is written.
TEST_F(Checkpoint, ANonFiniteStateIsNeverSaved) {
  Executor ex(module_);
  fill(ex, 1);
  save_checkpoint(dir_.string(), ex, sample_state(1), 1);
  const fb::Parameter* p = module_.fb().parameters()->Get(1);
  for (uint32_t idx : {p->value(), p->adam_m(), p->adam_v()}) {
    float* f = ex.f32(idx);
    const float keep = f[5];
    f[5] = idx == p->adam_v() ? INFINITY : NAN;
    const std::string what = idx == p->value() ? "(value)" : idx == p->adam_m() ? "(AdamW m)" : "(AdamW v)";
    const std::string e = error_of([&] { save_checkpoint(dir_.string(), ex, sample_state(2), 1); });
    EXPECT_NE(e.find("ckpt_00000002.kiln-ckpt: not written: parameter '" + p->name()->str() + "' " + what +
                     " holds a NaN or an infinity after step 2's update; the last good checkpoint is kept"),
              std::string::npos)
        << e;
    f[5] = keep;
  }
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000001.kiln-ckpt", "latest"}));
  EXPECT_EQ(latest_checkpoint(dir_.string()), (dir_ / "ckpt_00000001.kiln-ckpt").string());
}

// ZeRO-1: an executor built with optimizer slices keeps only those elements of the moments. The
// layout packs them without overlaps, element 0 stays 256-byte aligned, a checkpoint loads into
// the slices, and one saved with the gathered whole moments is the plain run's file, byte for byte.
TEST_F(Checkpoint, ZeroOneKeepsSlicesOfTheMomentsAndSavesTheGatheredWhole) {
  ModelSpec spec;
  spec.params = {{"a.weight", {64, 16}, true}, {"b.weight", {4, 12}, true}, {"c.weight", {300}, false}};
  const Module mod = Module::from_bytes(param_module(spec), "zero.kiln");
  const std::vector<std::pair<int64_t, int64_t>> slices = {{300, 700}, {0, 0}, {0, 300}};
  const ArenaLayout whole = layout_arena(mod), sliced = layout_arena(mod, {{}, slices});
  EXPECT_FALSE(whole.sliced);
  EXPECT_TRUE(sliced.sliced);
  for (uint32_t b = 0; b < mod.fb().buffers()->size(); ++b) EXPECT_EQ(whole.at[b], mod.buffer(b).offset()) << b;
  EXPECT_EQ(whole.state_bytes, mod.fb().state_size());
  // a: 4096 bytes per moment become 1200 % 256 + 1600 = 1776, 1792 aligned; b: none kept.
  EXPECT_EQ(whole.state_bytes - sliced.state_bytes, 2 * (4096 - 1792) + 2 * 256u);
  std::vector<std::pair<uint64_t, uint64_t>> stored;  // [first, end) bytes of what each buffer keeps
  for (uint32_t b = 0; b < mod.fb().buffers()->size(); ++b) {
    if (mod.buffer(b).kind() == fb::BufferKind::Activation) {
      EXPECT_EQ(sliced.at[b], sliced.state_bytes);
      continue;
    }
    EXPECT_EQ(sliced.at[b] % 256, 0u) << b;
    const auto [lo, hi] = sliced.held[b];
    if (hi > lo) stored.push_back({sliced.at[b] + uint64_t(lo) * 4, sliced.at[b] + uint64_t(hi) * 4});
  }
  std::sort(stored.begin(), stored.end());
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_LE(stored[i].second, sliced.state_bytes);
    if (i) EXPECT_LE(stored[i - 1].second, stored[i].first) << i;
  }
  EXPECT_NE(error_of([&] { layout_arena(mod, {{}, {{0, 1025}, {0, 0}, {0, 0}}}); })
                .find("zero.kiln: optimizer slice [0, 1025) is not within parameter a.weight of 1024 elements"),
            std::string::npos);

  Executor plain(mod);
  fill(plain, 3);
  save_checkpoint((dir_ / "plain").string(), plain, sample_state(5), 0);
  Executor ex(mod, {}, {{}, slices});
  EXPECT_EQ(ex.state_bytes(), sliced.state_bytes);
  const fb::Parameter& a = *mod.fb().parameters()->Get(0);
  EXPECT_NE(error_of([&] { ex.f32(a.adam_m()); })
                .find("zero.kiln: this rank keeps elements [300, 700) of a.weight.AdamM only (ZeRO-1), not all 1024"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ex.set_parameter_slice(0, 0, 1024); }).find("keeps its moments [300, 700)"), std::string::npos);
  ex.set_parameter_slice(0, 300, 700);  // the same slice: accepted

  load_checkpoint((dir_ / "plain" / "ckpt_00000005.kiln-ckpt").string(), ex);
  for (uint32_t i = 0; i < 3; ++i) {
    const fb::Parameter& p = *mod.fb().parameters()->Get(i);
    EXPECT_EQ(bytes_of(ex, p.value()), bytes_of(plain, p.value()));
    for (uint32_t moment : {p.adam_m(), p.adam_v()}) {
      const auto [lo, hi] = ex.held(moment);
      EXPECT_EQ(std::memcmp(ex.f32_held(moment), plain.f32(moment) + lo, size_t(hi - lo) * 4), 0) << i;
    }
  }
  // Without the gathered moments the slices cannot be saved; with them, the plain file.
  EXPECT_NE(error_of([&] { save_checkpoint((dir_ / "zero").string(), ex, sample_state(5), 0); }).find("only (ZeRO-1)"),
            std::string::npos);
  WholeMoments gathered;
  for (uint32_t i = 0; i < 3; ++i) {
    const fb::Parameter& p = *mod.fb().parameters()->Get(i);
    gathered.adam_m.push_back(plain.f32(p.adam_m()));
    gathered.adam_v.push_back(plain.f32(p.adam_v()));
  }
  save_checkpoint((dir_ / "zero").string(), ex, sample_state(5), 0, gathered);
  EXPECT_EQ(read_file((dir_ / "zero" / "ckpt_00000005.kiln-ckpt").string()),
            read_file((dir_ / "plain" / "ckpt_00000005.kiln-ckpt").string()));
  plain.f32(mod.fb().parameters()->Get(2)->adam_v())[7] = NAN;  // c.weight's v[7]
  EXPECT_NE(error_of([&] { save_checkpoint((dir_ / "zero").string(), ex, sample_state(6), 0, gathered); })
                .find("not written: parameter 'c.weight' (AdamW v) holds a NaN"),
            std::string::npos);
}

// A data-parallel rank's bucket order: the gradients first, one after another in that order
// (256-byte aligned, so as BucketPlan's flat vector with 64-element alignment has them), then the
// values the same way, then the rest; the same training state loads and saves.
TEST_F(Checkpoint, BucketOrderLaysTheGradientsOutAsTheFlatVector) {
  ModelSpec spec;
  spec.params = {{"a.weight", {64, 16}, true}, {"b.weight", {4, 12}, true}, {"c.weight", {300}, false}};
  const Module mod = Module::from_bytes(param_module(spec), "order.kiln");
  const StatePlan state{{2, 0, 1}, {}};
  const ArenaLayout l = layout_arena(mod, state);
  const auto& ps = *mod.fb().parameters();
  const BucketPlan plan = plan_buckets({{2, 0}, {1}}, {1024, 48, 300}, 2, 64);
  for (uint32_t p = 0; p < 3; ++p) {
    EXPECT_EQ(l.at[ps.Get(p)->grad()], uint64_t(plan.params[p].flat) * 4) << p;
    EXPECT_EQ(l.at[ps.Get(p)->value()], uint64_t(plan.total) * 4 + uint64_t(plan.params[p].flat) * 4) << p;
  }
  EXPECT_EQ(plan.params[0].flat, 320);  // c (300 elements) padded to 320
  EXPECT_EQ(l.state_bytes, layout_arena(mod).state_bytes);  // the same buffers, another order
  EXPECT_NE(error_of([&] { layout_arena(mod, {{2, 0}, {}}); }).find("order.kiln: the bucket order has 2 of 3 parameters"),
            std::string::npos);
  EXPECT_NE(error_of([&] { layout_arena(mod, {{2, 0, 0}, {}}); }).find("names parameter 0 twice"), std::string::npos);

  Executor plain(mod);
  fill(plain, 5);
  save_checkpoint((dir_ / "plain").string(), plain, sample_state(3), 0);
  Executor ex(mod, {}, state);
  load_checkpoint((dir_ / "plain" / "ckpt_00000003.kiln-ckpt").string(), ex);
  save_checkpoint((dir_ / "ordered").string(), ex, sample_state(3), 0);
  EXPECT_EQ(read_file((dir_ / "ordered" / "ckpt_00000003.kiln-ckpt").string()),
            read_file((dir_ / "plain" / "ckpt_00000003.kiln-ckpt").string()));
}

TEST_F(Checkpoint, CreatesNestedDirectoriesAndRejectsAFileInTheWay) {
  Executor ex(module_);
  save_checkpoint((dir_ / "a" / "b").string(), ex, sample_state(1), 1);
  EXPECT_TRUE(fs::exists(dir_ / "a" / "b" / "ckpt_00000001.kiln-ckpt"));
  write_bytes(dir_ / "file", {1});
  EXPECT_NE(error_of([&] { save_checkpoint((dir_ / "file").string(), ex, sample_state(1), 1); })
                .find("cannot create the checkpoint directory"),
            std::string::npos);
}

// A saved checkpoint (step 100) taken apart into its header and data, to be put back together
// with one edit and the lengths and the checksum made right: the edit alone must be refused, by
// name, and leave the executor untouched.
class CheckpointForged : public Checkpoint {
 protected:
  using Json = nlohmann::ordered_json;

  void SetUp() override {
    Checkpoint::SetUp();
    Executor saver(module_);
    fill(saver, 1);
    good_ = read_file(save_checkpoint(dir_.string(), saver, sample_state(100), 0));
    uint64_t header_len;
    std::memcpy(&header_len, &good_[16], 8);
    header_ = Json::parse(good_.begin() + 32, good_.begin() + 32 + long(header_len));
    data_.assign(good_.begin() + 32 + long(header_len), good_.end() - 4);
  }

  // The message of loading `file`, written to DIR/name.
  std::string refusal(const std::vector<uint8_t>& file, const std::string& name = "forged.kiln-ckpt") {
    write_bytes(dir_ / name, file);
    Executor ex(module_);
    fill(ex, 2);
    const auto before = snapshot(ex);
    const std::string msg = error_of([&] { load_checkpoint((dir_ / name).string(), ex); });
    EXPECT_EQ(snapshot(ex), before) << msg;
    return msg;
  }
  std::string refusal(const Json& header) { return refusal(framed(good_, padded(header.dump()), data_)); }

  // What a refusal of forged.kiln-ckpt says.
  std::string said(const std::string& what) const { return (dir_ / "forged.kiln-ckpt").string() + ": " + what; }

  // The saved file with the prefix field at byte `at` set to `value`.
  template <class T>
  std::vector<uint8_t> with_prefix_field(size_t at, T value) const {
    std::vector<uint8_t> file = good_;
    std::memcpy(&file[at], &value, sizeof value);
    rechecksum(file);
    return file;
  }

  // The saved file with the data's 4 bytes at `at` set to `bits`.
  std::vector<uint8_t> with_data_word(uint64_t at, uint32_t bits) const {
    std::vector<uint8_t> data = data_;
    std::memcpy(&data[at], &bits, 4);
    return framed(good_, padded(header_.dump()), data);
  }

  // The header with parameter i's `key` set to `value`.
  Json with_entry(size_t i, const char* key, const Json& value) const {
    Json h = header_;
    h["parameters"][i][key] = value;
    return h;
  }

  std::vector<uint8_t> good_, data_;
  Json header_;
};

TEST_F(CheckpointForged, PrefixFieldsAreCheckedOnceTheChecksumPasses) {
  const uint64_t size = good_.size(), room = size - 36;  // the longest header the file has room for
  EXPECT_EQ(refusal(with_prefix_field<uint32_t>(8, 2)), said("checkpoint version 2 is not supported (this build reads version 1)"));
  EXPECT_EQ(refusal(with_prefix_field<uint64_t>(24, size + 64)),
            said("length: the header says " + std::to_string(size + 64) + " bytes, the file has " + std::to_string(size)));
  EXPECT_EQ(refusal(with_prefix_field<uint32_t>(12, 7)), said("prefix: reserved bytes 12-15 hold 7, not 0"));
  EXPECT_EQ(refusal(with_prefix_field<uint64_t>(16, room + 1)),
            said("length: header length " + std::to_string(room + 1) + " runs past the end of the file"));
  // A header right up to the trailer leaves no data, which the frame allows: then the table is refused.
  Json empty = header_;
  empty["parameters"] = Json::array();
  EXPECT_EQ(refusal(framed(good_, padded(empty.dump()), {})), said("parameter 'wte.weight' is missing"));
  // A NUL in the padding, where the JSON parser would stop.
  EXPECT_EQ(refusal(framed(good_, padded(header_.dump() + '\0'), data_)),
            said("header: holds a NUL byte (the JSON is padded with spaces)"));
}

TEST_F(CheckpointForged, HeaderFieldsAreCheckedInFull) {
  const std::tuple<const char*, Json, std::string> cases[] = {
      {"format", "kiln-weights", "format is not \"kiln-checkpoint\""},
      {"step", -1, "step -1 is negative"},
      {"step", uint64_t(1) << 63, "step 9223372036854775808 is not a 64-bit integer"},  // not read as -2^63
      {"data_shard", -1, "data_shard -1 is not an integer >= 0"},
      {"rng_state", "FEDCBA9876543210", "rng_state \"FEDCBA9876543210\" is not 16 lowercase hex digits"},
      {"zero_stage", -1, "zero_stage -1 is not 0 or 1 (--zero)"},
      {"zero_stage", -(int64_t(1) << 32), "zero_stage -4294967296 is out of range"},  // not read as 0
      {"fingerprint", 12, "fingerprint is not a string"},
      {"extra", Json::array({1}), "extra is not a JSON object"}};
  for (const auto& [key, value, want] : cases) {
    Json h = header_;
    h[key] = value;
    EXPECT_EQ(refusal(h), said("header: " + want)) << key;
  }
  // A copy named for a later step is refused as well as one named for an earlier step.
  EXPECT_EQ(refusal(good_, "ckpt_00000200.kiln-ckpt"),
            (dir_ / "ckpt_00000200.kiln-ckpt").string() +
                ": header: step 100 is not the step 200 its name says (a renamed copy? name it by its step, or other "
                "than ckpt_N.kiln-ckpt)");
}

TEST_F(CheckpointForged, ParameterTableIsCheckedInFull) {
  EXPECT_EQ(refusal(with_entry(0, "value", {0, 256, 1})),
            said("header: parameter 'wte.weight': value [0,256,1] is not [offset, bytes]"));
  // An offset whose end wraps around 2^64 would land inside the data.
  EXPECT_EQ(refusal(with_entry(2, "adam_v", {UINT64_MAX - 3, 16})),
            said("header: parameter 'ln_f.weight': adam_v [18446744073709551612,16] runs past the end of the data (" +
                 std::to_string(data_.size()) + " bytes)"));
  // 2^62 elements are 2^64 bytes, which would wrap to 0.
  Json huge = with_entry(0, "shape", {uint64_t(1) << 62});
  for (const char* key : {"value", "adam_m", "adam_v"}) huge["parameters"][0][key] = {0, 0};
  EXPECT_EQ(refusal(huge), said("header: parameter 'wte.weight': shape [4611686018427387904] is negative or too large"));
  const uint64_t value_at = header_["parameters"][0]["value"][0];
  EXPECT_EQ(refusal(with_entry(0, "adam_m", {value_at + 4, 256})),
            said("header: parameter 'wte.weight' adam_m overlaps parameter 'wte.weight' value"));
  Json extra = header_;
  extra["parameters"].push_back({{"name", "zzz.weight"}, {"shape", {0}}, {"decay", false},
                                 {"value", {0, 0}}, {"adam_m", {0, 0}}, {"adam_v", {0, 0}}});
  EXPECT_EQ(refusal(extra), said("parameter 'zzz.weight' is not in the module"));
  EXPECT_EQ(refusal(with_entry(0, "decay", false)),
            said("header: parameter 'wte.weight': decay false, yet its fingerprint is this module's (true)"));
}

TEST_F(CheckpointForged, EveryElementIsScannedAndAnyNegativeSecondMomentRefused) {
  const uint64_t value_at = header_["parameters"][2]["value"][0], v_at = header_["parameters"][2]["adam_v"][0];
  EXPECT_EQ(refusal(with_data_word(value_at + 12, 0x7fc00000u)),  // ln_f's last element
            said("parameter 'ln_f.weight' value element 3 is NaN (a checkpoint edited by hand?)"));
  EXPECT_EQ(refusal(with_data_word(v_at, 0x80800000u)),  // -FLT_MIN, far above the -1 tried above
            said("parameter 'ln_f.weight' AdamW v element 0 is negative (a second moment) (a checkpoint edited by hand?)"));
}

// Checks of the folder functions and of --init, past what the tests above reach.
class CheckpointChecks : public Checkpoint {};

// --init of a bf16 run's checkpoint into an fp32 module takes its values and nothing else; a
// resume of it is refused with the way to do that.
TEST_F(CheckpointChecks, InitTakesTheValuesOfAnotherPrecisionAndNoMoments) {
  ModelSpec mixed;
  mixed.compute_copy = true;
  mixed.precision = "bf16";
  const Module bf16 = Module::from_bytes(param_module(mixed), "mixed.kiln");
  Executor a(bf16);
  fill(a, 1);
  const std::string file = save_checkpoint(dir_.string(), a, sample_state(4), 0);
  Executor b(module_), untouched(module_);
  fill(b, 2);
  fill(untouched, 2);
  EXPECT_EQ(error_of([&] { load_checkpoint(file, b); }),
            file + ": compiled for a different model (precision: the checkpoint's \"bf16\", this module's \"fp32\"; the "
                   "checkpoint's fingerprint " + module_fingerprint(bf16) + ", this module's " + module_fingerprint(module_) +
                "); start afresh from its weights in this precision with --init " + file +
                " and another --checkpoint-dir (its AdamW state and step are left)");
  EXPECT_EQ(snapshot(b), snapshot(untouched));
  EXPECT_EQ(load_checkpoint(file, b, true).step, 4);
  for (uint32_t i = 0; i < 3; ++i) {
    const fb::Parameter& p = *module_.fb().parameters()->Get(i);
    EXPECT_EQ(bytes_of(b, p.value()), bytes_of(a, bf16.fb().parameters()->Get(i)->value())) << i;
    for (uint32_t idx : {p.grad(), p.adam_m(), p.adam_v()}) EXPECT_EQ(bytes_of(b, idx), bytes_of(untouched, idx)) << i;
  }
}

TEST_F(CheckpointChecks, GatheredMomentsAreOnePerParameterAndBothAreScanned) {
  Executor ex(module_);
  fill(ex, 1);
  auto gathered = [&](uint32_t n) {
    WholeMoments g;
    for (uint32_t i = 0; i < n; ++i) {
      const fb::Parameter& p = *module_.fb().parameters()->Get(i);
      g.adam_m.push_back(ex.f32(p.adam_m()));
      g.adam_v.push_back(ex.f32(p.adam_v()));
    }
    return g;
  };
  EXPECT_EQ(error_of([&] { save_checkpoint(dir_.string(), ex, sample_state(2), 0, gathered(2)); }),
            dir_.string() + ": the gathered moments are 2 first and 2 second for 3 parameters");
  WholeMoments short_v = gathered(3);
  short_v.adam_v.pop_back();
  EXPECT_EQ(error_of([&] { save_checkpoint(dir_.string(), ex, sample_state(2), 0, std::move(short_v)); }),
            dir_.string() + ": the gathered moments are 3 first and 2 second for 3 parameters");
  WholeMoments bad_m = gathered(3);
  std::vector<float> m1(bad_m.adam_m[1], bad_m.adam_m[1] + 48);
  m1[5] = NAN;
  bad_m.adam_m[1] = m1.data();
  EXPECT_NE(error_of([&] { save_checkpoint(dir_.string(), ex, sample_state(2), 0, bad_m); })
                .find("ckpt_00000002.kiln-ckpt: not written: parameter 'h.0.attn.c_attn.weight' (AdamW m) holds a NaN"),
            std::string::npos);
  EXPECT_TRUE(listing(dir_).empty());
}

// A temporary whose writer ran here and is gone is counted as free space and removed by the next
// save; one of a running writer, or not named as a checkpoint's, stays.
TEST_F(CheckpointChecks, StaleTemporariesAreCountedAndRemovedByTheNextSave) {
  fs::create_directories(dir_);
  const std::string dead = ".tmp.999999999", alive = ".tmp." + std::to_string(getpid());  // above any pid_max
  const std::vector<std::string> stale = {"ckpt_00000001.kiln-ckpt" + dead, "latest" + dead};
  write_bytes(dir_ / stale[0], std::vector<uint8_t>(10000, 1));
  write_bytes(dir_ / stale[1], {1});
  write_bytes(dir_ / ("notes" + dead), {1});
  write_bytes(dir_ / ("ckpt_00000001.kiln-ckpt" + alive), {1});
  uint64_t blocks = 0;
  for (const std::string& name : stale) {
    struct stat st {};
    ASSERT_EQ(::stat((dir_ / name).c_str(), &st), 0);
    blocks += uint64_t(st.st_blocks) * 512;
  }
  EXPECT_EQ(stale_temporary_bytes(dir_.string()), blocks);
  Executor ex(module_);
  save_checkpoint(dir_.string(), ex, sample_state(2), 0);
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000002.kiln-ckpt", "latest", "notes" + dead,
                                                  "ckpt_00000001.kiln-ckpt" + alive}));
  EXPECT_EQ(stale_temporary_bytes(dir_.string()), 0u);
}

TEST_F(CheckpointChecks, CheckpointFileNames) {
  EXPECT_TRUE(is_checkpoint_file_name("latest"));
  EXPECT_TRUE(is_checkpoint_file_name("ckpt_0.kiln-ckpt"));
  EXPECT_TRUE(is_checkpoint_file_name("ckpt_" + std::string(18, '9') + ".kiln-ckpt"));
  EXPECT_FALSE(is_checkpoint_file_name("ckpt_" + std::string(19, '9') + ".kiln-ckpt"));  // past INT64_MAX
  EXPECT_FALSE(is_checkpoint_file_name("ckpt_.kiln-ckpt"));
  EXPECT_FALSE(is_checkpoint_file_name("ckpt_1a.kiln-ckpt"));
  EXPECT_FALSE(is_checkpoint_file_name("latest.tmp.1"));
}

TEST_F(CheckpointChecks, ListingTakesRegularFilesNamedByStepHighestFirst) {
  fs::create_directories(dir_ / "ckpt_00000030.kiln-ckpt");  // a folder is no checkpoint
  for (const char* name : {"ckpt_00000002.kiln-ckpt", "ckpt_00000010.kiln-ckpt", "ckpt_00000040.kiln-ckpt.tmp.1", "notes"})
    write_bytes(dir_ / name, {1});
  EXPECT_EQ(list_checkpoints(dir_.string()),
            (std::vector<std::pair<int64_t, std::string>>{{10, "ckpt_00000010.kiln-ckpt"}, {2, "ckpt_00000002.kiln-ckpt"}}));
  EXPECT_TRUE(list_checkpoints((dir_ / "missing").string()).empty());
  const std::string notes = (dir_ / "notes").string();
  EXPECT_EQ(error_of([&] { list_checkpoints(notes); }), notes + ": listing checkpoints: Not a directory");
}

TEST_F(CheckpointChecks, PruneKeepsTheNewestAndTheHighestOthersAndCountsWhatItDeleted) {
  fs::create_directories(dir_);
  for (int step = 1; step <= 5; ++step) write_bytes(dir_ / ("ckpt_0000000" + std::to_string(step) + ".kiln-ckpt"), {1});
  EXPECT_EQ(prune_checkpoints(dir_.string(), "ckpt_00000002.kiln-ckpt", 0, ""), 0);
  EXPECT_EQ(prune_checkpoints(dir_.string(), "ckpt_00000002.kiln-ckpt", 2, ""), 3);
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"ckpt_00000002.kiln-ckpt", "ckpt_00000005.kiln-ckpt"}));
}

TEST_F(CheckpointChecks, NewestWholeCheckpointSkipsTheGivenOneAndDamagedOnes) {
  Executor ex(module_);
  std::vector<std::string> path;
  for (int64_t step : {1, 2, 3}) path.push_back(save_checkpoint(dir_.string(), ex, sample_state(step), 0));
  auto damaged = read_file(path[1]);
  damaged[40] ^= 1;
  write_bytes(path[1], damaged);
  EXPECT_FALSE(is_whole_checkpoint(path[1]));
  EXPECT_EQ(newest_whole_checkpoint(dir_.string(), path[2]), path[0]);
  EXPECT_EQ(newest_whole_checkpoint(dir_.string(), path[0]), path[2]);
}

TEST_F(CheckpointChecks, DataBytesAreTheFilesTensorSection) {
  Executor ex(module_);
  const auto b = read_file(save_checkpoint(dir_.string(), ex, sample_state(1), 0));
  uint64_t header_len;
  std::memcpy(&header_len, &b[16], 8);
  EXPECT_EQ(checkpoint_data_bytes(module_), b.size() - 32 - header_len - 4);
  EXPECT_EQ(checkpoint_data_bytes(module_), 3u * (64 + 48 + 4) * 4);  // value, m and v of each element
}

TEST_F(CheckpointChecks, ACutFileSaysHowMuchIsLeft) {
  Executor ex(module_);
  const auto good = read_file(save_checkpoint(dir_.string(), ex, sample_state(1), 0));
  const fs::path cut = dir_ / "cut.kiln-ckpt";
  for (const auto& [len, want] : {std::pair<long, std::string>{0, "is empty (0 bytes), not a Kiln checkpoint"},
                                  {1, "a Kiln checkpoint cut short (truncated: only 1 byte)"},
                                  {7, "a Kiln checkpoint cut short (truncated: only 7 bytes)"},
                                  {35, "checksum mismatch (file corrupt or truncated: only 35 bytes)"}}) {
    write_bytes(cut, {good.begin(), good.begin() + len});
    EXPECT_EQ(error_of([&] { load_checkpoint(cut.string(), ex); }), cut.string() + ": " + want) << len;
  }
}

}  // namespace
}  // namespace kiln
