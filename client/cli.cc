// See cli.h.
#include "client/cli.h"

#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "client/job_file.h"
#include "client/output.h"
#include "client/plan_command.h"
#include "client/plot.h"

namespace megatrain::client {

#ifndef MEGATRAIN_VERSION
#error "MEGATRAIN_VERSION must be defined by the build (client/CMakeLists.txt)"
#endif
const char* Version() { return MEGATRAIN_VERSION; }

namespace {

// Whether an UNAVAILABLE message is gRPC's "could not connect" (no daemon
// listening, or a wrong address) rather than a daemon that is draining.
bool IsConnectFailure(absl::string_view message) {
  return absl::StrContains(message, "failed to connect") ||
         absl::StrContains(message, "Connection refused") ||
         absl::StrContains(message, "DNS resolution failed") ||
         absl::StrContains(message, "Socket closed");
}

using nlohmann::json;

// `submit --init_from CHECKPOINT [--optimizer fresh|restore]`: the job
// file's model.init_from given on the command line (docs/api.md, "CLI").
// INVALID_ARGUMENT naming the flag for --optimizer alone, or --init_from
// when the file has model.init_from too.
absl::Status ApplyInitFromFlags(const std::string& init_from, const std::string& optimizer,
                                v1::JobSpec* spec) {
  if (init_from.empty()) {
    if (optimizer.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError("--optimizer: only with --init_from (the checkpoint)");
  }
  const std::string& in_file = spec->model().init_from().checkpoint();
  if (!in_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--init_from: the job file has model.init_from (", in_file,
                     ") already; give it in one place"));
  }
  v1::InitFrom* init = spec->mutable_model()->mutable_init_from();
  init->set_checkpoint(init_from);
  init->set_optimizer(optimizer);
  return absl::OkStatus();
}

// Default per-RPC timeouts when --timeout is not given.
constexpr absl::Duration kDefaultTimeout = absl::Seconds(30);
constexpr absl::Duration kCheckpointTimeout = absl::Minutes(30);
// WatchJob reconnects after a lost connection (daemon restart) this many
// times in a row before giving up.
constexpr int kMaxReconnects = 20;

// A random idempotency key: retries of one `megatrain submit` never create
// two jobs.
std::string RandomRequestId() {
  std::random_device random;
  std::string bytes(16, '\0');
  for (char& byte : bytes) byte = static_cast<char>(random() & 0xff);
  return absl::StrCat("cli-", absl::BytesToHexString(bytes));
}

class Cli {
 public:
  Cli(std::ostream& out, std::ostream& err, bool interactive, bool json, absl::Duration timeout,
      std::string server, std::unique_ptr<Connection> connection)
      : out_(out),
        err_(err),
        interactive_(interactive),
        json_(json),
        timeout_(timeout),
        server_(std::move(server)),
        connection_(std::move(connection)) {}

  // Prints `status` as "megatrain: CODE: message"; returns the exit code of
  // its code (ExitCodeFor: kExitUsage for INVALID_ARGUMENT, here or from
  // the daemon). A daemon that does not answer gets a hint naming
  // the address tried and how to start or point at one.
  int Fail(const absl::Status& status) {
    err_ << "megatrain: " << absl::StatusCodeToString(status.code()) << ": "
         << Printable(status.message()) << "\n";
    if (absl::IsUnavailable(status) && IsConnectFailure(status.message())) {
      err_ << "megatrain: no megatraind answered at " << Printable(server_)
           << ". Start one (`megatraind --state_dir=DIR --listen=" << Printable(server_)
           << "`, or `systemctl start megatraind`; docs/operations.md), or point --server or "
              "MEGATRAIN_SERVER at a running one.\n";
    }
    return ExitCodeFor(status.code());
  }

