// CPU runtime and the runtime factory.
#include "engine/runtime/device_runtime.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace megatrain::engine {

#ifdef MEGATRAIN_WITH_CUDA
// Defined in cuda_runtime.cc.
absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateCudaRuntime(int device_index);
#endif

namespace {

class CpuEvent final : public DeviceEvent {};
class CpuScope final : public StreamScope {};

// Replays by running the body again: on the CPU there is nothing to
// capture, and the caller's view (results in what the body assigns) is the
// same as a CUDA graph's.
class CpuGraph final : public DeviceGraph {
 public:
  explicit CpuGraph(std::function<void()> body) : body_(std::move(body)) {}
  void Replay() override { body_(); }

 private:
  std::function<void()> body_;
};

// Everything runs synchronously on the calling thread.
class CpuRuntime final : public DeviceRuntime {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  bool is_cuda() const override { return false; }
  std::string name() const override { return "cpu"; }
  std::unique_ptr<StreamScope> Use(StreamKind) override { return std::make_unique<CpuScope>(); }
  void CopyHostToDevice(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyDeviceToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  std::unique_ptr<DeviceEvent> CreateEvent(bool) override { return std::make_unique<CpuEvent>(); }
  void Record(StreamKind, DeviceEvent&) override {}
  void Wait(StreamKind, DeviceEvent&) override {}
  void HostWait(DeviceEvent&) override {}
  double ElapsedMs(DeviceEvent&, DeviceEvent&) override { return 0.0; }
  std::unique_ptr<DeviceGraph> CaptureGraph(std::function<void()> body) override {
    return std::make_unique<CpuGraph>(std::move(body));
  }
  void Synchronize() override {}
  int64_t TotalBytes() const override { return 0; }
  int64_t AllocatedBytes() const override { return 0; }
  int64_t PeakAllocatedBytes() const override { return 0; }
  void ResetPeak() override {}
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceRuntime>> DeviceRuntime::Create(const std::string& device) {
  if (device == "cpu") return std::unique_ptr<DeviceRuntime>(new CpuRuntime());
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) {
    int index = 0;
    if (device.size() > 5 && !absl::SimpleAtoi(device.substr(5), &index)) {
      return absl::InvalidArgumentError(absl::StrCat("device: bad CUDA index in '", device, "'"));
    }
#ifdef MEGATRAIN_WITH_CUDA
    return CreateCudaRuntime(index);
#else
    return absl::UnavailableError(
        absl::StrCat("device: '", device, "' asked for, but this build's LibTorch has no CUDA"));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device: expected cpu, cuda or cuda:N, got '", device, "'"));
}

}  // namespace megatrain::engine
