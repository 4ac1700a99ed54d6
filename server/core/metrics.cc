// See metrics.h.
#include "server/core/metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace megatrain::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Step times range from ~10 ms (tiny model on CPU) to minutes (8B model,
// long sequences): exponential buckets 5 ms .. ~20 min.
Histogram::BucketBoundaries StepBuckets() {
  Histogram::BucketBoundaries bounds;
  for (double bound = 0.005; bound < 1300; bound *= 2) bounds.push_back(bound);
  return bounds;
}

// Checkpoints: ~10 ms (tiny) .. ~30 min (8B with AdamW state, ~100 GB).
Histogram::BucketBoundaries CheckpointBuckets() {
  Histogram::BucketBoundaries bounds;
  for (double bound = 0.01; bound < 2000; bound *= 2) bounds.push_back(bound);
  return bounds;
}

// RPCs: sub-millisecond lookups .. minutes (ExportCheckpoint, WatchJob).
Histogram::BucketBoundaries RpcBuckets() {
  Histogram::BucketBoundaries bounds;
  for (double bound = 0.0005; bound < 700; bound *= 4) bounds.push_back(bound);
  return bounds;
}

// Note [Not applicable on the CPU] in metrics.h.
bool IsCpuDevice(const std::string& device) { return absl::StartsWith(device, "cpu"); }

// A family named `name` with `help`, registered in `r`.
prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& r,
                                                       const std::string& name,
                                                       const std::string& help) {
  return BuildCounter().Name(name).Help(help).Register(r);
}
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& r, const std::string& name,
                                                   const std::string& help) {
  return BuildGauge().Name(name).Help(help).Register(r);
}
prometheus::Family<Histogram>& HistogramFamily(prometheus::Registry& r, const std::string& name,
                                               const std::string& help) {
  return BuildHistogram().Name(name).Help(help).Register(r);
}

}  // namespace

std::string StatusCodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

ServerMetrics::ServerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  // Registered in this order, which is the order of the exposition.
  RegisterStepMetrics(*registry_);
  RegisterPcieMetrics(*registry_);
  RegisterMemoryMetrics(*registry_);
  RegisterTrainingMetrics(*registry_);
  RegisterServerMetrics(*registry_);
}

void ServerMetrics::RegisterStepMetrics(prometheus::Registry& r) {
  tokens_total_ = &CounterFamily(r, "megatrain_tokens_total", "Tokens trained, all jobs.").Add({});
  steps_total_ =
      &CounterFamily(r, "megatrain_steps_total", "Optimizer steps finished, all jobs.").Add({});
  skipped_steps_total_ = &CounterFamily(r, "megatrain_skipped_steps_total",
                                        "Steps not applied: loss or gradient norm not finite "
                                        "(train.nan_policy: skip).")
                              .Add({});
  step_duration_seconds_ =
      &HistogramFamily(r, "megatrain_step_duration_seconds", "Wall time of one optimizer step.")
           .Add({}, StepBuckets());
  phase_seconds_total_ =
      &CounterFamily(r, "megatrain_phase_seconds_total",
                     "Time per step phase: busy time of the h2d, compute and d2h streams, CPU "
                     "optimizer time, its exposed part (compute-stream idle while waiting for it), "
                     "and GPU idle time.");
  for (const char* phase :
       {"h2d", "compute", "d2h", "optimizer", "optimizer_exposed", "gpu_idle"}) {
    phase_seconds_total_->Add({{"phase", phase}});
  }
}

