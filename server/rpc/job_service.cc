// See job_service.h.
#include "server/rpc/job_service.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/rpc_call.h"
#include "server/rpc/strict_parse.h"

namespace megatrain::server {

// One open WatchJob stream: counted while it lives (RAII), so that every
// way out of the handler (end, client gone, error) gives the slot back.
class JobServiceImpl::WatchSlot {
 public:
  // Takes a slot of `user`; `refusal()` says why not when max_watch_streams
  // or the user's max_watch_streams_per_user are open.
  WatchSlot(JobServiceImpl* service, const std::string& user) : service_(service), user_(user) {
    std::lock_guard<std::mutex> lock(service_->watch_mu_);
    if (service_->watch_streams_ >= service_->max_watch_streams_) {
      refusal_ = absl::ResourceExhaustedError(
          absl::StrCat("the daemon already serves ", service_->max_watch_streams_,
                       " WatchJob streams (--max_watch_streams); retry later or poll GetJob"));
      return;
    }
    int& mine = service_->watch_streams_by_user_[user_];
    if (mine >= service_->max_watch_streams_per_user_) {
      refusal_ = absl::ResourceExhaustedError(absl::StrCat(
          "user '", user_, "' already has ", mine, " WatchJob streams open (at most ",
          service_->max_watch_streams_per_user_, " per user); retry later or poll GetJob"));
      if (mine == 0) service_->watch_streams_by_user_.erase(user_);
      return;
    }
    ++mine;
    acquired_ = true;
    ++service_->watch_streams_;
    service_->metrics_->SetWatchStreams(service_->watch_streams_);
    service_->watch_cv_.notify_all();
  }
  ~WatchSlot() {
    if (!acquired_) return;
    std::lock_guard<std::mutex> lock(service_->watch_mu_);
    --service_->watch_streams_;
    auto it = service_->watch_streams_by_user_.find(user_);
    if (it != service_->watch_streams_by_user_.end() && --it->second <= 0) {
      service_->watch_streams_by_user_.erase(it);
    }
    service_->metrics_->SetWatchStreams(service_->watch_streams_);
    service_->watch_cv_.notify_all();
  }
  WatchSlot(const WatchSlot&) = delete;
  WatchSlot& operator=(const WatchSlot&) = delete;

  bool acquired() const { return acquired_; }
  const absl::Status& refusal() const { return refusal_; }