  // A job file that cannot be loaded is bad input, whatever the code.
  int FailInput(const absl::Status& status) {
    Fail(status);
    return kExitUsage;
  }

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration fallback = kDefaultTimeout) {
    return connection_->NewContext(timeout_ != absl::ZeroDuration() ? timeout_ : fallback);
  }

  // `init_from`, `optimizer`: ApplyInitFromFlags'.
  int Submit(const std::string& file, bool wait, std::string request_id,
             const std::string& init_from, const std::string& optimizer) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobFile(file);
    if (!spec.ok()) return FailInput(spec.status());
    absl::Status flags = ApplyInitFromFlags(init_from, optimizer, &*spec);
    if (!flags.ok()) return FailInput(flags);
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *std::move(spec);
    request.set_request_id(request_id.empty() ? RandomRequestId() : request_id);
    v1::Job job;
    absl::Status status =
        FromGrpcStatus(connection_->jobs().SubmitJob(Context().get(), request, &job));
    if (!status.ok()) return Fail(status);
    if (!wait) {
      if (json_) {
        out_ << JobToJson(job).dump(2) << "\n";
      } else {
        out_ << "submitted " << job.id() << " (" << StateName(job.state());
        if (job.queue_position() > 0) out_ << ", queue position " << job.queue_position();
        out_ << ")\n";
      }
      return kExitOk;
    }
    if (!json_) out_ << "submitted " << job.id() << "\n" << std::flush;
    return WaitAndReport(job.id(), /*print_events=*/!json_);
  }

  int Watch(const std::string& job_id) { return WaitAndReport(job_id, /*print_events=*/true); }

  int List(const std::vector<std::string>& states, const std::string& owner, int page_size,
           const std::string& page_token, bool all) {
    v1::ListJobsRequest request;
    for (const std::string& name : states) {
      v1::JobState state;
      if (!ParseStateName(name, &state)) {
        err_ << "megatrain: --state: unknown state '" << name
             << "' (queued, running, suspending, suspended, succeeded, failed, cancelled)\n";
        return kExitUsage;
      }
      request.add_states(state);
    }
    request.set_owner(owner);
    request.set_page_size(page_size);
    request.set_page_token(page_token);
    v1::ListJobsResponse all_jobs;
    // --all: follow next_page_token to the end (each page is one RPC).
    while (true) {
      v1::ListJobsResponse page;
      absl::Status status =
          FromGrpcStatus(connection_->jobs().ListJobs(Context().get(), request, &page));
      if (!status.ok()) return Fail(status);
      for (v1::Job& job : *page.mutable_jobs()) *all_jobs.add_jobs() = std::move(job);
      all_jobs.set_next_page_token(page.next_page_token());
      if (!all || page.next_page_token().empty()) break;
      request.set_page_token(page.next_page_token());
    }
    if (json_) {
      json jobs = json::array();
      for (const v1::Job& job : all_jobs.jobs()) jobs.push_back(JobToJson(job));
      out_ << json{{"jobs", jobs}, {"next_page_token", all_jobs.next_page_token()}}.dump(2) << "\n";
    } else {
      out_ << JobTable(all_jobs);
    }
    return kExitOk;
  }

  int Get(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    absl::Status status =
        FromGrpcStatus(connection_->jobs().GetJob(Context().get(), request, &job));
    if (!status.ok()) return Fail(status);
    out_ << (json_ ? JobToJson(job).dump(2) + "\n" : JobDetails(job));
    return kExitOk;
  }

