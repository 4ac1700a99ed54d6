// c10d rendezvous and process groups (process_group.h).
#include "engine/dist/process_group.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef MEGATRAIN_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef MEGATRAIN_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/dist/gradient_shard.h"
#include "engine/dist/peer_exchange.h"
#include "engine/runtime/status_macros.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {

struct RendezvousStore::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  int port = 0;
  bool loopback = true;  // every rank on this host: gloo over 127.0.0.1
  // A TCP store's server as a client reaches it (Note [One client per
  // rank]): set by CreateTcp, unset for an in-process store.
  std::optional<TorchrunEnv> tcp;
  std::chrono::milliseconds timeout{0};
};

struct CollectiveGroup::Impl {
  c10::intrusive_ptr<compat::DistBackend> backend;
  at::Device device = at::kCPU;
  std::shared_ptr<PeerExchange> peers;  // Note [Peer copies]
};

namespace {

// INVALID_ARGUMENT unless `name` holds an integer in [lo, hi].
absl::StatusOr<int> IntFromEnv(const char* name, int lo, int hi) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not set (torchrun sets it)"));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < lo || parsed > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be an integer in [", lo, ", ", hi, "], got '", value, "'"));
  }
  return parsed;
}

// Runs a c10d call; its exceptions (gloo's IoException on a timeout or a
// closed peer, c10::Error) become UNAVAILABLE naming `what`.
template <typename F>
absl::Status Collective(const char* what, F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("c10d ", what, ": ", e.what()));
  }
}

absl::Status AllReduce(CollectiveGroup::Impl& impl, void* data, int64_t numel, at::ScalarType dtype,
                       c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  if (numel == 0) return absl::OkStatus();
  return Collective("allreduce", [&] {
    at::Tensor host = at::from_blob(data, {numel}, at::TensorOptions().dtype(dtype));
    // NCCL reduces device memory: stage there (the copy back waits for the
    // collective, which ProcessGroupNCCL orders before the current stream).
    std::vector<at::Tensor> tensors{impl.device.is_cpu() ? host : host.to(impl.device)};
    c10d::AllreduceOptions options;
    options.reduceOp = op;
    impl.backend->allreduce(tensors, options)->wait();
    if (!impl.device.is_cpu()) host.copy_(tensors[0]);
  });
}

// [numel] fp32 at `data` in `impl`'s device memory (no copy).
at::Tensor DeviceTensor(CollectiveGroup::Impl& impl, float* data, int64_t numel) {
  return at::from_blob(data, {numel}, at::TensorOptions().dtype(at::kFloat).device(impl.device));
}

absl::Status AllReduceInPlace(CollectiveGroup::Impl& impl, float* data, int64_t numel) {
  if (numel == 0) return absl::OkStatus();
  return Collective("allreduce", [&] {
    std::vector<at::Tensor> tensors{DeviceTensor(impl, data, numel)};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    // wait(): on CUDA the current stream waits for the NCCL stream.
    impl.backend->allreduce(tensors, options)->wait();
  });
}

}  // namespace

absl::StatusOr<TorchrunEnv> ReadTorchrunEnv() {
  if (std::getenv("WORLD_SIZE") == nullptr) {
    return absl::NotFoundError("WORLD_SIZE: not set (not launched by torchrun)");
  }
  TorchrunEnv env;
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    return absl::InvalidArgumentError("MASTER_ADDR: not set (torchrun sets it)");
  }
  env.master_addr = addr;
  MEGATRAIN_ASSIGN_OR_RETURN(env.master_port, IntFromEnv("MASTER_PORT", 1, 65535));
  MEGATRAIN_ASSIGN_OR_RETURN(env.world_size, IntFromEnv("WORLD_SIZE", 1, 1 << 16));
  MEGATRAIN_ASSIGN_OR_RETURN(env.rank, IntFromEnv("RANK", 0, env.world_size - 1));
  MEGATRAIN_ASSIGN_OR_RETURN(env.local_rank, IntFromEnv("LOCAL_RANK", 0, 1 << 10));
  // Note [torchrun's agent store].
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  env.agent_store = agent != nullptr && std::string(agent) == "True";
  if (std::getenv("TORCHELASTIC_RESTART_COUNT") != nullptr) {
    MEGATRAIN_ASSIGN_OR_RETURN(env.restart_count,
                               IntFromEnv("TORCHELASTIC_RESTART_COUNT", 0, 1 << 20));
  }
  return env;
}

RendezvousStore::RendezvousStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RendezvousStore::~RendezvousStore() = default;
int RendezvousStore::port() const { return impl_->port; }

