// Module loading and verification, the executable trailer, the executor's operand checks and
// the learning-rate schedule.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

#include "runtime/embedded.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/file_io.h"
#include "runtime/lr_schedule.h"
#include "runtime/module.h"
#include "runtime/terminal_progress.h"

namespace kiln {
namespace {

// A module with one program: out[n] = a[n] + b[n], with buffers of the given sizes. a and b
// are inputs (the state region), out an activation after them. `extra` bytes are added to the
// arena and activation sizes the module states (a crafted module).
std::vector<uint8_t> add_module(int64_t n, int64_t out_elems, uint32_t version = kModuleFormatVersion,
                                uint64_t extra = 0) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs;
  std::vector<int64_t> shapes[3] = {{n}, {n}, {out_elems}};
  const char* names[3] = {"a", "b", "out"};
  uint64_t offset = 0, state = 0;
  for (int i = 0; i < 3; ++i) {
    uint64_t size = uint64_t(shapes[i][0]) * 4;
    if (i == 2) state = offset;
    bufs.push_back(fb::CreateBufferDirect(fbb, names[i], i < 2 ? fb::BufferKind::Input : fb::BufferKind::Activation,
                                          fb::DType::F32, &shapes[i], offset, size));
    offset += (size + 255) / 256 * 256;
  }
  std::vector<uint32_t> in = {0, 1}, out = {2};
  std::vector<int64_t> ints = {n};
  std::vector<flatbuffers::Offset<fb::Instr>> instrs = {
      fb::CreateInstrDirect(fbb, fb::OpCode::Add, &in, &out, &ints, nullptr, "test")};
  std::vector<flatbuffers::Offset<fb::Program>> progs = {
      fb::CreateProgramDirect(fbb, "forward", &instrs, 2, (uint64_t(out_elems) * 4 + 255) / 256 * 256)};
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  auto model = fb::CreateModelDirect(fbb, 1, 1, 4, 16, 8, 1, 8, "fp32", "cpu", "test.toml");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, version, "test", model, offset + extra, &bufs,
                                                      &params, &progs, state, offset - state + extra,
                                                      offset - state, "none", nullptr, nullptr, nullptr, nullptr, true, /*crc32=*/1));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  seal_module(bytes);
  return bytes;
}

// A module of one ClipCoef: inputs norm and max_norm (scalars), output coef.
std::vector<uint8_t> clip_module() {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs;
  const std::vector<int64_t> scalar = {};
  const char* names[3] = {"norm", "max_norm", "coef"};
  for (int i = 0; i < 3; ++i)
    bufs.push_back(fb::CreateBufferDirect(fbb, names[i], i < 2 ? fb::BufferKind::Input : fb::BufferKind::Activation,
                                          fb::DType::F32, &scalar, uint64_t(i) * 256, 4));
  std::vector<uint32_t> in = {0, 1}, out = {2};
  std::vector<int64_t> ints;
  std::vector<flatbuffers::Offset<fb::Instr>> instrs = {
      fb::CreateInstrDirect(fbb, fb::OpCode::ClipCoef, &in, &out, &ints, nullptr, "test")};
  std::vector<flatbuffers::Offset<fb::Program>> progs = {fb::CreateProgramDirect(fbb, "optimizer_step", &instrs, 2, 256)};
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  auto model = fb::CreateModelDirect(fbb, 1, 1, 4, 16, 8, 1, 8, "fp32", "cpu", "test.toml");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "test", model, 768, &bufs, &params, &progs,
                                                      512, 256, 256, "none", nullptr, nullptr, nullptr, nullptr, true, /*crc32=*/1));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  seal_module(bytes);
  return bytes;
}

// coef = max_norm / (norm + 1e-6) when that is below 1 (training-semantics.md), else 1; a
// max_norm of 0 disables clipping.
TEST(Module, ClipCoefFollowsTheSemantics) {
  Module m = Module::from_bytes(clip_module(), "clip.kiln");
  Executor ex(m);
  auto coef = [&](float norm, float max_norm) {
    ex.f32(0)[0] = norm, ex.f32(1)[0] = max_norm;
    ex.run("optimizer_step");
    return ex.f32(2)[0];
  };
  EXPECT_FLOAT_EQ(coef(4.0f, 1.0f), 1.0f / (4.0f + 1e-6f));
  EXPECT_FLOAT_EQ(coef(1e-3f, 1e-4f), 1e-4f / (1e-3f + 1e-6f));  // 0.0999001: the 1e-6 shows at small norms
  EXPECT_NE(coef(1e-3f, 1e-4f), 1e-4f / 1e-3f);
  EXPECT_EQ(coef(0.5f, 1.0f), 1.0f);    // below max_norm: unclipped
  EXPECT_FLOAT_EQ(coef(1.0f, 1.0f), 1.0f / (1.0f + 1e-6f));  // at max_norm itself, shrunk by 1e-6 (as torch's clip_grad_norm_)
  EXPECT_EQ(coef(0.0f, 1.0f), 1.0f);
  EXPECT_EQ(coef(100.0f, 0.0f), 1.0f);  // --grad-clip 0
}

