// kiln-fuse-kernels: wrap groups of scheduled ops that one kernel computes into kiln.fusion
// regions (the rules are listed in Passes.td).
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace kiln {
#define GEN_PASS_DEF_FUSEKERNELS
#include "passes/Passes.h.inc"
}  // namespace kiln

using namespace mlir;
using namespace kiln;

namespace {

// Ops an epilogue or an elementwise kernel computes element by element.
bool isElementwise(Operation* op) { return isa<AddOp, MulOp, ScaleOp, GeluOp, GeluGradOp, CastOp>(op); }

class Fuser {
 public:
  Fuser(func::FuncOp f, bool singleOps) : body_(f.getBody().front()), singleOps_(singleOps) {}

  void run() {
    // An op whose results nothing reads, and that writes no state, would be a kernel with nothing
    // to write (a region may not compute values it neither reads nor yields): it is dropped, as
    // canonicalization drops it, and so are the ops only it read (hence from the end).
    for (Operation& op : llvm::make_early_inc_range(llvm::reverse(body_.getOperations())))
      if (op.getNumResults() && op.use_empty() && isMemoryEffectFree(&op)) op.erase();
    SmallVector<Operation*> ops;
    for (Operation& op : body_.without_terminator()) ops.push_back(&op);

    for (Operation* op : ops)
      if (auto g = dyn_cast<CrossEntropyGradOp>(op)) fuseClassifier(g);
    for (Operation* op : ops)
      if (auto ce = dyn_cast<CrossEntropyOp>(op)) fuseLoss(ce);
    for (Operation* op : ops)
      if (auto l = dyn_cast<LayerNormGradOp>(op)) fuseLayerNormGrad(l);
    for (Operation* op : ops)
      if (auto m = dyn_cast<MatmulOp>(op)) fuseMatmul(m);
    for (Operation* op : ops)
      if (auto l = dyn_cast<LayerNormOp>(op)) fuseLayerNorm(l);
    for (Operation* op : ops)
      if (auto e = dyn_cast<EmbeddingGradOp>(op)) fuseEmbeddingGrad(e);
    for (Operation* op : llvm::reverse(ops)) fuseElementwise(op);
    fuseOptimizer(ops);
    if (singleOps_)
      for (Operation* op : ops) {
        if (claimed(op)) continue;
        if (isa<ReduceSumOp>(op)) claim("reduce_sum", {op});
        else if (isa<IotaOp, BroadcastOp, EmbeddingOp, ZerosOp>(op)) claim("elementwise", {op});
      }

    for (auto& [kind, group] : groups_) materialize(kind, group);
  }

 private:
  bool claimed(Operation* op) const { return claimed_.count(op); }

  // The only op that reads `v`, or null.
  static Operation* soleUser(Value v) {
    Operation* user = nullptr;
    for (Operation* u : v.getUsers()) {
      if (user && u != user) return nullptr;
      user = u;
    }
    return user;
  }

  // Ops that write model state (gradient accumulation, AdamW, the gradient exchange).
  static bool writesState(Operation* op) {
    return !isMemoryEffectFree(op) && !isStateOp(op);
  }
  // Whether `writer` (an op that writes state) changes state that `reader` reads through its
  // operands: kiln.param and kiln.grad values are the parameter and gradient buffers themselves.
  static bool clobbers(Operation* writer, Operation* reader) {
    for (Value v : reader->getOperands()) {
      if (auto p = v.getDefiningOp<ParamOp>()) {
        if (auto a = dyn_cast<AdamWOp>(writer)) {
          if (a.getName() == p.getName()) return true;
        } else if (!isa<AccumulateGradOp, ReduceGradientsOp, WaitGradientsOp>(writer)) {
          return true;  // gradient writes leave parameter values alone; anything else may not
        }
      } else if (auto g = v.getDefiningOp<GradOp>()) {
        if (auto acc = dyn_cast<AccumulateGradOp>(writer)) {
          if (acc.getName() == g.getName()) return true;
        } else if (auto r = dyn_cast<ReduceGradientsOp>(writer)) {
          for (Attribute a : r.getParams())
            if (cast<FlatSymbolRefAttr>(a).getValue() == g.getName()) return true;
        } else if (!isa<AdamWOp>(writer)) {
          return true;  // the exchange's wait, or an op this does not know
        }
      }
    }
    return false;
  }