void ServerMetrics::RegisterPcieMetrics(prometheus::Registry& r) {
  pcie_bytes_total_ = &CounterFamily(r, "megatrain_pcie_bytes_total",
                                     "Bytes copied over PCIe, by direction (h2d, d2h).");
  pcie_bandwidth_ = &GaugeFamily(r, "megatrain_pcie_bandwidth_bytes_per_second",
                                 "Achieved copy bandwidth in the latest step: bytes / busy seconds "
                                 "of the copy stream.");
  pcie_link_bandwidth_ = &GaugeFamily(r, "megatrain_pcie_link_bandwidth_bytes_per_second",
                                      "Pinned copy bandwidth measured at daemon start-up.");
  pcie_utilization_ =
      &GaugeFamily(r, "megatrain_pcie_utilization_ratio",
                   "Latest step: bytes / (step seconds x measured link bandwidth), in [0, 1].");
  nvml_pcie_throughput_ =
      &GaugeFamily(r, "megatrain_nvml_pcie_throughput_bytes_per_second",
                   "PCIe throughput reported by NVML (tx, rx): one 20 ms window at each scrape, "
                   "not comparable with byte counters; use megatrain_nvml_pcie_bytes_total.");
  nvml_pcie_bytes_total_ =
      &CounterFamily(r, "megatrain_nvml_pcie_bytes_total",
                     "PCIe bytes counted by NVML since daemon start (tx: device to host, rx: host "
                     "to device), link level: payload and packet headers.");
  nvml_pcie_counter_late_reads_total_ =
      &CounterFamily(r, "megatrain_nvml_pcie_counter_late_reads_total",
                     "Reads of a 32-bit NVML PCIe byte counter that came late enough to have "
                     "missed a whole wrap (megatrain_nvml_pcie_bytes_total may be short by 4 GiB "
                     "each).");
  pcie_link_estimate_bytes_total_ =
      &CounterFamily(r, "megatrain_pcie_link_estimate_bytes_total",
                     "The engine's copies as bytes on the PCIe link (tx: device to host, rx: host "
                     "to device; payload, packet headers and read requests, by the link model): "
                     "comparable with megatrain_nvml_pcie_bytes_total.");
  pcie_link_model_ratio_ =
      &GaugeFamily(r, "megatrain_pcie_link_model_ratio",
                   "PCIe link model: link bytes per payload byte (kind: rx_per_h2d_byte, "
                   "tx_per_h2d_byte, tx_per_d2h_byte, rx_per_d2h_byte).");
  pcie_link_model_calibrated_ =
      &GaugeFamily(r, "megatrain_pcie_link_model_calibrated",
                   "1 when the PCIe link model was measured with NVML at start-up, 0 when it "
                   "is the defaults.");
}

void ServerMetrics::RegisterMemoryMetrics(prometheus::Registry& r) {
  gpu_memory_used_ =
      &GaugeFamily(r, "megatrain_gpu_memory_used_bytes", "Device memory in use (NVML).");
  gpu_memory_total_ = &GaugeFamily(r, "megatrain_gpu_memory_total_bytes", "Device memory (NVML).");
  gpu_memory_peak_ = &GaugeFamily(r, "megatrain_gpu_memory_peak_bytes",
                                  "Peak device memory allocated by the engine in the latest step.");
  host_store_bytes_ = &GaugeFamily(r, "megatrain_host_store_bytes",
                                   "Host model store of the running jobs, by kind.");
  for (const char* kind : {"master", "grad", "exp_avg", "exp_avg_sq", "streaming", "staging"}) {
    host_store_bytes_->Add({{"kind", kind}});
  }
  host_pinned_bytes_ =
      &GaugeFamily(r, "megatrain_host_pinned_bytes", "Page-locked part of the host model store.")
           .Add({});
  host_memory_budget_bytes_ = &GaugeFamily(r, "megatrain_host_memory_budget_bytes",
                                           "Host memory all running jobs may use together.")
                                   .Add({});
  host_memory_reserved_bytes_ = &GaugeFamily(r, "megatrain_host_memory_reserved_bytes",
                                             "Host memory footprints of the running jobs.")
                                     .Add({});
}

