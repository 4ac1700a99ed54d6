// Data-parallel trainer over c10d (data_parallel.h).
#include "engine/dist/data_parallel.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/dist/first_use.h"
#include "engine/dist/peer_exchange.h"
#include "engine/dist/rank_threads.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {

std::vector<std::string> DataParallelDevices(const std::string& base_device, int devices) {
  std::vector<std::string> out;
  if (!absl::StartsWith(base_device, "cuda")) {
    out.assign(static_cast<size_t>(std::max(devices, 0)), base_device);
    return out;
  }
  int first = 0;
  if (base_device.size() > 5 && base_device[4] == ':') {
    if (!absl::SimpleAtoi(base_device.substr(5), &first)) first = 0;
  }
  for (int r = 0; r < devices; ++r) out.push_back(absl::StrCat("cuda:", first + r));
  return out;
}

bool DataParallelGradientRing(const TrainerOptions& options, const ModelConfig& config, int world,
                              GradientReduction reduction) {
  if (options.gradient_landing != GradientLanding::kAuto) {
    return options.gradient_landing == GradientLanding::kRing;
  }
  const int64_t per_rank = options.gradient_accumulation_steps / std::max(world, 1);
  const bool whole =
      per_rank <= 1 || (options.device_grad_accumulation != 0 &&
                        (!config.tie_word_embeddings || options.resident_embedding == 1));
  return !ClippingForbidsGradientRing(options.max_grad_norm) && options.nvme_dir.empty() &&
         reduction != GradientReduction::kHostAllReduce && whole;
}

namespace {

// Note [Resident blocks on every rank] in step/gradient_reducer.h: every
// rank must plan the same pass (the same resident blocks, schedule and
// gradient path), or their collectives would not match. Rank 0 resolves
// the auto choices for its device; the others take them as given.
void ForceChoiceOf(const Trainer& rank0, TrainerOptions* options) {
  const ScheduleChoice& choice = rank0.schedule_choice();
  options->resident_layers = rank0.resident_layers();
  options->resident_embedding = rank0.resident_embedding() ? 1 : 0;
  options->device_grad_accumulation = rank0.device_grad_accumulation() ? 1 : 0;
  options->cuda_graphs = choice.cuda_graphs ? 1 : 0;
  options->kept_graph_layers = choice.kept_graph_layers;
  options->step_schedule = choice.schedule;
  options->wave = choice.wave;
  options->activation_placement =
      choice.offload_activations ? ActivationPlacement::kHost : ActivationPlacement::kDevice;
}

// INVALID_ARGUMENT unless the device count, the process's rank and the
// accumulation steps (a multiple of every rank of every process) hold.
absl::Status CheckDataParallelOptions(const TrainerOptions& options,
                                      const DataParallelOptions& dp) {
  const int local = static_cast<int>(dp.devices.size());
  if (local < 1 || local > kMaxDataParallelRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.devices: must be in [1, ", kMaxDataParallelRanks, "], got ", local));
  }
  if (dp.num_processes < 1 || dp.process_rank < 0 || dp.process_rank >= dp.num_processes ||
      (dp.num_processes > 1 && dp.rendezvous == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK: must be in [0, WORLD_SIZE=", dp.num_processes,
                     ") with a rendezvous store, got ", dp.process_rank));
  }
  if (options.gradient_landing == GradientLanding::kRing &&
      dp.gradient_reduction == GradientReduction::kHostAllReduce) {
    // Note [Ring shards] in step/gradient_reducer.h.
    return absl::InvalidArgumentError(
        "memory.gradient_landing: ring with train.devices > 1 needs the device reduce-scatter "
        "(each rank lands its reduced shard in its ring); gradient_reduction host_all_reduce "
        "lands whole blocks: use device_reduce_scatter or auto");
  }
  const int world = local * dp.num_processes;
  if (options.gradient_accumulation_steps % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.gradient_accumulation_steps: must be a multiple of train.devices=", local,
        dp.num_processes > 1 ? absl::StrCat(" x WORLD_SIZE=", dp.num_processes) : "",
        " (each device runs the same number of micro-batches), got ",
        options.gradient_accumulation_steps));
  }
  return absl::OkStatus();
}

