// See fake_engine_backend.h.
#include "tests/server/fake_engine_backend.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/spec/job_spec.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::server::testing {

namespace fs = std::filesystem;

// FNV-1a 64 of `text`: the fake's stand-in for the XXH64 of manifest.json.
uint64_t FakeManifestHash(absl::string_view text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash == 0 ? 1 : hash;  // 0 means "no hash recorded"
}

engine::CheckpointInfo WriteFakeCheckpoint(const std::string& dir, int64_t step,
                                           const std::string& job_id) {
  fs::create_directories(dir);
  const std::string text = absl::StrCat(step, "\n", job_id, "\n");
  std::ofstream(fs::path(dir) / "state") << text;
  engine::CheckpointInfo info;
  info.dir = dir;
  info.step = step;
  info.bytes = static_cast<int64_t>(text.size());
  info.job_id = job_id;
  info.manifest_xxh64 = FakeManifestHash(text);
  return info;
}

void FakeJobControl::AllowSteps(int64_t steps) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    permits_ += steps;
  }
  cv_.notify_all();
}

bool FakeJobControl::WaitForStep(int64_t step, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                      [&] { return steps_done_ >= step || ended_; });
}

bool FakeJobControl::WaitForEnd(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return ended_; });
}

// The fake training loop (see the header).
class FakeTrainingJob final : public engine::TrainingJob {
 public:
  FakeTrainingJob(engine::JobSpec spec, bool gated, absl::Duration step_duration,
                  std::shared_ptr<FakeJobControl> control, engine::MemoryFootprint footprint)
      : spec_(std::move(spec)),
        gated_(gated),
        step_duration_(step_duration),
        control_(std::move(control)),
        footprint_(footprint) {
    step_ = control_->start_step;
  }

  absl::StatusOr<engine::JobOutcome> Run(engine::JobObserver* observer) override {
    absl::StatusOr<engine::JobOutcome> outcome = RunLoop(observer);
    {
      std::lock_guard<std::mutex> lock(control_->mu_);
      control_->ended_ = true;
    }
    control_->cv_.notify_all();
    return outcome;
  }

  void RequestStop(StopKind kind) override {
    {
      std::lock_guard<std::mutex> lock(control_->mu_);
      // A cancel wins over a suspend.
      if (!control_->stop_.has_value() || kind != StopKind::kSuspend) control_->stop_ = kind;
    }
    control_->cv_.notify_all();
  }

  void RequestCheckpoint() override {
    {
      std::lock_guard<std::mutex> lock(control_->mu_);
      control_->checkpoint_requested_ = true;
    }
    control_->cv_.notify_all();
  }

  int64_t step() const override { return step_; }
  int64_t max_steps() const override { return spec_.train.max_steps; }
  engine::MemoryFootprint footprint() const override { return footprint_; }
  std::string data_description() const override { return data_description_; }
  std::string data_description_;

