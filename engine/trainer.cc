// Optimizer steps over the streaming executor.
#include "engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device_runtime.h"
#include "engine/executor.h"
#include "engine/status_macros.h"
#include "engine/thread_pool.h"

namespace megatrain::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Trainer::~Trainer() {
  if (optimizer_thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    optimizer_thread_.join();  // runs every queued update first
  }
  executor_.reset();  // drains the device before the store goes away
}

void Trainer::OptimizerLoop() {
  if (options_.optimizer_nice != 0) SetCurrentThreadNice(options_.optimizer_nice);
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;
      auto next = std::min_element(tasks_.begin(), tasks_.end(), [](const auto& a, const auto& b) {
        return std::tie(a.step, a.order, a.slice) < std::tie(b.step, b.order, b.slice);
      });
      task = std::move(next->run);
      tasks_.erase(next);
    }
    task();
  }
}

AdamWBuffers Trainer::StoreBuffers(int64_t block, int64_t offset, int64_t count) const {
  AdamWBuffers buffers;
  buffers.params = store_->master(block) + offset;
  buffers.grads = store_->grad(block) + offset;
  buffers.exp_avg = store_->exp_avg(block) + offset;
  buffers.exp_avg_sq = store_->exp_avg_sq(block) + offset;
  bf16_bits* bf16 = store_->streaming_bf16(block);
  buffers.bf16_params = bf16 != nullptr ? bf16 + offset : nullptr;
  buffers.num_elements = count;
  return buffers;
}

void Trainer::ScheduleUpdate(int64_t block, int64_t step, double lr, float grad_scale) {
  // Note [Optimizer slices]: one task per slice, each accounted separately.
  const int64_t numel = store_->block_numel(block);
  const int64_t slice = options_.optimizer_slice_elements;
  const int64_t slices = std::max<int64_t>(1, (numel + slice - 1) / slice);
  absl::MutexLock lock(&mu_);
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t begin = k * slice;
    const int64_t count = std::min(numel - begin, slice);
    ++pending_[block];
    ++pending_count_;
    tasks_.push_back(UpdateTask{step, block, k, [this, block, step, lr, grad_scale, begin, count] {
      const auto start = std::chrono::steady_clock::now();
      absl::Status status = adamw_->Step(StoreBuffers(block, begin, count), step, lr, grad_scale);
      absl::MutexLock lock(&mu_);
      if (!status.ok() && optimizer_error_.ok()) optimizer_error_ = status;
      optimizer_busy_seconds_ += SecondsSince(start);
      --pending_[block];
      --pending_count_;
    }});
  }
}

void Trainer::ScheduleEmbeddingUpdate(int64_t step, double lr, float grad_scale) {
  const int64_t emb = store_->layout().embedding_block();
  if (emb_rows_ == 0) {  // no row gate (see Create): the whole block at once
    ScheduleUpdate(emb, step, lr, grad_scale);
    return;
  }
  // The lookahead of this step reads the rows this update rewrites.
  FinishLookahead(lookahead_[step % 2]);
  for (int64_t r = 0; r < emb_rows_; ++r) emb_row_state_[r].store(0, std::memory_order_relaxed);
  emb_grad_zero_next_ = true;  // the update zeroes each row's gradient
  emb_step_ = step;
  emb_lr_ = lr;
  emb_grad_scale_ = grad_scale;
  absl::MutexLock lock(&mu_);
  ++pending_[emb];
  emb_rows_pending_ = true;
  ++pending_count_;
  // Last in priority: the next forward's gathers update their own rows.
  tasks_.push_back(UpdateTask{step, store_->num_blocks(), 0, [this, emb] {
    const auto start = std::chrono::steady_clock::now();
    pool_->ParallelFor(emb_rows_, 64, [this](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) UpdateEmbeddingRow(r);
    });
    absl::MutexLock lock(&mu_);
    optimizer_busy_seconds_ += SecondsSince(start);
    emb_rows_pending_ = false;
    --pending_[emb];
    --pending_count_;
  }});
}

