// The trainer's choice of a step schedule (Note [Schedule choice] in
// schedule_choice.h).
#include "engine/step/schedule_choice.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/layers.h"
#include "engine/model/param_layout.h"
#include "engine/runtime/status_macros.h"
#include "engine/spec/job_spec.h"
#include "engine/step/executor.h"

namespace megatrain::engine {
namespace {

std::string Gigabytes(int64_t bytes) { return absl::StrFormat("%.1f GB", bytes / 1e9); }

}  // namespace

std::string ScheduleChoice::Describe() const {
  std::string out = StepScheduleName(schedule);
  if (schedule == StepSchedule::kLayerMajor) absl::StrAppend(&out, ", wave ", wave);
  absl::StrAppend(&out, ", activations ",
                  offload_activations ? "in pinned host memory" : "on the device");
  if (activation_budget_bytes > 0) {
    absl::StrAppend(&out, " (", Gigabytes(activation_device_bytes), " on the device of a ",
                    Gigabytes(activation_budget_bytes), " budget)");
  }
  if (cuda_graphs) absl::StrAppend(&out, ", CUDA graphs");
  if (kept_graph_layers > 0) {
    absl::StrAppend(&out, ", forward graphs of ", kept_graph_layers, " layers kept");
    if (kept_graph_bytes > 0) absl::StrAppend(&out, " (", Gigabytes(kept_graph_bytes), ")");
  }
  // On the CPU with nothing resident, nothing to say.
  if (device_total_bytes <= 0 && resident_layers == 0 && !resident_embedding) return out;
  absl::StrAppend(&out, "; resident: ", resident_layers, " layers",
                  resident_layers_forced ? " (resident_layers)" : " (auto)",
                  resident_embedding ? " and the embedding" : "");
  if (device_total_bytes > 0) {
    absl::StrAppend(&out, " (", Gigabytes(resident_bytes), "; ", Gigabytes(planned_device_bytes()),
                    " of ", Gigabytes(device_total_bytes), " planned)");
  }
  return out;
}

int64_t ScheduleChoice::planned_device_bytes() const {
  if (device_total_bytes <= 0) return 0;  // the CPU: nothing planned
  return executor_device_bytes + working_bytes + kept_graph_bytes +
         (activation_device_bytes - (offload_activations ? 2 * layer_input_bytes : 0));
}

namespace {

// Note [Kept layer graphs] in executor.h: dense models, activations on
// the device.
absl::Status CheckKeptGraphRequest(const ModelConfig& config, const ScheduleRequest& request) {
  if (request.kept_graph_layers < -1 || request.kept_graph_layers > config.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("kept_graph_layers: must be -1 (auto) or in [0, num_hidden_layers=",
                     config.num_hidden_layers, "], got ", request.kept_graph_layers));
  }
  if (request.kept_graph_layers > 0 && config.moe != nullptr) {
    return absl::InvalidArgumentError(
        "kept_graph_layers: mixture-of-experts layers are always recomputed in backward");
  }
  if (request.kept_graph_layers > 0 && request.activations == ActivationPlacement::kHost) {
    return absl::InvalidArgumentError(
        "kept_graph_layers: not with activations in host memory (a kept graph stays on the "
        "device)");
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const ModelConfig& config, const ScheduleRequest& request) {
  if (request.gradient_accumulation_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient_accumulation_steps: must be >= 1, got ", request.gradient_accumulation_steps));
  }
  if (request.wave < kWaveRange.min || request.wave > kWaveRange.max) {
    return absl::InvalidArgumentError(absl::StrCat("wave: must be in [", kWaveRange.min,
                                                   " (auto), ", kWaveRange.max, "], got ",
                                                   request.wave));
  }
  if (WaveContradictsSchedule(request.schedule, request.wave)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wave: ", request.wave, " micro-batches per wave needs the layer-major schedule"));
  }
  if (request.resident_layers < -1 || request.resident_layers > config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident_layers: must be -1 (auto) or in [0, num_hidden_layers=", config.num_hidden_layers,
        "], got ", request.resident_layers));
  }
  if (request.resident_embedding < -1 || request.resident_embedding > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident_embedding: must be -1 (auto), 0 or 1, got ", request.resident_embedding));
  }
  if (request.device_grad_accumulation < -1 || request.device_grad_accumulation > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_grad_accumulation: must be -1 (auto), 0 or 1, got ",
                     request.device_grad_accumulation));
  }
  if (request.cuda_graphs < -1 || request.cuda_graphs > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_graphs: must be -1 (auto), 0 or 1, got ", request.cuda_graphs));
  }
  return CheckKeptGraphRequest(config, request);
}