  // cancel / suspend / resume; `force` for cancel only.
  int Control(const std::string& verb, const std::string& job_id, bool force = false) {
    v1::Job job;
    grpc::Status grpc_status;
    auto context = Context();
    if (verb == "cancel") {
      v1::CancelJobRequest request;
      request.set_job_id(job_id);
      request.set_force(force);
      grpc_status = connection_->jobs().CancelJob(context.get(), request, &job);
    } else if (verb == "suspend") {
      v1::SuspendJobRequest request;
      request.set_job_id(job_id);
      grpc_status = connection_->jobs().SuspendJob(context.get(), request, &job);
    } else {
      v1::ResumeJobRequest request;
      request.set_job_id(job_id);
      grpc_status = connection_->jobs().ResumeJob(context.get(), request, &job);
    }
    absl::Status status = FromGrpcStatus(grpc_status);
    if (!status.ok()) return Fail(status);
    if (json_) {
      out_ << JobToJson(job).dump(2) << "\n";
    } else {
      out_ << job.id() << ": " << StateName(job.state());
      if (!job.status_message().empty()) out_ << " (" << Printable(job.status_message()) << ")";
      out_ << "\n";
    }
    return kExitOk;
  }

  int CreateCheckpoint(const std::string& job_id) {
    v1::CreateCheckpointRequest request;
    request.set_job_id(job_id);
    v1::Checkpoint checkpoint;
    // The daemon refuses a job that is not RUNNING at once
    // (FAILED_PRECONDITION); a running one answers at its next step.
    absl::Status status = FromGrpcStatus(connection_->checkpoints().CreateCheckpoint(
        Context(kCheckpointTimeout).get(), request, &checkpoint));
    if (!status.ok()) return Fail(status);
    if (json_) {
      out_ << CheckpointToJson(checkpoint).dump(2) << "\n";
    } else {
      out_ << Printable(checkpoint.id()) << " written to " << Printable(checkpoint.dir()) << "\n";
    }
    return kExitOk;
  }

  int Checkpoints(const std::string& job_id) {
    v1::ListCheckpointsRequest request;
    request.set_job_id(job_id);
    v1::ListCheckpointsResponse response;
    absl::Status status = FromGrpcStatus(
        connection_->checkpoints().ListCheckpoints(Context().get(), request, &response));
    if (!status.ok()) return Fail(status);
    if (json_) {
      json checkpoints = json::array();
      for (const v1::Checkpoint& checkpoint : response.checkpoints()) {
        checkpoints.push_back(CheckpointToJson(checkpoint));
      }
      out_ << json{{"checkpoints", checkpoints}}.dump(2) << "\n";
    } else {
      out_ << CheckpointTable(response);
    }
    return kExitOk;
  }

  int Export(const std::string& checkpoint_id, const std::string& out_dir,
             const std::string& dtype) {
    v1::ExportCheckpointRequest request;
    request.set_checkpoint_id(checkpoint_id);
    // Relative to the caller's working directory (the daemon is local).
    request.set_out_dir(std::filesystem::absolute(out_dir).lexically_normal().string());
    request.set_dtype(dtype);
    v1::ExportCheckpointResponse response;
    // No deadline by default: exporting a large model takes minutes.
    absl::Status status = FromGrpcStatus(connection_->checkpoints().ExportCheckpoint(
        Context(absl::InfiniteDuration()).get(), request, &response));
    if (!status.ok()) return Fail(status);
    const std::vector<std::string> copied(response.copied_files().begin(),
                                          response.copied_files().end());
    const std::vector<std::string> skipped(response.skipped_files().begin(),
                                           response.skipped_files().end());
    if (json_) {
      out_ << json{{"checkpoint_id", checkpoint_id},
                   {"out_dir", response.out_dir()},
                   {"copied_files", copied},
                   {"skipped_files", skipped}}
                  .dump(2)
           << "\n";
    } else {
      out_ << "exported " << Printable(checkpoint_id) << " to " << Printable(response.out_dir())
           << "\n";
      if (!copied.empty())
        out_ << "copied from model.hf_dir: " << Printable(absl::StrJoin(copied, ", ")) << "\n";
      for (const std::string& note : skipped) out_ << "not copied: " << Printable(note) << "\n";
    }
    return kExitOk;
  }

