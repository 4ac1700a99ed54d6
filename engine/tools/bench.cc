// The training benchmark behind megatrain-bench.
#include "engine/tools/bench.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/kernel_trace.h"
#include "engine/formats/hf_model.h"
#include "engine/fs/mapped_file.h"
#include "engine/job/step_options.h"
#include "engine/job/training_job.h"
#include "engine/model/moe_layout.h"
#include "engine/runtime/status_macros.h"
#include "engine/dist/data_parallel.h"
#include "engine/dist/gradient_shard.h"
#include "engine/step/trainer.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Random tokens; labels are the inputs shifted by one (next-token targets).
// `document_tokens` > 0: position ids of documents of that many tokens
// (BenchOptions::document_tokens).
MicroBatch RandomBatch(int64_t b, int64_t t, int64_t vocab, int64_t document_tokens,
                       std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  MicroBatch mb;
  for (int64_t row = 0; row < b; ++row) {
    std::vector<int32_t> seq(t + 1);
    for (int32_t& x : seq) x = token(rng);
    mb.input_ids.insert(mb.input_ids.end(), seq.begin(), seq.end() - 1);
    mb.labels.insert(mb.labels.end(), seq.begin() + 1, seq.end());
    for (int64_t i = 0; i < t && document_tokens > 0; ++i) {
      mb.position_ids.push_back(static_cast<int32_t>(i % document_tokens));
    }
  }
  return mb;
}

// --dist=env (Note [Replica processes] in dist/data_parallel.h): joins the
// job through torchrun's variables (60 s to reach the master).
absl::Status JoinBenchProcesses(const BenchOptions& o, DataParallelOptions* dp) {
  if (o.dist.empty()) return absl::OkStatus();
  if (o.dist != "env") {
    return absl::InvalidArgumentError(absl::StrCat("--dist: expected env, got '", o.dist, "'"));
  }
  return JoinFromTorchrunEnv(std::chrono::seconds(60), dp);
}

// The first device of this process's ranks: with --dist=env and a bare
// "cuda", process LOCAL_RANK of a host starts at cuda:LOCAL_RANK*devices
// (one process per host: LOCAL_RANK 0, cuda:0).
std::string BenchBaseDevice(const BenchOptions& o) {
  const char* local_rank = std::getenv("LOCAL_RANK");
  int local = 0;
  if (o.dist != "env" || o.device != "cuda" || local_rank == nullptr ||
      !absl::SimpleAtoi(local_rank, &local) || local <= 0) {
    return o.device;
  }
  return absl::StrCat("cuda:", local * std::max(o.devices, 1));
}

absl::StatusOr<ModelConfig> BenchModelConfig(const BenchOptions& o) {
  if (std::filesystem::is_directory(o.model)) {
    return LoadHfConfigFile(o.model + "/config.json");
  }
  return PresetConfig(o.model);
}

