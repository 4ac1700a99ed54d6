// ServerMetrics: every Prometheus metric family of the daemon, in one
// prometheus-cpp Registry, fed from the engine's plain stats snapshots
// (engine/runtime/stats.h: the engine never sees prometheus-cpp) and from the job
// manager, the RPC handlers and NVML.
//
// Families (prefix megatrain_, base units; labels of bounded cardinality
// only: `device` is one of the --device list, `method` one of the RPCs,
// `code` one of the 17 status codes; `job_id` only on the per-job series
// of running jobs, Note [Per-job series]; never a user):
//
//   megatrain_tokens_total                         counter   tokens trained
//   megatrain_steps_total                          counter   optimizer steps
//   megatrain_skipped_steps_total                  counter   non-finite steps skipped
//   megatrain_step_duration_seconds                histogram wall time per step
//   megatrain_nvme_bytes_total{direction=read|written}
//                                                  counter   NVMe tier moment-file bytes
//                                                            (the writes: SSD wear); made
//                                                            at the first tiered step
//   megatrain_phase_seconds_total{phase}           counter   h2d, compute, d2h,
//                                                            optimizer, optimizer_exposed,
//                                                            gpu_idle
//   megatrain_pcie_bytes_total{direction}          counter   h2d, d2h bytes copied
//   megatrain_pcie_bandwidth_bytes_per_second{device,direction}
//                                                  gauge     achieved in the latest step:
//                                                            bytes / busy seconds of the
//                                                            copy stream
//   megatrain_pcie_link_bandwidth_bytes_per_second{device,direction}
//                                                  gauge     measured at start-up
//   megatrain_pcie_utilization_ratio{device,direction}
//                                                  gauge     latest step: bytes /
//                                                            (step seconds x link
//                                                            bandwidth), [0, 1]
//   megatrain_nvml_pcie_bytes_total{device,direction=tx|rx}
//                                                  counter   NVML's PCIe byte counters
//                                                            (link level: payload and
//                                                            headers), from 0 at daemon
//                                                            start; compare its rate with
//                                                            megatrain_pcie_bytes_total's
//                                                            (Note [NVML PCIe counters])
//   megatrain_pcie_link_estimate_bytes_total{device,direction=tx|rx}
//                                                  counter   the engine's copies as link
//                                                            bytes (payload, headers, read
//                                                            requests): comparable with
//                                                            megatrain_nvml_pcie_bytes_total
//                                                            (Note [PCIe link model])
//   megatrain_pcie_link_model_ratio{device,kind}   gauge     the model's link bytes per
//                                                            payload byte: kind =
//                                                            rx_per_h2d_byte, ...
//   megatrain_pcie_link_model_calibrated{device}   gauge     1: measured at start-up,
//                                                            0: the defaults
//   megatrain_nvml_pcie_counter_late_reads_total{device}
//                                                  counter   reads of a 32-bit NVML byte
//                                                            counter late enough to have
//                                                            missed a wrap
//   megatrain_nvml_pcie_throughput_bytes_per_second{device,direction=tx|rx}
//                                                  gauge     NVML, one 20 ms window per
//                                                            scrape: not comparable with
//                                                            byte counters
//   megatrain_gpu_memory_used_bytes{device}        gauge     NVML
//   megatrain_gpu_memory_total_bytes{device}       gauge     NVML
//   megatrain_gpu_memory_peak_bytes{device}        gauge     engine, latest step
//   megatrain_host_store_bytes{kind}               gauge     running jobs' host model
//                                                            store: master, grad,
//                                                            exp_avg, exp_avg_sq,
//                                                            streaming, staging
//   megatrain_host_pinned_bytes                    gauge     of which page-locked
//   megatrain_host_memory_budget_bytes             gauge     --host_memory_budget
//   megatrain_host_memory_reserved_bytes           gauge     footprints of running jobs
//   megatrain_mfu_ratio{device}                    gauge     latest step, [0, 1]
//   megatrain_tokens_per_second{device}            gauge     latest step, this device's
//   megatrain_job_tokens_per_second{device}        gauge     latest step, the job's (all
//                                                            its devices), under its
//                                                            first device
//   megatrain_training_loss{device}                gauge     latest step
//   megatrain_training_aux_loss{device}            gauge     latest step, MoE aux loss
//   megatrain_eval_loss{device}                    gauge     latest eval of the job now
//                                                            on the device (removed when
//                                                            it ends)
//   megatrain_job_loss{job_id}                     gauge     Note [Per-job series]:
//   megatrain_job_eval_loss{job_id}                gauge     latest step's training loss,
//   megatrain_job_learning_rate{job_id}            gauge     latest eval loss, learning
//   megatrain_job_grad_norm{job_id}                gauge     rate, gradient norm (before
//   megatrain_job_step_tokens_per_second{job_id}   gauge     clipping), tokens/s
//   megatrain_jobs{state}                          gauge     jobs per state
//   megatrain_queue_depth                          gauge     QUEUED jobs
//   megatrain_checkpoint_duration_seconds          histogram time to write a checkpoint
//   megatrain_rpcs_total{method,code}              counter   finished RPCs
//   megatrain_rpc_duration_seconds{method}         histogram RPC latency
//   megatrain_watch_streams                        gauge     WatchJob streams open now
//   megatrain_build_info{version}                  gauge     always 1
//
// Note [Per-device metrics]
// A data-parallel job (train.devices N > 1) holds N devices. Each step
// sets megatrain_tokens_per_second{device} on each of them to that
// device's tokens/s (StepReport::device_tokens_per_s: the ranks train
// equal shares of the global batch in lockstep, so the N values are
// equal), and megatrain_mfu_ratio{device} on each to the per-device MFU;
// megatrain_job_tokens_per_second{device} under the job's first device is
// the job's total (N times a device's). Counters (tokens, steps, phases)
// count the job once: tokens the global batch's, phase seconds rank 0's
// (the first device's). The PCIe series are each device's own
// (StepReport::device_stats): megatrain_pcie_bytes_total sums every
// device's copies, and the bandwidth, utilization, link-estimate and peak
// device memory series carry each device's label. The loss and eval loss
// series are the first device's. sum(megatrain_tokens_per_second) is the
// daemon's throughput over every device. NVML's per-device series
// (megatrain_nvml_*, megatrain_gpu_memory_used_bytes) are sampled for
// every device, the job's or not, and give each GPU's own link traffic.
//
// Note [Per-job series]
// The megatrain_job_*{job_id} gauges are labelled with the job id so that a
// dashboard tells jobs apart (`job_id`, not `job`: Prometheus sets `job`
// and `instance` on every scraped series and would rename ours) (the {device} series pass from one
// job to the next). Their cardinality is bounded by the running jobs: a job's series appear at its
// first step (eval loss: first evaluation) and are removed when it stops running (RemoveJob: ended,
// suspended, preempted, failed), so at most (devices + CPU jobs) x 5 series exist at a time.
// History lives in Prometheus, not in the daemon; each job also writes its curves to its output_dir
// (server/core/job_scalars.h).
//
// Thread-safety: every method is thread-safe (prometheus-cpp metrics are
// atomic; the per-device maps have their own mutex).
#ifndef MEGATRAIN_SERVER_METRICS_H_
#define MEGATRAIN_SERVER_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/runtime/stats.h"
#include "engine/job/training_job.h"
#include "server/core/engine_backend.h"
#include "server/core/job.h"
#include "server/core/pcie_link_model.h"

