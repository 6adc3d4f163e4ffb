// The arena planner against the runtime's plan verifier: many random interval sets are planned,
// written into modules and verified; a corrupted plan is caught with both buffers named.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "compiler/arena_planner.h"
#include "runtime/error.h"
#include "runtime/module.h"
#include "runtime/plan_verifier.h"

namespace kiln {
namespace {

// Buffers and instructions of a module laid out by hand.
struct PlanBuffer {
  std::string name;
  fb::BufferKind kind;
  uint64_t offset, size;
};
struct PlanInstr {
  std::vector<uint32_t> in, out;
  fb::OpCode op = fb::OpCode::Copy;
};

// A module of one program, "forward" (a micro_step would need the idx and targets inputs:
// Module::verify), running `instrs` and returning buffer `result`, with `activation` planned bytes:
// buffer 0 a 4-byte hyperparameter lr at 0, then `bufs`, the state region [0, state), in an arena
// of `arena` bytes. Loading it verifies its plan.
Module hand_module(const std::vector<PlanBuffer>& bufs, const std::vector<PlanInstr>& instrs, uint32_t result,
                   uint64_t state, uint64_t activation, uint64_t arena) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<fb::Buffer>> fbufs;
  std::vector<int64_t> one = {1};
  fbufs.push_back(fb::CreateBufferDirect(fbb, "lr", fb::BufferKind::Hyper, fb::DType::F32, &one, 0, 4));
  for (const PlanBuffer& b : bufs) {
    std::vector<int64_t> shape = {int64_t(b.size / 4)};
    fbufs.push_back(fb::CreateBufferDirect(fbb, b.name.c_str(), b.kind, fb::DType::F32, &shape, b.offset, b.size));
  }
  std::vector<flatbuffers::Offset<fb::Instr>> fins;
  for (const PlanInstr& ins : instrs) {
    std::vector<int64_t> ints = {1};
    fins.push_back(fb::CreateInstrDirect(fbb, ins.op, &ins.in, &ins.out, &ints, nullptr, "t"));
  }
  std::vector<flatbuffers::Offset<fb::Program>> progs = {
      fb::CreateProgramDirect(fbb, "forward", &fins, result, activation)};
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  auto model = fb::CreateModelDirect(fbb, 1, 1, 4, 16, 8, 1, 8, "fp32", "cpu", "random");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "test", model, arena, &fbufs, &params,
                                                      &progs, state, arena - state, arena - state, "none", nullptr,
                                                      nullptr, nullptr, nullptr, true, /*crc32=*/1));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  seal_module(bytes);
  return Module::from_bytes(std::move(bytes), "hand.kiln");
}

// A module whose one program writes buffer i at instr first[i] and reads it last at instr
// last[i] (Copy kernels, never in place, unless `op` says otherwise), with the given offsets after a
// 256-byte state region.
Module module_for(const std::vector<LiveBuffer>& bufs, const std::vector<uint64_t>& offsets,
                  uint64_t arena, fb::OpCode op = fb::OpCode::Copy) {
  std::vector<PlanBuffer> named;
  int64_t steps = 0;
  for (size_t i = 0; i < bufs.size(); ++i) {
    named.push_back({"v" + std::to_string(i), fb::BufferKind::Activation, 256 + offsets[i], bufs[i].size});
    steps = std::max(steps, bufs[i].last + 1);
  }
  std::vector<PlanInstr> instrs(size_t(steps), PlanInstr{{}, {}, op});
  for (int64_t k = 0; k < steps; ++k)
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (bufs[i].first == k) instrs[size_t(k)].out.push_back(uint32_t(i + 1));
      else if (bufs[i].last == k) instrs[size_t(k)].in.push_back(uint32_t(i + 1));
    }
  return hand_module(named, instrs, 0, 256, arena, 256 + arena);
}

