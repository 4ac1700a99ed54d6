// EngineBackend: the only door from the server to the training engine
// (engine/job/training_job.h). The job manager calls the engine through this
// interface so that the scheduler, the store and the RPC layer can be
// tested with a fake engine (tests/server/fake_engine_backend.h); the daemon
// uses NewEngineBackend() (server/core/engine_backend.cc, library
// megatrain_server_engine), which forwards to the engine's functions.
//
// Thread-safety: implementations must allow every method to be called
// concurrently from any thread.
#ifndef MEGATRAIN_SERVER_ENGINE_BACKEND_H_
#define MEGATRAIN_SERVER_ENGINE_BACKEND_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/formats/hf_export.h"
#include "engine/data/input_checks.h"
#include "engine/job/plan.h"
#include "engine/job/training_job.h"
#include "engine/runtime/cancellation.h"

namespace megatrain::server {

// Host <-> device copy bandwidth of one device's link, bytes per second.
struct LinkBandwidth {
  double h2d_bytes_per_second = 0;
  double d2h_bytes_per_second = 0;
  // Payload the measurement copied each way, bytes.
  int64_t bytes_copied_each_way = 0;
};

class EngineBackend {
 public:
  virtual ~EngineBackend() = default;

  // engine::ValidateJobSpec: INVALID_ARGUMENT naming the field path,
  // UNIMPLEMENTED for an unsupported architecture.
  virtual absl::Status ValidateJobSpec(const engine::JobSpec& spec) = 0;

  // engine::EstimateFootprint: bytes the job needs (reads config.json for
  // model.hf_dir: NOT_FOUND / INVALID_ARGUMENT for a missing or bad file).
  virtual absl::StatusOr<engine::MemoryFootprint> EstimateFootprint(
      const engine::JobSpec& spec) = 0;

  // As EstimateFootprint, but sizes an hf_dir model from `hf_config_json`
  // (its config.json, already read by the caller: Note [Input preflight] in
  // path_policy.h) instead of opening the file; a preset spec ignores it.
  // Stops with `cancel`'s status (CANCELLED, DEADLINE_EXCEEDED) once it is
  // not OK (Note [Cancelled engine calls] in server/rpc/rpc_call.h). The
  // default, for fakes that read no files, checks `cancel` once and calls
  // EstimateFootprint.
  virtual absl::StatusOr<engine::MemoryFootprint> EstimateFootprintFromHfConfig(
      const engine::JobSpec& spec, const std::string& hf_config_json,
      const engine::Cancellation& cancel) {
    (void)hf_config_json;
    absl::Status go_on = cancel.Check();
    if (!go_on.ok()) return go_on;
    return EstimateFootprint(spec);
  }

  // engine::PlanJobForModel: where `spec`'s bytes go on `machine`, whether
  // it fits and its projected step time; stops with `cancel`'s status as
  // above. The default, for fakes, UNIMPLEMENTED.
  virtual absl::StatusOr<engine::JobPlan> PlanJob(const engine::PlanModel& model,
                                                  const engine::JobSpec& spec,
                                                  const engine::PlanMachine& machine,
                                                  const engine::Cancellation& cancel) {
    (void)model, (void)spec, (void)machine, (void)cancel;
    return absl::UnimplementedError("PlanJob: not available without the engine");
  }