std::shared_ptr<RendezvousStore> RendezvousStore::CreateInProcess() {
  auto impl = std::make_unique<Impl>();
  impl->store = c10::make_intrusive<c10d::HashStore>();
  return std::shared_ptr<RendezvousStore>(new RendezvousStore(std::move(impl)));
}

absl::StatusOr<std::shared_ptr<RendezvousStore>> RendezvousStore::CreateTcp(
    const TorchrunEnv& env, std::chrono::milliseconds timeout) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK: must be in [0, WORLD_SIZE=", env.world_size, "), got ", env.rank));
  }
  if (env.master_port < 0 || env.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT: must be in [0, 65535], got ", env.master_port));
  }
  auto impl = std::make_unique<Impl>();
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;  // Note [torchrun's agent store]
  options.numWorkers = static_cast<size_t>(env.world_size);
  // Rank 0 returns at once; the group's first collective is the barrier.
  options.waitWorkers = false;
  options.timeout = timeout;
  impl->loopback = env.master_addr == "127.0.0.1" || env.master_addr == "localhost";
  absl::Status status = Collective("TCPStore", [&] {
    auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    impl->port = store->getPort();
    impl->store = store;
    if (env.agent_store) {
      impl->store = c10::make_intrusive<c10d::PrefixStore>(
          absl::StrCat("/worker/attempt_", env.restart_count), store);
    }
  });
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("MASTER_ADDR:MASTER_PORT (", env.master_addr, ":", env.master_port, "): ",
                     options.isServer ? "rank 0 could not serve the rendezvous store"
                                      : "the rendezvous store was not reachable",
                     " within ", timeout.count(), " ms: ", status.message()));
  }
  impl->tcp = env;
  impl->tcp->master_port = impl->port;  // the port served (an ephemeral one resolved)
  impl->timeout = timeout;
  return std::shared_ptr<RendezvousStore>(new RendezvousStore(std::move(impl)));
}

absl::StatusOr<std::shared_ptr<RendezvousStore>> RendezvousStore::Connect(
    const std::shared_ptr<RendezvousStore>& store) {
  if (!store->impl_->tcp.has_value()) return store;  // a HashStore serves every thread
  // A client connection (rank != 0: never a second server on the port),
  // under the agent's key prefix when torchrun's agent serves the store.
  TorchrunEnv client = *store->impl_->tcp;
  client.world_size = std::max(client.world_size, 2);
  client.rank = 1;
  return CreateTcp(client, store->impl_->timeout);
}

bool HasCollectiveBackend(const std::string& device) {
  if (absl::StartsWith(device, "cuda")) {
#ifdef MEGATRAIN_C10D_NCCL
    return true;
#else
    return false;
#endif
  }
#ifdef MEGATRAIN_C10D_GLOO
  return device == "cpu";
#else
  return false;
#endif
}

CollectiveGroup::~CollectiveGroup() = default;

absl::StatusOr<std::unique_ptr<CollectiveGroup>> CollectiveGroup::Create(
    std::shared_ptr<RendezvousStore> store, int rank, int world_size, const std::string& device,
    std::chrono::milliseconds timeout, const std::string& prefix) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [0, world_size=", world_size, "), got ", rank));
  }
  if (!HasCollectiveBackend(device)) {
    return absl::UnimplementedError(
        absl::StrCat("train.devices: this build has no c10d backend for device '", device,
                     "' (gloo for cpu, NCCL for cuda: built with LibTorch's distributed headers)"));
  }
  std::unique_ptr<CollectiveGroup> group(new CollectiveGroup());
  group->rank_ = rank;
  group->world_size_ = world_size;
  group->store_ = std::move(store);
  group->impl_ = std::make_unique<Impl>();
  Impl& impl = *group->impl_;
  // Keys of this group under their own prefix, so that a second group in
  // the same store (the next job) never reads stale ones.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, group->store_->impl()->store);
  absl::Status status = Collective("process group", [&] {
    impl.device = at::Device(device);
#ifdef MEGATRAIN_C10D_NCCL
    if (impl.device.is_cuda()) {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      // The collectives overlap the backward's kernels: a high-priority
      // stream lets their blocks take SMs as the GEMMs' blocks retire,
      // rather than after the compute stream's queue.
      options->is_high_priority_stream = true;
      impl.backend =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, world_size, options);
      group->backend_name_ = "nccl";
      return;
    }
#endif
#ifdef MEGATRAIN_C10D_GLOO
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    // Across hosts: the interface GLOO_SOCKET_IFNAME names, else the one
    // this host's name resolves to (as torch.distributed does).
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (group->store_->impl()->loopback) {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else if (ifname != nullptr && *ifname != '\0') {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else {
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    impl.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world_size, options);
    group->backend_name_ = "gloo";
#endif
  });
  MEGATRAIN_RETURN_IF_ERROR(status);
  return group;
}

