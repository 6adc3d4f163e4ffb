#include "runtime/data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "runtime/error.h"

namespace kiln {

std::pair<int64_t, int64_t> BucketPlan::owned(size_t p, int r) const {
  const Slot& s = params[p];
  const int64_t lo = std::max(s.flat, piece_begin(s.bucket, r));
  const int64_t hi = std::min(s.flat + s.size, piece_end(s.bucket, r));
  if (lo >= hi) return {0, 0};
  return {lo - s.flat, hi - s.flat};
}

BucketPlan plan_buckets(const std::vector<int64_t>& sizes, int64_t bucket_bytes, int world) {
  if (world < 1) throw Error("plan_buckets: world size " + std::to_string(world));
  BucketPlan plan;
  plan.params.resize(sizes.size());
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float)));
  int64_t at = 0;
  for (size_t k = sizes.size(); k-- > 0;) {
    const int64_t n = sizes[k];
    if (plan.buckets.empty() || (plan.buckets.back().end - plan.buckets.back().begin > 0 &&
                                 plan.buckets.back().end - plan.buckets.back().begin + n > cap)) {
      BucketPlan::Bucket b;
      b.begin = b.end = at;
      plan.buckets.push_back(b);
    }
    BucketPlan::Bucket& b = plan.buckets.back();
    plan.params[k] = {at, n, plan.buckets.size() - 1};
    b.params.push_back(k);
    b.end = at += n;
  }
  plan.total = at;
  for (BucketPlan::Bucket& b : plan.buckets) {
    const int64_t len = b.end - b.begin;
    for (int r = 0; r < world; ++r) b.pieces.push_back(len / world + (r < len % world ? 1 : 0));
  }
  return plan;
}

namespace {

// ZeRO-1 relies on the executor's hooks, which know this optimizer program: GlobalNorm over the
// gradient buffers, ClipCoef, AdamW per parameter writing its value buffer. Anything else (a
// future compiler that reduces in the program, say) must not be silently half-sharded.
void check_optimizer_program(const Module& m) {
  const fb::Program* prog = m.program("optimizer_step");
  const std::string at = m.source() + ": optimizer_step: --zero 1: ";
  std::vector<bool> grad(m.fb().buffers()->size()), value(m.fb().buffers()->size());
  for (const fb::Parameter* p : *m.fb().parameters()) grad[p->grad()] = true, value[p->value()] = true;
  size_t adamw = 0;
  for (const fb::Instr* ins : *prog->instrs()) {
    switch (ins->op()) {
      case fb::OpCode::GlobalNorm:
        for (uint32_t b : *ins->inputs())
          if (!grad[b]) throw Error(at + "GlobalNorm reads buffer " + std::to_string(b) + ", not a gradient");
        break;
      case fb::OpCode::AdamW:
        if (!value[ins->outputs()->Get(0)] || !grad[ins->inputs()->Get(0)])
          throw Error(at + "an AdamW does not update a parameter from its gradient");
        ++adamw;
        break;
      case fb::OpCode::ClipCoef: break;
      default:
        throw Error(at + std::string("the program has a ") + fb::EnumNameOpCode(ins->op()) +
                    ", which ZeRO-1's sharding does not know");
    }
  }
  if (adamw != m.fb().parameters()->size())
    throw Error(at + std::to_string(adamw) + " AdamW updates for " + std::to_string(m.fb().parameters()->size()) +
                " parameters");
}

}  // namespace

DataParallel::DataParallel(Executor& ex, Communicator& comm, int zero, int64_t bucket_bytes)
    : ex_(ex), comm_(comm), zero_(zero), bucket_bytes_(bucket_bytes) {
  if (zero != 0 && zero != 1) throw Error("--zero: " + std::to_string(zero) + " is not 0 or 1");
  const Module& m = ex.module();
  std::vector<int64_t> sizes;
  for (const fb::Parameter* p : *m.fb().parameters()) sizes.push_back(numel(m.buffer(p->value())));
  plan_ = plan_buckets(sizes, bucket_bytes, comm.world_size());
  if (comm.world_size() == 1) return;  // nothing to exchange; the hooks stay off
  staging_.resize(size_t(plan_.total));
  if (zero_ == 1) {
    check_optimizer_program(m);
    for (size_t p = 0; p < sizes.size(); ++p) {
      auto [b, e] = plan_.owned(p, comm.rank());
      ex.set_parameter_slice(p, b, e);
    }
    Communicator* c = &comm_;
    ex.set_norm_reducer([c](double sum_squares) { return c->all_reduce_sum(sum_squares); });
  }
}

