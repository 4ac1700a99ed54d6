// See checkpoint_records.h.
#include "server/core/checkpoint_records.h"

#include <cstdint>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/runtime/status_macros.h"
#include "server/core/logging.h"

namespace megatrain::server {
namespace {

namespace fs = std::filesystem;

}  // namespace

JobEvent CheckpointRecords::RecordWritten(const std::string& job_id, const std::string& owner,
                                          const engine::CheckpointInfo& info,
                                          double write_seconds) {
  CheckpointRecord checkpoint;
  checkpoint.job_id = job_id;
  checkpoint.step = info.step;
  checkpoint.dir = info.dir;
  checkpoint.bytes = info.bytes;
  checkpoint.create_time_unix_ms = NowUnixMs();
  checkpoint.write_seconds = write_seconds;
  checkpoint.owner = owner;
  checkpoint.manifest_xxh64 = info.manifest_xxh64;
  absl::Status status = store_->RecordCheckpoint(checkpoint);
  if (!status.ok()) LogError(absl::StrCat(job_id, ": recording checkpoint: ", status.ToString()));
  ForgetVanished(job_id, info.step);
  JobEvent event;
  event.job_id = job_id;
  event.time_unix_ms = checkpoint.create_time_unix_ms;
  event.kind = JobEvent::Kind::kCheckpoint;
  event.step = info.step;
  event.checkpoint_dir = info.dir;
  event.checkpoint_seconds = write_seconds;
  return event;
}

absl::StatusOr<std::vector<CheckpointRecord>> CheckpointRecords::Present(
    const std::string& job_id) {
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> recorded,
                             store_->ListCheckpoints(job_id));
  // Only the recorded path is looked at (no directory scan): a record whose
  // directory is gone (retention, deleted by hand) is not listed.
  std::vector<CheckpointRecord> present;
  for (CheckpointRecord& checkpoint : recorded) {
    std::error_code ec;
    if (fs::is_directory(checkpoint.dir, ec)) present.push_back(std::move(checkpoint));
  }
  return present;
}

absl::StatusOr<CheckpointRecord> CheckpointRecords::Find(const JobRecord& job, int64_t step,
                                                         absl::string_view checkpoint_id) {
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> checkpoints, Present(job.id));
  for (CheckpointRecord& checkpoint : checkpoints) {
    if (checkpoint.step == step) return std::move(checkpoint);
  }
  return absl::NotFoundError(absl::StrCat("checkpoint '", checkpoint_id, "' not found (job ",
                                          job.id, " has ", checkpoints.size(),
                                          " recorded checkpoints)"));
}

std::string CheckpointRecords::LatestDir(const JobRecord& job) {
  absl::StatusOr<std::vector<CheckpointRecord>> checkpoints = store_->ListCheckpoints(job.id);
  if (!checkpoints.ok()) {
    LogWarning(absl::StrCat(job.id, ": listing checkpoints: ", checkpoints.status().ToString()));
    return job.resume_from;
  }
  if (checkpoints->empty()) return "";
  return checkpoints->back().dir;
}

void CheckpointRecords::Adopt(const JobRecord& job) {
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job.id);
  if (!recorded.ok()) {
    LogError(absl::StrCat(job.id, ": adopting checkpoints: ", recorded.status().ToString()));
    return;
  }
  if (recorded->empty()) return;
  std::vector<std::string> dirs;
  for (const CheckpointRecord& checkpoint : *recorded) dirs.push_back(checkpoint.dir);
  absl::StatusOr<int64_t> adopted =
      backend_->AdoptRecordedCheckpoints(job.request.spec.output_dir, dirs);
  if (!adopted.ok()) {
    // The job's own checkpoint write reports a broken directory; retention
    // then simply keeps the unadopted checkpoints.
    LogError(absl::StrCat(job.id, ": adopting checkpoints: ", adopted.status().ToString()));
  } else if (*adopted > 0) {
    LogInfo(absl::StrCat(job.id, ": ", *adopted,
                         " recorded checkpoint(s) from before the checkpoint ledger now come "
                         "under retention"));
  }
}

void CheckpointRecords::ForgetVanished(const std::string& job_id, int64_t written_step) {
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job_id);
  if (!recorded.ok()) return;
  for (const CheckpointRecord& checkpoint : *recorded) {
    std::error_code ec;
    if (checkpoint.step == written_step || fs::exists(checkpoint.dir, ec)) continue;
    absl::Status status = store_->DeleteCheckpoint(job_id, checkpoint.step);
    if (!status.ok()) {
      LogWarning(absl::StrCat(job_id, ": forgetting ", checkpoint.dir, ": ", status.ToString()));
    }
  }
}

