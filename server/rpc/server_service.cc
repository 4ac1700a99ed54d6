// See server_service.h.
#include "server/rpc/server_service.h"

#include <prometheus/metric_type.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/core/plan_machine.h"
#include "server/rpc/plan_convert.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/rpc_call.h"
#include "server/rpc/strict_parse.h"

namespace megatrain::server {
namespace {

std::string MetricTypeName(prometheus::MetricType type) {
  switch (type) {
    case prometheus::MetricType::Counter:
      return "counter";
    case prometheus::MetricType::Gauge:
      return "gauge";
    case prometheus::MetricType::Histogram:
      return "histogram";
    case prometheus::MetricType::Summary:
      return "summary";
    default:
      return "untyped";
  }
}

void AddSample(v1::MetricFamily* family, const std::string& name,
               const prometheus::ClientMetric& metric, double value,
               const std::pair<std::string, std::string>* extra_label = nullptr) {
  v1::MetricSample* sample = family->add_samples();
  sample->set_name(name);
  for (const auto& label : metric.label) (*sample->mutable_labels())[label.name] = label.value;
  if (extra_label != nullptr) (*sample->mutable_labels())[extra_label->first] = extra_label->second;
  sample->set_value(value);
}

// A family as proto samples, named as in the text format.
void FamilyToProto(const prometheus::MetricFamily& in, v1::MetricFamily* out) {
  out->set_name(in.name);
  out->set_help(in.help);
  out->set_type(MetricTypeName(in.type));
  for (const prometheus::ClientMetric& metric : in.metric) {
    switch (in.type) {
      case prometheus::MetricType::Counter:
        AddSample(out, in.name, metric, metric.counter.value);
        break;
      case prometheus::MetricType::Gauge:
        AddSample(out, in.name, metric, metric.gauge.value);
        break;
      case prometheus::MetricType::Histogram: {
        for (const auto& bucket : metric.histogram.bucket) {
          const std::pair<std::string, std::string> le{
              "le", bucket.upper_bound == std::numeric_limits<double>::infinity()
                        ? "+Inf"
                        : absl::StrCat(bucket.upper_bound)};
          AddSample(out, in.name + "_bucket", metric, static_cast<double>(bucket.cumulative_count),
                    &le);
        }
        AddSample(out, in.name + "_sum", metric, metric.histogram.sample_sum);
        AddSample(out, in.name + "_count", metric,
                  static_cast<double>(metric.histogram.sample_count));
        break;
      }
      case prometheus::MetricType::Summary:
        AddSample(out, in.name + "_sum", metric, metric.summary.sample_sum);
        AddSample(out, in.name + "_count", metric,
                  static_cast<double>(metric.summary.sample_count));
        break;
      default:
        AddSample(out, in.name, metric, metric.untyped.value);
        break;
    }
  }
}

}  // namespace

void ServerServiceImpl::ParseRequestsStrictly() {
  constexpr absl::string_view kService = "megatrain.v1.ServerService";
  MarkMethodStreamed(
      MethodIndex(kService, "GetServerStatus", v1::GetServerStatusRequest::descriptor()),
      NewStrictUnaryHandler(this, &ServerServiceImpl::GetServerStatus));
  MarkMethodStreamed(MethodIndex(kService, "GetMetrics", v1::GetMetricsRequest::descriptor()),
                     NewStrictUnaryHandler(this, &ServerServiceImpl::GetMetrics));
  MarkMethodStreamed(
      MethodIndex(kService, "ListAuditRecords", v1::ListAuditRecordsRequest::descriptor()),
      NewStrictUnaryHandler(this, &ServerServiceImpl::ListAuditRecords));
  MarkMethodStreamed(MethodIndex(kService, "PlanJob", v1::PlanJobRequest::descriptor()),
                     NewStrictUnaryHandler(this, &ServerServiceImpl::PlanJob));
}

grpc::Status ServerServiceImpl::PlanJob(grpc::ServerContext* context,
                                        const v1::PlanJobRequest* request,
                                        v1::PlanJobResponse* response) {
  RpcCall call("PlanJob", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::StatusOr<PlanInputs> in = PlanInputsFromProto(*request);
  if (!in.ok()) return call.Finish(in.status());
  if (facts_.backend == nullptr) {
    return call.Finish(absl::UnimplementedError("PlanJob: this daemon has no engine"));
  }
  absl::StatusOr<ManagerStatus> status = manager_->GetStatus();
  if (!status.ok()) return call.Finish(status.status());
  DaemonMachine daemon;
  daemon.host_memory_budget_bytes = status->host_memory_budget_bytes;
  daemon.nvme_budget_bytes = facts_.nvme_budget_bytes;
  if (!status->devices.empty()) {
    const std::string& device = status->devices.front().name;
    auto link = facts_.link_bandwidth.find(device);
    if (link != facts_.link_bandwidth.end()) {
      daemon.h2d_bytes_per_second = link->second.h2d_bytes_per_second;
      daemon.d2h_bytes_per_second = link->second.d2h_bytes_per_second;
    }
    if (nvml_ != nullptr) {
      std::optional<NvmlSample> sample = nvml_->Sample(device);
      if (sample.has_value()) daemon.gpu_memory_bytes = sample->memory_total_bytes;
    }
  }
  const engine::PlanMachine machine = ResolvePlanMachine(in->machine, daemon);
  absl::StatusOr<engine::JobPlan> plan = facts_.backend->PlanJob(
      in->model, in->spec, machine, call.EngineCancellation(facts_.max_engine_call));
  if (!plan.ok()) return call.Finish(plan.status());
  JobPlanToProto(*plan, machine, response);
  return call.Finish(absl::OkStatus());
}

grpc::Status ServerServiceImpl::GetServerStatus(grpc::ServerContext* context,
                                                const v1::GetServerStatusRequest* request,
                                                v1::ServerStatus* response) {
  RpcCall call("GetServerStatus", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::StatusOr<ManagerStatus> status = manager_->GetStatus();
  if (!status.ok()) return call.Finish(status.status());
  response->set_version(facts_.version);
  response->set_start_time_unix_ms(facts_.start_time_unix_ms);
  for (const DeviceState& device : status->devices) {
    v1::Device* out = response->add_devices();
    out->set_name(device.name);
    out->set_job_id(device.job_id);
    auto link = facts_.link_bandwidth.find(device.name);
    if (link != facts_.link_bandwidth.end()) {
      out->set_pcie_h2d_bytes_per_second(link->second.h2d_bytes_per_second);
      out->set_pcie_d2h_bytes_per_second(link->second.d2h_bytes_per_second);
    }
    if (nvml_ != nullptr) {
      std::optional<NvmlSample> sample = nvml_->Sample(device.name);
      if (sample.has_value()) {
        out->set_memory_total_bytes(sample->memory_total_bytes);
        out->set_memory_used_bytes(sample->memory_used_bytes);
        out->set_description(sample->name);
      }
    }
  }
  v1::HostMemory* memory = response->mutable_host_memory();
  memory->set_budget_bytes(status->host_memory_budget_bytes);
  memory->set_reserved_bytes(status->host_memory_reserved_bytes);
  memory->set_physical_bytes(facts_.physical_memory_bytes);
  v1::QueueStatus* queue = response->mutable_queue();
  auto count = [&](JobState state) {
    auto it = status->jobs_by_state.find(state);
    return it == status->jobs_by_state.end() ? 0 : it->second;
  };
  queue->set_queued(count(JobState::kQueued));
  queue->set_running(count(JobState::kRunning));
  queue->set_suspending(count(JobState::kSuspending));
  queue->set_suspended(count(JobState::kSuspended));
  queue->set_succeeded(count(JobState::kSucceeded));
  queue->set_failed(count(JobState::kFailed));
  queue->set_cancelled(count(JobState::kCancelled));
  response->set_draining(status->draining);
  response->set_auth_enabled(facts_.auth_enabled);
  response->set_preemption_enabled(facts_.preemption_enabled);
  response->set_caller(caller->name);
  response->set_caller_role(std::string(RoleName(caller->role)));
  return call.Finish(absl::OkStatus());
}

grpc::Status ServerServiceImpl::GetMetrics(grpc::ServerContext* context,
                                           const v1::GetMetricsRequest* request,
                                           v1::GetMetricsResponse* response) {
  RpcCall call("GetMetrics", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  std::vector<prometheus::MetricFamily> families = metrics_->Collect();
  std::vector<prometheus::MetricFamily> selected;
  for (prometheus::MetricFamily& family : families) {
    if (!absl::StartsWith(family.name, request->name_prefix())) continue;
    FamilyToProto(family, response->add_families());
    selected.push_back(std::move(family));
  }
  response->set_text(ServerMetrics::ToText(selected));
  return call.Finish(absl::OkStatus());
}

grpc::Status ServerServiceImpl::ListAuditRecords(grpc::ServerContext* context,
                                                 const v1::ListAuditRecordsRequest* request,
                                                 v1::ListAuditRecordsResponse* response) {
  RpcCall call("ListAuditRecords", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  AuditQuery query;
  query.user = request->user();
  query.job_id = request->job_id();
  query.method = request->method();
  query.page_size = request->page_size();
  query.page_token = request->page_token();
  absl::StatusOr<AuditPage> page = audit_->List(*caller, query);
  if (!page.ok()) return call.Finish(page.status());
  for (const AuditRecord& record : page->records)
    AuditRecordToProto(record, response->add_records());
  response->set_next_page_token(page->next_page_token);
  return call.Finish(absl::OkStatus());
}

}  // namespace megatrain::server
