// The job spec's plain number fields, declared once (Note [Spec field
// table]). Header-only and free of includes: the validation and JSON of
// engine/spec/, the proto conversion of server/rpc/ and the YAML reader of
// client/ expand the same rows.
//
// Note [Spec field table]
// A field is a row here when it is a number with a range and nothing else:
// its proto field is `optional` (unset keeps the JobSpec default), its YAML
// key is the field's name, its only check is the range, and no rule ties
// it to another field's spelling. A row is
//   X(name, kind, range, json)
//     name   the member of the section's struct (TrainSpec, OptimizerSpec),
//            its proto field and its YAML/JSON key
//     kind   Int (int64) or Real (double)
//     range  its IntRange / RealRange constant in engine/spec/job_spec.h
//            (ValidateJobSpec: INVALID_ARGUMENT "train.wave: must be in
//            [0, 4096], got -1")
//     json   kPinned: always written (in the format job_spec_test pins);
//            kIfSet: written only when it differs from the default, so
//            that older readers keep reading a default spec
// Each consumer expands a row in one line:
//   engine/spec/job_spec.cc       the range check
//   engine/spec/job_spec_json.cc  the JSON writer and reader
//   server/rpc/proto_convert.cc   proto -> spec (has_name) and back
//   client/job_file.cc            the YAML key
// so a new train.* number field touches this table, the member (and its
// range) in job_spec.h, job.proto and, when the step reads it,
// TrainerOptions and StepOptionsOf: docs/architecture.md, "Where to add".
// The spec_field_table test (tests/docs/check_spec_field_table.py)
// refuses a row that a consumer also spells out by hand, and one
// docs/job-spec.md does not list.
#ifndef MEGATRAIN_ENGINE_SPEC_SPEC_FIELDS_H_
#define MEGATRAIN_ENGINE_SPEC_SPEC_FIELDS_H_

// train.* (TrainSpec, v1::TrainSpec).
#define MEGATRAIN_TRAIN_NUMBER_FIELDS(X)             \
  X(max_grad_norm, Real, kMaxGradNormRange, kPinned) \
  X(wave, Int, kWaveRange, kIfSet)

// optimizer.* (OptimizerSpec, v1::OptimizerSpec).
#define MEGATRAIN_OPTIMIZER_NUMBER_FIELDS(X) \
  X(lr, Real, kLrRange, kPinned)             \
  X(beta1, Real, kBeta1Range, kPinned)       \
  X(beta2, Real, kBeta2Range, kPinned)       \
  X(eps, Real, kEpsRange, kPinned)

#endif  // MEGATRAIN_ENGINE_SPEC_SPEC_FIELDS_H_
