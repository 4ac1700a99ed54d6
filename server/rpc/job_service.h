// JobService handlers (megatrain.v1.JobService, proto/megatrain/v1/job.proto).
// Thin: authenticate, convert the request, call JobManager, convert the
// result and the status, record the RPC metric and, for SubmitJob,
// CancelJob, SuspendJob and ResumeJob, the audit record.
//
// WatchJob streams each hold one of the server's threads for their whole
// life, so they are counted and limited (max_watch_streams): a flood of
// watchers cannot take every thread from the unary calls.
//
// Thread-safety: gRPC calls the handlers concurrently; the job state is in
// the (thread-safe) JobManager, the stream count behind its own mutex. The
// manager, authenticator, metrics and audit log are borrowed and must
// outlive the service.
#ifndef MEGATRAIN_SERVER_JOB_SERVICE_H_
#define MEGATRAIN_SERVER_JOB_SERVICE_H_

#include <condition_variable>
#include <map>
#include <mutex>

#include "absl/time/time.h"
#include "megatrain/v1/job.grpc.pb.h"
#include "server/core/audit_log.h"
#include "server/core/auth.h"
#include "server/core/job_manager.h"
#include "server/core/metrics.h"
#include "server/rpc/rpc_call.h"

namespace megatrain::server {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `max_watch_streams` (> 0) bounds the concurrent WatchJob streams;
  // `max_watch_streams_per_user` those of one user (0: three quarters of
  // max_watch_streams, rounded up, so that one user cannot take every
  // stream from the others). `max_engine_call` (> 0) bounds SubmitJob's
  // footprint estimate whatever the client's deadline (Note [Cancelled
  // engine calls] in rpc_call.h).
  JobServiceImpl(JobManager* manager, const Authenticator* auth, ServerMetrics* metrics,
                 AuditLog* audit, int max_watch_streams, int max_watch_streams_per_user = 0,
                 absl::Duration max_engine_call = kDefaultMaxEngineCall)
      : manager_(manager),
        auth_(auth),
        metrics_(metrics),
        audit_(audit),
        max_watch_streams_(max_watch_streams),
        max_watch_streams_per_user_(max_watch_streams_per_user > 0
                                        ? max_watch_streams_per_user
                                        : (3 * max_watch_streams + 3) / 4),
        max_engine_call_(max_engine_call) {
    ParseRequestsStrictly();
  }

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
  // Streams events until the job is terminal, the client goes away or its
  // deadline passes (CANCELLED; noticed within a second) or the daemon
  // drains (UNAVAILABLE). RESOURCE_EXHAUSTED when max_watch_streams streams
  // are open already, or the caller's max_watch_streams_per_user.
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;

  // WatchJob streams open now.
  int watch_streams() const;
  // Blocks until exactly `count` streams are open, at most `timeout`;
  // false on timeout. For tests and the load benchmark.
  bool WaitForWatchStreams(int count, absl::Duration timeout) const;

 private:
  class WatchSlot;

  // Re-registers every method so that a request that does not parse is
  // INVALID_ARGUMENT (Note [Malformed requests], strict_parse.h).
  void ParseRequestsStrictly();
  // WatchJob's body, writing to any stream (the generated ServerWriter or
  // the one of strict_parse.h).
  grpc::Status StreamEvents(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                            grpc::internal::WriterInterface<v1::JobEvent>* writer);

  JobManager* const manager_;
  const Authenticator* const auth_;
  ServerMetrics* const metrics_;
  AuditLog* const audit_;
  const int max_watch_streams_;
  const int max_watch_streams_per_user_;
  const absl::Duration max_engine_call_;

  mutable std::mutex watch_mu_;
  mutable std::condition_variable watch_cv_;          // watch_streams_ changed
  int watch_streams_ = 0;                             // guarded by watch_mu_
  std::map<std::string, int> watch_streams_by_user_;  // no zero entries; guarded by watch_mu_
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_JOB_SERVICE_H_
