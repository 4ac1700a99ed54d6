// Collectives by peer copies (Note [Peer copies] in
// engine/dist/peer_exchange.h) on the GPUs of one host, one thread per
// rank as DataParallelTrainer drives them; skipped with fewer than 2 CUDA
// devices. Run: build-gpu/tests/peer_exchange_test
#include "engine/dist/peer_exchange.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "engine/dist/data_parallel.h"
#include "engine/dist/gradient_shard.h"
#include "tests/testing/parity.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/trainer_state.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::AllState;
using ::megatrain::testing::IsOk;
using ::megatrain::testing::MakeBatches;
using ::megatrain::testing::SmallLlama;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

int World() { return std::min<int>(4, static_cast<int>(torch::cuda::device_count())); }

#define MEGATRAIN_SKIP_WITHOUT_TWO_GPUS() \
  if (World() < 2) GTEST_SKIP() << "needs 2 CUDA devices (" << World() << ")"

std::shared_ptr<PeerExchange> MakeExchange(int world, std::chrono::milliseconds timeout) {
  std::vector<int> devices(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) devices[static_cast<size_t>(r)] = r;
  auto exchange = PeerExchange::Create(devices, timeout);
  EXPECT_THAT(exchange, IsOk());
  return exchange.ok() ? *exchange : nullptr;
}

// Runs `body(rank)` on one thread per rank (the exchange makes the
// rank's device current) and waits for every rank's work on its GPU.
std::vector<absl::Status> OnEveryRank(int world, const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> status(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      status[static_cast<size_t>(r)] = body(r);
      torch::cuda::synchronize(r);
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

// Rank r's addend: small integers, so that every order of summation gives
// the same fp32 sum and the expected values are exact.
at::Tensor Addend(int64_t numel, int rank) {
  return (at::arange(numel, at::kLong).remainder(97) + 1000 * rank)
      .to(at::kFloat)
      .to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank)));
}

at::Tensor ExpectedSum(int64_t numel, int world) {
  at::Tensor sum = at::zeros({numel}, at::kFloat);
  for (int r = 0; r < world; ++r) sum += Addend(numel, r).cpu();
  return sum;
}

// Past one receive chunk and not divisible by the world: the chunk loop
// and the shard boundaries both exercised.
TEST(PeerExchangeTest, AllReduceSumGivesEveryGpuTheSum) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  const int world = World();
  const int64_t numel = PeerExchange::kChunkElements * world + 7;
  auto exchange = MakeExchange(world, std::chrono::seconds(60));
  ASSERT_NE(exchange, nullptr);
  std::vector<at::Tensor> data;
  for (int r = 0; r < world; ++r) data.push_back(Addend(numel, r));
  for (const absl::Status& s : OnEveryRank(world, [&](int r) {
         return exchange->AllReduceSum(r, data[static_cast<size_t>(r)].data_ptr<float>(), numel);
       })) {
    ASSERT_THAT(s, IsOk());
  }
  const at::Tensor expected = ExpectedSum(numel, world);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(at::equal(data[static_cast<size_t>(r)].cpu(), expected)) << "rank " << r;
  }
}

TEST(PeerExchangeTest, ReduceScatterSumWritesOnlyEachRanksShard) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  const int world = World();
  constexpr int64_t kNumel = 1001;
  auto exchange = MakeExchange(world, std::chrono::seconds(60));
  ASSERT_NE(exchange, nullptr);
  std::vector<at::Tensor> data;
  for (int r = 0; r < world; ++r) data.push_back(Addend(kNumel, r));
  for (const absl::Status& s : OnEveryRank(world, [&](int r) {
         return exchange->ReduceScatterSum(r, data[static_cast<size_t>(r)].data_ptr<float>(),
                                           kNumel);
       })) {
    ASSERT_THAT(s, IsOk());
  }
  const at::Tensor expected = ExpectedSum(kNumel, world);
  for (int r = 0; r < world; ++r) {
    const at::Tensor got = data[static_cast<size_t>(r)].cpu();
    const at::Tensor own = Addend(kNumel, r).cpu();
    const ShardRange shard = ShardOf(kNumel, r, world);
    for (int64_t i = 0; i < kNumel; ++i) {
      const bool in_shard = i >= shard.begin && i < shard.end;
      ASSERT_EQ(got[i].item<float>(), (in_shard ? expected : own)[i].item<float>())
          << "rank " << r << " element " << i;
    }
  }
}

// bf16 elements (2 bytes), as the sharded weight loads gather them.
TEST(PeerExchangeTest, AllGatherGivesEveryGpuEveryShard) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  const int world = World();
  constexpr int64_t kShard = 333;
  auto exchange = MakeExchange(world, std::chrono::seconds(60));
  ASSERT_NE(exchange, nullptr);
  const at::Tensor full = at::arange(world * kShard, at::kFloat).to(at::kBFloat16);
  std::vector<at::Tensor> data;
  for (int r = 0; r < world; ++r) {
    at::Tensor mine = at::zeros({world * kShard}, at::kBFloat16);
    mine.narrow(0, r * kShard, kShard).copy_(full.narrow(0, r * kShard, kShard));
    data.push_back(mine.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(r))));
  }
  for (const absl::Status& s : OnEveryRank(world, [&](int r) {
         return exchange->AllGather(r, data[static_cast<size_t>(r)].data_ptr(), kShard, 2);
       })) {
    ASSERT_THAT(s, IsOk());
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(at::equal(data[static_cast<size_t>(r)].cpu(), full)) << "rank " << r;
  }
}

