// The device side of the streaming pipeline, behind one interface so that the
// executor's logic is the same on CPU (CI) and CUDA (GPU machines).
//
// Note [Streams and events]
// The executor orders work on three streams: kH2D (weight prefetch and
// activation upload), kCompute (layer math), kD2H (gradient offload). Every
// cross-stream dependency is an event: Record(stream, event) marks the point
// after the work enqueued so far; Wait(stream, event) makes later work on
// `stream` wait for that point; HostWait(event) blocks the calling thread.
// A Wait binds to the most recent Record of the event at the time Wait is
// called, as with cudaStreamWaitEvent, so the executor records before it
// waits, in one enqueuing thread.
//
// On the CPU runtime every operation runs to completion when it is called,
// so events are always complete and the streams are the calling thread; the
// executor's sequencing, slot reuse and byte accounting are still exercised.
// The CUDA runtime (cuda_runtime.cc, built when Torch has CUDA) owns
// non-blocking streams created with cudaStreamCreateWithPriority, hands them
// to LibTorch through getStreamFromExternal, and owns its events; all are
// released on their device by their owners' destructors after the streams
// drain.
//
// Thread-safety: a runtime is used by one enqueuing thread, except
// HostWait/Query on events, which any thread may call.
#ifndef MEGATRAIN_ENGINE_DEVICE_RUNTIME_H_
#define MEGATRAIN_ENGINE_DEVICE_RUNTIME_H_

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace megatrain::engine {

enum class StreamKind { kCompute = 0, kH2D = 1, kD2H = 2 };
inline constexpr int kNumStreams = 3;

// An event owned by a runtime. Move-only; destroyed by its owner.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};

// RAII: while alive, LibTorch ops on this thread are enqueued on a stream.
class StreamScope {
 public:
  virtual ~StreamScope() = default;
};

// Work captured from the compute stream (a CUDA graph) by
// DeviceRuntime::CaptureGraph, replayed as one launch (Note [Layer graphs]
// in engine/step/layer_graphs.h). Destroyed by its owner, before the
// runtime.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Enqueues the captured work on the compute stream, which must be the
  // calling thread's current stream (DeviceRuntime::Use). The CPU runtime
  // runs the captured body again instead. Throws on a CUDA error.
  virtual void Replay() = 0;
};

class DeviceRuntime {
 public:
  // "cpu", "cuda" or "cuda:N". INVALID_ARGUMENT for anything else;
  // UNAVAILABLE when CUDA is asked for and the build or machine has none.
  static absl::StatusOr<std::unique_ptr<DeviceRuntime>> Create(const std::string& device);

  virtual ~DeviceRuntime() = default;

  virtual c10::Device device() const = 0;
  virtual bool is_cuda() const = 0;
  // Human-readable device name ("cpu", "NVIDIA H200").
  virtual std::string name() const = 0;

  // Makes `stream` the current LibTorch stream of this thread until the
  // returned scope is destroyed.
  virtual std::unique_ptr<StreamScope> Use(StreamKind stream) = 0;

  // Enqueues a copy of `bytes` on kH2D (host -> device) or kD2H. The host
  // side must be pinned for the copy to be asynchronous on CUDA; it must stay
  // untouched until an event recorded after the copy has completed.
  virtual void CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes) = 0;

  // Events (Note [Streams and events]). `timing` events can be timed.
  virtual std::unique_ptr<DeviceEvent> CreateEvent(bool timing = false) = 0;
  virtual void Record(StreamKind stream, DeviceEvent& event) = 0;
  virtual void Wait(StreamKind stream, DeviceEvent& event) = 0;
  virtual void HostWait(DeviceEvent& event) = 0;
  // Milliseconds between two completed timing events.
  virtual double ElapsedMs(DeviceEvent& start, DeviceEvent& end) = 0;

  // Captures what `body` enqueues on the compute stream (which it must use
  // as the current stream) into a graph, without running it: CUDA graph
  // capture in cudaStreamCaptureModeThreadLocal, so that the runtime's
  // other threads (event waits of the gradient lander and the optimizer)
  // stay legal, with every graph of this runtime sharing one private
  // memory pool. Tensors `body` allocates live in that pool for the
  // graph's lifetime; what it returns through its captures is rewritten in
  // place by each Replay. The CPU runtime keeps `body` and runs it on each
  // Replay. `body` must not synchronise with the host (no .item(), no
  // data-dependent shapes). Throws (with the capture ended and the CUDA
  // error cleared) when capture fails; the runtime is then still usable.
  virtual std::unique_ptr<DeviceGraph> CaptureGraph(std::function<void()> body) = 0;

  // Blocks until all three streams are idle.
  virtual void Synchronize() = 0;

  // Device memory of the whole device in bytes (the driver's total, not
  // what is free); 0 on the CPU, whose memory is the host's.
  virtual int64_t TotalBytes() const = 0;
  // Device memory: bytes in use now, peak since the last reset.
  virtual int64_t AllocatedBytes() const = 0;
  virtual int64_t PeakAllocatedBytes() const = 0;
  virtual void ResetPeak() = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DEVICE_RUNTIME_H_
