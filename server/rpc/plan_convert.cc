// PlanJob's conversions (plan_convert.h).
#include "server/rpc/plan_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "server/rpc/proto_convert.h"

namespace megatrain::server {
namespace {

absl::Status NonNegative(const char* field, double value) {
  if (value >= 0) return absl::OkStatus();  // false for NaN too
  return absl::InvalidArgumentError(absl::StrCat("machine.", field, ": must be >= 0, got ", value));
}

// Copies one optional machine field after checking it.
template <typename T>
absl::Status Take(const char* field, bool has, T value, std::optional<T>* out) {
  if (!has) return absl::OkStatus();
  if (absl::Status s = NonNegative(field, static_cast<double>(value)); !s.ok()) return s;
  *out = value;
  return absl::OkStatus();
}

absl::Status MachineFromProto(const v1::PlanMachine& m, PlanMachineOverrides* out) {
  const absl::Status checks[] = {
      Take("host_memory_bytes", m.has_host_memory_bytes(), m.host_memory_bytes(),
           &out->host_memory_bytes),
      Take("nvme_bytes", m.has_nvme_bytes(), m.nvme_bytes(), &out->nvme_bytes),
      Take("gpu_memory_bytes", m.has_gpu_memory_bytes(), m.gpu_memory_bytes(),
           &out->gpu_memory_bytes),
      Take("h2d_bytes_per_second", m.has_h2d_bytes_per_second(), m.h2d_bytes_per_second(),
           &out->h2d_bytes_per_second),
      Take("d2h_bytes_per_second", m.has_d2h_bytes_per_second(), m.d2h_bytes_per_second(),
           &out->d2h_bytes_per_second),
      Take("matmul_flops_per_second", m.has_matmul_flops_per_second(), m.matmul_flops_per_second(),
           &out->matmul_flops_per_second),
      Take("adamw_params_per_second", m.has_adamw_params_per_second(), m.adamw_params_per_second(),
           &out->adamw_params_per_second),
      Take("nvme_read_bytes_per_second", m.has_nvme_read_bytes_per_second(),
           m.nvme_read_bytes_per_second(), &out->nvme_read_bytes_per_second),
      Take("nvme_write_bytes_per_second", m.has_nvme_write_bytes_per_second(),
           m.nvme_write_bytes_per_second(), &out->nvme_write_bytes_per_second)};
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// memory.nvme_tier's names (engine::ParseNvmeTierMode's: megatrain_server
// links no engine library, so the three names are spelled here too).
absl::StatusOr<engine::NvmeTierMode> TierFromName(absl::string_view name) {
  if (name == "off") return engine::NvmeTierMode::kOff;
  if (name == "moments") return engine::NvmeTierMode::kMoments;
  if (name == "auto") return engine::NvmeTierMode::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("memory.nvme_tier: must be off, moments or auto, got '", name, "'"));
}

const char* TierName(engine::NvmeTierMode mode) {
  switch (mode) {
    case engine::NvmeTierMode::kMoments:
      return "moments";
    case engine::NvmeTierMode::kAuto:
      return "auto";
    case engine::NvmeTierMode::kOff:
      break;
  }
  return "off";
}

}  // namespace

absl::StatusOr<PlanInputs> PlanInputsFromProto(const v1::PlanJobRequest& request) {
  if (absl::Status s = CheckLength("hf_config_json", request.hf_config_json(), kMaxPlanConfigBytes);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLength("family", request.family(), kMaxKeywordBytes); !s.ok()) return s;
  if (absl::Status s = CheckLength("nvme_tier", request.nvme_tier(), kMaxKeywordBytes); !s.ok()) {
    return s;
  }
  if (!request.model().hf_dir().empty()) {
    return absl::InvalidArgumentError(
        "model.hf_dir: not read for a plan; send the directory's config.json as hf_config_json "
        "(megatrain plan --hf_dir does)");
  }
  // The train fields exactly as SubmitJob reads them (defaults, global_batch).
  v1::JobSpec job;
  job.mutable_model()->set_preset(request.model().preset());
  *job.mutable_train() = request.train();
  *job.mutable_memory() = request.memory();
  absl::StatusOr<JobRequest> converted = JobRequestFromProto(job);
  if (!converted.ok()) return converted.status();
  PlanInputs in;
  in.spec = converted->spec;
  in.model.preset = request.model().preset();
  in.model.hf_config_json = request.hf_config_json();
  in.model.family = request.family();
  in.model.param_count = request.param_count();
  if (!request.nvme_tier().empty()) {
    absl::StatusOr<engine::NvmeTierMode> tier = TierFromName(request.nvme_tier());
    if (!tier.ok()) return tier.status();
    in.spec.memory.nvme_tier = *tier;
  }
  if (absl::Status s = MachineFromProto(request.machine(), &in.machine); !s.ok()) return s;
  return in;
}

void JobPlanToProto(const engine::JobPlan& plan, const engine::PlanMachine& machine,
                    v1::PlanJobResponse* out) {
  out->set_params(plan.params);
  out->set_devices(static_cast<int32_t>(plan.devices));
  out->set_nvme_tier(TierName(plan.nvme_tier));
  out->set_host_bytes(plan.tiers.host_bytes);
  out->set_pinned_bytes(plan.tiers.pinned_bytes);
  out->set_device_bytes(plan.tiers.device_bytes);
  out->set_nvme_bytes(plan.tiers.nvme_bytes);
  out->set_fits(plan.fits);
  out->set_verdict(plan.verdict);
  const engine::StepProjection& p = plan.projection;
  v1::StepProjection* projection = out->mutable_projection();
  projection->set_tokens(p.tokens);
  projection->set_model_flops(p.model_flops);
  projection->set_compute_seconds(p.compute_seconds);
  projection->set_h2d_seconds(p.h2d_seconds);
  projection->set_d2h_seconds(p.d2h_seconds);
  projection->set_adamw_seconds(p.adamw_seconds);
  projection->set_nvme_seconds(p.nvme_seconds);
  projection->set_step_seconds(p.step_seconds);
  projection->set_bound(p.bound);
  projection->set_tokens_per_second(p.tokens_per_second);
  projection->set_mfu(p.mfu);
  v1::PlanMachine* m = out->mutable_machine();
  m->set_host_memory_bytes(machine.host_memory_bytes);
  m->set_nvme_bytes(machine.nvme_bytes);
  m->set_gpu_memory_bytes(machine.gpu_memory_bytes);
  m->set_h2d_bytes_per_second(machine.h2d_bytes_per_second);
  m->set_d2h_bytes_per_second(machine.d2h_bytes_per_second);
  m->set_matmul_flops_per_second(machine.matmul_flops_per_second);
  m->set_adamw_params_per_second(machine.adamw_params_per_second);
  m->set_nvme_read_bytes_per_second(machine.nvme_read_bytes_per_second);
  m->set_nvme_write_bytes_per_second(machine.nvme_write_bytes_per_second);
  m->set_description(machine.description);
}

}  // namespace megatrain::server
