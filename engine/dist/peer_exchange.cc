// Collectives by peer copies (peer_exchange.h, Note [Peer copies]).
#include "engine/dist/peer_exchange.h"

#include <algorithm>
#include <array>
#include <exception>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/dist/gradient_shard.h"
#include "engine/runtime/status_macros.h"

#ifdef MEGATRAIN_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace megatrain::engine {

#ifdef MEGATRAIN_WITH_CUDA

namespace {

constexpr int kSlots = 8;

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("peer copies: ", what, ": ", cudaGetErrorString(err)));
}

// One rank's publication at a meeting.
// `what` and `count` name the collective, so that ranks that call them in
// different orders fail with an error rather than exchange wrong data.
struct Post {
  int64_t seq = -1;
  void* ptr = nullptr;
  cudaEvent_t event = nullptr;
  const char* what = "";
  int64_t count = 0;
};

// INTERNAL when the ranks' publications of one meeting name different
// collectives (a bug in the caller's ordering, never a user's mistake).
absl::Status SameCollective(const std::vector<Post>& posts, int rank, int64_t seq) {
  for (size_t q = 0; q < posts.size(); ++q) {
    const Post& mine = posts[static_cast<size_t>(rank)];
    if (absl::string_view(posts[q].what) != mine.what || posts[q].count != mine.count) {
      return absl::InternalError(absl::StrCat(
          "peer copies: at collective ", seq, " rank ", rank, " called ", mine.what, " of ",
          mine.count, " elements and rank ", q, " ", posts[q].what, " of ", posts[q].count));
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct PeerExchange::Impl {
  std::vector<int> devices;
  absl::Duration timeout;
  absl::Mutex mu;
  std::vector<std::array<Post, kSlots>> posts ABSL_GUARDED_BY(mu);
  // Each touched only by its rank's enqueuing thread.
  std::vector<int64_t> next_seq;
  std::vector<std::array<cudaEvent_t, kSlots>> events;
  std::vector<at::Tensor> receive;

  int world() const { return static_cast<int>(devices.size()); }
  cudaStream_t Stream(int rank) const {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(devices[rank])).stream();
  }

  // Records this rank's event, publishes it with `ptr`, waits for every
  // rank's publication of the same meeting and makes this rank's stream
  // wait for the others' events. Returns every rank's publication.
  absl::StatusOr<std::vector<Post>> Meet(int rank, void* ptr, const char* what, int64_t count) {
    const int64_t seq = next_seq[rank]++;
    const int slot = static_cast<int>(seq % kSlots);
    cudaEvent_t event = events[rank][slot];
    MEGATRAIN_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(event, Stream(rank)), "cudaEventRecord"));
    std::vector<Post> out;
    {
      absl::MutexLock lock(&mu);
      posts[rank][slot] = Post{seq, ptr, event, what, count};
      auto all = [this, slot, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        for (const auto& p : posts) {
          if (p[slot].seq != seq) return false;
        }
        return true;
      };
      if (!mu.AwaitWithTimeout(absl::Condition(&all), timeout)) {
        return absl::UnavailableError(absl::StrCat(
            "peer copies: rank ", rank, " waited ", absl::FormatDuration(timeout),
            " for the other ranks at collective ", seq, " (a peer failed or stopped)"));
      }
      for (const auto& p : posts) out.push_back(p[slot]);
    }
    MEGATRAIN_RETURN_IF_ERROR(SameCollective(out, rank, seq));
    for (int q = 0; q < world(); ++q) {
      if (q == rank) continue;
      MEGATRAIN_RETURN_IF_ERROR(
          CudaStatus(cudaStreamWaitEvent(Stream(rank), out[q].event, 0), "cudaStreamWaitEvent"));
    }
    return out;
  }

  absl::Status Pull(int rank, void* dst, int q, const void* src, int64_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemcpyPeerAsync(dst, devices[rank], src, devices[q],
                                          static_cast<size_t>(bytes), Stream(rank)),
                      "cudaMemcpyPeerAsync");
  }

  // data[shard] += every peer's data[shard], chunk by chunk through the
  // receive buffer (on the rank's current stream: each chunk's copy
  // follows the previous chunk's add).
  absl::Status AddPeers(int rank, const std::vector<Post>& posts_now, float* data,
                        ShardRange shard) {
    if (shard.size() == 0) return absl::OkStatus();
    const auto fp32 =
        at::TensorOptions()
            .dtype(at::kFloat)
            .device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(devices[rank])));
    if (!receive[rank].defined()) receive[rank] = at::empty({kChunkElements}, fp32);
    for (int64_t first = shard.begin; first < shard.end; first += kChunkElements) {
      const int64_t count = std::min(kChunkElements, shard.end - first);
      at::Tensor mine = at::from_blob(data + first, {count}, fp32);
      for (int q = 0; q < world(); ++q) {
        if (q == rank) continue;
        MEGATRAIN_RETURN_IF_ERROR(Pull(rank, receive[rank].data_ptr(), q,
                                       static_cast<const float*>(posts_now[q].ptr) + first,
                                       count * 4));
        mine.add_(receive[rank].narrow(0, 0, count));
      }
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::shared_ptr<PeerExchange>> PeerExchange::Create(
    const std::vector<int>& devices, std::chrono::milliseconds timeout) {
  if (devices.size() < 2 ||
      std::set<int>(devices.begin(), devices.end()).size() != devices.size()) {
    return absl::InvalidArgumentError("peer copies: needs 2 or more distinct devices");
  }
  for (const int a : devices) {
    for (const int b : devices) {
      if (a == b) continue;
      int can = 0;
      MEGATRAIN_RETURN_IF_ERROR(
          CudaStatus(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer"));
      if (can == 0) {
        return absl::UnavailableError(
            absl::StrCat("peer copies: cuda:", a, " cannot access cuda:", b, "'s memory"));
      }
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(a));
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // NCCL enabled it already
      } else {
        MEGATRAIN_RETURN_IF_ERROR(CudaStatus(err, "cudaDeviceEnablePeerAccess"));
      }
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->devices = devices;
  impl->timeout = absl::FromChrono(timeout);
  impl->posts.resize(devices.size());
  impl->next_seq.assign(devices.size(), 0);
  impl->events.resize(devices.size());
  impl->receive.resize(devices.size());
  for (size_t r = 0; r < devices.size(); ++r) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(devices[r]));
    for (cudaEvent_t& e : impl->events[r]) {
      MEGATRAIN_RETURN_IF_ERROR(
          CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
    }
  }
  return std::shared_ptr<PeerExchange>(new PeerExchange(std::move(impl)));
}

PeerExchange::~PeerExchange() {
  if (impl_ == nullptr) return;
  for (size_t r = 0; r < impl_->devices.size(); ++r) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(impl_->devices[r]));
    for (cudaEvent_t e : impl_->events[r]) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
  }
}

