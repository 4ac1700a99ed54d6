// See step_options.h.
#include "engine/job/step_options.h"

#include "engine/model/fused_ops.h"

namespace megatrain::engine {

TrainerOptions StepOptionsOf(const JobSpec& spec) {
  const TrainSpec& train = spec.train;
  TrainerOptions t;
  t.compute_dtype = train.compute_dtype;
  t.micro_batch = train.micro_batch;
  t.seq_len = train.seq_len;
  t.gradient_accumulation_steps = train.gradient_accumulation_steps;
  t.adamw.lr = spec.optimizer.lr;
  t.adamw.beta1 = spec.optimizer.beta1;
  t.adamw.beta2 = spec.optimizer.beta2;
  t.adamw.eps = spec.optimizer.eps;
  t.adamw.weight_decay = spec.optimizer.weight_decay;
  t.schedule.kind = spec.optimizer.schedule;
  t.schedule.warmup_steps = spec.optimizer.warmup_steps;
  t.schedule.total_steps = MaxSteps(spec);
  t.schedule.min_lr_ratio = spec.optimizer.min_lr_ratio;
  t.max_grad_norm = train.max_grad_norm;
  t.nan_policy = train.nan_policy;
  t.offload_activations = train.offload_activations;
  t.step_schedule = train.schedule;
  t.wave = static_cast<int>(train.wave);
  t.activation_placement = train.activations;
  t.cuda_graphs = CudaGraphsOption(train.cuda_graphs);
  t.fused_kernels = FusedKernelsEnabled(train.fused_kernels, FusedKernelsCompiled());
  t.resident_layers = static_cast<int>(train.resident_layers);  // -1: auto
  t.kept_graph_layers = KeptGraphLayersOption(train.activation_checkpointing);
  t.weight_stream = spec.memory.weight_stream;
  t.gradient_landing = spec.memory.gradient_landing;
  return t;
}

absl::Status ValidateJobSpecForThisBuild(const JobSpec& spec) {
  SpecErrors errors;
  errors.Add(ValidateJobSpec(spec));
  if (spec.train.fused_kernels == FusedKernels::kOn && !FusedKernelsCompiled()) {
    errors.Add(absl::UnimplementedError(
        "train.fused_kernels: 'on' needs a CUDA build with the fused kernels (CMake "
        "MEGATRAIN_FUSED_KERNELS, on by default in CUDA builds); this build has none: use auto "
        "or off"));
  }
  return errors.ToStatus();
}

}  // namespace megatrain::engine