// The error to report of a step in which some ranks failed (`errors`, per
// rank; `lowest`: the lowest rank's): the first that is not UNAVAILABLE.
// A rank whose optimizer failed (an NVMe tier file that cannot be read,
// Note [Tiered trainer] in step/trainer.h) tells the others in the step's
// first collective (GradientReducer::BeginStep), and their UNAVAILABLE is
// the echo, not the cause; so is the timeout of ranks left waiting by a
// rank that failed elsewhere.
absl::Status CauseOf(const std::vector<absl::Status>& errors, const absl::Status& lowest) {
  for (const absl::Status& e : errors) {
    if (!e.ok() && !absl::IsUnavailable(e)) return e;
  }
  return lowest;
}

}  // namespace

absl::Status DataParallelTrainer::OnEveryRank(const std::function<absl::Status(int)>& fn) {
  return threads_->Run(fn);
}

DataParallelTrainer::~DataParallelTrainer() {
  // The other ranks' weight gates use rank 0's queue: they go first; rank
  // 0 drains its optimizer (which writes the shared store) before the
  // reducers and the store go.
  while (!ranks_.empty()) ranks_.pop_back();
  reducers_.clear();
  weight_groups_.clear();
  cross_groups_.clear();
  local_groups_.clear();
  groups_.clear();
}

absl::Status JoinFromTorchrunEnv(std::chrono::milliseconds timeout, DataParallelOptions* dp) {
  absl::StatusOr<TorchrunEnv> env = ReadTorchrunEnv();
  if (absl::IsNotFound(env.status())) {  // WORLD_SIZE unset: a bad variable here
    return absl::InvalidArgumentError(env.status().message());
  }
  MEGATRAIN_RETURN_IF_ERROR(env.status());
  MEGATRAIN_ASSIGN_OR_RETURN(dp->rendezvous, RendezvousStore::CreateTcp(*env, timeout));
  dp->process_rank = env->rank;
  dp->num_processes = env->world_size;
  return absl::OkStatus();
}

absl::Status DataParallelTrainer::JoinGroups(const DataParallelOptions& dp) {
  const int local = static_cast<int>(dp.devices.size());
  const int world = local * num_processes_;
  std::shared_ptr<RendezvousStore> shared =
      dp.rendezvous != nullptr ? dp.rendezvous : RendezvousStore::CreateInProcess();
  // Note [One client per rank] in process_group.h.
  std::vector<std::shared_ptr<RendezvousStore>> stores(static_cast<size_t>(local), shared);
  for (int r = 1; r < local; ++r) {
    MEGATRAIN_ASSIGN_OR_RETURN(stores[static_cast<size_t>(r)], RendezvousStore::Connect(shared));
  }
  groups_.resize(static_cast<size_t>(local));
  // Every rank joins at once (the group's creation is a barrier).
  MEGATRAIN_RETURN_IF_ERROR(OnEveryRank([&](int r) -> absl::Status {
    const std::string& device = dp.devices[static_cast<size_t>(r)];
    MEGATRAIN_ASSIGN_OR_RETURN(
        groups_[r], CollectiveGroup::Create(stores[static_cast<size_t>(r)],
                                            process_rank_ * local + r, world, device, dp.timeout));
    return absl::OkStatus();
  }));
  reduction_ = SelectGradientReduction(dp.gradient_reduction, groups_[0]->backend_name(),
                                       groups_[0]->has_reduce_scatter());
  // Note [Ring shards] in step/gradient_reducer.h: the ring takes the
  // device path (emulated on gloo by an all-reduce and the shard).
  if (gradient_ring_) reduction_ = GradientReduction::kDeviceReduceScatter;
  // The enqueuing thread's groups (Notes [Shard landing] and [Resident
  // blocks on every rank]): every path has them, since resident blocks
  // are summed on the devices whatever the streamed blocks take.
  local_groups_.resize(static_cast<size_t>(local));
  cross_groups_.resize(static_cast<size_t>(local));
  weight_groups_.resize(static_cast<size_t>(local));
  MEGATRAIN_RETURN_IF_ERROR(OnEveryRank([&](int r) -> absl::Status {
    const std::string& device = dp.devices[static_cast<size_t>(r)];
    MEGATRAIN_ASSIGN_OR_RETURN(
        local_groups_[r],
        CollectiveGroup::Create(stores[static_cast<size_t>(r)], r, local, device, dp.timeout,
                                absl::StrCat("megatrain/local/", process_rank_)));
    if (dp.shard_weights && local > 1) {  // Note [Sharded weight streaming]
      MEGATRAIN_ASSIGN_OR_RETURN(
          weight_groups_[r],
          CollectiveGroup::Create(stores[static_cast<size_t>(r)], r, local, device, dp.timeout,
                                  absl::StrCat("megatrain/weights/", process_rank_)));
    }
    if (num_processes_ > 1) {
      MEGATRAIN_ASSIGN_OR_RETURN(
          cross_groups_[r],
          CollectiveGroup::Create(stores[static_cast<size_t>(r)], process_rank_, num_processes_,
                                  device, dp.timeout, absl::StrCat("megatrain/cross/", r)));
    }
    return absl::OkStatus();
  }));
  return UsePeerCopies(dp);
}

