// GradientReducer over c10d (collective_reducer.h).
#include "engine/dist/collective_reducer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/data/batch.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

// Elements per partial sum of the squared norm (Note [Gradient all-reduce]).
constexpr int64_t kNormChunk = int64_t{1} << 20;

// sum(x^2) in fp64 over fixed chunks, added in chunk order: the same bits
// for any number of threads.
double SquaredNorm(const float* x, int64_t numel) {
  const int64_t chunks = (numel + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double sum = 0;
      const int64_t stop = std::min(numel, (c + 1) * kNormChunk);
      for (int64_t i = c * kNormChunk; i < stop; ++i) sum += static_cast<double>(x[i]) * x[i];
      partial[static_cast<size_t>(c)] = sum;
    }
  });
  double total = 0;
  for (const double p : partial) total += p;
  return total;
}

}  // namespace

GradientShards::GradientShards(HostStore* shared, int world)
    : shared_(shared),
      world_(world),
      landed_(static_cast<size_t>(shared->num_blocks()), 0),
      shard_sq_(static_cast<size_t>(shared->num_blocks() * world), 0.0) {}

void GradientShards::Land(int rank, int64_t block, const float* reduced, double shard_sq) {
  // A view landing in place (Note [Shard-only landing] in
  // store/host_store.h) has nothing to copy; nor has a shared store with
  // no gradient of the block (Note [Ring shards] in
  // step/gradient_reducer.h: with the gradient ring the embedding's
  // reduced gradient stays in every rank's landing buffer, where its
  // AdamW shard reads it).
  float* dst = shared_->grad(block);
  if (reduced != nullptr && dst != nullptr && reduced != dst) {
    const ShardRange shard = ShardOf(shared_->block_numel(block), rank, world_);
    std::memcpy(dst + shard.begin, reduced + shard.begin,
                static_cast<size_t>(shard.size()) * sizeof(float));
  }
  absl::MutexLock lock(&mu_);
  shard_sq_[static_cast<size_t>(block * world_ + rank)] = shard_sq;
  ++landed_[static_cast<size_t>(block)];
}

double GradientShards::ShardNormsSum(int64_t block) {
  absl::MutexLock lock(&mu_);
  double sum = 0;
  for (int r = 0; r < world_; ++r) sum += shard_sq_[static_cast<size_t>(block * world_ + r)];
  return sum;
}

bool GradientShards::WaitLanded(int64_t block, int64_t round, absl::Duration timeout) {
  const int64_t want = round * world_;
  absl::MutexLock lock(&mu_);
  auto landed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return landed_[static_cast<size_t>(block)] >= want;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&landed), timeout);
}

CollectiveGradientReducer::CollectiveGradientReducer(CollectiveGroup* group, int64_t vocab_size,
                                                     GradientShards* shards, bool owner,
                                                     std::chrono::milliseconds timeout)
    : CollectiveGradientReducer(
          CollectiveReducerGroups{group, nullptr, false, nullptr, nullptr, group->rank()},
          vocab_size, shards, owner, timeout) {}

CollectiveGradientReducer::CollectiveGradientReducer(const CollectiveReducerGroups& groups,
                                                     int64_t vocab_size, GradientShards* shards,
                                                     bool owner, std::chrono::milliseconds timeout)
    : group_(groups.all),
      local_group_(groups.local),
      cross_group_(groups.cross),
      device_reduce_scatter_(groups.device_reduce_scatter && groups.local != nullptr),
      weights_group_(groups.weights),
      local_rank_(groups.local_rank),
      vocab_size_(vocab_size),
      shards_(shards),
      owner_(owner),
      timeout_(absl::FromChrono(timeout)) {}

void CollectiveGradientReducer::Fail(int64_t block, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (error_.ok()) {
    error_ = absl::Status(status.code(),
                          absl::StrCat("gradient of block ", block, ": ", status.message()));
  }
}

bool CollectiveGradientReducer::ReduceScatterOnDevice(int64_t block, float* grad, int64_t numel,
                                                      int64_t* begin, int64_t* end) {
  if (!device_reduce_scatter_) return false;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = error_;
    if (on_device_.size() <= static_cast<size_t>(block)) {
      on_device_.resize(static_cast<size_t>(block) + 1, false);
    }
    on_device_[static_cast<size_t>(block)] = true;
  }
  const ShardRange shard = ShardOf(numel, local_rank_, shards_->world());
  if (status.ok()) {
    status = local_group_->ReduceScatterSum(grad, numel);  // Note [Gradient all-reduce]
  }
  if (status.ok() && cross_group_ != nullptr) {
    status = cross_group_->AllReduceSumOnDevice(grad + shard.begin, shard.size());
  }
  if (!status.ok()) {
    Fail(block, status);
    *begin = *end = 0;
    return true;
  }
  *begin = shard.begin;
  *end = shard.end;
  return true;
}

void CollectiveGradientReducer::AllGatherWeights(int64_t block, void* slot, int64_t shard_numel,
                                                 int element_bytes) {
  if (weights_group_ == nullptr) return;
  const absl::Status status = weights_group_->AllGatherInPlace(slot, shard_numel, element_bytes);
  if (!status.ok()) Fail(block, status);
}

bool CollectiveGradientReducer::AllReduceOnDevice(int64_t block, float* grad, int64_t numel) {
  if (local_group_ == nullptr) return false;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = error_;
  }
  if (status.ok()) status = local_group_->AllReduceSumOnDevice(grad, numel);
  if (status.ok() && cross_group_ != nullptr) {
    status = cross_group_->AllReduceSumOnDevice(grad, numel);
  }
  if (!status.ok()) Fail(block, status);
  return true;
}