// Note [Schedule choice]: order, wave and activation placement, with the
// executor's buffers taking `executor_device_bytes` of the device.
void ChooseOrder(const ModelConfig& config, const ScheduleRequest& request,
                 int64_t layer_input_bytes, int64_t device_total_bytes,
                 int64_t executor_device_bytes, ScheduleChoice* choice) {
  const bool gpu = device_total_bytes > 0;
  const ScheduleOrder order = RequestedOrder(request, gpu);
  choice->schedule = order.schedule;
  const int64_t layers = config.num_hidden_layers;
  // Live activations of a wave of w (Note [Schedule choice]).
  auto kept = [&](int64_t w) { return w * (layers + 2) * layer_input_bytes; };
  auto offloaded = [&](int64_t w) { return (w * 3 + 2) * layer_input_bytes; };
  if (gpu) {
    choice->activation_budget_bytes = static_cast<int64_t>(
        kActivationBudgetFraction *
        static_cast<double>(std::max<int64_t>(0, device_total_bytes - executor_device_bytes)));
  }
  const int64_t budget = choice->activation_budget_bytes;
  int64_t wave = order.wave;
  const bool host = request.activations == ActivationPlacement::kHost;
  // Auto wave and placement: the largest wave whose activations fit on
  // the device (Note [Schedule choice]).
  if (gpu && request.wave == 0 && request.activations == ActivationPlacement::kAuto) {
    while (wave > 1 && kept(wave) > budget) --wave;
  }
  choice->wave = static_cast<int>(wave);
  choice->offload_activations = host && layers > 1;
  choice->activation_device_bytes = choice->offload_activations ? offloaded(wave) : kept(wave);
}

// Note [Schedule choice]: whether device gradient accumulation is on,
// with the first `resident_layers` layers on the device.
bool ChooseDeviceAccumulation(const ModelConfig& config, const ScheduleRequest& request,
                              const ScheduleChoice& choice, int64_t device_total_bytes) {
  if (request.device_grad_accumulation >= 0) return request.device_grad_accumulation == 1;
  const int64_t accumulation = request.gradient_accumulation_steps;
  const bool one_wave = choice.schedule == StepSchedule::kLayerMajor && choice.wave == accumulation;
  if (device_total_bytes <= 0 || accumulation == 1 || one_wave) return false;
  const ModelLayout layout = ModelLayout::Create(config);
  int64_t numel = 0;
  for (const int64_t block : layout.StreamedDenseBlocks(choice.resident_layers)) {
    numel += layout.blocks[block].numel;
  }
  return 4.0 * static_cast<double>(numel) <=
         kDeviceGradAccumulationMaxFraction * static_cast<double>(device_total_bytes);
}

// Whether the executor can keep `config`'s embedding resident (its checks
// in StreamingExecutor::Create): one [V, C] table.
bool EmbeddingCanBeResident(const ModelConfig& config) {
  const ModelLayout layout = ModelLayout::Create(config);
  const BlockLayout& emb = layout.blocks[layout.embedding_block()];
  return emb.params.size() == 1 && emb.params[0].shape.size() == 2 && emb.params[0].offset == 0;
}

// The executor's device bytes with `choice` (Note [Executor memory plan]).
ExecutorMemoryPlan PlanWith(const ModelConfig& config, const ExecutorOptions& executor,
                            const ScheduleChoice& choice) {
  return PlanExecutorMemory(config, WithChoice(executor, choice));
}

// KeptGraphBytes of one layer and micro-batch under `executor`: the fused
// kernels act only on bf16 (fp32 and tf32 keep the ATen ops whatever the
// option says, Note [Fused kernels]).
int64_t KeptGraphBytesOf(const ModelConfig& config, const ExecutorOptions& executor) {
  const bool bf16 = executor.compute_dtype == ComputeDtype::kBf16;
  return KeptGraphBytes(config, executor.micro_batch * executor.seq_len, bf16 ? 2 : 4,
                        bf16 && executor.fused_kernels);
}

// How many resident layers' graphs fit beside `choice`'s plan (Note [Auto
// resident layers]).
int64_t KeptGraphsThatFit(const ModelConfig& config, const ExecutorOptions& executor,
                          const ScheduleChoice& choice) {
  const int64_t per_layer = choice.wave * KeptGraphBytesOf(config, executor);
  if (per_layer <= 0) return 0;
  ScheduleChoice planned = choice;
  planned.kept_graph_bytes = 0;
  planned.executor_device_bytes = PlanWith(config, executor, choice).device_bytes();
  const int64_t left =
      choice.device_total_bytes - choice.margin_bytes - planned.planned_device_bytes();
  return std::clamp<int64_t>(left / per_layer, 0, choice.resident_layers);
}