 private:
  absl::StatusOr<engine::JobOutcome> RunLoop(engine::JobObserver* observer) {
    const int64_t max_steps = spec_.train.max_steps;
    while (true) {
      // Step boundary: stop and checkpoint requests take effect here.
      std::optional<StopKind> stop;
      bool checkpoint_now = false;
      {
        std::unique_lock<std::mutex> lock(control_->mu_);
        if (gated_ && step_ < max_steps) {
          control_->cv_.wait(lock, [&] {
            return control_->permits_ > 0 || control_->stop_.has_value() ||
                   control_->checkpoint_requested_;
          });
        }
        stop = control_->stop_;
        checkpoint_now = control_->checkpoint_requested_;
        control_->checkpoint_requested_ = false;
      }
      if (checkpoint_now) WriteCheckpoint(observer);
      if (stop.has_value()) {
        if (*stop == StopKind::kSuspend) {
          WriteCheckpoint(observer);
          return engine::JobOutcome::kSuspended;
        }
        return engine::JobOutcome::kCancelled;
      }
      if (step_ >= max_steps) break;
      {
        std::lock_guard<std::mutex> lock(control_->mu_);
        if (gated_) {
          if (control_->permits_ == 0) continue;  // woken for a checkpoint only
          --control_->permits_;
        }
      }
      if (step_duration_ > absl::ZeroDuration()) absl::SleepFor(step_duration_);  // simulated work
      ++step_;
      engine::StepReport report;
      report.step = step_;
      report.max_steps = max_steps;
      report.loss = 5.0 * std::exp(-0.05 * static_cast<double>(step_));
      report.grad_norm = 1.0;
      report.lr = spec_.optimizer.lr;
      report.tokens_per_s = 102400;
      // A data-parallel job's devices share the tokens (StepReport).
      report.devices = std::max<int64_t>(1, spec_.train.devices);
      report.device_tokens_per_s = report.tokens_per_s / static_cast<double>(report.devices);
      report.mfu = 0.25;
      report.stats.tokens = 1024;
      report.stats.step_seconds = 0.01;
      report.stats.compute_seconds = 0.006;
      report.stats.h2d_seconds = 0.002;
      report.stats.d2h_seconds = 0.001;
      report.stats.gpu_idle_seconds = 0.004;
      report.stats.h2d_bytes = 1 << 20;
      report.stats.d2h_bytes = 1 << 19;
      observer->OnStep(report);
      if (spec_.eval.every_steps > 0 && step_ % spec_.eval.every_steps == 0) {
        observer->OnEval(step_, report.loss + 0.1);
      }
      if (spec_.checkpoint.every_steps > 0 && step_ % spec_.checkpoint.every_steps == 0) {
        WriteCheckpoint(observer);
      }
      {
        std::lock_guard<std::mutex> lock(control_->mu_);
        control_->steps_done_ = step_;
      }
      control_->cv_.notify_all();
    }
    WriteCheckpoint(observer);
    return engine::JobOutcome::kSucceeded;
  }

  void WriteCheckpoint(engine::JobObserver* observer) {
    const fs::path dir = fs::path(spec_.output_dir) / absl::StrCat("step-", step_);
    observer->OnCheckpointWritten(WriteFakeCheckpoint(dir.string(), step_, spec_.job_id), 0.001);
    // Retention like the engine's checkpoint.keep_last (keep_every ignored).
    if (spec_.checkpoint.keep_last > 0) {
      std::vector<std::pair<int64_t, fs::path>> existing;
      for (const auto& entry : fs::directory_iterator(spec_.output_dir)) {
        const std::string name = entry.path().filename().string();
        int64_t step = 0;
        if (absl::StartsWith(name, "step-") &&
            absl::SimpleAtoi(absl::string_view(name).substr(5), &step)) {
          existing.emplace_back(step, entry.path());
        }
      }
      std::sort(existing.begin(), existing.end());
      const int64_t excess = static_cast<int64_t>(existing.size()) - spec_.checkpoint.keep_last;
      for (int64_t old_idx = 0; old_idx < excess; ++old_idx)
        ::megatrain::testing::RemoveTestTree(existing[old_idx].second);
    }
  }

  const engine::JobSpec spec_;
  const bool gated_;
  const absl::Duration step_duration_;
  const std::shared_ptr<FakeJobControl> control_;
  const engine::MemoryFootprint footprint_;
  int64_t step_ = 0;
};

