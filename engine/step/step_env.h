// What the executor's parts share: the store, the device runtime, the
// host pool, the model's layout, the pass's phase timer and traffic
// counters, and the trainer's weight gate.
//
// Every part of the executor (weight slots, input staging, activation
// offload, gradient landing, device gradient accumulation, resident
// blocks) holds a pointer to the one StepEnv of its executor, which owns
// it and outlives them. The counters are per pass: BeginPass zeroes them.
//
// Thread-safety: written by the enqueuing thread only, except that the
// gradient lander's accumulator thread calls weight_gate (the gate is
// thread-safe) and reads store, runtime and pool.
#ifndef MEGATRAIN_ENGINE_STEP_STEP_ENV_H_
#define MEGATRAIN_ENGINE_STEP_STEP_ENV_H_

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/runtime/device_runtime.h"
#include "engine/store/host_store.h"
#include "engine/model/param_layout.h"
#include "engine/model/precision.h"
#include "engine/runtime/thread_pool.h"

namespace megatrain::engine {

using StepClock = std::chrono::steady_clock;

inline double SecondsSince(StepClock::time_point start) {
  return std::chrono::duration<double>(StepClock::now() - start).count();
}

inline at::ScalarType ScalarTypeOf(ComputeDtype d) {
  return d == ComputeDtype::kBf16 ? at::kBFloat16 : at::kFloat;
}

// A CPU tensor over `numel` elements of host memory the caller owns (the
// store's arenas), for copies to and from the device.
inline at::Tensor HostTensor(void* data, int64_t numel, at::ScalarType dtype) {
  return at::from_blob(data, {numel}, at::TensorOptions().dtype(dtype));
}

// Maps a LibTorch exception to a status (the engine boundary):
// RESOURCE_EXHAUSTED for device out of memory, INTERNAL otherwise.
absl::Status StatusFromException(const std::exception& e);

// Busy time of the three streams. On CUDA, pairs of timing events resolved
// at the end of a pass; on CPU (synchronous), wall-clock intervals.
// Thread-safety: the enqueuing thread only.
class PhaseTimer {
 public:
  explicit PhaseTimer(DeviceRuntime* runtime) : runtime_(runtime) {}

  // What a compute interval does, for the idle-gap breakdown.
  enum Label { kOther = 0, kForward = 1, kHead = 2, kBackward = 3 };

  void Reset();
  // Marks the start of a pass on the compute stream (CUDA only).
  void MarkStart();
  // Marks the start of a busy interval on `stream`; returns a token for End.
  int Begin(StreamKind stream);
  void End(StreamKind stream, int begin_token, Label label = kOther);
  // Brackets a host wait of the enqueuing thread (a gate): on CUDA, events
  // on the compute stream before and after it, so that the time between
  // them on the device is the idle time the wait caused (the work enqueued
  // before it was done before the wait ended); on the CPU, the wait itself.
  int BeginWait();
  void EndWait(int begin_token);
  // Compute-stream idle time the BeginWait/EndWait waits caused, in
  // seconds; call after the streams are synchronised.
  double WaitIdleSeconds();
  // Idle time of the compute stream before each interval, by the label of
  // the work that was waited for: [pass start, forward, head, backward].
  // Call after the streams are synchronised; zeros on the CPU.
  std::array<double, 4> ComputeGaps();
  // Seconds per stream; call after the streams are synchronised.
  std::array<double, kNumStreams> Seconds();

 private:
  struct Interval {
    int stream, begin, end;
    Label label;
  };
  int NextEvent();

  DeviceRuntime* runtime_;
  std::vector<std::unique_ptr<DeviceEvent>> events_;
  int used_ = 0;
  std::vector<Interval> intervals_;
  int start_marker_ = -1;
  std::array<double, kNumStreams> cpu_seconds_{};
  std::array<StepClock::time_point, kNumStreams> cpu_start_{};
  std::vector<std::pair<int, int>> waits_;  // BeginWait/EndWait event pairs
  double cpu_wait_seconds_ = 0;
  StepClock::time_point cpu_wait_start_{};
};

struct StepEnv {
  StepEnv(HostStore* store_in, DeviceRuntime* runtime_in, ThreadPool* pool_in,
          ComputeDtype compute_dtype_in)
      : store(store_in),
        runtime(runtime_in),
        pool(pool_in),
        config(store_in->config()),
        layout(store_in->layout()),
        compute_dtype(ScalarTypeOf(compute_dtype_in)),
        timer(runtime_in) {}

  // Zeroes the per-pass counters and the timer.
  void BeginPass() {
    h2d_bytes = d2h_bytes = h2d_weight_bytes = 0;
    gate_wait_seconds = grad_wait_seconds = 0;
    timer.Reset();
  }

  // Blocks until `block`'s host weights are current (the trainer's gate),
  // timing the wait (Note [Optimizer overlap] in trainer.h).
  void WaitWeights(int64_t block) {
    if (!weight_gate) return;
    const StepClock::time_point start = StepClock::now();
    const int wait = timer.BeginWait();
    weight_gate(block);
    timer.EndWait(wait);
    gate_wait_seconds += SecondsSince(start);
  }

  HostStore* const store;
  DeviceRuntime* const runtime;
  ThreadPool* const pool;
  const ModelConfig& config;
  const ModelLayout& layout;
  const at::ScalarType compute_dtype;  // of streamed weights on the device
  PhaseTimer timer;
  std::function<void(int64_t block)> weight_gate;  // may be empty
  // Note [Device reduce-scatter] in gradient_reducer.h: reduces a block's
  // whole device gradient before it lands (GradientReducer::
  // ReduceScatterOnDevice's contract); may be empty.
  std::function<bool(int64_t block, float* grad, int64_t numel, int64_t* begin, int64_t* end)>
      reduce_on_device;
  // Note [Resident blocks on every rank] in gradient_reducer.h: sums a
  // resident block's final device gradient over the ranks in place
  // (GradientReducer::AllReduceOnDevice's contract); may be empty.
  std::function<bool(int64_t block, float* grad, int64_t numel)> all_reduce_on_device;
  // Note [Sharded weight streaming] in weight_slots.h: this rank's place
  // among the ranks that share the loads of streamed blocks (world 1:
  // none), and the gather of a slot's shards over them
  // (GradientReducer::AllGatherWeights's contract).
  struct WeightSharding {
    int rank = 0;
    int world = 1;
    std::function<void(int64_t block, void* slot, int64_t shard_numel, int element_bytes)>
        all_gather;
  };
  WeightSharding weight_sharding;

  // Per pass (BeginPass).
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  int64_t h2d_weight_bytes = 0;  // of h2d_bytes, the weight slots' loads
  double gate_wait_seconds = 0;  // enqueuing thread in the weight and row gates
  double grad_wait_seconds = 0;  // enqueuing thread waiting for a free gradient slot
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_STEP_ENV_H_
