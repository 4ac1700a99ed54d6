// Job plans (plan.h): tiers, fit and the projected step time.
#include "engine/job/plan.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/job/step_options.h"
#include "engine/model/param_layout.h"
#include "engine/runtime/status_macros.h"
#include "engine/step/executor.h"
#include "engine/step/trainer.h"

namespace megatrain::engine {
namespace {

std::string Bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e12) return absl::StrFormat("%.2f TB", b / 1e12);
  return absl::StrFormat("%.1f GB", b / 1e9);
}

absl::Status CheckMachine(const PlanMachine& m) {
  const std::pair<const char*, double> fields[] = {
      {"host_memory_bytes", static_cast<double>(m.host_memory_bytes)},
      {"nvme_bytes", static_cast<double>(m.nvme_bytes)},
      {"gpu_memory_bytes", static_cast<double>(m.gpu_memory_bytes)},
      {"h2d_bytes_per_second", m.h2d_bytes_per_second},
      {"d2h_bytes_per_second", m.d2h_bytes_per_second},
      {"matmul_flops_per_second", m.matmul_flops_per_second},
      {"adamw_params_per_second", m.adamw_params_per_second},
      {"nvme_read_bytes_per_second", m.nvme_read_bytes_per_second},
      {"nvme_write_bytes_per_second", m.nvme_write_bytes_per_second}};
  for (const auto& [name, value] : fields) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("machine.", name, ": must be finite and >= 0, got ", value));
    }
  }
  return absl::OkStatus();
}

// seconds = amount / rate, 0 when the rate is unknown (0).
double Over(double amount, double rate) { return rate > 0 ? amount / rate : 0.0; }

StepProjection Project(const JobSpec& spec, const ModelConfig& config, const JobPlan& plan,
                       const PlanMachine& m, const ScheduleChoice& choice) {
  StepProjection p;
  const ModelLayout layout = ModelLayout::Create(config);
  const int64_t micro_batches = spec.train.gradient_accumulation_steps;
  p.tokens = spec.train.micro_batch * spec.train.seq_len * micro_batches;
  // Data parallelism (Note [Plan projection]): each GPU's share.
  const int64_t ranks = std::max<int64_t>(1, spec.train.devices);
  const double share = 1.0 / static_cast<double>(ranks);
  const int64_t rank_micro_batches = std::max<int64_t>(1, micro_batches / ranks);
  const double n = static_cast<double>(plan.params);
  const double attention = 12.0 * static_cast<double>(config.num_hidden_layers) *
                           static_cast<double>(config.num_attention_heads * config.head_dim) *
                           static_cast<double>(spec.train.seq_len);
  p.model_flops = (6.0 * n + attention) * static_cast<double>(p.tokens);
  // Layers whose forward graph is kept are not recomputed (Note [Kept
  // layer graphs] in step/executor.h).
  double kept_numel = 0;
  for (int64_t l = 0; l < choice.kept_graph_layers; ++l) {
    kept_numel += static_cast<double>(layout.blocks[layout.layer_block(l)].numel);
  }
  const double hardware_flops =
      (8.0 * n - 2.0 * kept_numel + attention) * static_cast<double>(p.tokens);
  p.compute_seconds = Over(hardware_flops * share, m.matmul_flops_per_second * kPlanMatmulFraction);
  // The blocks that stream, with the trainer's choices on this device
  // (Note [Auto resident layers] in step/schedule_choice.h).
  double streamed_numel = 0;
  for (const int64_t block : layout.StreamedDenseBlocks(choice.resident_layers)) {
    streamed_numel += static_cast<double>(layout.blocks[block].numel);
  }
  const double embedding_numel = static_cast<double>(layout.blocks[layout.embedding_block()].numel);
  if (config.tie_word_embeddings && !choice.resident_embedding) streamed_numel += embedding_numel;
  // Weights cross twice per wave (Note [Layer-major schedule]).
  const double passes =
      choice.schedule == StepSchedule::kLayerMajor
          ? static_cast<double>((rank_micro_batches + choice.wave - 1) / choice.wave)
          : static_cast<double>(rank_micro_batches);
  // Bytes per streamed weight: bf16 (the copy, or the host cast), or the
  // fp32 master (fp32 and tf32 compute, or memory.weight_stream fp32: Note
  // [Weight streaming]).
  const double esize = spec.train.compute_dtype == ComputeDtype::kBf16
                           ? WeightStreamH2dBytesPerParam(spec.memory.weight_stream)
                           : 4.0;
  // With N GPUs each loads 1/N of a streamed block and lands 1/N of its
  // gradient (Notes [Sharded weight streaming], [Shard landing]).
  p.h2d_seconds = Over(passes * 2.0 * esize * streamed_numel * share, m.h2d_bytes_per_second);
  p.d2h_seconds = Over(
      (choice.device_grad_accumulation || ranks > 1 ? 1 : passes) * 4.0 * streamed_numel * share,
      m.d2h_bytes_per_second);
  // The CPU AdamW updates what is not resident.
  double resident_numel = choice.resident_embedding ? embedding_numel : 0.0;
  for (int64_t l = 0; l < choice.resident_layers; ++l) {
    resident_numel += static_cast<double>(layout.blocks[layout.layer_block(l)].numel);
  }
  p.adamw_seconds = Over(std::max(0.0, n - resident_numel), m.adamw_params_per_second);
  const double nvme = static_cast<double>(plan.footprint.nvme_bytes);
  p.nvme_seconds =
      Over(nvme, m.nvme_read_bytes_per_second) + Over(nvme, m.nvme_write_bytes_per_second);
  const std::pair<const char*, double> terms[] = {{"compute", p.compute_seconds},
                                                  {"h2d", p.h2d_seconds},
                                                  {"d2h", p.d2h_seconds},
                                                  {"adamw", p.adamw_seconds},
                                                  {"nvme", p.nvme_seconds}};
  double longest = -1;
  for (const auto& [name, seconds] : terms) {
    if (seconds > longest) {
      longest = seconds;
      p.bound = name;
    }
  }
  p.step_seconds = longest + kPlanStepOverheadSeconds;
  p.tokens_per_second = static_cast<double>(p.tokens) / p.step_seconds;
  p.mfu = Over(p.model_flops * share / p.step_seconds, m.matmul_flops_per_second);
  return p;
}