absl::Status FakeEngineBackend::ValidateJobSpec(const engine::JobSpec& spec) {
  if (spec.model.preset.empty() == spec.model.hf_dir.empty()) {
    return absl::InvalidArgumentError("model: give exactly one of preset and hf_dir");
  }
  // The engine's bound and message (Note [One place per bound] in job_spec.h).
  if (absl::Status status = engine::CheckIntInRange("train.micro_batch", spec.train.micro_batch,
                                                    engine::kMicroBatchRange);
      !status.ok()) {
    return status;
  }
  if (spec.train.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.seq_len: must be >= 1, got ", spec.train.seq_len));
  }
  if (spec.train.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.gradient_accumulation_steps: must be >= 1, got ",
                     spec.train.gradient_accumulation_steps));
  }
  if (spec.train.max_steps <= 0 && spec.train.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        "train.max_steps: one of max_steps and max_tokens must be > 0");
  }
  if (!(spec.optimizer.lr > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.lr: must be > 0, got ", spec.optimizer.lr));
  }
  if (spec.data.tokens.empty() == spec.data.text.empty()) {
    return absl::InvalidArgumentError("data: give exactly one of tokens and text");
  }
  if (!spec.model.preset.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    const bool known = spec.model.preset == "tiny" || spec.model.preset == "llama-1b" ||
                       spec.model.preset == "llama-3b" || spec.model.preset == "llama-8b" ||
                       footprint_bytes_by_preset.count(spec.model.preset) > 0;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.preset: unknown preset '", spec.model.preset, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<engine::MemoryFootprint> FakeEngineBackend::EstimateFootprint(
    const engine::JobSpec& spec) {
  engine::MemoryFootprint footprint;
  int64_t bytes = 1 << 20;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = footprint_bytes_by_preset.find(spec.model.preset);
    if (it != footprint_bytes_by_preset.end()) bytes = it->second;
    auto slots = block_slot_bytes_by_preset.find(spec.model.preset);
    if (slots != block_slot_bytes_by_preset.end()) {
      footprint.block_slot_bytes = slots->second;
      footprint.largest_block_layer_idx = 3;
      footprint.largest_block_params = slots->second / 14;
    }
    if (spec.train.offload_activations) {
      footprint.activation_offload_bytes = activation_offload_bytes;
    }
    footprint.device_estimate_bytes = device_estimate_bytes;
    footprint.device_resident_bytes = device_resident_bytes;
  }
  footprint.params = bytes / 16;
  footprint.host.master = bytes / 4;
  footprint.host.grad = bytes / 4;
  footprint.host.exp_avg = bytes / 4;
  footprint.host.exp_avg_sq = bytes - 3 * (bytes / 4);
  footprint.host.staging = footprint.activation_offload_bytes;
  footprint.host_total_bytes = bytes + footprint.activation_offload_bytes;
  if (spec.memory.nvme_tier == engine::NvmeTierMode::kMoments) {
    // The NVMe tier takes the moments, as engine::WithNvmeMoments does.
    footprint.nvme_bytes = footprint.host.exp_avg + footprint.host.exp_avg_sq;
    footprint.host_total_bytes -= footprint.nvme_bytes;
    footprint.host.exp_avg = footprint.host.exp_avg_sq = 0;
  }
  return footprint;
}

absl::StatusOr<std::unique_ptr<engine::TrainingJob>> FakeEngineBackend::CreateJobOnDevices(
    const engine::JobSpec& spec, const std::vector<std::string>& devices,
    const std::optional<std::string>& resume_from) {
  if (devices.size() > 1 && !data_parallel) {
    return EngineBackend::CreateJobOnDevices(spec, devices, resume_from);
  }
  return CreateJob(spec, absl::StrJoin(devices, ","), resume_from);
}

absl::StatusOr<std::unique_ptr<engine::TrainingJob>> FakeEngineBackend::CreateJob(
    const engine::JobSpec& spec, const std::string& device,
    const std::optional<std::string>& resume_from) {
  auto control = std::make_shared<FakeJobControl>();
  control->device = device;
  control->resume_from = resume_from;
  control->spec_name = spec.name;
  if (resume_from.has_value()) {
    const std::string name = fs::path(*resume_from).filename().string();
    if (!absl::StartsWith(name, "step-") ||
        !absl::SimpleAtoi(absl::string_view(name).substr(5), &control->start_step)) {
      return absl::DataLossError(absl::StrCat("fake: bad checkpoint dir ", *resume_from));
    }
    // Like the engine: a checkpoint naming another job is refused.
    absl::StatusOr<engine::CheckpointInfo> found = VerifyCheckpoint(*resume_from, false);
    if (found.ok() && !spec.job_id.empty() && !found->job_id.empty() &&
        found->job_id != spec.job_id) {
      return absl::FailedPreconditionError(absl::StrCat("resume: ", *resume_from,
                                                        " belongs to job ", found->job_id,
                                                        ", not to job ", spec.job_id));
    }
  }
  control->job_id = spec.job_id;
  control->nvme_dir = spec.memory.nvme_dir;
  absl::StatusOr<engine::MemoryFootprint> footprint = EstimateFootprint(spec);
  bool gated_now = false;
  absl::Duration step_duration_now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    created_.push_back(control);
    gated_now = gated;
    step_duration_now = step_duration;
  }
  cv_.notify_all();
  if (!fail_create_name.empty() && spec.name == fail_create_name) return fail_create_status;
  auto job =
      std::make_unique<FakeTrainingJob>(spec, gated_now, step_duration_now, control, *footprint);
  job->data_description_ = data_description;
  return std::unique_ptr<engine::TrainingJob>(std::move(job));
}