TEST(Module, RunsAVerifiedProgram) {
  Module m = Module::from_bytes(add_module(5, 5), "add.kiln");
  Executor ex(m);
  for (int i = 0; i < 5; ++i) ex.f32(0)[i] = float(i), ex.f32(1)[i] = 10.0f * float(i);
  ex.run("forward");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ex.f32(2)[i], 11.0f * float(i));
}

TEST(Module, RejectsAnOutputTooSmallForItsKernel) {
  Module m = Module::from_bytes(add_module(5, 4), "small.kiln");
  try {
    Executor ex(m);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("small.kiln: program forward, instr 0 (Add): output buffer 2 holds 4 F32, needs 5 F32"),
              std::string::npos) << e.what();
  }
}

// A decode program of one built-in DecodeAttention (B = 1, C = 2, one head, S = T = 4): qkv,
// token and position are inputs, the cache (`cache_kind`, `cache_elems` floats) and out
// activations.
std::vector<uint8_t> decode_module(fb::BufferKind cache_kind, int64_t cache_elems) {
  flatbuffers::FlatBufferBuilder fbb;
  struct B { const char* name; fb::BufferKind kind; fb::DType dtype; std::vector<int64_t> shape; };
  const B spec[5] = {{"qkv", fb::BufferKind::Input, fb::DType::F32, {1, 6}},
                     {"token", fb::BufferKind::Input, fb::DType::I32, {1}},
                     {"position", fb::BufferKind::Input, fb::DType::I32, {1}},
                     // [2, B, n_head, T, C / n_head] when whole; a flat cut-short one else
                     {"h.0.attn/kv_cache", cache_kind, fb::DType::F32,
                      cache_elems == 16 ? std::vector<int64_t>{2, 1, 1, 4, 2} : std::vector<int64_t>{cache_elems}},
                     {"out", fb::BufferKind::Activation, fb::DType::F32, {1, 2}}};
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs;
  uint64_t offset = 0, state = 0;
  for (int pass = 0; pass < 2; ++pass)  // the state region first
    for (const B& b : spec) {
      const bool activation = b.kind == fb::BufferKind::Activation;
      if (activation != (pass == 1)) continue;
      if (activation && !state) state = offset;
      int64_t n = 1;
      for (int64_t d : b.shape) n *= d;
      bufs.push_back(fb::CreateBufferDirect(fbb, b.name, b.kind, b.dtype, &b.shape, offset, uint64_t(n) * 4));
      offset += (uint64_t(n) * 4 + 255) / 256 * 256;
    }
  // Buffer indices in the order written: the state region's, then the activations.
  auto index = [&](const char* name) {
    uint32_t i = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (const B& b : spec) {
        if ((b.kind == fb::BufferKind::Activation) != (pass == 1)) continue;
        if (std::string(b.name) == name) return i;
        ++i;
      }
    return i;
  };
  std::vector<uint32_t> in = {index("qkv"), index("h.0.attn/kv_cache"), index("position")}, out = {index("out")};
  std::vector<int64_t> ints = {1, 2, 1, 4, 1};  // B, C, H, S, M
  std::vector<flatbuffers::Offset<fb::Instr>> instrs = {
      fb::CreateInstrDirect(fbb, fb::OpCode::DecodeAttention, &in, &out, &ints, nullptr, "test")};
  std::vector<flatbuffers::Offset<fb::Program>> progs = {
      fb::CreateProgramDirect(fbb, "decode", &instrs, index("out"), offset - state)};
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  auto model = fb::CreateModelDirect(fbb, 1, 1, 2, 16, 4, 1, 4, "fp32", "cpu", "test.toml");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "test", model, offset, &bufs, &params,
                                                      &progs, state, offset - state, offset - state, "none", nullptr, nullptr, nullptr, nullptr, true, /*crc32=*/1));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  seal_module(bytes);
  return bytes;
}