  int DeleteCheckpoint(const std::string& checkpoint_id) {
    v1::DeleteCheckpointRequest request;
    request.set_checkpoint_id(checkpoint_id);
    v1::DeleteCheckpointResponse response;
    absl::Status status = FromGrpcStatus(
        connection_->checkpoints().DeleteCheckpoint(Context().get(), request, &response));
    if (!status.ok()) return Fail(status);
    if (json_) {
      out_ << json{{"deleted", checkpoint_id}}.dump(2) << "\n";
    } else {
      out_ << "deleted " << checkpoint_id << "\n";
    }
    return kExitOk;
  }

  int Status() {
    v1::ServerStatus status_message;
    absl::Status status = FromGrpcStatus(connection_->server().GetServerStatus(
        Context().get(), v1::GetServerStatusRequest(), &status_message));
    if (!status.ok()) return Fail(status);
    out_ << (json_ ? StatusToJson(status_message).dump(2) + "\n" : StatusText(status_message));
    return kExitOk;
  }

  // The audit log (admins): one page, or every page with `all`.
  int Audit(const std::string& user, const std::string& job_id, const std::string& method,
            int page_size, const std::string& page_token, bool all) {
    v1::ListAuditRecordsRequest request;
    request.set_user(user);
    request.set_job_id(job_id);
    request.set_method(method);
    request.set_page_size(page_size);
    request.set_page_token(page_token);
    v1::ListAuditRecordsResponse records;
    while (true) {
      v1::ListAuditRecordsResponse page;
      absl::Status status =
          FromGrpcStatus(connection_->server().ListAuditRecords(Context().get(), request, &page));
      if (!status.ok()) return Fail(status);
      for (v1::AuditRecord& record : *page.mutable_records()) {
        *records.add_records() = std::move(record);
      }
      records.set_next_page_token(page.next_page_token());
      if (!all || page.next_page_token().empty()) break;
      request.set_page_token(page.next_page_token());
    }
    if (json_) {
      json list = json::array();
      for (const v1::AuditRecord& record : records.records()) {
        list.push_back(AuditRecordToJson(record));
      }
      out_ << json{{"records", list}, {"next_page_token", records.next_page_token()}}.dump(2)
           << "\n";
    } else {
      out_ << AuditTable(records);
      if (!records.next_page_token().empty()) {
        out_ << "(more: --page_token " << records.next_page_token() << ", or --all)\n";
      }
    }
    return kExitOk;
  }

  int Metrics(const std::string& prefix) {
    v1::GetMetricsRequest request;
    request.set_name_prefix(prefix);
    v1::GetMetricsResponse response;
    absl::Status status =
        FromGrpcStatus(connection_->server().GetMetrics(Context().get(), request, &response));
    if (!status.ok()) return Fail(status);
    if (!json_) {
      out_ << response.text();
      return kExitOk;
    }
    json families = json::array();
    for (const v1::MetricFamily& family : response.families()) {
      json samples = json::array();
      for (const v1::MetricSample& sample : family.samples()) {
        json labels = json::object();
        for (const auto& [key, value] : sample.labels()) labels[key] = value;
        samples.push_back({{"name", sample.name()}, {"labels", labels}, {"value", sample.value()}});
      }
      families.push_back({{"name", family.name()},
                          {"help", family.help()},
                          {"type", family.type()},
                          {"samples", samples}});
    }
    out_ << json{{"families", families}}.dump(2) << "\n";
    return kExitOk;
  }

 private:
  // Follows the job to its end, then prints the final job. Exit code 0 only
  // for SUCCEEDED.
  int WaitAndReport(const std::string& job_id, bool print_events) {
    absl::StatusOr<v1::Job> job = Follow(job_id, print_events);
    if (!job.ok()) return Fail(job.status());
    if (json_ && !print_events) {
      out_ << JobToJson(*job).dump(2) << "\n";
    } else if (!json_) {
      out_ << job->id() << " ended " << StateName(job->state());
      if (!job->status_message().empty()) out_ << ": " << Printable(job->status_message());
      out_ << "\n";
    }
    if (job->state() != v1::JOB_STATE_SUCCEEDED) {
      err_ << "megatrain: job " << job->id() << " ended " << StateName(job->state());
      if (!job->error_code().empty()) err_ << " (" << job->error_code() << ")";
      err_ << "\n";
      return kExitJobNotSucceeded;
    }
    return kExitOk;
  }

