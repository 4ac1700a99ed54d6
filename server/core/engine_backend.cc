// NewEngineBackend: EngineBackend over the real engine (engine/job/training_job.h).
// The only server file that calls engine functions, so that megatrain_server
// builds and tests without megatrain_engine; this file is in the library
// megatrain_server_engine.
#include <malloc.h>

#include <exception>
#include <new>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/dist/process_group.h"
#include "engine/formats/hf_export.h"
#include "engine/job/step_options.h"
#include "engine/data/input_checks.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_config.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/torch_compat.h"
#include "server/core/engine_backend.h"

namespace megatrain::server {
namespace {

// Runs `fn`, mapping any exception that escapes the engine to INTERNAL (the
// engine should catch its own; this is the last line), and std::bad_alloc
// to RESOURCE_EXHAUSTED: that call fails, the daemon goes on, and the heap
// the failed call freed goes back to the system (malloc_trim).
template <typename Fn>
auto Guard(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    ::malloc_trim(0);
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of host memory (std::bad_alloc); the call was abandoned"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": engine threw: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": engine threw an unknown exception"));
  }
}

class RealEngineBackend final : public EngineBackend {
 public:
  absl::Status ValidateJobSpec(const engine::JobSpec& spec) override {
    return Guard("ValidateJobSpec", [&] { return engine::ValidateJobSpecForThisBuild(spec); });
  }

  absl::StatusOr<engine::MemoryFootprint> EstimateFootprint(const engine::JobSpec& spec) override {
    return Guard("EstimateFootprint", [&] { return engine::EstimateFootprint(spec); });
  }

  absl::StatusOr<engine::JobPlan> PlanJob(const engine::PlanModel& model,
                                          const engine::JobSpec& spec,
                                          const engine::PlanMachine& machine,
                                          const engine::Cancellation& cancel) override {
    return Guard("PlanJob", [&] { return engine::PlanJobForModel(model, spec, machine, cancel); });
  }

  absl::StatusOr<engine::MemoryFootprint> EstimateFootprintFromHfConfig(
      const engine::JobSpec& spec, const std::string& hf_config_json,
      const engine::Cancellation& cancel) override {
    return Guard("EstimateFootprint", [&] {
      return engine::EstimateFootprintFromHfConfig(spec, hf_config_json, cancel);
    });
  }

  absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJob(
      const engine::JobSpec& spec, const std::string& device,
      const std::optional<std::string>& resume_from) override {
    return Guard("TrainingJob::Create",
                 [&] { return engine::TrainingJob::Create(spec, device, resume_from); });
  }

  bool RunsDataParallelJobs(const std::vector<std::string>& devices) override {
    if (devices.empty()) return false;
    const bool cuda = absl::StartsWith(devices.front(), "cuda");
    for (const std::string& device : devices) {
      // A gang of CPU slots and GPUs has no one backend (engine::JobRankDevices).
      if (absl::StartsWith(device, "cuda") != cuda) return false;
    }
    return engine::HasCollectiveBackend(cuda ? "cuda" : "cpu");
  }

  absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJobOnDevices(
      const engine::JobSpec& spec, const std::vector<std::string>& devices,
      const std::optional<std::string>& resume_from) override {
    return Guard("TrainingJob::CreateOnDevices",
                 [&] { return engine::TrainingJob::CreateOnDevices(spec, devices, resume_from); });
  }

  absl::StatusOr<std::vector<engine::CheckpointInfo>> ListCheckpoints(
      const std::string& output_dir) override {
    return Guard("ListCheckpoints", [&] { return engine::ListCheckpoints(output_dir); });
  }

  absl::StatusOr<engine::CheckpointInfo> VerifyCheckpoint(const std::string& checkpoint_dir,
                                                          bool check_data) override {
    return Guard("VerifyCheckpoint",
                 [&] { return engine::VerifyCheckpoint(checkpoint_dir, check_data); });
  }

  absl::StatusOr<int64_t> AdoptRecordedCheckpoints(
      const std::string& output_dir, const std::vector<std::string>& checkpoint_dirs) override {
    return Guard("AdoptRecordedCheckpoints",
                 [&] { return engine::AdoptRecordedCheckpoints(output_dir, checkpoint_dirs); });
  }

  absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                             const std::string& dtype) override {
    return ExportHfModelFrom(checkpoint_dir, out_dir, dtype, "").status();
  }

  absl::StatusOr<engine::HfExportReport> ExportHfModelFrom(const std::string& checkpoint_dir,
                                                           const std::string& out_dir,
                                                           const std::string& dtype,
                                                           const std::string& source_dir) override {
    return Guard("ExportHfModel", [&] {
      return engine::ExportHfModelFrom(checkpoint_dir, out_dir, dtype, source_dir);
    });
  }

  absl::StatusOr<ModelLimits> ModelLimitsOf(const engine::JobSpec& spec,
                                            const std::string& hf_config_json) override {
    return Guard("ModelLimitsOf", [&]() -> absl::StatusOr<ModelLimits> {
      absl::StatusOr<engine::ModelConfig> config = spec.model.hf_dir.empty()
                                                       ? engine::PresetConfig(spec.model.preset)
                                                       : engine::ParseHfConfig(hf_config_json);
      if (!config.ok()) return config.status();
      return ModelLimits{config->vocab_size, config->max_position_embeddings,
                         config->num_hidden_layers};
    });
  }

  absl::StatusOr<std::vector<engine::TokenShardHeaderFacts>> ReadTokenShardHeaders(
      const std::string& path) override {
    return Guard("ReadTokenShardHeaders", [&] { return engine::ReadTokenShardHeaders(path); });
  }

  absl::Status CheckInitFromModel(const engine::JobSpec& spec,
                                  const std::string& checkpoint_dir) override {
    return Guard("CheckInitFromModel",
                 [&] { return engine::CheckInitFromModel(spec, checkpoint_dir); });
  }
  absl::Status CheckDataInputs(const engine::DataInputsToCheck& inputs) override {
    return Guard("CheckDataInputs", [&] { return engine::CheckDataInputs(inputs); });
  }

  absl::Status CheckHfWeightHeaders(const std::string& hf_dir,
                                    const std::string& hf_config_json) override {
    return Guard("CheckHfWeightHeaders", [&]() -> absl::Status {
      absl::StatusOr<engine::ModelConfig> config = engine::ParseHfConfig(hf_config_json);
      if (!config.ok()) return config.status();
      return engine::CheckHfWeightHeaders(hf_dir, *config);
    });
  }

  int CudaDeviceCount() override { return engine::CudaDeviceCount(); }

  absl::StatusOr<LinkBandwidth> MeasureLinkBandwidth(
      const std::string& device, const std::function<void()>& between_directions) override {
    return Guard("MeasureLinkBandwidth", [&]() -> absl::StatusOr<LinkBandwidth> {
      absl::StatusOr<engine::LinkBandwidthMeasurement> m = engine::MeasureLinkBandwidth(
          device, /*bytes_per_copy=*/256 << 20, /*repeats=*/8, between_directions);
      if (!m.ok()) return m.status();
      return LinkBandwidth{m->h2d_bytes_per_second, m->d2h_bytes_per_second,
                           m->bytes_copied_each_way};
    });
  }
};

}  // namespace

// Called once by RunDaemonMain, after the flags parse and before any thread
// or CUDA allocation (Note [Expandable segments] in engine/runtime/torch_compat.h).
std::unique_ptr<EngineBackend> NewEngineBackend() {
  engine::compat::PreferExpandableSegments();
  return std::make_unique<RealEngineBackend>();
}

}  // namespace megatrain::server
