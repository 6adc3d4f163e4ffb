#include "runtime/data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "runtime/error.h"

namespace kiln {

std::pair<int64_t, int64_t> BucketPlan::owned(size_t p, int r) const {
  const Slot& s = params[p];
  const int64_t lo = std::max(s.flat, piece_begin(s.bucket, r));
  const int64_t hi = std::min(s.flat + s.size, piece_end(s.bucket, r));
  if (lo >= hi) return {0, 0};
  return {lo - s.flat, hi - s.flat};
}

BucketPlan plan_buckets(const std::vector<std::vector<size_t>>& groups, const std::vector<int64_t>& sizes,
                        int world, int64_t align) {
  if (world < 1) throw Error("plan_buckets: world size " + std::to_string(world));
  if (align < 1) throw Error("plan_buckets: alignment " + std::to_string(align));
  BucketPlan plan;
  plan.params.resize(sizes.size());
  int64_t at = 0;
  for (const std::vector<size_t>& group : groups) {
    BucketPlan::Bucket b;
    b.begin = b.end = at;
    for (size_t k : group) {
      if (k >= sizes.size()) throw Error("plan_buckets: parameter " + std::to_string(k) + " out of range");
      plan.params[k] = {at, sizes[k], plan.buckets.size()};
      b.params.push_back(k);
      b.end = at += (sizes[k] + align - 1) / align * align;
    }
    plan.buckets.push_back(b);
  }
  plan.total = at;
  for (BucketPlan::Bucket& b : plan.buckets) {
    const int64_t len = b.end - b.begin;
    for (int r = 0; r < world; ++r) b.pieces.push_back(len / world + (r < len % world ? 1 : 0));
  }
  return plan;
}

BucketPlan plan_buckets(const std::vector<int64_t>& sizes, int64_t bucket_bytes, int world, int64_t align) {
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float)));
  std::vector<std::vector<size_t>> groups;
  int64_t filled = 0;
  for (size_t k = sizes.size(); k-- > 0;) {
    if (groups.empty() || (filled > 0 && filled + sizes[k] > cap)) groups.emplace_back(), filled = 0;
    groups.back().push_back(k);
    filled += sizes[k];
  }
  return plan_buckets(groups, sizes, world, align);
}

// The buckets the compiler placed in micro_step (ReduceGradients instructions, in order), as
// parameter indices; empty when the module has none.
std::vector<std::vector<size_t>> compiled_buckets(const Module& m) {
  std::vector<std::vector<size_t>> groups;
  const fb::Program* step = m.program("micro_step");
  if (!step) return groups;
  std::map<uint32_t, size_t> param_of_grad;
  for (uint32_t i = 0; i < m.fb().parameters()->size(); ++i) param_of_grad[m.fb().parameters()->Get(i)->grad()] = i;
  for (const fb::Instr* ins : *step->instrs()) {
    if (ins->op() != fb::OpCode::ReduceGradients) continue;
    std::vector<size_t> group;
    for (uint32_t g : *ins->inputs()) {
      auto it = param_of_grad.find(g);
      if (it == param_of_grad.end()) throw Error(m.source() + ": a ReduceGradients instruction reads a buffer that is no gradient");
      group.push_back(it->second);
    }
    if (size_t(ins->ints()->Get(0)) != groups.size())
      throw Error(m.source() + ": ReduceGradients buckets are not numbered in program order");
    groups.push_back(group);
  }
  if (groups.empty()) return groups;
  // Every parameter in exactly one bucket: one the loss does not reach (no gradient, so no
  // bucket) joins a last bucket, so ZeRO-1 still assigns its update to a rank.
  std::vector<int> seen(m.fb().parameters()->size(), 0);
  for (const auto& g : groups)
    for (size_t p : g)
      if (seen[p]++) throw Error(m.source() + ": parameter " + std::to_string(p) + " is in two gradient buckets");
  std::vector<size_t> rest;
  for (size_t p = 0; p < seen.size(); ++p)
    if (!seen[p]) rest.push_back(p);
  if (!rest.empty()) groups.push_back(rest);
  return groups;
}

BucketPlan module_buckets(const Module& m, int world, int64_t bucket_bytes, bool* compiled) {
  std::vector<int64_t> sizes;
  for (const fb::Parameter* p : *m.fb().parameters()) sizes.push_back(numel(m.buffer(p->value())));
  // The compiler's buckets when the module has them (placed in the backward pass, so each starts
  // as soon as its gradients are final); otherwise buckets of bucket_bytes, started after it.
  std::vector<std::vector<size_t>> groups = compiled_buckets(m);
  if (compiled) *compiled = !groups.empty();
  // 64 elements: the arena's alignment, so the flat vector is the gradients as a rank laid out
  // in bucket order holds them (data_parallel_state), padding included.
  return groups.empty() ? plan_buckets(sizes, bucket_bytes, world, 64) : plan_buckets(groups, sizes, world, 64);
}