  // Can every member run where the group's last member is? Members move down to it, so no
  // outside op in between may read a member's result, a member that writes state crosses no
  // other state access, and a member that reads state crosses no state write.
  bool legal(ArrayRef<Operation*> group) const {
    llvm::SmallPtrSet<Operation*, 16> members(group.begin(), group.end());
    Operation *first = group.front(), *root = group.front();
    for (Operation* m : group) {
      if (m->isBeforeInBlock(first)) first = m;
      if (root->isBeforeInBlock(m)) root = m;
    }
    // One walk from the first member to the root: each outside op there is crossed by the
    // members before it (the optimizer's group has an AdamW per parameter, so a walk per member
    // would be quadratic).
    bool memberWrites = false;                 // a member seen so far writes state
    SmallVector<Operation*> readersOfState;  // the members seen so far with state operands
    for (Operation* x = first; x != root; x = x->getNextNode()) {
      if (members.contains(x)) {
        memberWrites |= writesState(x);
        if (llvm::any_of(x->getOperands(), [](Value v) { return v.getDefiningOp<ParamOp>() || v.getDefiningOp<GradOp>(); }))
          readersOfState.push_back(x);
        continue;
      }
      for (Value v : x->getOperands())
        if (Operation* d = v.getDefiningOp(); d && members.contains(d)) return false;
      if (memberWrites && !isMemoryEffectFree(x)) return false;
      if (writesState(x) && llvm::any_of(readersOfState, [&](Operation* m) { return clobbers(x, m); })) return false;
    }
    return true;
  }

  // Adds `more` to `group` when the result is legal and nothing in `more` is taken.
  bool grow(SmallVector<Operation*>& group, ArrayRef<Operation*> more) const {
    for (Operation* op : more)
      if (claimed(op) || llvm::is_contained(group, op)) return false;
    SmallVector<Operation*> candidate(group);
    candidate.append(more.begin(), more.end());
    if (!legal(candidate)) return false;
    group = std::move(candidate);
    return true;
  }

  // alone: a lone op's region even without single-ops (where the generated kernel beats the
  // built-in one).
  void claim(StringRef kind, ArrayRef<Operation*> group, bool alone = false) {
    if (group.size() < 2 && !singleOps_ && !alone) return;  // a lone op is already one (built-in) kernel
    for (Operation* op : group) claimed_.insert(op);
    groups_.push_back({kind.str(), SmallVector<Operation*>(group)});
  }

  // 1. Loss and logits gradient in one pass.
  void fuseClassifier(CrossEntropyGradOp g) {
    auto ce = g.getLse().getDefiningOp<CrossEntropyOp>();
    if (!ce || ce.getLogits() != g.getLogits() || ce.getTargets() != g->getOperand(3) ||
        ce.getNumClassesAttr() != g.getNumClassesAttr() || !ce.getLse().hasOneUse() || claimed(ce))
      return;
    SmallVector<Operation*> group{ce};
    if (grow(group, {g})) claim("classifier", group);
  }

  // 1, the rest. A cross_entropy no classifier took (evaluation's loss; a training loss whose
  // log-sum-exp other ops read) is a region of its own even without single-ops: the generated
  // row pass vectorises its exponentials, which the built-in kernel (libm's expf into a double
  // sum) does not.
  void fuseLoss(CrossEntropyOp ce) {
    if (!claimed(ce)) claim("classifier", {ce}, /*alone=*/true);
  }

