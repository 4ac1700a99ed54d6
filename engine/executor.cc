// The streaming executor (Note [Streaming pipeline] in executor.h).
#include "engine/executor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

#include "absl/base/internal/raw_logging.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/adamw.h"
#include "engine/layers.h"
#include "engine/status_macros.h"
#include "engine/tensor_adamw.h"
#include "engine/torch_compat.h"

namespace megatrain::engine {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

at::ScalarType ScalarTypeOf(ComputeDtype d) {
  return d == ComputeDtype::kBf16 ? at::kBFloat16 : at::kFloat;
}

// A CPU tensor over `numel` elements of host memory the caller owns (the
// store's arenas), for copies to and from the device.
at::Tensor HostTensor(void* data, int64_t numel, at::ScalarType dtype) {
  return at::from_blob(data, {numel}, at::TensorOptions().dtype(dtype));
}

// Maps a LibTorch exception to a status (the engine boundary).
absl::Status StatusFromException(const std::exception& e) {
  const std::string what = e.what();
  if (compat::IsOutOfMemory(e)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device out of memory (try a smaller train.micro_batch or train.seq_len): ",
        what.substr(0, what.find('\n'))));
  }
  return absl::InternalError(absl::StrCat("engine: ", what.substr(0, 2000)));
}

// One use of a block's weights on the device (Note [Streaming pipeline]).
struct BlockUse {
  int64_t block = 0;
  int slot = 0;          // device weight slot
  bool load = false;     // copy host -> slot before the use
  int prev_user = -1;    // previous use of the same slot, -1 if none
};

// Busy time of the three streams. On CUDA, pairs of timing events resolved
// at the end of a pass; on CPU (synchronous), wall-clock intervals.
class PhaseTimer {
 public:
  explicit PhaseTimer(DeviceRuntime* runtime) : runtime_(runtime) {}

  // What a compute interval does, for the idle-gap breakdown.
  enum Label { kOther = 0, kForward = 1, kHead = 2, kBackward = 3 };

  void Reset() {
    used_ = 0;
    intervals_.clear();
    waits_.clear();
    cpu_wait_seconds_ = 0;
    start_marker_ = -1;
    for (double& s : cpu_seconds_) s = 0;
  }
  // Marks the start of a pass on the compute stream (CUDA only).
  void MarkStart() {
    if (!runtime_->is_cuda()) return;
    start_marker_ = NextEvent();
    runtime_->Record(StreamKind::kCompute, *events_[start_marker_]);
  }
  // Marks the start of a busy interval on `stream`; returns a token for End.
  int Begin(StreamKind stream) {
    if (!runtime_->is_cuda()) {
      cpu_start_[static_cast<int>(stream)] = Clock::now();
      return -1;
    }
    const int idx = NextEvent();
    runtime_->Record(stream, *events_[idx]);
    return idx;
  }
  void End(StreamKind stream, int begin_token, Label label = kOther) {
    if (!runtime_->is_cuda()) {
      cpu_seconds_[static_cast<int>(stream)] += SecondsSince(cpu_start_[static_cast<int>(stream)]);
      return;
    }
    const int idx = NextEvent();
    runtime_->Record(stream, *events_[idx]);
    intervals_.push_back({static_cast<int>(stream), begin_token, idx, label});
  }
  // Brackets a host wait of the enqueuing thread (a gate): on CUDA, events
  // on the compute stream before and after it, so that the time between
  // them on the device is the idle time the wait caused (the work enqueued
  // before it was done before the wait ended); on the CPU, the wait itself.
  int BeginWait() {
    if (!runtime_->is_cuda()) {
      cpu_wait_start_ = Clock::now();
      return -1;
    }
    const int idx = NextEvent();
    runtime_->Record(StreamKind::kCompute, *events_[idx]);
    return idx;
  }
  void EndWait(int begin_token) {
    if (!runtime_->is_cuda()) {
      cpu_wait_seconds_ += SecondsSince(cpu_wait_start_);
      return;
    }
    const int idx = NextEvent();
    runtime_->Record(StreamKind::kCompute, *events_[idx]);
    waits_.push_back({begin_token, idx});
  }
  // Compute-stream idle time the BeginWait/EndWait waits caused, in
  // seconds; call after the streams are synchronised.
  double WaitIdleSeconds() {
    double total = cpu_wait_seconds_;
    for (const auto& [begin, end] : waits_) {
      total += std::max(0.0, runtime_->ElapsedMs(*events_[begin], *events_[end]) / 1e3);
    }
    return total;
  }
  // Idle time of the compute stream before each interval, by the label of
  // the work that was waited for: [pass start, forward, head, backward].
  // Call after the streams are synchronised; zeros on the CPU.
  std::array<double, 4> ComputeGaps() {
    std::array<double, 4> gaps{};
    int prev_end = start_marker_;
    for (const Interval& iv : intervals_) {
      if (iv.stream != static_cast<int>(StreamKind::kCompute)) continue;
      if (prev_end >= 0) {
        const double gap = runtime_->ElapsedMs(*events_[prev_end], *events_[iv.begin]) / 1e3;
        gaps[prev_end == start_marker_ ? 0 : iv.label] += std::max(0.0, gap);
      }
      prev_end = iv.end;
    }
    return gaps;
  }
  // Seconds per stream; call after the streams are synchronised.
  std::array<double, kNumStreams> Seconds() {
    std::array<double, kNumStreams> out = cpu_seconds_;
    for (const Interval& iv : intervals_) {
      out[iv.stream] += runtime_->ElapsedMs(*events_[iv.begin], *events_[iv.end]) / 1e3;
    }
    return out;
  }

 private:
  struct Interval {
    int stream, begin, end;
    Label label;
  };
  int NextEvent() {
    if (used_ == static_cast<int>(events_.size())) events_.push_back(runtime_->CreateEvent(true));
    return used_++;
  }
  DeviceRuntime* runtime_;
  std::vector<std::unique_ptr<DeviceEvent>> events_;
  int used_ = 0;
  std::vector<Interval> intervals_;
  int start_marker_ = -1;
  std::array<double, kNumStreams> cpu_seconds_{};
  std::array<Clock::time_point, kNumStreams> cpu_start_{};
  std::vector<std::pair<int, int>> waits_;  // BeginWait/EndWait event pairs
  double cpu_wait_seconds_ = 0;
  Clock::time_point cpu_wait_start_{};
};

}  // namespace

class StreamingExecutor::Impl {
 public:
  Impl(HostStore* store, DeviceRuntime* runtime, ThreadPool* pool, const ExecutorOptions& options)
      : store_(store),
        runtime_(runtime),
        pool_(pool),
        options_(options),
        config_(store->config()),
        layout_(store->layout()),
        cd_(ScalarTypeOf(options.compute_dtype)),
        timer_(runtime) {}

  ~Impl() {
    try {
      runtime_->Synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megatrain: executor shutdown: %s\n", e.what());
    }
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (accumulator_.joinable()) accumulator_.join();
  }

  absl::Status Init();
  absl::StatusOr<ForwardBackwardResult> Run(absl::Span<const MicroBatch> micro_batches,
                                            bool backward,
                                            const BlockFinalCallback& on_block_final,
                                            std::vector<float>* logits = nullptr);
  int64_t slot_device_bytes() const { return slot_device_bytes_ + acc_device_bytes_; }
  int64_t staging_host_bytes() const { return staging_host_bytes_; }
  void SetWeightGate(std::function<void(int64_t)> gate) { weight_gate_ = std::move(gate); }
  void SetEmbeddingRowGate(EmbeddingRowGate gate) {
    row_gate_ = std::move(gate);
  }
  void AssumeEmbeddingGradZero(bool zero) { assume_embedding_grad_zero_ = zero; }
  absl::Status ScheduleResidentUpdate(const AdamWStepParams& hp, std::vector<bool> apply);
  absl::Status SyncResidentToStore(bool grads);
  absl::Status LoadResidentFromStore();
  const std::vector<int64_t>& resident_blocks() const { return resident_blocks_; }