// The job the bench runs, as a JobSpec: its flags parsed once (errors
// name the flag), so that the trainer's options (StepOptionsOf) and the
// footprint (EstimateFootprintForConfig) read the same fields a job's do.
// The ranks of this process (--devices) are the spec's devices, each
// running --gradient_accumulation_steps micro-batches of a step. AdamW has
// AdamWOptions' betas and eps, --lr and no weight decay, under a constant
// LR schedule.
absl::StatusOr<JobSpec> BenchJobSpec(const BenchOptions& o) {
  if (o.data != "fixed" && o.data != "random") {
    return absl::InvalidArgumentError(
        absl::StrCat("--data: expected fixed or random, got '", o.data, "'"));
  }
  if (o.steps < 1 || o.warmup < 0 || o.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(
        "--steps must be >= 1, --warmup >= 0, --gradient_accumulation_steps >= 1");
  }
  JobSpec spec;
  TrainSpec& t = spec.train;
  t.micro_batch = o.micro_batch;
  t.seq_len = o.seq_len;
  t.devices = std::max(o.devices, 1);
  t.gradient_accumulation_steps = o.gradient_accumulation_steps * t.devices;
  t.max_steps = o.steps + o.warmup;
  MEGATRAIN_ASSIGN_OR_RETURN(t.compute_dtype,
                             ParseComputeDtype(o.compute_dtype, "--compute_dtype"));
  t.max_grad_norm = o.max_grad_norm;
  t.seed = o.seed;
  t.offload_activations = o.offload_activations;
  MEGATRAIN_ASSIGN_OR_RETURN(t.schedule, ParseStepSchedule(o.schedule, "--schedule"));
  t.wave = o.wave;
  MEGATRAIN_ASSIGN_OR_RETURN(t.activations,
                             ParseActivationPlacement(o.activations, "--activations"));
  t.cuda_graphs = CudaGraphsFromOption(o.cuda_graphs);
  MEGATRAIN_ASSIGN_OR_RETURN(
      t.fused_kernels, ParseKeyword(kFusedKernelsKeywords, o.fused_kernels, "--fused_kernels"));
  MEGATRAIN_ASSIGN_OR_RETURN(
      t.activation_checkpointing,
      ParseKeyword(kActivationCheckpointingKeywords, o.activation_checkpointing,
                   "--activation_checkpointing"));
  t.resident_layers = o.resident_layers;
  const AdamWOptions adamw;
  spec.optimizer.lr = o.lr;
  spec.optimizer.beta1 = adamw.beta1;
  spec.optimizer.beta2 = adamw.beta2;
  spec.optimizer.eps = adamw.eps;
  spec.optimizer.weight_decay = 0.0;
  spec.optimizer.schedule = LrScheduleKind::kConstant;
  MEGATRAIN_ASSIGN_OR_RETURN(spec.memory.weight_stream,
                             ParseWeightStream(o.weight_stream, "--weight_stream"));
  MEGATRAIN_ASSIGN_OR_RETURN(spec.memory.gradient_landing,
                             ParseGradientLanding(o.gradient_landing, "--gradient_landing"));
  if (o.nvme_tier == "moments") spec.memory.nvme_tier = NvmeTierMode::kMoments;
  return spec;
}

// The trainer's options of the bench's job (StepOptionsOf) with the knobs
// a job file does not have.
TrainerOptions BenchTrainerOptions(const BenchOptions& o, const JobSpec& spec) {
  TrainerOptions topt = StepOptionsOf(spec);
  topt.device = o.device;
  topt.gradient_accumulation_steps = o.gradient_accumulation_steps;  // per rank
  topt.threads = o.threads;
  topt.num_weight_slots = o.num_weight_slots;
  topt.optimizer_nice = o.optimizer_nice;
  topt.critical_threads = o.critical_threads;
  topt.optimizer_slice_elements = o.optimizer_slice_elements;
  topt.resident_embedding = o.resident_embedding;
  topt.device_grad_accumulation = o.device_grad_accumulation;
  topt.loss_chunk_tokens = o.loss_chunk_tokens;
  return topt;
}

// --nvme_tier moments: a fresh directory under --nvme_dir for the moment
// files, removed (with them) by the destructor through RemoveTree (nftw),
// never std::filesystem::remove_all (Note [No std::filesystem::remove_all]
// in fs/mapped_file.h: with pip's libtorch.so it jumped to address 0 after
// the last step of every tiered run on CUDA); null for --nvme_tier off.
// Destroy after the trainer, which holds the files open.
class BenchTierDir {
 public:
  static absl::StatusOr<std::unique_ptr<BenchTierDir>> Create(const BenchOptions& o) {
    if (o.nvme_tier == "off") return nullptr;
    if (o.nvme_tier != "moments") {
      return absl::InvalidArgumentError(
          absl::StrCat("--nvme_tier: expected off or moments, got '", o.nvme_tier, "'"));
    }
    if (o.nvme_dir.empty()) {
      return absl::InvalidArgumentError("--nvme_tier moments needs --nvme_dir");
    }
    std::string pattern = o.nvme_dir + "/megatrain-bench.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("--nvme_dir: cannot create ", pattern, ": ", std::strerror(errno)));
    }
    return std::unique_ptr<BenchTierDir>(new BenchTierDir(pattern));
  }
  ~BenchTierDir() {
    const absl::Status removed = RemoveTree(path_);
    if (!removed.ok()) std::fprintf(stderr, "megatrain-bench: %s\n", removed.ToString().c_str());
  }
  const std::string& path() const { return path_; }

 private:
  explicit BenchTierDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// The footprint's host bytes by kind (docs/operations.md "Sizing host
