// Activation offload (Note [Activation offload] in executor.h): the saved
// inputs of decoder layers 0..L-2 in pinned host memory during forward,
// brought back one layer ahead during backward into a ring of two device
// buffers.
//
// Event protocol, per layer l (all events owned here):
//   forward:  kCompute records ready_ -> kD2H waits, copies x to host slot
//             l, records offloaded_[l]; kCompute waits offloaded_[l] one
//             layer later (RetireCopies) before the device copy can go.
//   backward: kH2D waits free_[l%2] and offloaded_[l], copies host slot l
//             into ring buffer l%2, records loaded_[l%2]; kCompute waits
//             loaded_[l%2] (WaitLoaded) and records free_[l%2] after its
//             last read (MarkFree).
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
  // Allocates (L-1) x [B, T, C] fp32 of pinned host memory and two [B, T,
  // C] fp32 device buffers; nothing for fewer than two layers.
  // RESOURCE_EXHAUSTED (naming train.offload_activations) when pinned
  // memory runs out; LibTorch exceptions for device memory.
  static absl::StatusOr<std::unique_ptr<ActivationOffload>> Create(StepEnv* env,
                                                                   int64_t micro_batch,
                                                                   int64_t seq_len);

  // Enqueues the copy of layer `layer`'s input `x` (produced on kCompute)
  // to its host slot on kD2H; keeps `x` alive until RetireCopies.
  void Save(int64_t layer, const at::Tensor& x);
  // After a layer's forward: lets go of the device copies whose D2H copy
  // was issued a layer ago (all of them after the last layer), making
  // kCompute wait for those copies (long done).
  void RetireCopies(bool last_layer);
  // Enqueues the copy of layer `layer`'s input back into ring buffer
  // layer % 2 on kH2D; returns that buffer ([B, T, C] fp32, device).
  at::Tensor Prefetch(int64_t layer);
  // kCompute waits until layer `layer`'s input is back.
  void WaitLoaded(int64_t layer);
  // kCompute's last read of layer `layer`'s ring buffer is enqueued.
  void MarkFree(int64_t layer);

  int64_t pinned_bytes() const { return static_cast<int64_t>(host_.bytes()); }
  int64_t device_bytes() const { return device_bytes_; }

 private:
  explicit ActivationOffload(StepEnv* env) : env_(env) {}

  StepEnv* env_;
  HostBuffer host_;                                      // pinned [L-1, B*T*C] fp32
  std::vector<std::unique_ptr<DeviceEvent>> offloaded_;  // per layer, on kD2H
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