std::vector<LiveBuffer> random_buffers(std::mt19937& rng) {
  std::uniform_int_distribution<int> count(1, 60), start(0, 40), len(0, 12), words(1, 25000);
  std::vector<LiveBuffer> bufs(count(rng));
  for (LiveBuffer& b : bufs) {
    b.first = start(rng);
    b.last = b.first + len(rng);
    b.size = uint64_t(words(rng)) * 4;
  }
  return bufs;
}

// Best fit as the planner's comment states it, the plain way: for each buffer (largest first),
// the busy ranges of the placed buffers alive with it, sorted; the smallest gap that holds it.
ArenaPlan reference_plan(const std::vector<LiveBuffer>& bufs) {
  auto up = [](uint64_t n) { return (std::max<uint64_t>(n, 1) + 255) / 256 * 256; };
  ArenaPlan plan;
  plan.offsets.assign(bufs.size(), 0);
  std::vector<size_t> order(bufs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bufs[a].size > bufs[b].size; });
  std::vector<size_t> placed;
  for (size_t i : order) {
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (size_t j : placed)
      if (bufs[j].first <= bufs[i].last && bufs[i].first <= bufs[j].last)
        busy.push_back({plan.offsets[j], plan.offsets[j] + up(bufs[j].size)});
    std::sort(busy.begin(), busy.end());
    uint64_t best = UINT64_MAX, gap = UINT64_MAX, cursor = 0;
    for (auto [start, end] : busy) {
      if (start > cursor && start - cursor >= up(bufs[i].size) && start - cursor < gap) best = cursor, gap = start - cursor;
      cursor = std::max(cursor, end);
    }
    plan.offsets[i] = best != UINT64_MAX ? best : cursor;
    plan.size = std::max(plan.size, plan.offsets[i] + up(bufs[i].size));
    placed.push_back(i);
  }
  return plan;
}

TEST(ArenaPlanner, RandomPlansVerify) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<LiveBuffer> bufs = random_buffers(rng);
    ArenaPlan plan = plan_arena(bufs);
    // Bounds: at least the bytes live at the busiest instant, at most every buffer apart.
    uint64_t naive = 0, busiest = 0;
    for (const LiveBuffer& b : bufs) naive += (b.size + 255) / 256 * 256;
    for (int64_t t = 0; t <= 52; ++t) {
      uint64_t live = 0;
      for (const LiveBuffer& b : bufs)
        if (b.first <= t && t <= b.last) live += b.size;
      busiest = std::max(busiest, live);
    }
    ASSERT_GE(plan.size, busiest) << "trial " << trial;
    ASSERT_LE(plan.size, naive) << "trial " << trial;
    for (uint64_t o : plan.offsets) ASSERT_EQ(o % kArenaAlignment, 0u);
    ASSERT_NO_THROW(verify_plan(module_for(bufs, plan.offsets, plan.size))) << "trial " << trial;
  }
}

// The planner keeps its placed buffers sorted and stops at an exact fit; its offsets must be the
// plain algorithm's, on sets with many equal sizes (as a deep model's layers have) and without.
TEST(ArenaPlanner, MatchesThePlainBestFit) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 200; ++trial) {
    std::uniform_int_distribution<int> count(1, 400), start(0, 300), len(0, trial % 2 ? 20 : 200), kinds(1, 6);
    std::vector<LiveBuffer> bufs(count(rng));
    for (LiveBuffer& b : bufs) {
      b.first = start(rng);
      b.last = b.first + len(rng);
      b.size = trial % 4 < 2 ? uint64_t(kinds(rng)) * 1024 : uint64_t(kinds(rng)) * 1000 + uint64_t(start(rng));
    }
    ArenaPlan got = plan_arena(bufs), want = reference_plan(bufs);
    ASSERT_EQ(got.offsets, want.offsets) << "trial " << trial;
    ASSERT_EQ(got.size, want.size) << "trial " << trial;
  }
}