  // Note [Submit checks] (server/core/submit_checks.h). The defaults, for
  // fakes that read no files, know nothing (zeros) and find nothing wrong.
  //
  // The model's vocab_size and max_position_embeddings: from
  // `hf_config_json` (model.hf_dir's config.json, read by PreflightJobInputs)
  // or the preset; INVALID_ARGUMENT / UNIMPLEMENTED as engine::ParseHfConfig.
  struct ModelLimits {
    int64_t vocab_size = 0;               // 0: unknown
    int64_t max_position_embeddings = 0;  // 0: unknown
    int64_t num_hidden_layers = 0;        // 0: unknown
  };
  virtual absl::StatusOr<ModelLimits> ModelLimitsOf(const engine::JobSpec& spec,
                                                    const std::string& hf_config_json) {
    (void)spec;
    (void)hf_config_json;
    return ModelLimits{};
  }
  // engine::ReadTokenShardHeaders.
  virtual absl::StatusOr<std::vector<engine::TokenShardHeaderFacts>> ReadTokenShardHeaders(
      const std::string& path) {
    (void)path;
    return std::vector<engine::TokenShardHeaderFacts>{};
  }
  // engine::CheckDataInputs (Note [Data checks at submit] in
  // engine/data/input_checks.h). The default, for fakes: OK.
  virtual absl::Status CheckDataInputs(const engine::DataInputsToCheck& inputs) {
    (void)inputs;
    return absl::OkStatus();
  }
  // engine::CheckInitFromModel: model.init_from's checkpoint in
  // `checkpoint_dir` holds spec's model. The default, for fakes: OK.
  virtual absl::Status CheckInitFromModel(const engine::JobSpec& spec,
                                          const std::string& checkpoint_dir) {
    (void)spec;
    (void)checkpoint_dir;
    return absl::OkStatus();
  }
  // engine::CheckHfWeightHeaders with the model of `hf_config_json`.
  virtual absl::Status CheckHfWeightHeaders(const std::string& hf_dir,
                                            const std::string& hf_config_json) {
    (void)hf_dir;
    (void)hf_config_json;
    return absl::OkStatus();
  }

  // engine::TrainingJob::Create: builds the job on `device`, resuming from
  // the checkpoint directory `resume_from` when given (spec.job_id set: a
  // checkpoint naming another job is refused). May take long (loads
  // the model); called on the job's own thread.
  virtual absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJob(
      const engine::JobSpec& spec, const std::string& device,
      const std::optional<std::string>& resume_from) = 0;

  // Whether CreateJobOnDevices runs a job on several of `devices` (the
  // daemon's; train.devices > 1, data parallel; docs/distributed.md): the
  // engine's does when they are all CUDA devices and the build has NCCL, or
  // all CPU slots (Note [CPU device slots]) and it has gloo. When false the
  // daemon refuses such jobs at submission (UNIMPLEMENTED). The default,
  // for fakes: false.
  virtual bool RunsDataParallelJobs(const std::vector<std::string>& devices) {
    (void)devices;
    return false;
  }

  // Builds a job on `devices` (its train.devices of them, gang-scheduled:
  // Note [Gang scheduling] in scheduling_policy.h), resuming as CreateJob. The
  // engine's: engine::TrainingJob::CreateOnDevices (one rank per device).
  // The default, for fakes: one device is CreateJob; several are
  // UNIMPLEMENTED.
  virtual absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJobOnDevices(
      const engine::JobSpec& spec, const std::vector<std::string>& devices,
      const std::optional<std::string>& resume_from) {
    if (devices.size() == 1) return CreateJob(spec, devices.front(), resume_from);
    return absl::UnimplementedError(
        "train.devices: the engine's job runner does not run data-parallel jobs yet");
  }

  // engine::ListCheckpoints: complete checkpoints under `output_dir`, oldest
  // first; NOT_FOUND when the directory is missing.
  virtual absl::StatusOr<std::vector<engine::CheckpointInfo>> ListCheckpoints(
      const std::string& output_dir) = 0;

  // engine::VerifyCheckpoint: the checkpoint's step, job id (state.json) and
  // manifest hash; with `check_data` every file is read and checked against
  // its XXH64. DATA_LOSS naming the file for anything that does not verify;
  // NOT_FOUND for a missing directory.
  virtual absl::StatusOr<engine::CheckpointInfo> VerifyCheckpoint(const std::string& checkpoint_dir,
                                                                  bool check_data) = 0;

