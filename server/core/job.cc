// See job.h.
#include "server/core/job.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace megatrain::server {

absl::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSuspending:
      return "SUSPENDING";
    case JobState::kSuspended:
      return "SUSPENDED";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

std::optional<JobState> ParseJobState(absl::string_view name) {
  for (JobState state : kAllJobStates) {
    if (absl::EqualsIgnoreCase(name, JobStateName(state))) return state;
  }
  return std::nullopt;
}

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

namespace {

bool IsLabelKeyChar(char c) {
  return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_' || c == '.' || c == '-' ||
         c == '/';
}

}  // namespace

absl::Status ValidateJobRequest(const JobRequest& request) {
  if (request.priority < kMinPriority || request.priority > kMaxPriority) {
    return absl::InvalidArgumentError(absl::StrCat("priority: must be in [", kMinPriority, ", ",
                                                   kMaxPriority, "], got ", request.priority));
  }
  if (request.labels.size() > static_cast<size_t>(kMaxLabels)) {
    return absl::InvalidArgumentError(
        absl::StrCat("labels: at most ", kMaxLabels, " labels, got ", request.labels.size()));
  }
  for (const auto& [key, value] : request.labels) {
    if (key.empty() || key.size() > kMaxLabelKeyLength) {
      return absl::InvalidArgumentError(absl::StrCat("labels: key '", key, "' must have 1 to ",
                                                     kMaxLabelKeyLength, " characters"));
    }
    for (char c : key) {
      if (!IsLabelKeyChar(c)) {
        return absl::InvalidArgumentError(
            absl::StrCat("labels: key '", key, "' may contain only a-z, 0-9, '_', '.', '-', '/'"));
      }
    }
    if (value.size() > kMaxLabelValueLength) {
      return absl::InvalidArgumentError(absl::StrCat("labels.", key, ": value must have at most ",
                                                     kMaxLabelValueLength, " characters, got ",
                                                     value.size()));
    }
  }
  return absl::OkStatus();
}

JobEvent JobEvent::StateChange(std::string job_id, JobState state, std::string message) {
  JobEvent event;
  event.job_id = std::move(job_id);
  event.time_unix_ms = NowUnixMs();
  event.kind = Kind::kStateChange;
  event.state = state;
  event.message = std::move(message);
  return event;
}

std::string CheckpointId(absl::string_view job_id, int64_t step) {
  return absl::StrCat(job_id, "/step-", step);
}

absl::StatusOr<std::pair<std::string, int64_t>> ParseCheckpointId(absl::string_view checkpoint_id) {
  const size_t slash = checkpoint_id.rfind('/');
  int64_t step = 0;
  if (slash == absl::string_view::npos || slash == 0 ||
      !absl::StartsWith(checkpoint_id.substr(slash + 1), "step-") ||
      !absl::SimpleAtoi(checkpoint_id.substr(slash + 6), &step) || step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_id: expected '<job id>/step-<step>', got '", checkpoint_id, "'"));
  }
  return std::make_pair(std::string(checkpoint_id.substr(0, slash)), step);
}

std::string JobIdForSeq(int64_t seq) { return absl::StrFormat("job-%06d", seq); }

int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace megatrain::server
