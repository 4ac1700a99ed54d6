// The `megatrain` command line (docs/api.md, "CLI"): subcommands submit,
// list, get, watch, cancel, suspend, resume, checkpoint, checkpoints, export,
// delete-checkpoint, status, metrics, audit, hash-token. Global flags (--server,
// --token, --json, --timeout, --tls*) may stand before or after the
// subcommand; MEGATRAIN_SERVER and MEGATRAIN_TOKEN supply --server and
// --token.
//
// Exit codes (docs/api.md, "Exit codes"): 0 success; 2 bad usage or bad
// input (a flag, a job file that does not load, or INVALID_ARGUMENT from the
// daemon); 3 the job ended in a state other than SUCCEEDED (submit --wait,
// watch); otherwise one code per gRPC code of the error, printed as
// "megatrain: CODE: message" (ExitCodeFor: 1 UNAVAILABLE, 4 NOT_FOUND, ...).
// `megatrain tokenize ...` (main.cc) runs the local megatrain-tokenize tool;
// `megatrain --version` prints the version.
//
// Thread-safety: RunCli may run concurrently with itself (no globals) except
// that it reads the environment.
#ifndef MEGATRAIN_CLIENT_CLI_H_
#define MEGATRAIN_CLIENT_CLI_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace megatrain::client {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // UNAVAILABLE: no daemon answered, or it is draining
inline constexpr int kExitUsage = 2;  // also bad input (INVALID_ARGUMENT)
inline constexpr int kExitJobNotSucceeded = 3;

// The exit code of an error with `code`, one per gRPC code: OK 0,
// UNAVAILABLE 1, INVALID_ARGUMENT 2, NOT_FOUND 4, ALREADY_EXISTS 5,
// PERMISSION_DENIED 6, UNAUTHENTICATED 7, RESOURCE_EXHAUSTED 8,
// FAILED_PRECONDITION 9, UNIMPLEMENTED 10, DATA_LOSS 11, DEADLINE_EXCEEDED
// 12, INTERNAL 13, ABORTED 14, CANCELLED 15, OUT_OF_RANGE 16, UNKNOWN 17.
int ExitCodeFor(absl::StatusCode code);

// The version of this build (CMake's PROJECT_VERSION), as `--version` prints.
const char* Version();

// Runs one command. `argv[0]` is the program name. Output goes to `out`,
// errors and progress notes to `err`. `interactive` (stdout is a terminal)
// turns the watch output into one live progress line.
int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
           bool interactive);

// The arguments to hand to megatrain-tokenize when argv's subcommand is
// `tokenize`, after any global flags (`megatrain --server H:P tokenize
// a.jsonl ...`: they are accepted and unused, tokenizing needs no daemon):
// every argument after the word `tokenize`, unparsed. nullopt when the
// subcommand is another one or argv does not parse (RunCli then reports it).
std::optional<std::vector<std::string>> TokenizeArguments(int argc, const char* const* argv);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_CLI_H_