// Each call stores its position's key and value and attends over every position stored so far.
TEST(Module, DecodeAttentionKeepsItsCacheBetweenRuns) {
  Module m = Module::from_bytes(decode_module(fb::BufferKind::Activation, 16), "decode.kiln");
  Executor ex(m);
  const float q[2] = {1.0f, 0.5f}, k[2][2] = {{0.3f, -0.2f}, {-1.0f, 2.0f}}, v[2][2] = {{1.0f, 2.0f}, {-3.0f, 5.0f}};
  for (int p = 0; p < 2; ++p) {
    float* qkv = ex.f32(0);
    qkv[0] = q[0], qkv[1] = q[1], qkv[2] = k[p][0], qkv[3] = k[p][1], qkv[4] = v[p][0], qkv[5] = v[p][1];
    *ex.input("position") = p;
    ex.run("decode");
  }
  // softmax(q . k[t] / sqrt(2)) over t = 0, 1, then the weighted values.
  const double s0 = (1.0 * 0.3 + 0.5 * -0.2) / std::sqrt(2.0), s1 = (1.0 * -1.0 + 0.5 * 2.0) / std::sqrt(2.0);
  const double w0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), w1 = 1.0 - w0;
  const float* out = ex.f32(m.program("decode")->result());
  EXPECT_NEAR(out[0], w0 * 1.0 + w1 * -3.0, 1e-6);
  EXPECT_NEAR(out[1], w0 * 2.0 + w1 * 5.0, 1e-6);
}

// A position past the cache's S would write its key and value past the buffer.
TEST(Module, DecodeAttentionRefusesAPositionOutsideItsCache) {
  Module m = Module::from_bytes(decode_module(fb::BufferKind::Activation, 16), "decode.kiln");
  Executor ex(m);
  for (int p : {4, -1}) {
    *ex.input("position") = p;
    try {
      ex.run("decode");
      FAIL() << "expected an error for position " << p;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "decode.kiln: decode attention: position " + std::to_string(p) + " is not in [0, 4)");
    }
  }
  *ex.input("position") = 3;
  ex.run("decode");
}

TEST(Module, RefusesAKeyValueCacheThatIsNotItsOwnActivation) {
  for (auto [kind, elems, what] : {std::tuple{fb::BufferKind::Input, int64_t(16), "must be an F32 activation"},
                                   std::tuple{fb::BufferKind::Activation, int64_t(8), "must be an F32 activation"}}) {
    try {
      Module::from_bytes(decode_module(kind, elems), "cache.kiln");
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cache.kiln: program decode: key/value cache buffers["), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

TEST(Module, RejectsGarbageTruncationAndOtherVersions) {
  auto bytes = add_module(5, 5);
  EXPECT_THROW(Module::from_bytes({1, 2, 3}, "x.kiln"), Error);
  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + bytes.size() / 2);
  EXPECT_THROW(Module::from_bytes(cut, "cut.kiln"), Error);
  try {
    Module::from_bytes(add_module(5, 5, 7), "v7.kiln");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v7.kiln: format_version: 7 is not " + std::to_string(kModuleFormatVersion)),
              std::string::npos) << e.what();
  }
}

// One flipped bit anywhere past the header (here in the Add's element count, which the plan
// verifier would accept as 4) is refused by the module's checksum.
TEST(Module, RejectsAFlippedBitByItsChecksum) {
  const auto bytes = add_module(5, 5);
  Module::from_bytes(bytes, "ok.kiln");
  const int64_t* n = fb::GetModule(bytes.data())->programs()->Get(0)->instrs()->Get(0)->ints()->data();
  auto flipped = bytes;
  flipped[size_t(reinterpret_cast<const uint8_t*>(n) - bytes.data())] ^= 1;
  try {
    Module::from_bytes(flipped, "flip.kiln");
    FAIL() << "accepted a flipped bit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flip.kiln: crc32: the module's checksum does not match its bytes"),
              std::string::npos) << e.what();
  }
}

