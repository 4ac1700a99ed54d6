// See output.h.
#include "client/output.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace megatrain::client {

using nlohmann::json;

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  if (absl::StartsWith(name, "JOB_STATE_")) name = name.substr(10);
  return name.empty() ? "UNKNOWN" : name;
}

bool ParseStateName(const std::string& name, v1::JobState* state) {
  return v1::JobState_Parse(absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(name)), state) &&
         *state != v1::JOB_STATE_UNSPECIFIED;
}

namespace {

// Length of the UTF-8 sequence starting at text[pos] and its code point,
// or 0 when the bytes there are not well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, at most U+10FFFF).
size_t DecodeUtf8(absl::string_view text, size_t pos, char32_t* code_point) {
  const auto byte = [&](size_t idx) { return static_cast<unsigned char>(text[idx]); };
  const unsigned char lead = byte(pos);
  size_t length = 0;
  char32_t value = 0;
  char32_t min_value = 0;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2, value = lead & 0x1f, min_value = 0x80;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3, value = lead & 0x0f, min_value = 0x800;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4, value = lead & 0x07, min_value = 0x10000;
  } else {
    return 0;
  }
  if (pos + length > text.size()) return 0;
  for (size_t idx = 1; idx < length; ++idx) {
    if ((byte(pos + idx) & 0xc0) != 0x80) return 0;
    value = (value << 6) | (byte(pos + idx) & 0x3f);
  }
  if (value < min_value || value > 0x10ffff || (value >= 0xd800 && value <= 0xdfff)) return 0;
  *code_point = value;
  return length;
}

// C1 controls and the bidirectional formatting characters (Unicode UAX #9).
bool IsUnsafeCodePoint(char32_t c) {
  return (c >= 0x80 && c <= 0x9f) || c == 0x061c || c == 0x200e || c == 0x200f ||
         (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

}  // namespace

std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const unsigned char lead = static_cast<unsigned char>(text[pos]);
    if (lead < 0x80) {
      out.append(EscapeControlCharacters(text.substr(pos, 1)));
      ++pos;
      continue;
    }
    char32_t code_point = 0;
    const size_t length = DecodeUtf8(text, pos, &code_point);
    if (length == 0) {
      absl::StrAppend(&out, "\\x", absl::Hex(lead, absl::kZeroPad2));
      ++pos;
    } else if (IsUnsafeCodePoint(code_point)) {
      absl::StrAppend(&out, "\\u", absl::Hex(static_cast<uint32_t>(code_point), absl::kZeroPad4));
      pos += length;
    } else {
      out.append(text.data() + pos, length);
      pos += length;
    }
  }
  return out;
}