  // 3. Matmul epilogues, and the bias gradient of a weight-gradient matmul.
  void fuseMatmul(MatmulOp m) {
    if (claimed(m)) return;
    SmallVector<Operation*> group{m.getOperation()};
    Value cur = m.getResult();
    while (cur) {
      // The first epilogue op among cur's users that can join (others read cur from memory).
      SmallVector<Operation*> users;
      for (Operation* u : cur.getUsers())
        if (!claimed(u) && (isElementwise(u) || isa<AccumulateGradOp>(u)) && !llvm::is_contained(users, u))
          users.push_back(u);
      llvm::sort(users, [](Operation* a, Operation* b) { return a->isBeforeInBlock(b); });
      Operation* joined = nullptr;
      for (Operation* next : users)
        if (growEpilogue(group, cur, next)) {
          joined = next;
          break;
        }
      if (!joined || joined->getNumResults() == 0) break;
      cur = joined->getResult(0);
    }
    // dW = x^T dy: the bias gradient is the row sum of dy, accumulated.
    if (m.getTransposeLhs())
      for (Operation* u : m.getRhs().getUsers()) {
        auto sum = dyn_cast<ReduceSumOp>(u);
        if (!sum || claimed(sum)) continue;
        SmallVector<Operation*> chain{sum};
        Value v = sum.getResult();
        if (auto c = dyn_cast_or_null<CastOp>(soleUser(v))) chain.push_back(c), v = c.getResult();
        auto acc = dyn_cast_or_null<AccumulateGradOp>(soleUser(v));
        if (!acc) continue;
        chain.push_back(acc);
        if (grow(group, chain)) break;
      }
    claim("matmul", group);
  }

  // Adds the epilogue op `next` (a user of `cur`) to a matmul group.
  bool growEpilogue(SmallVector<Operation*>& group, Value cur, Operation* next) const {
    // What a library epilogue can give: the value before a GELU (its auxiliary output) is the only
    // intermediate read outside; after GELU or its backward, only casts follow.
    const bool readOutside =
        llvm::any_of(cur.getUsers(), [&](Operation* u) { return u != next && !llvm::is_contained(group, u); });
    if (readOutside && !isa<GeluOp>(next)) return false;
    const bool activated = llvm::any_of(group, [](Operation* op) { return isa<GeluOp, GeluGradOp>(op); });
    if (activated && !isa<CastOp>(next)) return false;
    if (auto add = dyn_cast<AddOp>(next)) {
      Value other = add.getLhs() == cur ? add.getRhs() : add.getLhs();
      auto bias = other.getDefiningOp<BroadcastOp>();
      if (bias && cast<RankedTensorType>(bias.getInput().getType()).getRank() == 1 && bias.getResult().hasOneUse())
        return grow(group, {bias, add});
      return other != cur && !feedsLayerNorm(add) && grow(group, {add});
    }
    // The cast in front of a residual add that a layer norm takes (see feedsLayerNorm).
    if (auto c = dyn_cast<CastOp>(next))
      if (auto add = dyn_cast_or_null<AddOp>(soleUser(c.getResult())); add && feedsLayerNorm(add)) return false;
    if (auto gg = dyn_cast<GeluGradOp>(next))
      return gg->getOperand(0) == cur && gg->getOperand(1) != cur && grow(group, {gg});
    if (auto mul = dyn_cast<MulOp>(next)) return mul.getLhs() != mul.getRhs() && grow(group, {mul});
    return grow(group, {next});
  }

  // A residual add whose sum a layer norm normalises joins the layer norm's kernel (rule 4), not
  // the product before it (as llm.c's fused residual + layernorm): the layer norm reads its
  // operands anyway, and the product's result stays in its own type (cuBLASLt adds a bias only
  // in the output's type).
  static bool feedsLayerNorm(AddOp add) {
    return add.getLhs() != add.getRhs() && llvm::any_of(add->getUsers(), [&](Operation* u) {
             auto l = dyn_cast<LayerNormOp>(u);
             return l && l.getInput() == add.getResult();
           });
  }

  // 4. Residual add (with the cast of an operand that only it reads) + layer norm + cast of its
  // output.
  void fuseLayerNorm(LayerNormOp l) {
    if (claimed(l)) return;
    SmallVector<Operation*> group{l.getOperation()};
    if (auto add = l.getInput().getDefiningOp<AddOp>(); add && add.getLhs() != add.getRhs() && !claimed(add) &&
                                                        grow(group, {add}))
      for (Value v : add->getOperands())
        if (auto c = v.getDefiningOp<CastOp>(); c && !claimed(c) && soleUser(c.getResult()) == add.getOperation())
          (void)grow(group, {c});
    if (auto c = dyn_cast_or_null<CastOp>(soleUser(l.getResult()))) (void)grow(group, {c});
    claim("layer_norm", group);
  }

