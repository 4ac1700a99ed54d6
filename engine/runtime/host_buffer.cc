// mmap-backed host buffers with optional CUDA registration.
#include "engine/runtime/host_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#ifdef MEGATRAIN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace megatrain::engine {

bool HostPinningAvailable() {
#ifdef MEGATRAIN_WITH_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      pinned_(std::exchange(other.pinned_, false)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    pinned_ = std::exchange(other.pinned_, false);
  }
  return *this;
}

HostBuffer::~HostBuffer() { Release(); }

void HostBuffer::Release() noexcept {
  if (data_ == nullptr) return;
#ifdef MEGATRAIN_WITH_CUDA
  if (pinned_) {
    cudaError_t err = cudaHostUnregister(data_);
    if (err != cudaSuccess) {
      std::fprintf(stderr, "megatrain: cudaHostUnregister(%zu bytes) failed: %s\n", bytes_,
                   cudaGetErrorString(err));
    }
  }
#endif
  if (munmap(data_, mapped_bytes_) != 0) {
    std::fprintf(stderr, "megatrain: munmap(%zu bytes) failed: %s\n", mapped_bytes_,
                 std::strerror(errno));
  }
  data_ = nullptr;
  bytes_ = mapped_bytes_ = 0;
  pinned_ = false;
}

void HostBuffer::FaultIn() {
  if (data_ == nullptr) return;
  // Touching one byte per page suffices; it is read and written back, so
  // the contents are kept (a fresh mapping stays zero).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = mapped_bytes_;
  void* p = data_;
  const unsigned threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  const size_t per_thread = (mapped / threads + page - 1) / page * page;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    const size_t begin = t * per_thread;
    if (begin >= mapped) break;
    const size_t end = std::min(mapped, begin + per_thread);
    workers.emplace_back([p, begin, end, page] {
      volatile char* base = static_cast<char*>(p);
      for (size_t off = begin; off < end; off += page) base[off] = base[off];
    });
  }
  for (std::thread& w : workers) w.join();
}

absl::StatusOr<HostBuffer> HostBuffer::Allocate(size_t bytes, bool pin) {
  HostBuffer buffer;
  if (bytes == 0) return buffer;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host memory: mmap of ", bytes, " bytes failed: ", std::strerror(errno)));
  }
  // Large arenas benefit from transparent huge pages (fewer TLB misses in
  // the CPU optimizer, faster registration). Advice only; failure is fine.
  (void)madvise(p, mapped, MADV_HUGEPAGE);
  buffer.data_ = p;
  buffer.bytes_ = bytes;
  buffer.mapped_bytes_ = mapped;
  if (pin) {
#ifdef MEGATRAIN_WITH_CUDA
    // Fault the pages in on all cores first: cudaHostRegister would fault
    // them one by one on this thread (minutes for 100 GiB instead of
    // seconds).
    buffer.FaultIn();
    cudaError_t err = cudaHostRegister(p, mapped, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error state
      return absl::ResourceExhaustedError(
          absl::StrCat("pinned host memory: cudaHostRegister of ", mapped,
                       " bytes failed: ", cudaGetErrorString(err),
                       " (check `ulimit -l`; the systemd unit sets LimitMEMLOCK=infinity)"));
    }
    buffer.pinned_ = true;
#else
    return absl::FailedPreconditionError(
        "pinned host memory: this build has no CUDA (LibTorch without CUDA)");
#endif
  }
  return buffer;
}

}  // namespace megatrain::engine
