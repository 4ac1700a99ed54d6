// Gradient landing and the accumulator thread (Note [Gradient landing] in
// grad_lander.h).
#include "engine/step/grad_lander.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "engine/optim/adamw.h"
#include "engine/store/shard_layout.h"
#include "engine/model/fused_ops.h"
#include "engine/model/layers.h"
#include "engine/runtime/status_macros.h"
#include "engine/runtime/torch_compat.h"
#include "engine/step/device_grad_accumulator.h"

namespace megatrain::engine {
namespace {

// Note [Gradient norm kernel]
// Each landed gradient's L2 norm, accumulated in fp64 (the clip factor's
// and the non-finite check's input). ATen's linalg_vector_norm with an
// fp64 dtype first writes an fp64 copy of the fp32 gradient and then
// reduces it: 16 bytes moved per parameter where one read is 4 (about
// 9 ms of a llama-1b step at 8 x 2048 on an H200, docs/performance.md,
// "Fused RoPE and the fp64 norm"). CUDA builds with the fused kernels
// read it once (FusedNormFp64), whatever train.fused_kernels says: the
// sum is in fp64 either way and differs from ATen's only in its order
// (~1e-15 relative), and every block of a run takes the same kernel, so
// runs stay bit-identical to each other.
at::Tensor GradientNormFp64(const at::Tensor& grad) {
#ifdef MEGATRAIN_FUSED_KERNELS
  if (grad.is_cuda() && grad.scalar_type() == at::kFloat && grad.is_contiguous()) {
    return FusedNormFp64(grad);
  }
#endif
  return compat::VectorNormFp64(grad);
}

}  // namespace

std::vector<int64_t> GradRingNumels(const std::vector<int64_t>& layer_numels, int64_t head_numel,
                                    int64_t largest_layer_numel, int shard_world) {
  const int64_t block_numel =
      layer_numels.empty()
          ? (largest_layer_numel > 0 ? std::min(head_numel, largest_layer_numel) : head_numel)
          : *std::max_element(layer_numels.begin(), layer_numels.end());
  // Note [Shard layout] in store/shard_layout.h: S = ceil(numel / world).
  const int world = std::max(shard_world, 1);
  const int64_t numel = PaddedShardNumel(block_numel, world);
  if (numel <= 0) return {};
  return std::vector<int64_t>(kGradRingBuffers, numel);
}

absl::StatusOr<std::unique_ptr<GradLander>> GradLander::Create(
    StepEnv* env, int num_slots, int64_t max_numel, size_t staging_bytes, int64_t chunk_elements,
    const std::vector<int64_t>& ring_numels) {
  std::unique_ptr<GradLander> g(new GradLander(env));
  const bool pin = env->runtime->is_cuda();
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(env->runtime->device());
  MEGATRAIN_ASSIGN_OR_RETURN(g->norm_host_, HostBuffer::Allocate(num_slots * sizeof(double), pin));
  for (int r = 0; r < num_slots; ++r) {
    g->slots_.push_back(at::zeros({max_numel}, fp32));
    g->device_bytes_ += static_cast<int64_t>(g->slots_.back().nbytes());
    g->slot_kind_.push_back(-1);
    MEGATRAIN_ASSIGN_OR_RETURN(HostBuffer buf, HostBuffer::Allocate(staging_bytes, pin));
    g->pinned_bytes_ += static_cast<int64_t>(buf.bytes());
    g->staging_.push_back(std::move(buf));
    g->grad_ready_.push_back(env->runtime->CreateEvent());
    g->staged_.push_back(env->runtime->CreateEvent());
  }
  g->pinned_bytes_ += static_cast<int64_t>(g->norm_host_.bytes());
  // Note [Resident norm ring].
  MEGATRAIN_ASSIGN_OR_RETURN(g->resident_norm_host_,
                             HostBuffer::Allocate(kResidentNormSlots * sizeof(double), pin));
  g->pinned_bytes_ += static_cast<int64_t>(g->resident_norm_host_.bytes());
  for (int r = 0; r < kResidentNormSlots; ++r) {
    g->resident_ready_.push_back(env->runtime->CreateEvent());
    g->resident_staged_.push_back(env->runtime->CreateEvent());
  }
  // Note [Bounded gradient staging]: the chunk ring, for later
  // contributions added on the host; none with the gradient ring, whose
  // every landing is a block's whole gradient (Note [Gradient ring]).
  const size_t chunk_bytes = static_cast<size_t>(GradChunkNumel(max_numel, chunk_elements)) * 4;
  for (int c = 0; c < (ring_numels.empty() ? kGradChunkBuffers : 0); ++c) {
    MEGATRAIN_ASSIGN_OR_RETURN(HostBuffer buf, HostBuffer::Allocate(chunk_bytes, pin));
    g->pinned_bytes_ += static_cast<int64_t>(buf.bytes());
    g->chunks_.push_back(std::move(buf));
    g->chunk_staged_.push_back(env->runtime->CreateEvent());
  }
  for (const int64_t ring_numel : ring_numels) {  // Note [Gradient ring]
    MEGATRAIN_ASSIGN_OR_RETURN(HostBuffer buf,
                               HostBuffer::Allocate(static_cast<size_t>(ring_numel) * 4, pin));
    g->pinned_bytes_ += static_cast<int64_t>(buf.bytes());
    g->ring_.push_back(std::move(buf));
    g->ring_staged_.push_back(env->runtime->CreateEvent());
  }
  {
    absl::MutexLock lock(&g->mu_);
    g->staging_busy_.assign(num_slots, false);
    g->resident_busy_.assign(kResidentNormSlots, false);
    g->chunk_busy_.assign(kGradChunkBuffers, false);
    g->ring_busy_.assign(g->ring_.size(), false);
  }
  GradLander* raw = g.get();
  g->accumulator_ = std::thread([raw] { raw->Loop(); });
  return g;
}

GradLander::~GradLander() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (accumulator_.joinable()) accumulator_.join();
}

