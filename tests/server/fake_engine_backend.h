// FakeEngineBackend: a test double of server::EngineBackend for the server's
// unit tests (scheduler, RPC layer, CLI). NOT used by the daemon: megatraind
// links the real engine (server/core/engine_backend.cc).
//
// Its jobs "train" without any model: step k reports loss 5 * exp(-0.05 k),
// 1024 tokens and 10 ms; checkpoints are directories <output_dir>/step-<k>
// holding one file `state` ("<step>\n<spec.job_id>\n"; WriteFakeCheckpoint),
// reported through OnCheckpointWritten with a stand-in manifest hash (FNV-1a
// of that file); VerifyCheckpoint reads it back (DATA_LOSS when it does not
// parse: tests corrupt a checkpoint by overwriting it), CreateJob refuses a
// resume_from naming another job like the engine; checkpoint.keep_last is
// honoured like the engine does. Jobs either run freely or, when
// `gated`, wait before each step until the test grants steps
// (FakeJobControl::AllowSteps) or a stop is requested: tests decide exactly
// when each step happens, without sleeps.
//
// Validation mimics a few of the engine's checks, each naming its field:
// exactly one of model.preset / model.hf_dir, train.micro_batch in
// engine::kMicroBatchRange (the engine's check, from engine/spec/),
// seq_len and gradient_accumulation_steps >= 1, max_steps or max_tokens > 0,
// optimizer.lr > 0, a known optimizer.schedule, exactly one of data.tokens /
// data.text, a known preset (tiny, llama-*, or a key of
// `footprint_bytes_by_preset`). Footprints come from
// `footprint_bytes_by_preset` (default 1 MiB), plus
// `activation_offload_bytes` of pinned staging for specs with
// train.offload_activations.
//
// Thread-safety: all methods are thread-safe.
#ifndef MEGATRAIN_TESTS_SERVER_FAKE_ENGINE_BACKEND_H_
#define MEGATRAIN_TESTS_SERVER_FAKE_ENGINE_BACKEND_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/core/engine_backend.h"

namespace megatrain::server::testing {

// Shared between a fake job and the test; outlives the job.
class FakeJobControl {
 public:
  // Lets a gated job run `steps` more steps.
  void AllowSteps(int64_t steps);
  // Blocks until the job has finished `step` steps (or ended), at most
  // `timeout`; false on timeout.
  bool WaitForStep(int64_t step, absl::Duration timeout);
  // Blocks until Run() returned, at most `timeout`.
  bool WaitForEnd(absl::Duration timeout);

  // What the job was created with.
  std::string device;
  std::optional<std::string> resume_from;
  std::string spec_name;
  std::string job_id;      // spec.job_id
  std::string nvme_dir;    // spec.memory.nvme_dir
  int64_t start_step = 0;  // parsed from resume_from
  // The stop the job was last asked for (kForceCancel kept as such).
  std::optional<engine::TrainingJob::StopKind> last_stop() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

 private:
  friend class FakeTrainingJob;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t permits_ = 0;                                // guarded by mu_
  int64_t steps_done_ = 0;                             // guarded by mu_
  bool ended_ = false;                                 // guarded by mu_
  std::optional<engine::TrainingJob::StopKind> stop_;  // guarded by mu_
  bool checkpoint_requested_ = false;                  // guarded by mu_
};

class FakeEngineBackend : public EngineBackend {
 public:
  // Settings; change before jobs are created.
  bool gated = false;
  // Simulated wall time of one step (0 in unit tests, which gate instead);
  // lets a manual harness drive the daemon at a human pace.
  absl::Duration step_duration = absl::ZeroDuration();
  int cuda_device_count = 0;
  std::map<std::string, int64_t> footprint_bytes_by_preset;
  // MemoryFootprint::block_slot_bytes of a preset (default 0: fits any
  // device), with its largest block reported as decoder layer 3 of
  // bytes / 14 parameters (bf16 weight and fp32 gradient slots).
  std::map<std::string, int64_t> block_slot_bytes_by_preset;
  // Added to the footprint of a spec with train.offload_activations (as
  // host.staging and activation_offload_bytes, like the engine's estimate).
  int64_t activation_offload_bytes = 0;
  // Every footprint's device_estimate_bytes (of which device_resident_bytes
  // is what a GPU would keep resident; the CPU keeps none).
  int64_t device_estimate_bytes = 0;
  int64_t device_resident_bytes = 0;
  // What every created job's data_description() returns.
  std::string data_description;
  // CreateJob fails with this for specs named `fail_create_name`.
  std::string fail_create_name;
  absl::Status fail_create_status = absl::ResourceExhaustedError("fake: out of memory");
  // What CheckInitFromModel returns (set before the manager starts): the
  // model match itself is the engine's, tested in training_job_test.
  absl::Status init_from_model_status = absl::OkStatus();
  absl::Status CheckInitFromModel(const engine::JobSpec& spec,
                                  const std::string& checkpoint_dir) override {
    (void)spec;
    (void)checkpoint_dir;
    return init_from_model_status;
  }