// Whether auto may keep graphs for `config`: a GPU, dense layers whose
// attention is plain causal SDPA (KeptGraphBytes's bound: no soft-capping,
// whose kernel keeps blocks of scores, and no sliding layers, whose masked
// SDPA may keep the [T, T] probabilities), activations on the device and
// no CUDA graphs (Note [Auto resident layers]).
bool AutoKeepsGraphs(const ModelConfig& config, const ScheduleChoice& choice) {
  return choice.device_total_bytes > 0 && config.moe == nullptr &&
         config.attn_logit_softcapping <= 0 && !config.AnySlidingLayer() &&
         !choice.offload_activations && !choice.cuda_graphs;
}

// `choice` with every decoder layer resident, replanned micro-batch-major
// (Note [Auto resident layers]): one micro-batch of graphs per kept layer
// instead of a wave's.
ScheduleChoice AsMicroBatchMajor(const ModelConfig& config, const ScheduleRequest& request,
                                 const ExecutorOptions& executor, const ScheduleChoice& choice) {
  ScheduleRequest micro_batch_major = request;
  micro_batch_major.schedule = StepSchedule::kMicroBatchMajor;
  ScheduleChoice other = choice;
  ChooseOrder(config, micro_batch_major, other.layer_input_bytes, other.device_total_bytes,
              PlanWith(config, executor, other).device_bytes(), &other);
  other.device_grad_accumulation =
      ChooseDeviceAccumulation(config, request, other, other.device_total_bytes);
  return other;
}

// Note [Auto resident layers]: the resident layers whose forward graph is
// kept, with what the device has left after everything else (a forced
// count as asked, capped at the resident layers). With every decoder layer
// resident an auto layer-major order saves no link traffic, and its wave
// multiplies each kept layer's graphs: it turns micro-batch-major when that
// keeps more graphs.
void ChooseKeptGraphs(const ModelConfig& config, const ScheduleRequest& request,
                      const ExecutorOptions& executor, ScheduleChoice* choice) {
  int64_t kept = 0;
  if (request.kept_graph_layers >= 0) {
    kept = std::min<int64_t>(request.kept_graph_layers, choice->resident_layers);
  } else if (AutoKeepsGraphs(config, *choice)) {
    kept = KeptGraphsThatFit(config, executor, *choice);
    const bool may_reorder = !request.schedule.has_value() && request.wave == 0 &&
                             choice->schedule == StepSchedule::kLayerMajor &&
                             choice->resident_layers == config.num_hidden_layers &&
                             kept < choice->resident_layers;
    if (may_reorder) {
      const ScheduleChoice other = AsMicroBatchMajor(config, request, executor, *choice);
      const int64_t other_kept = KeptGraphsThatFit(config, executor, other);
      if (other_kept > kept) {
        *choice = other;
        kept = other_kept;
      }
    }
  }
  choice->kept_graph_layers = static_cast<int>(kept);
  choice->kept_graph_bytes =
      choice->device_total_bytes > 0 ? kept * choice->wave * KeptGraphBytesOf(config, executor) : 0;
}

}  // namespace

ScheduleOrder RequestedOrder(const ScheduleRequest& request, bool gpu) {
  const int64_t accumulation = request.gradient_accumulation_steps;
  // A wave asked for implies layer-major.
  const bool layer_major = (gpu && accumulation > 1) || request.wave > 0;
  ScheduleOrder order;
  order.schedule = request.schedule.value_or(layer_major ? StepSchedule::kLayerMajor
                                                         : StepSchedule::kMicroBatchMajor);
  if (order.schedule == StepSchedule::kLayerMajor) {
    order.wave = request.wave > 0 ? std::min<int64_t>(request.wave, accumulation) : accumulation;
  }
  return order;
}

ExecutorOptions WithChoice(const ExecutorOptions& executor, const ScheduleChoice& choice) {
  ExecutorOptions out = executor;
  out.schedule = choice.schedule;
  out.wave = choice.wave;
  out.offload_activations = choice.offload_activations;
  out.resident_layers = choice.resident_layers;
  out.resident_embedding = choice.resident_embedding;
  out.device_grad_accumulation = choice.device_grad_accumulation;
  out.cuda_graphs = choice.cuda_graphs;
  out.kept_graph_layers = choice.kept_graph_layers;
  return out;
}

