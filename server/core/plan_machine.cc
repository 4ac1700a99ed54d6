// ResolvePlanMachine (plan_machine.h).
#include "server/core/plan_machine.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace megatrain::server {
namespace {

// Sets `*out` from the request, else the daemon (when known, > 0), else
// leaves the default; appends "<name> (request|daemon|default)".
template <typename T>
void Pick(const char* name, const std::optional<T>& request, T daemon, T* out,
          std::string* description) {
  const char* source = "default";
  if (request.has_value()) {
    *out = *request;
    source = "request";
  } else if (daemon > 0) {
    *out = daemon;
    source = "daemon";
  }
  absl::StrAppend(description, description->empty() ? "" : ", ", name, " (", source, ")");
}

}  // namespace

engine::PlanMachine ResolvePlanMachine(const PlanMachineOverrides& request,
                                       const DaemonMachine& daemon) {
  engine::PlanMachine m = engine::DefaultPlanMachine();
  std::string d;
  Pick<int64_t>("host", request.host_memory_bytes, daemon.host_memory_budget_bytes,
                &m.host_memory_bytes, &d);
  Pick<int64_t>("nvme", request.nvme_bytes, daemon.nvme_budget_bytes, &m.nvme_bytes, &d);
  Pick<int64_t>("gpu", request.gpu_memory_bytes, daemon.gpu_memory_bytes, &m.gpu_memory_bytes, &d);
  Pick<double>("h2d", request.h2d_bytes_per_second, daemon.h2d_bytes_per_second,
               &m.h2d_bytes_per_second, &d);
  Pick<double>("d2h", request.d2h_bytes_per_second, daemon.d2h_bytes_per_second,
               &m.d2h_bytes_per_second, &d);
  Pick<double>("matmul", request.matmul_flops_per_second, 0.0, &m.matmul_flops_per_second, &d);
  Pick<double>("adamw", request.adamw_params_per_second, 0.0, &m.adamw_params_per_second, &d);
  Pick<double>("nvme_read", request.nvme_read_bytes_per_second, 0.0, &m.nvme_read_bytes_per_second,
               &d);
  Pick<double>("nvme_write", request.nvme_write_bytes_per_second, 0.0,
               &m.nvme_write_bytes_per_second, &d);
  m.description = absl::StrCat(d, "; default: ", m.description);
  return m;
}

}  // namespace megatrain::server