// The trainer's schedule and resident blocks for `spec` on a device of
// `gpu_bytes` (0: unknown; then the floor of Note [Auto resident layers]
// for the projection): the same ChooseSchedule call as Trainer::Create's,
// on the same options (StepOptionsOf).
absl::StatusOr<ScheduleChoice> TrainerChoice(const JobSpec& spec, const ModelConfig& config,
                                             int64_t gpu_bytes, const Cancellation& cancel,
                                             std::string* resident_shortfall = nullptr) {
  const TrainerOptions options = StepOptionsOf(spec);
  const ScheduleRequest request = ScheduleRequestOf(options);
  const ExecutorOptions executor = ExecutorOptionsOf(options);
  MEGATRAIN_ASSIGN_OR_RETURN(ScheduleChoice choice,
                             ChooseSchedule(config, request, executor, gpu_bytes, cancel));
  // The trainer's refusal of a forced count that can never fit, as the
  // plan's reason.
  const absl::Status fit = CheckForcedResidentLayersFit(config, request, executor, choice,
                                                        "train.resident_layers", cancel);
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  if (!fit.ok() && resident_shortfall != nullptr) *resident_shortfall = std::string(fit.message());
  if (gpu_bytes <= 0) {
    choice.resident_layers =
        ResolveResidentLayers(config, static_cast<int>(spec.train.resident_layers), /*cuda=*/true);
  }
  return choice;
}

// `f` with the device bytes of `choice` (its plan, saved inputs and
// working set: Note [Auto resident layers]); host bytes do not change
// (the store keeps every block).
MemoryFootprint ForDevice(const MemoryFootprint& f, const ScheduleChoice& choice) {
  if (choice.device_total_bytes <= 0) return f;
  MemoryFootprint out = f;
  out.device_estimate_bytes = choice.planned_device_bytes();
  out.device_resident_bytes = choice.resident_bytes + choice.grad_accumulation_bytes;
  return out;
}

TierBytes TiersOf(const MemoryFootprint& f) {
  TierBytes t;
  t.host_bytes = f.host_total_bytes;
  t.pinned_bytes = f.host.pinned + f.host.staging;
  t.device_bytes = f.device_estimate_bytes;
  t.nvme_bytes = f.nvme_bytes;
  return t;
}

