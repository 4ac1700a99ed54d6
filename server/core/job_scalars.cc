// See job_scalars.h.
#include "server/core/job_scalars.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/fs/dir_fd.h"
#include "server/core/logging.h"
#include "server/core/tfevents.h"

namespace megatrain::server {
namespace {

constexpr char kStepsHeader[] =
    "step,time_unix_ms,loss,grad_norm,lr,tokens_per_s,mfu,step_seconds,skipped\n";
constexpr char kEvalsHeader[] = "step,time_unix_ms,eval_loss\n";

// Opens `name` in `dir` for appending (Note [Directory descriptors]: no
// link followed, a FIFO never blocks, regular files with no other hard
// link only); `exclusive`
// refuses an existing one. Writes `header` into a new, empty file.
absl::StatusOr<int> OpenAppend(const engine::DirFd& dir, const std::string& name, bool exclusive,
                               absl::string_view header) {
  const std::string path = absl::StrCat(dir.path(), "/", name);
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC |
                    (exclusive ? O_EXCL : 0);
  const int fd = ::openat(dir.fd(), name.c_str(), flags, 0644);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": a symbolic link; not followed"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": open"));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  // A hard link planted there could make the daemon append to a file its
  // user may not write.
  if (info.st_nlink != 1) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": has ", info.st_nlink, " hard links; not written"));
  }
  if (info.st_size == 0 && !header.empty() &&
      ::write(fd, header.data(), header.size()) != static_cast<ssize_t>(header.size())) {
    const int write_errno = errno;
    ::close(fd);
    return absl::ErrnoToStatus(write_errno, absl::StrCat(path, ": write"));
  }
  return fd;
}

// Nine significant digits: every float (what TensorBoard keeps) reads back
// exactly, and a CSV row stays short.
std::string Number(double value) { return absl::StrFormat("%.9g", value); }

}  // namespace

absl::StatusOr<std::unique_ptr<JobScalarWriter>> JobScalarWriter::Open(
    const std::string& output_dir, int64_t now_unix_ms) {
  absl::StatusOr<engine::DirFd> dir =
      engine::DirFd::OpenBeneath(output_dir, kDir, engine::DirFd::Create::kYes);
  if (!dir.ok()) return dir.status();
  std::vector<int> fds;
  auto close_all = [&fds] {
    for (int fd : fds) ::close(fd);
  };
  const std::string event_file = absl::StrFormat("events.out.tfevents.%d.megatraind.%03d",
                                                 now_unix_ms / 1000, now_unix_ms % 1000);
  const std::pair<std::string, absl::string_view> files[] = {
      {kStepsCsv, kStepsHeader}, {kEvalsCsv, kEvalsHeader}, {event_file, ""}};
  for (const auto& [name, header] : files) {
    absl::StatusOr<int> fd = OpenAppend(*dir, name, /*exclusive=*/name == event_file, header);
    if (!fd.ok()) {
      close_all();
      return fd.status();
    }
    fds.push_back(*fd);
  }
  std::unique_ptr<JobScalarWriter> writer(new JobScalarWriter(dir->path(), fds[0], fds[1], fds[2]));
  writer->Write(writer->events_fd_, TfRecord(FileVersionEvent(now_unix_ms / 1000.0)));
  return writer;
}

JobScalarWriter::~JobScalarWriter() {
  for (int fd : {steps_fd_, evals_fd_, events_fd_}) ::close(fd);
}

void JobScalarWriter::AddStep(const JobEvent& event) {
  Write(steps_fd_,
        absl::StrCat(event.step, ",", event.time_unix_ms, ",", Number(event.loss), ",",
                     Number(event.grad_norm), ",", Number(event.lr), ",",
                     Number(event.tokens_per_s), ",", event.mfu > 0 ? Number(event.mfu) : "", ",",
                     Number(event.step_seconds), ",", event.skipped ? 1 : 0, "\n"));
  std::vector<std::pair<std::string, float>> scalars = {
      {"train/grad_norm", static_cast<float>(event.grad_norm)},
      {"train/learning_rate", static_cast<float>(event.lr)},
      {"train/tokens_per_s", static_cast<float>(event.tokens_per_s)}};
  if (!event.skipped)
    scalars.insert(scalars.begin(), {"train/loss", static_cast<float>(event.loss)});
  Write(events_fd_, TfRecord(ScalarsEvent(event.time_unix_ms / 1000.0, event.step, scalars)));
}

void JobScalarWriter::AddEval(const JobEvent& event) {
  Write(evals_fd_,
        absl::StrCat(event.step, ",", event.time_unix_ms, ",", Number(event.eval_loss), "\n"));
  Write(events_fd_, TfRecord(ScalarsEvent(event.time_unix_ms / 1000.0, event.step,
                                          {{"eval/loss", static_cast<float>(event.eval_loss)}})));
}

void JobScalarWriter::Write(int fd, absl::string_view bytes) {
  while (!failed_ && !bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      failed_ = true;
      LogError(absl::StrCat(
          dir_, ": writing the job's curves: ", absl::ErrnoToStatus(errno, "write").ToString(),
          "; no more rows are written"));
      return;
    }
    bytes.remove_prefix(static_cast<size_t>(written));
  }
}

}  // namespace megatrain::server