TEST(Module, RejectsAnArenaLargerThanItsProgramsNeed) {
  // An arena_size of 2^63 - 1 once passed, and kiln-run asked for an 8 EiB arena.
  const uint64_t planned = Module::from_bytes(add_module(5, 5), "add.kiln").fb().arena_size();
  for (uint64_t extra : {uint64_t(256), uint64_t(INT64_MAX) - planned}) {
    try {
      Module::from_bytes(add_module(5, 5, kModuleFormatVersion, extra), "big.kiln");
      FAIL() << "accepted " << extra << " extra arena bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("big.kiln: arena_size: " + std::to_string(planned + extra) +
                                           " bytes is not the state region's 512 (a multiple of 256) plus the 256 "
                                           "activation bytes its programs and buffers need"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Module, RejectsShapesWhoseByteSizeWrapsAround) {
  // 2^62 floats are 2^64 bytes: a size of 0 once wrapped. The loader must not accept it.
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<int64_t> huge = {int64_t(1) << 62};
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs = {
      fb::CreateBufferDirect(fbb, "x", fb::BufferKind::Activation, fb::DType::F32, &huge, 0, 0)};
  std::vector<flatbuffers::Offset<fb::Instr>> instrs;
  std::vector<flatbuffers::Offset<fb::Program>> progs = {fb::CreateProgramDirect(fbb, "forward", &instrs, 0, 256)};
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  auto model = fb::CreateModelDirect(fbb, 1, 1, 4, 16, 8, 1, 8, "fp32", "cpu", "t");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "t", model, 256, &bufs, &params, &progs, 0, 256, 256, "none", nullptr, nullptr, nullptr, nullptr, true, /*crc32=*/1));
  try {
    std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    seal_module(bytes);
    Module::from_bytes(bytes, "wrap.kiln");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wrap.kiln: buffers[0]: shape [4611686018427387904] is negative or too large"),
              std::string::npos) << e.what();
  }
}

TEST(Module, ExecutableTrailerRoundTrip) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln-exe-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string runtime = (dir / "runtime").string(), exe = (dir / "exe").string();
  // What write_executable takes for a runtime: ELF, with run_main's marker among its bytes.
  std::string elf = std::string("\x7f" "ELF, a runtime's bytes: KILN-RUNTIME:run_main and more");
  write_file_atomic(runtime, {{elf.data(), elf.size()}});
  EXPECT_FALSE(read_embedded_module(runtime).has_value());
  auto module = add_module(3, 3);
  const std::string script = "#!/bin/sh\necho not a runtime\n", other = (dir / "other").string();
  write_file_atomic(other, {{script.data(), script.size()}});
  try {
    write_executable(exe, other, module);
    FAIL() << "took a shell script for a runtime";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other: not a Kiln runtime"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(exe));
  write_executable(exe, runtime, module);
  auto back = read_embedded_module(exe);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, module);
  EXPECT_EQ(Module::load(exe).fb().model()->seq_len(), 8);
  // Re-embedding into an executable replaces its module instead of stacking a second one.
  write_executable(exe, exe, add_module(4, 4));
  EXPECT_EQ(read_file(exe).size(), elf.size() + add_module(4, 4).size() + 16);
  EXPECT_TRUE(std::filesystem::perms::owner_exec ==
              (std::filesystem::status(exe).permissions() & std::filesystem::perms::owner_exec));
  std::filesystem::remove_all(dir);
}

// The trailer's bounds, on hand-made files: a module may fill the file up to its trailer (an empty
// one too) but not past it; after a 64-bit ELF's own extent, 8 bytes that begin as a module does
// are a cut executable, while a 32-bit ELF's header is not read as a 64-bit one's.
TEST(Module, ExecutableTrailerBounds) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln-trailer-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "f").string();
  auto write = [&](const std::vector<uint8_t>& b) { write_file_atomic(path, {{b.data(), b.size()}}); };
  auto with_trailer = [](std::vector<uint8_t> b, uint64_t size) {
    const auto* p = reinterpret_cast<const uint8_t*>(&size);
    b.insert(b.end(), p, p + 8);
    b.insert(b.end(), kEmbeddedMagic, kEmbeddedMagic + 8);
    return b;
  };
  const std::vector<uint8_t> module = {1, 2, 3, 4, 5};
  write(with_trailer(module, module.size()));
  ASSERT_TRUE(read_embedded_module(path).has_value());
  EXPECT_EQ(*read_embedded_module(path), module);
  write(with_trailer({}, 0));
  ASSERT_TRUE(read_embedded_module(path).has_value());
  EXPECT_TRUE(read_embedded_module(path)->empty());
  write(with_trailer(module, module.size() + 1));
  try {
    read_embedded_module(path, "exe");
    FAIL() << "took a module larger than its file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exe: embedded module: size 6 exceeds the file"), std::string::npos) << e.what();
  }
  // A 64-byte ELF header whose section headers end at 64 (shoff 64, none of them), then "xxxxKILN".
  std::vector<uint8_t> elf(64, 0);
  std::memcpy(elf.data(), "\x7f" "ELF", 4);
  elf[4] = 2;
  elf[0x28] = 64;
  for (char c : std::string("xxxxKILN")) elf.push_back(uint8_t(c));
  write(elf);
  try {
    read_embedded_module(path, "exe");
    FAIL() << "took a cut module for none";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exe: 8 bytes of a Kiln module follow the program"), std::string::npos) << e.what();
  }
  elf[4] = 1;  // ELFCLASS32: its section header offset is elsewhere
  write(elf);
  EXPECT_FALSE(read_embedded_module(path).has_value());
  std::filesystem::remove_all(dir);
}