// Why `f` does not fit `m` ("" when it does).
std::string Shortfall(const MemoryFootprint& f, const PlanMachine& m) {
  std::vector<std::string> over;
  if (f.host_total_bytes > m.host_memory_bytes) {
    over.push_back(
        absl::StrCat("host ", Bytes(f.host_total_bytes), " > ", Bytes(m.host_memory_bytes)));
  }
  if (m.gpu_memory_bytes > 0 && f.device_estimate_bytes > m.gpu_memory_bytes) {
    over.push_back(absl::StrCat("device ", Bytes(f.device_estimate_bytes), " > ",
                                Bytes(m.gpu_memory_bytes), " (try a smaller micro_batch)"));
  }
  if (f.nvme_bytes > m.nvme_bytes) {
    over.push_back(
        absl::StrCat("NVMe ", Bytes(f.nvme_bytes), " > ",
                     m.nvme_bytes > 0 ? Bytes(m.nvme_bytes) : std::string("0 (no NVMe tier)")));
  }
  std::string text;
  for (const std::string& s : over) absl::StrAppend(&text, text.empty() ? "" : ", ", s);
  return text;
}

// Note [No expert-group sub-blocks]: a decoder layer streams as one block
// (a MoE layer with all its experts), so the device needs at least its
// weight slots (compute dtype) and gradient slots (fp32) of the largest
// block (MemoryFootprint::block_slot_bytes). When those alone exceed the
// device, no micro_batch helps: the reason names the layer, its parameters
// and both byte counts ("" when they fit or the device is unknown), and
// the daemon refuses such a job at submission with the same check
// (CheckBlockSlotsFitDevice). docs/architecture.md lists the released
// models' per-layer sizes.
std::string LayerSlotShortfall(const MemoryFootprint& f, const PlanMachine& m) {
  const absl::Status fits = CheckBlockSlotsFitDevice(f, m.gpu_memory_bytes, "memory");
  return fits.ok() ? "" : std::string(fits.message());
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec, const ModelConfig& config,
                                const PlanMachine& machine, const Cancellation& cancel) {
  MEGATRAIN_RETURN_IF_ERROR(CheckMachine(machine));
  MEGATRAIN_RETURN_IF_ERROR(config.Validate());
  JobSpec in_ram = spec;
  in_ram.memory.nvme_tier = NvmeTierMode::kOff;
  std::string resident_short;
  MEGATRAIN_ASSIGN_OR_RETURN(
      const ScheduleChoice choice,
      TrainerChoice(spec, config, machine.gpu_memory_bytes, cancel, &resident_short));
  // Note [Schedule choice] in step/schedule_choice.h: the saved layer
  // inputs the trainer moves to pinned host memory, in its wave, count on
  // the host.
  if (choice.offload_activations) in_ram.train.activations = ActivationPlacement::kHost;
  if (choice.schedule == StepSchedule::kLayerMajor) in_ram.train.wave = choice.wave;
  MEGATRAIN_ASSIGN_OR_RETURN(const MemoryFootprint in_ram_footprint,
                             EstimateFootprintForConfig(in_ram, config, cancel));
  const MemoryFootprint ram = ForDevice(in_ram_footprint, choice);
  const MemoryFootprint tiered = WithNvmeMoments(ram, config, spec.train.devices);
  JobPlan plan;
  plan.params = ram.params;
  plan.devices = std::max<int64_t>(1, spec.train.devices);
  const std::string ram_short = Shortfall(ram, machine);
  const std::string tiered_short = Shortfall(tiered, machine);
  switch (spec.memory.nvme_tier) {
    case NvmeTierMode::kOff:
      plan.nvme_tier = NvmeTierMode::kOff;
      break;
    case NvmeTierMode::kMoments:
      plan.nvme_tier = NvmeTierMode::kMoments;
      break;
    case NvmeTierMode::kAuto:
      // Only for the host: the tier moves nothing off the device.
      plan.nvme_tier = ram.host_total_bytes > machine.host_memory_bytes &&
                               tiered.host_total_bytes <= machine.host_memory_bytes &&
                               tiered.nvme_bytes <= machine.nvme_bytes
                           ? NvmeTierMode::kMoments
                           : NvmeTierMode::kOff;
      break;
  }
  const bool tier = plan.nvme_tier == NvmeTierMode::kMoments;
  plan.footprint = tier ? tiered : ram;
  plan.tiers = TiersOf(plan.footprint);
  std::string shortfall = tier ? tiered_short : ram_short;
  const std::string slot_short = LayerSlotShortfall(ram, machine);
  if (!slot_short.empty()) absl::StrAppend(&shortfall, shortfall.empty() ? "" : ", ", slot_short);
  if (!resident_short.empty()) {
    absl::StrAppend(&shortfall, shortfall.empty() ? "" : ", ", resident_short);
  }
  plan.fits = shortfall.empty();
  if (plan.fits) {
    plan.verdict = absl::StrCat(
        "fits: host ", Bytes(plan.footprint.host_total_bytes), " of ",
        Bytes(machine.host_memory_bytes),
        tier ? absl::StrCat(", AdamW moments on NVMe ", Bytes(plan.footprint.nvme_bytes), " of ",
                            Bytes(machine.nvme_bytes))
             : std::string(", everything in host memory"));
  } else {
    plan.verdict = absl::StrCat("does not fit: ", shortfall);
    // What the tier would need: the shortfall with NVMe enough for it.
    PlanMachine with_nvme = machine;
    with_nvme.nvme_bytes = std::max(machine.nvme_bytes, tiered.nvme_bytes);
    if (!tier && Shortfall(tiered, with_nvme).empty()) {
      absl::StrAppend(&plan.verdict, "; fits with memory.nvme_tier: moments (host ",
                      Bytes(tiered.host_total_bytes), ", NVMe ", Bytes(tiered.nvme_bytes),
                      tiered_short.empty() ? ")" : " needed)");
    } else if (!tier) {
      absl::StrAppend(&plan.verdict, "; with the moments on NVMe still: ", tiered_short);
    }
  }
  // The host bytes by kind, per parameter (docs/operations.md "Sizing host
  // memory"), for checking against megatrain-bench's measured host_bytes.
  absl::StrAppend(&plan.verdict, "; ", DescribeHostBytesPerParam(plan.footprint));
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  plan.projection = Project(spec, config, plan, machine, choice);
  return plan;
}

