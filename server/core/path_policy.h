// PathPolicy: where jobs may read and write on the daemon's machine.
//
// The daemon opens every path of a job spec (model.hf_dir, data.tokens,
// data.eval_tokens, data.text, data.tokenizer) and writes output_dir and
// export directories with its own file-system permissions, on behalf of
// users who may have no account on the machine. --data_roots and
// --output_roots confine those paths to directories the operator chose.
//
// Note [Path checks]
// A path must be absolute and may not contain a ".." component
// (INVALID_ARGUMENT naming the field). When the policy restricts the kind
// (read or write), the path is resolved like the kernel would: the deepest
// ancestor that exists is resolved with realpath(3) (following every
// symbolic link), the components below it, which do not exist yet, are
// appended unchanged. A component that is a dangling symbolic link is
// refused (writing through it would create its target anywhere). The
// resolved path must equal a root or lie below one (roots are resolved with
// realpath(3) at start-up too); otherwise PERMISSION_DENIED naming the field,
// the path, what it resolves to and the roots. So a symbolic link inside a
// root that points outside it is refused.
//
// Checks run at submission and again when a job starts (JobManager); the
// window after them, in which a user with write access inside a root could
// swap a checked file or directory for a symbolic link, is closed by
// opening every input below its root at use time (ConfineJobReads; Note
// [Confined reads] in engine/fs/dir_fd.h). The files the daemon
// itself creates, renames and deletes in a job's output directory go
// through a descriptor of that directory without following symbolic links
// (engine/fs/dir_fd.h, Note [Directory descriptors]). Run the daemon as a
// dedicated user (deploy/megatraind.service) so that its own permissions
// bound what a race could reach.
//
// Note [Per-user data roots]
// A data root may contain the placeholder "{user}" (for example
// "/srv/data/{user}"): for a job of user U it grants "/srv/data/U" only, so
// users cannot train on each other's data. The placeholder is replaced only
// by a plain user name (letters, digits, '.', '_', '-'; not "." or "..");
// for any other name the root grants nothing. A refusal names the root as
// written ("{user}"), never another user's directory, and is decided before
// any file is examined, so it reveals neither the size nor the kind of a
// file in another user's root.
//
// Note [Input preflight]
// Before the job manager takes its lock, PreflightJobInputs examines every
// input with stat(2) (which never opens the file, so a FIFO or a device node
// cannot block it or feel it) and reads model.hf_dir's config.json through
// a non-blocking open whose descriptor is fstat'ed to be a regular file of
// at most kMaxHfConfigBytes. A FIFO, socket or device node given as an
// input fails that submission with INVALID_ARGUMENT naming the field and
// the path; the engine then sizes the model from the text read here, never
// opening config.json itself at submission.
//
// Example:
//   MEGATRAIN_ASSIGN_OR_RETURN(PathPolicy policy,
//                              PathPolicy::Create({"/srv/data"}, {"/srv/out"}));
//   MEGATRAIN_RETURN_IF_ERROR(policy.CheckJobSpec(spec));
//   MEGATRAIN_RETURN_IF_ERROR(policy.CheckWrite("out_dir", out_dir));
//
// Thread-safety: immutable after creation; all methods may be called
// concurrently. They read the file system (realpath, lstat) but never
// change it; none may be called under a lock other callers wait on (they
// can take as long as the file system does).
#ifndef MEGATRAIN_SERVER_PATH_POLICY_H_
#define MEGATRAIN_SERVER_PATH_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/fs/dir_fd.h"
#include "engine/job/training_job.h"

namespace megatrain::server {

class PathPolicy {
 public:
  // A policy with the given roots, each an absolute path to an existing
  // directory (stored resolved with realpath). An empty list leaves that
  // kind unrestricted (any absolute path without ".."). A data root may
  // contain "{user}" (Note [Per-user data roots]): it is kept as written,
  // and the directory before the placeholder must exist. INVALID_ARGUMENT
  // naming `data_flag` / `output_flag` for a relative root or "{user}" in
  // an output root; NOT_FOUND for a root that does not exist;
  // FAILED_PRECONDITION for one that is not a directory.
  static absl::StatusOr<PathPolicy> Create(const std::vector<std::string>& data_roots,
                                           const std::vector<std::string>& output_roots,
                                           absl::string_view data_flag = "--data_roots",
                                           absl::string_view output_flag = "--output_roots");
  // No roots: every absolute path without ".." is allowed.
  static PathPolicy Unrestricted() { return PathPolicy({}, {}, {}); }

