// Activation offload (activation_offload.h).
#include "engine/step/activation_offload.h"

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::StatusOr<std::unique_ptr<ActivationOffload>> ActivationOffload::Create(StepEnv* env,
                                                                             int64_t micro_batch,
                                                                             int64_t seq_len,
                                                                             int wave) {
  std::unique_ptr<ActivationOffload> o(new ActivationOffload(env, wave));
  const int64_t c = env->config.hidden_size, num_layers = env->layout.num_layers();
  if (num_layers <= 1) return o;
  const int64_t layer_bytes = micro_batch * seq_len * c * 4;
  const int64_t host_slots = wave * (num_layers - 1);
  const size_t host_bytes = static_cast<size_t>(host_slots * layer_bytes);
  absl::StatusOr<HostBuffer> host = HostBuffer::Allocate(host_bytes, env->runtime->is_cuda());
  if (!host.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("train.offload_activations: cannot allocate ", host_bytes,
                     " bytes of pinned host memory for ", host_slots,
                     " saved layer inputs of micro_batch x seq_len x hidden_size fp32: ",
                     host.status().message()));
  }
  o->host_ = std::move(*host);
  for (int64_t s = 0; s < host_slots; ++s) o->offloaded_.push_back(env->runtime->CreateEvent());
  o->ring_of_.assign(host_slots, 0);
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(env->runtime->device());
  for (int k = 0; k < 2; ++k) {
    o->device_[k] = at::empty({micro_batch, seq_len, c}, fp32);
    o->device_bytes_ += static_cast<int64_t>(o->device_[k].nbytes());
    o->loaded_[k] = env->runtime->CreateEvent();
    o->free_[k] = env->runtime->CreateEvent();
  }
  o->ready_ = env->runtime->CreateEvent();
  return o;
}

void ActivationOffload::Save(int64_t layer, int m, const at::Tensor& x) {
  DeviceRuntime* runtime = env_->runtime;
  const int64_t slot = Slot(layer, m);
  const size_t bytes = static_cast<size_t>(x.numel()) * 4;
  runtime->Record(StreamKind::kCompute, *ready_);
  runtime->Wait(StreamKind::kD2H, *ready_);
  const int token = env_->timer.Begin(StreamKind::kD2H);
  runtime->CopyDeviceToHost(static_cast<char*>(host_.data()) + slot * bytes, x.data_ptr(), bytes);
  env_->timer.End(StreamKind::kD2H, token);
  runtime->Record(StreamKind::kD2H, *offloaded_[slot]);
  env_->d2h_bytes += static_cast<int64_t>(bytes);
  in_flight_.emplace_back(slot, x);
}

void ActivationOffload::RetireCopies(bool last_layer) {
  while (in_flight_.size() > 1 || (!in_flight_.empty() && last_layer)) {
    env_->runtime->Wait(StreamKind::kCompute, *offloaded_[in_flight_.front().first]);
    in_flight_.pop_front();
  }
}

at::Tensor ActivationOffload::Prefetch(int64_t layer, int m) {
  DeviceRuntime* runtime = env_->runtime;
  const int64_t slot = Slot(layer, m);
  const int k = next_ring_;
  next_ring_ ^= 1;
  ring_of_[slot] = k;
  at::Tensor& dst = device_[k];
  const size_t bytes = static_cast<size_t>(dst.numel()) * 4;
  runtime->Wait(StreamKind::kH2D, *free_[k]);          // its previous reader is done
  runtime->Wait(StreamKind::kH2D, *offloaded_[slot]);  // the host copy is complete
  const int token = env_->timer.Begin(StreamKind::kH2D);
  runtime->CopyHostToDevice(dst.data_ptr(), static_cast<const char*>(host_.data()) + slot * bytes,
                            bytes);
  env_->timer.End(StreamKind::kH2D, token);
  runtime->Record(StreamKind::kH2D, *loaded_[k]);
  env_->h2d_bytes += static_cast<int64_t>(bytes);
  return dst;
}

void ActivationOffload::WaitLoaded(int64_t layer, int m) {
  env_->runtime->Wait(StreamKind::kCompute, *loaded_[ring_of_[Slot(layer, m)]]);
}

void ActivationOffload::MarkFree(int64_t layer, int m) {
  env_->runtime->Record(StreamKind::kCompute, *free_[ring_of_[Slot(layer, m)]]);
}

}  // namespace megatrain::engine
