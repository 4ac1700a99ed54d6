// See strict_parse.h.
#include "server/rpc/strict_parse.h"

#include <malloc.h>

#include <google/protobuf/descriptor.h>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"

namespace megatrain::server {

int MethodIndex(absl::string_view service, absl::string_view method,
                const google::protobuf::Descriptor* request_type) {
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(std::string(service));
  ABSL_RAW_CHECK(descriptor != nullptr, "MethodIndex: unknown gRPC service");
  const google::protobuf::MethodDescriptor* found =
      descriptor->FindMethodByName(std::string(method));
  ABSL_RAW_CHECK(found != nullptr, "MethodIndex: unknown gRPC method");
  ABSL_RAW_CHECK(found->input_type() == request_type, "MethodIndex: wrong request type");
  return found->index();
}

grpc::Status MalformedRequestStatus(const std::string& message_type) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("the request is not a valid ", message_type,
                                   " message (it does not parse as protobuf, or is missing)"));
}

grpc::Status OutOfMemoryStatus() {
  ::malloc_trim(0);  // give the failed call's freed heap back to the system
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "the daemon ran out of memory serving this call (std::bad_alloc); "
                      "the call was abandoned");
}

}  // namespace megatrain::server
