// Host store allocation, byte accounting and initialisation.
#include "engine/store/host_store.h"

#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

// Blocks start at 4 KiB boundaries in every arena (1024 fp32 elements).
constexpr int64_t kBlockAlignElements = 1024;

int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

std::vector<int64_t> BlockOffsets(const ModelLayout& layout, int64_t* total) {
  std::vector<int64_t> offsets;
  int64_t n = 0;
  for (const BlockLayout& b : layout.blocks) {
    offsets.push_back(n);
    n += AlignUp(b.numel, kBlockAlignElements);
  }
  *total = n;
  return offsets;
}

// Counter-based normal samples: element i of stream `key` depends only on
// (key, i), so initialisation is identical for any thread split.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a: a stable string hash (std::hash is implementation-defined).
uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Box-Muller on two 53-bit uniforms derived from (key, index).
float NormalSample(uint64_t key, uint64_t index) {
  const uint64_t a = SplitMix64(key ^ SplitMix64(2 * index));
  const uint64_t b = SplitMix64(key ^ SplitMix64(2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

// Runs fn(begin, end) over [0, n) on up to hardware_concurrency threads.
template <typename Fn>
void ParallelChunks(int64_t n, Fn fn) {
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), n / (1 << 20)));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> workers;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin < end) workers.emplace_back([=] { fn(begin, end); });
  }
  for (std::thread& w : workers) w.join();
}

// Elements of the gradient arena: all blocks, or with gradient_ring the
// embedding block's only (none when its gradient lives on the device).
int64_t GradArenaNumel(const ModelLayout& layout, const HostStoreOptions& options,
                       int64_t arena_numel) {
  if (!options.gradient_ring) return arena_numel;
  if (!options.embedding_grad_in_host) return 0;
  return AlignUp(layout.blocks[layout.embedding_block()].numel, kBlockAlignElements);
}

// Note [Ring shards] in step/gradient_reducer.h: a view of a store with
// the gradient ring lands every block but the embedding in its own ring,
// so only the embedding may have a landing buffer of the view's own.
absl::Status CheckRingView(const HostStore& weights, const std::vector<bool>& private_landing) {
  if (!weights.options().gradient_ring) return absl::OkStatus();
  bool ok = static_cast<int64_t>(private_landing.size()) == weights.num_blocks();
  for (size_t b = 0; ok && b < private_landing.size(); ++b) {
    ok = !private_landing[b] || static_cast<int64_t>(b) == weights.layout().embedding_block();
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "HostStore::CreateGradientView: a shared store with the gradient ring (no gradient arena) "
      "takes views that land only the embedding in a buffer of their own (every other block's "
      "reduced shard goes to the rank's ring: the device reduce-scatter)");
}

}  // namespace

HostStoreBytes HostStore::EstimateBytes(const ModelConfig& config,
                                        const HostStoreOptions& options) {
  const ModelLayout layout = ModelLayout::Create(config);
  int64_t numel = 0;
  BlockOffsets(layout, &numel);
  HostStoreBytes b;
  b.master = numel * 4;
  if (options.optimizer_state) b.grad = GradArenaNumel(layout, options, numel) * 4;
  if (options.optimizer_state && options.moments_in_host) b.exp_avg = b.exp_avg_sq = numel * 4;
  if (options.streaming_bf16) b.streaming = numel * 2;
  // Pinned: what the device reads (streaming copy or master) and the
  // gradients it writes (Note [Gradient landing] in step/grad_lander.h).
  if (options.pin) b.pinned = (options.streaming_bf16 ? b.streaming : b.master) + b.grad;
  return b;
}

// Note [Prefaulted moments]
// The AdamW moments are the only store arenas nothing writes before the
// first update: the master is initialised or loaded, and on CUDA the
// gradient arena and the streaming copy are pinned (faulted in by
// registration; on the CPU backward writes the gradient first). Left
// untouched, their pages are faulted and zeroed by the optimizer's first
// step, inside the step: on llama-8b (8 bytes per parameter of moments)
// that made the first update several times slower than the next ones and
// the step wait for it (docs/performance-history.md, "2026-11-24 (RoPE-kernels)"). Faulting
// them in at creation, on all cores, moves that cost out of training and
// makes the process's resident memory equal admission's footprint from
// the start.
absl::StatusOr<std::unique_ptr<HostStore>> HostStore::Create(const ModelConfig& config,
                                                             const HostStoreOptions& options) {
  MEGATRAIN_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<HostStore> store(new HostStore(config, ModelLayout::Create(config), options));
  store->block_offsets_ = BlockOffsets(store->layout_, &store->arena_numel_);
  const size_t fp32_bytes = static_cast<size_t>(store->arena_numel_) * 4;
  const bool pin_master = options.pin && !options.streaming_bf16;
  MEGATRAIN_ASSIGN_OR_RETURN(store->master_, HostBuffer::Allocate(fp32_bytes, pin_master));
  if (options.optimizer_state) {
    const int64_t grad_numel = GradArenaNumel(store->layout_, options, store->arena_numel_);
    MEGATRAIN_ASSIGN_OR_RETURN(
        store->grad_, HostBuffer::Allocate(static_cast<size_t>(grad_numel) * 4, options.pin));
  }
  if (options.optimizer_state && options.moments_in_host) {
    MEGATRAIN_ASSIGN_OR_RETURN(store->exp_avg_, HostBuffer::Allocate(fp32_bytes, false));
    MEGATRAIN_ASSIGN_OR_RETURN(store->exp_avg_sq_, HostBuffer::Allocate(fp32_bytes, false));
    store->exp_avg_.FaultIn();  // Note [Prefaulted moments]
    store->exp_avg_sq_.FaultIn();
  }
  if (options.streaming_bf16) {
    MEGATRAIN_ASSIGN_OR_RETURN(
        store->streaming_,
        HostBuffer::Allocate(static_cast<size_t>(store->arena_numel_) * 2, options.pin));
  }
  return store;
}