void GradLander::BeginPass(const std::vector<int64_t>& contributions, FinalCallback on_block_final,
                           bool embedding_grad_zero) {
  // The previous pass drained: the accumulator thread is idle.
  contributions_.Begin(contributions);
  known_sq_.assign(contributions.size(), -1.0);
  on_block_final_ = std::move(on_block_final);
  embedding_grad_zero_ = embedding_grad_zero;
}

int GradLander::AcquireSlot() {
  const int r = next_slot_;
  next_slot_ = (next_slot_ + 1) % static_cast<int>(slots_.size());
  const StepClock::time_point start = StepClock::now();
  absl::MutexLock lock(&mu_);
  auto free = [this, r]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !staging_busy_[r] || !error_.ok(); };
  mu_.Await(absl::Condition(&free));
  staging_busy_[r] = true;
  env_->grad_wait_seconds += SecondsSince(start);
  return r;
}

void GradLander::FillSlot(int slot, const BlockLayout& bl, BlockKind kind,
                          absl::Span<const at::Tensor> grads) {
  if (slot_kind_[slot] != static_cast<int>(kind)) slots_[slot].zero_();
  slot_kind_[slot] = static_cast<int>(kind);
  std::vector<at::Tensor> g = BindBlockParams(bl, slots_[slot]);
  for (size_t i = 0; i < g.size() && i < grads.size(); ++i) {
    if (grads[i].defined()) g[i].copy_(grads[i]);
  }
}

void GradLander::LandSlot(int slot, int64_t block) {
  Offload(slot, block, env_->layout.blocks[block].numel, slots_[slot].data_ptr<float>(), {},
          Task::Kind::kDense, {}, /*whole=*/false);
}

void GradLander::AddToSlot(int slot, const BlockLayout& bl, const std::vector<at::Tensor>& grads) {
  AccumulateInto(bl, slots_[slot].narrow(0, 0, bl.numel), grads, /*first=*/false);
}

void GradLander::LandSlotWhole(int slot, int64_t block) {
  Offload(slot, block, env_->layout.blocks[block].numel, slots_[slot].data_ptr<float>(), {},
          Task::Kind::kDense, {}, /*whole=*/true);
}

void GradLander::LandWhole(int64_t block, const at::Tensor& sum) {
  const int r = AcquireSlot();
  Offload(r, block, env_->layout.blocks[block].numel, sum.data_ptr<float>(), {}, Task::Kind::kDense,
          {}, /*whole=*/true);
}

void GradLander::LandEmbeddingRows(int64_t block, const at::Tensor& grad_hidden,
                                   std::vector<int32_t> rows) {
  const int r = AcquireSlot();
  at::Tensor dx = grad_hidden.to(at::kFloat).contiguous();
  Offload(r, block, dx.numel(), dx.data_ptr<float>(), dx, Task::Kind::kEmbeddingRows,
          std::move(rows), /*whole=*/false);
}