absl::Status DataParallelTrainer::UsePeerCopies(const DataParallelOptions& dp) {
  if (!dp.peer_copies || dp.devices.size() < 2) return absl::OkStatus();
  std::vector<int> indices;
  for (const std::string& device : dp.devices) {
    int index = 0;
    if (!absl::StartsWith(device, "cuda:") || !absl::SimpleAtoi(device.substr(5), &index)) {
      return absl::OkStatus();  // CPU ranks (gloo): no peer copies
    }
    indices.push_back(index);
  }
  // One exchange per group: each keeps its own order of collectives.
  absl::StatusOr<std::shared_ptr<PeerExchange>> gradients =
      PeerExchange::Create(indices, dp.timeout);
  absl::StatusOr<std::shared_ptr<PeerExchange>> weights = PeerExchange::Create(indices, dp.timeout);
  if (!gradients.ok() || !weights.ok()) {
    std::fprintf(stderr, "megatrain: peer copies off (%s); NCCL carries the collectives\n",
                 std::string((gradients.ok() ? weights : gradients).status().message()).c_str());
    return absl::OkStatus();
  }
  for (size_t r = 0; r < dp.devices.size(); ++r) {
    local_groups_[r]->UsePeerCopies(*gradients);
    if (weight_groups_[r] != nullptr) weight_groups_[r]->UsePeerCopies(*weights);
  }
  peer_copies_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DataParallelTrainer>> DataParallelTrainer::Create(
    const ModelConfig& config, const TrainerOptions& options, uint64_t seed,
    const DataParallelOptions& dp) {
  MEGATRAIN_RETURN_IF_ERROR(CheckDataParallelOptions(options, dp));
  const int local = static_cast<int>(dp.devices.size());
  // Every rank of every process (Note [Replica processes]).
  const int world = local * dp.num_processes;
  std::unique_ptr<DataParallelTrainer> t(new DataParallelTrainer());
  t->threads_ = std::make_unique<RankThreads>(local);  // Note [Rank threads]
  t->process_rank_ = dp.process_rank;
  t->num_processes_ = dp.num_processes;
  // Note [Shared host store]: the options Trainer::Create would give its
  // own store.
  HostStoreOptions store_options;
  store_options.streaming_bf16 =
      options.compute_dtype == ComputeDtype::kBf16 && options.weight_stream == WeightStream::kBf16;
  store_options.pin = absl::StartsWith(dp.devices[0], "cuda");
  // Note [Ring shards]: with the ring no gradient arena at all (the
  // embedding's reduced gradient stays in each rank's landing buffer).
  t->gradient_ring_ =
      DataParallelGradientRing(options, config, local * dp.num_processes, dp.gradient_reduction);
  store_options.gradient_ring = t->gradient_ring_;
  store_options.embedding_grad_in_host = false;
  // Note [Tier shards] in store/nvme_tier.h: each rank's moments in its files.
  store_options.moments_in_host = options.nvme_dir.empty();
  MEGATRAIN_ASSIGN_OR_RETURN(t->shared_, HostStore::Create(config, store_options));
  t->shared_->InitializeWeights(seed);
  t->shards_ = std::make_unique<GradientShards>(t->shared_.get(), local);
  t->reducers_.resize(static_cast<size_t>(local));
  t->ranks_.resize(static_cast<size_t>(local));
  MEGATRAIN_RETURN_IF_ERROR(t->JoinGroups(dp));
  // Note [Sharded optimizer] in step/gradient_reducer.h: every rank updates
  // its shard of each host block with its share of the cores; a rank
  // streams a block once every rank's update of it ran.
  const int cores = options.threads > 0
                        ? options.threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  DataParallelTrainer* self = t.get();
  auto all_updated = [self](int64_t block) {
    for (const auto& rank : self->ranks_) rank->WaitBlockUpdated(block);
  };
  // Then the trainers, rank 0 (whose auto choices the others take) first.
  for (int r = 0; r < local; ++r) {
    CollectiveReducerGroups groups;
    groups.all = t->groups_[r].get();
    groups.local = t->local_groups_[r].get();
    groups.device_reduce_scatter = t->reduction_ == GradientReduction::kDeviceReduceScatter;
    groups.cross = t->cross_groups_[r].get();
    groups.weights = t->weight_groups_[r].get();
    groups.local_rank = r;
    t->reducers_[r] = std::make_unique<CollectiveGradientReducer>(
        groups, config.vocab_size, t->shards_.get(), /*owner=*/false, dp.timeout);
    TrainerOptions rank_options = options;
    if (r > 0) ForceChoiceOf(*t->ranks_[0], &rank_options);
    rank_options.device = dp.devices[static_cast<size_t>(r)];
    rank_options.gradient_accumulation_steps = options.gradient_accumulation_steps / world;
    if (r == 0 && groups.device_reduce_scatter && rank_options.gradient_accumulation_steps > 1 &&
        rank_options.device_grad_accumulation < 0) {
      // Note [Shard-only landing] in store/host_store.h: the ranks' several
      // micro-batches summed on the device, so that each lands only its
      // shard of a block's reduced gradient, never a whole arena of its own.
      rank_options.device_grad_accumulation = 1;
    }
    rank_options.gradient_reducer = t->reducers_[r].get();
    rank_options.shared_store = t->shared_.get();
    rank_options.optimizer_shard_rank = r;
    rank_options.optimizer_shard_world = local;
    // Note [Tier shards]: the tier's files named by the global rank.
    rank_options.process_rank = dp.process_rank;
    rank_options.num_processes = dp.num_processes;
    rank_options.shared_weight_gate = all_updated;
    rank_options.threads = std::max(1, cores / local);
    MEGATRAIN_ASSIGN_OR_RETURN(t->ranks_[r], Trainer::Create(config, rank_options, seed));
  }
  // Note [Serial first use]: each rank thread's first GEMMs and attention,
  // one rank at a time, before the first step would make them all at once.
  MEGATRAIN_RETURN_IF_ERROR(t->threads_->RunOneAtATime([self, &config](int r) {
    return WarmUpFirstUse(self->ranks_[static_cast<size_t>(r)]->runtime(), config.head_dim);
  }));
  return t;
}

HostStoreBytes DataParallelTrainer::host_bytes() const {
  HostStoreBytes total = shared_->bytes();
  for (const auto& rank : ranks_) {
    const HostStoreBytes b = rank->store().bytes();
    total.master += b.master;
    total.grad += b.grad;
    total.exp_avg += b.exp_avg;
    total.exp_avg_sq += b.exp_avg_sq;
    total.streaming += b.streaming;
    total.pinned += b.pinned;
  }
  return total;
}

absl::StatusOr<StepResult> DataParallelTrainer::Step(absl::Span<const MicroBatch> micro_batches) {
  const size_t world = ranks_.size();
  const size_t all = world * static_cast<size_t>(num_processes_);
  if (micro_batches.empty() || micro_batches.size() % all != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: the number of micro-batches must be a positive multiple of train.devices=", world,
        num_processes_ > 1 ? absl::StrCat(" x WORLD_SIZE=", num_processes_) : "", ", got ",
        micro_batches.size()));
  }
  // Refused here, on every rank and process alike (each holds the global
  // batch), rather than by one rank's executor while the others wait in a
  // collective.
  const size_t seq_len = static_cast<size_t>(ranks_[0]->options().seq_len);
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    if (!PositionIdsValid(micro_batches[m], seq_len)) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: micro-batch ", m,
                       ": position_ids must be empty or one per token, each row "
                       "starting at 0 and each next id 0 or the previous plus one"));
    }
  }
  // Every process gets the job's global batch; global rank g takes the
  // g-th contiguous share (Note [Replica processes]).
  const size_t share = micro_batches.size() / (world * num_processes_);
  const size_t first = static_cast<size_t>(process_rank_) * world;
  std::vector<StepResult> results(world);
  std::vector<absl::Status> errors(world);
  const absl::Status failed = OnEveryRank([&](int r) -> absl::Status {
    absl::StatusOr<StepResult> result =
        ranks_[r]->Step(micro_batches.subspan((first + r) * share, share));
    if (!result.ok()) return errors[static_cast<size_t>(r)] = result.status();
    results[r] = *std::move(result);
    return absl::OkStatus();
  });
  if (!failed.ok()) return CauseOf(errors, failed);
  for (const StepResult& r : results) results[0].rank_stats.push_back(r.stats);
  // The NVMe tier is the host's: its bytes are every rank's (Note [Tier
  // shards] in store/nvme_tier.h).
  for (size_t r = 1; r < world; ++r) {
    results[0].stats.nvme_read_bytes += results[r].stats.nvme_read_bytes;
    results[0].stats.nvme_written_bytes += results[r].stats.nvme_written_bytes;
  }
  return results[0];
}