namespace megatrain::server {

class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // One finished step of the job on `device`. Note [Not applicable on the
  // CPU]: a "cpu" device has no PCIe link and no bf16 peak, so its steps
  // add no PCIe series (megatrain_pcie_*: its "copies" are memcpys) and no
  // megatrain_mfu_ratio series; absent series, not zeros, say "not
  // applicable" (a CPU-only daemon exports none of them).
  void RecordStep(const std::string& device, const engine::StepReport& report);
  // One finished step of a job on `devices` (its train.devices, the first
  // naming its job-level series; Note [Per-device metrics]).
  void RecordStep(const std::vector<std::string>& devices, const engine::StepReport& report);
  // One evaluation of the job on `device`.
  void RecordEval(const std::string& device, double eval_loss);
  // Note [Per-job series]: one finished step / evaluation of job `job_id`
  // (a skipped step sets no loss).
  void RecordJobStep(const std::string& job_id, const engine::StepReport& report);
  void RecordJobEval(const std::string& job_id, double eval_loss);
  // Job `job_id` stopped running: removes its megatrain_job_*{job_id} series.
  void RemoveJob(const std::string& job_id);
  // One checkpoint written, taking `seconds`.
  void RecordCheckpoint(double seconds);

  // Host store of the job running on `device` (replaces the previous value).
  void SetHostStore(const std::string& device, const engine::HostStoreBytes& bytes);
  // The job on `device` ended: drops its host store and zeroes its
  // per-step gauges (loss, MFU, tokens/s, achieved bandwidth).
  void ClearDevice(const std::string& device);