  // Removes checkpoint directory `checkpoint_dir`, which lies below
  // `output_dir`, through a descriptor of `output_dir` without following
  // symbolic links (Note [Directory descriptors] in engine/fs/dir_fd.h). A
  // missing directory is OK. INTERNAL when `checkpoint_dir` is not below
  // `output_dir`; FAILED_PRECONDITION when a link is in the way; others
  // from errno. May take as long as the file system: never call it under a
  // lock others wait on. The default (server/core/job_manager.cc) is the
  // one the daemon uses; tests override it to stand in for a slow disk.
  virtual absl::Status RemoveCheckpointDir(const std::string& output_dir,
                                           const std::string& checkpoint_dir);

  // engine::AdoptRecordedCheckpoints (Note [Checkpoint adoption] in
  // engine/checkpoint/checkpoint_info.h): records `checkpoint_dirs`, this job's
  // checkpoints in the job store, in `output_dir`'s checkpoint ledger.
  // Returns how many were newly recorded.
  virtual absl::StatusOr<int64_t> AdoptRecordedCheckpoints(
      const std::string& output_dir, const std::vector<std::string>& checkpoint_dirs) = 0;

  // engine::ExportHfModel without a source directory.
  virtual absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                                     const std::string& dtype) = 0;

  // engine::ExportHfModel keeping `source_dir`'s config keys and tokenizer
  // files (Note [Export copies] in engine/formats/hf_export.h; `source_dir`
  // resolved, empty for none). The default, for fakes, calls the form above
  // and copies nothing.
  virtual absl::StatusOr<engine::HfExportReport> ExportHfModelFrom(
      const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
      const std::string& source_dir) {
    (void)source_dir;
    absl::Status status = ExportHfModel(checkpoint_dir, out_dir, dtype);
    if (!status.ok()) return status;
    return engine::HfExportReport{};
  }

  // Number of CUDA devices usable by this process (0 without CUDA).
  virtual int CudaDeviceCount() = 0;

  // Measures the host <-> device bandwidth of `device` with pinned buffers
  // (takes about a second): H2D copies, then `between_directions` (when
  // set; on the calling thread), then D2H copies. UNIMPLEMENTED where not
  // available (CPU).
  virtual absl::StatusOr<LinkBandwidth> MeasureLinkBandwidth(
      const std::string& device, const std::function<void()>& between_directions) = 0;
};

// The engine itself (defined in server/core/engine_backend.cc, library
// megatrain_server_engine, which links megatrain_engine).
std::unique_ptr<EngineBackend> NewEngineBackend();

// Note [CPU device slots]
// "cpu:N" (N in [1, kMaxCpuDeviceSlots)) in --device is one more CPU
// "device": a slot the scheduler gives one job (or one rank of a
// data-parallel job) as it does a GPU; "cpu:0" is "cpu". The slots share the
// host's cores and memory: `--device cpu,cpu:1` lets the CPU run two jobs at
// once, or a train.devices 2 job over gloo (the engine trains every CPU
// slot on the one CPU device; engine::JobRankDevices). For tests and small
// CPU hosts; a GPU host lists its GPUs.
inline constexpr int kMaxCpuDeviceSlots = 64;

// Expands the --device flag into the devices jobs are scheduled on:
// "cpu" -> {"cpu"}; "cpu:N" -> {"cpu:N"} (Note [CPU device slots]);
// "cuda" -> {"cuda:0"}; "cuda:N" -> {"cuda:N"} (N below
// `cuda_device_count`); "auto" -> every CUDA device, or {"cpu"} when there is
// none; a comma-separated list of the above is also accepted ("cuda:0,cuda:2").
// INVALID_ARGUMENT naming --device for anything else or a missing device.
absl::StatusOr<std::vector<std::string>> ResolveDevices(absl::string_view flag,
                                                        int cuda_device_count);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_ENGINE_BACKEND_H_
