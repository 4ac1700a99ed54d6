// CheckpointService handlers (megatrain.v1.CheckpointService,
// proto/megatrain/v1/checkpoint.proto). Thin, like job_service.h;
// CreateCheckpoint, ExportCheckpoint and DeleteCheckpoint are audited.
//
// Thread-safety: as JobServiceImpl; borrowed objects must outlive it.
#ifndef MEGATRAIN_SERVER_CHECKPOINT_SERVICE_H_
#define MEGATRAIN_SERVER_CHECKPOINT_SERVICE_H_

#include "megatrain/v1/checkpoint.grpc.pb.h"
#include "server/core/audit_log.h"
#include "server/core/auth.h"
#include "server/core/job_manager.h"
#include "server/core/metrics.h"

namespace megatrain::server {

class CheckpointServiceImpl final : public v1::CheckpointService::Service {
 public:
  CheckpointServiceImpl(JobManager* manager, const Authenticator* auth, ServerMetrics* metrics,
                        AuditLog* audit)
      : manager_(manager), auth_(auth), metrics_(metrics), audit_(audit) {
    ParseRequestsStrictly();
  }

  // Blocks until the checkpoint is written, the call's deadline passes or
  // the client goes away.
  grpc::Status CreateCheckpoint(grpc::ServerContext* context,
                                const v1::CreateCheckpointRequest* request,
                                v1::Checkpoint* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status ExportCheckpoint(grpc::ServerContext* context,
                                const v1::ExportCheckpointRequest* request,
                                v1::ExportCheckpointResponse* response) override;
  grpc::Status DeleteCheckpoint(grpc::ServerContext* context,
                                const v1::DeleteCheckpointRequest* request,
                                v1::DeleteCheckpointResponse* response) override;

 private:
  // Re-registers every method so that a request that does not parse is
  // INVALID_ARGUMENT (Note [Malformed requests], strict_parse.h).
  void ParseRequestsStrictly();

  JobManager* const manager_;
  const Authenticator* const auth_;
  ServerMetrics* const metrics_;
  AuditLog* const audit_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CHECKPOINT_SERVICE_H_
