// The one translation of a job spec into the step's options. A job's
// train.*, optimizer.* and memory.* fields reach the step through
// StepOptionsOf alone: the job's trainer (TrainingJob), the footprint
// (EstimateFootprint, which admission checks), the plan (PlanJob, with the
// trainer's own ChooseSchedule call) and megatrain-bench (which fills a
// JobSpec from its flags) all start from it, so that they cannot disagree
// about what a field means. docs/architecture.md ("Where to add a field")
// lists the files a new field takes.
//
// Thread-safety: a pure function.
#ifndef MEGATRAIN_ENGINE_JOB_STEP_OPTIONS_H_
#define MEGATRAIN_ENGINE_JOB_STEP_OPTIONS_H_

#include "absl/status/status.h"
#include "engine/spec/job_spec.h"
#include "engine/step/trainer.h"

namespace megatrain::engine {

// The trainer's options for `spec` (validated by ValidateJobSpec): batch
// shape, compute dtype, AdamW and its LR schedule (total_steps
// MaxSteps(spec)), clipping, NaN policy, the step schedule (order, wave,
// activations, CUDA graphs), micro-batches per step, resident layers,
// weight stream and gradient landing. What a job file does not say keeps
// TrainerOptions' defaults: the device, threads, abandon_step, the debug
// injection, the NVMe directory (the job's, made when it starts),
// resident_embedding and device_grad_accumulation (auto). The schedule
// request and the executor's options follow from the result
// (ScheduleRequestOf, ExecutorOptionsOf in engine/step/trainer.h).
TrainerOptions StepOptionsOf(const JobSpec& spec);

// ValidateJobSpec's errors and those of choices this build of the engine
// cannot run (the spec library is build-agnostic; the server links it
// without the engine): train.fused_kernels 'on' in a build without the
// fused kernels is UNIMPLEMENTED naming the field. Every error at once
// (SpecErrors: the first one's code).
absl::Status ValidateJobSpecForThisBuild(const JobSpec& spec);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_JOB_STEP_OPTIONS_H_