// memory"), beside what the run holds (host_bytes).
nlohmann::json FootprintJson(const MemoryFootprint& f) {
  const double params = static_cast<double>(std::max<int64_t>(1, f.params));
  return {{"master", f.host.master},
          {"grad", f.host.grad},
          {"exp_avg", f.host.exp_avg},
          {"exp_avg_sq", f.host.exp_avg_sq},
          {"streaming", f.host.streaming},
          {"staging", f.host.staging},
          {"gradient_ring", f.gradient_ring_bytes},
          {"lookahead", f.embedding_lookahead_bytes},
          {"total", f.host_total_bytes},
          {"bytes_per_param", static_cast<double>(f.host_total_bytes) / params},
          {"nvme", f.nvme_bytes}};
}

// The process's resident memory, from /proc/self/status (Linux; 0 where
// it cannot be read). VmRSS = RssAnon + RssFile + RssShmem: file pages are
// the mapped libraries (LibTorch's and CUDA's code, shared and clean);
// anonymous and shmem pages are memory the process allocated (the store,
// pinned staging, CUDA's and LibTorch's own).
struct ProcessMemory {
  int64_t rss_bytes = 0;        // VmRSS
  int64_t rss_peak_bytes = 0;   // VmHWM: the peak since the process started
  int64_t rss_anon_bytes = 0;   // RssAnon, now
  int64_t rss_file_bytes = 0;   // RssFile, now
  int64_t rss_shmem_bytes = 0;  // RssShmem, now
};

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (status >> key) {
    if (key == "VmRSS:" && status >> kib >> unit) m.rss_bytes = kib * 1024;
    if (key == "VmHWM:" && status >> kib >> unit) m.rss_peak_bytes = kib * 1024;
    if (key == "RssAnon:" && status >> kib >> unit) m.rss_anon_bytes = kib * 1024;
    if (key == "RssFile:" && status >> kib >> unit) m.rss_file_bytes = kib * 1024;
    if (key == "RssShmem:" && status >> kib >> unit) m.rss_shmem_bytes = kib * 1024;
  }
  return m;
}

// The measured steps' phase times, in seconds, one entry per step.
struct PhaseSamples {
  std::vector<double> step, h2d, compute, d2h, optimizer, exposed, gate, idle, grad_wait, drain;
  std::array<std::vector<double>, 4> gap;  // start, forward, head, backward

  void Add(const StepStats& s) {
    step.push_back(s.step_seconds);
    h2d.push_back(s.h2d_seconds);
    compute.push_back(s.compute_seconds);
    d2h.push_back(s.d2h_seconds);
    optimizer.push_back(s.optimizer_seconds);
    exposed.push_back(s.optimizer_exposed_seconds);
    gate.push_back(s.gate_wait_seconds);
    idle.push_back(s.gpu_idle_seconds);
    grad_wait.push_back(s.grad_wait_seconds);
    drain.push_back(s.drain_seconds);
    gap[0].push_back(s.gap_start_seconds);
    gap[1].push_back(s.gap_forward_seconds);
    gap[2].push_back(s.gap_head_seconds);
    gap[3].push_back(s.gap_backward_seconds);
  }
};

// One progress line per step (`step_idx` from 0; warmup steps marked).
void PrintStep(FILE* progress, int64_t step_idx, bool warmup, const StepResult& r,
               double flops_per_token) {
  const double tokens_per_s = r.stats.tokens / r.stats.step_seconds;
  std::fprintf(progress,
               "step %ld%s loss %.4f grad_norm %.3f | %.3f s, %.0f tokens/s, %.1f model TFLOP/s | "
               "h2d %.3f compute %.3f d2h %.3f optimizer %.3f (exposed %.3f, gates %.3f) idle %.3f "
               "grad-wait %.3f drain %.3f | gaps start %.3f fwd %.3f head %.3f bwd %.3f s | "
               "rows gated %ld lookahead %ld\n",
               static_cast<long>(step_idx + 1), warmup ? " (warmup)" : "", r.loss, r.grad_norm,
               r.stats.step_seconds, tokens_per_s, tokens_per_s * flops_per_token / 1e12,
               r.stats.h2d_seconds, r.stats.compute_seconds, r.stats.d2h_seconds,
               r.stats.optimizer_seconds, r.stats.optimizer_exposed_seconds,
               r.stats.gate_wait_seconds, r.stats.gpu_idle_seconds, r.stats.grad_wait_seconds,
               r.stats.drain_seconds, r.stats.gap_start_seconds, r.stats.gap_forward_seconds,
               r.stats.gap_head_seconds, r.stats.gap_backward_seconds,
               static_cast<long>(r.stats.gate_rows), static_cast<long>(r.stats.lookahead_rows));
  std::fflush(progress);
}