TEST(LrSchedule, WarmupCosineAndFloor) {
  LrSchedule s{"cosine", 1e-3, 0.1, 5, 20};
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 2e-4);            // (0 + 1) / 5
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 1e-3);            // end of warm-up
  EXPECT_DOUBLE_EQ(learning_rate(s, 5), 1e-3);            // r = 0
  EXPECT_NEAR(learning_rate(s, 20), 1e-4, 1e-18);         // r = 1: min_lr
  EXPECT_DOUBLE_EQ(learning_rate(s, 21), 1e-4);           // past S
  EXPECT_NEAR(learning_rate(s, 12), 1e-4 + 0.5 * (1 + std::cos(M_PI * 7.0 / 15.0)) * 9e-4, 1e-18);
  LrSchedule c{"constant", 1e-3, 0.1, 2, 20};
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 5e-4);            // warm-up applies to a constant lr too
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 19), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 25), 1e-3);           // no floor past S
  LrSchedule flat{"constant", 3e-4, 0.1, 0, 20};
  EXPECT_DOUBLE_EQ(learning_rate(flat, 0), 3e-4);         // no warm-up: the full lr from step 0
  LrSchedule cold{"cosine", 1e-3, 0.1, 0, 10};
  EXPECT_DOUBLE_EQ(learning_rate(cold, 0), 1e-3);
  EXPECT_NEAR(learning_rate(cold, 5), 1e-4 + 0.5 * 9e-4, 1e-18);  // r = 1/2
}

// A warm-up as long as the run (S - W = 0, where the spec's r would be 0/0): the full lr at step
// W = S, not NaN, then min_lr; a warm-up longer than the run goes on to its end.
TEST(LrSchedule, WarmupAsLongAsTheRun) {
  LrSchedule s{"cosine", 1e-3, 0.1, 5, 5};
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 1e-3);
  EXPECT_EQ(learning_rate(s, 5), 1e-3);                   // r = 0
  EXPECT_EQ(learning_rate(s, 6), 1e-3 * 0.1);             // past S
  LrSchedule longer{"cosine", 1e-3, 0.1, 8, 5};
  EXPECT_DOUBLE_EQ(learning_rate(longer, 6), 8.75e-4);    // still warming up past S: 7 / 8
  EXPECT_EQ(learning_rate(longer, 8), 1e-3 * 0.1);
}