 private:
  // Blocks until `block`'s host weights are current (the trainer's gate).
  void WaitWeights(int64_t block) {
    if (!weight_gate_) return;
    const Clock::time_point start = Clock::now();
    const int wait = timer_.BeginWait();
    weight_gate_(block);
    timer_.EndWait(wait);
    gate_wait_seconds_ += SecondsSince(start);
  }

  // An accumulation job for the host thread.
  // Note [Gradient landing]: a dense block's first contribution of a step
  // is copied (fp32) straight into the store's gradient, so with one
  // micro-batch per step the host does no gradient work at all; its squared
  // norm is computed on the device and copied beside it. Later
  // contributions land in pinned staging and are added on the host.
  struct AccumTask {
    // kResidentNorm: only the squared norm of a resident layer's final
    // gradient (norm_host_[slot]; Note [Resident layers] in executor.h).
    enum class Kind { kDense, kEmbeddingRows, kResidentNorm } kind = Kind::kDense;
    int slot = 0;                 // grad slot (device buffer + pinned staging)
    int64_t block = 0;
    int64_t numel = 0;            // elements in staging (dense) or rows*C
    bool first = false;           // first contribution of the step: overwrite
    bool final = false;           // last contribution of the step
    bool direct = false;          // already in the store's gradient (dense, first);
                                  // norm_host_[slot] then holds its L2 norm
    bool grad_zero = false;       // kEmbeddingRows: the store's gradient is already zero
    std::vector<int32_t> rows;    // token ids of kEmbeddingRows, [B*T]
    at::Tensor keep_alive;        // device tensors read by the D2H copies
    at::Tensor keep_alive_norm;
  };

  absl::Status ValidateBatches(absl::Span<const MicroBatch> mbs, int64_t* counted) const;
  void Plan(const std::vector<int64_t>& blocks);
  void IssueLoads();
  at::Tensor Acquire(int use);
  void Release(int use);
  // A micro-batch on the device: layer 0's input [B, T, C] fp32, labels
  // [B, T] int64, and with a resident embedding the token ids [B*T] int64.
  struct Uploaded {
    at::Tensor x, labels, ids;
  };
  Uploaded Upload(const MicroBatch& mb);
  int AcquireGradSlot();
  // `whole`: device_src holds the block's whole gradient of the pass (Note
  // [Device gradient accumulation]), which lands in the store as a final
  // first contribution.
  void OffloadGrad(int slot, int64_t block, int64_t numel, const float* device_src,
                   at::Tensor keep_alive, AccumTask::Kind kind, std::vector<int32_t> rows,
                   bool whole = false);
  // Note [Device gradient accumulation] in executor.h: whether this pass of
  // `micro_batches` sums streamed gradients on the device (allocating the
  // buffers the first time).
  bool PrepareDeviceAccumulation(size_t micro_batches);
  // Adds one micro-batch's gradient `grads` (one tensor per parameter of
  // `bl`) into `dst` ([numel] fp32): a copy for the block's first
  // contribution of the pass, else fp32 adds in micro-batch order.
  void AccumulateInPlace(const BlockLayout& bl, int64_t block, const at::Tensor& dst,
                         const std::vector<at::Tensor>& grads);
  // A contribution to block's device accumulator is in place; on the final
  // one the sum goes to the store.
  void AccumulatedGradDone(int64_t block);
  void AccumulatorLoop();
  void RunTask(AccumTask& task);
  absl::Status Drain();
  void ResetAfterError();
  // Note [Activation offload] in executor.h.
  bool Offloaded(int64_t layer) const {
    return options_.offload_activations && layer >= 0 && layer < layout_.num_layers() - 1;
  }
  void OffloadActivation(int64_t layer, const at::Tensor& x);
  at::Tensor PrefetchActivation(int64_t layer);
  at::Tensor SlotView(const at::Tensor& slot, int64_t block) const {
    return slot.narrow(0, 0, layout_.blocks[block].numel);
  }
  // Note [Resident layers] in executor.h: decoder layer `layer` is resident
  // (it is then resident_[layer]).
  bool Resident(int64_t layer) const { return layer < options_.resident_layers; }
  // Resident block `index`'s contribution to its gradient is in place: the
  // bookkeeping of OffloadGrad, and on the final one its norm to the host.
  void ResidentGradDone(size_t index);
  // Enqueues the waiting resident update, if any, on the current stream.
  void ApplyResidentUpdate();

  HostStore* store_;
  DeviceRuntime* runtime_;
  ThreadPool* pool_;
  ExecutorOptions options_;
  const ModelConfig& config_;
  const ModelLayout& layout_;
  at::ScalarType cd_;
  int64_t chunk_tokens_ = 0;
  RopeCache rope_;
  at::Tensor attention_mask_;

  // Device weight slots and their events.
  std::vector<at::Tensor> weight_slots_;                        // [max numel] cd
  std::vector<std::unique_ptr<DeviceEvent>> weights_ready_;     // per slot, on kH2D
  std::vector<std::unique_ptr<DeviceEvent>> slot_free_;         // per slot, on kCompute
  std::vector<BlockUse> uses_;
  int next_load_ = 0;        // next use whose load is not issued yet
  int released_upto_ = -1;   // all uses <= this are released
  std::vector<bool> released_;

  // Gradient slots: device buffers + pinned staging, one ring.
  std::vector<at::Tensor> grad_slots_;                          // [max numel] fp32
  std::vector<int> grad_slot_kind_;                             // BlockKind last written
  std::vector<HostBuffer> staging_;                             // pinned, fp32
  HostBuffer norm_host_;                                        // pinned, double per grad slot
  std::vector<std::unique_ptr<DeviceEvent>> grad_ready_;        // per slot, on kCompute
  std::vector<std::unique_ptr<DeviceEvent>> staged_;            // per slot, on kD2H
  int next_grad_slot_ = 0;

  // Activation upload (pinned): [B*T*C] fp32 hidden + [B*T] int64 labels.
  HostBuffer upload_staging_;
  std::unique_ptr<DeviceEvent> upload_ready_, upload_done_;
  bool upload_pending_ = false;

  // Activation offload (Note [Activation offload] in executor.h): pinned
  // [L-1, B*T*C] fp32 host copies, their D2H events, and a ring of two
  // device buffers for the way back.
  HostBuffer act_host_;
  std::vector<std::unique_ptr<DeviceEvent>> act_offloaded_;   // per layer, on kD2H
  std::array<at::Tensor, 2> act_device_;                      // [B, T, C] fp32
  std::array<std::unique_ptr<DeviceEvent>, 2> act_loaded_;    // on kH2D
  std::array<std::unique_ptr<DeviceEvent>, 2> act_free_;      // on kCompute
  std::unique_ptr<DeviceEvent> act_ready_;                    // on kCompute

  // Resident blocks (Notes [Resident layers] and [Resident embedding] in
  // executor.h): decoder layers 0..N-1 (resident_[l] is layer l), then the
  // embedding when resident (resident_[emb_resident_]).
  struct ResidentBlock {
    int64_t block = 0;
    at::Tensor master, exp_avg, exp_avg_sq, grad;  // [numel] fp32
    // [numel] compute dtype; master itself for fp32/tf32 and the embedding.
    at::Tensor weights;
  };
  std::vector<ResidentBlock> resident_;
  std::vector<int64_t> resident_blocks_;  // resident_[i].block
  int emb_resident_ = -1;                 // index of the embedding in resident_, or -1

  // Note [Device gradient accumulation] in executor.h: [numel] fp32 per
  // streamed dense block (undefined for the others), zero-initialised so
  // that alignment gaps between parameters stay zero.
  std::vector<at::Tensor> acc_;
  int64_t acc_device_bytes_ = 0;
  bool device_accumulation_ = false;  // in the current pass
  std::optional<AdamWStepParams> resident_update_;  // waiting for the next pass
  std::vector<bool> resident_apply_;

  PhaseTimer timer_;
  int64_t h2d_bytes_ = 0, d2h_bytes_ = 0;
  int64_t slot_device_bytes_ = 0, staging_host_bytes_ = 0;