  absl::Status ValidateJobSpec(const engine::JobSpec& spec) override;
  absl::StatusOr<engine::MemoryFootprint> EstimateFootprint(const engine::JobSpec& spec) override;
  absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJob(
      const engine::JobSpec& spec, const std::string& device,
      const std::optional<std::string>& resume_from) override;
  // Runs data-parallel jobs when `data_parallel` (Note [Gang scheduling] in
  // server/core/scheduling_policy.h): CreateJobOnDevices then creates a job like
  // CreateJob whose FakeJobControl::device is the devices joined by ",".
  bool data_parallel = false;
  bool RunsDataParallelJobs(const std::vector<std::string>&) override { return data_parallel; }
  absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJobOnDevices(
      const engine::JobSpec& spec, const std::vector<std::string>& devices,
      const std::optional<std::string>& resume_from) override;
  absl::StatusOr<std::vector<engine::CheckpointInfo>> ListCheckpoints(
      const std::string& output_dir) override;
  absl::StatusOr<engine::CheckpointInfo> VerifyCheckpoint(const std::string& checkpoint_dir,
                                                          bool check_data) override;
  absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                             const std::string& dtype) override;
  // Records `source_dir` (export_source_dirs), then exports as above and
  // copies nothing.
  absl::StatusOr<engine::HfExportReport> ExportHfModelFrom(const std::string& checkpoint_dir,
                                                           const std::string& out_dir,
                                                           const std::string& dtype,
                                                           const std::string& source_dir) override;
  // `source_dir` of every ExportHfModelFrom call.
  std::vector<std::string> export_source_dirs();
  // Records its arguments (adopt_calls) and adopts nothing.
  absl::StatusOr<int64_t> AdoptRecordedCheckpoints(
      const std::string& output_dir, const std::vector<std::string>& checkpoint_dirs) override;
  // (output_dir, checkpoint_dirs) of every AdoptRecordedCheckpoints call.
  std::vector<std::pair<std::string, std::vector<std::string>>> adopt_calls();
  // Runs `before_remove_checkpoint` (when set; a stand-in for a slow disk),
  // then the daemon's own removal (EngineBackend::RemoveCheckpointDir).
  absl::Status RemoveCheckpointDir(const std::string& output_dir,
                                   const std::string& checkpoint_dir) override {
    if (before_remove_checkpoint) before_remove_checkpoint(checkpoint_dir);
    return EngineBackend::RemoveCheckpointDir(output_dir, checkpoint_dir);
  }
  std::function<void(const std::string&)> before_remove_checkpoint;
  // Number of VerifyCheckpoint calls so far.
  int verify_calls();
  int CudaDeviceCount() override { return cuda_device_count; }
  // Runs `between_directions` and returns `link_bandwidth` when set;
  // UNIMPLEMENTED otherwise.
  absl::StatusOr<LinkBandwidth> MeasureLinkBandwidth(
      const std::string& device, const std::function<void()>& between_directions) override;
  std::optional<LinkBandwidth> link_bandwidth;

  // Blocks until at least `count` jobs were created, at most `timeout`;
  // returns the control of the `count`-th (1-based) or nullptr on timeout.
  std::shared_ptr<FakeJobControl> WaitForCreated(int count, absl::Duration timeout);
  // Number of CreateJob calls so far.
  int created_count();
  // Names (spec.name) of created jobs, in creation order.
  std::vector<std::string> created_names();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<FakeJobControl>> created_;                       // guarded by mu_
  int verify_calls_ = 0;                                                       // guarded by mu_
  std::vector<std::pair<std::string, std::vector<std::string>>> adopt_calls_;  // guarded by mu_
  std::vector<std::string> export_source_dirs_;                                // guarded by mu_
};

// A backend whose engine calls go to an owned FakeEngineBackend
// (`fake_`); a test derives from it and overrides only the calls it
// scripts (the submission checks' model limits, shard headers, data
// inputs). Thread-safety: as FakeEngineBackend.
class ForwardingEngineBackend : public EngineBackend {
 public:
  absl::Status ValidateJobSpec(const engine::JobSpec& spec) override {
    return fake_.ValidateJobSpec(spec);
  }
  absl::StatusOr<engine::MemoryFootprint> EstimateFootprint(const engine::JobSpec& spec) override {
    return fake_.EstimateFootprint(spec);
  }
  absl::StatusOr<std::unique_ptr<engine::TrainingJob>> CreateJob(
      const engine::JobSpec& spec, const std::string& device,
      const std::optional<std::string>& resume_from) override {
    return fake_.CreateJob(spec, device, resume_from);
  }
  absl::StatusOr<std::vector<engine::CheckpointInfo>> ListCheckpoints(
      const std::string& output_dir) override {
    return fake_.ListCheckpoints(output_dir);
  }
  absl::StatusOr<engine::CheckpointInfo> VerifyCheckpoint(const std::string& dir,
                                                          bool check_data) override {
    return fake_.VerifyCheckpoint(dir, check_data);
  }
  absl::StatusOr<int64_t> AdoptRecordedCheckpoints(
      const std::string& output_dir, const std::vector<std::string>& checkpoint_dirs) override {
    return fake_.AdoptRecordedCheckpoints(output_dir, checkpoint_dirs);
  }
  absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                             const std::string& dtype) override {
    return fake_.ExportHfModel(checkpoint_dir, out_dir, dtype);
  }
  int CudaDeviceCount() override { return 0; }
  absl::StatusOr<LinkBandwidth> MeasureLinkBandwidth(
      const std::string& device, const std::function<void()>& between_directions) override {
    return fake_.MeasureLinkBandwidth(device, between_directions);
  }

 protected:
  FakeEngineBackend fake_;
};

// Writes a fake checkpoint of `step` written by `job_id` as `dir`
// (created) and returns what the fake reports for it (its hash included).
engine::CheckpointInfo WriteFakeCheckpoint(const std::string& dir, int64_t step,
                                           const std::string& job_id);

// A fresh empty directory under the test's temp dir.
std::string MakeTempDir();

}  // namespace megatrain::server::testing

#endif  // MEGATRAIN_TESTS_SERVER_FAKE_ENGINE_BACKEND_H_