absl::StatusOr<ScheduleChoice> ChooseSchedule(const ModelConfig& config,
                                              const ScheduleRequest& request,
                                              const ExecutorOptions& executor,
                                              int64_t device_total_bytes,
                                              const Cancellation& cancel) {
  MEGATRAIN_RETURN_IF_ERROR(CheckRequest(config, request));
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  const bool gpu = device_total_bytes > 0;
  ScheduleChoice choice;
  choice.layer_input_bytes = executor.micro_batch * executor.seq_len * config.hidden_size * 4;
  // The schedule, with only the forced resident blocks (Note [Auto
  // resident layers]: the saved inputs come before auto's resident ones).
  choice.resident_layers = std::max(0, request.resident_layers);
  choice.resident_layers_forced = request.resident_layers >= 0;
  choice.resident_embedding = request.resident_embedding == 1;
  choice.device_grad_accumulation = request.device_grad_accumulation == 1;
  choice.cuda_graphs =
      request.cuda_graphs == 1 || (request.cuda_graphs < 0 && gpu && config.moe == nullptr &&
                                   executor.micro_batch * executor.seq_len <= kCudaGraphMaxTokens);
  ChooseOrder(config, request, choice.layer_input_bytes, device_total_bytes,
              PlanWith(config, executor, choice).device_bytes(), &choice);
  choice.device_grad_accumulation =
      ChooseDeviceAccumulation(config, request, choice, device_total_bytes);
  if (gpu) {
    choice.device_total_bytes = device_total_bytes;
    choice.working_bytes =
        WorkingBytes(config, executor.compute_dtype, executor.micro_batch, executor.seq_len);
    choice.margin_bytes =
        kResidentMarginBytes +
        static_cast<int64_t>(kResidentMarginFraction * static_cast<double>(device_total_bytes));
    auto fits = [&](const ScheduleChoice& c) {
      ScheduleChoice planned = c;
      planned.executor_device_bytes = PlanWith(config, executor, c).device_bytes();
      return planned.planned_device_bytes() + c.margin_bytes <= device_total_bytes;
    };
    if (request.resident_embedding < 0 && EmbeddingCanBeResident(config)) {
      choice.resident_embedding = true;
      if (!fits(choice)) choice.resident_embedding = false;
    }
    if (request.resident_layers < 0) {
      // The most layers that fit. Device bytes grow with every resident
      // layer, so a binary search finds the same count as trying each from
      // the top, in O(L log L) rather than O(L^2) (each try plans all L
      // blocks; 4,096 layers took minutes).
      int fitting = 0;
      int lo = 1, hi = static_cast<int>(config.num_hidden_layers);
      while (lo <= hi) {
        MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
        const int mid = lo + (hi - lo) / 2;
        choice.resident_layers = mid;
        if (fits(choice)) {
          fitting = mid;
          lo = mid + 1;
        } else {
          hi = mid - 1;
        }
      }
      choice.resident_layers = fitting;
    }
  }
  ChooseKeptGraphs(config, request, executor, &choice);
  const ExecutorMemoryPlan plan = PlanWith(config, executor, choice);
  choice.executor_device_bytes = gpu ? plan.device_bytes() : 0;
  choice.resident_bytes = gpu ? plan.resident_bytes : 0;
  choice.grad_accumulation_bytes = gpu ? plan.grad_accumulation_bytes : 0;
  return choice;
}

absl::Status CheckForcedResidentLayersFit(const ModelConfig& config, const ScheduleRequest& request,
                                          const ExecutorOptions& executor,
                                          const ScheduleChoice& choice, absl::string_view field,
                                          const Cancellation& cancel) {
  const int64_t device = choice.device_total_bytes;
  if (request.resident_layers < 0 || device <= 0 || choice.executor_device_bytes <= device) {
    return absl::OkStatus();
  }
  // What auto keeps on this device, for the message.
  ScheduleRequest auto_request = request;
  auto_request.resident_layers = -1;
  const absl::StatusOr<ScheduleChoice> auto_choice =
      ChooseSchedule(config, auto_request, executor, device, cancel);
  MEGATRAIN_RETURN_IF_ERROR(cancel.Check());
  return absl::ResourceExhaustedError(absl::StrCat(
      field, ": ", choice.resident_layers, " resident decoder layers need ",
      Gigabytes(choice.executor_device_bytes),
      " of device memory for the executor's buffers alone (", Gigabytes(choice.resident_bytes),
      " of them resident blocks) > the device's ", Gigabytes(device), "; it can never run there",
      auto_choice.ok()
          ? absl::StrCat(" (auto keeps ", auto_choice->resident_layers, " layers on this device)")
          : ""));
}

}  // namespace megatrain::engine
