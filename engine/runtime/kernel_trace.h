// A Kineto (CUPTI) trace of the device's kernels and copies, for profiling
// megatrain-bench (docs/performance.md compares its per-kernel totals with
// torch.profiler's for the resident PyTorch baseline).
#ifndef MEGATRAIN_ENGINE_RUNTIME_KERNEL_TRACE_H_
#define MEGATRAIN_ENGINE_RUNTIME_KERNEL_TRACE_H_

#include <string>

#include "absl/status/status.h"

namespace megatrain::engine {

// Whether this LibTorch can record a kernel trace (torch >= 2.0: pip's
// wheels, built with Kineto; Debian's LibTorch 1.13 is not).
bool KernelTraceSupported();

// Starts recording every CUDA kernel, memcpy and memset of the process (all
// threads and streams; CUPTI activity records) and the CPU-side ATen ops
// of the calling thread. One trace at a time per process; not
// thread-safe against a concurrent Start/Stop.
// Errors: UNIMPLEMENTED when !KernelTraceSupported(); FAILED_PRECONDITION
// when a trace is already running; INTERNAL with LibTorch's message.
absl::Status StartKernelTrace();

// Stops the trace started by StartKernelTrace and writes it to `path` as a
// Chrome trace (JSON; timestamps and durations in microseconds, kernels
// under category "kernel"). The caller synchronises the device first so
// that every kernel of interest has finished.
// Errors: FAILED_PRECONDITION without a running trace; INTERNAL when
// LibTorch fails or `path` cannot be written.
absl::Status StopKernelTrace(const std::string& path);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_RUNTIME_KERNEL_TRACE_H_