void Trainer::UpdateEmbeddingRow(int64_t row) {
  std::atomic<uint8_t>& state = emb_row_state_[row];
  uint8_t expected = 0;
  if (state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
    const int64_t emb = store_->layout().embedding_block();
    const int64_t offset = row * emb_row_width_;
    absl::Status status =
        adamw_->Step(StoreBuffers(emb, offset, emb_row_width_), emb_step_, emb_lr_, emb_grad_scale_);
    std::memset(store_->grad(emb) + offset, 0, static_cast<size_t>(emb_row_width_) * 4);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      if (optimizer_error_.ok()) optimizer_error_ = status;
    }
    state.store(2, std::memory_order_release);
    return;
  }
  while (state.load(std::memory_order_acquire) != 2) std::this_thread::yield();
}

void Trainer::GateEmbeddingRows(absl::Span<const int32_t> token_ids,
                                absl::Span<const float*> row_sources) {
  const float* table = store_->master(store_->layout().embedding_block());
  // Only the first gather after the lookahead's update was scheduled may
  // use it (Note [Embedding lookahead]).
  const Lookahead* la = std::exchange(gate_lookahead_, nullptr);
  bool pending;
  {
    absl::MutexLock lock(&mu_);
    pending = emb_rows_pending_;
  }
  if (pending || la != nullptr) {
    std::vector<int32_t> rows = DistinctTokenIds(token_ids);
    if (la != nullptr) {
      const size_t all = rows.size();
      rows.erase(std::remove_if(rows.begin(), rows.end(),
                                [la](int32_t r) { return la->slot_of_row[r] >= 0; }),
                 rows.end());
      lookahead_rows_ += static_cast<int64_t>(all - rows.size());
    }
    if (!pending) rows.clear();
    critical_pool_->ParallelFor(static_cast<int64_t>(rows.size()), 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) UpdateEmbeddingRow(rows[i]);
    });
    gate_rows_ += static_cast<int64_t>(rows.size());
  }
  for (size_t i = 0; i < token_ids.size(); ++i) {
    const int32_t id = token_ids[i];
    const int32_t slot = la != nullptr ? la->slot_of_row[id] : -1;
    if (slot >= 0) {
      row_sources[i] = la->values.data() + static_cast<int64_t>(slot) * emb_row_width_;
    } else {
      row_sources[i] = table + static_cast<int64_t>(id) * emb_row_width_;
    }
  }
}

void Trainer::QueueLookahead(int64_t step, double lr, absl::Span<const MicroBatch> micro_batches,
                             absl::Span<const int32_t> next_input_ids) {
  Lookahead& la = lookahead_[step % 2];
  FinishLookahead(la);  // step - 2's, long consumed
  for (const int32_t r : la.rows) la.slot_of_row[r] = -1;
  la.rows.clear();
  if (la.slot_of_row.empty()) la.slot_of_row.assign(emb_rows_, -1);
  if (touched_.empty()) touched_.assign(emb_rows_, 0);
  // Ids come from the caller unchecked here (the executor validates this
  // step's batch after this, the next one's a step later): out-of-range
  // ones are skipped, and the batch then fails with INVALID_ARGUMENT.
  auto in_range = [this](int32_t id) { return id >= 0 && id < emb_rows_; };
  auto mark = [&](uint8_t value) {
    for (const MicroBatch& mb : micro_batches) {
      for (const int32_t id : mb.input_ids) {
        if (in_range(id)) touched_[id] = value;
      }
    }
  };
  mark(1);
  for (const int32_t id : next_input_ids) {
    if (!in_range(id) || touched_[id] || la.slot_of_row[id] >= 0) continue;
    la.slot_of_row[id] = static_cast<int32_t>(la.rows.size());
    la.rows.push_back(id);
  }
  mark(0);
  if (la.rows.empty()) return;
  const size_t values = la.rows.size() * static_cast<size_t>(emb_row_width_);
  if (la.values.size() < values) la.values.resize(values);
  la.step = step;
  la.lr = lr;
  absl::MutexLock lock(&mu_);
  la.state = LookaheadState::kQueued;
  tasks_.push_back(UpdateTask{step, -1, 0, [this, &la] { RunLookahead(la); }});
}

