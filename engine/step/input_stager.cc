// Input staging (input_stager.h).
#include "engine/step/input_stager.h"

#include <cstring>

#include "absl/base/internal/raw_logging.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {

absl::StatusOr<std::unique_ptr<InputStager>> InputStager::Create(StepEnv* env, int64_t micro_batch,
                                                                 int64_t seq_len,
                                                                 bool rows_on_host) {
  std::unique_ptr<InputStager> s(new InputStager(env, micro_batch, seq_len));
  MEGATRAIN_ASSIGN_OR_RETURN(
      s->staging_,
      HostBuffer::Allocate(static_cast<size_t>(InputStagerPinnedBytes(
                               micro_batch * seq_len, env->config.hidden_size, rows_on_host)),
                           env->runtime->is_cuda()));
  s->ready_ = env->runtime->CreateEvent();
  s->done_ = env->runtime->CreateEvent();
  return s;
}

UploadedInput InputStager::UploadIds(const MicroBatch& mb, const at::Tensor& table) {
  DeviceRuntime* runtime = env_->runtime;
  const int64_t rows = b_ * t_;
  int64_t* ids_host = static_cast<int64_t*>(staging_.data());  // [rows] then labels [rows]
  for (int64_t r = 0; r < rows; ++r) {
    ids_host[r] = mb.input_ids[r];
    ids_host[rows + r] = mb.labels[r];
  }
  at::Tensor both =
      at::empty({2, rows}, at::TensorOptions().dtype(at::kLong).device(runtime->device()));
  runtime->Record(StreamKind::kCompute, *ready_);  // allocation usable
  runtime->Wait(StreamKind::kH2D, *ready_);
  const int token = env_->timer.Begin(StreamKind::kH2D);
  runtime->CopyHostToDevice(both.data_ptr(), ids_host, static_cast<size_t>(rows) * 16);
  env_->timer.End(StreamKind::kH2D, token);
  runtime->Record(StreamKind::kH2D, *done_);
  runtime->Wait(StreamKind::kCompute, *done_);
  pending_ = true;
  env_->h2d_bytes += rows * 16;
  UploadedInput up;
  up.ids = both[0];
  up.labels = both[1].view({b_, t_});
  const int gather = env_->timer.Begin(StreamKind::kCompute);
  up.x = at::embedding(table, up.ids).view({b_, t_, env_->config.hidden_size});
  env_->timer.End(StreamKind::kCompute, gather, PhaseTimer::kForward);
  return up;
}

void InputStager::GatherSources(const MicroBatch& mb) {
  const int64_t rows = b_ * t_, c = env_->config.hidden_size;
  row_sources_.resize(rows);
  if (row_gate_) {
    const StepClock::time_point start = StepClock::now();
    const int wait = env_->timer.BeginWait();
    row_gate_(absl::MakeConstSpan(mb.input_ids), absl::MakeSpan(row_sources_));
    env_->timer.EndWait(wait);
    env_->gate_wait_seconds += SecondsSince(start);
    return;
  }
  const int64_t emb = env_->layout.embedding_block();
  env_->WaitWeights(emb);
  const float* table = env_->store->master(emb);
  for (int64_t r = 0; r < rows; ++r) {
    row_sources_[r] = table + static_cast<int64_t>(mb.input_ids[r]) * c;
  }
}

UploadedInput InputStager::Upload(const MicroBatch& mb, const at::Tensor& resident_table) {
  UploadedInput up = UploadTokens(mb, resident_table);
  if (!mb.position_ids.empty()) {  // Note [Document attention] in model/layers.h
    up.documents = MakePackedDocuments(mb.position_ids, b_, t_, env_->runtime->device());
    env_->h2d_bytes += up.documents->cu_seqlens.numel() * 4 + b_ * t_ * 16;
  }
  return up;
}

UploadedInput InputStager::UploadTokens(const MicroBatch& mb, const at::Tensor& resident_table) {
  DeviceRuntime* runtime = env_->runtime;
  if (pending_) runtime->HostWait(*done_);  // staging reused
  if (resident_table.defined()) return UploadIds(mb, resident_table);
  const int64_t rows = b_ * t_, c = env_->config.hidden_size;
  ABSL_RAW_CHECK(staging_.bytes() >= static_cast<size_t>(InputStagerPinnedBytes(rows, c, true)),
                 "InputStager: rows gathered on the host by a stager created for ids only");
  float* hidden = static_cast<float*>(staging_.data());
  int64_t* labels = reinterpret_cast<int64_t*>(hidden + rows * c);
  GatherSources(mb);
  env_->pool->ParallelFor(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(hidden + r * c, row_sources_[r], c * 4);
      labels[r] = mb.labels[r];
    }
  });
  at::Tensor x =
      at::empty({b_, t_, c}, at::TensorOptions().dtype(at::kFloat).device(runtime->device()));
  at::Tensor y =
      at::empty({b_, t_}, at::TensorOptions().dtype(at::kLong).device(runtime->device()));
  runtime->Record(StreamKind::kCompute, *ready_);  // allocations usable
  runtime->Wait(StreamKind::kH2D, *ready_);
  const int token = env_->timer.Begin(StreamKind::kH2D);
  runtime->CopyHostToDevice(x.data_ptr(), hidden, rows * c * 4);
  runtime->CopyHostToDevice(y.data_ptr(), labels, rows * 8);
  env_->timer.End(StreamKind::kH2D, token);
  runtime->Record(StreamKind::kH2D, *done_);
  runtime->Wait(StreamKind::kCompute, *done_);
  pending_ = true;
  env_->h2d_bytes += rows * (c * 4 + 8);
  UploadedInput up;
  up.x = std::move(x);
  up.labels = std::move(y);
  return up;
}

}  // namespace megatrain::engine