// What the run measured, beside the options.
struct BenchRun {
  PhaseSamples samples;
  StepStats last;  // of the last measured step
  // NVMe tier bytes reported by the measured steps, summed.
  int64_t nvme_read_bytes = 0;
  int64_t nvme_written_bytes = 0;
  double loss_first = 0;
  double loss_last = 0;
  // The largest RssAnon + RssShmem read after any step (warm-up included):
  // the memory the process allocated, without mapped library files.
  int64_t rss_allocated_peak_bytes = 0;
};

// The run's setup: options, the resolved trainer settings and `footprint`
// (EstimateFootprintForConfig of the run's job spec, computed once by the
// caller).
void AddSetupJson(const BenchOptions& o, const ModelConfig& config,
                  const MemoryFootprint& footprint, Trainer& trainer, const DataParallelTrainer* dp,
                  nlohmann::json* j) {
  (*j)["model"] = o.model;
  (*j)["params"] = config.ParamCount();
  // MoE: the parameters one token uses (k of E experts), what MFU counts.
  if (config.moe != nullptr) {
    (*j)["params_active"] = MoeActiveParamCount(MoeModelConfigOf(config));
  }
  (*j)["device"] = trainer.device_name();
  const ScheduleChoice& choice = trainer.schedule_choice();
  (*j)["schedule"] = StepScheduleName(choice.schedule);
  (*j)["wave"] = choice.wave;
  (*j)["activations"] = choice.offload_activations ? "host" : "device";
  (*j)["schedule_choice"] = choice.Describe();
  // Note [Auto resident layers] in step/schedule_choice.h: the device as
  // the choice planned it (0 on the CPU), beside peak_gpu_bytes.
  (*j)["device_plan"] = {{"total", choice.device_total_bytes},
                         {"planned", choice.planned_device_bytes()},
                         {"executor", choice.executor_device_bytes},
                         {"resident", choice.resident_bytes},
                         {"activations", choice.activation_device_bytes},
                         {"working", choice.working_bytes},
                         {"kept_graphs", choice.kept_graph_bytes},
                         {"margin", choice.margin_bytes}};
  (*j)["compute_dtype"] = o.compute_dtype;
  (*j)["micro_batch"] = o.micro_batch;
  (*j)["seq_len"] = o.seq_len;
  (*j)["document_tokens"] = o.document_tokens;
  (*j)["offload_activations"] = o.offload_activations;
  (*j)["optimizer_nice"] = o.optimizer_nice;
  (*j)["critical_threads"] = o.critical_threads;
  (*j)["embedding_lookahead"] = o.embedding_lookahead;
  (*j)["optimizer_slice_elements"] = o.optimizer_slice_elements;
  (*j)["resident_layers"] = trainer.resident_layers();
  (*j)["resident_embedding"] = trainer.resident_embedding();
  (*j)["device_grad_accumulation"] = trainer.device_grad_accumulation();
  (*j)["cuda_graphs"] = trainer.schedule_choice().cuda_graphs;
  (*j)["kept_graph_layers"] = trainer.schedule_choice().kept_graph_layers;
  (*j)["kept_graph_bytes"] = trainer.schedule_choice().kept_graph_bytes;
  (*j)["fused_kernels"] = trainer.options().fused_kernels;  // as resolved
  (*j)["gradient_accumulation_steps"] = o.gradient_accumulation_steps;
  (*j)["steps"] = o.steps;
  (*j)["max_grad_norm"] = o.max_grad_norm;
  (*j)["weight_stream"] = o.weight_stream;
  (*j)["gradient_ring"] = trainer.gradient_ring();
  // Data parallel: the shared store plus every rank's landing gradients.
  const HostStoreBytes host = dp != nullptr ? dp->host_bytes() : trainer.store().bytes();
  // The executor's staging plus, with the tier, its read/write buffers
  // (each data-parallel rank has its own of both).
  const int64_t ranks = dp != nullptr ? dp->world_size() : 1;
  const int64_t staging =
      ranks * (trainer.staging_host_bytes() +
               (trainer.nvme_moments() != nullptr ? NvmeTierStagingBytes() : 0));
  const int64_t total = host.Total() + staging;
  (*j)["host_bytes"] = {{"master", host.master},       {"grad", host.grad},
                        {"exp_avg", host.exp_avg},     {"exp_avg_sq", host.exp_avg_sq},
                        {"streaming", host.streaming}, {"staging", staging},
                        {"pinned", host.pinned},       {"total", total}};
  // The store and staging over the parameters (docs/operations.md's
  // sizing table), and the same over the process's measured memory.
  const double params = static_cast<double>(std::max<int64_t>(1, config.ParamCount()));
  (*j)["host_bytes_per_param"] = static_cast<double>(total) / params;
  const ProcessMemory rss = ReadProcessMemory();
  (*j)["rss_bytes"] = rss.rss_bytes;
  (*j)["rss_peak_bytes"] = rss.rss_peak_bytes;
  (*j)["rss_peak_bytes_per_param"] = static_cast<double>(rss.rss_peak_bytes) / params;
  (*j)["rss_anon_bytes"] = rss.rss_anon_bytes;
  (*j)["rss_file_bytes"] = rss.rss_file_bytes;
  (*j)["rss_shmem_bytes"] = rss.rss_shmem_bytes;
  // Admission's footprint of the bench's job (with --nvme_tier moments the
  // moments on NVMe), beside what the run holds.
  (*j)["footprint_host_bytes"] = footprint.host_total_bytes;
  (*j)["footprint"] = FootprintJson(footprint);
  (*j)["nvme_tier"] = o.nvme_tier;
  if (trainer.nvme_moments() != nullptr) (*j)["nvme_direct"] = trainer.nvme_moments()->direct();
}