TEST(ArenaPlanner, ReusesMemoryOfDeadBuffers) {
  // Three 1 KiB buffers, each dead before the next is written: one slot serves all three.
  std::vector<LiveBuffer> bufs = {{1024, 0, 1}, {1024, 2, 3}, {1024, 4, 5}};
  ArenaPlan plan = plan_arena(bufs);
  EXPECT_EQ(plan.size, 1024u);
  EXPECT_EQ(plan.offsets, (std::vector<uint64_t>{0, 0, 0}));
}

TEST(ArenaPlanner, EmptyBuffersStillGetAddressesOfTheirOwn) {
  // A 0-byte buffer takes one aligned slot, so two alive together never share an address.
  ArenaPlan plan = plan_arena({{0, 0, 1}, {0, 1, 2}, {3, 0, 2}});
  EXPECT_EQ(plan.offsets, (std::vector<uint64_t>{256, 512, 0}));
  EXPECT_EQ(plan.size, 768u);
}

TEST(ArenaPlanner, BestFitPicksTheSmallestGap) {
  // P and R die at step 2, leaving a 4 KiB gap at 0 and a 1 KiB gap at 6144 between the
  // long-lived Q and S. T (1 KiB, steps 5..9) takes the 1 KiB gap: best fit, not first fit.
  std::vector<LiveBuffer> bufs = {
      {4096, 0, 2} /*P*/, {2048, 0, 9} /*Q*/, {1024, 0, 2} /*R*/, {1024, 0, 9} /*S*/, {1024, 5, 9} /*T*/};
  ArenaPlan plan = plan_arena(bufs);
  EXPECT_EQ(plan.offsets, (std::vector<uint64_t>{0, 4096, 6144, 7168, 6144}));
  EXPECT_EQ(plan.size, 8192u);
}

TEST(PlanVerifier, NamesBothBuffersOfAnOverlap) {
  std::vector<LiveBuffer> bufs = {{1024, 0, 3}, {1024, 1, 2}};
  try {
    verify_plan(module_for(bufs, {0, 512}, 2048));
    FAIL() << "expected an overlap";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("buffer 1 'v0' [256, 1280)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("buffer 2 'v1' [768, 1792)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("overlap while both are live"), std::string::npos) << msg;
  }
}

// The verifier sweeps over time; on random offsets (many overlaps, and outputs at an input's offset
// with other sizes) its verdict must be the plain pairwise check's, with in-place kernels and without.
TEST(PlanVerifier, AgreesWithThePairwiseCheck) {
  std::mt19937 rng(7);
  int failures = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::uniform_int_distribution<int> count(1, trial % 4 < 2 ? 4 : 12), start(0, 5), len(0, 3), slot(0, 3), words(1, 3);
    std::vector<LiveBuffer> bufs(count(rng));
    std::vector<uint64_t> offsets(bufs.size());
    uint64_t arena = 0;
    for (size_t i = 0; i < bufs.size(); ++i) {
      bufs[i].first = start(rng);
      bufs[i].last = bufs[i].first + len(rng);
      bufs[i].size = uint64_t(words(rng)) * 256;
      offsets[i] = uint64_t(slot(rng)) * 256;
      arena = std::max(arena, offsets[i] + bufs[i].size);
    }
    const bool in_place = trial % 2;
    bool want_ok = true;
    for (size_t i = 0; i < bufs.size(); ++i)
      for (size_t j = i + 1; j < bufs.size(); ++j) {
        const LiveBuffer &a = bufs[i], &b = bufs[j];
        const bool at_once = a.first <= b.last && b.first <= a.last;
        const bool shared = offsets[i] < offsets[j] + b.size && offsets[j] < offsets[i] + a.size;
        // module_for makes a buffer an input of its last instr only when that is not its first.
        const bool over = in_place && offsets[i] == offsets[j] &&
                          ((a.last == b.first && a.first < a.last) || (b.last == a.first && b.first < b.last));
        if (at_once && shared && !over) want_ok = false;
      }
    bool got_ok = true;
    try {  // loading the module verifies its plan
      module_for(bufs, offsets, arena, in_place ? fb::OpCode::Add : fb::OpCode::Copy);
    } catch (const Error& e) {
      got_ok = false;
      ASSERT_NE(std::string(e.what()).find("overlap while both are live"), std::string::npos) << e.what();
    }
    ASSERT_EQ(got_ok, want_ok) << "trial " << trial;
    failures += !got_ok;
  }
  EXPECT_GT(failures, 200);  // both verdicts are exercised
  EXPECT_LT(failures, 1800);
}