  // Per-step contribution bookkeeping (main thread only).
  std::vector<int64_t> remaining_;
  std::vector<bool> seen_;
  // Per block: squared norm of its gradient so far in this pass, -1 when
  // unknown (accumulator thread only; reset at the start of a pass).
  std::vector<double> known_sq_;
  std::function<void(int64_t, double)> on_block_final_;
  std::function<void(int64_t)> weight_gate_;
  EmbeddingRowGate row_gate_;
  std::vector<const float*> row_sources_;  // per token of the gather, from row_gate_
  bool assume_embedding_grad_zero_ = false;  // for the current/next Run only
  double gate_wait_seconds_ = 0;
  double grad_wait_seconds_ = 0;   // enqueue thread waiting for a free grad slot

  // Accumulator thread state.
  absl::Mutex mu_;
  std::deque<AccumTask> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> staging_busy_ ABSL_GUARDED_BY(mu_);
  bool task_running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status accumulator_error_ ABSL_GUARDED_BY(mu_);
  std::thread accumulator_;
};

absl::Status StreamingExecutor::Impl::Init() {
  const int64_t b = options_.micro_batch, t = options_.seq_len, c = config_.hidden_size;
  const size_t esize = cd_ == at::kBFloat16 ? 2 : 4;
  // Largest block that visits the device: layers, head, and the embedding
  // table only when it doubles as lm_head.
  int64_t max_numel = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(layout_.blocks.size()); ++i) {
    if (i == layout_.embedding_block() && !config_.tie_word_embeddings) continue;
    max_numel = std::max(max_numel, layout_.blocks[i].numel);
  }
  chunk_tokens_ = options_.loss_chunk_tokens > 0
                      ? options_.loss_chunk_tokens
                      : std::max<int64_t>(64, (int64_t{256} << 20) / (4 * config_.vocab_size));
  try {
    const at::Device device = runtime_->device();
    auto scope = runtime_->Use(StreamKind::kCompute);
    compat::SetAllowTf32(options_.compute_dtype == ComputeDtype::kTf32);
    rope_ = BuildRopeCache(config_, t, device);
    attention_mask_ = BuildAttentionMask(config_, t, device);
    for (int k = 0; k < options_.num_weight_slots; ++k) {
      weight_slots_.push_back(at::empty({max_numel}, at::TensorOptions().dtype(cd_).device(device)));
      weights_ready_.push_back(runtime_->CreateEvent());
      slot_free_.push_back(runtime_->CreateEvent());
    }
    // Gradients leave the device in fp32 (Note [Gradient landing]).
    const size_t staging_bytes =
        std::max<size_t>(max_numel * 4, static_cast<size_t>(b * t * c) * 4);
    MEGATRAIN_ASSIGN_OR_RETURN(
        norm_host_, HostBuffer::Allocate(options_.num_grad_slots * sizeof(double), runtime_->is_cuda()));
    for (int r = 0; r < options_.num_grad_slots; ++r) {
      grad_slots_.push_back(at::zeros({max_numel}, at::TensorOptions().dtype(at::kFloat).device(device)));
      grad_slot_kind_.push_back(-1);
      MEGATRAIN_ASSIGN_OR_RETURN(HostBuffer buf,
                                 HostBuffer::Allocate(staging_bytes, runtime_->is_cuda()));
      staging_.push_back(std::move(buf));
      grad_ready_.push_back(runtime_->CreateEvent());
      staged_.push_back(runtime_->CreateEvent());
    }
    MEGATRAIN_ASSIGN_OR_RETURN(
        upload_staging_,
        HostBuffer::Allocate(static_cast<size_t>(b * t) * (c * 4 + 8), runtime_->is_cuda()));
    upload_ready_ = runtime_->CreateEvent();
    upload_done_ = runtime_->CreateEvent();
    int64_t act_device_bytes = 0;
    if (options_.offload_activations && layout_.num_layers() > 1) {
      const size_t layer_bytes = static_cast<size_t>(b * t * c) * 4;
      absl::StatusOr<HostBuffer> act =
          HostBuffer::Allocate(layer_bytes * (layout_.num_layers() - 1), runtime_->is_cuda());
      if (!act.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "train.offload_activations: cannot allocate ", layer_bytes * (layout_.num_layers() - 1),
            " bytes of pinned host memory for ", layout_.num_layers() - 1,
            " saved layer inputs of micro_batch x seq_len x hidden_size fp32: ",
            act.status().message()));
      }
      act_host_ = std::move(*act);
      for (int64_t l = 0; l + 1 < layout_.num_layers(); ++l) {
        act_offloaded_.push_back(runtime_->CreateEvent());
      }
      for (int k = 0; k < 2; ++k) {
        act_device_[k] = at::empty({b, t, c}, at::TensorOptions().dtype(at::kFloat).device(device));
        act_loaded_[k] = runtime_->CreateEvent();
        act_free_[k] = runtime_->CreateEvent();
      }
      act_ready_ = runtime_->CreateEvent();
      act_device_bytes = 2 * static_cast<int64_t>(layer_bytes);
    }
    int64_t resident_bytes = 0;
    for (int64_t l = 0; l < options_.resident_layers; ++l) resident_blocks_.push_back(layout_.layer_block(l));
    if (options_.resident_embedding) {
      emb_resident_ = static_cast<int>(resident_blocks_.size());
      resident_blocks_.push_back(layout_.embedding_block());
    }
    for (const int64_t block : resident_blocks_) {
      const int64_t numel = layout_.blocks[block].numel;
      const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
      // The embedding is read in fp32 (the gather), like the host path's.
      const bool compute_copy = cd_ != at::kFloat && block != layout_.embedding_block();
      ResidentBlock rb;
      rb.block = block;
      rb.master = at::empty({numel}, fp32);
      rb.exp_avg = at::empty({numel}, fp32);
      rb.exp_avg_sq = at::empty({numel}, fp32);
      rb.grad = at::zeros({numel}, fp32);
      rb.weights = compute_copy ? at::empty({numel}, fp32.dtype(cd_)) : rb.master;
      resident_bytes += numel * (16 + (compute_copy ? static_cast<int64_t>(esize) : 0));
      resident_.push_back(std::move(rb));
    }
    slot_device_bytes_ =
        (static_cast<int64_t>(options_.num_weight_slots) * static_cast<int64_t>(esize) +
         static_cast<int64_t>(options_.num_grad_slots) * 4) * max_numel + act_device_bytes +
        resident_bytes;
    staging_host_bytes_ =
        static_cast<int64_t>(staging_bytes) * options_.num_grad_slots +
        static_cast<int64_t>(upload_staging_.bytes()) + static_cast<int64_t>(act_host_.bytes());
  } catch (const std::exception& e) {
    return StatusFromException(e);
  }
  {
    absl::MutexLock lock(&mu_);
    staging_busy_.assign(options_.num_grad_slots, false);
  }
  accumulator_ = std::thread([this] { AccumulatorLoop(); });
  return LoadResidentFromStore();
}

absl::Status StreamingExecutor::Impl::ValidateBatches(absl::Span<const MicroBatch> mbs,
                                                      int64_t* counted) const {
  if (mbs.empty()) return absl::InvalidArgumentError("batch: no micro-batches");
  const size_t n = static_cast<size_t>(options_.micro_batch * options_.seq_len);
  const int32_t vocab = static_cast<int32_t>(config_.vocab_size);
  *counted = 0;
  for (size_t m = 0; m < mbs.size(); ++m) {
    const MicroBatch& mb = mbs[m];
    if (mb.input_ids.size() != n || mb.labels.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "micro-batch ", m, ": expected ", n, " input_ids and labels (micro_batch x seq_len), got ",
          mb.input_ids.size(), " and ", mb.labels.size()));
    }
    for (size_t i = 0; i < n; ++i) {
      if (mb.input_ids[i] < 0 || mb.input_ids[i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("micro-batch ", m, ": input_ids[", i,
                                                       "] = ", mb.input_ids[i],
                                                       " is outside [0, vocab_size=", vocab, ")"));
      }
      const int32_t label = mb.labels[i];
      if (label == kIgnoreLabel) continue;
      if (label < 0 || label >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("micro-batch ", m, ": labels[", i, "] = ",
                                                       label, " is outside [0, vocab_size=", vocab,
                                                       ") and is not -100"));
      }
      ++*counted;
    }
  }
  return absl::OkStatus();
}