StatePlan data_parallel_state(const Module& m, int world, int rank, int zero, int64_t bucket_bytes) {
  return data_parallel_state(module_buckets(m, world, bucket_bytes), rank, zero);
}

StatePlan data_parallel_state(const BucketPlan& plan, int rank, int zero) {
  StatePlan state;
  for (const BucketPlan::Bucket& b : plan.buckets) state.bucket_order.insert(state.bucket_order.end(), b.params.begin(), b.params.end());
  if (zero == 1)
    for (size_t p = 0; p < plan.params.size(); ++p) state.moment_slices.push_back(plan.owned(p, rank));
  return state;
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
      case fb::OpCode::ClipCoef: case fb::OpCode::WaitGradients: break;
      case fb::OpCode::Kernel: {  // the fused clipping + AdamW over every parameter
        const fb::Kernel* k = m.fb().kernels()->Get(uint32_t(ins->ints()->Get(0)));
        if (k->kind()->str() != "optimizer" || !k->adamw_params())
          throw Error(at + "the program has a " + k->kind()->str() + " kernel, which ZeRO-1's sharding does not know");
        for (uint32_t v : *k->adamw_params())
          if (!value[v]) throw Error(at + "a fused AdamW does not update a parameter");
        adamw += k->adamw_params()->size();
        break;
      }
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
  plan_ = module_buckets(m, comm.world_size(), bucket_bytes, &compiled_);
  if (comm.world_size() == 1) return;  // nothing to exchange; the hooks stay off
  // A GPU's gradients are in device memory: the collectives must take it (NCCL) and start after
  // the kernels on the executor's stream that compute what they reduce.
  if (ex.comm_needs_device_memory()) {
    if (!comm.device_memory())
      throw Error(m.source() + ": data parallel: the gradients of a cuda module are in GPU memory, which " +
                  comm.describe() + " cannot reduce; use --comm nccl (the default under a launcher)");
    comm.use_stream(ex.device_stream());
  } else if (comm.device_memory()) {
    throw Error(m.source() + ": data parallel: " + comm.describe() + " reduces GPU memory, but this module's "
                "buffers are in host memory");
  }
  // The collectives run on the arena itself: the executor laid the gradients and values out as
  // the flat vector of the plan (data_parallel_state).
  grads_ = in_place(Field::Grad);
  values_ = in_place(Field::Value);
  if (!plan_.params.empty() && (!grads_ || !values_))
    throw Error(m.source() + ": data parallel: the executor's gradients and values do not lie in bucket order "
                "(build it with data_parallel_state)");
  started_.assign(plan_.buckets.size(), false);
  ex.set_gradient_hooks([this](int64_t b) { if (armed_) start_bucket(size_t(b)); },
                        [this] { finish_gradient_reduction(); },
                        [this] {  // the started collectives
                          for (auto& pending : pending_) pending.second->wait();
                        });
  // Without ZeRO-1 the executor must keep every moment whole (its AdamW would write past a slice);
  // with it, set_parameter_slice below refuses slices other than this rank's.
  for (size_t p = 0; p < plan_.params.size() && zero_ == 0; ++p) {
    const uint32_t moment = m.fb().parameters()->Get(uint32_t(p))->adam_m();
    const auto held = ex.held(moment);
    if (held != std::pair<int64_t, int64_t>{0, plan_.params[p].size})
      throw Error(m.source() + ": data parallel: the executor keeps elements [" + std::to_string(held.first) + ", " +
                  std::to_string(held.second) + ") of " + m.buffer(moment).name()->str() + ", which --zero " +
                  std::to_string(zero_) + " on rank " + std::to_string(comm.rank()) + " does not update (build it "
                  "with data_parallel_state)");
  }
  if (zero_ == 1) {
    check_optimizer_program(m);
    for (size_t p = 0; p < plan_.params.size(); ++p) {
      auto [b, e] = plan_.owned(p, comm.rank());
      ex.set_parameter_slice(p, b, e);
    }
    Communicator* c = &comm_;
    ex.set_norm_reducer([c](double sum_squares) { return c->all_reduce_sum(sum_squares); });
  }
}

DataParallel::~DataParallel() {
  if (comm_.device_memory()) comm_.use_stream(nullptr);  // the executor's stream goes with it
}

std::string DataParallel::describe() const {
  char mb[32];
  std::snprintf(mb, sizeof mb, "%g", double(bucket_bytes_) / 1e6);
  return std::to_string(plan_.buckets.size()) +
         (compiled_ ? " gradient bucket(s) placed by the compiler in the backward pass"
                    : " gradient bucket(s) of <= " + std::string(mb) + " MB after the backward pass") +
         ", reduced in place" +
         (zero_ ? ", ZeRO-1 (optimizer sharded" + arena_note() + ")" : "");
}

