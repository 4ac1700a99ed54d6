// HeldOutputDir: a job's output_dir opened once, at job start, and reached
// through that descriptor for the whole run.
//
// Note [Held output directory]
// A job's checkpoints, their ledger and retention's deletes all happen in
// <output_dir>/checkpoints. Resolving output_dir's path again for every
// checkpoint let a user who can write a parent of it swap that parent for a
// symbolic link mid-run and send the job's later checkpoints (and its
// retention's deletes) outside the output roots or into another job's
// directory. So the daemon, when a job starts:
//   1. opens the output root the directory lies in (an --output_roots entry
//      or the jobs directory: the operator's, opened by path) and walks
//      from that descriptor to output_dir one component at a time with
//      O_NOFOLLOW, creating what is missing (DirFd::OpenChild): a symbolic
//      link anywhere below the root fails the start (FAILED_PRECONDITION
//      naming the path);
//   2. re-checks output_dir's exclusivity against the other jobs (the path
//      it walked is the directory's real place: nothing was followed);
//   3. holds both descriptors and makes them the job thread's
//      (ScopedHeldOutputDir) while the job is built and runs.
// WriteCheckpoint and AdoptRecordedCheckpoints reach output_dir through
// OpenOutputSubdir, which on such a thread (and for that path) first
// re-walks the path from the root's descriptor without following links and
// compares the directory it reaches with the held one (device and inode):
// if a directory on the way was moved or replaced by a link, the checkpoint
// fails with FAILED_PRECONDITION ("output_dir ... no longer leads to the
// job's directory") and nothing is written or deleted anywhere; otherwise
// everything below goes through the held descriptor (dir_fd.h).
// Retention deletes only the names the directory's own ledger records
// (Note [Checkpoint ledger] in checkpoint.cc), inside the held directory.
// Where no root contains output_dir (a daemon without output roots, which
// trusts its single user) the directory is opened by path once and held.
//
// Thread-safety: a HeldOutputDir is immutable after Open and may be used
// from any thread; ScopedHeldOutputDir installs it for the calling thread
// only.
#ifndef MEGATRAIN_ENGINE_FS_HELD_OUTPUT_DIR_H_
#define MEGATRAIN_ENGINE_FS_HELD_OUTPUT_DIR_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/fs/dir_fd.h"

namespace megatrain::engine {

class HeldOutputDir {
 public:
  // Step 1 of Note [Held output directory]: `output_dir` (absolute, no
  // "..") below the longest of `roots` that contains it lexically, walked
  // from that root's descriptor and created as needed; with no such root,
  // created and opened by path. FAILED_PRECONDITION naming the component
  // when a symbolic link or non-directory is on the way below the root;
  // INVALID_ARGUMENT for a relative path or a ".." component; others from
  // errno (dir_fd.h).
  // With DirFd::Create::kNo nothing is created (NOT_FOUND when missing):
  // the daemon's check that a path still leads, without links, to the
  // directory it names before it deletes there (DeleteCheckpoint).
  static absl::StatusOr<HeldOutputDir> Open(const std::string& output_dir,
                                            const std::vector<std::string>& roots,
                                            DirFd::Create create = DirFd::Create::kYes);

  HeldOutputDir(HeldOutputDir&&) noexcept = default;
  HeldOutputDir& operator=(HeldOutputDir&&) noexcept = default;

  // OK when walking the path from the root's descriptor again (no links
  // followed) reaches the held directory; FAILED_PRECONDITION naming the
  // path otherwise (moved, removed or replaced on the way). Always OK for
  // a directory held without a root.
  absl::Status Verify() const;

  // The held directory (path() is output_dir as given).
  const DirFd& dir() const { return dir_; }
  const std::string& path() const { return dir_.path(); }
  // Device and inode of the held directory: two jobs with equal identities
  // share a directory whatever their paths say.
  dev_t device() const { return device_; }
  ino_t inode() const { return inode_; }

 private:
  HeldOutputDir(std::optional<DirFd> root, std::string relative, DirFd dir, dev_t device,
                ino_t inode)
      : root_(std::move(root)),
        relative_(std::move(relative)),
        dir_(std::move(dir)),
        device_(device),
        inode_(inode) {}

  std::optional<DirFd> root_;  // unset: held without a root
  std::string relative_;       // output_dir below root_ ("" when it is the root)
  DirFd dir_;
  dev_t device_ = 0;
  ino_t inode_ = 0;
};

// Makes `held` the calling thread's output directory until destroyed (then
// the previous one is restored). `held` must outlive the scope.
class ScopedHeldOutputDir {
 public:
  explicit ScopedHeldOutputDir(const HeldOutputDir* held);
  ~ScopedHeldOutputDir();
  ScopedHeldOutputDir(const ScopedHeldOutputDir&) = delete;
  ScopedHeldOutputDir& operator=(const ScopedHeldOutputDir&) = delete;

 private:
  const HeldOutputDir* previous_;
};

// Opens `relative` (a '/'-separated path of plain components) below
// `output_dir`, creating it with Create::kYes. On a thread holding
// `output_dir` (ScopedHeldOutputDir; paths compared lexically) it is
// verified first (HeldOutputDir::Verify) and opened below the held
// descriptor; elsewhere (a standalone run, a tool) `output_dir` is created
// and `relative` opened below it by DirFd::OpenBeneath. Errors of Verify,
// OpenChild and OpenBeneath.
absl::StatusOr<DirFd> OpenOutputSubdir(const std::string& output_dir, absl::string_view relative,
                                       DirFd::Create create);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_FS_HELD_OUTPUT_DIR_H_
