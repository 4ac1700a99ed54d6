// The machine a PlanJob call plans for: the caller's values where given,
// else the daemon's own (its budgets, the first device's memory and
// measured link), else docs/performance.md's H200 numbers
// (engine::DefaultPlanMachine). No gRPC here: the handler converts.
#ifndef MEGATRAIN_SERVER_CORE_PLAN_MACHINE_H_
#define MEGATRAIN_SERVER_CORE_PLAN_MACHINE_H_

#include <cstdint>
#include <optional>

#include "engine/job/plan.h"

namespace megatrain::server {

// What the caller asked for; unset fields are the daemon's.
struct PlanMachineOverrides {
  std::optional<int64_t> host_memory_bytes;
  std::optional<int64_t> nvme_bytes;
  std::optional<int64_t> gpu_memory_bytes;
  std::optional<double> h2d_bytes_per_second;
  std::optional<double> d2h_bytes_per_second;
  std::optional<double> matmul_flops_per_second;
  std::optional<double> adamw_params_per_second;
  std::optional<double> nvme_read_bytes_per_second;
  std::optional<double> nvme_write_bytes_per_second;
};

// What the daemon knows of its machine; 0 = unknown.
struct DaemonMachine {
  int64_t host_memory_budget_bytes = 0;  // --host_memory_budget
  int64_t nvme_budget_bytes = 0;         // --nvme_budget (0: no NVMe tier)
  int64_t gpu_memory_bytes = 0;          // the first device's (NVML)
  double h2d_bytes_per_second = 0;       // measured at start-up
  double d2h_bytes_per_second = 0;
};

// The machine to plan for; `description` says which numbers are whose
// ("host 1.50 TB (request), link 55.0/53.1 GB/s (measured), ..."). Pure.
engine::PlanMachine ResolvePlanMachine(const PlanMachineOverrides& request,
                                       const DaemonMachine& daemon);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_PLAN_MACHINE_H_
