// See job_request_json.h.
#include "server/core/job_request_json.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"
#include "engine/spec/job_spec_json.h"

namespace megatrain::server {

using nlohmann::json;

std::string JobRequestToJson(const JobRequest& request) {
  json j = engine::JobSpecToJsonObject(request.spec);
  j["priority"] = request.priority;
  j["labels"] = request.labels;  // std::map: sorted, deterministic
  return j.dump();
}

absl::StatusOr<JobRequest> JobRequestFromJson(absl::string_view text) {
  JobRequest request;
  try {
    const json j = json::parse(text);
    MEGATRAIN_RETURN_IF_ERROR(engine::JobSpecFromJsonObject(j, &request.spec));
    if (auto it = j.find("priority"); it != j.end() && !it->is_null()) {
      it->get_to(request.priority);
    }
    if (auto it = j.find("labels"); it != j.end() && !it->is_null()) it->get_to(request.labels);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("job spec JSON: ", e.what()));
  }
  return request;
}

}  // namespace megatrain::server