bool IsTerminalState(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

json JobToJson(const v1::Job& job) {
  json progress = {{"step", job.progress().step()},
                   {"max_steps", job.progress().max_steps()},
                   {"loss", job.progress().loss()},
                   {"eval_loss", nullptr},
                   {"tokens_per_s", job.progress().tokens_per_s()},
                   {"tokens", job.progress().tokens()},
                   {"eta_seconds", job.progress().eta_seconds()}};
  if (job.progress().has_mfu()) progress["mfu"] = job.progress().mfu();  // absent: unknown
  if (job.progress().has_eval_loss()) progress["eval_loss"] = job.progress().eval_loss();
  std::string spec_text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  json spec = json::object();
  if (google::protobuf::util::MessageToJsonString(job.spec(), &spec_text, options).ok()) {
    spec = json::parse(spec_text, nullptr, /*allow_exceptions=*/false);
  }
  json labels = json::object();
  for (const auto& [key, value] : job.spec().labels()) labels[key] = value;
  return {{"id", job.id()},
          {"name", job.spec().name()},
          {"owner", job.owner()},
          {"state", StateName(job.state())},
          {"priority", job.spec().priority()},
          {"labels", labels},
          {"request_id", job.request_id()},
          {"create_time_unix_ms", job.create_time_unix_ms()},
          {"start_time_unix_ms", job.start_time_unix_ms()},
          {"end_time_unix_ms", job.end_time_unix_ms()},
          {"progress", progress},
          {"device", job.device()},
          {"host_memory_bytes", job.host_memory_bytes()},
          {"error_code", job.error_code()},
          {"error_message", job.error_message()},
          {"status_message", job.status_message()},
          {"resume_from", job.resume_from()},
          {"queue_position", job.queue_position()},
          {"spec", spec}};
}

json CheckpointToJson(const v1::Checkpoint& checkpoint) {
  return {{"id", checkpoint.id()},
          {"job_id", checkpoint.job_id()},
          {"step", checkpoint.step()},
          {"dir", checkpoint.dir()},
          {"bytes", checkpoint.bytes()},
          {"create_time_unix_ms", checkpoint.create_time_unix_ms()},
          {"write_seconds", checkpoint.write_seconds()}};
}

json EventToJson(const v1::JobEvent& event) {
  json j = {
      {"seq", event.seq()}, {"job_id", event.job_id()}, {"time_unix_ms", event.time_unix_ms()}};
  switch (event.kind_case()) {
    case v1::JobEvent::kStateChange:
      j["kind"] = "state";
      j["state"] = StateName(event.state_change().state());
      j["message"] = event.state_change().message();
      break;
    case v1::JobEvent::kStep: {
      const v1::JobEvent::Step& step = event.step();
      j["kind"] = "step";
      j["step"] = step.step();
      j["max_steps"] = step.max_steps();
      j["loss"] = step.loss();
      j["grad_norm"] = step.grad_norm();
      j["lr"] = step.lr();
      j["tokens_per_s"] = step.tokens_per_s();
      if (step.has_mfu()) j["mfu"] = step.mfu();  // absent: unknown (CPU)
      j["skipped"] = step.skipped();
      j["step_seconds"] = step.step_seconds();
      j["eta_seconds"] = step.eta_seconds();
      if (step.aux_loss() != 0) j["aux_loss"] = step.aux_loss();
      if (step.devices() > 1) {  // data parallel: tokens_per_s is the job's total
        j["devices"] = step.devices();
        j["device_tokens_per_s"] = step.device_tokens_per_s();
      }
      if (step.nvme_written_bytes() > 0 || step.nvme_read_bytes() > 0) {
        j["nvme_read_bytes"] = step.nvme_read_bytes();
        j["nvme_written_bytes"] = step.nvme_written_bytes();
      }
      break;
    }
    case v1::JobEvent::kEval:
      j["kind"] = "eval";
      j["step"] = event.eval().step();
      j["eval_loss"] = event.eval().eval_loss();
      break;
    case v1::JobEvent::kCheckpoint:
      j["kind"] = "checkpoint";
      j["checkpoint_id"] = event.checkpoint().checkpoint_id();
      j["step"] = event.checkpoint().step();
      j["dir"] = event.checkpoint().dir();
      j["seconds"] = event.checkpoint().seconds();
      break;
    default:
      j["kind"] = "unknown";
      break;
  }
  return j;
}

json StatusToJson(const v1::ServerStatus& status) {
  json devices = json::array();
  for (const v1::Device& device : status.devices()) {
    devices.push_back({{"name", device.name()},
                       {"job_id", device.job_id()},
                       {"description", device.description()},
                       {"pcie_h2d_bytes_per_second", device.pcie_h2d_bytes_per_second()},
                       {"pcie_d2h_bytes_per_second", device.pcie_d2h_bytes_per_second()},
                       {"memory_total_bytes", device.memory_total_bytes()},
                       {"memory_used_bytes", device.memory_used_bytes()}});
  }
  const v1::QueueStatus& queue = status.queue();
  return {{"version", status.version()},
          {"start_time_unix_ms", status.start_time_unix_ms()},
          {"devices", devices},
          {"host_memory",
           {{"budget_bytes", status.host_memory().budget_bytes()},
            {"reserved_bytes", status.host_memory().reserved_bytes()},
            {"physical_bytes", status.host_memory().physical_bytes()}}},
          {"queue",
           {{"queued", queue.queued()},
            {"running", queue.running()},
            {"suspending", queue.suspending()},
            {"suspended", queue.suspended()},
            {"succeeded", queue.succeeded()},
            {"failed", queue.failed()},
            {"cancelled", queue.cancelled()}}},
          {"draining", status.draining()},
          {"auth_enabled", status.auth_enabled()},
          {"preemption_enabled", status.preemption_enabled()},
          {"caller", status.caller()},
          {"caller_role", status.caller_role()}};
}

namespace {

// Left-aligned columns separated by two spaces; every cell through
// Printable.
std::string Table(std::vector<std::vector<std::string>> rows) {
  for (auto& row : rows) {
    for (std::string& cell : row) cell = Printable(cell);
  }
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t col_idx = 0; col_idx < row.size(); ++col_idx) {
      widths[col_idx] = std::max(widths[col_idx], row[col_idx].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t col_idx = 0; col_idx < row.size(); ++col_idx) {
      absl::StrAppend(&line, row[col_idx]);
      if (col_idx + 1 < row.size()) line.append(widths[col_idx] - row[col_idx].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string FormatTime(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::LocalTimeZone());
}

// 12345.6 -> "12,346".
std::string Thousands(double value) {
  std::string digits = absl::StrFormat("%.0f", value);
  std::string out;
  const size_t start = (!digits.empty() && digits[0] == '-') ? 1 : 0;
  for (size_t idx = 0; idx < digits.size(); ++idx) {
    if (idx > start && (digits.size() - idx) % 3 == 0) out.push_back(',');
    out.push_back(digits[idx]);
  }
  return out;
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  const double value = static_cast<double>(bytes);
  if (value >= 1024.0 * 1024 * 1024 * 1024)
    return absl::StrFormat("%.2f TiB", value / (1024.0 * 1024 * 1024 * 1024));
  if (value >= 1024.0 * 1024 * 1024)
    return absl::StrFormat("%.2f GiB", value / (1024.0 * 1024 * 1024));
  if (value >= 1024.0 * 1024) return absl::StrFormat("%.1f MiB", value / (1024.0 * 1024));
  if (value >= 1024.0) return absl::StrFormat("%.1f KiB", value / 1024.0);
  return absl::StrCat(bytes, " B");
}

std::string HumanDuration(double seconds) {
  if (seconds <= 0) return "?";
  const int64_t total = static_cast<int64_t>(seconds + 0.5);
  if (total >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", total / 3600, (total / 60) % 60, total % 60);
  }
  return absl::StrFormat("%d:%02d", total / 60, total % 60);
}

std::string JobTable(const v1::ListJobsResponse& jobs) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "OWNER", "STATE", "PRIORITY", "STEP", "LOSS", "DEVICE", "SUBMITTED"}};
  for (const v1::Job& job : jobs.jobs()) {
    rows.push_back(
        {job.id(), job.spec().name(), job.owner(), StateName(job.state()),
         absl::StrCat(job.spec().priority()),
         absl::StrCat(job.progress().step(), "/", job.progress().max_steps()),
         job.progress().step() > 0 ? absl::StrFormat("%.4f", job.progress().loss()) : "-",
         job.device().empty() ? "-" : job.device(), FormatTime(job.create_time_unix_ms())});
  }
  std::string out = Table(rows);
  if (!jobs.next_page_token().empty()) {
    absl::StrAppend(&out, "(more: --page_token ", Printable(jobs.next_page_token()), ")\n");
  }
  return out;
}

std::string JobDetails(const v1::Job& job) {
  std::vector<std::vector<std::string>> rows = {
      {"id:", job.id()},
      {"name:", job.spec().name()},
      {"owner:", job.owner()},
      {"state:", StateName(job.state())},
      {"priority:", absl::StrCat(job.spec().priority())},
      {"step:", absl::StrCat(job.progress().step(), "/", job.progress().max_steps())},
  };
  if (job.progress().step() > 0) {
    rows.push_back({"loss:", absl::StrFormat("%.4f", job.progress().loss())});
    rows.push_back({"tokens/s:", Thousands(job.progress().tokens_per_s())});
    // MFU is 0 where it does not apply (a CPU device: no bf16 peak).
    rows.push_back({"MFU:", job.progress().mfu() > 0
                                ? absl::StrFormat("%.1f%%", 100 * job.progress().mfu())
                                : std::string("n/a (no bf16 peak known: CPU or unknown GPU)")});
  }
  if (job.progress().has_eval_loss()) {
    rows.push_back({"eval loss:", absl::StrFormat("%.4f", job.progress().eval_loss())});
  }
  if (job.state() == v1::JOB_STATE_RUNNING && job.progress().eta_seconds() > 0) {
    rows.push_back({"ETA:", HumanDuration(job.progress().eta_seconds())});
  }
  if (job.queue_position() > 0)
    rows.push_back({"queue position:", absl::StrCat(job.queue_position())});
  if (!job.device().empty()) rows.push_back({"device:", job.device()});
  rows.push_back({"host memory:", HumanBytes(job.host_memory_bytes())});
  rows.push_back({"submitted:", FormatTime(job.create_time_unix_ms())});
  rows.push_back({"started:", FormatTime(job.start_time_unix_ms())});
  rows.push_back({"ended:", FormatTime(job.end_time_unix_ms())});
  rows.push_back({"output dir:", job.spec().output_dir()});
  if (!job.spec().memory().nvme_tier().empty()) {
    rows.push_back({"NVMe tier:", job.spec().memory().nvme_tier()});  // resolved at submission
  }
  if (const v1::InitFrom& init = job.spec().model().init_from(); !init.checkpoint().empty()) {
    rows.push_back(
        {"init from:", absl::StrCat(init.checkpoint(), " (optimizer ",
                                    init.optimizer().empty() ? "fresh" : init.optimizer(), ")")});
  }
  if (!job.resume_from().empty()) rows.push_back({"resume from:", job.resume_from()});
  if (!job.error_code().empty()) rows.push_back({"error:", job.error_code()});
  if (!job.status_message().empty()) rows.push_back({"message:", job.status_message()});
  return Table(rows);
}

std::string CheckpointTable(const v1::ListCheckpointsResponse& checkpoints) {
  std::vector<std::vector<std::string>> rows = {{"ID", "STEP", "SIZE", "WRITTEN", "DIR"}};
  for (const v1::Checkpoint& checkpoint : checkpoints.checkpoints()) {
    rows.push_back({checkpoint.id(), absl::StrCat(checkpoint.step()),
                    HumanBytes(checkpoint.bytes()), FormatTime(checkpoint.create_time_unix_ms()),
                    checkpoint.dir()});
  }
  return Table(rows);
}

json AuditRecordToJson(const v1::AuditRecord& record) {
  return {
      {"seq", record.seq()},
      {"time", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(record.time_unix_ms()),
                                absl::UTCTimeZone())},
      {"time_unix_ms", record.time_unix_ms()},
      {"user", record.user()},
      {"role", record.role()},
      {"peer", record.peer()},
      {"method", record.method()},
      {"target", record.target()},
      {"job_id", record.job_id()},
      {"code", record.code()},
      {"message", record.message()},
      {"detail", record.detail()}};
}