void ServerMetrics::RegisterTrainingMetrics(prometheus::Registry& r) {
  mfu_ = &GaugeFamily(r, "megatrain_mfu_ratio",
                      "Model FLOPs utilisation of the latest step, in [0, 1].");
  tokens_per_second_ = &GaugeFamily(r, "megatrain_tokens_per_second",
                                    "Tokens/s of the device in the latest step of its job.");
  job_tokens_per_second_ =
      &GaugeFamily(r, "megatrain_job_tokens_per_second",
                   "Tokens/s of the job (all its devices) in its latest step, under its first "
                   "device.");
  training_loss_ = &GaugeFamily(r, "megatrain_training_loss", "Training loss of the latest step.");
  training_aux_loss_ = &GaugeFamily(r, "megatrain_training_aux_loss",
                                    "Router load-balancing loss of the latest step (MoE models).");
  eval_loss_ = &GaugeFamily(r, "megatrain_eval_loss", "Loss of the latest evaluation.");
  // Note [Per-job series] in metrics.h.
  job_loss_ = &GaugeFamily(r, "megatrain_job_loss", "Training loss of the job's latest step.");
  job_eval_loss_ =
      &GaugeFamily(r, "megatrain_job_eval_loss", "Loss of the job's latest evaluation.");
  job_learning_rate_ = &GaugeFamily(r, "megatrain_job_learning_rate",
                                    "Learning rate used by the job's latest step.");
  job_grad_norm_ = &GaugeFamily(r, "megatrain_job_grad_norm",
                                "Global gradient norm (before clipping) of the job's latest step.");
  job_step_tokens_per_second_ = &GaugeFamily(r, "megatrain_job_step_tokens_per_second",
                                             "Tokens/s of the job's latest step (all devices).");
}

void ServerMetrics::RegisterServerMetrics(prometheus::Registry& r) {
  jobs_ = &GaugeFamily(r, "megatrain_jobs", "Jobs per state.");
  for (JobState state : kAllJobStates) {
    jobs_->Add({{"state", absl::AsciiStrToLower(JobStateName(state))}});
  }
  queue_depth_ =
      &GaugeFamily(r, "megatrain_queue_depth", "Jobs waiting in the queue (QUEUED).").Add({});
  checkpoint_duration_seconds_ =
      &HistogramFamily(r, "megatrain_checkpoint_duration_seconds", "Time to write one checkpoint.")
           .Add({}, CheckpointBuckets());
  rpcs_total_ =
      &CounterFamily(r, "megatrain_rpcs_total", "Finished RPCs by method and status code.");
  rpc_duration_seconds_ =
      &HistogramFamily(r, "megatrain_rpc_duration_seconds", "RPC latency by method.");
  watch_streams_ = &GaugeFamily(r, "megatrain_watch_streams", "WatchJob streams open now.").Add({});
  GaugeFamily(r, "megatrain_build_info", "Constant 1, labelled with the daemon version.")
      .Add({{"version", MEGATRAIN_VERSION}})  // CMake's PROJECT_VERSION (daemon.h kVersion)
      .Set(1);
}

prometheus::Family<prometheus::Counter>* ServerMetrics::NvmeBytesTotal() {
  std::call_once(nvme_bytes_total_once_, [this] {
    nvme_bytes_total_ = &BuildCounter()
                             .Name("megatrain_nvme_bytes_total")
                             .Help(
                                 "Bytes the optimizer read from and wrote to the NVMe tier's "
                                 "moment files (memory.nvme_tier); the writes are SSD wear.")
                             .Register(*registry_);
  });
  return nvme_bytes_total_;
}

void ServerMetrics::RecordStep(const std::string& device, const engine::StepReport& report) {
  RecordStep(std::vector<std::string>{device}, report);
}