// Assigns device slots to block uses: a block still resident is reused,
// otherwise the next slot of the ring is loaded.
void StreamingExecutor::Impl::Plan(const std::vector<int64_t>& blocks) {
  const int k = options_.num_weight_slots;
  std::vector<int64_t> content(k, -1);
  std::vector<int> last_user(k, -1);
  int ring = 0;
  uses_.clear();
  for (size_t i = 0; i < blocks.size(); ++i) {
    BlockUse use;
    use.block = blocks[i];
    int slot = -1;
    for (int s = 0; s < k; ++s) {
      if (content[s] == use.block) slot = s;
    }
    if (slot < 0) {
      slot = ring;
      ring = (ring + 1) % k;
      use.load = true;
      content[slot] = use.block;
    }
    use.slot = slot;
    use.prev_user = last_user[slot];
    last_user[slot] = static_cast<int>(i);
    uses_.push_back(use);
  }
  next_load_ = 0;
  released_upto_ = -1;
  released_.assign(uses_.size(), false);
}

// Issues, in use order, every load whose slot's previous user is released.
void StreamingExecutor::Impl::IssueLoads() {
  while (next_load_ < static_cast<int>(uses_.size())) {
    const BlockUse& use = uses_[next_load_];
    if (use.load) {
      if (use.prev_user >= 0 && !released_[use.prev_user]) return;
      if (use.prev_user >= 0) runtime_->Wait(StreamKind::kH2D, *slot_free_[use.slot]);
      WaitWeights(use.block);
      const int64_t bytes = store_->streaming_bytes(use.block);
      const int token = timer_.Begin(StreamKind::kH2D);
      runtime_->CopyHostToDevice(weight_slots_[use.slot].data_ptr(),
                                 store_->streaming_data(use.block), static_cast<size_t>(bytes));
      timer_.End(StreamKind::kH2D, token);
      runtime_->Record(StreamKind::kH2D, *weights_ready_[use.slot]);
      h2d_bytes_ += bytes;
    }
    ++next_load_;
  }
}

at::Tensor StreamingExecutor::Impl::Acquire(int use) {
  IssueLoads();
  ABSL_RAW_CHECK(next_load_ > use, "executor: a load was not issued before its use");
  // A resident block was made ready by an earlier wait on this stream.
  if (uses_[use].load) runtime_->Wait(StreamKind::kCompute, *weights_ready_[uses_[use].slot]);
  return SlotView(weight_slots_[uses_[use].slot], uses_[use].block);
}

void StreamingExecutor::Impl::Release(int use) {
  runtime_->Record(StreamKind::kCompute, *slot_free_[uses_[use].slot]);
  released_[use] = true;
  IssueLoads();
}

// Gathers the embedding rows on the host and uploads hidden and labels;
// with a resident embedding uploads token ids and labels and gathers on
// the device (Note [Resident embedding] in executor.h).
StreamingExecutor::Impl::Uploaded StreamingExecutor::Impl::Upload(const MicroBatch& mb) {
  const int64_t b = options_.micro_batch, t = options_.seq_len, c = config_.hidden_size;
  const int64_t rows = b * t;
  if (upload_pending_) runtime_->HostWait(*upload_done_);  // staging reused
  if (emb_resident_ >= 0) {
    int64_t* ids_host = static_cast<int64_t*>(upload_staging_.data());  // [rows] then labels [rows]
    for (int64_t r = 0; r < rows; ++r) {
      ids_host[r] = mb.input_ids[r];
      ids_host[rows + r] = mb.labels[r];
    }
    at::Tensor both = at::empty({2, rows}, at::TensorOptions().dtype(at::kLong).device(runtime_->device()));
    runtime_->Record(StreamKind::kCompute, *upload_ready_);  // allocation usable
    runtime_->Wait(StreamKind::kH2D, *upload_ready_);
    const int token = timer_.Begin(StreamKind::kH2D);
    runtime_->CopyHostToDevice(both.data_ptr(), ids_host, static_cast<size_t>(rows) * 16);
    timer_.End(StreamKind::kH2D, token);
    runtime_->Record(StreamKind::kH2D, *upload_done_);
    runtime_->Wait(StreamKind::kCompute, *upload_done_);
    upload_pending_ = true;
    h2d_bytes_ += rows * 16;
    Uploaded up;
    up.ids = both[0];
    up.labels = both[1].view({b, t});
    const int gather = timer_.Begin(StreamKind::kCompute);
    // The [V, C] table inside the block (which may end in alignment padding).
    const at::Tensor table =
        BindBlockParams(layout_.blocks[layout_.embedding_block()], resident_[emb_resident_].master)[0];
    up.x = at::embedding(table, up.ids).view({b, t, c});
    timer_.End(StreamKind::kCompute, gather, PhaseTimer::kForward);
    return up;
  }
  float* hidden = static_cast<float*>(upload_staging_.data());
  int64_t* labels = reinterpret_cast<int64_t*>(hidden + rows * c);
  const float* table = store_->master(layout_.embedding_block());
  row_sources_.resize(rows);
  if (row_gate_) {
    const Clock::time_point start = Clock::now();
    const int wait = timer_.BeginWait();
    row_gate_(absl::MakeConstSpan(mb.input_ids), absl::MakeSpan(row_sources_));
    timer_.EndWait(wait);
    gate_wait_seconds_ += SecondsSince(start);
  } else {
    WaitWeights(layout_.embedding_block());
    for (int64_t r = 0; r < rows; ++r) {
      row_sources_[r] = table + static_cast<int64_t>(mb.input_ids[r]) * c;
    }
  }
  pool_->ParallelFor(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(hidden + r * c, row_sources_[r], c * 4);
      labels[r] = mb.labels[r];
    }
  });
  at::Tensor x = at::empty({b, t, c}, at::TensorOptions().dtype(at::kFloat).device(runtime_->device()));
  at::Tensor y = at::empty({b, t}, at::TensorOptions().dtype(at::kLong).device(runtime_->device()));
  runtime_->Record(StreamKind::kCompute, *upload_ready_);  // allocations usable
  runtime_->Wait(StreamKind::kH2D, *upload_ready_);
  const int token = timer_.Begin(StreamKind::kH2D);
  runtime_->CopyHostToDevice(x.data_ptr(), hidden, rows * c * 4);
  runtime_->CopyHostToDevice(y.data_ptr(), labels, rows * 8);
  timer_.End(StreamKind::kH2D, token);
  runtime_->Record(StreamKind::kH2D, *upload_done_);
  runtime_->Wait(StreamKind::kCompute, *upload_done_);
  upload_pending_ = true;
  h2d_bytes_ += rows * (c * 4 + 8);
  Uploaded up;
  up.x = std::move(x);
  up.labels = std::move(y);
  return up;
}

// Copies layer `layer`'s saved input `x` (produced on kCompute) to its
// pinned host slot on kD2H (Note [Activation offload] in executor.h).
void StreamingExecutor::Impl::OffloadActivation(int64_t layer, const at::Tensor& x) {
  const size_t bytes = static_cast<size_t>(x.numel()) * 4;
  runtime_->Record(StreamKind::kCompute, *act_ready_);
  runtime_->Wait(StreamKind::kD2H, *act_ready_);
  const int token = timer_.Begin(StreamKind::kD2H);
  runtime_->CopyDeviceToHost(static_cast<char*>(act_host_.data()) + layer * bytes, x.data_ptr(),
                             bytes);
  timer_.End(StreamKind::kD2H, token);
  runtime_->Record(StreamKind::kD2H, *act_offloaded_[layer]);
  d2h_bytes_ += static_cast<int64_t>(bytes);
}

// Enqueues the copy of layer `layer`'s saved input back into device ring
// buffer layer % 2 on kH2D; returns that buffer. The caller makes kCompute
// wait on act_loaded_[layer % 2] before reading it and records
// act_free_[layer % 2] after its last use.
at::Tensor StreamingExecutor::Impl::PrefetchActivation(int64_t layer) {
  const int k = static_cast<int>(layer % 2);
  at::Tensor& dst = act_device_[k];
  const size_t bytes = static_cast<size_t>(dst.numel()) * 4;
  runtime_->Wait(StreamKind::kH2D, *act_free_[k]);             // its previous reader is done
  runtime_->Wait(StreamKind::kH2D, *act_offloaded_[layer]);    // the host copy is complete
  const int token = timer_.Begin(StreamKind::kH2D);
  runtime_->CopyHostToDevice(dst.data_ptr(), static_cast<const char*>(act_host_.data()) + layer * bytes,
                             bytes);
  timer_.End(StreamKind::kH2D, token);
  runtime_->Record(StreamKind::kH2D, *act_loaded_[k]);
  h2d_bytes_ += static_cast<int64_t>(bytes);
  return dst;
}