std::string DataParallel::describe() const {
  char mb[32];
  std::snprintf(mb, sizeof mb, "%g", double(bucket_bytes_) / 1e6);
  return std::to_string(plan_.buckets.size()) + " gradient bucket(s) of <= " + mb + " MB" +
         (zero_ ? ", ZeRO-1 (optimizer sharded)" : "");
}

// Copies between the parameters' buffers and bucket b's staging range: every element, or with
// owned_only this rank's piece only.
void DataParallel::pack(size_t b, bool grads, bool owned_only) {
  const Module& m = ex_.module();
  for (size_t p : plan_.buckets[b].params) {
    const fb::Parameter& prm = *m.fb().parameters()->Get(uint32_t(p));
    const float* src = ex_.f32(grads ? prm.grad() : prm.value());
    auto [lo, hi] = owned_only ? plan_.owned(p, comm_.rank()) : std::make_pair(int64_t(0), plan_.params[p].size);
    if (hi > lo) std::memcpy(&staging_[size_t(plan_.params[p].flat + lo)], src + lo, size_t(hi - lo) * sizeof(float));
  }
}

void DataParallel::unpack(size_t b, bool grads, bool owned_only) {
  const Module& m = ex_.module();
  for (size_t p : plan_.buckets[b].params) {
    const fb::Parameter& prm = *m.fb().parameters()->Get(uint32_t(p));
    float* dst = ex_.f32(grads ? prm.grad() : prm.value());
    auto [lo, hi] = owned_only ? plan_.owned(p, comm_.rank()) : std::make_pair(int64_t(0), plan_.params[p].size);
    if (hi > lo) std::memcpy(dst + lo, &staging_[size_t(plan_.params[p].flat + lo)], size_t(hi - lo) * sizeof(float));
  }
}

void DataParallel::start_gradient_reduction() {
  if (comm_.world_size() == 1) return;
  // Bucket 0 holds the last parameters, whose gradients the backward pass completes first.
  // TODO(compiler): the step program will carry these as bucket instructions placed right after
  // the last gradient of each bucket is accumulated in the final micro-step, so they overlap the
  // rest of the backward; until then they all start here, after micro_step has returned.
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const BucketPlan::Bucket& k = plan_.buckets[b];
    pack(b, /*grads=*/true, /*owned_only=*/false);
    float* data = &staging_[size_t(k.begin)];
    pending_.push_back(zero_ ? comm_.ireduce_scatter_sum(data, k.pieces) : comm_.iall_reduce_sum(data, k.end - k.begin));
  }
}

void DataParallel::finish_gradient_reduction() {
  if (comm_.world_size() == 1) return;
  for (size_t b = 0; b < pending_.size(); ++b) {
    pending_[b]->wait();
    unpack(b, /*grads=*/true, /*owned_only=*/zero_ == 1);
  }
  pending_.clear();
}

void DataParallel::gather_gradients() {
  if (comm_.world_size() == 1 || zero_ == 0) return;
  // The owned pieces of staging hold the reduced gradients since the reduce-scatter.
  for (size_t b = 0; b < plan_.buckets.size(); ++b)
    pending_.push_back(comm_.iall_gather(&staging_[size_t(plan_.buckets[b].begin)], plan_.buckets[b].pieces));
  for (size_t b = 0; b < pending_.size(); ++b) {
    pending_[b]->wait();
    unpack(b, /*grads=*/true, /*owned_only=*/false);
  }
  pending_.clear();
}

void DataParallel::gather_parameters() {
  if (comm_.world_size() == 1 || zero_ == 0) return;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    pack(b, /*grads=*/false, /*owned_only=*/true);
    pending_.push_back(comm_.iall_gather(&staging_[size_t(plan_.buckets[b].begin)], plan_.buckets[b].pieces));
  }
  for (size_t b = 0; b < pending_.size(); ++b) {
    pending_[b]->wait();
    unpack(b, /*grads=*/false, /*owned_only=*/false);
  }
  pending_.clear();
  ex_.refresh_compute_copies();  // bf16 copies of the pieces other ranks updated
}

}  // namespace kiln
