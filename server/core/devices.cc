// ResolveDevices (declared in engine_backend.h): parsing of the --device flag.
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/core/engine_backend.h"

namespace megatrain::server {

absl::StatusOr<std::vector<std::string>> ResolveDevices(absl::string_view flag,
                                                        int cuda_device_count) {
  std::vector<std::string> devices;
  std::set<std::string> seen;
  for (absl::string_view item : absl::StrSplit(flag, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<std::string> expanded;
    if (item == "auto") {
      for (int device_idx = 0; device_idx < cuda_device_count; ++device_idx) {
        expanded.push_back(absl::StrCat("cuda:", device_idx));
      }
      if (expanded.empty()) expanded.push_back("cpu");
    } else if (item == "cpu" || item == "cpu:0") {
      expanded.push_back("cpu");
    } else if (absl::StartsWith(item, "cpu:")) {
      // Note [CPU device slots] in engine_backend.h.
      int slot = 0;
      if (!absl::SimpleAtoi(item.substr(4), &slot) || slot < 1 || slot >= kMaxCpuDeviceSlots) {
        return absl::InvalidArgumentError(absl::StrCat("--device: bad CPU device '", item,
                                                       "' (expected cpu or cpu:N, N in [0, ",
                                                       kMaxCpuDeviceSlots - 1, "])"));
      }
      expanded.push_back(absl::StrCat("cpu:", slot));
    } else if (item == "cuda" || absl::StartsWith(item, "cuda:")) {
      int device_idx = 0;
      if (item != "cuda" && !absl::SimpleAtoi(item.substr(5), &device_idx)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--device: bad CUDA device '", item, "' (expected cuda:N)"));
      }
      if (device_idx < 0 || device_idx >= cuda_device_count) {
        return absl::InvalidArgumentError(absl::StrCat("--device: ", item, " is not available (",
                                                       cuda_device_count, " CUDA devices)"));
      }
      expanded.push_back(absl::StrCat("cuda:", device_idx));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--device: must be auto, cpu, cpu:N, cuda or cuda:N (comma-separated), got '", item,
          "'"));
    }
    for (std::string& device : expanded) {
      if (seen.insert(device).second) devices.push_back(std::move(device));
    }
  }
  if (devices.empty()) return absl::InvalidArgumentError("--device: no device given");
  return devices;
}

}  // namespace megatrain::server