int GradLander::AcquireResidentNormSlot() {
  const int r = next_resident_;
  next_resident_ = (next_resident_ + 1) % kResidentNormSlots;
  const StepClock::time_point start = StepClock::now();
  absl::MutexLock lock(&mu_);
  auto free = [this, r]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !resident_busy_[r] || !error_.ok(); };
  mu_.Await(absl::Condition(&free));
  resident_busy_[r] = true;
  env_->grad_wait_seconds += SecondsSince(start);
  return r;
}

void GradLander::LandResidentNorm(int64_t block, const at::Tensor& grad) {
  // Only the norm crosses, through a word of the resident norm ring (Note
  // [Resident norm ring]).
  DeviceRuntime* runtime = env_->runtime;
  const int r = AcquireResidentNormSlot();
  DeviceEvent& grad_ready = *resident_ready_[r];
  Task task;
  task.kind = Task::Kind::kResidentNorm;
  task.slot = r;
  task.releases_slot = false;
  task.block = block;
  task.first = task.final = true;
  if (env_->all_reduce_on_device) {
    // Note [Resident blocks on every rank] in gradient_reducer.h: the sum
    // over the ranks and the norm of the sum run on kD2H, so that the
    // compute stream goes on with the next layer; the pass's final drain
    // (this task's staged event) orders them before the next AdamW.
    runtime->Record(StreamKind::kCompute, grad_ready);
    runtime->Wait(StreamKind::kD2H, grad_ready);
    auto scope = runtime->Use(StreamKind::kD2H);
    const int token = env_->timer.Begin(StreamKind::kD2H);
    env_->all_reduce_on_device(block, grad.data_ptr<float>(), grad.numel());
    task.keep_alive_norm = GradientNormFp64(grad);
    env_->timer.End(StreamKind::kD2H, token);
  } else {
    const int norm_token = env_->timer.Begin(StreamKind::kCompute);
    task.keep_alive_norm = GradientNormFp64(grad);
    env_->timer.End(StreamKind::kCompute, norm_token, PhaseTimer::kBackward);
    runtime->Record(StreamKind::kCompute, grad_ready);
    runtime->Wait(StreamKind::kD2H, grad_ready);
  }
  runtime->CopyDeviceToHost(static_cast<double*>(resident_norm_host_.data()) + r,
                            task.keep_alive_norm.data_ptr(), sizeof(double));
  runtime->Record(StreamKind::kD2H, *resident_staged_[r]);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void GradLander::Offload(int slot, int64_t block, int64_t numel, const float* device_src,
                         at::Tensor keep_alive, Task::Kind kind, std::vector<int32_t> rows,
                         bool whole) {
  DeviceRuntime* runtime = env_->runtime;
  Task task;
  task.kind = kind;
  task.slot = slot;
  task.block = block;
  task.numel = numel;
  if (whole) {  // counted by the caller as its contributions were summed
    task.first = task.final = true;
  } else {
    const GradContributions::Mark mark = contributions_.Count(block);
    task.first = mark.first;
    task.final = mark.final;
  }
  task.direct = kind == Task::Kind::kDense && task.first;
  task.grad_zero = embedding_grad_zero_;
  // The landed range: the whole block, or this rank's shard of it after a
  // reduce-scatter on the device (Note [Device reduce-scatter] in
  // gradient_reducer.h), when the block's whole gradient is here.
  int64_t begin = 0, end = numel;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(runtime->device());
  if (task.direct && task.final && env_->reduce_on_device) {
    ReduceOnDevice(slot, device_src, &task, &begin, &end);
  } else {
    if (task.direct) {
      // The block's gradient so far is this one: its norm, on the device
      // (compute-stream work, timed as such).
      const int norm_token = env_->timer.Begin(StreamKind::kCompute);
      at::Tensor flat = at::from_blob(const_cast<float*>(device_src), {numel}, fp32);
      task.keep_alive_norm = GradientNormFp64(flat);
      env_->timer.End(StreamKind::kCompute, norm_token, PhaseTimer::kBackward);
    }
    runtime->Record(StreamKind::kCompute, *grad_ready_[slot]);
    runtime->Wait(StreamKind::kD2H, *grad_ready_[slot]);
  }
  CheckShardOnly(task);
  if (kind == Task::Kind::kDense && !task.direct) {
    task.keep_alive = std::move(keep_alive);
    OffloadChunks(task, device_src);
    return;
  }
  // A ring landing is the whole block, or this rank's reduced shard of it
  // (Note [Ring shards] in gradient_reducer.h).
  if (task.direct && !ring_.empty() && block != env_->layout.embedding_block()) {
    task.keep_alive = std::move(keep_alive);
    OffloadRing(task, device_src, begin, end);
    return;
  }
  const int64_t bytes = (end - begin) * 4;
  ABSL_RAW_CHECK(task.direct || staging_[slot].bytes() >= static_cast<size_t>(bytes),
                 "GradLander: an embedding contribution with no staging (resident embedding?)");
  void* dst = task.direct ? static_cast<void*>(env_->store->grad(block)) : staging_[slot].data();
  const int token = env_->timer.Begin(StreamKind::kD2H);
  if (bytes > 0) {
    runtime->CopyDeviceToHost(static_cast<float*>(dst) + begin, device_src + begin,
                              static_cast<size_t>(bytes));
  }
  if (task.direct) {
    runtime->CopyDeviceToHost(static_cast<double*>(norm_host_.data()) + slot,
                              task.keep_alive_norm.data_ptr(), sizeof(double));
  }
  env_->timer.End(StreamKind::kD2H, token);
  runtime->Record(StreamKind::kD2H, *staged_[slot]);
  env_->d2h_bytes += bytes;
  task.rows = std::move(rows);
  task.keep_alive = std::move(keep_alive);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void GradLander::ReduceOnDevice(int slot, const float* device_src, Task* task, int64_t* begin,
                                int64_t* end) {
  // The collective and the shard's norm on kD2H, after the backward that
  // made the gradient, so that the compute stream goes on with the next
  // layer meanwhile (the D2H copy follows them on kD2H).
  DeviceRuntime* runtime = env_->runtime;
  runtime->Record(StreamKind::kCompute, *grad_ready_[slot]);
  runtime->Wait(StreamKind::kD2H, *grad_ready_[slot]);
  auto scope = runtime->Use(StreamKind::kD2H);
  const int token = env_->timer.Begin(StreamKind::kD2H);
  float* grad = const_cast<float*>(device_src);
  task->reduced = env_->reduce_on_device(task->block, grad, task->numel, begin, end);
  if (!task->reduced) *begin = 0, *end = task->numel;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(runtime->device());
  at::Tensor flat = at::from_blob(grad + *begin, {*end - *begin}, fp32);
  task->keep_alive_norm = GradientNormFp64(flat);
  env_->timer.End(StreamKind::kD2H, token);
}

void GradLander::CheckShardOnly(const Task& task) const {
  // Note [Shard-only landing] in store/host_store.h: a rank writes into
  // the shared gradient only its shard of a whole, reduced gradient.
  // Anything else (a later micro-batch's contribution, a whole block)
  // would add into or overwrite the other ranks' shards.
  // (With one rank per process the shard is the whole block.)
  if (!env_->store->lands_shard_only(task.block) || task.reduced) return;
  throw std::runtime_error(absl::StrCat(
      "data parallelism: block ", task.block,
      " would land a partial gradient in the shared store; each rank's micro-batches must be "
      "summed on the device (device gradient accumulation needs ",
      task.numel * 4, " bytes of device memory for this block; see the stderr line above)"));
}

void GradLander::OffloadRing(const Task& task, const float* device_src, int64_t begin,
                             int64_t end) {
  // Note [Gradient ring]: the executor lands only whole gradients here.
  ABSL_RAW_CHECK(task.first && task.final, "gradient ring: a partial gradient landed");
  DeviceRuntime* runtime = env_->runtime;
  const int64_t piece = static_cast<int64_t>(ring_[0].bytes() / 4);  // all of one size
  // At least one piece, even for an empty range (a rank that owns no
  // element of the block, or a failed collective): its callback is how
  // the rank takes part in the block's ReduceRingShard.
  int64_t offset = begin;
  do {
    const int64_t count = std::min(piece, end - offset);
    const bool last = offset + count >= end;
    const int r = AcquireRing();
    try {
      const int token = env_->timer.Begin(StreamKind::kD2H);
      if (count > 0) {
        runtime->CopyDeviceToHost(ring_[r].data(), device_src + offset,
                                  static_cast<size_t>(count) * 4);
      }
      if (offset == begin) {  // the landed range's norm, read by every piece
        runtime->CopyDeviceToHost(static_cast<double*>(norm_host_.data()) + task.slot,
                                  task.keep_alive_norm.data_ptr(), sizeof(double));
      }
      env_->timer.End(StreamKind::kD2H, token);
      runtime->Record(StreamKind::kD2H, *ring_staged_[r]);
    } catch (...) {
      ReleaseRing(r);  // never queued: nobody else frees it
      throw;
    }
    Task piece_task = task;
    piece_task.ring = r;
    piece_task.offset = offset;
    piece_task.numel = count;
    piece_task.first_piece = offset == begin;
    piece_task.releases_slot = last;
    // The first piece keeps the norm, the last the source alive.
    if (offset > begin) piece_task.keep_alive_norm.reset();
    if (!last) piece_task.keep_alive.reset();
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(piece_task));
    }
    offset += count;
  } while (offset < end);
  env_->d2h_bytes += (end - begin) * 4;
}