absl::StatusOr<std::vector<engine::CheckpointInfo>> FakeEngineBackend::ListCheckpoints(
    const std::string& output_dir) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("fake: no directory ", output_dir));
  }
  std::vector<engine::CheckpointInfo> checkpoints;
  for (const auto& entry : fs::directory_iterator(output_dir)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") ||
        !absl::SimpleAtoi(absl::string_view(name).substr(5), &step)) {
      continue;
    }
    checkpoints.push_back({entry.path().string(), step, 6});
  }
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const auto& a, const auto& b) { return a.step < b.step; });
  return checkpoints;
}

absl::StatusOr<engine::CheckpointInfo> FakeEngineBackend::VerifyCheckpoint(
    const std::string& checkpoint_dir, bool check_data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++verify_calls_;
  }
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(checkpoint_dir, ": no such checkpoint directory"));
  }
  const fs::path state_path = fs::path(checkpoint_dir) / "state";
  std::ifstream in(state_path);
  if (!in) return absl::DataLossError(absl::StrCat(state_path.string(), ": missing"));
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> lines = absl::StrSplit(text.str(), '\n');
  engine::CheckpointInfo info;
  info.dir = checkpoint_dir;
  if (lines.size() != 3 || !lines[2].empty() || !absl::SimpleAtoi(lines[0], &info.step)) {
    return absl::DataLossError(
        absl::StrCat(state_path.string(), ": XXH64 does not match manifest.json's (corrupt)"));
  }
  info.job_id = lines[1];
  info.bytes = static_cast<int64_t>(text.str().size());
  info.manifest_xxh64 = FakeManifestHash(text.str());
  return info;
}

int FakeEngineBackend::verify_calls() {
  std::lock_guard<std::mutex> lock(mu_);
  return verify_calls_;
}

absl::Status FakeEngineBackend::ExportHfModel(const std::string& checkpoint_dir,
                                              const std::string& out_dir,
                                              const std::string& dtype) {
  fs::create_directories(out_dir);
  std::ofstream(fs::path(out_dir) / "config.json")
      << "{\"from\": \"" << checkpoint_dir << "\", \"dtype\": \"" << dtype << "\"}\n";
  std::ofstream(fs::path(out_dir) / "model.safetensors");  // empty stand-in
  return absl::OkStatus();
}

absl::StatusOr<engine::HfExportReport> FakeEngineBackend::ExportHfModelFrom(
    const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
    const std::string& source_dir) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    export_source_dirs_.push_back(source_dir);
  }
  return EngineBackend::ExportHfModelFrom(checkpoint_dir, out_dir, dtype, source_dir);
}

std::vector<std::string> FakeEngineBackend::export_source_dirs() {
  std::lock_guard<std::mutex> lock(mu_);
  return export_source_dirs_;
}

absl::StatusOr<int64_t> FakeEngineBackend::AdoptRecordedCheckpoints(
    const std::string& output_dir, const std::vector<std::string>& checkpoint_dirs) {
  std::lock_guard<std::mutex> lock(mu_);
  adopt_calls_.emplace_back(output_dir, checkpoint_dirs);
  return 0;
}

std::vector<std::pair<std::string, std::vector<std::string>>> FakeEngineBackend::adopt_calls() {
  std::lock_guard<std::mutex> lock(mu_);
  return adopt_calls_;
}

absl::StatusOr<LinkBandwidth> FakeEngineBackend::MeasureLinkBandwidth(
    const std::string& device, const std::function<void()>& between_directions) {
  if (!link_bandwidth.has_value()) return absl::UnimplementedError("fake: no link");
  if (between_directions) between_directions();
  return *link_bandwidth;
}

std::shared_ptr<FakeJobControl> FakeEngineBackend::WaitForCreated(int count,
                                                                  absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                    [&] { return static_cast<int>(created_.size()) >= count; })) {
    return nullptr;
  }
  return created_[count - 1];
}

int FakeEngineBackend::created_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(created_.size());
}

std::vector<std::string> FakeEngineBackend::created_names() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& control : created_) names.push_back(control->spec_name);
  return names;
}

std::string MakeTempDir() { return ::megatrain::testing::MakeTempDir("megatrain"); }

}  // namespace megatrain::server::testing
