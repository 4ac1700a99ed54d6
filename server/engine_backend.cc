// NewEngineBackend: EngineBackend over the real engine (engine/training_job.h).
// The only server file that calls engine functions, so that megatrain_server
// builds and tests without megatrain_engine; this file is in the library
// megatrain_server_engine.
#include <exception>

#include "absl/strings/str_cat.h"
#include "server/engine_backend.h"
#include "server/nvml.h"

namespace megatrain::server {
namespace {

// Runs `fn`, mapping any exception that escapes the engine to INTERNAL (the
// engine should catch its own; this is the last line).
template <typename Fn>
auto Guard(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": engine threw: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": engine threw an unknown exception"));
  }
}

class RealEngineBackend final : public EngineBackend {
 public:
  absl::Status ValidateJobSpec(const engine::JobSpec& spec) override {
    return Guard("ValidateJobSpec", [&] { return engine::ValidateJobSpec(spec); });
  }

  absl::StatusOr<engine::MemoryFootprint> EstimateFootprint(const engine::JobSpec& spec) override {
    return Guard("EstimateFootprint", [&] { return engine::EstimateFootprint(spec); });
  }

  absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJob(
      const engine::JobSpec& spec, const std::string& device,
      const std::optional<std::string>& resume_from) override {
    return Guard("TrainingJob::Create",
                 [&] { return engine::TrainingJob::Create(spec, device, resume_from); });
  }

  absl::StatusOr<std::vector<engine::CheckpointInfo>> ListCheckpoints(
      const std::string& output_dir) override {
    return Guard("ListCheckpoints", [&] { return engine::ListCheckpoints(output_dir); });
  }

  absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                             const std::string& dtype) override {
    return Guard("ExportHfModel",
                 [&] { return engine::ExportHfModel(checkpoint_dir, out_dir, dtype); });
  }

  int CudaDeviceCount() override {
#if defined(MEGATRAIN_WITH_CUDA)
    // Interim: the engine does not export a device count yet; NVML (limited
    // by CUDA_VISIBLE_DEVICES) gives the same answer on a normal machine.
    std::unique_ptr<Nvml> nvml = Nvml::Load();
    return nvml == nullptr ? 0 : nvml->CudaVisibleDeviceCount();
#else
    return 0;
#endif
  }

  absl::StatusOr<LinkBandwidth> MeasureLinkBandwidth(const std::string& device) override {
    // Needs an engine function (pinned H2D/D2H copies on `device`).
    return absl::UnimplementedError(
        absl::StrCat(device, ": PCIe bandwidth measurement is not available from the engine"));
  }
};

}  // namespace

std::unique_ptr<EngineBackend> NewEngineBackend() { return std::make_unique<RealEngineBackend>(); }

}  // namespace megatrain::server
