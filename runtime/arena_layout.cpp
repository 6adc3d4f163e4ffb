#include "runtime/arena_layout.h"

#include <algorithm>
#include <numeric>

#include "runtime/error.h"

namespace kiln {
namespace {

constexpr uint64_t kAlign = 256;  // the module's alignment of every buffer (Module::verify)
uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::pair<uint64_t, uint64_t> ArenaLayout::storage(const Module& m, uint32_t b) const {
  const uint64_t elem = m.buffer(b).size() / uint64_t(std::max<int64_t>(numel[b], 1));
  return {at[b] + uint64_t(held[b].first) * elem, at[b] + uint64_t(held[b].second) * elem};
}

uint64_t ArenaLayout::arena_bytes(const Module& m, const std::vector<std::string>& programs) const {
  uint64_t activations = 0;
  for (const std::string& name : programs)
    if (const fb::Program* p = m.program(name)) activations = std::max(activations, p->activation_size());
  return state_bytes + activations;
}

ArenaLayout layout_arena(const Module& m, const StatePlan& plan) {
  const auto& slices = plan.moment_slices;
  const auto& params = *m.fb().parameters();
  if (!slices.empty() && slices.size() != params.size())
    throw Error(m.source() + ": " + std::to_string(slices.size()) + " optimizer slices for " +
                std::to_string(params.size()) + " parameters");
  const uint32_t n = m.fb().buffers()->size();
  ArenaLayout l;
  l.at.resize(n);
  l.held.resize(n);
  l.numel.resize(n);
  for (uint32_t b = 0; b < n; ++b) l.numel[b] = numel(m.buffer(b)), l.held[b] = {0, l.numel[b]};
  for (uint32_t p = 0; p < slices.size(); ++p) {
    const fb::Parameter& prm = *params.Get(p);
    const auto [begin, end] = slices[p];
    if (begin < 0 || begin > end || end > l.numel[prm.value()])
      throw Error(m.source() + ": optimizer slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") is not within parameter " + prm.name()->str() + " of " + std::to_string(l.numel[prm.value()]) +
                  " elements");
    for (uint32_t mom : {prm.adam_m(), prm.adam_v()}) {
      l.held[mom] = {begin, end};
      if (begin != 0 || end != l.numel[mom]) l.sliced = true;
    }
  }
  // The state region in the module's order; a sliced moment takes the bytes of its slice, placed
  // so that element 0's position stays 256-byte aligned (vector loads line up as planned).
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return m.buffer(a).offset() < m.buffer(b).offset(); });
  uint64_t pos = 0;
  std::vector<bool> placed(n, false);
  if (!plan.bucket_order.empty()) {
    std::vector<bool> seen(params.size(), false);
    for (size_t p : plan.bucket_order) {
      if (p >= params.size())
        throw Error(m.source() + ": the bucket order names parameter " + std::to_string(p) + ", but the module has " +
                    std::to_string(params.size()));
      if (seen[p]) throw Error(m.source() + ": the bucket order names parameter " + std::to_string(p) + " twice");
      seen[p] = true;
    }
    if (plan.bucket_order.size() != params.size())
      throw Error(m.source() + ": the bucket order has " + std::to_string(plan.bucket_order.size()) + " of " +
                  std::to_string(params.size()) + " parameters");
    for (bool grads : {true, false})
      for (size_t p : plan.bucket_order) {
        const uint32_t b = grads ? params.Get(uint32_t(p))->grad() : params.Get(uint32_t(p))->value();
        l.at[b] = pos, placed[b] = true;
        pos += align_up(m.buffer(b).size());
      }
  }
  for (uint32_t b : order) {
    const fb::Buffer& buf = m.buffer(b);
    if (buf.kind() == fb::BufferKind::Activation || placed[b]) continue;
    if (l.whole(b)) {
      l.at[b] = pos;
      pos += align_up(buf.size());
      continue;
    }
    const uint64_t elem = buf.size() / uint64_t(std::max<int64_t>(l.numel[b], 1));  // F32 moments: 4
    const uint64_t skip = uint64_t(l.held[b].first) * elem;  // bytes of element 0 to `begin`
    if (pos + skip % kAlign < skip)  // never for kilnc's modules: the value and gradient come first
      throw Error(m.source() + ": buffer " + buf.name()->str() + " cannot be sliced: its element 0 would lie "
                  "before the arena (the buffers before it take fewer bytes than the slice skips)");
    l.at[b] = pos + skip % kAlign - skip;
    pos += align_up(skip % kAlign + uint64_t(l.held[b].second - l.held[b].first) * elem);
  }
  l.state_bytes = pos;
  for (uint32_t b = 0; b < n; ++b) {
    const fb::Buffer& buf = m.buffer(b);
    if (buf.kind() == fb::BufferKind::Activation)  // after the state region (verify_plan: but empty ones)
      l.at[b] = std::max(buf.offset(), m.fb().state_size()) - m.fb().state_size() + l.state_bytes;
  }
  return l;
}

}  // namespace kiln
