// The job's trainer: one device or data parallel (job_trainer.h).
#include "engine/job/job_trainer.h"

#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {

absl::StatusOr<std::vector<std::string>> JobRankDevices(const std::vector<std::string>& devices,
                                                        int64_t spec_devices) {
  if (devices.empty() || static_cast<int64_t>(devices.size()) != spec_devices) {
    return absl::InvalidArgumentError(absl::StrCat("train.devices: ", spec_devices,
                                                   " requested, the job was given ", devices.size(),
                                                   " device(s)"));
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& device : devices) {
    const bool cpu = device == "cpu" || absl::StartsWith(device, "cpu:");
    if (!cpu && !seen.insert(device).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.devices: device ", device, " given twice"));
    }
    out.push_back(cpu ? "cpu" : device);
  }
  for (const std::string& device : out) {
    if ((device == "cpu") != (out.front() == "cpu")) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.devices: the job's devices mix the CPU and CUDA (", out.front(), ", ",
                       device, ")"));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<JobTrainer>> JobTrainer::Create(
    const ModelConfig& config, TrainerOptions options, uint64_t seed,
    const std::vector<std::string>& devices) {
  std::unique_ptr<JobTrainer> t(new JobTrainer());
  if (devices.size() == 1) {
    options.device = devices.front();
    MEGATRAIN_ASSIGN_OR_RETURN(t->single_, Trainer::Create(config, options, seed));
  } else {
    // Note [Data-parallel job]: a forced cancel waits for the step boundary
    // (a rank that abandoned its pass mid-step would leave the others in a
    // collective until its timeout).
    options.abandon_step = nullptr;
    DataParallelOptions dp;
    dp.devices = devices;
    MEGATRAIN_ASSIGN_OR_RETURN(t->dp_, DataParallelTrainer::Create(config, options, seed, dp));
  }
  if (!options.nvme_dir.empty()) {  // Note [Tier shards] in store/nvme_tier.h
    MEGATRAIN_ASSIGN_OR_RETURN(NvmeMomentTier tier,
                               t->dp_ != nullptr
                                   ? t->dp_->nvme_tier()
                                   : NvmeMomentTier::Create({t->single_->nvme_shard()}));
    t->tier_ = std::make_unique<NvmeMomentTier>(std::move(tier));
  }
  return t;
}

absl::StatusOr<StepResult> JobTrainer::Step(absl::Span<const MicroBatch> micro_batches,
                                            absl::Span<const int32_t> next_input_ids) {
  if (dp_ != nullptr) return dp_->Step(micro_batches);
  return single_->Step(micro_batches, next_input_ids);
}

absl::StatusOr<double> JobTrainer::Evaluate(absl::Span<const MicroBatch> micro_batches) {
  if (dp_ != nullptr) {
    // Rank 0 reads the shared store: every rank's queued updates first.
    MEGATRAIN_RETURN_IF_ERROR(dp_->WaitForOptimizer());
    return dp_->Evaluate(micro_batches);
  }
  return single_->Evaluate(micro_batches);
}

absl::Status JobTrainer::WaitForOptimizer() {
  return dp_ != nullptr ? dp_->WaitForOptimizer() : single_->WaitForOptimizer();
}

HostStore& JobTrainer::store() { return dp_ != nullptr ? dp_->store() : single_->store(); }

int64_t JobTrainer::step() const { return dp_ != nullptr ? dp_->step() : single_->step(); }

void JobTrainer::set_step(int64_t step) {
  if (dp_ != nullptr) {
    dp_->set_step(step);
  } else {
    single_->set_step(step);
  }
}

}  // namespace megatrain::engine