int PeerExchange::world_size() const { return impl_->world(); }

namespace {

// LibTorch's exceptions (the adds) as UNAVAILABLE naming the collective.
template <typename F>
absl::Status Guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("peer copies: ", what, ": ", e.what()));
  }
}

}  // namespace

absl::Status PeerExchange::ReduceScatterSum(int rank, float* data, int64_t numel) {
  if (numel == 0) return absl::OkStatus();
  static constexpr char kWhat[] = "reduce-scatter";
  return Guarded(kWhat, [&]() -> absl::Status {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(impl_->devices[rank]));
    MEGATRAIN_ASSIGN_OR_RETURN(std::vector<Post> posts, impl_->Meet(rank, data, kWhat, numel));
    MEGATRAIN_RETURN_IF_ERROR(
        impl_->AddPeers(rank, posts, data, ShardOf(numel, rank, impl_->world())));
    // Every peer has read from `data` before this rank's stream goes on.
    return impl_->Meet(rank, data, kWhat, numel).status();
  });
}

absl::Status PeerExchange::AllReduceSum(int rank, float* data, int64_t numel) {
  if (numel == 0) return absl::OkStatus();
  static constexpr char kWhat[] = "all-reduce";
  return Guarded(kWhat, [&]() -> absl::Status {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(impl_->devices[rank]));
    const int world = impl_->world();
    MEGATRAIN_ASSIGN_OR_RETURN(std::vector<Post> posts, impl_->Meet(rank, data, kWhat, numel));
    MEGATRAIN_RETURN_IF_ERROR(impl_->AddPeers(rank, posts, data, ShardOf(numel, rank, world)));
    // Every shard summed by its owner, and every read of the unsummed
    // values done: gather the sums.
    MEGATRAIN_ASSIGN_OR_RETURN(posts, impl_->Meet(rank, data, kWhat, numel));
    for (int q = 0; q < world; ++q) {
      if (q == rank) continue;
      const ShardRange s = ShardOf(numel, q, world);
      MEGATRAIN_RETURN_IF_ERROR(impl_->Pull(rank, data + s.begin, q,
                                            static_cast<const float*>(posts[q].ptr) + s.begin,
                                            s.size() * 4));
    }
    return impl_->Meet(rank, data, kWhat, numel).status();
  });
}

absl::Status PeerExchange::AllGather(int rank, void* data, int64_t shard_numel, int element_bytes) {
  if (shard_numel == 0) return absl::OkStatus();
  static constexpr char kWhat[] = "all-gather";
  return Guarded(kWhat, [&]() -> absl::Status {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(impl_->devices[rank]));
    MEGATRAIN_ASSIGN_OR_RETURN(std::vector<Post> posts,
                               impl_->Meet(rank, data, kWhat, shard_numel));
    const int64_t bytes = shard_numel * element_bytes;
    for (int q = 0; q < impl_->world(); ++q) {
      if (q == rank) continue;
      MEGATRAIN_RETURN_IF_ERROR(impl_->Pull(rank, static_cast<char*>(data) + q * bytes, q,
                                            static_cast<const char*>(posts[q].ptr) + q * bytes,
                                            bytes));
    }
    return impl_->Meet(rank, data, kWhat, shard_numel).status();
  });
}

#else  // no CUDA: never created

struct PeerExchange::Impl {};

absl::StatusOr<std::shared_ptr<PeerExchange>> PeerExchange::Create(
    const std::vector<int>& devices, std::chrono::milliseconds timeout) {
  return absl::UnavailableError("peer copies: this build has no CUDA");
}
PeerExchange::~PeerExchange() = default;
int PeerExchange::world_size() const { return 0; }
absl::Status PeerExchange::ReduceScatterSum(int, float*, int64_t) {
  return absl::UnimplementedError("peer copies: this build has no CUDA");
}
absl::Status PeerExchange::AllReduceSum(int, float*, int64_t) {
  return absl::UnimplementedError("peer copies: this build has no CUDA");
}
absl::Status PeerExchange::AllGather(int, void*, int64_t, int) {
  return absl::UnimplementedError("peer copies: this build has no CUDA");
}

#endif

PeerExchange::PeerExchange(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

}  // namespace megatrain::engine