// Medians of the measured steps, bytes and the link's use.
void AddTimingJson(const BenchRun& run, const absl::StatusOr<LinkBandwidthMeasurement>& link,
                   nlohmann::json* j) {
  const PhaseSamples& s = run.samples;
  (*j)["gate_rows"] = run.last.gate_rows;
  (*j)["cuda_graph_replays"] = run.last.cuda_graph_replays;  // in the last step
  (*j)["lookahead_rows"] = run.last.lookahead_rows;
  (*j)["loss_first"] = run.loss_first;
  (*j)["loss_last"] = run.loss_last;
  (*j)["h2d_seconds"] = Median(s.h2d);
  (*j)["compute_seconds"] = Median(s.compute);
  (*j)["d2h_seconds"] = Median(s.d2h);
  (*j)["optimizer_seconds"] = Median(s.optimizer);
  (*j)["optimizer_exposed_seconds"] = Median(s.exposed);
  (*j)["gate_wait_seconds"] = Median(s.gate);
  (*j)["gpu_idle_seconds"] = Median(s.idle);
  (*j)["grad_wait_seconds"] = Median(s.grad_wait);
  (*j)["drain_seconds"] = Median(s.drain);
  (*j)["compute_gap_seconds"] = {{"start", Median(s.gap[0])},
                                 {"forward", Median(s.gap[1])},
                                 {"head", Median(s.gap[2])},
                                 {"backward", Median(s.gap[3])}};
  const double h2d_median = Median(s.h2d);
  (*j)["h2d_bytes"] = run.last.h2d_bytes;
  (*j)["h2d_weight_bytes"] = run.last.h2d_weight_bytes;
  (*j)["d2h_bytes"] = run.last.d2h_bytes;
  (*j)["h2d_gb_per_s_busy"] = h2d_median > 0 ? run.last.h2d_bytes / h2d_median / 1e9 : 0.0;
  (*j)["peak_gpu_bytes"] = run.last.peak_device_bytes;
  (*j)["rss_allocated_peak_bytes"] = run.rss_allocated_peak_bytes;
  if (link.ok()) {
    (*j)["link_h2d_gb_per_s"] = link->h2d_bytes_per_second / 1e9;
    (*j)["link_d2h_gb_per_s"] = link->d2h_bytes_per_second / 1e9;
    // H2D bandwidth while the H2D stream was busy, over the link's.
    if (h2d_median > 0) {
      (*j)["h2d_link_utilization"] = run.last.h2d_bytes / h2d_median / link->h2d_bytes_per_second;
    }
  }
}

