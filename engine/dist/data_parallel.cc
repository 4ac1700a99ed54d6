// Data-parallel trainer over c10d (data_parallel.h).
#include "engine/dist/data_parallel.h"

#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {

std::vector<std::string> DataParallelDevices(const std::string& base_device, int devices) {
  std::vector<std::string> out;
  if (!absl::StartsWith(base_device, "cuda")) {
    out.assign(static_cast<size_t>(std::max(devices, 0)), base_device);
    return out;
  }
  int first = 0;
  if (base_device.size() > 5 && base_device[4] == ':') {
    if (!absl::SimpleAtoi(base_device.substr(5), &first)) first = 0;
  }
  for (int r = 0; r < devices; ++r) out.push_back(absl::StrCat("cuda:", first + r));
  return out;
}

template <typename F>
absl::Status DataParallelTrainer::OnEveryRank(F fn) {
  std::vector<absl::Status> status(ranks_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    threads.emplace_back([&, r] { status[r] = fn(static_cast<int>(r)); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) MEGATRAIN_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

DataParallelTrainer::~DataParallelTrainer() {
  // The other ranks' weight gates use rank 0's queue: they go first; rank
  // 0 drains its optimizer (which writes the shared store) before the
  // reducers and the store go.
  while (!ranks_.empty()) ranks_.pop_back();
  reducers_.clear();
  groups_.clear();
}

absl::StatusOr<std::unique_ptr<DataParallelTrainer>> DataParallelTrainer::Create(
    const ModelConfig& config, const TrainerOptions& options, uint64_t seed,
    const DataParallelOptions& dp) {
  const int world = static_cast<int>(dp.devices.size());
  if (world < 1 || world > kMaxDataParallelRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.devices: must be in [1, ", kMaxDataParallelRanks, "], got ", world));
  }
  if (options.gradient_accumulation_steps % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.gradient_accumulation_steps: must be a multiple of train.devices=", world,
        " (each device runs the same number of micro-batches), got ",
        options.gradient_accumulation_steps));
  }
  std::unique_ptr<DataParallelTrainer> t(new DataParallelTrainer());
  // Note [Shared host store]: the options Trainer::Create would give its
  // own store.
  HostStoreOptions store_options;
  store_options.streaming_bf16 =
      options.compute_dtype == ComputeDtype::kBf16 && options.weight_stream == WeightStream::kBf16;
  store_options.pin = absl::StartsWith(dp.devices[0], "cuda");
  MEGATRAIN_ASSIGN_OR_RETURN(t->shared_, HostStore::Create(config, store_options));
  t->shared_->InitializeWeights(seed);
  t->shards_ = std::make_unique<GradientShards>(t->shared_.get(), world);
  t->groups_.resize(static_cast<size_t>(world));
  t->reducers_.resize(static_cast<size_t>(world));
  t->ranks_.resize(static_cast<size_t>(world));
  std::shared_ptr<RendezvousStore> store = RendezvousStore::CreateInProcess();
  // Every rank joins at once (the group's creation is a barrier).
  MEGATRAIN_RETURN_IF_ERROR(t->OnEveryRank([&](int r) -> absl::Status {
    const std::string& device = dp.devices[static_cast<size_t>(r)];
    MEGATRAIN_ASSIGN_OR_RETURN(t->groups_[r],
                               CollectiveGroup::Create(store, r, world, device, dp.timeout));
    return absl::OkStatus();
  }));
  // Then the trainers, rank 0 (the optimizer's owner) first.
  for (int r = 0; r < world; ++r) {
    t->reducers_[r] = std::make_unique<CollectiveGradientReducer>(
        t->groups_[r].get(), config.vocab_size, t->shards_.get(), r == 0, dp.timeout);
    TrainerOptions rank_options = options;
    rank_options.device = dp.devices[static_cast<size_t>(r)];
    rank_options.gradient_accumulation_steps = options.gradient_accumulation_steps / world;
    rank_options.gradient_reducer = t->reducers_[r].get();
    rank_options.shared_store = t->shared_.get();
    rank_options.optimizer_owner = r == 0 ? nullptr : t->ranks_[0].get();
    // Only rank 0's optimizer pool runs AdamW; the others' stays idle.
    if (r > 0) rank_options.threads = 1;
    MEGATRAIN_ASSIGN_OR_RETURN(t->ranks_[r], Trainer::Create(config, rank_options, seed));
  }
  return t;
}

HostStoreBytes DataParallelTrainer::host_bytes() const {
  HostStoreBytes total = shared_->bytes();
  for (const auto& rank : ranks_) {
    const HostStoreBytes b = rank->store().bytes();
    total.master += b.master;
    total.grad += b.grad;
    total.exp_avg += b.exp_avg;
    total.exp_avg_sq += b.exp_avg_sq;
    total.streaming += b.streaming;
    total.pinned += b.pinned;
  }
  return total;
}

absl::StatusOr<StepResult> DataParallelTrainer::Step(absl::Span<const MicroBatch> micro_batches) {
  const size_t world = ranks_.size();
  if (micro_batches.empty() || micro_batches.size() % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: the number of micro-batches must be a positive multiple of train.devices=", world,
        ", got ", micro_batches.size()));
  }
  const size_t share = micro_batches.size() / world;
  std::vector<StepResult> results(world);
  MEGATRAIN_RETURN_IF_ERROR(OnEveryRank([&](int r) -> absl::Status {
    MEGATRAIN_ASSIGN_OR_RETURN(results[r],
                               ranks_[r]->Step(micro_batches.subspan(r * share, share)));
    return absl::OkStatus();
  }));
  return results[0];
}

absl::StatusOr<double> DataParallelTrainer::Evaluate(absl::Span<const MicroBatch> micro_batches) {
  return ranks_[0]->Evaluate(micro_batches);
}

absl::Status DataParallelTrainer::WaitForOptimizer() {
  return OnEveryRank([&](int r) { return ranks_[r]->WaitForOptimizer(); });
}

void DataParallelTrainer::set_step(int64_t step) {
  for (auto& rank : ranks_) rank->set_step(step);
}

}  // namespace megatrain::engine