int GradLander::AcquireRing() {
  const int r = next_ring_;
  next_ring_ = (next_ring_ + 1) % static_cast<int>(ring_.size());
  const StepClock::time_point start = StepClock::now();
  absl::MutexLock lock(&mu_);
  auto released = [this, r]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !ring_busy_[r]; };
  mu_.Await(absl::Condition(&released));
  ring_busy_[r] = true;
  env_->grad_wait_seconds += SecondsSince(start);
  return r;
}

void GradLander::ReleaseRing(int r) {
  absl::MutexLock lock(&mu_);
  ring_busy_[r] = false;
}

void GradLander::RunRingPiece(Task& task) {
  env_->runtime->HostWait(*ring_staged_[task.ring]);
  if (!on_block_final_) return;  // Loop releases the buffer
  const double norm = static_cast<const double*>(norm_host_.data())[task.slot];
  FinalGradient piece;
  piece.block = task.block;
  piece.grad_squared_norm = norm * norm;
  piece.begin = task.offset;
  piece.count = task.numel;
  piece.data = static_cast<const float*>(ring_[task.ring].data());
  piece.first = task.first_piece;
  piece.last = task.releases_slot;
  piece.release = [this, r = task.ring] { ReleaseRing(r); };
  task.handed_on = true;
  on_block_final_(piece);
}

