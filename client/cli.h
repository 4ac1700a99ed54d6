// The `megatrain` command line (docs/api.md, "CLI"): subcommands submit,
// list, get, watch, cancel, suspend, resume, checkpoint, checkpoints, export,
// delete-checkpoint, status, metrics, audit, hash-token. Global flags (--server,
// --token, --json, --timeout, --tls*) may stand before or after the
// subcommand; MEGATRAIN_SERVER and MEGATRAIN_TOKEN supply --server and
// --token.
//
// Exit codes: 0 success; 1 the server (or connection) returned an error,
// printed as "megatrain: CODE: message"; 2 bad usage or bad input (a flag,
// a job file that does not load, or INVALID_ARGUMENT from the daemon); 3 the
// job ended in a state other than SUCCEEDED (submit --wait, watch).
// `megatrain tokenize ...` (main.cc) runs the local megatrain-tokenize tool;
// `megatrain --version` prints the version.
//
// Thread-safety: RunCli may run concurrently with itself (no globals) except
// that it reads the environment.
#ifndef MEGATRAIN_CLIENT_CLI_H_
#define MEGATRAIN_CLIENT_CLI_H_

#include <ostream>

namespace megatrain::client {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;  // also bad input (INVALID_ARGUMENT)
inline constexpr int kExitJobNotSucceeded = 3;

// The version of this build (CMake's PROJECT_VERSION), as `--version` prints.
const char* Version();

// Runs one command. `argv[0]` is the program name. Output goes to `out`,
// errors and progress notes to `err`. `interactive` (stdout is a terminal)
// turns the watch output into one live progress line.
int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
           bool interactive);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_CLI_H_