  void SetHostMemory(int64_t budget_bytes, int64_t reserved_bytes);
  void SetJobCounts(const std::map<JobState, int64_t>& counts);
  void SetLinkBandwidth(const std::string& device, const LinkBandwidth& bandwidth);
  // The PCIe link model of `device` (replaces the defaults, which apply
  // to a device until this is called).
  void SetPcieLinkModel(const std::string& device, const PcieLinkModel& model);
  void SetGpuMemory(const std::string& device, int64_t used_bytes, int64_t total_bytes);
  void SetNvmlPcieThroughput(const std::string& device, double tx_bytes_per_second,
                             double rx_bytes_per_second);
  // NVML's PCIe byte totals of `device` (NvmlSample: cumulative, never
  // decreasing) and its late reads: the counters advance by the growth
  // since the previous call (the first call adds the whole totals).
  void SetNvmlPcieBytes(const std::string& device, uint64_t tx_bytes, uint64_t rx_bytes,
                        int64_t late_reads);

  // One finished RPC.
  void RecordRpc(absl::string_view method, absl::StatusCode code, double seconds);
  // WatchJob streams open now.
  void SetWatchStreams(int streams);

  // `hook` runs before every Collect() (e.g. to sample NVML). Set once,
  // before concurrent use.
  void SetPreCollectHook(std::function<void()> hook);

  // Runs the pre-collect hook and snapshots every family.
  std::vector<prometheus::MetricFamily> Collect();
  // Collect() in the Prometheus text format 0.0.4.
  std::string TextExposition();
  // Serialises `families` in the Prometheus text format 0.0.4.
  static std::string ToText(const std::vector<prometheus::MetricFamily>& families);

 private:
  // The constructor's steps: the families of each concern, registered in
  // `r` in the order of the exposition.
  void RegisterStepMetrics(prometheus::Registry& r);      // tokens, steps, phases
  void RegisterPcieMetrics(prometheus::Registry& r);      // copies, link, NVML
  void RegisterMemoryMetrics(prometheus::Registry& r);    // device and host memory
  void RegisterTrainingMetrics(prometheus::Registry& r);  // MFU, tokens/s, losses
  void RegisterServerMetrics(prometheus::Registry& r);    // jobs, RPCs, build info
  void UpdateHostStoreGaugesLocked();
  // RecordStep's PCIe series and peak device memory of `device`.
  void RecordLinkStep(const std::string& device, const engine::StepStats& stats);

  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> pre_collect_hook_;