absl::Status CollectiveGroup::AllReduceSum(float* data, int64_t numel) {
  return AllReduce(*impl_, data, numel, at::kFloat);
}
absl::Status CollectiveGroup::AllReduceSum(double* data, int64_t numel) {
  return AllReduce(*impl_, data, numel, at::kDouble);
}
absl::Status CollectiveGroup::AllReduceSum(int64_t* data, int64_t numel) {
  return AllReduce(*impl_, data, numel, at::kLong);
}
absl::Status CollectiveGroup::AllReduceMax(int64_t* data, int64_t numel) {
  return AllReduce(*impl_, data, numel, at::kLong, c10d::ReduceOp::MAX);
}

bool CollectiveGroup::has_reduce_scatter() const {
  return backend_name_ == "nccl" || compat::kGlooHasReduceScatterBase;
}

absl::Status CollectiveGroup::AllReduceSumOnDevice(float* data, int64_t numel, float scale) {
  if (numel == 0) return absl::OkStatus();
  if (scale != 1.0f) {
    MEGATRAIN_RETURN_IF_ERROR(
        Collective("scale", [&] { DeviceTensor(*impl_, data, numel).mul_(scale); }));
  }
  if (impl_->peers != nullptr) return impl_->peers->AllReduceSum(rank_, data, numel);
  return AllReduceInPlace(*impl_, data, numel);
}

void CollectiveGroup::UsePeerCopies(std::shared_ptr<PeerExchange> exchange) {
  impl_->peers = std::move(exchange);
}
bool CollectiveGroup::uses_peer_copies() const { return impl_->peers != nullptr; }

absl::Status CollectiveGroup::AllGatherInPlace(void* data, int64_t shard_numel, int element_bytes) {
  if (shard_numel == 0 || world_size_ == 1) return absl::OkStatus();
  if (impl_->peers != nullptr) {
    return impl_->peers->AllGather(rank_, data, shard_numel, element_bytes);
  }
  return Collective("allgather", [&] {
    const auto options = at::TensorOptions()
                             .dtype(element_bytes == 2 ? at::kBFloat16 : at::kFloat)
                             .device(impl_->device);
    at::Tensor all = at::from_blob(data, {world_size_ * shard_numel}, options);
    // A copy of this rank's shard: the collective's input never aliases
    // its output.
    at::Tensor mine = all.narrow(0, rank_ * shard_numel, shard_numel).clone();
    if (backend_name_ == "nccl") {
      impl_->backend->_allgather_base(all, mine)->wait();
      return;
    }
    // gloo (1.13 has no flat all-gather): one output view per rank.
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) {
      outputs[0].push_back(all.narrow(0, r * shard_numel, shard_numel));
    }
    std::vector<at::Tensor> inputs{mine};
    impl_->backend->allgather(outputs, inputs)->wait();
  });
}

absl::Status CollectiveGroup::ReduceScatterSum(float* data, int64_t numel, float scale) {
  if (numel == 0) return absl::OkStatus();
  if (scale != 1.0f) {
    MEGATRAIN_RETURN_IF_ERROR(
        Collective("scale", [&] { DeviceTensor(*impl_, data, numel).mul_(scale); }));
  }
  if (impl_->peers != nullptr) return impl_->peers->ReduceScatterSum(rank_, data, numel);
  if (!has_reduce_scatter()) return AllReduceInPlace(*impl_, data, numel);
  return Collective("reduce_scatter", [&] {
    const int64_t s = PaddedShardNumel(numel, world_size_);
    const ShardRange mine = ShardOf(numel, rank_, world_size_);
    at::Tensor flat = DeviceTensor(*impl_, data, numel);
    at::Tensor input = flat;
    if (s * world_size_ != numel) {  // Note [Shard layout]: zero padding
      input = at::zeros({s * world_size_}, flat.options());
      input.narrow(0, 0, numel).copy_(flat);
    }
    at::Tensor output = at::empty({s}, flat.options());
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    compat::ReduceScatterBase(*impl_->backend, output, input, options)->wait();
    if (mine.size() > 0) {
      flat.narrow(0, mine.begin, mine.size()).copy_(output.narrow(0, 0, mine.size()));
    }
  });
}

}  // namespace megatrain::engine
