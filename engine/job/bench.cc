// The training benchmark behind megatrain-bench.
#include "engine/job/bench.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/device_info.h"
#include "engine/io/hf_model.h"
#include "engine/runtime/status_macros.h"
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
MicroBatch RandomBatch(int64_t b, int64_t t, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  MicroBatch mb;
  for (int64_t row = 0; row < b; ++row) {
    std::vector<int32_t> seq(t + 1);
    for (int32_t& x : seq) x = token(rng);
    mb.input_ids.insert(mb.input_ids.end(), seq.begin(), seq.end() - 1);
    mb.labels.insert(mb.labels.end(), seq.begin() + 1, seq.end());
  }
  return mb;
}

}  // namespace

absl::StatusOr<std::string> RunTrainingBenchmark(const BenchOptions& o) {
  ModelConfig config;
  if (std::filesystem::is_directory(o.model)) {
    MEGATRAIN_ASSIGN_OR_RETURN(config, LoadHfConfigFile(o.model + "/config.json"));
  } else {
    MEGATRAIN_ASSIGN_OR_RETURN(config, PresetConfig(o.model));
  }
  if (o.data != "fixed" && o.data != "random") {
    return absl::InvalidArgumentError(
        absl::StrCat("--data: expected fixed or random, got '", o.data, "'"));
  }
  if (o.steps < 1 || o.warmup < 0 || o.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(
        "--steps must be >= 1, --warmup >= 0, --gradient_accumulation_steps >= 1");
  }
  TrainerOptions topt;
  topt.device = o.device;
  MEGATRAIN_ASSIGN_OR_RETURN(topt.compute_dtype,
                             ParseComputeDtype(o.compute_dtype, "--compute_dtype"));
  topt.micro_batch = o.micro_batch;
  topt.seq_len = o.seq_len;
  topt.adamw.lr = o.lr;
  topt.adamw.weight_decay = 0.0;
  topt.schedule.kind = LrScheduleKind::kConstant;
  topt.schedule.total_steps = o.steps + o.warmup;
  topt.threads = o.threads;
  topt.max_grad_norm = o.max_grad_norm;
  topt.num_weight_slots = o.num_weight_slots;
  topt.offload_activations = o.offload_activations;
  topt.optimizer_nice = o.optimizer_nice;
  topt.critical_threads = o.critical_threads;
  topt.optimizer_slice_elements = o.optimizer_slice_elements;
  topt.resident_layers = o.resident_layers;
  topt.resident_embedding = o.resident_embedding;
  topt.device_grad_accumulation = o.device_grad_accumulation;
  MEGATRAIN_ASSIGN_OR_RETURN(topt.step_schedule, ParseStepSchedule(o.schedule, "--schedule"));
  topt.wave = o.wave;
  MEGATRAIN_ASSIGN_OR_RETURN(topt.activation_placement,
                             ParseActivationPlacement(o.activations, "--activations"));
  topt.gradient_accumulation_steps = o.gradient_accumulation_steps;
  // The pinned copy bandwidth of the link, measured before the run (and
  // before the store pins its arenas), is the yardstick for H2D use.
  absl::StatusOr<LinkBandwidthMeasurement> link = MeasureLinkBandwidth(o.device);
  MEGATRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                             Trainer::Create(config, topt, o.seed));
  const bool hf_weights = std::filesystem::exists(o.model + "/model.safetensors") ||
                          std::filesystem::exists(o.model + "/model.safetensors.index.json");
  if (hf_weights) MEGATRAIN_RETURN_IF_ERROR(LoadHfWeights(o.model, &trainer->store()));
  FILE* progress = o.json ? stderr : stdout;
  std::fprintf(
      progress,
      "megatrain-bench: %s (%.3f B params) on %s, %s, micro_batch %ld x seq_len %ld x accum %ld\n",
      o.model.c_str(), config.ParamCount() / 1e9, trainer->device_name().c_str(),
      o.compute_dtype.c_str(), static_cast<long>(o.micro_batch), static_cast<long>(o.seq_len),
      static_cast<long>(o.gradient_accumulation_steps));
  std::fprintf(progress, "megatrain-bench: schedule %s\n",
               trainer->schedule_choice().Describe().c_str());

  std::mt19937_64 rng(o.seed + 1);
  std::vector<MicroBatch> fixed;
  for (int64_t m = 0; m < o.gradient_accumulation_steps; ++m) {
    fixed.push_back(RandomBatch(o.micro_batch, o.seq_len, config.vocab_size, rng));
  }
  const double flops_per_token = config.TrainFlopsPerToken(o.seq_len);
  std::vector<double> step_s, h2d_s, compute_s, d2h_s, opt_s, exposed_s, gate_s, idle_s,
      grad_wait_s, drain_s;
  std::array<std::vector<double>, 4> gap_s;
  double loss_first = 0, loss_last = 0;
  StepStats last;
  auto make_batches = [&]() {
    if (o.data != "random") return fixed;
    std::vector<MicroBatch> out;
    for (int64_t m = 0; m < o.gradient_accumulation_steps; ++m) {
      out.push_back(RandomBatch(o.micro_batch, o.seq_len, config.vocab_size, rng));
    }
    return out;
  };
  // One global batch ahead, so that each step knows the next one's first
  // micro-batch (Note [Embedding lookahead] in trainer.h).
  std::vector<MicroBatch> batches = make_batches();
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    std::vector<MicroBatch> next;
    if (i + 1 < o.warmup + o.steps) next = make_batches();
    absl::Span<const int32_t> next_ids;
    if (o.embedding_lookahead && !next.empty()) next_ids = next.front().input_ids;
    MEGATRAIN_ASSIGN_OR_RETURN(StepResult r, trainer->Step(batches, next_ids));
    batches = std::move(next);
    if (i == 0) loss_first = r.loss;
    loss_last = r.loss;
    const double tokens_per_s = r.stats.tokens / r.stats.step_seconds;
    std::fprintf(
        progress,
        "step %ld%s loss %.4f grad_norm %.3f | %.3f s, %.0f tokens/s, %.1f model TFLOP/s | "
        "h2d %.3f compute %.3f d2h %.3f optimizer %.3f (exposed %.3f, gates %.3f) idle %.3f "
        "grad-wait %.3f drain %.3f | gaps start %.3f fwd %.3f head %.3f bwd %.3f s | "
        "rows gated %ld lookahead %ld\n",
        static_cast<long>(i + 1), i < o.warmup ? " (warmup)" : "", r.loss, r.grad_norm,
        r.stats.step_seconds, tokens_per_s, tokens_per_s * flops_per_token / 1e12,
        r.stats.h2d_seconds, r.stats.compute_seconds, r.stats.d2h_seconds,
        r.stats.optimizer_seconds, r.stats.optimizer_exposed_seconds, r.stats.gate_wait_seconds,
        r.stats.gpu_idle_seconds, r.stats.grad_wait_seconds, r.stats.drain_seconds,
        r.stats.gap_start_seconds, r.stats.gap_forward_seconds, r.stats.gap_head_seconds,
        r.stats.gap_backward_seconds, static_cast<long>(r.stats.gate_rows),
        static_cast<long>(r.stats.lookahead_rows));
    std::fflush(progress);
    if (i < o.warmup) continue;
    step_s.push_back(r.stats.step_seconds);
    h2d_s.push_back(r.stats.h2d_seconds);
    compute_s.push_back(r.stats.compute_seconds);
    d2h_s.push_back(r.stats.d2h_seconds);
    opt_s.push_back(r.stats.optimizer_seconds);
    exposed_s.push_back(r.stats.optimizer_exposed_seconds);
    gate_s.push_back(r.stats.gate_wait_seconds);
    idle_s.push_back(r.stats.gpu_idle_seconds);
    grad_wait_s.push_back(r.stats.grad_wait_seconds);
    drain_s.push_back(r.stats.drain_seconds);
    gap_s[0].push_back(r.stats.gap_start_seconds);
    gap_s[1].push_back(r.stats.gap_forward_seconds);
    gap_s[2].push_back(r.stats.gap_head_seconds);
    gap_s[3].push_back(r.stats.gap_backward_seconds);
    last = r.stats;
  }
  MEGATRAIN_RETURN_IF_ERROR(trainer->WaitForOptimizer());
  const double step_median = Median(step_s);
  const double tokens =
      static_cast<double>(o.micro_batch * o.seq_len * o.gradient_accumulation_steps);
  const HostStoreBytes host = trainer->store().bytes();
  nlohmann::json j;
  j["model"] = o.model;
  j["params"] = config.ParamCount();
  j["device"] = trainer->device_name();
  j["compute_dtype"] = o.compute_dtype;
  j["micro_batch"] = o.micro_batch;
  j["seq_len"] = o.seq_len;
  j["offload_activations"] = o.offload_activations;
  j["optimizer_nice"] = o.optimizer_nice;
  j["critical_threads"] = o.critical_threads;
  j["embedding_lookahead"] = o.embedding_lookahead;
  j["optimizer_slice_elements"] = o.optimizer_slice_elements;
  j["resident_layers"] = trainer->resident_layers();
  j["resident_embedding"] = trainer->resident_embedding();
  j["device_grad_accumulation"] = trainer->device_grad_accumulation();
  const ScheduleChoice& choice = trainer->schedule_choice();
  j["schedule"] = StepScheduleName(choice.schedule);
  j["wave"] = choice.wave;
  j["activations"] = choice.offload_activations ? "host" : "device";
  j["schedule_choice"] = choice.Describe();
  j["gate_rows"] = last.gate_rows;
  j["lookahead_rows"] = last.lookahead_rows;
  j["gradient_accumulation_steps"] = o.gradient_accumulation_steps;
  j["steps"] = o.steps;
  j["tokens_per_s"] = tokens / step_median;
  j["step_seconds"] = step_median;
  j["loss_first"] = loss_first;
  j["loss_last"] = loss_last;
  j["h2d_seconds"] = Median(h2d_s);
  j["compute_seconds"] = Median(compute_s);
  j["d2h_seconds"] = Median(d2h_s);
  j["optimizer_seconds"] = Median(opt_s);
  j["optimizer_exposed_seconds"] = Median(exposed_s);
  j["gate_wait_seconds"] = Median(gate_s);
  j["max_grad_norm"] = o.max_grad_norm;
  j["gpu_idle_seconds"] = Median(idle_s);
  j["grad_wait_seconds"] = Median(grad_wait_s);
  j["drain_seconds"] = Median(drain_s);
  j["compute_gap_seconds"] = {{"start", Median(gap_s[0])},
                              {"forward", Median(gap_s[1])},
                              {"head", Median(gap_s[2])},
                              {"backward", Median(gap_s[3])}};
  j["h2d_bytes"] = last.h2d_bytes;
  j["d2h_bytes"] = last.d2h_bytes;
  j["h2d_gb_per_s_busy"] = Median(h2d_s) > 0 ? last.h2d_bytes / Median(h2d_s) / 1e9 : 0.0;
  j["host_bytes"] = {
      {"master", host.master},       {"grad", host.grad},
      {"exp_avg", host.exp_avg},     {"exp_avg_sq", host.exp_avg_sq},
      {"streaming", host.streaming}, {"staging", trainer->staging_host_bytes()},
      {"pinned", host.pinned},       {"total", host.Total() + trainer->staging_host_bytes()}};
  j["peak_gpu_bytes"] = last.peak_device_bytes;
  if (link.ok()) {
    j["link_h2d_gb_per_s"] = link->h2d_bytes_per_second / 1e9;
    j["link_d2h_gb_per_s"] = link->d2h_bytes_per_second / 1e9;
    // H2D bandwidth while the H2D stream was busy, over the link's.
    if (Median(h2d_s) > 0) {
      j["h2d_link_utilization"] = last.h2d_bytes / Median(h2d_s) / link->h2d_bytes_per_second;
    }
  }
  const double model_tflops = tokens / step_median * flops_per_token / 1e12;
  j["model_tflops"] = model_tflops;
  if (o.peak_tflops > 0) j["mfu"] = model_tflops / o.peak_tflops;
  return j.dump();
}

}  // namespace megatrain::engine