  // Streams WatchJob until the job is terminal, reconnecting (with the last
  // seq seen) when the daemon goes away; returns the final job.
  absl::StatusOr<v1::Job> Follow(const std::string& job_id, bool print_events) {
    int64_t after_seq = 0;
    int reconnects = 0;
    bool line_open = false;  // a live progress line is on screen
    std::string eval_loss;
    absl::Time last_step_line = absl::InfinitePast();
    while (true) {
      auto context = connection_->NewContext(absl::InfiniteDuration());
      // After a lost connection, wait for the daemon to come back.
      if (reconnects > 0) context->set_wait_for_ready(true);
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      request.set_after_seq(after_seq);
      std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
          connection_->jobs().WatchJob(context.get(), request);
      v1::JobEvent event;
      while (reader->Read(&event)) {
        after_seq = event.seq();
        reconnects = 0;
        if (!print_events) continue;
        if (json_) {
          out_ << EventToJson(event).dump() << "\n" << std::flush;
          continue;
        }
        if (event.kind_case() == v1::JobEvent::kEval) {
          eval_loss = absl::StrFormat("%.4f", event.eval().eval_loss());
        }
        if (event.kind_case() == v1::JobEvent::kStep) {
          const std::string line = ProgressLine(job_id, event.step(), eval_loss);
          if (interactive_) {
            out_ << "\r\033[K" << line << std::flush;
            line_open = true;
          } else if (absl::Now() - last_step_line >= absl::Seconds(1) ||
                     event.step().step() >= event.step().max_steps()) {
            // Logs and pipes: at most one progress line per second.
            out_ << line << "\n" << std::flush;
            last_step_line = absl::Now();
          }
          continue;
        }
        if (line_open) {
          out_ << "\n";
          line_open = false;
        }
        out_ << EventLine(event) << "\n" << std::flush;
      }
      absl::Status status = FromGrpcStatus(reader->Finish());
      if (line_open) {
        out_ << "\n";
        line_open = false;
      }
      if (status.ok()) break;
      if (!absl::IsUnavailable(status) || reconnects >= kMaxReconnects) return status;
      ++reconnects;
      err_ << "megatrain: connection lost (" << Printable(status.message()) << "); reconnecting ("
           << reconnects << "/" << kMaxReconnects << ")\n";
      // Back off: the daemon may be draining (UNAVAILABLE while still up).
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200 << reconnects, 5000)));
    }
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    absl::Status status =
        FromGrpcStatus(connection_->jobs().GetJob(Context().get(), request, &job));
    if (!status.ok()) return status;
    return job;
  }

  std::ostream& out_;
  std::ostream& err_;
  const bool interactive_;
  const bool json_;
  const absl::Duration timeout_;  // zero: per-command defaults
  const std::string server_;      // the address dialled, for messages
  std::unique_ptr<Connection> connection_;
};

// The parsed command line: global flags, every subcommand's arguments, and
// the subcommands (owned by the CLI::App that made them).
struct CliArgs {
  ConnectionOptions connection;
  bool json = false;
  double timeout_seconds = 0;
  std::string file, job_id, checkpoint_id, out_dir, dtype, request_id, owner, page_token, prefix;
  std::string audit_user, audit_method, init_from, init_optimizer;
  bool wait = false, all = false, force = false;
  int page_size = 0;
  std::vector<std::string> states;
  PlanArgs plan;
  PlotArgs plot;
  CLI::App* submit = nullptr;
  CLI::App* list = nullptr;
  CLI::App* get = nullptr;
  CLI::App* watch = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* suspend = nullptr;
  CLI::App* resume = nullptr;
  CLI::App* checkpoint = nullptr;
  CLI::App* checkpoints = nullptr;
  CLI::App* export_cmd = nullptr;
  CLI::App* delete_checkpoint = nullptr;
  CLI::App* status = nullptr;
  CLI::App* metrics = nullptr;
  CLI::App* audit = nullptr;
  CLI::App* plan_cmd = nullptr;
  CLI::App* plot_cmd = nullptr;
  CLI::App* hash_token = nullptr;
};