 private:
  JobServiceImpl* const service_;
  const std::string user_;
  bool acquired_ = false;
  absl::Status refusal_;
};

void JobServiceImpl::ParseRequestsStrictly() {
  constexpr absl::string_view kService = "megatrain.v1.JobService";
  MarkMethodStreamed(MethodIndex(kService, "SubmitJob", v1::SubmitJobRequest::descriptor()),
                     NewStrictUnaryHandler(this, &JobServiceImpl::SubmitJob));
  MarkMethodStreamed(MethodIndex(kService, "GetJob", v1::GetJobRequest::descriptor()),
                     NewStrictUnaryHandler(this, &JobServiceImpl::GetJob));
  MarkMethodStreamed(MethodIndex(kService, "ListJobs", v1::ListJobsRequest::descriptor()),
                     NewStrictUnaryHandler(this, &JobServiceImpl::ListJobs));
  MarkMethodStreamed(MethodIndex(kService, "CancelJob", v1::CancelJobRequest::descriptor()),
                     NewStrictUnaryHandler(this, &JobServiceImpl::CancelJob));
  MarkMethodStreamed(MethodIndex(kService, "SuspendJob", v1::SuspendJobRequest::descriptor()),
                     NewStrictUnaryHandler(this, &JobServiceImpl::SuspendJob));
  MarkMethodStreamed(MethodIndex(kService, "ResumeJob", v1::ResumeJobRequest::descriptor()),
                     NewStrictUnaryHandler(this, &JobServiceImpl::ResumeJob));
  MarkMethodStreamed(MethodIndex(kService, "WatchJob", v1::WatchJobRequest::descriptor()),
                     NewStrictServerStreamingHandler(this, &JobServiceImpl::StreamEvents));
}

int JobServiceImpl::watch_streams() const {
  std::lock_guard<std::mutex> lock(watch_mu_);
  return watch_streams_;
}

bool JobServiceImpl::WaitForWatchStreams(int count, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(watch_mu_);
  return watch_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                            [&] { return watch_streams_ == count; });
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request, v1::Job* response) {
  RpcCall call("SubmitJob", context, *auth_, metrics_, audit_);
  // model.init_from reads a checkpoint: the audit names it (refused or not).
  const v1::InitFrom& init = request->spec().model().init_from();
  call.set_audit_detail(absl::StrCat(
      "name=", request->spec().name(), " request_id=", request->request_id(),
      init.checkpoint().empty()
          ? ""
          : absl::StrCat(" init_from=", init.checkpoint(),
                         " optimizer=", init.optimizer().empty() ? "fresh" : init.optimizer())));
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<JobRequest> job_request = JobRequestFromProto(request->spec());
  if (!job_request.ok()) return call.Finish(job_request.status());
  absl::StatusOr<JobRecord> job =
      manager_->Submit(*caller, *std::move(job_request), request->request_id(),
                       call.EngineCancellation(max_engine_call_));
  if (!job.ok()) return call.Finish(job.status());
  call.set_audit_target(job->id);
  JobToProto(*job, response);
  return call.Finish(absl::OkStatus());
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  RpcCall call("GetJob", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<JobRecord> job = manager_->Get(*caller, request->job_id());
  if (!job.ok()) return call.Finish(job.status());
  JobToProto(*job, response);
  return call.Finish(absl::OkStatus());
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  RpcCall call("ListJobs", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<std::vector<JobState>> states = JobStatesFromProto(request->states());
  if (!states.ok()) return call.Finish(states.status());
  JobQuery query;
  query.owner = request->owner();
  query.states = *std::move(states);
  query.page_size = request->page_size();
  query.page_token = request->page_token();
  absl::StatusOr<JobPage> page = manager_->List(*caller, std::move(query));
  if (!page.ok()) return call.Finish(page.status());
  for (const JobRecord& job : page->jobs) JobToProto(job, response->add_jobs());
  response->set_next_page_token(page->next_page_token);
  return call.Finish(absl::OkStatus());
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  RpcCall call("CancelJob", context, *auth_, metrics_, audit_);
  call.set_audit_target(request->job_id());
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<JobRecord> job = manager_->Cancel(*caller, request->job_id(), request->force());
  if (!job.ok()) return call.Finish(job.status());
  JobToProto(*job, response);
  return call.Finish(absl::OkStatus());
}

grpc::Status JobServiceImpl::SuspendJob(grpc::ServerContext* context,
                                        const v1::SuspendJobRequest* request, v1::Job* response) {
  RpcCall call("SuspendJob", context, *auth_, metrics_, audit_);
  call.set_audit_target(request->job_id());
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<JobRecord> job = manager_->Suspend(*caller, request->job_id());
  if (!job.ok()) return call.Finish(job.status());
  JobToProto(*job, response);
  return call.Finish(absl::OkStatus());
}

grpc::Status JobServiceImpl::ResumeJob(grpc::ServerContext* context,
                                       const v1::ResumeJobRequest* request, v1::Job* response) {
  RpcCall call("ResumeJob", context, *auth_, metrics_, audit_);
  call.set_audit_target(request->job_id());
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  absl::StatusOr<JobRecord> job = manager_->Resume(*caller, request->job_id());
  if (!job.ok()) return call.Finish(job.status());
  JobToProto(*job, response);
  return call.Finish(absl::OkStatus());
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  return StreamEvents(context, request, writer);
}

grpc::Status JobServiceImpl::StreamEvents(grpc::ServerContext* context,
                                          const v1::WatchJobRequest* request,
                                          grpc::internal::WriterInterface<v1::JobEvent>* writer) {
  RpcCall call("WatchJob", context, *auth_, metrics_);
  absl::StatusOr<Principal> caller = call.Start();
  if (!caller.ok()) return call.Finish(caller.status());
  absl::Status bounds = CheckRequestBounds(*request);
  if (!bounds.ok()) return call.Finish(bounds);
  WatchSlot slot(this, caller->name);
  if (!slot.acquired()) return call.Finish(slot.refusal());
  int64_t after_seq = request->after_seq();
  // Ends when the job is terminal, the client goes away (or its deadline
  // passes: gRPC then cancels the call) or the daemon drains; WaitEvents
  // wakes at least once a second to check.
  while (true) {
    if (context->IsCancelled()) return call.Finish(absl::CancelledError("client went away"));
    absl::StatusOr<EventBatch> batch =
        manager_->WaitEvents(*caller, request->job_id(), after_seq, absl::Seconds(1));
    if (!batch.ok()) return call.Finish(batch.status());
    for (const JobEvent& event : batch->events) {
      v1::JobEvent message;
      JobEventToProto(event, &message);
      if (!writer->Write(message)) return call.Finish(absl::CancelledError("client went away"));
      after_seq = event.seq;
    }
    if (batch->finished) return call.Finish(absl::OkStatus());
  }
}

}  // namespace megatrain::server
