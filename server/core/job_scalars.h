// JobScalarWriter: a job's training curves as files in its output_dir, so
// that a user can plot them without a metrics stack (`megatrain plot`,
// TensorBoard, a spreadsheet):
//
//   <output_dir>/metrics/steps.csv   step,time_unix_ms,loss,grad_norm,lr,
//                                    tokens_per_s,mfu,step_seconds,skipped
//                                    (one row per step event; mfu empty
//                                    where unknown, e.g. on the CPU)
//   <output_dir>/metrics/evals.csv   step,time_unix_ms,eval_loss
//   <output_dir>/metrics/events.out.tfevents.<seconds>.megatraind.<ms>
//                                    TensorBoard scalars train/loss,
//                                    train/grad_norm, train/learning_rate,
//                                    train/tokens_per_s, eval/loss
//                                    (Note [Event file format] in tfevents.h)
//
// A resumed job appends to the CSV files (the steps after its checkpoint
// appear again, as they are trained again) and starts a new event file
// (TensorBoard drops the steps a restart rewinds over). Rows are bounded
// by the job's steps (about 100 bytes each in CSV, 150 in the event file).
//
// The daemon writes with its own permissions into a directory its user
// may also write, so (Note [Directory descriptors] in engine/fs/dir_fd.h)
// `metrics/` is reached from output_dir through descriptors without
// following a symbolic link, and its files are opened O_NOFOLLOW |
// O_NONBLOCK and must be regular files without another hard link.
//
// Thread-safety: not synchronised; the job's thread (its JobObserver) is
// the only caller. Writes never fail the job: after the first failed write
// (a full disk) the writer logs it once and writes nothing more.
#ifndef MEGATRAIN_SERVER_CORE_JOB_SCALARS_H_
#define MEGATRAIN_SERVER_CORE_JOB_SCALARS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/job.h"

namespace megatrain::server {

class JobScalarWriter {
 public:
  // Subdirectory of output_dir the files go to, and their names.
  static constexpr char kDir[] = "metrics";
  static constexpr char kStepsCsv[] = "steps.csv";
  static constexpr char kEvalsCsv[] = "evals.csv";

  // Opens (creating) `output_dir`/metrics and its files; `now_unix_ms`
  // names the event file. Errors: FAILED_PRECONDITION when a symbolic link,
  // a non-regular file or a file with another hard link is in the way;
  // others from the file system, naming the path.
  static absl::StatusOr<std::unique_ptr<JobScalarWriter>> Open(const std::string& output_dir,
                                                               int64_t now_unix_ms);

  JobScalarWriter(const JobScalarWriter&) = delete;
  JobScalarWriter& operator=(const JobScalarWriter&) = delete;
  // Closes the files (errors ignored).
  ~JobScalarWriter();

  // Appends a step event (JobEvent::Kind::kStep) / an eval event (kEval).
  void AddStep(const JobEvent& event);
  void AddEval(const JobEvent& event);

 private:
  JobScalarWriter(std::string dir, int steps_fd, int evals_fd, int events_fd)
      : dir_(std::move(dir)), steps_fd_(steps_fd), evals_fd_(evals_fd), events_fd_(events_fd) {}
  // Writes all of `bytes` to `fd`; on failure logs and stops all writing.
  void Write(int fd, absl::string_view bytes);

  std::string dir_;  // for messages
  int steps_fd_;
  int evals_fd_;
  int events_fd_;
  bool failed_ = false;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_JOB_SCALARS_H_