// More collectives than the event ring has slots, each reading the
// previous one's result: the ring's reuse keeps every meeting ordered.
TEST(PeerExchangeTest, ManyCollectivesInARowStayOrdered) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  const int world = World();
  constexpr int64_t kNumel = 4099;
  constexpr int kRounds = 21;
  auto exchange = MakeExchange(world, std::chrono::seconds(60));
  ASSERT_NE(exchange, nullptr);
  std::vector<at::Tensor> data;
  for (int r = 0; r < world; ++r) {
    data.push_back(at::ones(
        {kNumel}, at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(r))));
  }
  for (const absl::Status& s : OnEveryRank(world, [&](int r) -> absl::Status {
         for (int i = 0; i < kRounds; ++i) {
           // Sums of ones, divided back: every round must see the last.
           absl::Status st =
               exchange->AllReduceSum(r, data[static_cast<size_t>(r)].data_ptr<float>(), kNumel);
           if (!st.ok()) return st;
           data[static_cast<size_t>(r)].div_(world).add_(1);
         }
         return absl::OkStatus();
       })) {
    ASSERT_THAT(s, IsOk());
  }
  for (int r = 0; r < world; ++r) {
    // x -> (world * x) / world + 1: after kRounds rounds, 1 + kRounds.
    EXPECT_TRUE(at::equal(data[static_cast<size_t>(r)].cpu(),
                          at::full({kNumel}, 1.0f + kRounds, at::kFloat)))
        << "rank " << r;
  }
}

TEST(PeerExchangeTest, RanksCallingDifferentCollectivesFailWithInternal) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  constexpr int kWorld = 2;
  auto exchange = MakeExchange(kWorld, std::chrono::seconds(60));
  ASSERT_NE(exchange, nullptr);
  std::vector<at::Tensor> data{Addend(64, 0), Addend(64, 1)};
  const std::vector<absl::Status> status = OnEveryRank(kWorld, [&](int r) {
    float* p = data[static_cast<size_t>(r)].data_ptr<float>();
    return r == 0 ? exchange->AllReduceSum(r, p, 64) : exchange->ReduceScatterSum(r, p, 60);
  });
  for (const absl::Status& s : status) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal, HasSubstr("rank 1")));
  }
}

TEST(PeerExchangeTest, ARankThatNeverComesFailsTheOthersWithUnavailable) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  constexpr int kWorld = 2;
  auto exchange = MakeExchange(kWorld, std::chrono::milliseconds(300));
  ASSERT_NE(exchange, nullptr);
  at::Tensor data = Addend(64, 0);
  EXPECT_THAT(exchange->AllReduceSum(0, data.data_ptr<float>(), 64),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("waited")));
}

// The trainer with peer copies against NCCL's collectives, every block
// streamed (reduce-scatter, sharded weight loads) and, second, every block
// resident (all-reduce): fp32 weights and moments bit for bit on 2 GPUs
// (two addends: the same fp32 sum in either order).
TEST(PeerExchangeTest, TrainerWithPeerCopiesMatchesNcclBitForBit) {
  MEGATRAIN_SKIP_WITHOUT_TWO_GPUS();
  const ModelConfig config = SmallLlama();
  for (const int resident : {0, -1}) {
    TrainerOptions o;
    o.micro_batch = 2;
    o.seq_len = 8;
    o.adamw.lr = 1e-3;
    o.max_grad_norm = 1.0;
    o.gradient_accumulation_steps = 2;
    o.resident_layers = resident;
    o.resident_embedding = resident;
    std::vector<std::vector<MicroBatch>> steps;
    for (int s = 0; s < 3; ++s) steps.push_back(MakeBatches(2, 2, 8, config.vocab_size, 40 + s));
    std::vector<std::vector<float>> state(2);
    for (int peer = 0; peer < 2; ++peer) {
      DataParallelOptions dp;
      dp.devices = DataParallelDevices("cuda", 2);
      dp.timeout = std::chrono::seconds(120);
      dp.peer_copies = peer == 1;
      auto t = DataParallelTrainer::Create(config, o, /*seed=*/5, dp);
      ASSERT_THAT(t, IsOk());
      EXPECT_EQ((*t)->peer_copies(), peer == 1);
      for (const auto& batch : steps) ASSERT_THAT((*t)->Step(batch), IsOk());
      ASSERT_THAT((*t)->WaitForOptimizer(), IsOk());
      state[static_cast<size_t>(peer)] = AllState((*t)->store());
    }
    ASSERT_EQ(state[0].size(), state[1].size());
    EXPECT_EQ(std::memcmp(state[0].data(), state[1].data(), state[0].size() * sizeof(float)), 0)
        << "resident " << resident;
  }
}

}  // namespace
}  // namespace megatrain::engine
