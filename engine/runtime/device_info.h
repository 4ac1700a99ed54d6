// Facts about the compute devices the server needs at start-up: how many
// CUDA devices there are and what their host<->device link moves.
#ifndef MEGATRAIN_ENGINE_DEVICE_INFO_H_
#define MEGATRAIN_ENGINE_DEVICE_INFO_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// CUDA devices visible to this process (honours CUDA_VISIBLE_DEVICES); 0 in
// a build without CUDA or on a machine without a GPU. Thread-safe.
int CudaDeviceCount();

// Copy bandwidth of a device's host link, bytes per second, measured with
// pinned host memory (the store's kind of memory; Note [Pinned host memory]).
struct LinkBandwidthMeasurement {
  double h2d_bytes_per_second = 0;  // host -> device, one stream alone
  double d2h_bytes_per_second = 0;  // device -> host, one stream alone
  int64_t bytes_per_copy = 0;
  int repeats = 0;
  // Payload each direction moved, the warm-up copy included:
  // (repeats + 1) x bytes_per_copy bytes.
  int64_t bytes_copied_each_way = 0;
};

// Times `repeats` copies of `bytes_per_copy` each way on `device` ("cuda",
// "cuda:N") with CUDA events, after one warm-up copy; H2D first, then D2H.
// `between_directions`, when set, runs on the calling thread once every H2D
// copy has finished and before the first D2H copy is issued (the daemon
// reads NVML's PCIe counters there; Note [PCIe link model] in
// server/core/pcie_link_model.h). Takes about
// 2 * repeats * bytes / bandwidth seconds (~0.1 s with the defaults on
// PCIe gen5). Errors: UNAVAILABLE for "cpu" or without CUDA; INVALID_ARGUMENT
// for a bad device or size; RESOURCE_EXHAUSTED when the buffers cannot be
// allocated or pinned. Not to be called while a job trains on the device
// (it would measure a shared link).
absl::StatusOr<LinkBandwidthMeasurement> MeasureLinkBandwidth(
    const std::string& device, int64_t bytes_per_copy = 256 << 20, int repeats = 8,
    const std::function<void()>& between_directions = nullptr);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DEVICE_INFO_H_
