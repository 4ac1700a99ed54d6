// The executor's shared environment: the phase timer and the exception
// mapping (step_env.h).
#include "engine/step/step_env.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/runtime/torch_compat.h"

namespace megatrain::engine {

absl::Status StatusFromException(const std::exception& e) {
  const std::string what = e.what();
  if (compat::IsOutOfMemory(e)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("device out of memory (try a smaller train.micro_batch or train.seq_len): ",
                     what.substr(0, what.find('\n'))));
  }
  return absl::InternalError(absl::StrCat("engine: ", what.substr(0, 2000)));
}

void PhaseTimer::Reset() {
  used_ = 0;
  intervals_.clear();
  waits_.clear();
  cpu_wait_seconds_ = 0;
  start_marker_ = -1;
  for (double& s : cpu_seconds_) s = 0;
}

void PhaseTimer::MarkStart() {
  if (!runtime_->is_cuda()) return;
  start_marker_ = NextEvent();
  runtime_->Record(StreamKind::kCompute, *events_[start_marker_]);
}

int PhaseTimer::Begin(StreamKind stream) {
  if (!runtime_->is_cuda()) {
    cpu_start_[static_cast<int>(stream)] = StepClock::now();
    return -1;
  }
  const int idx = NextEvent();
  runtime_->Record(stream, *events_[idx]);
  return idx;
}

void PhaseTimer::End(StreamKind stream, int begin_token, Label label) {
  if (!runtime_->is_cuda()) {
    cpu_seconds_[static_cast<int>(stream)] += SecondsSince(cpu_start_[static_cast<int>(stream)]);
    return;
  }
  const int idx = NextEvent();
  runtime_->Record(stream, *events_[idx]);
  intervals_.push_back({static_cast<int>(stream), begin_token, idx, label});
}

int PhaseTimer::BeginWait() {
  if (!runtime_->is_cuda()) {
    cpu_wait_start_ = StepClock::now();
    return -1;
  }
  const int idx = NextEvent();
  runtime_->Record(StreamKind::kCompute, *events_[idx]);
  return idx;
}

void PhaseTimer::EndWait(int begin_token) {
  if (!runtime_->is_cuda()) {
    cpu_wait_seconds_ += SecondsSince(cpu_wait_start_);
    return;
  }
  const int idx = NextEvent();
  runtime_->Record(StreamKind::kCompute, *events_[idx]);
  waits_.push_back({begin_token, idx});
}

double PhaseTimer::WaitIdleSeconds() {
  double total = cpu_wait_seconds_;
  for (const auto& [begin, end] : waits_) {
    total += std::max(0.0, runtime_->ElapsedMs(*events_[begin], *events_[end]) / 1e3);
  }
  return total;
}

std::array<double, 4> PhaseTimer::ComputeGaps() {
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

std::array<double, kNumStreams> PhaseTimer::Seconds() {
  std::array<double, kNumStreams> out = cpu_seconds_;
  for (const Interval& iv : intervals_) {
    out[iv.stream] += runtime_->ElapsedMs(*events_[iv.begin], *events_[iv.end]) / 1e3;
  }
  return out;
}

int PhaseTimer::NextEvent() {
  if (used_ == static_cast<int>(events_.size())) events_.push_back(runtime_->CreateEvent(true));
  return used_++;
}

}  // namespace megatrain::engine