int StreamingExecutor::Impl::AcquireGradSlot() {
  const int r = next_grad_slot_;
  next_grad_slot_ = (next_grad_slot_ + 1) % options_.num_grad_slots;
  const Clock::time_point start = Clock::now();
  absl::MutexLock lock(&mu_);
  auto free = [this, r]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !staging_busy_[r] || !accumulator_error_.ok();
  };
  mu_.Await(absl::Condition(&free));
  staging_busy_[r] = true;
  grad_wait_seconds_ += SecondsSince(start);
  return r;
}

void StreamingExecutor::Impl::OffloadGrad(int slot, int64_t block, int64_t numel,
                                          const float* device_src, at::Tensor keep_alive,
                                          AccumTask::Kind kind, std::vector<int32_t> rows,
                                          bool whole) {
  AccumTask task;
  task.kind = kind;
  task.slot = slot;
  task.block = block;
  task.numel = numel;
  task.first = whole || !seen_[block];
  seen_[block] = true;
  task.final = whole || --remaining_[block] == 0;
  task.direct = kind == AccumTask::Kind::kDense && task.first;
  task.grad_zero = assume_embedding_grad_zero_;
  if (task.direct) {
    // The block's gradient so far is this one: its norm, on the device
    // (compute-stream work, timed as such).
    const int norm_token = timer_.Begin(StreamKind::kCompute);
    at::Tensor flat = at::from_blob(const_cast<float*>(device_src), {numel},
                                    at::TensorOptions().dtype(at::kFloat).device(runtime_->device()));
    task.keep_alive_norm = compat::VectorNormFp64(flat);
    timer_.End(StreamKind::kCompute, norm_token, PhaseTimer::kBackward);
  }
  runtime_->Record(StreamKind::kCompute, *grad_ready_[slot]);
  runtime_->Wait(StreamKind::kD2H, *grad_ready_[slot]);
  const int64_t bytes = numel * 4;
  void* dst = task.direct ? static_cast<void*>(store_->grad(block)) : staging_[slot].data();
  const int token = timer_.Begin(StreamKind::kD2H);
  runtime_->CopyDeviceToHost(dst, device_src, static_cast<size_t>(bytes));
  if (task.direct) {
    runtime_->CopyDeviceToHost(static_cast<double*>(norm_host_.data()) + slot,
                               task.keep_alive_norm.data_ptr(), sizeof(double));
  }
  timer_.End(StreamKind::kD2H, token);
  runtime_->Record(StreamKind::kD2H, *staged_[slot]);
  d2h_bytes_ += bytes;
  task.rows = std::move(rows);
  task.keep_alive = std::move(keep_alive);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void StreamingExecutor::Impl::AccumulatorLoop() {
  while (true) {
    AccumTask task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      task_running_ = true;
    }
    absl::Status status;
    try {
      RunTask(task);
    } catch (const std::exception& e) {
      status = StatusFromException(e);
    }
    task.keep_alive.reset();
    task.keep_alive_norm.reset();
    absl::MutexLock lock(&mu_);
    staging_busy_[task.slot] = false;
    task_running_ = false;
    if (!status.ok() && accumulator_error_.ok()) accumulator_error_ = status;
  }
}

void StreamingExecutor::Impl::RunTask(AccumTask& task) {
  runtime_->HostWait(*staged_[task.slot]);
  if (task.kind == AccumTask::Kind::kResidentNorm) {
    const double norm = static_cast<const double*>(norm_host_.data())[task.slot];
    if (on_block_final_) on_block_final_(task.block, norm * norm);
    return;
  }
  float* grad = store_->grad(task.block);
  const float* src = static_cast<const float*>(staging_[task.slot].data());
  // Squared norm of the block's gradient so far, when known without a pass
  // over the whole block (Note [Gradient landing]).
  double& known_sq = known_sq_[task.block];
  if (task.kind == AccumTask::Kind::kDense) {
    if (!task.direct) {  // a later micro-batch's contribution
      pool_->ParallelFor(task.numel, 1 << 14, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) grad[i] += src[i];
      });
      known_sq = -1;
    } else {
      const double norm = static_cast<const double*>(norm_host_.data())[task.slot];
      known_sq = norm * norm;
    }
  } else {
    // Embedding backward: grad[token] += d hidden[position]. Positions are
    // grouped by token (ascending within a group, the order the sum takes
    // for every element), so that each group's row is written by one
    // thread and every read and write is a whole contiguous row.
    const int64_t c = config_.hidden_size;
    const int64_t block_numel = store_->block_numel(task.block);
    // The previous update of the table may still be reading its gradient
    // (Note [Embedding rows on demand] in trainer.h).
    if (weight_gate_) weight_gate_(task.block);
    if (task.first && !task.grad_zero) {
      pool_->ParallelFor(block_numel, 1 << 16, [&](int64_t begin, int64_t end) {
        std::memset(grad + begin, 0, (end - begin) * 4);
      });
    }
    if (task.first) known_sq = 0;  // a zero table (untied), not tied's dense part
    const int64_t positions = static_cast<int64_t>(task.rows.size());
    std::vector<int64_t> keys(positions);  // token << 32 | position
    for (int64_t p = 0; p < positions; ++p) keys[p] = (static_cast<int64_t>(task.rows[p]) << 32) | p;
    std::sort(keys.begin(), keys.end());
    std::vector<int64_t> group_start;  // into keys, one per distinct token, then positions
    for (int64_t i = 0; i < positions; ++i) {
      if (i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32)) group_start.push_back(i);
    }
    const int64_t groups = static_cast<int64_t>(group_start.size());
    group_start.push_back(positions);
    // The table's squared norm changes only in the rows this scatter
    // touches, so it is updated from their sums before and after instead
    // of a pass over the whole [V, C] table.
    const bool track = known_sq >= 0;
    const bool need_before = track && !task.first;
    std::vector<double> sq_before(need_before ? groups : 0), sq_after(track ? groups : 0);
    const int64_t padding_idx = config_.EmbeddingPaddingIdx();
    auto row_sq = [c](const float* g) {
      double acc = 0;
      for (int64_t j = 0; j < c; ++j) acc += static_cast<double>(g[j]) * g[j];
      return acc;
    };
    pool_->ParallelFor(groups, 16, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        // HF nn.Embedding(padding_idx): lookups of pad_token_id add nothing.
        if ((keys[group_start[g]] >> 32) == padding_idx) continue;
        float* dst = grad + (keys[group_start[g]] >> 32) * c;
        if (need_before) sq_before[g] = row_sq(dst);
        for (int64_t k = group_start[g]; k < group_start[g + 1]; ++k) {
          const float* row = src + (keys[k] & 0xffffffff) * c;
          for (int64_t j = 0; j < c; ++j) dst[j] += row[j];
        }
        if (track) sq_after[g] = row_sq(dst);
      }
    });
    if (track) {
      double before = 0, after = 0;
      for (const double v : sq_before) before += v;
      for (const double v : sq_after) after += v;
      known_sq += after - before;
    }
  }
  if (!task.final || !on_block_final_) return;
  const double sq = known_sq >= 0 && std::isfinite(known_sq)
                        ? known_sq
                        : SumOfSquares(grad, store_->block_numel(task.block), pool_);
  on_block_final_(task.block, sq);
}