  // 2. Layer-norm backward with the residual gradient, the accumulation of dw and db, and the
  // bias gradient of the layer before.
  void fuseLayerNormGrad(LayerNormGradOp l) {
    if (claimed(l)) return;
    SmallVector<Operation*> group{l.getOperation()};
    // A cast of the incoming gradient stays out: the template reads `grad` from memory, in
    // either float type (the verifier admits only what follows the input gradient).
    // The residual-gradient add, the accumulation of the weight and bias gradients and the cast
    // of the gradient that leaves: they interleave in program order, so they join together (the
    // longest prefix of them that is legal).
    SmallVector<Operation*> more;
    Value dx = l->getResult(0);
    if (auto add = dyn_cast_or_null<AddOp>(soleUser(dx)); add && add.getLhs() != add.getRhs())
      more.push_back(add), dx = add.getResult();
    for (unsigned i : {1u, 2u})
      if (auto acc = dyn_cast_or_null<AccumulateGradOp>(soleUser(l->getResult(i)))) more.push_back(acc);
    for (Operation* u : dx.getUsers())
      if (isa<CastOp>(u) && !claimed(u)) {
        more.push_back(u);
        break;
      }
    for (size_t k = more.size(); k > 0; --k)
      if (grow(group, ArrayRef<Operation*>(more).take_front(k))) break;
    // The bias gradient of the layer whose output gradient this is (the row sum of the gradient
    // that leaves, accumulated): a column reduction of the kernel's own output.
    Value out = l->getResult(0);
    for (Operation* op : group)
      if (isa<AddOp>(op) && llvm::is_contained(op->getOperands(), out)) out = op->getResult(0);
    for (Operation* op : group)
      if (isa<CastOp>(op) && op->getOperand(0) == out) out = op->getResult(0);
    const int64_t C = cast<RankedTensorType>(l->getResult(0).getType()).getShape().back();
    for (Operation* u : out.getUsers()) {
      auto sum = dyn_cast<ReduceSumOp>(u);
      if (!sum || claimed(sum) || cast<RankedTensorType>(sum.getResult().getType()).getNumElements() != C) continue;
      SmallVector<Operation*> chain{sum};
      Value v = sum.getResult();
      if (auto c = dyn_cast_or_null<CastOp>(soleUser(v))) chain.push_back(c), v = c.getResult();
      if (auto acc = dyn_cast_or_null<AccumulateGradOp>(soleUser(v))) {
        chain.push_back(acc);
        if (grow(group, chain)) break;
      }
    }
    claim("layer_norm_grad", group);
  }

  // 5. Embedding backward straight into the gradient accumulator.
  void fuseEmbeddingGrad(EmbeddingGradOp e) {
    if (claimed(e)) return;
    SmallVector<Operation*> group{e.getOperation()};
    // Only the accumulation may join (a cast of the rows, as the gradient of a bf16 table that
    // was widened for the gather, is a kernel of its own: the template scatters fp32 rows).
    if (auto acc = dyn_cast_or_null<AccumulateGradOp>(soleUser(e.getResult()))) (void)grow(group, {acc});
    claim("embedding_grad", group);
  }

  // 6. Elementwise chains, grown from a consumer towards its producers.
  void fuseElementwise(Operation* root) {
    if (claimed(root) || !(isElementwise(root) || isa<AccumulateGradOp>(root))) return;
    SmallVector<Operation*> group{root};
    SmallVector<Operation*> work{root};
    while (!work.empty()) {
      Operation* op = work.pop_back_val();
      for (Value v : op->getOperands()) {
        Operation* p = v.getDefiningOp();
        if (!p || claimed(p) || llvm::is_contained(group, p)) continue;
        if (!(isElementwise(p) || isa<BroadcastOp, EmbeddingOp, IotaOp>(p))) continue;
        // A gather reads its table at data-dependent rows: the table comes from memory.
        if (auto e = dyn_cast<EmbeddingOp>(op); e && v == e.getTable()) continue;
        bool inside = llvm::all_of(p->getUsers(), [&](Operation* u) { return llvm::is_contained(group, u); });
        if (inside && grow(group, {p})) work.push_back(p);
      }
    }
    claim("elementwise", group);
  }

