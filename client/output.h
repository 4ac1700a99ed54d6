// What the CLI prints: JSON objects for --json (nlohmann-json; enum values as
// short names, e.g. "state": "SUCCEEDED") and human tables/lines otherwise.
//
// JSON shapes (stable, used by scripts):
//   job:         {"id", "name", "owner", "state", "priority", "labels",
//                 "request_id", "create_time_unix_ms", "start_time_unix_ms",
//                 "end_time_unix_ms", "progress": {"step", "max_steps",
//                 "loss", "eval_loss" (null before the first eval),
//                 "tokens_per_s", "mfu", "tokens", "eta_seconds"}, "device",
//                 "host_memory_bytes", "error_code", "error_message" (FAILED
//                 only), "status_message" (the latest note, any state),
//                 "resume_from", "queue_position", "spec": {job.proto JSON}}
//   job list:    {"jobs": [job...], "next_page_token"}
//   checkpoint:  {"id", "job_id", "step", "dir", "bytes",
//                 "create_time_unix_ms", "write_seconds"}
//   checkpoints: {"checkpoints": [checkpoint...]}
//   event:       {"seq", "job_id", "time_unix_ms", "kind": "state" | "step" |
//                 "eval" | "checkpoint", ...fields of that kind}
//   audit:       {"records": [{"seq", "time" (UTC ISO 8601), "time_unix_ms",
//                 "user", "role", "peer", "method", "target", "job_id",
//                 "code" ("OK", "PERMISSION_DENIED", ...), "message",
//                 "detail"}...], "next_page_token"}
//
// Escaping: every string the daemon sends (job names, labels, owners, paths,
// messages, audit rows) may come from another user; the human forms print
// it through Printable, so that a name holding "\n", a terminal escape
// sequence (7- or 8-bit) or a right-to-left override cannot forge lines,
// drive the reader's terminal or reorder what it shows. JSON output
// is escaped by the JSON encoder.
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_CLIENT_OUTPUT_H_
#define MEGATRAIN_CLIENT_OUTPUT_H_

#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"
#include "common/escape.h"

#include "megatrain/v1/checkpoint.pb.h"
#include "megatrain/v1/job.pb.h"
#include "megatrain/v1/server.pb.h"

namespace megatrain::client {

// `text` made safe for a terminal: ASCII control characters (0x00-0x1f,
// 0x7f, ESC included) as \n, \r, \t or \xNN (EscapeControlCharacters,
// common/escape.h); the C1 controls U+0080-U+009F (U+009B is an 8-bit CSI)
// and the bidirectional controls (U+061C, U+200E, U+200F, U+202A-U+202E,
// U+2066-U+2069: U+202E reverses what follows) as \uXXXX; bytes that are
// not UTF-8 (a lone 0x9B is a CSI on an 8-bit terminal) as \xNN. Other
// UTF-8 text is kept.
std::string Printable(absl::string_view text);

// "QUEUED", "RUNNING", ... ("UNSPECIFIED" for 0).
std::string StateName(v1::JobState state);
// Parses "queued", "RUNNING", ... (case-insensitive); false if unknown.
bool ParseStateName(const std::string& name, v1::JobState* state);
// SUCCEEDED, FAILED, CANCELLED.
bool IsTerminalState(v1::JobState state);

nlohmann::json JobToJson(const v1::Job& job);
nlohmann::json CheckpointToJson(const v1::Checkpoint& checkpoint);
nlohmann::json EventToJson(const v1::JobEvent& event);
nlohmann::json StatusToJson(const v1::ServerStatus& status);
nlohmann::json AuditRecordToJson(const v1::AuditRecord& record);

// Human forms.
std::string JobTable(const v1::ListJobsResponse& jobs);
std::string JobDetails(const v1::Job& job);
std::string CheckpointTable(const v1::ListCheckpointsResponse& checkpoints);
std::string StatusText(const v1::ServerStatus& status);
// Audit records, one line each, times in UTC.
std::string AuditTable(const v1::ListAuditRecordsResponse& records);
// One line for a non-step event ("job-000001 RUNNING: started on cpu").
std::string EventLine(const v1::JobEvent& event);
// The live progress line of a step:
// "job-000001 step 20/60  loss 3.2107  12,345 tok/s  ETA 0:40".
std::string ProgressLine(const std::string& job_id, const v1::JobEvent::Step& step,
                         const std::string& eval_loss);

// "1.50 GiB", "12.0 MiB", "512 B".
std::string HumanBytes(int64_t bytes);
// "1:02:03" / "2:03"; "?" for <= 0.
std::string HumanDuration(double seconds);

}  // namespace megatrain::client

#endif  // MEGATRAIN_CLIENT_OUTPUT_H_
