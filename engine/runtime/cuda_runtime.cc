// CUDA runtime: RAII streams and events, and LibTorch stream binding.
// Compiled only when LibTorch has CUDA (MEGATRAIN_WITH_CUDA).
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdio>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/runtime/device_runtime.h"

namespace megatrain::engine {
namespace {

// Logs a failed CUDA call in a destructor (never throws there).
void LogIfError(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    std::fprintf(stderr, "megatrain: %s: %s\n", what, cudaGetErrorString(err));
}

// Aborts the enqueuing path with an exception LibTorch-style: the executor
// catches exceptions at the engine boundary and maps them to INTERNAL.
void ThrowIfError(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(err)));
  }
}

// One owner of a cudaStream_t, destroyed on its device after draining.
class CudaStream {
 public:
  static CudaStream Create(int device_index, int priority) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
    cudaStream_t s = nullptr;
    ThrowIfError(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority),
                 "cudaStreamCreateWithPriority");
    return CudaStream(device_index, s);
  }
  CudaStream(CudaStream&& o) noexcept : device_index_(o.device_index_), stream_(o.stream_) {
    o.stream_ = nullptr;
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  CudaStream& operator=(CudaStream&&) = delete;
  ~CudaStream() {
    if (stream_ == nullptr) return;
    int previous = 0;
    LogIfError(cudaGetDevice(&previous), "cudaGetDevice");
    LogIfError(cudaSetDevice(device_index_), "cudaSetDevice");
    LogIfError(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    LogIfError(cudaStreamDestroy(stream_), "cudaStreamDestroy");
    LogIfError(cudaSetDevice(previous), "cudaSetDevice");
  }
  cudaStream_t get() const { return stream_; }

 private:
  CudaStream(int device_index, cudaStream_t s) : device_index_(device_index), stream_(s) {}
  int device_index_;
  cudaStream_t stream_;
};

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent(int device_index, bool timing) : device_index_(device_index) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
    ThrowIfError(
        cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
  }
  ~CudaEvent() override {
    int previous = 0;
    LogIfError(cudaGetDevice(&previous), "cudaGetDevice");
    LogIfError(cudaSetDevice(device_index_), "cudaSetDevice");
    LogIfError(cudaEventDestroy(event_), "cudaEventDestroy");
    LogIfError(cudaSetDevice(previous), "cudaSetDevice");
  }
  cudaEvent_t get() const { return event_; }

 private:
  int device_index_;
  cudaEvent_t event_ = nullptr;
};

class CudaScope final : public StreamScope {
 public:
  explicit CudaScope(c10::cuda::CUDAStream stream) : guard_(stream) {}

 private:
  c10::cuda::CUDAStreamGuard guard_;
};

// One captured CUDA graph; LibTorch's CUDAGraph releases it and its share
// of the memory pool.
class CudaGraph final : public DeviceGraph {
 public:
  void Replay() override { graph_.replay(); }
  at::cuda::CUDAGraph& graph() { return graph_; }

 private:
  at::cuda::CUDAGraph graph_;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  explicit CudaRuntime(int device_index) : device_index_(device_index) {
    int least = 0, greatest = 0;
    ThrowIfError(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                 "cudaDeviceGetStreamPriorityRange");
    // Compute gets the highest priority so copies never delay a kernel launch.
    streams_[static_cast<int>(StreamKind::kCompute)].emplace(
        CudaStream::Create(device_index, greatest));
    streams_[static_cast<int>(StreamKind::kH2D)].emplace(CudaStream::Create(device_index, least));
    streams_[static_cast<int>(StreamKind::kD2H)].emplace(CudaStream::Create(device_index, least));
    cudaDeviceProp prop{};
    ThrowIfError(cudaGetDeviceProperties(&prop, device_index), "cudaGetDeviceProperties");
    name_ = prop.name;
  }

  ~CudaRuntime() override { Synchronize(); }