std::string AuditTable(const v1::ListAuditRecordsResponse& records) {
  std::vector<std::vector<std::string>> rows = {
      {"TIME (UTC)", "USER", "METHOD", "TARGET", "CODE", "MESSAGE"}};
  for (const v1::AuditRecord& record : records.records()) {
    std::string message = record.message();
    // One line per record: the first line of the message, cut at 80.
    message = message.substr(0, message.find('\n'));
    if (message.size() > 80) message = message.substr(0, 77) + "...";
    rows.push_back(
        {absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(record.time_unix_ms()),
                          absl::UTCTimeZone()),
         record.user().empty() ? "-" : record.user(), record.method(),
         record.target().empty() ? "-" : record.target(), record.code(), message});
  }
  return Table(rows);
}

std::string StatusText(const v1::ServerStatus& status) {
  std::string out = absl::StrCat("megatraind ", Printable(status.version()), " (since ",
                                 FormatTime(status.start_time_unix_ms()), ")",
                                 status.draining() ? ", DRAINING" : "", "\n");
  absl::StrAppend(&out, "caller: ", Printable(status.caller()), " (",
                  Printable(status.caller_role()), "), auth ", status.auth_enabled() ? "on" : "off",
                  ", preemption ", status.preemption_enabled() ? "on" : "off", "\n");
  const v1::HostMemory& memory = status.host_memory();
  absl::StrAppend(&out, "host memory: ", HumanBytes(memory.reserved_bytes()), " reserved of ",
                  HumanBytes(memory.budget_bytes()), " budget (",
                  HumanBytes(memory.physical_bytes()), " physical)\n");
  const v1::QueueStatus& queue = status.queue();
  absl::StrAppend(&out, "jobs: ", queue.queued(), " queued, ", queue.running(), " running, ",
                  queue.suspending() + queue.suspended(), " suspended, ", queue.succeeded(),
                  " succeeded, ", queue.failed(), " failed, ", queue.cancelled(), " cancelled\n");
  std::vector<std::vector<std::string>> rows = {{"DEVICE", "JOB", "H2D", "D2H", "MEMORY", "NAME"}};
  for (const v1::Device& device : status.devices()) {
    auto rate = [](double bytes_per_second) {
      return bytes_per_second > 0 ? absl::StrFormat("%.1f GB/s", bytes_per_second / 1e9)
                                  : std::string("-");
    };
    rows.push_back({device.name(), device.job_id().empty() ? "-" : device.job_id(),
                    rate(device.pcie_h2d_bytes_per_second()),
                    rate(device.pcie_d2h_bytes_per_second()),
                    device.memory_total_bytes() > 0
                        ? absl::StrCat(HumanBytes(device.memory_used_bytes()), " / ",
                                       HumanBytes(device.memory_total_bytes()))
                        : "-",
                    device.description().empty() ? "-" : device.description()});
  }
  absl::StrAppend(&out, Table(rows));
  return out;
}

