// JobService handlers (megatrain.v1.JobService, proto/megatrain/v1/job.proto).
// Thin: authenticate, convert the request, call JobManager, convert the
// result and the status, record the RPC metric.
//
// Thread-safety: gRPC calls the handlers concurrently; all state is in the
// (thread-safe) JobManager. The manager, authenticator and metrics are
// borrowed and must outlive the service.
#ifndef MEGATRAIN_SERVER_JOB_SERVICE_H_
#define MEGATRAIN_SERVER_JOB_SERVICE_H_

#include "megatrain/v1/job.grpc.pb.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/metrics.h"

namespace megatrain::server {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(JobManager* manager, const Authenticator* auth, ServerMetrics* metrics)
      : manager_(manager), auth_(auth), metrics_(metrics) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status SuspendJob(grpc::ServerContext* context, const v1::SuspendJobRequest* request,
                          v1::Job* response) override;
  grpc::Status ResumeJob(grpc::ServerContext* context, const v1::ResumeJobRequest* request,
                         v1::Job* response) override;
  // Streams events until the job is terminal, the client goes away
  // (CANCELLED) or the daemon drains (UNAVAILABLE).
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;

 private:
  JobManager* const manager_;
  const Authenticator* const auth_;
  ServerMetrics* const metrics_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_JOB_SERVICE_H_