absl::StatusOr<double> DataParallelTrainer::Evaluate(absl::Span<const MicroBatch> micro_batches) {
  // Every rank's shard of the updates first (Note [Sharded optimizer]).
  MEGATRAIN_RETURN_IF_ERROR(WaitForOptimizer());
  return ranks_[0]->Evaluate(micro_batches);
}

absl::Status DataParallelTrainer::WaitForOptimizer() {
  return OnEveryRank([&](int r) { return ranks_[r]->WaitForOptimizer(); });
}

absl::StatusOr<bool> DataParallelTrainer::ReplicasAgree() {
  MEGATRAIN_RETURN_IF_ERROR(WaitForOptimizer());
  absl::StatusOr<int64_t> mine = ReplicaChecksum();
  // A replica that cannot be read (its NVMe tier files) still takes part
  // in the collective, as two values that cannot agree, so that the other
  // processes learn it now rather than at the collective timeout.
  const std::array<int64_t, 2> sent =
      mine.ok() ? std::array<int64_t, 2>{*mine, -*mine} : std::array<int64_t, 2>{1, 0};
  std::vector<std::array<int64_t, 2>> extremes(ranks_.size(), sent);
  MEGATRAIN_RETURN_IF_ERROR(OnEveryRank(
      [&](int r) { return groups_[r]->AllReduceMax(extremes[static_cast<size_t>(r)].data(), 2); }));
  MEGATRAIN_RETURN_IF_ERROR(mine.status());
  // max == min over every rank of every process.
  return extremes[0][0] == -extremes[0][1];
}