// Runs warmup + measured steps, one global batch ahead so that each step
// knows the next one's first micro-batch (Note [Embedding lookahead] in
// trainer.h).
// With o.devices > 1, `dp` runs the steps (global batches of devices x
// gradient_accumulation_steps micro-batches, no lookahead) and `trainer` is
// its rank 0.
absl::StatusOr<BenchRun> RunSteps(const BenchOptions& o, const ModelConfig& config,
                                  Trainer& trainer, DataParallelTrainer* dp, FILE* progress) {
  std::mt19937_64 rng(o.seed + 1);
  const int64_t global_micro_batches =
      o.gradient_accumulation_steps *
      (dp != nullptr ? dp->world_size() * dp->num_processes() : std::max(o.devices, 1));
  std::vector<MicroBatch> fixed;
  for (int64_t m = 0; m < global_micro_batches; ++m) {
    fixed.push_back(
        RandomBatch(o.micro_batch, o.seq_len, config.vocab_size, o.document_tokens, rng));
  }
  auto make_batches = [&]() {
    if (o.data != "random") return fixed;
    std::vector<MicroBatch> out;
    for (int64_t m = 0; m < global_micro_batches; ++m) {
      out.push_back(
          RandomBatch(o.micro_batch, o.seq_len, config.vocab_size, o.document_tokens, rng));
    }
    return out;
  };
  const double flops_per_token = config.TrainFlopsPerToken(o.seq_len);
  BenchRun run;
  std::vector<MicroBatch> batches = make_batches();
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    std::vector<MicroBatch> next;
    if (i + 1 < o.warmup + o.steps) next = make_batches();
    absl::Span<const int32_t> next_ids;
    if (o.embedding_lookahead && !next.empty()) next_ids = next.front().input_ids;
    const bool traced = !o.kernel_trace.empty() && i + 1 == o.warmup + o.steps;
    if (traced) MEGATRAIN_RETURN_IF_ERROR(StartKernelTrace());
    MEGATRAIN_ASSIGN_OR_RETURN(StepResult r,
                               dp != nullptr ? dp->Step(batches) : trainer.Step(batches, next_ids));
    if (traced) {
      MEGATRAIN_RETURN_IF_ERROR(dp != nullptr ? dp->WaitForOptimizer()
                                              : trainer.WaitForOptimizer());
      MEGATRAIN_RETURN_IF_ERROR(StopKernelTrace(o.kernel_trace));
    }
    batches = std::move(next);
    if (i == 0) run.loss_first = r.loss;
    run.loss_last = r.loss;
    const ProcessMemory mem = ReadProcessMemory();
    run.rss_allocated_peak_bytes =
        std::max(run.rss_allocated_peak_bytes, mem.rss_anon_bytes + mem.rss_shmem_bytes);
    PrintStep(progress, i, i < o.warmup, r, flops_per_token);
    if (i < o.warmup) continue;
    run.samples.Add(r.stats);
    run.last = r.stats;
    run.nvme_read_bytes += r.stats.nvme_read_bytes;
    run.nvme_written_bytes += r.stats.nvme_written_bytes;
  }
  MEGATRAIN_RETURN_IF_ERROR(dp != nullptr ? dp->WaitForOptimizer() : trainer.WaitForOptimizer());
  return run;
}

