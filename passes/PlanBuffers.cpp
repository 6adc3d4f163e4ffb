// kiln-plan-buffers: live intervals over the scheduled order, storage sharing, arena offsets.
#include "compiler/arena_planner.h"
#include "passes/Liveness.h"
#include "passes/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/MathExtras.h"

namespace kiln {
#define GEN_PASS_DEF_PLANBUFFERS
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {

struct Interval {
  int64_t first = INT64_MAX, last = -1;
  uint64_t size = 0;
};

class FunctionPlanner {
 public:
  explicit FunctionPlanner(func::FuncOp f) : body_(f.getBody().front()), func_(f) {}

  LogicalResult run() {
    int64_t pos = 0;
    for (Operation& op : body_) position_[&op] = pos++;
    const int64_t end = pos;  // returned values live to the end of the call

    // 1. A reshape's result is its operand's storage.
    for (Operation& op : body_)
      for (Value r : op.getResults()) {
        sequence_[r] = sequence_.size();  // deterministic order for ties
        if (isPersistent(r)) persistent_.insert(r);
        else parent_[r] = r;
        if (auto reshape = dyn_cast<ReshapeOp>(op)) {
          Value in = reshape.getInput();
          if (persistent_.count(in)) persistent_.insert(r), parent_.erase(r);
          else parent_[r] = leader(in);
        }
      }

    // 2. Each storage group's interval: first write to last use.
    auto note = [&](Value v, int64_t at) {
      if (persistent_.count(v) || !parent_.count(v)) return;
      Interval& iv = groups_[leader(v)];
      iv.first = std::min(iv.first, at);
      iv.last = std::max(iv.last, at);
      iv.size = std::max(iv.size, byteSize(v));
    };
    for (Operation& op : body_) {
      const int64_t at = isa<func::ReturnOp>(op) ? end : position_[&op];
      for (Value r : op.getResults()) note(r, at);
      for (Value v : op.getOperands()) note(v, at);
      // A key/value cache is live for the whole call, so no other value of the function shares
      // its storage and it holds what the previous call stored (kiln.kv_cache).
      if (auto kv = dyn_cast<KvCacheOp>(op)) note(kv.getResult(), 0), note(kv.getResult(), end);
    }

    // 3. In place: a result takes over an operand group that ends at this op, unless another
    // operand in that group (the same value, or a reshape of it) is read at other elements.
    for (Operation& op : body_) {
      llvm::DenseSet<unsigned> placed;
      const auto pairs = inPlacePairs(&op);
      for (auto [r, i] : pairs) {
        if (placed.count(r)) continue;
        Value out = op.getResult(r), in = op.getOperand(i);
        if (persistent_.count(in) || byteSize(in) != byteSize(out)) continue;
        Value g = leader(in), o = leader(out);
        if (g == o || groups_[g].last != position_[&op]) continue;
        const bool sharedElsewhere = llvm::any_of(llvm::enumerate(op.getOperands()), [&](auto operand) {
          const unsigned j = unsigned(operand.index());
          Value v = operand.value();
          return j != i && !persistent_.count(v) && parent_.count(v) && leader(v) == g &&
                 !llvm::is_contained(pairs, std::pair<unsigned, unsigned>{r, j});
        });
        if (sharedElsewhere) continue;
        Interval merged = groups_[g];
        merged.last = std::max(merged.last, groups_[o].last);
        merged.size = std::max(merged.size, groups_[o].size);
        groups_.erase(o);
        parent_[o] = g;
        groups_[g] = merged;
        placed.insert(r);
      }
    }

    // 4. Pack. The key/value caches go first, in op order, so functions that declare the same
    // caches (@prefill and @decode) hold them at the same offsets and one leaves them filled for
    // the other; the rest is packed after them.
    std::vector<Value> leaders;
    std::vector<LiveBuffer> buffers;
    for (auto& [leader, iv] : groups_) leaders.push_back(leader);
    llvm::sort(leaders, [&](Value a, Value b) { return sequence_[a] < sequence_[b]; });
    llvm::DenseMap<Value, int64_t> offset;
    uint64_t caches = 0;
    for (Value l : leaders)
      if (l.getDefiningOp<KvCacheOp>())
        offset[l] = int64_t(caches), caches = llvm::SaturatingAdd(caches, llvm::alignTo(groups_[l].size, kArenaAlignment));
    llvm::erase_if(leaders, [&](Value l) { return l.getDefiningOp<KvCacheOp>() != nullptr; });
    for (Value l : leaders) buffers.push_back({groups_[l].size, groups_[l].first, groups_[l].last});
    // The plan places every buffer below the sum of all of them (each aligned): while that sum
    // fits in kiln.arena_size's i64, no offset or size wraps. Each value is at most 2^50 bytes,
    // so only thousands of the largest tensors get there; the plan would otherwise come out
    // negative (IR the verifier refuses) or wrap around to overlapping offsets.
    uint64_t total = caches;  // (saturating: past 2^64 it stays at the top)
    for (const LiveBuffer& buf : buffers)
      total = llvm::SaturatingAdd(total, llvm::alignTo(std::max<uint64_t>(buf.size, 1), kArenaAlignment));
    if (total > uint64_t(INT64_MAX))
      return func_.emitError() << "kiln-plan-buffers: the buffers of @" << func_.getName()
                               << " need more than 2^63 bytes together (the arena's size and offsets are i64); "
                               << "use smaller tensors";
    ArenaPlan plan = plan_arena(buffers);
    for (size_t i = 0; i < leaders.size(); ++i) offset[leaders[i]] = int64_t(caches + plan.offsets[i]);
    plan.size += caches;

    Builder b(func_.getContext());
    for (Operation& op : body_) {
      if (op.getNumResults() == 0) continue;
      SmallVector<int64_t> offsets;
      for (Value r : op.getResults())
        offsets.push_back(persistent_.count(r) ? -1 : offset.lookup(leader(r)));
      op.setAttr("kiln.offsets", b.getDenseI64ArrayAttr(offsets));
    }
    func_->setAttr("kiln.arena_size", b.getI64IntegerAttr(int64_t(plan.size)));
    return success();
  }

 private:
  // Union-find over storage groups.
  Value leader(Value v) {
    Value p = parent_.lookup(v);
    if (p == v) return v;
    Value root = leader(p);
    parent_[v] = root;
    return root;
  }

  Block& body_;
  func::FuncOp func_;
  llvm::DenseMap<Operation*, int64_t> position_;
  llvm::DenseSet<Value> persistent_;
  llvm::DenseMap<Value, Value> parent_;
  llvm::DenseMap<Value, size_t> sequence_;  // results in program order
  llvm::DenseMap<Value, Interval> groups_;
};

struct PlanBuffersPass : kiln::impl::PlanBuffersBase<PlanBuffersPass> {
  void runOnOperation() override {
    if (failed(refuseGraphIR(getOperation(), "kiln-plan-buffers"))) return signalPassFailure();
    if (failed(requireOneBlock(getOperation(), "kiln-plan-buffers"))) return signalPassFailure();
    if (failed(requireStaticTensors(getOperation(), "kiln-plan-buffers"))) return signalPassFailure();
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      if (f.isExternal()) continue;
      // Every value a function computes gets an arena offset; an argument would be a value no op
      // of it defines (the entry points read their inputs with kiln.input instead).
      if (f.getNumArguments() != 0) {
        f.emitError() << "kiln-plan-buffers: @" << f.getName() << " takes " << f.getNumArguments()
                      << " argument(s); planned functions take none (inputs are kiln.input ops)";
        return signalPassFailure();
      }
      if (failed(FunctionPlanner(f).run())) return signalPassFailure();
    }
  }
};

}  // namespace