void ServerMetrics::RecordStep(const std::vector<std::string>& devices,
                               const engine::StepReport& report) {
  if (devices.empty()) return;
  const std::string& device = devices.front();
  const engine::StepStats& stats = report.stats;
  tokens_total_->Increment(static_cast<double>(std::max<int64_t>(stats.tokens, 0)));
  steps_total_->Increment();
  if (report.skipped) skipped_steps_total_->Increment();
  step_duration_seconds_->Observe(stats.step_seconds);
  // Counters must not decrease: clamp at 0.
  auto add = [this](const char* phase, double seconds) {
    phase_seconds_total_->Add({{"phase", phase}}).Increment(std::max(seconds, 0.0));
  };
  add("h2d", stats.h2d_seconds);
  add("compute", stats.compute_seconds);
  add("d2h", stats.d2h_seconds);
  add("optimizer", stats.optimizer_seconds);
  add("optimizer_exposed", stats.optimizer_exposed_seconds);
  add("gpu_idle", stats.gpu_idle_seconds);
  // Note [Per-device metrics] in metrics.h.
  const double per_device = devices.size() > 1 ? report.device_tokens_per_s : report.tokens_per_s;
  for (const std::string& d : devices) {
    tokens_per_second_->Add({{"device", d}}).Set(per_device);
    if (!IsCpuDevice(d)) mfu_->Add({{"device", d}}).Set(report.mfu);
  }
  job_tokens_per_second_->Add({{"device", device}}).Set(report.tokens_per_s);
  if (!report.skipped) training_loss_->Add({{"device", device}}).Set(report.loss);
  if (!report.skipped && report.aux_loss != 0) {
    training_aux_loss_->Add({{"device", device}}).Set(report.aux_loss);
  }
  if (stats.nvme_read_bytes > 0 || stats.nvme_written_bytes > 0) {
    NvmeBytesTotal()
        ->Add({{"direction", "read"}})
        .Increment(static_cast<double>(std::max<int64_t>(stats.nvme_read_bytes, 0)));
    NvmeBytesTotal()
        ->Add({{"direction", "written"}})
        .Increment(static_cast<double>(std::max<int64_t>(stats.nvme_written_bytes, 0)));
  }
  if (IsCpuDevice(device)) return;  // Note [Not applicable on the CPU] in metrics.h
  // Note [Per-device metrics]: each GPU's own copies where the engine
  // reports them per device.
  if (report.device_stats.size() == devices.size()) {
    for (size_t i = 0; i < devices.size(); ++i) RecordLinkStep(devices[i], report.device_stats[i]);
  } else {
    RecordLinkStep(device, stats);
  }
}

void ServerMetrics::RecordLinkStep(const std::string& device, const engine::StepStats& stats) {
  pcie_bytes_total_->Add({{"direction", "h2d"}})
      .Increment(static_cast<double>(std::max<int64_t>(stats.h2d_bytes, 0)));
  pcie_bytes_total_->Add({{"direction", "d2h"}})
      .Increment(static_cast<double>(std::max<int64_t>(stats.d2h_bytes, 0)));

  LinkBandwidth link;
  PcieLinkModel model;  // the defaults until SetPcieLinkModel
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = link_by_device_.find(device);
    if (it != link_by_device_.end()) link = it->second;
    auto model_it = link_model_by_device_.find(device);
    if (model_it != link_model_by_device_.end()) model = model_it->second;
  }
  auto bandwidth = [&](const char* direction, int64_t bytes, double busy_seconds,
                       double link_bytes_per_second) {
    const prometheus::Labels labels = {{"device", device}, {"direction", direction}};
    pcie_bandwidth_->Add(labels).Set(busy_seconds > 0 ? bytes / busy_seconds : 0);
    if (link_bytes_per_second > 0 && stats.step_seconds > 0) {
      pcie_utilization_->Add(labels).Set(
          std::min(1.0, bytes / (stats.step_seconds * link_bytes_per_second)));
    }
  };
  bandwidth("h2d", stats.h2d_bytes, stats.h2d_seconds, link.h2d_bytes_per_second);
  bandwidth("d2h", stats.d2h_bytes, stats.d2h_seconds, link.d2h_bytes_per_second);
  if (stats.h2d_bytes > 0 || stats.d2h_bytes > 0) {
    const PcieLinkBytes link_bytes = EstimateLinkBytes(model, stats.h2d_bytes, stats.d2h_bytes);
    pcie_link_estimate_bytes_total_->Add({{"device", device}, {"direction", "tx"}})
        .Increment(link_bytes.tx_bytes);
    pcie_link_estimate_bytes_total_->Add({{"device", device}, {"direction", "rx"}})
        .Increment(link_bytes.rx_bytes);
  }
  if (stats.peak_device_bytes > 0) {
    gpu_memory_peak_->Add({{"device", device}}).Set(static_cast<double>(stats.peak_device_bytes));
  }
}

void ServerMetrics::RecordEval(const std::string& device, double eval_loss) {
  eval_loss_->Add({{"device", device}}).Set(eval_loss);
}