void Trainer::RunLookahead(Lookahead& la) {
  {
    absl::MutexLock lock(&mu_);
    if (la.state != LookaheadState::kQueued) return;  // cancelled
    la.state = LookaheadState::kRunning;
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t emb = store_->layout().embedding_block();
  const int64_t c = emb_row_width_;
  std::atomic<bool> failed{false};
  pool_->ParallelFor(static_cast<int64_t>(la.rows.size()), 16, [&](int64_t begin, int64_t end) {
    std::vector<float> zero(c, 0.0f), m(c), v(c);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = la.rows[i];
      UpdateEmbeddingRow(row);  // the previous step's update of the row, if pending
      const AdamWBuffers stored = StoreBuffers(emb, row * c, c);
      float* value = la.values.data() + i * c;
      std::memcpy(value, stored.params, c * 4);
      std::memcpy(m.data(), stored.exp_avg, c * 4);
      std::memcpy(v.data(), stored.exp_avg_sq, c * 4);
      AdamWBuffers buffers;
      buffers.params = value;
      buffers.grads = zero.data();
      buffers.exp_avg = m.data();
      buffers.exp_avg_sq = v.data();
      buffers.num_elements = c;
      if (!adamw_->Step(buffers, la.step, la.lr, 1.0f).ok()) failed = true;
    }
  });
  absl::MutexLock lock(&mu_);
  optimizer_busy_seconds_ += SecondsSince(start);
  la.state = failed ? LookaheadState::kCancelled : LookaheadState::kDone;
}

void Trainer::FinishLookahead(Lookahead& la) {
  absl::MutexLock lock(&mu_);
  const bool keep = options_.debug_keep_lookahead;
  if (la.state == LookaheadState::kQueued && !keep) la.state = LookaheadState::kCancelled;
  auto settled = [&la]() {
    return la.state != LookaheadState::kRunning && la.state != LookaheadState::kQueued;
  };
  mu_.Await(absl::Condition(&settled));
}

void Trainer::WaitBlock(int64_t block) {
  absl::MutexLock lock(&mu_);
  auto done = [this, block]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_[block] == 0; };
  mu_.Await(absl::Condition(&done));
}

absl::Status Trainer::WaitForCpuOptimizer() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_count_ == 0; };
  mu_.Await(absl::Condition(&idle));
  return optimizer_error_;
}

absl::Status Trainer::SyncResidentIfNewer() {
  if (!resident_device_newer_) return absl::OkStatus();
  MEGATRAIN_RETURN_IF_ERROR(executor_->SyncResidentToStore(/*grads=*/false));
  resident_device_newer_ = false;
  return absl::OkStatus();
}

absl::Status Trainer::WaitForOptimizer() {
  MEGATRAIN_RETURN_IF_ERROR(WaitForCpuOptimizer());
  return SyncResidentIfNewer();
}

HostStore& Trainer::store() {
  if (!executor_->resident_blocks().empty()) {
    // Hand out current values even to a caller that skipped
    // WaitForOptimizer (the resident blocks never wait on the CPU queue);
    // an error surfaces at the next Step.
    if (absl::Status status = SyncResidentIfNewer(); !status.ok()) {
      absl::MutexLock lock(&mu_);
      if (optimizer_error_.ok()) optimizer_error_ = status;
    }
    resident_store_changed_ = true;
  }
  return *store_;
}

absl::Status Trainer::ReloadResidentIfStoreChanged() {
  if (!resident_store_changed_) return absl::OkStatus();
  MEGATRAIN_RETURN_IF_ERROR(executor_->LoadResidentFromStore());
  resident_store_changed_ = false;
  return absl::OkStatus();
}

