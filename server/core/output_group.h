// Sharing job outputs with a lab's Unix group (megatraind --output_group).
//
// By default the daemon's state directory is 0700: checkpoints and exports
// under <state_dir>/jobs are readable by the daemon's user only. A lab that
// wants its members to read (not write) them names a group: the state
// directory becomes 0710 (the group may pass through, not list it; the
// database and lock files stay 0600), <state_dir>/jobs 02750 with that
// group (setgid, so every job directory, checkpoint and export created
// below inherits the group), and the daemon's umask 027 (directories 0750,
// files 0640 unless written with an explicit mode: the engine writes
// checkpoint files 0644, which the 0710/02750 directories above still
// keep from other users).
#ifndef MEGATRAIN_SERVER_CORE_OUTPUT_GROUP_H_
#define MEGATRAIN_SERVER_CORE_OUTPUT_GROUP_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::server {

// The gid of group `name` (a name, or a number). INVALID_ARGUMENT naming
// --output_group when there is no such group.
absl::StatusOr<gid_t> ResolveOutputGroup(const std::string& name);

// Applies the modes above to `state_dir` and `jobs_dir` (both exist) for
// group `gid`, and sets the process umask to 027. The daemon's user must
// be a member of the group (or root): FAILED_PRECONDITION naming the
// directory and errno otherwise. Not thread-safe (umask is per process):
// call once at start-up, before any job runs.
absl::Status ShareOutputsWithGroup(const std::string& state_dir, const std::string& jobs_dir,
                                   gid_t gid);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_OUTPUT_GROUP_H_