void ServerMetrics::RecordJobStep(const std::string& job_id, const engine::StepReport& report) {
  const prometheus::Labels labels = {{"job_id", job_id}};
  if (!report.skipped) job_loss_->Add(labels).Set(report.loss);
  job_learning_rate_->Add(labels).Set(report.lr);
  job_grad_norm_->Add(labels).Set(report.grad_norm);
  job_step_tokens_per_second_->Add(labels).Set(report.tokens_per_s);
}

void ServerMetrics::RecordJobEval(const std::string& job_id, double eval_loss) {
  job_eval_loss_->Add({{"job_id", job_id}}).Set(eval_loss);
}

void ServerMetrics::RemoveJob(const std::string& job_id) {
  const prometheus::Labels labels = {{"job_id", job_id}};
  for (prometheus::Family<prometheus::Gauge>* family :
       {job_loss_, job_eval_loss_, job_learning_rate_, job_grad_norm_,
        job_step_tokens_per_second_}) {
    // Add returns the existing child (or a new one, removed at once).
    family->Remove(&family->Add(labels));
  }
}

void ServerMetrics::RecordCheckpoint(double seconds) {
  checkpoint_duration_seconds_->Observe(seconds);
}

void ServerMetrics::SetHostStore(const std::string& device, const engine::HostStoreBytes& bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  host_store_by_device_[device] = bytes;
  UpdateHostStoreGaugesLocked();
}

void ServerMetrics::ClearDevice(const std::string& device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    host_store_by_device_.erase(device);
    UpdateHostStoreGaugesLocked();
  }
  const prometheus::Labels labels = {{"device", device}};
  tokens_per_second_->Add(labels).Set(0);
  job_tokens_per_second_->Add(labels).Set(0);
  // The next job on the device has not evaluated yet: no eval loss.
  eval_loss_->Remove(&eval_loss_->Add(labels));
  if (IsCpuDevice(device)) return;  // Note [Not applicable on the CPU] in metrics.h
  mfu_->Add(labels).Set(0);
  for (const char* direction : {"h2d", "d2h"}) {
    pcie_bandwidth_->Add({{"device", device}, {"direction", direction}}).Set(0);
  }
}

void ServerMetrics::UpdateHostStoreGaugesLocked() {
  engine::HostStoreBytes sum;
  for (const auto& [device, bytes] : host_store_by_device_) {
    sum.master += bytes.master;
    sum.grad += bytes.grad;
    sum.exp_avg += bytes.exp_avg;
    sum.exp_avg_sq += bytes.exp_avg_sq;
    sum.streaming += bytes.streaming;
    sum.staging += bytes.staging;
    sum.pinned += bytes.pinned;
  }
  host_store_bytes_->Add({{"kind", "master"}}).Set(static_cast<double>(sum.master));
  host_store_bytes_->Add({{"kind", "grad"}}).Set(static_cast<double>(sum.grad));
  host_store_bytes_->Add({{"kind", "exp_avg"}}).Set(static_cast<double>(sum.exp_avg));
  host_store_bytes_->Add({{"kind", "exp_avg_sq"}}).Set(static_cast<double>(sum.exp_avg_sq));
  host_store_bytes_->Add({{"kind", "streaming"}}).Set(static_cast<double>(sum.streaming));
  host_store_bytes_->Add({{"kind", "staging"}}).Set(static_cast<double>(sum.staging));
  host_pinned_bytes_->Set(static_cast<double>(sum.pinned));
}

void ServerMetrics::SetHostMemory(int64_t budget_bytes, int64_t reserved_bytes) {
  host_memory_budget_bytes_->Set(static_cast<double>(budget_bytes));
  host_memory_reserved_bytes_->Set(static_cast<double>(reserved_bytes));
}

void ServerMetrics::SetJobCounts(const std::map<JobState, int64_t>& counts) {
  for (const auto& [state, count] : counts) {
    jobs_->Add({{"state", absl::AsciiStrToLower(JobStateName(state))}})
        .Set(static_cast<double>(count));
  }
  auto queued = counts.find(JobState::kQueued);
  queue_depth_->Set(queued == counts.end() ? 0 : static_cast<double>(queued->second));
}

