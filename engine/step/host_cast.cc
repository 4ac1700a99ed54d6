// The host cast of streamed weights (host_cast.h, Note [Host cast]).
#include "engine/step/host_cast.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "engine/optim/adamw.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

// Elements per line of the parallel cast: 64 bf16 are 128 bytes, so every
// thread's part starts aligned for the kernels' non-temporal stores and no
// two threads write one cache line.
constexpr int64_t kCastLineElements = 64;
// Lines per part of the pool's ParallelFor: 64 Ki elements (256 KiB read).
constexpr int64_t kCastMinLines = 1024;

}  // namespace

HostCastRing HostCastRingOf(int64_t max_numel, int64_t chunk_elements) {
  HostCastRing ring;
  if (max_numel <= 0) return ring;
  ring.chunk_numel = std::min(max_numel, std::max<int64_t>(1, chunk_elements));
  ring.stride_numel =
      (ring.chunk_numel + kCastLineElements - 1) / kCastLineElements * kCastLineElements;
  ring.num_buffers = (max_numel + ring.chunk_numel - 1) / ring.chunk_numel + 1;
  return ring;
}

HostCastStager::HostCastStager(StepEnv* env, HostCastRing geometry, HostBuffer ring)
    : env_(env), geometry_(geometry), ring_(std::move(ring)) {
  for (int64_t b = 0; b < geometry_.num_buffers; ++b)
    copied_.push_back(env_->runtime->CreateEvent());
  absl::MutexLock lock(&mu_);
  buffers_.resize(static_cast<size_t>(geometry_.num_buffers));
}

absl::StatusOr<std::unique_ptr<HostCastStager>> HostCastStager::Create(StepEnv* env,
                                                                       int64_t max_numel,
                                                                       int64_t chunk_elements) {
  const HostCastRing geometry = HostCastRingOf(max_numel, chunk_elements);
  if (geometry.num_buffers == 0) {
    return absl::InvalidArgumentError("executor: host cast without a streamed block");
  }
  MEGATRAIN_ASSIGN_OR_RETURN(
      HostBuffer ring,
      HostBuffer::Allocate(static_cast<size_t>(geometry.pinned_bytes()), env->runtime->is_cuda()));
  std::unique_ptr<HostCastStager> stager(new HostCastStager(env, geometry, std::move(ring)));
  stager->worker_ = std::thread([s = stager.get()] { s->WorkerLoop(); });
  return stager;
}

HostCastStager::~HostCastStager() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (worker_.joinable()) worker_.join();
  // Owners drain before they die: the ring's last copies still read it.
  try {
    for (const auto& event : copied_) env_->runtime->HostWait(*event);
  } catch (const std::exception& e) {
    ABSL_RAW_LOG(ERROR, "host cast: waiting for the last copies failed: %s", e.what());
  }
}

void HostCastStager::BeginPass(std::vector<Range> ranges) {
  consumer_seq_ = 0;
  absl::MutexLock lock(&mu_);
  ++pass_;
  ranges_ = std::move(ranges);
  gate_ = env_->weight_gate;
}

void HostCastStager::WorkerLoop() {
  int64_t pass = 0;
  for (;;) {
    std::vector<Range> ranges;
    std::function<void(int64_t)> gate;
    {
      absl::MutexLock lock(&mu_);
      auto next = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || pass_ != pass; };
      mu_.Await(absl::Condition(&next));
      if (stop_) return;
      pass = pass_;
      ranges = ranges_;
      gate = gate_;
    }
    try {
      CastWalk(pass, ranges, gate);
    } catch (const std::exception& e) {  // no exception crosses a thread
      absl::MutexLock lock(&mu_);
      if (error_.empty()) error_ = absl::StrCat("host cast: ", e.what());
    }
  }
}

void HostCastStager::CastWalk(int64_t pass, const std::vector<Range>& ranges,
                              const std::function<void(int64_t)>& gate) {
  int64_t seq = 0;
  for (const Range& range : ranges) {
    // Note [Host cast]: the previous step's update of the block is done.
    if (gate) gate(range.block);
    const float* master = env_->store->master(range.block);
    for (int64_t first = range.begin; first < range.end; first += geometry_.chunk_numel, ++seq) {
      const int64_t b = seq % geometry_.num_buffers;
      if (!ClaimBuffer(b, pass)) return;
      const int64_t count = std::min(geometry_.chunk_numel, range.end - first);
      const float* src = master + first;
      bf16_bits* dst = buffer_data(b);
      const int64_t lines = (count + kCastLineElements - 1) / kCastLineElements;
      env_->pool->ParallelFor(lines, kCastMinLines, [&](int64_t begin, int64_t end) {
        const int64_t from = begin * kCastLineElements;
        const int64_t to = std::min(count, end * kCastLineElements);
        CastToBf16(src + from, dst + from, to - from);
      });
      absl::MutexLock lock(&mu_);
      buffers_[b] = {BufferState::kReady, pass, seq, range.block, first};
    }
  }
}

bool HostCastStager::ClaimBuffer(int64_t b, int64_t pass) {
  bool copying = false;
  {
    absl::MutexLock lock(&mu_);
    auto claimable = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const Buffer& buffer = buffers_[b];
      return stop_ || pass_ != pass ||
             !(buffer.state == BufferState::kReady && buffer.pass == pass);
    };
    mu_.Await(absl::Condition(&claimable));
    if (stop_ || pass_ != pass) return false;
    copying = buffers_[b].state == BufferState::kCopying;
    buffers_[b].state = BufferState::kCasting;
  }
  // The copy that last read the buffer was enqueued (and its event
  // recorded) before it was given back.
  if (copying) env_->runtime->HostWait(*copied_[b]);
  return true;
}

int64_t HostCastStager::CopyRange(int64_t block, int64_t begin, int64_t end, void* device_dst) {
  DeviceRuntime* runtime = env_->runtime;
  int64_t bytes = 0;
  for (int64_t first = begin; first < end; first += geometry_.chunk_numel, ++consumer_seq_) {
    const int64_t b = consumer_seq_ % geometry_.num_buffers;
    const int64_t count = std::min(geometry_.chunk_numel, end - first);
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const Buffer& buffer = buffers_[b];
        return !error_.empty() || (buffer.state == BufferState::kReady && buffer.pass == pass_ &&
                                   buffer.seq == consumer_seq_);
      };
      if (!ready()) {  // the compute stream may idle meanwhile: a gate wait
        const StepClock::time_point start = StepClock::now();
        const int wait = env_->timer.BeginWait();
        mu_.Await(absl::Condition(&ready));
        env_->timer.EndWait(wait);
        env_->gate_wait_seconds += SecondsSince(start);
      }
      if (!error_.empty()) throw std::runtime_error(error_);
      ABSL_RAW_CHECK(buffers_[b].block == block && buffers_[b].first == first,
                     "host cast: the slots' loads left the order BeginPass was given");
    }
    runtime->CopyHostToDevice(static_cast<char*>(device_dst) + (first - begin) * 2, buffer_data(b),
                              static_cast<size_t>(count) * 2);
    runtime->Record(StreamKind::kH2D, *copied_[b]);
    {
      absl::MutexLock lock(&mu_);
      buffers_[b].state = BufferState::kCopying;
    }
    bytes += count * 2;
  }
  return bytes;
}

}  // namespace megatrain::engine