// Destroys what the run built, in order, with a progress line before each
// part and after the last: a crash in the teardown (GPU runs have no
// debugger) is then named by the last line printed. The trainer first
// (its destructor drains the optimizer queue and the device, and closes
// the tier's files), then the tier's directory.
void TearDown(FILE* progress, int64_t steps, std::unique_ptr<DataParallelTrainer> dp,
              std::unique_ptr<Trainer> single, std::unique_ptr<BenchTierDir> tier_dir) {
  std::fprintf(progress, "megatrain-bench: %ld steps done; teardown: trainer\n",
               static_cast<long>(steps));
  std::fflush(progress);
  dp.reset();
  single.reset();
  if (tier_dir != nullptr) {
    std::fprintf(progress, "megatrain-bench: teardown: NVMe tier directory %s\n",
                 tier_dir->path().c_str());
    std::fflush(progress);
    tier_dir.reset();
  }
  std::fprintf(progress, "megatrain-bench: teardown done\n");
  std::fflush(progress);
}

// RESOURCE_EXHAUSTED naming host memory when the run's footprint exceeds
// --host_memory_budget: refused before anything is allocated, never an
// out-of-memory kill.
absl::Status CheckHostMemoryBudget(const BenchOptions& o, const MemoryFootprint& footprint) {
  const int64_t need = footprint.host_total_bytes;
  if (o.host_memory_budget <= 0 || need <= o.host_memory_budget) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "host memory: the run needs %.1f GiB (the footprint: docs/operations.md, \"Sizing host "
      "memory\"), --host_memory_budget is %.1f GiB",
      need / 1073741824.0, o.host_memory_budget / 1073741824.0));
}

// Data parallel (docs/distributed.md): --devices ranks in this process (they
// share the cores), joined to the other processes' with --dist=env.
absl::StatusOr<std::unique_ptr<DataParallelTrainer>> CreateBenchDataParallel(
    const BenchOptions& o, const ModelConfig& config, TrainerOptions topt) {
  DataParallelOptions dpo;
  MEGATRAIN_ASSIGN_OR_RETURN(dpo.gradient_reduction,
                             ParseGradientReduction(o.gradient_reduction, "--gradient_reduction"));
  MEGATRAIN_RETURN_IF_ERROR(JoinBenchProcesses(o, &dpo));
  dpo.devices = DataParallelDevices(BenchBaseDevice(o), o.devices);
  dpo.shard_weights = o.shard_weights;
  dpo.peer_copies = o.peer_copies;
  dpo.timeout = std::chrono::seconds(o.collective_timeout_s);
  topt.gradient_accumulation_steps = o.gradient_accumulation_steps * o.devices * dpo.num_processes;
  return DataParallelTrainer::Create(config, topt, o.seed, dpo);
}

// The run's shape, device, schedule and data parallelism, once the
// trainer exists.
void PrintRunHeader(const BenchOptions& o, const ModelConfig& config, const Trainer& trainer,
                    const DataParallelTrainer* dp, FILE* progress) {
  std::fprintf(
      progress,
      "megatrain-bench: %s (%.3f B params) on %s, %s, micro_batch %ld x seq_len %ld x accum %ld\n",
      o.model.c_str(), config.ParamCount() / 1e9, trainer.device_name().c_str(),
      o.compute_dtype.c_str(), static_cast<long>(o.micro_batch), static_cast<long>(o.seq_len),
      static_cast<long>(o.gradient_accumulation_steps));
  std::fprintf(progress, "megatrain-bench: schedule %s\n",
               trainer.schedule_choice().Describe().c_str());
  if (dp != nullptr) {
    std::fprintf(progress,
                 "megatrain-bench: %d devices x %d processes, data parallel over %s, %s\n",
                 o.devices, dp->num_processes(), dp->backend_name().c_str(),
                 GradientReductionName(dp->gradient_reduction()));
  }
}

}  // namespace