void ServerMetrics::SetLinkBandwidth(const std::string& device, const LinkBandwidth& bandwidth) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    link_by_device_[device] = bandwidth;
  }
  pcie_link_bandwidth_->Add({{"device", device}, {"direction", "h2d"}})
      .Set(bandwidth.h2d_bytes_per_second);
  pcie_link_bandwidth_->Add({{"device", device}, {"direction", "d2h"}})
      .Set(bandwidth.d2h_bytes_per_second);
}

void ServerMetrics::SetPcieLinkModel(const std::string& device, const PcieLinkModel& model) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    link_model_by_device_[device] = model;
  }
  auto ratio = [&](const char* kind, double value) {
    pcie_link_model_ratio_->Add({{"device", device}, {"kind", kind}}).Set(value);
  };
  ratio("rx_per_h2d_byte", model.rx_per_h2d_byte);
  ratio("tx_per_h2d_byte", model.tx_per_h2d_byte);
  ratio("tx_per_d2h_byte", model.tx_per_d2h_byte);
  ratio("rx_per_d2h_byte", model.rx_per_d2h_byte);
  pcie_link_model_calibrated_->Add({{"device", device}}).Set(model.calibrated ? 1 : 0);
}

void ServerMetrics::SetGpuMemory(const std::string& device, int64_t used_bytes,
                                 int64_t total_bytes) {
  gpu_memory_used_->Add({{"device", device}}).Set(static_cast<double>(used_bytes));
  gpu_memory_total_->Add({{"device", device}}).Set(static_cast<double>(total_bytes));
}

void ServerMetrics::SetNvmlPcieThroughput(const std::string& device, double tx_bytes_per_second,
                                          double rx_bytes_per_second) {
  nvml_pcie_throughput_->Add({{"device", device}, {"direction", "tx"}}).Set(tx_bytes_per_second);
  nvml_pcie_throughput_->Add({{"device", device}, {"direction", "rx"}}).Set(rx_bytes_per_second);
}

void ServerMetrics::SetNvmlPcieBytes(const std::string& device, uint64_t tx_bytes,
                                     uint64_t rx_bytes, int64_t late_reads) {
  // Under mu_: two concurrent scrapes must not both add the same growth.
  std::lock_guard<std::mutex> lock(mu_);
  NvmlPcieTotals& last = nvml_pcie_by_device_[device];
  prometheus::Counter& tx = nvml_pcie_bytes_total_->Add({{"device", device}, {"direction", "tx"}});
  prometheus::Counter& rx = nvml_pcie_bytes_total_->Add({{"device", device}, {"direction", "rx"}});
  prometheus::Counter& late = nvml_pcie_counter_late_reads_total_->Add({{"device", device}});
  if (tx_bytes > last.tx_bytes) tx.Increment(static_cast<double>(tx_bytes - last.tx_bytes));
  if (rx_bytes > last.rx_bytes) rx.Increment(static_cast<double>(rx_bytes - last.rx_bytes));
  if (late_reads > last.late_reads)
    late.Increment(static_cast<double>(late_reads - last.late_reads));
  last.tx_bytes = std::max(last.tx_bytes, tx_bytes);
  last.rx_bytes = std::max(last.rx_bytes, rx_bytes);
  last.late_reads = std::max(last.late_reads, late_reads);
}

void ServerMetrics::SetWatchStreams(int streams) { watch_streams_->Set(streams); }

void ServerMetrics::RecordRpc(absl::string_view method, absl::StatusCode code, double seconds) {
  const std::string method_name(method);
  rpcs_total_->Add({{"method", method_name}, {"code", StatusCodeName(code)}}).Increment();
  static const Histogram::BucketBoundaries* const kRpcBuckets =
      new Histogram::BucketBoundaries(RpcBuckets());
  rpc_duration_seconds_->Add({{"method", method_name}}, *kRpcBuckets).Observe(seconds);
}

void ServerMetrics::SetPreCollectHook(std::function<void()> hook) {
  pre_collect_hook_ = std::move(hook);
}

std::vector<prometheus::MetricFamily> ServerMetrics::Collect() {
  if (pre_collect_hook_) pre_collect_hook_();
  return registry_->Collect();
}

std::string ServerMetrics::TextExposition() { return ToText(Collect()); }

std::string ServerMetrics::ToText(const std::vector<prometheus::MetricFamily>& families) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace megatrain::server