// An in-place output smaller than the input it writes over: another output of that kernel that
// overlaps the rest of the input is still caught.
TEST(PlanVerifier, CatchesAnOverlapBesideAnInPlaceOutput) {
  std::vector<LiveBuffer> bufs = {{512, 0, 2}, {256, 2, 3}, {256, 2, 3}};
  EXPECT_NO_THROW(module_for(bufs, {0, 0, 512}, 768, fb::OpCode::Add));
  try {
    module_for(bufs, {0, 0, 256}, 768, fb::OpCode::Add);
    FAIL() << "expected an overlap";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("buffer 1 'v0' [256, 768) (instrs 0..2, the first at t) and buffer 3 'v2' [512, 768) (instrs 2..3, the first at t)"), std::string::npos) << msg;
  }
}

// What loading a module laid out by hand says ("" when it loads), for the verifier's other checks:
// buffers after lr of the given kinds, offsets and sizes (a hyperparameter buffer i is named beta1,
// beta2 or eps by i % 3, an activation vi).
struct KindedBuffer {
  fb::BufferKind kind;
  uint64_t offset, size;
};
std::string plan_error(const std::vector<KindedBuffer>& bufs, const std::vector<PlanInstr>& instrs, uint32_t result,
                       uint64_t state, uint64_t activation, uint64_t arena) {
  static const char* const hypers[] = {"beta1", "beta2", "eps"};  // (names the runtime knows)
  std::vector<PlanBuffer> named;
  for (size_t i = 0; i < bufs.size(); ++i)
    named.push_back({bufs[i].kind == fb::BufferKind::Hyper ? hypers[i % 3] : "v" + std::to_string(i + 1), bufs[i].kind,
                     bufs[i].offset, bufs[i].size});
  try {
    hand_module(named, instrs, result, state, activation, arena);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

constexpr fb::BufferKind kAct = fb::BufferKind::Activation, kHyper = fb::BufferKind::Hyper;

TEST(PlanVerifier, TheStateRegionHoldsTheStateAloneWithoutOverlaps) {
  const std::vector<PlanInstr> write1 = {{{}, {1}}};  // writes v1, the result
  // As laid out: v1 an activation after the 512-byte state of lr and beta2.
  EXPECT_EQ(plan_error({{kAct, 512, 256}, {kHyper, 256, 256}}, write1, 1, 512, 256, 768), "");
  // An activation that starts inside the state region.
  EXPECT_NE(plan_error({{kAct, 256, 256}, {kHyper, 256, 256}}, write1, 1, 512, 256, 768)
                .find("buffer 1 'v1' [256, 512) is an activation inside the state region [0, 512)"),
            std::string::npos);
  // beta2 [256, 768) holds eps's bytes [512, 768). (State past the state region is Module::verify's
  // to refuse: its state_size must be where the state buffers end.)
  const std::string over =
      plan_error({{kAct, 768, 256}, {kHyper, 256, 512}, {kHyper, 512, 256}}, write1, 1, 768, 256, 1024);
  EXPECT_NE(over.find("buffer 2 'beta2' [256, 768) and buffer 3 'eps' [512, 768) overlap in the state region"),
            std::string::npos)
      << over;
}

TEST(PlanVerifier, RefusesAReadBeforeAnyWrite) {
  // Instr 0 reads v1, which no instruction writes; instr 1 writes v1 (too late).
  const std::string e =
      plan_error({{kAct, 256, 256}, {kAct, 512, 256}}, {{{1}, {2}}, {{2}, {1}}}, 1, 256, 512, 768);
  EXPECT_NE(e.find("program forward, instr 0 reads buffer 1 'v1' [256, 512) before any kernel writes it"),
            std::string::npos)
      << e;
}

TEST(PlanVerifier, TheResultStaysLiveAfterTheLastInstruction) {
  // v1, the result, written by instr 0 and read by no instruction: it is read after the call, so
  // v2 (written by instr 1) may not take its bytes; elsewhere it may.
  const std::vector<PlanInstr> instrs = {{{}, {1}}, {{}, {2}}};
  EXPECT_EQ(plan_error({{kAct, 256, 256}, {kAct, 512, 256}}, instrs, 1, 256, 512, 768), "");
  const std::string e = plan_error({{kAct, 256, 256}, {kAct, 256, 256}}, instrs, 1, 256, 256, 512);
  EXPECT_NE(e.find("buffer 1 'v1' [256, 512) (instrs 0..2"), std::string::npos) << e;
  EXPECT_NE(e.find("overlap while both are live"), std::string::npos) << e;
  // A result no instruction writes.
  EXPECT_NE(plan_error({{kAct, 256, 256}, {kAct, 512, 256}}, {{{}, {2}}}, 1, 256, 512, 768)
                .find("program forward returns buffer 1 'v1' [256, 512), which it never writes"),
            std::string::npos);
}

// (A program that plans more bytes than the arena holds is Module::verify's to refuse: the arena
// is the state region plus the largest program's plan.)
TEST(PlanVerifier, AProgramFitsItsPlannedBytes) {
  const std::vector<PlanInstr> instrs = {{{}, {1}}, {{1}, {2}}};
  EXPECT_EQ(plan_error({{kAct, 256, 256}, {kAct, 512, 256}}, instrs, 2, 256, 512, 768), "");
  // v2 lies within the arena but past the program's 256 planned bytes.
  const std::string e = plan_error({{kAct, 256, 256}, {kAct, 512, 256}}, instrs, 2, 256, 256, 768);
  EXPECT_NE(e.find("program forward: buffer 2 'v2' [512, 768) lies beyond its 256 planned activation bytes"),
            std::string::npos)
      << e;
}

// An in-place kernel may write over an input only at the input's last read: v1, read again by
// instr 2, may not be written over by instr 1's Add.
TEST(PlanVerifier, AnInPlaceOutputMayNotTakeAnInputReadLater) {
  const std::vector<PlanInstr> instrs = {{{}, {1}}, {{1}, {2}, fb::OpCode::Add}, {{1, 2}, {3}}};
  EXPECT_EQ(plan_error({{kAct, 256, 256}, {kAct, 512, 256}, {kAct, 768, 256}}, instrs, 3, 256, 768, 1024), "");
  const std::string e =
      plan_error({{kAct, 256, 256}, {kAct, 256, 256}, {kAct, 512, 256}}, instrs, 3, 256, 512, 768);
  EXPECT_NE(e.find("buffer 1 'v1' [256, 512) (instrs 0..2, the first at t) and buffer 2 'v2' [256, 512) (instrs 1..2, "
                   "the first at t) overlap while both are live"),
            std::string::npos)
      << e;
  // At its last read it may.
  EXPECT_EQ(plan_error({{kAct, 256, 256}, {kAct, 256, 256}, {kAct, 512, 256}},
                       {{{}, {1}}, {{1}, {2}, fb::OpCode::Add}, {{2}, {3}}}, 3, 256, 512, 768),
            "");
}

}  // namespace
}  // namespace kiln