namespace {

// EventLine before escaping.
std::string RawEventLine(const v1::JobEvent& event) {
  switch (event.kind_case()) {
    case v1::JobEvent::kStateChange:
      return absl::StrCat(event.job_id(), " ", StateName(event.state_change().state()), ": ",
                          event.state_change().message());
    case v1::JobEvent::kEval:
      return absl::StrFormat("%s step %d: eval loss %.4f", event.job_id(), event.eval().step(),
                             event.eval().eval_loss());
    case v1::JobEvent::kCheckpoint:
      return absl::StrFormat("%s step %d: checkpoint %s written in %.1f s (%s)", event.job_id(),
                             event.checkpoint().step(), event.checkpoint().checkpoint_id(),
                             event.checkpoint().seconds(), event.checkpoint().dir());
    case v1::JobEvent::kStep:
      return ProgressLine(event.job_id(), event.step(), "");
    default:
      return absl::StrCat(event.job_id(), ": unknown event");
  }
}

}  // namespace

std::string EventLine(const v1::JobEvent& event) { return Printable(RawEventLine(event)); }

std::string ProgressLine(const std::string& job_id, const v1::JobEvent::Step& step,
                         const std::string& eval_loss) {
  std::string line = absl::StrFormat("%s step %d/%d  loss %.4f", job_id, step.step(),
                                     step.max_steps(), step.loss());
  if (!eval_loss.empty()) absl::StrAppend(&line, "  eval ", eval_loss);
  if (step.aux_loss() != 0) absl::StrAppend(&line, absl::StrFormat("  aux %.4f", step.aux_loss()));
  absl::StrAppend(&line, "  ", Thousands(step.tokens_per_s()), " tok/s");
  if (step.devices() > 1) {  // data parallel: the job's total, then each device's
    absl::StrAppend(&line, " (", step.devices(), " devices, ",
                    Thousands(step.device_tokens_per_s()), " each)");
  }
  if (step.mfu() > 0) absl::StrAppend(&line, absl::StrFormat("  MFU %.1f%%", 100 * step.mfu()));
  absl::StrAppend(&line, "  ETA ", HumanDuration(step.eta_seconds()));
  if (step.skipped()) absl::StrAppend(&line, "  (skipped: non-finite loss)");
  return Printable(line);
}

}  // namespace megatrain::client