// Messages keep UTF-8 text and escape what could break the line or drive a terminal.
TEST(OneLine, EscapesControlsAndBytesThatAreNotUtf8) {
  EXPECT_EQ(one_line("plain: caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), "plain: caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(one_line("a\nb\rc\td\x1B[2J\x7F"), "a\\nb\\rc\\td\\x1B[2J\\x7F");
  EXPECT_EQ(one_line(std::string_view("n\0ul", 4)), "n\\x00ul");
  EXPECT_EQ(one_line("\xC2\x9B" "2J"), "\\xC2\\x9B2J");          // U+009B, the C1 CSI
  EXPECT_EQ(one_line("\xC2\xA0"), "\xC2\xA0");                   // U+00A0 is text
  EXPECT_EQ(one_line("\x9B" "2J"), "\\x9B2J");                  // a lone continuation byte
  EXPECT_EQ(one_line("\xC3"), "\\xC3");                          // cut short at the end
  EXPECT_EQ(one_line("\xC3(x"), "\\xC3(x");                       // a bad continuation
  EXPECT_EQ(one_line("\xC0\xAF"), "\\xC0\\xAF");                // overlong '/'
  EXPECT_EQ(one_line("\xE0\x80\xAF"), "\\xE0\\x80\\xAF");       // overlong, three bytes
  EXPECT_EQ(one_line("\xED\xA0\x80"), "\\xED\\xA0\\x80");       // a surrogate
  EXPECT_EQ(one_line("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(one_line("\xF4\x8F\xBF\xBF"), "\xF4\x8F\xBF\xBF");  // U+10FFFF itself
}

// The ETA of train's progress lines: the first step, which also warms up, is left out of the
// rate once later steps exist (a 3x slower first step made the first ETAs 3x too long).
TEST(TrainProgress, EtaLeavesTheWarmingFirstStepOut) {
  EXPECT_DOUBLE_EQ(eta_seconds(5.0, 3.0, 3, 10), 10.0);  // 3 s, then 1 s a step
  EXPECT_DOUBLE_EQ(eta_seconds(3.0, 3.0, 1, 10), 30.0);  // the first alone: all there is
  EXPECT_DOUBLE_EQ(eta_seconds(4.0, 3.0, 2, 10), 10.0);  // one step after the first: its 1 s alone
  EXPECT_DOUBLE_EQ(eta_seconds(0.0, 0.0, 0, 10), 0.0);
}

// Before the first evaluation the ETA counts each at a third of a micro-step per batch.
TEST(TrainProgress, EvaluationGuessIsAThirdOfAMicroStepPerBatch) {
  EXPECT_DOUBLE_EQ(evaluation_guess_seconds(6.0, 1, 20), 40.0);  // 20 forward passes of 2 s
  EXPECT_DOUBLE_EQ(evaluation_guess_seconds(6.0, 2, 20), 20.0);  // micro-steps of 3 s: 1 s each
  EXPECT_DOUBLE_EQ(evaluation_guess_seconds(6.0, 0, 20), 0.0);
}

// The evaluations, samples and checkpoints the ETA still counts: after every N-th step and the last.
TEST(TrainProgress, PeriodicWorkLeft) {
  EXPECT_EQ(periodic_left(0, 10, 5), 2);   // after steps 5 and 10
  EXPECT_EQ(periodic_left(5, 10, 5), 1);   // step 5's is done: 10's
  EXPECT_EQ(periodic_left(4, 10, 5), 2);   // 5 and 10
  EXPECT_EQ(periodic_left(0, 10, 3), 4);   // 3, 6, 9, and the last
  EXPECT_EQ(periodic_left(9, 10, 3), 1);   // the last alone
  EXPECT_EQ(periodic_left(10, 10, 3), 0);  // nothing after the last
  EXPECT_EQ(periodic_left(0, 10, 0), 1);   // no period: the last alone
  EXPECT_EQ(periodic_left(0, 10, 20), 1);  // a period past the run: the last alone
}

// A terminal's progress line: done/total, the time so far and what is left at that rate (stderr
// on a pseudo-terminal, so that the line is shown).
TEST(TerminalProgressLine, SaysTheTimeLeftAtTheRateSoFar) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0) GTEST_SKIP() << "no pseudo-terminals here";
  const int slave = ::grantpt(master) == 0 && ::unlockpt(master) == 0 ? ::open(::ptsname(master), O_RDWR | O_NOCTTY) : -1;
  if (slave < 0) {
    ::close(master);
    GTEST_SKIP() << "no pseudo-terminal could be opened here";
  }
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(slave, 2);
  {
    kiln::TerminalProgress progress("work", "items");
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    progress.update(1, 3);  // a third done: twice as long is left
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(slave);
  char buf[256] = {};
  ::fcntl(master, F_SETFL, O_NONBLOCK);  // nothing shown fails the test rather than hanging it
  const ssize_t got = ::read(master, buf, sizeof buf - 1);
  ::close(master);
  ASSERT_GT(got, 0);
  double spent = -1, left = -1;
  ASSERT_EQ(std::sscanf(buf, "\rwork: 1/3 items, %lf s, about %lf s left", &spent, &left), 2) << buf;
  EXPECT_GE(spent, 1.0) << buf;
  EXPECT_NEAR(left, 2 * spent, 1) << buf;  // (both printed whole)
}

}  // namespace
}  // namespace kiln