absl::StatusOr<JobPlan> PlanJobForModel(const PlanModel& model, const JobSpec& spec,
                                        const PlanMachine& machine, const Cancellation& cancel) {
  const int sources = !model.preset.empty() + !model.hf_config_json.empty() + !model.family.empty();
  if (sources != 1) {
    return absl::InvalidArgumentError(
        "model: set exactly one of model.preset, hf_config_json and family with param_count");
  }
  absl::StatusOr<ModelConfig> config = !model.preset.empty() ? PresetConfig(model.preset)
                                       : !model.hf_config_json.empty()
                                           ? ParseHfConfig(model.hf_config_json, "hf_config_json")
                                           : ConfigForParamCount(model.family, model.param_count);
  MEGATRAIN_RETURN_IF_ERROR(config.status());
  // The job's own checks of the fields a plan reads; the rest stand in.
  JobSpec checked = spec;
  checked.model = ModelSource{"tiny", ""};
  checked.data = DataSpec{};
  checked.data.tokens = "plan";
  checked.train.max_steps = 1;
  checked.train.max_tokens = 0;
  checked.optimizer.warmup_steps = 0;
  MEGATRAIN_RETURN_IF_ERROR(ValidateJobSpec(checked));
  return PlanJob(spec, *config, machine, cancel);
}

absl::StatusOr<ModelConfig> ConfigForParamCount(absl::string_view family, double params) {
  if (family != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.family: unknown '", family, "' (known: llama)"));
  }
  if (!std::isfinite(params) || params < 1e8 || params > 1e13) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.param_count: must be in [1e8, 1e13], got ", params));
  }
  // Llama-3.1 8B, 70B and 405B (their config.json files): hidden,
  // intermediate, layers, heads.
  struct Shape {
    int64_t hidden, intermediate, layers, heads;
  };
  constexpr Shape kShapes[] = {
      {4096, 14336, 32, 32}, {8192, 28672, 80, 64}, {16384, 53248, 126, 128}};
  absl::StatusOr<ModelConfig> chosen;
  for (const Shape& s : kShapes) {
    absl::StatusOr<ModelConfig> c = PresetConfig("llama-8b");
    if (!c.ok()) return c.status();
    c->hidden_size = s.hidden;
    c->intermediate_size = s.intermediate;
    c->num_hidden_layers = s.layers;
    c->num_attention_heads = s.heads;
    c->head_dim = s.hidden / s.heads;
    if (!chosen.ok() || static_cast<double>(c->ParamCount()) <= params) chosen = *c;
  }
  ModelConfig c = *chosen;
  const double per_layer = static_cast<double>(c.LayerParamCount());
  const double outside = static_cast<double>(c.ParamCount()) - per_layer * c.num_hidden_layers;
  c.num_hidden_layers = std::max<int64_t>(1, std::llround((params - outside) / per_layer));
  // Rounding up may pass 1e13 by part of a layer: stay within Note [Model
  // bounds] (model_config.h).
  while (c.num_hidden_layers > 1 && c.ParamCount() > kMaxModelParams) --c.num_hidden_layers;
  return c;
}

}  // namespace megatrain::engine