bool StreamingExecutor::Impl::PrepareDeviceAccumulation(size_t micro_batches) {
  if (!options_.device_grad_accumulation || micro_batches < 2) return false;
  if (!acc_.empty()) return true;
  try {
    acc_.resize(layout_.blocks.size());
    const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(runtime_->device());
    for (const int64_t block : layout_.StreamedDenseBlocks(options_.resident_layers)) {
      acc_[block] = at::zeros({layout_.blocks[block].numel}, fp32);
      acc_device_bytes_ += layout_.blocks[block].numel * 4;
    }
  } catch (const std::exception& e) {
    acc_.clear();
    options_.device_grad_accumulation = false;
    if (!compat::IsOutOfMemory(e)) throw;
    std::fprintf(stderr,
                 "megatrain: device gradient accumulation off (no device memory for the "
                 "streamed blocks' fp32 gradients); summing micro-batches on the host\n");
    return false;
  }
  return true;
}

void StreamingExecutor::Impl::AccumulateInPlace(const BlockLayout& bl, int64_t block,
                                                const at::Tensor& dst,
                                                const std::vector<at::Tensor>& grads) {
  // The host's adds: fp32 values of each contribution, in micro-batch order.
  std::vector<at::Tensor> g = BindBlockParams(bl, dst);
  const bool first = !seen_[block];
  for (size_t i = 0; i < g.size(); ++i) {
    if (first) {
      g[i].copy_(grads[i]);
    } else {
      g[i].add_(grads[i].to(at::kFloat));
    }
  }
}

void StreamingExecutor::Impl::AccumulatedGradDone(int64_t block) {
  seen_[block] = true;
  if (--remaining_[block] != 0) return;
  const int r = AcquireGradSlot();
  OffloadGrad(r, block, layout_.blocks[block].numel, acc_[block].data_ptr<float>(), {},
              AccumTask::Kind::kDense, {}, /*whole=*/true);
}

void StreamingExecutor::Impl::ResidentGradDone(size_t index) {
  const int64_t block = resident_[index].block;
  seen_[block] = true;
  if (--remaining_[block] != 0) return;
  // The final gradient: its squared norm reaches on_block_final through the
  // accumulator thread, in order with the landed blocks' (a grad slot lends
  // its pinned norm word and events; nothing else crosses PCIe).
  const int r = AcquireGradSlot();
  AccumTask task;
  task.kind = AccumTask::Kind::kResidentNorm;
  task.slot = r;
  task.block = block;
  task.first = task.final = true;
  const int norm_token = timer_.Begin(StreamKind::kCompute);
  task.keep_alive_norm = compat::VectorNormFp64(resident_[index].grad);
  timer_.End(StreamKind::kCompute, norm_token, PhaseTimer::kBackward);
  runtime_->Record(StreamKind::kCompute, *grad_ready_[r]);
  runtime_->Wait(StreamKind::kD2H, *grad_ready_[r]);
  runtime_->CopyDeviceToHost(static_cast<double*>(norm_host_.data()) + r,
                             task.keep_alive_norm.data_ptr(), sizeof(double));
  runtime_->Record(StreamKind::kD2H, *staged_[r]);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void StreamingExecutor::Impl::ApplyResidentUpdate() {
  if (!resident_update_.has_value()) return;
  const int token = timer_.Begin(StreamKind::kCompute);
  for (size_t i = 0; i < resident_.size(); ++i) {
    if (!resident_apply_[i]) continue;
    ResidentBlock& rb = resident_[i];
    TensorAdamWStep(*resident_update_, rb.master, rb.grad, rb.exp_avg, rb.exp_avg_sq, rb.weights);
  }
  timer_.End(StreamKind::kCompute, token);
  resident_update_.reset();
}

absl::Status StreamingExecutor::Impl::ScheduleResidentUpdate(const AdamWStepParams& hp,
                                                            std::vector<bool> apply) {
  if (apply.size() != resident_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("resident update: ", apply.size(),
                                                   " flags for ", resident_.size(),
                                                   " resident blocks"));
  }
  if (resident_update_.has_value()) {
    return absl::FailedPreconditionError(
        "resident update: the previous one has not been enqueued yet (no pass since)");
  }
  resident_update_ = hp;
  resident_apply_ = std::move(apply);
  return absl::OkStatus();
}

absl::Status StreamingExecutor::Impl::SyncResidentToStore(bool grads) {
  if (resident_.empty()) return absl::OkStatus();
  try {
    auto scope = runtime_->Use(StreamKind::kCompute);
    ApplyResidentUpdate();
    for (const ResidentBlock& layer : resident_) {
      const int64_t block = layer.block;
      const int64_t numel = layout_.blocks[block].numel;
      HostTensor(store_->master(block), numel, at::kFloat).copy_(layer.master);
      HostTensor(store_->exp_avg(block), numel, at::kFloat).copy_(layer.exp_avg);
      HostTensor(store_->exp_avg_sq(block), numel, at::kFloat).copy_(layer.exp_avg_sq);
      if (bf16_bits* bf16 = store_->streaming_bf16(block); bf16 != nullptr) {
        HostTensor(bf16, numel, at::kBFloat16).copy_(layer.weights);
      }
      if (grads) HostTensor(store_->grad(block), numel, at::kFloat).copy_(layer.grad);
    }
    runtime_->Synchronize();
  } catch (const std::exception& e) {
    return StatusFromException(e);
  }
  return absl::OkStatus();
}

absl::Status StreamingExecutor::Impl::LoadResidentFromStore() {
  if (resident_.empty()) return absl::OkStatus();
  resident_update_.reset();
  try {
    auto scope = runtime_->Use(StreamKind::kCompute);
    for (ResidentBlock& layer : resident_) {
      const int64_t block = layer.block;
      const int64_t numel = layout_.blocks[block].numel;
      layer.master.copy_(HostTensor(store_->master(block), numel, at::kFloat));
      layer.exp_avg.copy_(HostTensor(store_->exp_avg(block), numel, at::kFloat));
      layer.exp_avg_sq.copy_(HostTensor(store_->exp_avg_sq(block), numel, at::kFloat));
      // A decoder layer with bf16 compute (Create checked that the store
      // has the streaming copy).
      if (!layer.weights.is_same(layer.master)) {
        layer.weights.copy_(HostTensor(store_->streaming_bf16(block), numel, at::kBFloat16));
      }
    }
    runtime_->Synchronize();
  } catch (const std::exception& e) {
    return StatusFromException(e);
  }
  return absl::OkStatus();
}

absl::Status StreamingExecutor::Impl::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !task_running_;
  };
  mu_.Await(absl::Condition(&idle));
  absl::Status status = accumulator_error_;
  accumulator_error_ = absl::OkStatus();
  return status;
}

void StreamingExecutor::Impl::ResetAfterError() {
  try {
    runtime_->Synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: executor reset: %s\n", e.what());
  }
  (void)Drain();
  absl::MutexLock lock(&mu_);
  staging_busy_.assign(options_.num_grad_slots, false);
  upload_pending_ = false;
}