  // May a job of `user` read `path` (a file or directory)? OK for an empty
  // path (the field is unset). INVALID_ARGUMENT for a relative path or a
  // ".." component; PERMISSION_DENIED when it resolves outside every data
  // root of `user` (Note [Path checks], Note [Per-user data roots]; an
  // empty `user` gets no "{user}" root); messages start with `field`.
  absl::Status CheckRead(absl::string_view field, absl::string_view path,
                         absl::string_view user = "") const;
  // May a job or export write `path` (it may not exist yet)? As CheckRead,
  // against the output roots; a dangling symbolic link on the way is
  // PERMISSION_DENIED.
  absl::Status CheckWrite(absl::string_view field, absl::string_view path) const;

  // INVALID_ARGUMENT naming `field` when `path` is an output root itself
  // (lexically, or resolved as CheckWrite resolves it): a job's output_dir
  // is exclusive to that job, so one equal to a root would claim every
  // other job's directory below it. OK without output roots.
  absl::Status CheckNotOutputRoot(absl::string_view field, absl::string_view path) const;
  // Checks every path of `spec` for a job of `user`: model.hf_dir,
  // data.tokens, data.eval_tokens, data.text and data.tokenizer are read;
  // output_dir is written. The first refusal is returned.
  absl::Status CheckJobSpec(const engine::JobSpec& spec, absl::string_view user = "") const;

  // Note [Confined reads] in engine/fs/dir_fd.h, at a job's start (after
  // CheckJobSpec): rewrites the input paths of `spec` (model.hf_dir,
  // data.*) to their resolved form (ResolvePathBeneath) and returns the
  // confinement the engine reads them under: the data roots of `user`
  // (links inside them that stay inside followed; "/" when reads are
  // unrestricted) and spec->output_dir (no links), each held open from now
  // on. Errors of ResolvePathBeneath and ReadConfinement::Create (naming
  // the field or the root).
  absl::StatusOr<engine::ReadConfinement> ConfineJobReads(engine::JobSpec* spec,
                                                          absl::string_view user) const;

  // Every root as refusals name it: resolved roots, then (data) the
  // "{user}" roots as written; empty when that kind is unrestricted.
  const std::vector<std::string>& data_roots() const { return shown_data_roots_; }
  const std::vector<std::string>& output_roots() const { return output_roots_; }
  // Data roots containing "{user}", as written.
  const std::vector<std::string>& user_data_roots() const { return user_data_roots_; }

 private:
  PathPolicy(std::vector<std::string> data_roots, std::vector<std::string> user_data_roots,
             std::vector<std::string> output_roots)
      : data_roots_(std::move(data_roots)),
        user_data_roots_(std::move(user_data_roots)),
        output_roots_(std::move(output_roots)) {
    shown_data_roots_ = data_roots_;
    shown_data_roots_.insert(shown_data_roots_.end(), user_data_roots_.begin(),
                             user_data_roots_.end());
  }

  std::vector<std::string> data_roots_;  // resolved, without a placeholder
  std::vector<std::string> shown_data_roots_;
  std::vector<std::string> user_data_roots_;
  std::vector<std::string> output_roots_;
};

// Largest config.json PreflightJobInputs reads, in bytes. HF configs are a
// few KiB (the largest, with quantization or per-layer maps, well under
// 1 MiB); the cap bounds what one submission makes the daemon read.
inline constexpr int64_t kMaxHfConfigBytes = int64_t{4} << 20;

// What PreflightJobInputs read.
struct JobInputs {
  // model.hf_dir's config.json; unset when the spec names a preset.
  std::optional<std::string> hf_config_json;
};

// Note [Input preflight]: examines the inputs of `spec` (after the path
// policy allowed them). An input that does not exist yet is left to
// CheckSubmission (Note [Submit checks] in submit_checks.h, which refuses
// it), except
// model.hf_dir's config.json, which sizes the job now. INVALID_ARGUMENT
// naming the field and the path for a FIFO, socket or device node, a
// model.hf_dir that is not a directory or a config.json that is not a
// regular file or is larger than kMaxHfConfigBytes, or a missing
// model.hf_dir or config.json (the field is wrong); PERMISSION_DENIED
// when it cannot be read. Never blocks on a FIFO or opens a device; may
// block as long as a hung file system does.
absl::StatusOr<JobInputs> PreflightJobInputs(const engine::JobSpec& spec);

// Splits a comma-separated flag value into paths, trimming blanks and
// dropping empty entries: " /a, /b ,," -> {"/a", "/b"}.
std::vector<std::string> SplitPathList(absl::string_view list);

// Resolves absolute `path` (no ".." components; the caller checks) as Note
// [Path checks] describes: realpath of the deepest existing ancestor plus
// the components below it. PERMISSION_DENIED naming `field` for a dangling
// symbolic link on the way or an ancestor that cannot be resolved (EACCES,
// ELOOP, ...).
absl::StatusOr<std::string> ResolvePathBeneath(absl::string_view field, const std::string& path);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_PATH_POLICY_H_