void AddGlobalFlags(CLI::App& app, CliArgs& a) {
  app.name("megatrain");
  app.set_version_flag("--version", std::string("megatrain ") + Version());
  // Global flags may also follow the subcommand.
  app.fallthrough();
  app.require_subcommand(1, 1);
  app.add_option("--server", a.connection.server, "Daemon address host:port")
      ->envname("MEGATRAIN_SERVER")
      ->capture_default_str();
  app.add_option("--token", a.connection.token, "Bearer token (or MEGATRAIN_TOKEN)")
      ->envname("MEGATRAIN_TOKEN");
  app.add_flag("--json", a.json, "Machine-readable JSON output");
  app.add_option("--timeout", a.timeout_seconds,
                 "Seconds per RPC (default 30; checkpoint 1800; export none)");
  app.add_flag("--tls", a.connection.tls, "Use TLS with the system's root certificates");
  app.add_option("--tls_ca", a.connection.tls_ca, "PEM roots to verify the daemon (implies TLS)");
  app.add_option("--tls_cert", a.connection.tls_cert, "PEM client certificate (mutual TLS)");
  app.add_option("--tls_key", a.connection.tls_key, "PEM client key (mutual TLS)");
  app.add_option("--tls_server_name", a.connection.tls_server_name,
                 "Name expected in the daemon's certificate");
}

// submit, list, get, watch, cancel, suspend, resume.
void AddJobCommands(CLI::App& app, CliArgs& a) {
  a.submit = app.add_subcommand("submit", "Submit a job file (YAML)");
  a.submit->add_option("file", a.file, "Job file")->required();
  a.submit->add_flag("--wait", a.wait, "Follow the job; exit 0 only if it SUCCEEDED");
  a.submit->add_option("--request_id", a.request_id, "Idempotency key (default: random)");
  a.submit->add_option("--init_from", a.init_from,
                       "Start from this checkpoint of yours (model.init_from, e.g. "
                       "job-000012/step-400)");
  a.submit
      ->add_option("--optimizer", a.init_optimizer,
                   "With --init_from: fresh (default) or restore (its AdamW state)")
      ->check(CLI::IsMember({"fresh", "restore"}));
  a.list = app.add_subcommand("list", "List jobs, newest first");
  a.list->add_option("--state", a.states, "Only jobs in this state (repeatable)");
  a.list->add_option("--owner", a.owner, "Only jobs of this user (admins)");
  a.list->add_option("--page_size", a.page_size, "Jobs per page (default 50, at most 1000)");
  a.list->add_option("--page_token", a.page_token, "Continue from a previous page");
  a.list->add_flag("--all", a.all, "Fetch every page");
  a.get = app.add_subcommand("get", "Show one job");
  a.get->add_option("job", a.job_id, "Job id")->required();
  a.watch = app.add_subcommand("watch", "Follow a job's progress until it ends");
  a.watch->add_option("job", a.job_id, "Job id")->required();
  a.cancel = app.add_subcommand("cancel", "Cancel a job");
  a.cancel->add_option("job", a.job_id, "Job id")->required();
  a.cancel->add_flag("--force", a.force,
                     "Abandon the running step (lost) instead of finishing it; stops in seconds");
  a.suspend = app.add_subcommand("suspend", "Checkpoint a job and release its device");
  a.suspend->add_option("job", a.job_id, "Job id")->required();
  a.resume = app.add_subcommand("resume", "Queue a suspended job again");
  a.resume->add_option("job", a.job_id, "Job id")->required();
}