// "; this rank keeps 1/2 of the AdamW moments: its arena is 10.21 MiB, not 12.93" (when it does).
std::string DataParallel::arena_note() const {
  const uint64_t whole = ex_.module().fb().state_size();
  if (ex_.state_bytes() >= whole) return "";
  char text[128];
  std::snprintf(text, sizeof text, "; this rank keeps 1/%d of the AdamW moments: its arena is %.2f MiB, not %.2f",
                comm_.world_size(), double(ex_.arena_bytes()) / double(1 << 20),
                double(ex_.arena_bytes() + whole - ex_.state_bytes()) / double(1 << 20));
  return text;
}

// Where the flat vector of field f starts in the executor's arena, when each parameter's buffer
// lies at its place in it (the executor was built with data_parallel_state); else nullptr.
float* DataParallel::in_place(Field f) const {
  const Module& m = ex_.module();
  auto buffer = [&](size_t p) {
    const fb::Parameter& prm = *m.fb().parameters()->Get(uint32_t(p));
    return f == Field::Value ? prm.value() : prm.grad();
  };
  if (plan_.params.empty()) return nullptr;
  float* base = ex_.comm_address(buffer(0)) - plan_.params[0].flat;
  for (size_t p = 0; p < plan_.params.size(); ++p)
    if (ex_.comm_address(buffer(p)) != base + plan_.params[p].flat) return nullptr;
  return base;
}

void DataParallel::start_bucket(size_t b) {
  if (b >= plan_.buckets.size() || started_[b]) return;
  const BucketPlan::Bucket& k = plan_.buckets[b];
  float* data = grads_ + k.begin;
  pending_.push_back({b, zero_ ? comm_.ireduce_scatter_sum(data, k.pieces) : comm_.iall_reduce_sum(data, k.end - k.begin)});
  started_[b] = true;
}

void DataParallel::start_gradient_reduction() {
  if (comm_.world_size() == 1) return;
  // Buckets the program did not start (a module without ReduceGradients instructions) start
  // now, after micro_step has returned. Bucket 0 holds the gradients the backward pass finished first.
  for (size_t b = 0; b < plan_.buckets.size(); ++b) start_bucket(b);
}

void DataParallel::finish_gradient_reduction() {
  if (comm_.world_size() == 1) return;
  for (auto& pending : pending_) pending.second->wait();
  pending_.clear();
  started_.assign(plan_.buckets.size(), false);
  ex_.state_written_in_place();
}

// Every bucket of the flat vector `flat` (in the arena), each rank contributing its pieces.
void DataParallel::all_gather(float* flat) {
  for (size_t b = 0; b < plan_.buckets.size(); ++b)
    pending_.push_back({b, comm_.iall_gather(flat + plan_.buckets[b].begin, plan_.buckets[b].pieces)});
  for (auto& pending : pending_) pending.second->wait();
  pending_.clear();
  ex_.state_written_in_place();
}

void DataParallel::gather_gradients() {
  if (comm_.world_size() == 1 || zero_ == 0) return;
  all_gather(grads_);  // the owned pieces hold the reduced gradients since the reduce-scatter
}

void DataParallel::gather_parameters() {
  if (comm_.world_size() == 1 || zero_ == 0) return;
  all_gather(values_);  // AdamW updated this rank's pieces where they lie
  ex_.refresh_gathered_compute_copies();  // bf16 copies of the pieces other ranks updated
}

// This rank's pieces of a moment into the flat vector `flat` (the gradients' place in the
// arena), then every rank's.
void DataParallel::gather_into(Field f, float* flat) {
  const Module& m = ex_.module();
  for (size_t p = 0; p < plan_.params.size(); ++p) {
    const fb::Parameter& prm = *m.fb().parameters()->Get(uint32_t(p));
    auto [lo, hi] = plan_.owned(p, comm_.rank());
    if (hi > lo) ex_.copy_elements(f == Field::AdamM ? prm.adam_m() : prm.adam_v(), lo, hi - lo, flat + plan_.params[p].flat + lo);
  }
  all_gather(flat);
}

WholeMoments DataParallel::gather_optimizer_state() {
  WholeMoments whole;
  if (comm_.world_size() == 1 || zero_ == 0) return whole;
  const bool root = comm_.rank() == 0;
  const Module& m = ex_.module();
  // Both through the gradient buffers (whole, and dead from the optimizer step to the next
  // zero_grads): v, which rank 0 copies out for the time of the save, then m.
  gather_into(Field::AdamV, grads_);
  if (root) whole.storage.resize(size_t(plan_.total)), ex_.read_floats(grads_, plan_.total, whole.storage.data());
  gather_into(Field::AdamM, grads_);
  if (!root) return {};
  ex_.sync_to_host();
  for (size_t p = 0; p < plan_.params.size(); ++p) {
    whole.adam_m.push_back(ex_.f32(m.fb().parameters()->Get(uint32_t(p))->grad()));
    whole.adam_v.push_back(whole.storage.data() + plan_.params[p].flat);
  }
  return whole;
}

}  // namespace kiln