absl::StatusOr<std::unique_ptr<HostStore>> HostStore::CreateGradientView(
    const HostStore& weights, const std::vector<bool>& private_landing) {
  if (!weights.options().optimizer_state || weights.weights_ != nullptr) {
    return absl::InvalidArgumentError(
        "HostStore::CreateGradientView: the shared store needs optimizer state and must not "
        "itself be a view");
  }
  MEGATRAIN_RETURN_IF_ERROR(CheckRingView(weights, private_landing));
  HostStoreOptions view_options = weights.options_;
  if (weights.options_.gradient_ring) {  // Note [Ring shards]: the embedding's own, or none
    view_options.embedding_grad_in_host =
        private_landing[static_cast<size_t>(weights.layout_.embedding_block())];
  }
  std::unique_ptr<HostStore> view(new HostStore(weights.config_, weights.layout_, view_options));
  view->block_offsets_ = weights.block_offsets_;
  view->arena_numel_ = weights.arena_numel_;
  view->weights_ = &weights;
  int64_t landing_numel = view->arena_numel_;
  if (!private_landing.empty()) {  // Note [Shard-only landing]
    if (static_cast<int64_t>(private_landing.size()) != weights.num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("HostStore::CreateGradientView: ", private_landing.size(),
                       " landing flags for ", weights.num_blocks(), " blocks"));
    }
    landing_numel = 0;
    view->private_offsets_.assign(private_landing.size(), -1);
    for (size_t b = 0; b < private_landing.size(); ++b) {
      if (!private_landing[b]) continue;
      view->private_offsets_[b] = landing_numel;
      // 1024-element alignment, as the arena's blocks.
      landing_numel += (weights.block_numel(static_cast<int64_t>(b)) + 1023) / 1024 * 1024;
    }
  }
  MEGATRAIN_ASSIGN_OR_RETURN(
      view->grad_,
      HostBuffer::Allocate(static_cast<size_t>(landing_numel) * 4, weights.options_.pin));
  return view;
}

HostStoreBytes HostStore::bytes() const {
  HostStoreBytes b;
  b.master = static_cast<int64_t>(master_.bytes());
  b.grad = static_cast<int64_t>(grad_.bytes());
  b.exp_avg = static_cast<int64_t>(exp_avg_.bytes());
  b.exp_avg_sq = static_cast<int64_t>(exp_avg_sq_.bytes());
  b.streaming = static_cast<int64_t>(streaming_.bytes());
  for (const HostBuffer* buf : {&master_, &grad_, &exp_avg_, &exp_avg_sq_, &streaming_}) {
    if (buf->pinned()) b.pinned += static_cast<int64_t>(buf->bytes());
  }
  return b;
}

void HostStore::InitializeWeights(uint64_t seed, double initializer_range) {
  for (int64_t block = 0; block < num_blocks(); ++block) {
    float* w = master(block);
    std::fill(w, w + block_numel(block), 0.0f);
    for (const ParamSpec& p : layout_.blocks[block].params) {
      float* dst = w + p.offset;
      if (p.is_norm) {
        std::fill(dst, dst + p.numel, 1.0f);
      } else if (!p.is_bias) {
        // One stream per tensor, keyed by seed and HF name.
        const uint64_t key = SplitMix64(seed ^ Fnv1a64(p.hf_name));
        const float scale = static_cast<float>(initializer_range);
        ParallelChunks(p.numel, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) dst[i] = scale * NormalSample(key, i);
        });
      }
    }
  }
  RefreshAllStreamingCopies();
}

void HostStore::RefreshStreamingCopy(int64_t block) {
  bf16_bits* dst = streaming_bf16(block);
  if (dst == nullptr) return;
  const float* src = master(block);
  ParallelChunks(block_numel(block), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = FloatToBf16(src[i]);
  });
}

void HostStore::RefreshAllStreamingCopies() {
  for (int64_t block = 0; block < num_blocks(); ++block) RefreshStreamingCopy(block);
}

void HostStore::ZeroGrads() {
  if (grad_.data() == nullptr) return;
  // The arena (with gradient_ring the embedding's only; ring buffers are
  // overwritten by each landing).
  ParallelChunks(static_cast<int64_t>(grad_.bytes() / 4), [&](int64_t begin, int64_t end) {
    std::fill(static_cast<float*>(grad_.data()) + begin, static_cast<float*>(grad_.data()) + end,
              0.0f);
  });
}

}  // namespace megatrain::engine