int64_t Trainer::ResidentIndexOf(int64_t block) const {
  const std::vector<int64_t>& blocks = executor_->resident_blocks();
  const auto it = std::find(blocks.begin(), blocks.end(), block);
  return it == blocks.end() ? -1 : it - blocks.begin();
}

int ResolveResidentLayers(const ModelConfig& config, int option, bool cuda) {
  if (option >= 0) return option;
  // Layers 0 and 1, whose updates would otherwise start every step on the
  // critical path; at least one layer keeps streaming.
  return cuda ? static_cast<int>(std::clamp<int64_t>(config.num_hidden_layers - 1, 0, 2)) : 0;
}

bool ResolveResidentEmbedding(const ModelConfig& config, int option, int64_t device_total_bytes) {
  if (option >= 0) return option == 1;
  if (device_total_bytes <= 0 || config.tie_word_embeddings) return false;
  const double bytes = 16.0 * static_cast<double>(config.vocab_size) * config.hidden_size;
  return bytes <= kResidentEmbeddingMaxFraction * static_cast<double>(device_total_bytes);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config,
                                                        const TrainerOptions& options,
                                                        uint64_t seed) {
  MEGATRAIN_RETURN_IF_ERROR(config.Validate());
  if (options.optimizer_nice < 0 || options.optimizer_nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_nice: must be in [0, 19] (only lowering the priority needs no privilege), got ",
        options.optimizer_nice));
  }
  if (options.critical_threads < 0 || options.critical_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("critical_threads: must be in [0, 1024], got ", options.critical_threads));
  }
  if (options.resident_layers < -1 || options.resident_layers > config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident_layers: must be -1 (auto) or in [0, num_hidden_layers=", config.num_hidden_layers,
        "], got ", options.resident_layers));
  }
  if (options.resident_embedding < -1 || options.resident_embedding > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident_embedding: must be -1 (auto), 0 or 1, got ", options.resident_embedding));
  }
  if (options.resident_embedding == 1 && config.tie_word_embeddings) {
    return absl::InvalidArgumentError(
        "resident_embedding: needs untied embeddings (tie_word_embeddings is true: the table is "
        "also lm_head and streams with the head)");
  }
  if (options.device_grad_accumulation < -1 || options.device_grad_accumulation > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_grad_accumulation: must be -1 (auto), 0 or 1, got ",
                     options.device_grad_accumulation));
  }
  if (options.optimizer_slice_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_slice_elements: must be >= 1, got ", options.optimizer_slice_elements));
  }
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  t->pool_ = ThreadPool::Create(options.threads, options.optimizer_nice);
  t->critical_pool_ = ThreadPool::Create(
      options.critical_threads > 0
          ? options.critical_threads
          : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16));
  MEGATRAIN_ASSIGN_OR_RETURN(t->runtime_, DeviceRuntime::Create(options.device));
  HostStoreOptions store_options;
  store_options.streaming_bf16 = options.compute_dtype == ComputeDtype::kBf16;
  store_options.pin = t->runtime_->is_cuda();
  MEGATRAIN_ASSIGN_OR_RETURN(t->store_, HostStore::Create(config, store_options));
  t->store_->InitializeWeights(seed);
  ExecutorOptions exec;
  exec.compute_dtype = options.compute_dtype;
  exec.micro_batch = options.micro_batch;
  exec.seq_len = options.seq_len;
  exec.num_weight_slots = options.num_weight_slots;
  exec.loss_chunk_tokens = options.loss_chunk_tokens;
  exec.offload_activations = options.offload_activations;
  // Note [Resident layers] in executor.h.
  t->resident_layers_ =
      ResolveResidentLayers(config, options.resident_layers, t->runtime_->is_cuda());
  exec.resident_layers = t->resident_layers_;
  // Note [Resident embedding] in executor.h.
  t->resident_embedding_ = ResolveResidentEmbedding(
      config, options.resident_embedding, t->runtime_->is_cuda() ? t->runtime_->TotalBytes() : 0);
  exec.resident_embedding = t->resident_embedding_;
  // Note [Device gradient accumulation] in executor.h.
  if (options.device_grad_accumulation >= 0) {
    exec.device_grad_accumulation = options.device_grad_accumulation == 1;
  } else if (t->runtime_->is_cuda()) {
    const ModelLayout& layout = t->store_->layout();
    int64_t numel = 0;
    for (const int64_t block : layout.StreamedDenseBlocks(t->resident_layers_)) {
      numel += layout.blocks[block].numel;
    }
    exec.device_grad_accumulation =
        4.0 * static_cast<double>(numel) <=
        kDeviceGradAccumulationMaxFraction * static_cast<double>(t->runtime_->TotalBytes());
  }
  t->device_grad_accumulation_ = exec.device_grad_accumulation;
  MEGATRAIN_ASSIGN_OR_RETURN(
      t->executor_,
      StreamingExecutor::Create(t->store_.get(), t->runtime_.get(), t->critical_pool_.get(), exec));
  MEGATRAIN_ASSIGN_OR_RETURN(CpuAdamW adamw, CpuAdamW::Create(options.adamw, t->pool_.get()));
  t->adamw_ = std::make_unique<CpuAdamW>(std::move(adamw));
  LrScheduleOptions schedule = options.schedule;
  schedule.peak_lr = options.adamw.lr;
  MEGATRAIN_ASSIGN_OR_RETURN(LrSchedule lr, LrSchedule::Create(schedule));
  t->schedule_ = std::make_unique<LrSchedule>(std::move(lr));
  {
    absl::MutexLock lock(&t->mu_);
    t->pending_.assign(t->store_->num_blocks(), 0);
  }
  Trainer* raw = t.get();
  t->executor_->SetWeightGate([raw](int64_t block) { raw->WaitBlock(block); });
  // Row-wise embedding updates need the table as one [V, C] parameter at
  // the start of its block (Note [Embedding rows on demand]); a resident
  // embedding is updated on the device instead.
  const BlockLayout& emb = t->store_->layout().blocks[t->store_->layout().embedding_block()];
  if (!t->resident_embedding_ && emb.params.size() == 1 && emb.params[0].offset == 0 &&
      emb.params[0].shape.size() == 2) {
    t->emb_rows_ = emb.params[0].shape[0];
    t->emb_row_width_ = emb.params[0].shape[1];
    t->emb_row_state_ = std::make_unique<std::atomic<uint8_t>[]>(t->emb_rows_);
    for (int64_t r = 0; r < t->emb_rows_; ++r) t->emb_row_state_[r].store(2);
    t->executor_->SetEmbeddingRowGate(
        [raw](absl::Span<const int32_t> ids, absl::Span<const float*> sources) {
          raw->GateEmbeddingRows(ids, sources);
        });
  }
  t->optimizer_thread_ = std::thread([raw] { raw->OptimizerLoop(); });
  return t;
}

