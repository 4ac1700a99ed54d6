// Handlers that answer a request which does not parse with INVALID_ARGUMENT.
//
// Note [Malformed requests]
// gRPC's generated synchronous handlers parse the request before the
// service method runs, and answer one that does not parse with INTERNAL and
// an empty message (GenericDeserialize puts InitializationErrorString(),
// empty for proto3, into an INTERNAL status). A malformed request is the
// caller's fault, so the daemon re-registers each method (Service::
// MarkMethodStreamed, the mechanism of the generated WithStreamedUnaryMethod_
// and WithSplitStreamingMethod_ classes) with a handler that reads the
// request itself: when it does not parse, the reply is INVALID_ARGUMENT
// naming the message type; otherwise the ordinary service method runs with
// the parsed request. Requests over --max_message_bytes are still refused by
// gRPC itself (RESOURCE_EXHAUSTED) before any of this.
//
// Example (in a service's constructor):
//   MarkMethodStreamed(MethodIndex("megatrain.v1.JobService", "GetJob",
//                                  v1::GetJobRequest::descriptor()),
//                      NewStrictUnaryHandler(this, &JobServiceImpl::GetJob));
//
// Thread-safety: the handlers are called concurrently by gRPC, like the
// service methods they call; they keep no state of their own.
#ifndef MEGATRAIN_SERVER_STRICT_PARSE_H_
#define MEGATRAIN_SERVER_STRICT_PARSE_H_

#include <new>
#include <string>

#include <google/protobuf/descriptor.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/string_view.h"
#include "server/rpc/rpc_priority.h"

namespace megatrain::server {

// The index of `method` in the gRPC service `service` (full proto names,
// "megatrain.v1.JobService", "GetJob"): the number the generated Service
// gives it. Aborts (a programming error) when there is no such method or its
// request type is not `request_type`.
int MethodIndex(absl::string_view service, absl::string_view method,
                const google::protobuf::Descriptor* request_type);

// INVALID_ARGUMENT "the request is not a valid <type> message ...".
grpc::Status MalformedRequestStatus(const std::string& message_type);

// RESOURCE_EXHAUSTED for a call that ran out of memory.
grpc::Status OutOfMemoryStatus();

// Runs a service method on a thread at the RPC priority (rpc_priority.h);
// a std::bad_alloc anywhere under it (the engine's
// own boundary maps its own, engine_backend.cc) fails that call with
// RESOURCE_EXHAUSTED instead of ending the daemon. Other exceptions are
// not caught here (gRPC's handler turns them into UNKNOWN).
template <class Fn>
grpc::Status CallRefusingBadAlloc(Fn&& fn) {
  LowerThisRpcThread();  // Note [RPC threads below training]
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return OutOfMemoryStatus();
  }
}

// A unary handler for MarkMethodStreamed that parses the request itself
// and calls (service->*method) with it. Ownership passes to gRPC.
template <class Service, class Request, class Response>
grpc::internal::MethodHandler* NewStrictUnaryHandler(
    Service* service,
    grpc::Status (Service::*method)(grpc::ServerContext*, const Request*, Response*)) {
  return new grpc::internal::StreamedUnaryHandler<Request, Response>(
      [service, method](grpc::ServerContext* context,
                        grpc::ServerUnaryStreamer<Request, Response>* stream) {
        Request request;
        if (!stream->Read(&request)) {
          return MalformedRequestStatus(Request::descriptor()->full_name());
        }
        Response response;
        grpc::Status status =
            CallRefusingBadAlloc([&] { return (service->*method)(context, &request, &response); });
        // A failed Write means the client went away: nothing to tell it.
        if (status.ok()) stream->Write(response);
        return status;
      });
}

// A server-streaming handler for MarkMethodStreamed that parses the request
// itself and calls (service->*method) with it and the stream to write to.
template <class Service, class Request, class Response>
grpc::internal::MethodHandler* NewStrictServerStreamingHandler(
    Service* service, grpc::Status (Service::*method)(grpc::ServerContext*, const Request*,
                                                      grpc::internal::WriterInterface<Response>*)) {
  return new grpc::internal::SplitServerStreamingHandler<Request, Response>(
      [service, method](grpc::ServerContext* context,
                        grpc::ServerSplitStreamer<Request, Response>* stream) {
        Request request;
        if (!stream->Read(&request)) {
          return MalformedRequestStatus(Request::descriptor()->full_name());
        }
        return CallRefusingBadAlloc([&] { return (service->*method)(context, &request, stream); });
      });
}

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_STRICT_PARSE_H_