absl::StatusOr<std::string> RunTrainingBenchmark(const BenchOptions& o) {
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig config, BenchModelConfig(o));
  MEGATRAIN_ASSIGN_OR_RETURN(const JobSpec spec, BenchJobSpec(o));
  const MemoryFootprint footprint = EstimateFootprintForConfig(spec, config);
  MEGATRAIN_RETURN_IF_ERROR(CheckHostMemoryBudget(o, footprint));
  FILE* progress = o.json ? stderr : stdout;
  // Before anything is allocated, so that a run the kernel stops while the
  // store fills still says what it was sizing.
  std::fprintf(progress, "megatrain-bench: footprint %s\n",
               DescribeHostBytesPerParam(footprint).c_str());
  std::fflush(progress);
  TrainerOptions topt = BenchTrainerOptions(o, spec);
  // The pinned copy bandwidth of the link, measured before the run (and
  // before the store pins its arenas), is the yardstick for H2D use.
  absl::StatusOr<LinkBandwidthMeasurement> link = MeasureLinkBandwidth(o.device);
  MEGATRAIN_ASSIGN_OR_RETURN(std::unique_ptr<BenchTierDir> tier_dir, BenchTierDir::Create(o));
  if (tier_dir != nullptr) topt.nvme_dir = tier_dir->path();
  std::unique_ptr<Trainer> single;
  std::unique_ptr<DataParallelTrainer> dp;
  if (o.devices > 1 || !o.dist.empty()) {
    // (--dist with --nvme_tier moments: each process its own directory and
    // replica of the moments; Note [Tier shards] in store/nvme_tier.h.)
    MEGATRAIN_ASSIGN_OR_RETURN(dp, CreateBenchDataParallel(o, config, topt));
  } else {
    MEGATRAIN_ASSIGN_OR_RETURN(single, Trainer::Create(config, topt, o.seed));
  }
  Trainer* trainer = dp != nullptr ? &dp->rank(0) : single.get();
  const bool hf_weights = std::filesystem::exists(o.model + "/model.safetensors") ||
                          std::filesystem::exists(o.model + "/model.safetensors.index.json");
  // Data parallel: into the shared host store (Note [Shared host store]).
  HostStore& store = dp != nullptr ? dp->store() : trainer->store();
  if (hf_weights) MEGATRAIN_RETURN_IF_ERROR(LoadHfWeights(o.model, &store));
  PrintRunHeader(o, config, *trainer, dp.get(), progress);
  MEGATRAIN_ASSIGN_OR_RETURN(BenchRun run, RunSteps(o, config, *trainer, dp.get(), progress));

  const double step_median = Median(run.samples.step);
  const int processes = dp != nullptr ? dp->num_processes() : 1;
  const double tokens =
      static_cast<double>(o.micro_batch * o.seq_len * o.gradient_accumulation_steps *
                          std::max(o.devices, 1) * processes);
  nlohmann::json j;
  AddSetupJson(o, config, footprint, *trainer, dp.get(), &j);
  j["devices"] = std::max(o.devices, 1);
  j["processes"] = processes;
  if (dp != nullptr) {
    j["gradient_reduction"] = GradientReductionName(dp->gradient_reduction());
    j["shard_weights"] = o.shard_weights;
    j["peer_copies"] = dp->peer_copies();
  }
  AddTimingJson(run, link, &j);
  j["tokens_per_s"] = tokens / step_median;
  j["step_seconds"] = step_median;
  if (tier_dir != nullptr) {
    j["nvme_read_bytes_per_step"] = run.nvme_read_bytes / o.steps;
    j["nvme_written_bytes_per_step"] = run.nvme_written_bytes / o.steps;
  }
  // MFU (bench.h): model FLOPs on the parameters a token uses (a MoE
  // model's active ones) over the devices' dense bf16 peak.
  const double model_tflops = tokens / step_median * config.TrainFlopsPerToken(o.seq_len) / 1e12;
  j["model_tflops"] = model_tflops;
  const double peak_tflops =
      o.peak_tflops > 0 ? o.peak_tflops : PeakBf16Flops(trainer->device_name()) / 1e12;
  if (peak_tflops > 0) {
    j["peak_tflops"] = peak_tflops;
    j["mfu"] = model_tflops / (peak_tflops * std::max(o.devices, 1) * processes);
    j["mfu_params"] = config.moe != nullptr ? "active" : "all";
  }
  TearDown(progress, o.warmup + o.steps, std::move(dp), std::move(single), std::move(tier_dir));
  return j.dump();
}

}  // namespace megatrain::engine