int GradLander::AcquireChunk() {
  const int c = next_chunk_;
  next_chunk_ = (next_chunk_ + 1) % kGradChunkBuffers;
  const StepClock::time_point start = StepClock::now();
  absl::MutexLock lock(&mu_);
  auto free = [this, c]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !chunk_busy_[c] || !error_.ok(); };
  mu_.Await(absl::Condition(&free));
  chunk_busy_[c] = true;
  env_->grad_wait_seconds += SecondsSince(start);
  return c;
}

void GradLander::OffloadChunks(const Task& task, const float* device_src) {
  ABSL_RAW_CHECK(!chunks_.empty(), "GradLander: a later contribution with the gradient ring");
  DeviceRuntime* runtime = env_->runtime;
  const int64_t chunk_numel = static_cast<int64_t>(chunks_[0].bytes() / 4);
  for (int64_t offset = 0; offset < task.numel; offset += chunk_numel) {
    const int64_t count = std::min(chunk_numel, task.numel - offset);
    const bool last = offset + count >= task.numel;
    const int c = AcquireChunk();
    const int token = env_->timer.Begin(StreamKind::kD2H);
    runtime->CopyDeviceToHost(chunks_[c].data(), device_src + offset,
                              static_cast<size_t>(count) * 4);
    env_->timer.End(StreamKind::kD2H, token);
    runtime->Record(StreamKind::kD2H, *chunk_staged_[c]);
    Task chunk_task = task;
    chunk_task.chunk = c;
    chunk_task.offset = offset;
    chunk_task.numel = count;
    chunk_task.final = task.final && last;
    chunk_task.releases_slot = last;
    if (!last) chunk_task.keep_alive.reset();  // the last task keeps the source alive
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(chunk_task));
  }
  env_->d2h_bytes += task.numel * 4;
}