  // 7. Clipping and every AdamW update in one launch.
  void fuseOptimizer(ArrayRef<Operation*> ops) {
    SmallVector<Operation*> group;
    for (Operation* op : ops)
      if (isa<AdamWOp>(op) && !claimed(op)) group.push_back(op);
    for (Operation* op : ops)  // clipping joins when only the updates read its coefficient
      if (isa<ClipCoefOp>(op) && !claimed(op) &&
          llvm::all_of(op->getUsers(), [](Operation* u) { return isa<AdamWOp>(u); }))
        group.push_back(op);
    if (llvm::none_of(group, [](Operation* op) { return isa<AdamWOp>(op); }) || !legal(group)) return;
    claim("optimizer", group);
  }

  // Replaces the group's ops by one kiln.fusion at the position of the last of them.
  void materialize(StringRef kind, SmallVector<Operation*>& group) {
    llvm::sort(group, [](Operation* a, Operation* b) { return a->isBeforeInBlock(b); });
    llvm::SmallPtrSet<Operation*, 16> members(group.begin(), group.end());
    llvm::SetVector<Value> inputs;
    SmallVector<Value> outputs;
    for (Operation* op : group) {
      for (Value v : op->getOperands())
        if (!members.count(v.getDefiningOp())) inputs.insert(v);
      for (Value r : op->getResults())
        if (llvm::any_of(r.getUsers(), [&](Operation* u) { return !members.count(u); }))
          outputs.push_back(r);
    }
    // The kernel's name lists the ops it fuses, each once, in order.
    std::string name;
    llvm::StringSet<> seen;
    for (Operation* op : group) {
      StringRef n = op->getName().stripDialect();
      if (!seen.insert(n).second) continue;
      if (!name.empty()) name += "_";
      name += n.str();
    }
    Operation* root = group.back();
    // The kernel's place in the model is its anchor op's (the layer_norm_grad of a layer-norm
    // backward, the matmul of a product with its epilogues), not that of the accumulation it ends with.
    Location loc = root->getLoc();
    for (Operation* op : group)
      if (op->getName().stripDialect() == kind) {
        loc = op->getLoc();
        break;
      }
    OpBuilder b(root);
    SmallVector<Type> types;
    for (Value v : outputs) types.push_back(v.getType());
    auto fusion = b.create<FusionOp>(loc, types, b.getStringAttr(kind), b.getStringAttr(name), inputs.getArrayRef());
    if (root->hasAttr("kiln.recomputed")) fusion->setAttr("kiln.recomputed", b.getUnitAttr());
    Block* block = new Block();
    fusion.getBody().push_back(block);
    IRMapping map;
    for (Value v : inputs) map.map(v, block->addArgument(v.getType(), v.getLoc()));
    OpBuilder inner = OpBuilder::atBlockEnd(block);
    for (Operation* op : group) inner.clone(*op, map);
    SmallVector<Value> yielded;
    for (Value v : outputs) yielded.push_back(map.lookup(v));
    inner.create<YieldOp>(root->getLoc(), yielded);
    for (auto [i, v] : llvm::enumerate(outputs)) v.replaceAllUsesWith(fusion->getResult(i));
    for (Operation* op : llvm::reverse(group)) op->erase();
  }

  Block& body_;
  bool singleOps_;
  llvm::DenseSet<Operation*> claimed_;
  SmallVector<std::pair<std::string, SmallVector<Operation*>>> groups_;
};

struct FuseKernelsPass : kiln::impl::FuseKernelsBase<FuseKernelsPass> {
  using FuseKernelsBase::FuseKernelsBase;
  void runOnOperation() override {
    if (failed(refuseGraphIR(getOperation(), "kiln-fuse-kernels"))) return signalPassFailure();
    if (failed(refusePlanned(getOperation(), "kiln-fuse-kernels"))) return signalPassFailure();
    if (failed(requireOneBlock(getOperation(), "kiln-fuse-kernels"))) return signalPassFailure();
    for (auto f : getOperation().getOps<func::FuncOp>())
      if (!f.isExternal()) Fuser(f, singleOps).run();
  }
};

}  // namespace
