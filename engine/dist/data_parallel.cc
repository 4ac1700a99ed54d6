// Data-parallel trainer over c10d (data_parallel.h).
#include "engine/dist/data_parallel.h"

#include <cstring>
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
  ranks_.clear();  // drain every rank's optimizer before the reducers go
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
  t->groups_.resize(static_cast<size_t>(world));
  t->reducers_.resize(static_cast<size_t>(world));
  t->ranks_.resize(static_cast<size_t>(world));
  std::shared_ptr<RendezvousStore> store = RendezvousStore::CreateInProcess();
  // Every rank joins at once (the group's creation is a barrier), then
  // builds its trainer (its own store, pool and device).
  MEGATRAIN_RETURN_IF_ERROR(t->OnEveryRank([&](int r) -> absl::Status {
    const std::string& device = dp.devices[static_cast<size_t>(r)];
    MEGATRAIN_ASSIGN_OR_RETURN(t->groups_[r],
                               CollectiveGroup::Create(store, r, world, device, dp.timeout));
    t->reducers_[r] =
        std::make_unique<CollectiveGradientReducer>(t->groups_[r].get(), config.vocab_size);
    TrainerOptions rank_options = options;
    rank_options.device = device;
    rank_options.gradient_accumulation_steps = options.gradient_accumulation_steps / world;
    rank_options.gradient_reducer = t->reducers_[r].get();
    MEGATRAIN_ASSIGN_OR_RETURN(t->ranks_[r], Trainer::Create(config, rank_options, seed));
    return absl::OkStatus();
  }));
  return t;
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

absl::Status DataParallelTrainer::SyncReplicasFromRank0() {
  MEGATRAIN_RETURN_IF_ERROR(WaitForOptimizer());
  const HostStore& from = ranks_[0]->store();
  for (size_t r = 1; r < ranks_.size(); ++r) {
    HostStore& to = ranks_[r]->store();
    for (int64_t block = 0; block < from.num_blocks(); ++block) {
      const size_t bytes = static_cast<size_t>(from.block_numel(block)) * sizeof(float);
      std::memcpy(to.master(block), from.master(block), bytes);
      if (from.exp_avg(block) != nullptr && to.exp_avg(block) != nullptr) {
        std::memcpy(to.exp_avg(block), from.exp_avg(block), bytes);
        std::memcpy(to.exp_avg_sq(block), from.exp_avg_sq(block), bytes);
      }
      if (from.streaming_bf16(block) != nullptr && to.streaming_bf16(block) != nullptr) {
        std::memcpy(to.streaming_bf16(block), from.streaming_bf16(block),
                    static_cast<size_t>(from.block_numel(block)) * sizeof(bf16_bits));
      }
    }
    ranks_[r]->set_step(ranks_[0]->step());
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