void GradLander::Loop() {
  while (true) {
    Task task;
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
      Run(task);
    } catch (const std::exception& e) {
      status = StatusFromException(e);
    }
    task.keep_alive.reset();
    task.keep_alive_norm.reset();
    absl::MutexLock lock(&mu_);
    if (task.chunk >= 0) chunk_busy_[task.chunk] = false;
    // A ring piece nobody took (no callback, or an error before it).
    if (task.ring >= 0 && !task.handed_on) ring_busy_[task.ring] = false;
    if (task.releases_slot) staging_busy_[task.slot] = false;
    if (task.kind == Task::Kind::kResidentNorm) resident_busy_[task.slot] = false;
    task_running_ = false;
    if (!status.ok() && error_.ok()) error_ = status;
  }
}

void GradLander::Run(Task& task) {
  if (task.ring >= 0) {
    RunRingPiece(task);
    return;
  }
  FinalGradient whole;
  whole.block = task.block;
  whole.count = env_->store->block_numel(task.block);
  if (task.kind == Task::Kind::kResidentNorm) {  // Note [Resident norm ring]
    env_->runtime->HostWait(*resident_staged_[task.slot]);
    const double norm = static_cast<const double*>(resident_norm_host_.data())[task.slot];
    whole.grad_squared_norm = norm * norm;
    if (on_block_final_) on_block_final_(whole);
    return;
  }
  env_->runtime->HostWait(task.chunk >= 0 ? *chunk_staged_[task.chunk] : *staged_[task.slot]);
  const double* norms = static_cast<const double*>(norm_host_.data());
  float* grad = env_->store->grad(task.block);
  const float* src = static_cast<const float*>(staging_[task.slot].data());
  // Squared norm of the block's gradient so far, when known without a pass
  // over the whole block.
  double& known_sq = known_sq_[task.block];
  if (task.kind == Task::Kind::kEmbeddingRows) {
    ScatterRows(task, grad, src, known_sq);
  } else if (!task.direct) {  // a chunk of a later micro-batch's contribution
    float* dst = grad + task.offset;
    const float* chunk = static_cast<const float*>(chunks_[task.chunk].data());
    env_->pool->ParallelFor(task.numel, 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dst[i] += chunk[i];
    });
    known_sq = -1;
  } else {
    known_sq = norms[task.slot] * norms[task.slot];
  }
  if (!task.final || !on_block_final_) return;
  whole.grad_squared_norm = known_sq >= 0 && std::isfinite(known_sq)
                                ? known_sq
                                : SumOfSquares(grad, whole.count, env_->pool);
  whole.data = grad;
  on_block_final_(whole);
}

void GradLander::ScatterRows(const Task& task, float* grad, const float* src, double& known_sq) {
  // Embedding backward: grad[token] += d hidden[position]. Positions are
  // grouped by token (ascending within a group, the order the sum takes
  // for every element), so that each group's row is written by one
  // thread and every read and write is a whole contiguous row.
  const int64_t c = env_->config.hidden_size;
  const int64_t block_numel = env_->store->block_numel(task.block);
  ThreadPool* pool = env_->pool;
  // The previous update of the table may still be reading its gradient
  // (Note [Embedding rows on demand] in trainer.h).
  if (env_->weight_gate) env_->weight_gate(task.block);
  if (task.first && !task.grad_zero) {
    pool->ParallelFor(block_numel, 1 << 16, [&](int64_t begin, int64_t end) {
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
  const int64_t padding_idx = env_->config.EmbeddingPaddingIdx();
  auto row_sq = [c](const float* g) {
    double acc = 0;
    for (int64_t j = 0; j < c; ++j) acc += static_cast<double>(g[j]) * g[j];
    return acc;
  };
  pool->ParallelFor(groups, 16, [&](int64_t begin, int64_t end) {
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

absl::Status GradLander::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !task_running_; };
  mu_.Await(absl::Condition(&idle));
  absl::Status status = error_;
  error_ = absl::OkStatus();
  return status;
}

void GradLander::Reset() {
  (void)Drain();
  absl::MutexLock lock(&mu_);
  staging_busy_.assign(slots_.size(), false);
  resident_busy_.assign(resident_busy_.size(), false);
  chunk_busy_.assign(chunks_.size(), false);
  // ring_busy_ stays: every piece landed ran (Drain) and was released or
  // handed on, and a handed-on piece's update may still be reading it.
}

}  // namespace megatrain::engine