absl::StatusOr<ForwardBackwardResult> StreamingExecutor::Impl::Run(
    absl::Span<const MicroBatch> mbs, bool backward, const BlockFinalCallback& on_block_final,
    std::vector<float>* logits) {
  ForwardBackwardResult result;
  MEGATRAIN_RETURN_IF_ERROR(ValidateBatches(mbs, &result.counted_tokens));
  const Clock::time_point start = Clock::now();
  const int64_t num_layers = layout_.num_layers();
  const int64_t emb = layout_.embedding_block(), head = layout_.head_block();
  const bool tied = config_.tie_word_embeddings;
  h2d_bytes_ = d2h_bytes_ = 0;
  gate_wait_seconds_ = grad_wait_seconds_ = 0;
  timer_.Reset();
  on_block_final_ = on_block_final;

  // The plan of block uses (Note [Streaming pipeline]).
  std::vector<int64_t> blocks;
  // Resident layers have no uses: they never load (Note [Resident layers]).
  for (size_t m = 0; m < mbs.size(); ++m) {
    for (int64_t l = 0; l < num_layers; ++l) {
      if (!Resident(l)) blocks.push_back(layout_.layer_block(l));
    }
    if (tied) blocks.push_back(emb);
    blocks.push_back(head);
    if (backward) {
      for (int64_t l = num_layers - 1; l >= 0; --l) {
        if (!Resident(l)) blocks.push_back(layout_.layer_block(l));
      }
    }
  }
  const int64_t m_count = static_cast<int64_t>(mbs.size());
  remaining_.assign(layout_.blocks.size(), m_count);
  remaining_[emb] = tied ? 2 * m_count : m_count;
  seen_.assign(layout_.blocks.size(), false);
  known_sq_.assign(layout_.blocks.size(), -1.0);
  const double loss_scale = result.counted_tokens > 0 ? 1.0 / result.counted_tokens : 0.0;

  try {
    runtime_->ResetPeak();
    auto compute = runtime_->Use(StreamKind::kCompute);
    timer_.MarkStart();
    ApplyResidentUpdate();
    device_accumulation_ = backward && PrepareDeviceAccumulation(mbs.size());
    Plan(blocks);
    at::Tensor loss_total =
        at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(runtime_->device()));
    int use = 0;
    for (const MicroBatch& mb : mbs) {
      Uploaded up = Upload(mb);
      at::Tensor x = std::move(up.x), labels = std::move(up.labels);
      // Input of layer l, [B, T, C] fp32, kept for backward (undefined when
      // offloaded or when there is no backward).
      std::vector<at::Tensor> saved(num_layers);
      {
        at::NoGradGuard no_grad;
        // Offloaded inputs whose D2H copy may still be reading them.
        std::deque<std::pair<int64_t, at::Tensor>> in_flight;
        for (int64_t l = 0; l < num_layers; ++l) {
          const bool resident = Resident(l);
          at::Tensor flat = resident ? resident_[l].weights : Acquire(use);
          if (backward && Offloaded(l)) {
            OffloadActivation(l, x);
            in_flight.emplace_back(l, x);
          } else if (backward) {
            saved[l] = x;
          }
          const int token = timer_.Begin(StreamKind::kCompute);
          x = DecoderLayerForward(config_, BindDecoderLayerWeights(layout_.blocks[layout_.layer_block(l)], flat),
                                  x, rope_, attention_mask_, cd_);
          timer_.End(StreamKind::kCompute, token, PhaseTimer::kForward);
          if (!resident) Release(use++);
          // Free an offloaded input once its copy is done: the compute
          // stream waits for the copy issued one layer earlier (long done).
          while (in_flight.size() > 1 || (!in_flight.empty() && l + 1 == num_layers)) {
            runtime_->Wait(StreamKind::kCompute, *act_offloaded_[in_flight.front().first]);
            in_flight.pop_front();
          }
        }
      }
      // The input of the first offloaded layer backward needs comes back
      // during the head.
      if (backward && Offloaded(num_layers - 2)) saved[num_layers - 2] = PrefetchActivation(num_layers - 2);
      // Head: loss (and its backward).
      const int emb_use = tied ? use++ : -1;
      const int head_use = use++;
      at::Tensor emb_flat = tied ? Acquire(emb_use) : at::Tensor();
      at::Tensor head_flat = Acquire(head_use);
      std::vector<at::Tensor> head_params = BindBlockParams(layout_.blocks[head], head_flat);
      at::Tensor lm_head = tied ? BindBlockParams(layout_.blocks[emb], emb_flat)[0] : head_params[1];
      at::Tensor grad_y;
      int token = timer_.Begin(StreamKind::kCompute);
      if (backward) {
        HeadResult hr = HeadForwardBackward(config_, x, labels, head_params[0], lm_head, loss_scale,
                                            chunk_tokens_, cd_);
        loss_total.add_(hr.loss_sum);
        grad_y = hr.grad_hidden;
        // Head block gradient: final norm (+ lm_head when untied).
        if (device_accumulation_) {
          AccumulateInPlace(layout_.blocks[head], head, acc_[head],
                            {hr.grad_norm, tied ? at::Tensor() : hr.grad_lm_head});
          timer_.End(StreamKind::kCompute, token, PhaseTimer::kHead);
          AccumulatedGradDone(head);
        } else {
          const int r = AcquireGradSlot();
          if (grad_slot_kind_[r] != static_cast<int>(BlockKind::kHead)) grad_slots_[r].zero_();
          grad_slot_kind_[r] = static_cast<int>(BlockKind::kHead);
          std::vector<at::Tensor> g = BindBlockParams(layout_.blocks[head], grad_slots_[r]);
          g[0].copy_(hr.grad_norm);
          if (!tied) g[1].copy_(hr.grad_lm_head);
          timer_.End(StreamKind::kCompute, token, PhaseTimer::kHead);
          OffloadGrad(r, head, layout_.blocks[head].numel, grad_slots_[r].data_ptr<float>(), {},
                      AccumTask::Kind::kDense, {});
        }
        if (tied) {  // lm_head gradient belongs to the embedding block
          const int r2 = AcquireGradSlot();
          if (grad_slot_kind_[r2] != static_cast<int>(BlockKind::kEmbedding)) grad_slots_[r2].zero_();
          grad_slot_kind_[r2] = static_cast<int>(BlockKind::kEmbedding);
          BindBlockParams(layout_.blocks[emb], grad_slots_[r2])[0].copy_(hr.grad_lm_head);
          OffloadGrad(r2, emb, layout_.blocks[emb].numel, grad_slots_[r2].data_ptr<float>(), {},
                      AccumTask::Kind::kDense, {});
        }
        token = timer_.Begin(StreamKind::kCompute);
      } else {
        at::NoGradGuard no_grad;
        loss_total.add_(HeadLoss(config_, x, labels, head_params[0], lm_head, chunk_tokens_, cd_));
        if (logits != nullptr) {
          at::Tensor l = HeadLogits(config_, x, head_params[0], lm_head, cd_).to(at::kCPU).contiguous();
          logits->assign(l.data_ptr<float>(), l.data_ptr<float>() + l.numel());
        }
      }
      timer_.End(StreamKind::kCompute, token);
      Release(head_use);
      if (tied) Release(emb_use);
      x.reset();
      if (!backward) continue;

      // Backward through the layers: recompute each layer's forward from
      // its saved input with autograd local to the layer.
      for (int64_t l = num_layers - 1; l >= 0; --l) {
        const bool resident = Resident(l);
        const int64_t block = layout_.layer_block(l);
        const BlockLayout& bl = layout_.blocks[block];
        at::Tensor flat = resident ? resident_[l].weights : Acquire(use);
        // Summed on the device (Note [Device gradient accumulation]) or
        // sent to the host through grad slot r.
        const bool on_device = !resident && device_accumulation_;
        const int r = resident || on_device ? -1 : AcquireGradSlot();
        // One layer ahead: the next layer's offloaded input comes back
        // while this layer's backward runs.
        // (Layer L-2's came back during the head.)
        if (l < num_layers - 1 && Offloaded(l - 1)) saved[l - 1] = PrefetchActivation(l - 1);
        if (Offloaded(l)) runtime_->Wait(StreamKind::kCompute, *act_loaded_[l % 2]);
        token = timer_.Begin(StreamKind::kCompute);
        std::vector<at::Tensor> leaves;
        for (const at::Tensor& p : BindBlockParams(bl, flat)) {
          leaves.push_back(p.detach().requires_grad_(true));
        }
        at::Tensor x_leaf = saved[l].detach().requires_grad_(true);
        std::vector<at::Tensor> inputs = leaves;
        inputs.push_back(x_leaf);
        at::Tensor y = DecoderLayerForward(config_, DecoderLayerWeightsFromParams(bl, leaves),
                                           x_leaf, rope_, attention_mask_, cd_);
        std::vector<at::Tensor> grads = torch::autograd::grad({y}, inputs, {grad_y});
        if (resident) {
          // Accumulated in place, fp32, in micro-batch order: the host's adds.
          AccumulateInPlace(bl, block, resident_[l].grad, grads);
        } else if (on_device) {
          AccumulateInPlace(bl, block, acc_[block], grads);
        } else {
          if (grad_slot_kind_[r] != static_cast<int>(BlockKind::kDecoderLayer)) grad_slots_[r].zero_();
          grad_slot_kind_[r] = static_cast<int>(BlockKind::kDecoderLayer);
          std::vector<at::Tensor> g = BindBlockParams(bl, grad_slots_[r]);
          for (size_t i = 0; i < leaves.size(); ++i) g[i].copy_(grads[i]);
        }
        grad_y = grads.back();
        saved[l].reset();
        x_leaf.reset();
        if (Offloaded(l)) runtime_->Record(StreamKind::kCompute, *act_free_[l % 2]);
        timer_.End(StreamKind::kCompute, token, PhaseTimer::kBackward);
        if (resident) {
          ResidentGradDone(static_cast<size_t>(l));
        } else if (on_device) {
          Release(use++);
          AccumulatedGradDone(block);
        } else {
          Release(use++);
          OffloadGrad(r, block, bl.numel, grad_slots_[r].data_ptr<float>(), {},
                      AccumTask::Kind::kDense, {});
        }
      }
      if (emb_resident_ >= 0) {
        // Embedding backward on the device (Note [Resident embedding]):
        // the rows of d hidden_0 summed by token into the table's gradient.
        ResidentBlock& rb = resident_[emb_resident_];
        token = timer_.Begin(StreamKind::kCompute);
        const int64_t c = config_.hidden_size;
        // [V, C] fp32, accumulated into the table's gradient like a layer's.
        AccumulateInPlace(layout_.blocks[emb], emb, rb.grad,
                          {at::embedding_dense_backward(grad_y.to(at::kFloat).reshape({-1, c}),
                                                        up.ids, config_.vocab_size,
                                                        config_.EmbeddingPaddingIdx(),
                                                        /*scale_grad_by_freq=*/false)});
        timer_.End(StreamKind::kCompute, token, PhaseTimer::kBackward);
        ResidentGradDone(static_cast<size_t>(emb_resident_));
        continue;
      }
      // Embedding backward on the host: scatter-add of d hidden_0.
      const int r = AcquireGradSlot();
      at::Tensor dx = grad_y.to(at::kFloat).contiguous();
      OffloadGrad(r, emb, dx.numel(), dx.data_ptr<float>(), dx,
                  AccumTask::Kind::kEmbeddingRows, mb.input_ids);
    }
    const Clock::time_point drain_start = Clock::now();
    result.loss_sum = loss_total.item<double>();  // host sync: end of the pass
    runtime_->Synchronize();
    MEGATRAIN_RETURN_IF_ERROR(Drain());
    result.stats.drain_seconds = SecondsSince(drain_start);
  } catch (const std::exception& e) {
    assume_embedding_grad_zero_ = false;
    ResetAfterError();
    return StatusFromException(e);
  }
  upload_pending_ = false;
  assume_embedding_grad_zero_ = false;
  const auto seconds = timer_.Seconds();
  result.stats.step_seconds = SecondsSince(start);
  result.stats.compute_seconds = seconds[static_cast<int>(StreamKind::kCompute)];
  result.stats.h2d_seconds = seconds[static_cast<int>(StreamKind::kH2D)];
  result.stats.d2h_seconds = seconds[static_cast<int>(StreamKind::kD2H)];
  result.stats.gpu_idle_seconds =
      std::max(0.0, result.stats.step_seconds - result.stats.compute_seconds);
  result.stats.optimizer_exposed_seconds = timer_.WaitIdleSeconds();
  result.stats.gate_wait_seconds = gate_wait_seconds_;
  result.stats.grad_wait_seconds = grad_wait_seconds_;
  const std::array<double, 4> gaps = timer_.ComputeGaps();
  result.stats.gap_start_seconds = gaps[0];
  result.stats.gap_forward_seconds = gaps[1];
  result.stats.gap_head_seconds = gaps[2];
  result.stats.gap_backward_seconds = gaps[3];
  result.stats.h2d_bytes = h2d_bytes_;
  result.stats.d2h_bytes = d2h_bytes_;
  result.stats.tokens = static_cast<int64_t>(mbs.size()) * options_.micro_batch * options_.seq_len;
  result.stats.peak_device_bytes = runtime_->PeakAllocatedBytes();
  return result;
}

