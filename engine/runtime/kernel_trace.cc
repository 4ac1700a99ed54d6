#include "engine/runtime/kernel_trace.h"

#include <atomic>
#include <exception>
#include <set>

#include "engine/runtime/torch_compat.h"

#if MEGATRAIN_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/autograd/profiler_kineto.h>
#define MEGATRAIN_HAVE_KINETO 1
#endif

namespace megatrain::engine {
namespace {

std::atomic<bool> g_tracing{false};

}  // namespace

bool KernelTraceSupported() {
#ifdef MEGATRAIN_HAVE_KINETO
  return true;
#else
  return false;
#endif
}

#ifdef MEGATRAIN_HAVE_KINETO

namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

impl::ProfilerConfig TraceConfig() { return impl::ProfilerConfig(impl::ProfilerState::KINETO); }

const std::set<impl::ActivityType>& TraceActivities() {
  static const std::set<impl::ActivityType> activities = {impl::ActivityType::CPU,
                                                          impl::ActivityType::CUDA};
  return activities;
}

}  // namespace

absl::Status StartKernelTrace() {
  if (g_tracing.exchange(true)) {
    return absl::FailedPreconditionError("a kernel trace is already running");
  }
  try {
    prof::prepareProfiler(TraceConfig(), TraceActivities());
    prof::enableProfiler(TraceConfig(), TraceActivities());
  } catch (const std::exception& e) {
    g_tracing = false;
    return absl::InternalError(std::string("starting the Kineto trace: ") + e.what());
  }
  return absl::OkStatus();
}

absl::Status StopKernelTrace(const std::string& path) {
  if (!g_tracing.exchange(false)) {
    return absl::FailedPreconditionError("no kernel trace is running");
  }
  try {
    std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
    result->save(path);
  } catch (const std::exception& e) {
    return absl::InternalError("writing the Kineto trace to '" + path + "': " + e.what());
  }
  return absl::OkStatus();
}

#else  // !MEGATRAIN_HAVE_KINETO

absl::Status StartKernelTrace() {
  return absl::UnimplementedError(
      "kernel traces need LibTorch >= 2.0 built with Kineto (pip's torch); this build has " +
      std::string(TORCH_VERSION));
}

absl::Status StopKernelTrace(const std::string& path) {
  (void)path;
  return absl::FailedPreconditionError("no kernel trace is running");
}

#endif  // MEGATRAIN_HAVE_KINETO

}  // namespace megatrain::engine
