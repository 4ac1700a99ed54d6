// PlanJob's conversions (ServerService.PlanJob, proto/megatrain/v1/
// server.proto): the request into the engine's plan inputs, the plan into
// the response. Only server_service.cc includes this file.
// Thread-safety: pure functions.
#ifndef MEGATRAIN_SERVER_RPC_PLAN_CONVERT_H_
#define MEGATRAIN_SERVER_RPC_PLAN_CONVERT_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "engine/job/plan.h"
#include "megatrain/v1/server.pb.h"
#include "server/core/plan_machine.h"

namespace megatrain::server {

// The largest hf_config_json a PlanJob request may carry (a Llama
// config.json is ~1 KB; 1 MiB bounds what one call can make the daemon parse).
inline constexpr size_t kMaxPlanConfigBytes = size_t{1} << 20;

struct PlanInputs {
  engine::PlanModel model;
  engine::JobSpec spec;  // train and memory set; the rest default
  PlanMachineOverrides machine;
};

// INVALID_ARGUMENT naming the field: a string over its cap (Note [String
// caps] in proto_convert.h; hf_config_json over kMaxPlanConfigBytes), a
// bad train field (as in SubmitJob), an unknown nvme_tier, a negative
// machine value, or a model.hf_dir (send its config.json's text instead:
// the daemon opens no file for a plan).
absl::StatusOr<PlanInputs> PlanInputsFromProto(const v1::PlanJobRequest& request);

// `plan` on `machine` as the response.
void JobPlanToProto(const engine::JobPlan& plan, const engine::PlanMachine& machine,
                    v1::PlanJobResponse* out);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_RPC_PLAN_CONVERT_H_
