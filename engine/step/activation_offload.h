// Activation offload (Note [Activation offload] in executor.h): the saved
// inputs of decoder layers 0..L-2 in pinned host memory during forward,
// brought back one action ahead during backward into a ring of two device
// buffers. A wave of W micro-batches (Note [Layer-major schedule] in
// step_plan.h) has W x (L-1) host slots: slot s = (m % W) * (L-1) + l for
// layer l of micro-batch m.
//
// Event protocol, per host slot s (all events owned here):
//   forward:  kCompute records ready_ -> kD2H waits, copies x to host slot
//             s, records offloaded_[s]; kCompute waits offloaded_[s] one
//             layer later (RetireCopies) before the device copy can go.
//   backward: the k-th prefetch of the pass uses ring buffer r = k % 2:
//             kH2D waits free_[r] and offloaded_[s], copies host slot s
//             into ring buffer r, records loaded_[r]; kCompute waits
//             loaded_[r] (WaitLoaded) and records free_[r] after its last
//             read (MarkFree). Prefetches run at most one use ahead, so
//             two buffers suffice.
// A host slot is rewritten (the next micro-batch or wave) only after
// kCompute waited for its prefetch, earlier on that stream.
//
// Ownership: owns the pinned buffer, the device ring and the events; uses
// the StepEnv. Thread-safety: the enqueuing thread only.
#ifndef MEGATRAIN_ENGINE_STEP_ACTIVATION_OFFLOAD_H_
#define MEGATRAIN_ENGINE_STEP_ACTIVATION_OFFLOAD_H_

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/host_buffer.h"
#include "engine/step/step_env.h"

namespace megatrain::engine {

class ActivationOffload {
 public:
  // Allocates wave x (L-1) x [B, T, C] fp32 of pinned host memory and two
  // [B, T, C] fp32 device buffers; nothing for fewer than two layers.
  // `wave` >= 1 (1 for the micro-batch-major schedule).
  // RESOURCE_EXHAUSTED (naming train.offload_activations) when pinned
  // memory runs out; LibTorch exceptions for device memory.
  static absl::StatusOr<std::unique_ptr<ActivationOffload>> Create(StepEnv* env,
                                                                   int64_t micro_batch,
                                                                   int64_t seq_len, int wave);

  // Enqueues the copy of micro-batch `m`'s layer `layer` input `x`
  // (produced on kCompute) to its host slot on kD2H; keeps `x` alive until
  // RetireCopies.
  void Save(int64_t layer, int m, const at::Tensor& x);
  // After a layer's forward: lets go of the device copies whose D2H copy
  // was issued a layer ago (all of them after the last layer), making
  // kCompute wait for those copies (long done).
  void RetireCopies(bool last_layer);
  // Enqueues the copy of micro-batch `m`'s layer `layer` input back into
  // the next ring buffer on kH2D; returns that buffer ([B, T, C] fp32,
  // device).
  at::Tensor Prefetch(int64_t layer, int m);
  // kCompute waits until that input is back.
  void WaitLoaded(int64_t layer, int m);
  // kCompute's last read of that input's ring buffer is enqueued.
  void MarkFree(int64_t layer, int m);

  int64_t pinned_bytes() const { return static_cast<int64_t>(host_.bytes()); }
  int64_t device_bytes() const { return device_bytes_; }

 private:
  ActivationOffload(StepEnv* env, int wave) : env_(env), wave_(wave) {}
  // The host slot of micro-batch `m`'s layer `layer` input.
  int64_t Slot(int64_t layer, int m) const {
    return (m % wave_) * (env_->layout.num_layers() - 1) + layer;
  }

  StepEnv* env_;
  int wave_;
  HostBuffer host_;                                      // pinned [W*(L-1), B*T*C] fp32
  std::vector<std::unique_ptr<DeviceEvent>> offloaded_;  // per host slot, on kD2H
  std::vector<int> ring_of_;                             // per host slot: its ring buffer
  int next_ring_ = 0;                                    // of the next prefetch
  std::array<at::Tensor, 2> device_;                     // [B, T, C] fp32
  std::array<std::unique_ptr<DeviceEvent>, 2> loaded_;   // on kH2D
  std::array<std::unique_ptr<DeviceEvent>, 2> free_;     // on kCompute
  std::unique_ptr<DeviceEvent> ready_;                   // on kCompute
  // Offloaded inputs whose D2H copy may still be reading them.
  std::deque<std::pair<int64_t, at::Tensor>> in_flight_;
  int64_t device_bytes_ = 0;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_ACTIVATION_OFFLOAD_H_