  c10::Device device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_index_));
  }
  bool is_cuda() const override { return true; }
  std::string name() const override { return name_; }

  std::unique_ptr<StreamScope> Use(StreamKind stream) override {
    return std::make_unique<CudaScope>(c10::cuda::getStreamFromExternal(
        Raw(stream), static_cast<c10::DeviceIndex>(device_index_)));
  }

  void CopyHostToDevice(void* dst, const void* src, size_t bytes) override {
    ThrowIfError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, Raw(StreamKind::kH2D)),
                 "cudaMemcpyAsync H2D");
  }
  void CopyDeviceToHost(void* dst, const void* src, size_t bytes) override {
    ThrowIfError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, Raw(StreamKind::kD2H)),
                 "cudaMemcpyAsync D2H");
  }

  std::unique_ptr<DeviceEvent> CreateEvent(bool timing) override {
    return std::make_unique<CudaEvent>(device_index_, timing);
  }
  void Record(StreamKind stream, DeviceEvent& event) override {
    ThrowIfError(cudaEventRecord(Get(event), Raw(stream)), "cudaEventRecord");
  }
  void Wait(StreamKind stream, DeviceEvent& event) override {
    ThrowIfError(cudaStreamWaitEvent(Raw(stream), Get(event), 0), "cudaStreamWaitEvent");
  }
  void HostWait(DeviceEvent& event) override {
    ThrowIfError(cudaEventSynchronize(Get(event)), "cudaEventSynchronize");
  }
  double ElapsedMs(DeviceEvent& start, DeviceEvent& end) override {
    float ms = 0;
    ThrowIfError(cudaEventElapsedTime(&ms, Get(start), Get(end)), "cudaEventElapsedTime");
    return ms;
  }
  std::unique_ptr<DeviceGraph> CaptureGraph(std::function<void()> body) override {
    auto scope = Use(StreamKind::kCompute);
    if (!graph_pool_.has_value()) graph_pool_ = at::cuda::graph_pool_handle();
    auto graph = std::make_unique<CudaGraph>();
    graph->graph().capture_begin(*graph_pool_, cudaStreamCaptureModeThreadLocal);
    try {
      body();
    } catch (...) {
      EndFailedCapture(*graph);
      throw;
    }
    try {
      graph->graph().capture_end();
    } catch (...) {
      (void)cudaGetLastError();
      throw;
    }
    return graph;
  }

  void Synchronize() override {
    for (auto& s : streams_) {
      if (s.has_value()) LogIfError(cudaStreamSynchronize(s->get()), "cudaStreamSynchronize");
    }
  }

  auto Stats() const {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device_index_));
  }
  int64_t TotalBytes() const override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    size_t free = 0, total = 0;
    ThrowIfError(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return static_cast<int64_t>(total);
  }
  int64_t AllocatedBytes() const override { return Stats().allocated_bytes[0].current; }
  int64_t PeakAllocatedBytes() const override { return Stats().allocated_bytes[0].peak; }
  void ResetPeak() override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index_));
  }

 private:
  // Ends a capture whose body threw, discarding the graph, and clears the
  // error the body's launches may have left (a later launch check would
  // report it).
  static void EndFailedCapture(CudaGraph& graph) {
    try {
      graph.graph().capture_end();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megatrain: abandoned CUDA graph capture: %s\n", e.what());
    }
    (void)cudaGetLastError();
  }

  cudaStream_t Raw(StreamKind kind) const { return streams_[static_cast<int>(kind)]->get(); }
  static cudaEvent_t Get(DeviceEvent& e) { return static_cast<CudaEvent&>(e).get(); }

  int device_index_;
  std::string name_;
  std::array<std::optional<CudaStream>, kNumStreams> streams_;
  std::optional<c10::cuda::MempoolId_t> graph_pool_;  // shared by every CaptureGraph
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateCudaRuntime(int device_index) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("device: no CUDA device visible (", cudaGetErrorString(err), ")"));
  }
  if (device_index < 0 || device_index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: cuda:", device_index, " does not exist (", count, " devices)"));
  }
  try {
    return std::unique_ptr<DeviceRuntime>(new CudaRuntime(device_index));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("device: ", e.what()));
  }
}

}  // namespace megatrain::engine
