// ServerService handlers (megatrain.v1.ServerService,
// proto/megatrain/v1/server.proto): daemon status, metric values and the
// audit log (admins).
//
// Thread-safety: as JobServiceImpl; borrowed objects must outlive it.
#ifndef MEGATRAIN_SERVER_SERVER_SERVICE_H_
#define MEGATRAIN_SERVER_SERVER_SERVICE_H_

#include <cstdint>
#include <map>
#include <string>

#include "megatrain/v1/server.grpc.pb.h"
#include "server/core/audit_log.h"
#include "server/core/auth.h"
#include "server/core/engine_backend.h"
#include "server/core/job_manager.h"
#include "server/core/metrics.h"
#include "server/core/nvml.h"
#include "server/rpc/rpc_call.h"

namespace megatrain::server {

// Facts about the daemon fixed at start-up.
struct ServerFacts {
  std::string version;
  int64_t start_time_unix_ms = 0;
  int64_t physical_memory_bytes = 0;
  bool auth_enabled = false;
  bool preemption_enabled = false;
  std::map<std::string, LinkBandwidth> link_bandwidth;  // by device; measured at start-up
  int64_t nvme_budget_bytes = 0;                        // --nvme_budget (0: no NVMe tier)
  // PlanJob's door to the engine (not owned; outlives the service); null:
  // PlanJob is UNIMPLEMENTED.
  EngineBackend* backend = nullptr;
  // Longest PlanJob engine call, whatever the client's deadline
  // (--max_engine_call_seconds; Note [Cancelled engine calls] in rpc_call.h).
  absl::Duration max_engine_call = kDefaultMaxEngineCall;
};

class ServerServiceImpl final : public v1::ServerService::Service {
 public:
  // `nvml` may be null (no NVIDIA driver).
  ServerServiceImpl(ServerFacts facts, JobManager* manager, const Authenticator* auth,
                    ServerMetrics* metrics, const Nvml* nvml, AuditLog* audit)
      : facts_(std::move(facts)),
        manager_(manager),
        auth_(auth),
        metrics_(metrics),
        nvml_(nvml),
        audit_(audit) {
    ParseRequestsStrictly();
  }

  grpc::Status GetServerStatus(grpc::ServerContext* context,
                               const v1::GetServerStatusRequest* request,
                               v1::ServerStatus* response) override;
  grpc::Status GetMetrics(grpc::ServerContext* context, const v1::GetMetricsRequest* request,
                          v1::GetMetricsResponse* response) override;
  // Admins only.
  grpc::Status ListAuditRecords(grpc::ServerContext* context,
                                const v1::ListAuditRecordsRequest* request,
                                v1::ListAuditRecordsResponse* response) override;
  // Any authenticated caller; starts nothing (plan_convert.h, engine/job/plan.h).
  grpc::Status PlanJob(grpc::ServerContext* context, const v1::PlanJobRequest* request,
                       v1::PlanJobResponse* response) override;

 private:
  // Re-registers every method so that a request that does not parse is
  // INVALID_ARGUMENT (Note [Malformed requests], strict_parse.h).
  void ParseRequestsStrictly();

  const ServerFacts facts_;
  JobManager* const manager_;
  const Authenticator* const auth_;
  ServerMetrics* const metrics_;
  const Nvml* const nvml_;
  AuditLog* const audit_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_SERVER_SERVICE_H_