absl::StatusOr<int64_t> DataParallelTrainer::ReplicaChecksum() const {
  std::optional<NvmeMomentTier> tier;  // Note [Tier shards]: the moments' files
  if (ranks_[0]->nvme_moments() != nullptr) {
    MEGATRAIN_ASSIGN_OR_RETURN(tier, nvme_tier());
  }
  uint64_t hash = 1469598103934665603ull;  // FNV-1a 64
  auto add = [&hash](const float* data, int64_t numel) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(data);
    const size_t n = static_cast<size_t>(numel) * sizeof(float);
    for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  };
  std::vector<float> moment;  // one block's moment, read from the tier
  for (int64_t b = 0; b < shared_->num_blocks(); ++b) {
    const int64_t numel = shared_->block_numel(b);
    add(shared_->master(b), numel);
    if (!tier.has_value()) {
      add(shared_->exp_avg(b), numel);
      add(shared_->exp_avg_sq(b), numel);
      continue;
    }
    moment.resize(static_cast<size_t>(numel));
    for (MomentKind kind : {MomentKind::kExpAvg, MomentKind::kExpAvgSq}) {
      for (const NvmeBlockPiece& p : tier->Pieces(b)) {
        MEGATRAIN_RETURN_IF_ERROR(
            p.files->Read(kind, p.file_offset, p.count, moment.data() + p.begin));
      }
      add(moment.data(), numel);
    }
  }
  return static_cast<int64_t>(hash >> 1);  // 63 bits: negation cannot overflow
}

HostStore& DataParallelTrainer::store() {
  // Rank 0 writes its resident blocks back; every rank reloads them before
  // its next pass, since the caller may write the store.
  for (auto& rank : ranks_) rank->store();
  return *shared_;
}

absl::StatusOr<NvmeMomentTier> DataParallelTrainer::nvme_tier() const {
  std::vector<NvmeMomentTier::Shard> shards;
  for (const auto& rank : ranks_) shards.push_back(rank->nvme_shard());
  return NvmeMomentTier::Create(std::move(shards));
}

void DataParallelTrainer::set_step(int64_t step) {
  for (auto& rank : ranks_) rank->set_step(step);
}

}  // namespace megatrain::engine
