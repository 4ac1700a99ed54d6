// Device count and link bandwidth measurement (device_info.h).
#include "engine/runtime/device_info.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "engine/runtime/device_runtime.h"
#include "engine/runtime/host_buffer.h"
#include "engine/runtime/status_macros.h"

#ifdef MEGATRAIN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace megatrain::engine {

int CudaDeviceCount() {
#ifdef MEGATRAIN_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

absl::StatusOr<LinkBandwidthMeasurement> MeasureLinkBandwidth(
    const std::string& device, int64_t bytes_per_copy, int repeats,
    const std::function<void()>& between_directions) {
  if (bytes_per_copy < 4096 || repeats < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("link bandwidth: need bytes_per_copy >= 4096 and repeats >= 1, got ",
                     bytes_per_copy, " and ", repeats));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(std::unique_ptr<DeviceRuntime> runtime, DeviceRuntime::Create(device));
  if (!runtime->is_cuda()) {
    return absl::UnavailableError(absl::StrCat("link bandwidth: '", device, "' has no host link"));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(HostBuffer host,
                             HostBuffer::Allocate(static_cast<size_t>(bytes_per_copy), true));
  try {
    at::Tensor dev =
        at::empty({bytes_per_copy}, at::TensorOptions().dtype(at::kByte).device(runtime->device()));
    auto start = runtime->CreateEvent(/*timing=*/true);
    auto end = runtime->CreateEvent(/*timing=*/true);
    auto time_copies = [&](StreamKind stream, bool h2d) {
      // One warm-up copy, then the timed ones.
      for (int i = 0; i <= repeats; ++i) {
        if (i == 1) runtime->Record(stream, *start);
        if (h2d) {
          runtime->CopyHostToDevice(dev.data_ptr(), host.data(), bytes_per_copy);
        } else {
          runtime->CopyDeviceToHost(host.data(), dev.data_ptr(), bytes_per_copy);
        }
      }
      runtime->Record(stream, *end);
      runtime->HostWait(*end);
      const double seconds = runtime->ElapsedMs(*start, *end) / 1e3;
      return static_cast<double>(bytes_per_copy) * repeats / seconds;
    };
    LinkBandwidthMeasurement m;
    m.bytes_per_copy = bytes_per_copy;
    m.repeats = repeats;
    m.bytes_copied_each_way = bytes_per_copy * (repeats + 1);
    m.h2d_bytes_per_second = time_copies(StreamKind::kH2D, true);
    if (between_directions) between_directions();
    m.d2h_bytes_per_second = time_copies(StreamKind::kD2H, false);
    return m;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("link bandwidth on ", device, ": ", e.what()));
  }
}

}  // namespace megatrain::engine
