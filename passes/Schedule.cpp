// kiln-schedule: a memory-aware list scheduler for each function's ops.
#include "passes/Liveness.h"
#include "passes/Passes.h"

#include <set>

#include "llvm/ADT/DenseMap.h"

namespace kiln {
#define GEN_PASS_DEF_SCHEDULE
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {

class Scheduler {
 public:
  explicit Scheduler(Block& body) {
    for (Operation& op : body.without_terminator()) {
      index_[&op] = ops_.size();
      ops_.push_back(&op);
    }
    for (Operation* op : ops_) {
      llvm::SmallDenseMap<Value, unsigned> mine;
      for (Value v : op->getOperands()) uses_[v]++, mine[v]++;
      for (auto [v, k] : mine) mostByOne_[v] = std::max(mostByOne_.lookup(v), k);
    }
    for (Value v : body.getTerminator()->getOperands()) uses_[v] += 1u << 30;  // never freed
  }

  // Live-byte peak of running the ops in `order`.
  uint64_t peak(ArrayRef<Operation*> order) const {
    llvm::DenseMap<Value, unsigned> left = uses_;
    uint64_t live = 0, peak = 0;
    for (Operation* op : order) {
      live += allocated(op);
      peak = std::max(peak, live);
      for (Value v : op->getOperands())
        if (--left[v] == 0 && !isPersistent(v)) live -= byteSize(v);
      for (Value r : op->getResults())
        if (left.lookup(r) == 0 && !isPersistent(r)) live -= byteSize(r);
    }
    return peak;
  }

  SmallVector<Operation*> original() const { return SmallVector<Operation*>(ops_); }

  // Greedy: run the ready op that grows live memory least; ties keep the original order.
  SmallVector<Operation*> greedy() const {
    const size_t n = ops_.size();
    std::vector<std::vector<size_t>> succ(n);
    std::vector<unsigned> preds(n, 0);
    auto edge = [&](size_t from, size_t to) { succ[from].push_back(to), preds[to]++; };
    size_t lastEffect = SIZE_MAX;
    for (size_t i = 0; i < n; ++i) {
      llvm::SmallPtrSet<Operation*, 4> seen;
      for (Value v : ops_[i]->getOperands())
        if (Operation* d = v.getDefiningOp(); d && index_.count(d) && seen.insert(d).second)
          edge(index_.lookup(d), i);
      if (!isMemoryEffectFree(ops_[i])) {
        if (lastEffect != SIZE_MAX) edge(lastEffect, i);
        lastEffect = i;
      }
    }
    // The ready ops by (delta, index): the least growth first, ties in the original order. An
    // op's delta changes only when one of its operands becomes last-used by it (left[v] falls to
    // the op's own uses of v), so only those users are priced again: pricing every ready op at
    // every step grew with the square of the ops (seconds for a few hundred layers).
    llvm::DenseMap<Value, unsigned> left = uses_;
    std::vector<int64_t> price(n, 0);
    std::vector<bool> ready(n, false);
    std::set<std::pair<int64_t, size_t>> queue;
    auto push = [&](size_t i) {
      price[i] = delta(ops_[i], left);
      ready[i] = true;
      queue.insert({price[i], i});
    };
    for (size_t i = 0; i < n; ++i)
      if (preds[i] == 0) push(i);
    SmallVector<Operation*> order;
    while (!queue.empty()) {
      const size_t best = queue.begin()->second;
      queue.erase(queue.begin());
      ready[best] = false;
      Operation* op = ops_[best];
      order.push_back(op);
      llvm::SmallPtrSet<Value, 4> done;
      for (Value v : op->getOperands()) {
        --left[v];
        // Persistent values price nothing; while more uses are left than any one op makes, no
        // user's price changes (the clipping coefficient, read by every AdamW, is priced once).
        if (isPersistent(v) || left[v] > mostByOne_.lookup(v) || !done.insert(v).second) continue;
        for (Operation* u : v.getUsers()) {
          auto it = index_.find(u);
          if (it == index_.end() || !ready[it->second]) continue;
          const size_t i = it->second;
          if (int64_t d = delta(u, left); d != price[i]) {
            queue.erase({price[i], i});
            price[i] = d;
            queue.insert({d, i});
          }
        }
      }
      for (size_t s : succ[best])
        if (--preds[s] == 0) push(s);
    }
    return order;
  }

 private:
  static uint64_t allocated(Operation* op) {
    uint64_t bytes = 0;
    for (Value r : op->getResults())
      if (!isPersistent(r)) bytes += byteSize(r);
    return bytes;
  }
  // Bytes the op allocates minus bytes of operands whose last remaining use it is.
  int64_t delta(Operation* op, const llvm::DenseMap<Value, unsigned>& left) const {
    int64_t d = int64_t(allocated(op));
    llvm::SmallDenseMap<Value, unsigned> mine;
    for (Value v : op->getOperands()) mine[v]++;
    for (auto [v, n] : mine)
      if (left.lookup(v) == n && !isPersistent(v)) d -= int64_t(byteSize(v));
    return d;
  }

  SmallVector<Operation*> ops_;
  llvm::DenseMap<Operation*, size_t> index_;
  llvm::DenseMap<Value, unsigned> uses_;
  llvm::DenseMap<Value, unsigned> mostByOne_;  // the most uses of a value by one op
};

struct SchedulePass : kiln::impl::ScheduleBase<SchedulePass> {
  void runOnOperation() override {
    if (failed(refusePlanned(getOperation(), "kiln-schedule"))) return signalPassFailure();
    if (failed(requireOneBlock(getOperation(), "kiln-schedule"))) return signalPassFailure();
    if (failed(requireStaticTensors(getOperation(), "kiln-schedule"))) return signalPassFailure();
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (f.isExternal()) continue;
      Block& body = f.getBody().front();
      Scheduler s(body);
      SmallVector<Operation*> order = s.greedy();
      if (s.peak(order) >= s.peak(s.original())) continue;
      Operation* end = body.getTerminator();
      for (Operation* op : order) op->moveBefore(end);
    }
  }
};

}  // namespace