absl::StatusOr<StepResult> Trainer::Step(absl::Span<const MicroBatch> micro_batches,
                                         absl::Span<const int32_t> next_input_ids) {
  const auto start = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    if (!optimizer_error_.ok()) return optimizer_error_;
  }
  MEGATRAIN_RETURN_IF_ERROR(ReloadResidentIfStoreChanged());
  const int64_t step_number = step_ + 1;
  const double lr = schedule_->LrAt(step_number);
  const bool overlap_backward = options_.max_grad_norm <= 0;
  const NonFiniteInjection& inject = options_.debug_nonfinite;
  const bool poison = inject.step == step_number && !debug_nonfinite_done_;
  if (poison) debug_nonfinite_done_ = true;
  // Squared gradient norm per block, computed on the accumulator thread as
  // each block's gradient becomes final (overlapping the rest of backward).
  // The callback runs on that one thread; ForwardBackward returns after its
  // last call, so the vectors and flags are read below without a lock.
  std::vector<double> block_sq(store_->num_blocks(), 0.0);
  bool stopped = false;        // a non-finite block gradient was seen (overlap)
  int64_t blocks_updated = 0;  // updates queued during backward (overlap)
  // Resident blocks whose update this step applies (overlap: those final
  // before any non-finite block), enqueued on the device after the pass.
  const size_t num_resident = executor_->resident_blocks().size();
  std::vector<bool> resident_apply(num_resident, false);
  // The previous step's row-wise embedding update leaves the table's
  // gradient zero (it completes before this step's scatter, which waits).
  executor_->AssumeEmbeddingGradZero(emb_grad_zero_next_);
  emb_grad_zero_next_ = false;
  gate_rows_ = lookahead_rows_ = 0;
  if (!next_input_ids.empty() && emb_rows_ > 0 && !config().tie_word_embeddings) {
    QueueLookahead(step_number, lr, micro_batches, next_input_ids);
  }
  absl::StatusOr<ForwardBackwardResult> fb_or =
      executor_->ForwardBackward(micro_batches, [&](int64_t block, double grad_sq) {
        // The executor gives the block's squared gradient norm; a poisoned
        // gradient (testing only) is measured again.
        double sq = grad_sq;
        const int64_t resident = ResidentIndexOf(block);
        const bool poison_block = poison && (inject.kind == NonFiniteInjection::Kind::kLoss ||
                                             block == store_->layout().embedding_block());
        if (poison_block && resident >= 0) {  // its gradient is on the device
          sq = inject.kind == NonFiniteInjection::Kind::kLoss
                   ? std::numeric_limits<double>::quiet_NaN()
                   : std::numeric_limits<double>::infinity();
        } else if (poison_block) {
          store_->grad(block)[0] = inject.kind == NonFiniteInjection::Kind::kLoss
                                       ? std::numeric_limits<float>::quiet_NaN()
                                       : std::numeric_limits<float>::infinity();
          sq = SumOfSquares(store_->grad(block), store_->block_numel(block), pool_.get());
        }
        block_sq[block] = sq;
        if (!overlap_backward) return;
        // Note [Non-finite steps]: the first non-finite block stops the step.
        if (!std::isfinite(sq)) stopped = true;
        if (stopped) return;
        if (resident >= 0) {
          resident_apply[resident] = true;
        } else if (block == store_->layout().embedding_block()) {
          ScheduleEmbeddingUpdate(step_number, lr, 1.0f);
        } else {
          ScheduleUpdate(block, step_number, lr, 1.0f);
        }
        ++blocks_updated;
      });
  // This step's lookahead serves the next step's first gather only if this
  // step's embedding update is the one it anticipated (Note [Embedding
  // lookahead]); the one this step's gathers could use is spent.
  gate_lookahead_ = nullptr;
  if (!fb_or.ok()) {
    FinishLookahead(lookahead_[step_number % 2]);
    return fb_or.status();
  }
  ForwardBackwardResult& fb = *fb_or;
  auto schedule_resident = [&](float grad_scale) -> absl::Status {
    if (std::find(resident_apply.begin(), resident_apply.end(), true) == resident_apply.end()) {
      return absl::OkStatus();
    }
    MEGATRAIN_RETURN_IF_ERROR(executor_->ScheduleResidentUpdate(
        MakeAdamWStepParams(options_.adamw, step_number, lr, grad_scale), resident_apply));
    resident_device_newer_ = true;
    return absl::OkStatus();
  };
  // Overlap: the resident layers approved during backward are updated even
  // if a later block turns out non-finite (as the CPU blocks queued before
  // it are; Note [Non-finite steps]).
  if (overlap_backward) MEGATRAIN_RETURN_IF_ERROR(schedule_resident(1.0f));
  StepResult result;
  result.loss = fb.loss();
  if (poison && inject.kind == NonFiniteInjection::Kind::kLoss) {
    result.loss = std::numeric_limits<double>::quiet_NaN();
  }
  result.counted_tokens = fb.counted_tokens;
  result.lr = lr;
  double total_sq = 0;
  for (const double sq : block_sq) total_sq += sq;
  result.grad_norm = std::sqrt(total_sq);
  const bool finite = std::isfinite(result.loss) && std::isfinite(result.grad_norm) && !stopped;
  if (finite) {
    if (!overlap_backward) {
      const float grad_scale = ClipCoefficient(result.grad_norm, options_.max_grad_norm);
      resident_apply.assign(num_resident, true);
      MEGATRAIN_RETURN_IF_ERROR(schedule_resident(grad_scale));
      // Forward order, so that the next step's first layers are ready first.
      if (!resident_embedding_) ScheduleEmbeddingUpdate(step_number, lr, grad_scale);
      for (int64_t l = resident_layers_; l < store_->layout().num_layers(); ++l) {
        ScheduleUpdate(store_->layout().layer_block(l), step_number, lr, grad_scale);
      }
      ScheduleUpdate(store_->layout().head_block(), step_number, lr, grad_scale);
    }
    ++step_;
    Lookahead& la = lookahead_[step_number % 2];
    FinishLookahead(la);
    bool done;
    {
      absl::MutexLock lock(&mu_);
      done = la.state == LookaheadState::kDone;
    }
    if (done && la.step == step_number && emb_step_ == step_number && emb_lr_ == la.lr) {
      gate_lookahead_ = &la;
    }
  } else {
    FinishLookahead(lookahead_[step_number % 2]);
    // Blocks updated before a non-finite one (clipping off) have used
    // step_number in their AdamW bias correction: the step counts.
    result.skipped = true;
    result.partial = blocks_updated > 0;
    if (result.partial) ++step_;
    if (options_.nan_policy == NanPolicy::kFail) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step_number, ": loss ", result.loss, ", gradient norm ", result.grad_norm,
          ": not finite (train.nan_policy: fail)",
          result.partial ? absl::StrCat("; ", blocks_updated, " of ", store_->num_blocks(),
                                        " blocks were updated before the non-finite gradient")
                         : "; the update was not applied",
          ". Master weights hold no non-finite value"));
    }
  }
  result.step = step_;
  result.stats = fb.stats;
  result.stats.gate_rows = gate_rows_;
  result.stats.lookahead_rows = lookahead_rows_;
  {
    // CPU time of the updates that finished since the previous Step().
    absl::MutexLock lock(&mu_);
    result.stats.optimizer_seconds = optimizer_busy_seconds_;
    optimizer_busy_seconds_ = 0;
  }
  result.stats.step_seconds = SecondsSince(start);
  result.stats.gpu_idle_seconds =
      std::max(0.0, result.stats.step_seconds - result.stats.compute_seconds);
  return result;
}

absl::StatusOr<double> Trainer::Evaluate(absl::Span<const MicroBatch> micro_batches) {
  MEGATRAIN_RETURN_IF_ERROR(WaitForCpuOptimizer());
  MEGATRAIN_RETURN_IF_ERROR(ReloadResidentIfStoreChanged());
  MEGATRAIN_ASSIGN_OR_RETURN(ForwardBackwardResult r, executor_->Evaluate(micro_batches));
  return r.loss();
}

absl::StatusOr<std::vector<float>> Trainer::Logits(const MicroBatch& micro_batch) {
  MEGATRAIN_RETURN_IF_ERROR(WaitForCpuOptimizer());
  MEGATRAIN_RETURN_IF_ERROR(ReloadResidentIfStoreChanged());
  return executor_->Logits(micro_batch);
}

std::string Trainer::device_name() const { return runtime_->name(); }
bool Trainer::is_cuda() const { return runtime_->is_cuda(); }
int64_t Trainer::slot_device_bytes() const { return executor_->slot_device_bytes(); }
int64_t Trainer::staging_host_bytes() const { return executor_->staging_host_bytes(); }

}  // namespace megatrain::engine