// checkpoint, checkpoints, export, delete-checkpoint.
void AddCheckpointCommands(CLI::App& app, CliArgs& a) {
  a.checkpoint = app.add_subcommand("checkpoint", "Checkpoint a running job now");
  a.checkpoint->add_option("job", a.job_id, "Job id")->required();
  a.checkpoints = app.add_subcommand("checkpoints", "List a job's checkpoints");
  a.checkpoints->add_option("job", a.job_id, "Job id")->required();
  a.export_cmd = app.add_subcommand("export", "Write a checkpoint as a HF model directory");
  a.export_cmd->add_option("checkpoint", a.checkpoint_id, "Checkpoint id (job-000001/step-60)")
      ->required();
  a.export_cmd->add_option("--out", a.out_dir, "Output directory (must not exist or be empty)")
      ->required();
  a.export_cmd->add_option("--dtype", a.dtype, "bf16 (default) or fp32");
  a.delete_checkpoint = app.add_subcommand("delete-checkpoint", "Delete a checkpoint");
  a.delete_checkpoint->add_option("checkpoint", a.checkpoint_id, "Checkpoint id")->required();
}

// status, metrics, audit, plan, hash-token.
void AddServerCommands(CLI::App& app, CliArgs& a) {
  a.status = app.add_subcommand("status", "Show devices, memory and queue");
  a.metrics = app.add_subcommand("metrics", "Print the daemon's metrics");
  a.metrics->add_option("--prefix", a.prefix, "Only families starting with this");
  a.audit = app.add_subcommand("audit", "Show the audit log of mutating calls (admins)");
  a.audit->add_option("--user", a.audit_user, "Only calls by this user");
  a.audit->add_option("--job", a.job_id, "Only calls on this job and its checkpoints");
  a.audit->add_option("--method", a.audit_method, "Only this RPC (SubmitJob, CancelJob, ...)");
  a.audit->add_option("--page_size", a.page_size, "Records per page (default 50, at most 1000)");
  a.audit->add_option("--page_token", a.page_token, "Continue from a previous page");
  a.audit->add_flag("--all", a.all, "Fetch every page");
  a.plan_cmd = AddPlanCommand(&app, &a.plan);
  a.plot_cmd = AddPlotCommand(&app, &a.plot);
  a.hash_token = app.add_subcommand("hash-token",
                                    "Print the SHA-256 of a token read from stdin, for the "
                                    "daemon's --auth_tokens file");
}

// `megatrain hash-token`: the SHA-256 of the first line of stdin, in hex.
int HashToken(std::ostream& out) {
  std::string token;
  std::getline(std::cin, token);
  token = std::string(absl::StripAsciiWhitespace(token));
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  out << absl::BytesToHexString(
             absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)))
      << "\n";
  return kExitOk;
}

// Runs the parsed daemon subcommand; -1 when none matched.
int Dispatch(Cli& cli, const CliArgs& a) {
  if (a.submit->parsed()) {
    return cli.Submit(a.file, a.wait, a.request_id, a.init_from, a.init_optimizer);
  }
  if (a.list->parsed()) return cli.List(a.states, a.owner, a.page_size, a.page_token, a.all);
  if (a.get->parsed()) return cli.Get(a.job_id);
  if (a.watch->parsed()) return cli.Watch(a.job_id);
  if (a.cancel->parsed()) return cli.Control("cancel", a.job_id, a.force);
  if (a.suspend->parsed()) return cli.Control("suspend", a.job_id);
  if (a.resume->parsed()) return cli.Control("resume", a.job_id);
  if (a.checkpoint->parsed()) return cli.CreateCheckpoint(a.job_id);
  if (a.checkpoints->parsed()) return cli.Checkpoints(a.job_id);
  if (a.export_cmd->parsed()) return cli.Export(a.checkpoint_id, a.out_dir, a.dtype);
  if (a.delete_checkpoint->parsed()) return cli.DeleteCheckpoint(a.checkpoint_id);
  if (a.status->parsed()) return cli.Status();
  if (a.metrics->parsed()) return cli.Metrics(a.prefix);
  if (a.audit->parsed()) {
    return cli.Audit(a.audit_user, a.job_id, a.audit_method, a.page_size, a.page_token, a.all);
  }
  return -1;
}

}  // namespace

int ExitCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kUnavailable:
      return kExitError;
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    case absl::StatusCode::kNotFound:
      return 4;
    case absl::StatusCode::kAlreadyExists:
      return 5;
    case absl::StatusCode::kPermissionDenied:
      return 6;
    case absl::StatusCode::kUnauthenticated:
      return 7;
    case absl::StatusCode::kResourceExhausted:
      return 8;
    case absl::StatusCode::kFailedPrecondition:
      return 9;
    case absl::StatusCode::kUnimplemented:
      return 10;
    case absl::StatusCode::kDataLoss:
      return 11;
    case absl::StatusCode::kDeadlineExceeded:
      return 12;
    case absl::StatusCode::kInternal:
      return 13;
    case absl::StatusCode::kAborted:
      return 14;
    case absl::StatusCode::kCancelled:
      return 15;
    case absl::StatusCode::kOutOfRange:
      return 16;
    default:
      return 17;  // UNKNOWN and codes past the table
  }
}

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
           bool interactive) {
  CLI::App app{
      "megatrain: submit and manage training jobs on a megatraind daemon\n"
      "  megatrain tokenize ...  turns text, JSONL or chat JSONL into token shards locally\n"
      "                          (no daemon; `megatrain tokenize --help`; docs/data-format.md)"};
  CliArgs a;
  AddGlobalFlags(app, a);
  AddJobCommands(app, a);
  AddCheckpointCommands(app, a);
  AddServerCommands(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return code == 0 ? kExitOk : kExitUsage;
  }
  if (a.hash_token->parsed()) return HashToken(out);
  if (a.timeout_seconds < 0) {
    err << "megatrain: --timeout: must be >= 0\n";
    return kExitUsage;
  }
  absl::StatusOr<std::unique_ptr<Connection>> created = Connection::Create(a.connection);
  if (!created.ok()) {
    err << "megatrain: " << created.status().message() << "\n";
    return kExitUsage;
  }
  if (a.plan_cmd->parsed()) {
    return RunPlan(a.plan, **created,
                   a.timeout_seconds > 0 ? absl::Seconds(a.timeout_seconds) : absl::Seconds(30),
                   a.json, out, err);
  }
  if (a.plot_cmd->parsed()) {
    return RunPlot(a.plot, **created,
                   a.timeout_seconds > 0 ? absl::Seconds(a.timeout_seconds) : absl::Seconds(60),
                   out, err);
  }
  Cli cli(out, err, interactive, a.json, absl::Seconds(a.timeout_seconds), a.connection.server,
          *std::move(created));
  const int code = Dispatch(cli, a);
  if (code >= 0) return code;
  err << app.help();
  return kExitUsage;
}

std::optional<std::vector<std::string>> TokenizeArguments(int argc, const char* const* argv) {
  // The global flags only; parsing stops at the first word they do not
  // take, and that word and all after it are left unparsed.
  CLI::App app;
  CliArgs ignored;
  AddGlobalFlags(app, ignored);
  app.require_subcommand(0);
  app.set_help_flag();
  app.set_version_flag();
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError&) {
    return std::nullopt;
  }
  std::vector<std::string> rest = app.remaining();
  if (rest.empty() || rest.front() != "tokenize") return std::nullopt;
  rest.erase(rest.begin());
  return rest;
}

}  // namespace megatrain::client
