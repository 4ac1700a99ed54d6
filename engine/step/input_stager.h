// Input staging: a micro-batch's layer-0 input and labels onto the device.
//
// Host embedding (the default): the embedding rows of the micro-batch's
// tokens are gathered on the host (on the critical pool) from the fp32
// master, or from the sources the trainer's row gate names (Note
// [Embedding rows on demand] in trainer.h), into one pinned buffer with
// the labels, and uploaded on kH2D. Resident embedding (Note [Resident
// embedding] in executor.h): only token ids and labels cross; the rows are
// gathered on the device.
//
// The pinned buffer is rewritten only after its previous upload completed:
// Upload waits on the host for it (once per micro-batch, a documented
// synchronisation point of the pass).
//
// Ownership: owns the pinned buffer and two events; uses the StepEnv.
// Thread-safety: the enqueuing thread only. Streams: copies on kH2D; the
// device gather on kCompute.
#ifndef MEGATRAIN_ENGINE_STEP_INPUT_STAGER_H_
#define MEGATRAIN_ENGINE_STEP_INPUT_STAGER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/data/batch.h"
#include "engine/model/layers.h"
#include "engine/runtime/host_buffer.h"
#include "engine/step/step_env.h"

namespace megatrain::engine {

// Pinned bytes of an InputStager for `tokens` = B*T per micro-batch:
// each token's fp32 row (C x 4) and int64 label with the rows gathered on
// the host, else its int64 id and label (16: a resident embedding).
inline int64_t InputStagerPinnedBytes(int64_t tokens, int64_t hidden_size, bool rows_on_host) {
  return tokens * (rows_on_host ? hidden_size * 4 + 8 : 16);
}

// A micro-batch on the device.
struct UploadedInput {
  at::Tensor x;       // [B, T, C] fp32: layer 0's input
  at::Tensor labels;  // [B, T] int64
  at::Tensor ids;     // [B*T] int64, with a resident embedding only
  // The micro-batch's documents when it carries position ids (Note
  // [Document attention] in engine/model/layers.h), else none.
  std::optional<PackedDocuments> documents;
};

class InputStager {
 public:
  // See StreamingExecutor::EmbeddingRowGate.
  using RowGate = std::function<void(absl::Span<const int32_t> token_ids,
                                     absl::Span<const float*> row_sources)>;

  // Allocates the pinned buffer: [B*T*C] fp32 + [B*T] int64 with
  // `rows_on_host` (the host embedding), else [B*T] int64 ids + [B*T]
  // int64 labels (InputStagerPinnedBytes). RESOURCE_EXHAUSTED when pinned
  // memory runs out.
  static absl::StatusOr<std::unique_ptr<InputStager>> Create(StepEnv* env, int64_t micro_batch,
                                                             int64_t seq_len, bool rows_on_host);

  void SetRowGate(RowGate gate) { row_gate_ = std::move(gate); }

  // Stages `mb` and enqueues its upload; kCompute waits for it. With
  // `resident_table` ([V, C] fp32, device) defined, gathers on the device.
  // With position ids, also their PackedDocuments, copied on the current
  // stream (MakePackedDocuments; the executor's is kCompute).
  UploadedInput Upload(const MicroBatch& mb, const at::Tensor& resident_table);

  // The pass is over (or failed): the buffer is free.
  void EndPass() { pending_ = false; }

  int64_t pinned_bytes() const { return static_cast<int64_t>(staging_.bytes()); }

 private:
  InputStager(StepEnv* env, int64_t micro_batch, int64_t seq_len)
      : env_(env), b_(micro_batch), t_(seq_len) {}
  UploadedInput UploadIds(const MicroBatch& mb, const at::Tensor& table);
  // Upload without the documents: rows gathered here or on the device.
  UploadedInput UploadTokens(const MicroBatch& mb, const at::Tensor& resident_table);
  // Points row_sources_ at the current value of every token's row.
  void GatherSources(const MicroBatch& mb);

  StepEnv* env_;
  int64_t b_, t_;
  HostBuffer staging_;  // pinned: InputStagerPinnedBytes
  std::unique_ptr<DeviceEvent> ready_, done_;
  bool pending_ = false;  // an upload from staging_ may still run
  RowGate row_gate_;
  std::vector<const float*> row_sources_;  // per token of the gather
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_STEP_INPUT_STAGER_H_