absl::Status CollectiveGradientReducer::BeginStep(absl::Span<const MicroBatch> micro_batches,
                                                  bool rank_failed) {
  {
    absl::MutexLock lock(&mu_);
    error_ = absl::OkStatus();
  }
  // {counted tokens, malformed batches, micro-batches, micro-batches^2,
  // failed ranks}: summed, they give N, whether any rank's batch is bad
  // (the executor would refuse it before its first collective, leaving the
  // others waiting), whether every rank has the same number of
  // micro-batches (sum of squares = sum^2 / world exactly when all are
  // equal), and how many ranks cannot run the step.
  int64_t counts[5] = {0, 0, static_cast<int64_t>(micro_batches.size()), 0, rank_failed ? 1 : 0};
  counts[3] = counts[2] * counts[2];
  for (const MicroBatch& mb : micro_batches) {
    bool bad = mb.input_ids.size() != mb.labels.size();
    for (const int32_t id : mb.input_ids) bad = bad || id < 0 || id >= vocab_size_;
    for (const int32_t label : mb.labels) {
      if (label == kIgnoreLabel) continue;
      bad = bad || label < 0 || label >= vocab_size_;
      ++counts[0];
    }
    counts[1] += bad ? 1 : 0;
  }
  const int64_t local_micro_batches = counts[2];
  MEGATRAIN_RETURN_IF_ERROR(group_->AllReduceSum(counts, 5));
  const int64_t world = group_->world_size();
  if (counts[4] > 0) {
    return absl::UnavailableError(
        absl::StrCat("data parallelism: ", counts[4], " of the ", world,
                     " ranks cannot run the step (their own error, e.g. an NVMe tier file, "
                     "fails it there)"));
  }
  if (counts[1] > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: ", counts[1], " micro-batch(es) over the ", world,
        " ranks have a token id or label outside [0, vocab_size) or mismatched sizes"));
  }
  if (counts[3] * world != counts[2] * counts[2]) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: every rank needs the same number of micro-batches (", counts[2],
                     " over ", world, " ranks)"));
  }
  global_tokens_ = counts[0];
  first_micro_batch_ = static_cast<int64_t>(group_->rank()) * local_micro_batches;
  return absl::OkStatus();
}

int64_t CollectiveGradientReducer::BeginRound(int64_t block, bool* on_device,
                                              absl::Status* status) {
  if (rounds_.size() <= static_cast<size_t>(block)) rounds_.resize(static_cast<size_t>(block) + 1);
  absl::MutexLock lock(&mu_);
  *status = error_;
  *on_device = false;
  if (on_device_.size() > static_cast<size_t>(block)) {
    *on_device = on_device_[static_cast<size_t>(block)];
    on_device_[static_cast<size_t>(block)] = false;
  }
  return ++rounds_[static_cast<size_t>(block)];
}

double CollectiveGradientReducer::EndRound(int64_t block, int64_t round, bool wait,
                                           absl::Status status,
                                           const std::function<double()>& squared_norm) {
  if (status.ok() && wait && !shards_->WaitLanded(block, round, timeout_)) {
    status = absl::UnavailableError("a rank's shard did not land within the collective timeout");
  }
  if (!status.ok()) {
    Fail(block, status);
    return std::numeric_limits<double>::quiet_NaN();
  }
  return squared_norm();
}

double CollectiveGradientReducer::ReduceBlock(int64_t block, float* grad, int64_t numel) {
  bool on_device = false;
  absl::Status status;
  const int64_t round = BeginRound(block, &on_device, &status);
  if (status.ok() && !on_device) {  // Note [Shard landing]: the host path
    status = group_->AllReduceSum(grad, numel);
  }
  const ShardRange shard = ShardOf(numel, local_rank_, shards_->world());
  const double shard_sq =
      status.ok() && on_device ? SquaredNorm(grad + shard.begin, shard.size()) : 0.0;
  // Counted even after a failure, so no rank waits for it.
  shards_->Land(local_rank_, block, status.ok() ? grad : nullptr, shard_sq);
  return EndRound(block, round, owner_ || on_device, status, [&] {
    return on_device ? shards_->ShardNormsSum(block) : SquaredNorm(grad, numel);
  });
}

double CollectiveGradientReducer::ReduceRingShard(int64_t block, double shard_squared_norm) {
  bool on_device = false;
  absl::Status status;
  const int64_t round = BeginRound(block, &on_device, &status);
  if (status.ok() && !on_device) {
    status = absl::FailedPreconditionError(
        "memory.gradient_landing ring: a ring landing of a block not reduce-scattered on the "
        "device (the ring needs gradient_reduction device_reduce_scatter)");
  }
  // Note [Ring shards]: nothing to copy (the shard is in this rank's ring);
  // counted even after a failure, so no rank waits for it.
  shards_->Land(local_rank_, block, nullptr, status.ok() ? shard_squared_norm : 0.0);
  return EndRound(block, round, /*wait=*/true, status,
                  [&] { return shards_->ShardNormsSum(block); });
}

absl::StatusOr<PassSums> CollectiveGradientReducer::EndStep(const PassSums& local) {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  // The term count is a small integer: exact in a double.
  double sums[3] = {local.loss_sum, local.aux_loss_sum, static_cast<double>(local.aux_loss_terms)};
  MEGATRAIN_RETURN_IF_ERROR(group_->AllReduceSum(sums, 3));
  return PassSums{sums[0], sums[1], static_cast<int64_t>(sums[2])};
}

}  // namespace megatrain::engine