absl::Status CheckpointRecords::VerifyAgainstRecord(const CheckpointRecord& record,
                                                    const engine::CheckpointInfo& found) {
  if (found.step != record.step) {
    return absl::DataLossError(absl::StrCat(record.dir, "/state.json: step ", found.step,
                                            ", but it was recorded as step ", record.step));
  }
  const bool legacy = record.manifest_xxh64 == 0;  // recorded before schema version 3
  if (found.job_id.empty() ? !legacy : found.job_id != record.job_id) {
    return absl::DataLossError(absl::StrCat(record.dir, "/state.json: names job '", found.job_id,
                                            "', but job ", record.job_id,
                                            " wrote this checkpoint; it was replaced since"));
  }
  if (!legacy && found.manifest_xxh64 != record.manifest_xxh64) {
    return absl::DataLossError(absl::StrFormat(
        "%s/manifest.json: XXH64 %016x, but %016x was recorded when job %s wrote it; it was "
        "replaced since",
        record.dir, found.manifest_xxh64, record.manifest_xxh64, record.job_id));
  }
  return absl::OkStatus();
}

std::string CheckpointRecords::Quarantine(const JobRecord& job, const CheckpointRecord& record,
                                          const absl::Status& why, std::vector<JobEvent>* events) {
  std::string moved_to;
  std::error_code ec;
  if (fs::exists(record.dir, ec)) {
    const fs::path dir(record.dir);
    fs::path target = dir.parent_path() / absl::StrCat("quarantined-", dir.filename().string());
    if (fs::exists(target, ec)) target += absl::StrCat(".", NowUnixMs());
    fs::rename(dir, target, ec);
    moved_to = ec ? absl::StrCat("could not be moved aside (", ec.message(), ")")
                  : absl::StrCat("quarantined as ", target.string());
  } else {
    moved_to = "is gone";
  }
  const std::string message = absl::StrCat("checkpoint ", CheckpointId(job.id, record.step),
                                           " failed verification at resume (", why.message(),
                                           "); it ", moved_to, " and is no longer listed");
  LogWarning(absl::StrCat(job.id, ": ", message));
  absl::Status forgotten = store_->DeleteCheckpoint(job.id, record.step);
  if (!forgotten.ok()) LogError(absl::StrCat(job.id, ": ", forgotten.ToString()));
  events->push_back(JobEvent::StateChange(job.id, job.state, message));
  return absl::StrCat(record.dir, ": ", why.message(), " (", moved_to, ")");
}

ResumeSelection CheckpointRecords::SelectResume(const JobRecord& job) {
  ResumeSelection selection;
  if (job.resume_from.empty()) return selection;
  absl::StatusOr<std::vector<CheckpointRecord>> recorded = store_->ListCheckpoints(job.id);
  if (!recorded.ok()) {
    selection.dir = recorded.status();
    return selection;
  }
  // Newest first, from the one the job was to resume from downwards.
  int64_t max_step = INT64_MAX;
  for (const CheckpointRecord& record : *recorded) {
    if (record.dir == job.resume_from) max_step = record.step;
  }
  std::vector<std::string> failures;
  for (auto it = recorded->rbegin(); it != recorded->rend(); ++it) {
    if (it->step > max_step) continue;
    absl::StatusOr<engine::CheckpointInfo> found =
        backend_->VerifyCheckpoint(it->dir, /*check_data=*/true);
    absl::Status verified = found.ok() ? VerifyAgainstRecord(*it, *found) : found.status();
    if (verified.ok()) {
      if (!failures.empty()) {
        const std::string message = absl::StrCat("resuming from the newest intact checkpoint ",
                                                 CheckpointId(job.id, it->step));
        selection.events.push_back(JobEvent::StateChange(job.id, job.state, message));
        LogInfo(absl::StrCat(job.id, ": ", message));
      }
      selection.dir = it->dir;
      return selection;
    }
    failures.push_back(Quarantine(job, *it, verified, &selection.events));
  }
  selection.dir = absl::DataLossError(
      failures.empty()
          ? absl::StrCat("job ", job.id, ": resume_from '", job.resume_from,
                         "' is not a checkpoint recorded for this job and it has no other; "
                         "refusing to resume from an unrecorded directory")
          : absl::StrCat("job ", job.id,
                         ": no intact checkpoint to resume from: ", absl::StrJoin(failures, "; ")));
  return selection;
}

}  // namespace megatrain::server