StreamingExecutor::StreamingExecutor(std::unique_ptr<Impl> impl, const ExecutorOptions& options)
    : impl_(std::move(impl)), options_(options) {}

StreamingExecutor::~StreamingExecutor() = default;

absl::StatusOr<std::unique_ptr<StreamingExecutor>> StreamingExecutor::Create(
    HostStore* store, DeviceRuntime* runtime, ThreadPool* pool, const ExecutorOptions& options) {
  if (options.micro_batch < 1 || options.micro_batch > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.micro_batch: must be in [1, 4096], got ", options.micro_batch));
  }
  if (options.seq_len < 1 || options.seq_len > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.seq_len: must be in [1, 1048576], got ", options.seq_len));
  }
  if (options.num_weight_slots < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor.num_weight_slots: must be >= 3, got ", options.num_weight_slots));
  }
  if (options.num_grad_slots < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor.num_grad_slots: must be >= 2, got ", options.num_grad_slots));
  }
  if (options.resident_layers < 0 || options.resident_layers > store->layout().num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor.resident_layers: must be in [0, num_hidden_layers=", store->layout().num_layers(),
        "], got ", options.resident_layers));
  }
  if (options.resident_embedding) {
    const ModelLayout& layout = store->layout();
    const BlockLayout& emb = layout.blocks[layout.embedding_block()];
    if (store->config().tie_word_embeddings) {
      return absl::InvalidArgumentError(
          "executor.resident_embedding: needs untied embeddings (tie_word_embeddings is true: "
          "the table is also lm_head and streams with the head)");
    }
    if (emb.params.size() != 1 || emb.params[0].shape.size() != 2 || emb.params[0].offset != 0) {
      return absl::InvalidArgumentError(
          "executor.resident_embedding: the embedding block is not one [vocab_size, hidden_size] "
          "table");
    }
  }
  if (options.compute_dtype == ComputeDtype::kBf16 && !store->options().streaming_bf16) {
    return absl::FailedPreconditionError(
        "executor: bf16 compute needs a host store with a bf16 streaming copy");
  }
  if (options.compute_dtype != ComputeDtype::kBf16 && store->options().streaming_bf16) {
    return absl::FailedPreconditionError(
        "executor: fp32/tf32 compute streams the fp32 master; the store has a bf16 copy");
  }
  auto impl = std::make_unique<Impl>(store, runtime, pool, options);
  MEGATRAIN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<StreamingExecutor>(new StreamingExecutor(std::move(impl), options));
}

absl::StatusOr<ForwardBackwardResult> StreamingExecutor::ForwardBackward(
    absl::Span<const MicroBatch> micro_batches, const BlockFinalCallback& on_block_final) {
  return impl_->Run(micro_batches, /*backward=*/true, on_block_final);
}

absl::StatusOr<ForwardBackwardResult> StreamingExecutor::Evaluate(
    absl::Span<const MicroBatch> micro_batches) {
  return impl_->Run(micro_batches, /*backward=*/false, {});
}

void StreamingExecutor::SetWeightGate(std::function<void(int64_t)> gate) {
  impl_->SetWeightGate(std::move(gate));
}

void StreamingExecutor::AssumeEmbeddingGradZero(bool zero) { impl_->AssumeEmbeddingGradZero(zero); }

void StreamingExecutor::SetEmbeddingRowGate(EmbeddingRowGate gate) {
  impl_->SetEmbeddingRowGate(std::move(gate));
}

absl::StatusOr<std::vector<float>> StreamingExecutor::Logits(const MicroBatch& micro_batch) {
  std::vector<float> logits;
  MEGATRAIN_RETURN_IF_ERROR(
      impl_->Run(absl::MakeConstSpan(&micro_batch, 1), /*backward=*/false, {}, &logits).status());
  return logits;
}

absl::Status StreamingExecutor::ScheduleResidentUpdate(const AdamWStepParams& hp,
                                                      std::vector<bool> apply) {
  return impl_->ScheduleResidentUpdate(hp, std::move(apply));
}

absl::Status StreamingExecutor::SyncResidentToStore(bool grads) {
  return impl_->SyncResidentToStore(grads);
}

absl::Status StreamingExecutor::LoadResidentFromStore() { return impl_->LoadResidentFromStore(); }

const std::vector<int64_t>& StreamingExecutor::resident_blocks() const {
  return impl_->resident_blocks();
}

int64_t StreamingExecutor::slot_device_bytes() const { return impl_->slot_device_bytes(); }
int64_t StreamingExecutor::staging_host_bytes() const { return impl_->staging_host_bytes(); }

}  // namespace megatrain::engine