  prometheus::Counter* tokens_total_;
  prometheus::Counter* steps_total_;
  prometheus::Counter* skipped_steps_total_;
  // megatrain_nvme_bytes_total, registered once by the first step that
  // moved tier bytes (NvmeBytesTotal()).
  prometheus::Family<prometheus::Counter>* NvmeBytesTotal();
  std::once_flag nvme_bytes_total_once_;
  prometheus::Family<prometheus::Counter>* nvme_bytes_total_ = nullptr;
  prometheus::Histogram* step_duration_seconds_;
  prometheus::Family<prometheus::Counter>* phase_seconds_total_;
  // megatrain_pcie_bytes_total{direction}; children made at the first GPU
  // step (Note [Not applicable on the CPU]).
  prometheus::Family<prometheus::Counter>* pcie_bytes_total_;
  prometheus::Family<prometheus::Gauge>* pcie_bandwidth_;
  prometheus::Family<prometheus::Gauge>* pcie_link_bandwidth_;
  prometheus::Family<prometheus::Gauge>* pcie_utilization_;
  prometheus::Family<prometheus::Gauge>* nvml_pcie_throughput_;
  prometheus::Family<prometheus::Counter>* nvml_pcie_bytes_total_;
  prometheus::Family<prometheus::Counter>* nvml_pcie_counter_late_reads_total_;
  prometheus::Family<prometheus::Counter>* pcie_link_estimate_bytes_total_;
  prometheus::Family<prometheus::Gauge>* pcie_link_model_ratio_;
  prometheus::Family<prometheus::Gauge>* pcie_link_model_calibrated_;
  prometheus::Family<prometheus::Gauge>* gpu_memory_used_;
  prometheus::Family<prometheus::Gauge>* gpu_memory_total_;
  prometheus::Family<prometheus::Gauge>* gpu_memory_peak_;
  prometheus::Family<prometheus::Gauge>* host_store_bytes_;
  prometheus::Gauge* host_pinned_bytes_;
  prometheus::Gauge* host_memory_budget_bytes_;
  prometheus::Gauge* host_memory_reserved_bytes_;
  prometheus::Family<prometheus::Gauge>* mfu_;
  prometheus::Family<prometheus::Gauge>* tokens_per_second_;
  prometheus::Family<prometheus::Gauge>* job_tokens_per_second_;
  prometheus::Family<prometheus::Gauge>* training_loss_;
  prometheus::Family<prometheus::Gauge>* training_aux_loss_;
  prometheus::Family<prometheus::Gauge>* eval_loss_;
  // Note [Per-job series].
  prometheus::Family<prometheus::Gauge>* job_loss_;
  prometheus::Family<prometheus::Gauge>* job_eval_loss_;
  prometheus::Family<prometheus::Gauge>* job_learning_rate_;
  prometheus::Family<prometheus::Gauge>* job_grad_norm_;
  prometheus::Family<prometheus::Gauge>* job_step_tokens_per_second_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Gauge* queue_depth_;
  prometheus::Histogram* checkpoint_duration_seconds_;
  prometheus::Family<prometheus::Counter>* rpcs_total_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_seconds_;
  prometheus::Gauge* watch_streams_;

  std::mutex mu_;
  std::map<std::string, engine::HostStoreBytes> host_store_by_device_;  // guarded by mu_
  std::map<std::string, LinkBandwidth> link_by_device_;                 // guarded by mu_
  std::map<std::string, PcieLinkModel> link_model_by_device_;           // guarded by mu_
  // The NVML totals last added to the counters, per device.
  struct NvmlPcieTotals {
    uint64_t tx_bytes = 0;
    uint64_t rx_bytes = 0;
    int64_t late_reads = 0;
  };
  std::map<std::string, NvmlPcieTotals> nvml_pcie_by_device_;  // guarded by mu_
};

// "OK", "INVALID_ARGUMENT", ... (the canonical code name).
std::string StatusCodeName(absl::StatusCode code);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_METRICS_H_
