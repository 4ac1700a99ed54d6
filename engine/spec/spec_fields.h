// The job spec's number and keyword fields, declared once (Note [Spec
// field table]). Header-only and free of includes: the validation and JSON
// of engine/spec/, the proto conversion of server/rpc/ and the YAML reader
// of client/ expand the same rows.
//
// Note [Spec field table]
// A field is a row here when it is a number with a range, or a keyword
// (an enum), and its YAML key, JSON key and proto field are the field's
// name with nothing of their own. Two kinds of row:
//
//   Number rows, X(name, kind, range, json, proto):
//     name   the member of the section's struct (TrainSpec, OptimizerSpec,
//            EvalSpec, CheckpointSpec), its proto field and its YAML/JSON key
//     kind   Int (int64) or Real (double)
//     range  its IntRange / RealRange constant in engine/spec/job_spec.h
//            (ValidateJobSpec: INVALID_ARGUMENT "train.wave: must be in
//            [0, 4096], got -1")
//     json   kPinned: always written (in the format job_spec_test pins);
//            kIfSet: written only when it differs from the default, so
//            that older readers keep reading a default spec
//     proto  Optional: an `optional` proto field, unset keeps the JobSpec
//            default; Plain: a plain proto3 field, read as it is (its
//            default, 0, is the JobSpec's)
//
//   Keyword rows, X(name, keywords, json):
//     name      as above; the member is an enum (or std::optional of one)
//     keywords  its table of {keyword, value} (engine/spec/keyword.h), beside
//               the enum (kStepScheduleKeywords in step_schedule.h): the
//               one spelling of the keywords, read by the proto conversion
//               (an optional proto string; unset or empty keeps the
//               default), JSON, YAML and the messages
//               ("train.cuda_graphs: must be auto, off or on, got 'yes'")
//     json      as above
//
// Each consumer expands a row in one line:
//   engine/spec/job_spec.cc       the range check; a keyword's enum value
//   engine/spec/job_spec_json.cc  the JSON writer and reader
//   server/rpc/proto_convert.cc   proto -> spec (has_name) and back
//   client/job_file.cc            the YAML key
// Rules between fields stay in one check each (CheckTrainDevices,
// CheckTrainSchedule, the global_batch rule of the proto conversion): they
// read the members, never re-spell the conversion.
// docs/architecture.md, "Where to add", lists the files a new field takes.
// The spec_field_table test (tests/docs/check_spec_field_table.py)
// refuses a row that a consumer also spells out by hand, and one
// docs/job-spec.md does not list.
#ifndef MEGATRAIN_ENGINE_SPEC_SPEC_FIELDS_H_
#define MEGATRAIN_ENGINE_SPEC_SPEC_FIELDS_H_

// train.* (TrainSpec, v1::TrainSpec).
#define MEGATRAIN_TRAIN_NUMBER_FIELDS(X)                                                  \
  X(micro_batch, Int, kMicroBatchRange, kPinned, Optional)                                \
  X(seq_len, Int, kSeqLenRange, kPinned, Optional)                                        \
  X(gradient_accumulation_steps, Int, kGradientAccumulationStepsRange, kPinned, Optional) \
  X(max_steps, Int, kMaxStepsRange, kPinned, Plain)                                       \
  X(max_tokens, Int, kMaxTokensRange, kPinned, Plain)                                     \
  X(max_grad_norm, Real, kMaxGradNormRange, kPinned, Optional)                            \
  X(wave, Int, kWaveRange, kIfSet, Optional)

#define MEGATRAIN_TRAIN_KEYWORD_FIELDS(X)              \
  X(schedule, kStepScheduleKeywords, kIfSet)           \
  X(activations, kActivationPlacementKeywords, kIfSet) \
  X(cuda_graphs, kCudaGraphsKeywords, kIfSet)          \
  X(fused_kernels, kFusedKernelsKeywords, kIfSet)      \
  X(activation_checkpointing, kActivationCheckpointingKeywords, kIfSet)

// optimizer.* (OptimizerSpec, v1::OptimizerSpec). warmup_steps is not a
// row: its bound is the run's length (CheckOptimizer).
#define MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(X)               \
  X(lr, Real, kLrRange, kPinned, Optional)                 \
  X(beta1, Real, kBeta1Range, kPinned, Optional)           \
  X(beta2, Real, kBeta2Range, kPinned, Optional)           \
  X(eps, Real, kEpsRange, kPinned, Optional)               \
  X(weight_decay, Real, kWeightDecayRange, kPinned, Plain) \
  X(min_lr_ratio, Real, kMinLrRatioRange, kPinned, Plain)

#define MEGATRAIN_OPTIMIZER_KEYWORD_FIELDS(X) X(schedule, kLrScheduleKindKeywords, kPinned)

// eval.* (EvalSpec, v1::EvalSpec).
#define MEGATRAIN_EVAL_NUMBER_FIELDS(X)                     \
  X(every_steps, Int, kEvalEveryStepsRange, kPinned, Plain) \
  X(batches, Int, kEvalBatchesRange, kPinned, Optional)

// checkpoint.* (CheckpointSpec, v1::CheckpointSpec): CheckCheckpointRetention
// checks them (the checkpoint writer too).
#define MEGATRAIN_CHECKPOINT_NUMBER_FIELDS(X)                     \
  X(every_steps, Int, kCheckpointEveryStepsRange, kPinned, Plain) \
  X(keep_last, Int, kCheckpointKeepLastRange, kPinned, Optional)  \
  X(keep_every, Int, kCheckpointKeepEveryRange, kPinned, Plain)

// memory.* (MemorySpec, v1::MemorySpec).
#define MEGATRAIN_MEMORY_KEYWORD_FIELDS(X)        \
  X(nvme_tier, kNvmeTierModeKeywords, kIfSet)     \
  X(weight_stream, kWeightStreamKeywords, kIfSet) \
  X(gradient_landing, kGradientLandingKeywords, kIfSet)

#endif  // MEGATRAIN_ENGINE_SPEC_SPEC_FIELDS_H_
