// Page-aligned host memory, optionally page-locked ("pinned") for DMA.
//
// Note [Pinned host memory]
// Host<->device copies from pageable memory run at ~7 GB/s on the H200
// machine; from page-locked memory at ~55 GB/s (../shared/DEVICE.md). The
// host store is allocated with mmap (page aligned, untouched pages cost
// nothing) and registered with cudaHostRegister, rather than through the
// power-of-two caching host allocator, which would waste up to 2x on large
// arenas. Registration pins every page and so takes time proportional to the
// size (measured in docs/performance.md).
#ifndef MEGATRAIN_ENGINE_HOST_BUFFER_H_
#define MEGATRAIN_ENGINE_HOST_BUFFER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// Whether this build can pin host memory (CUDA builds with a visible device).
bool HostPinningAvailable();

// One owner of a page-aligned host allocation. Move-only; the destructor
// unregisters (if pinned) and unmaps, and never throws.
// Thread-safety: the object is not synchronised; the memory it owns may be
// used from any thread under the caller's own ordering.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  // Maps `bytes` of zeroed, page-aligned memory. With `pin`, registers it
  // with CUDA (cudaHostRegisterPortable) so DMA engines can read and write it.
  // Errors: RESOURCE_EXHAUSTED when the mapping or the registration fails
  // (message gives the bytes and, for pinning, the RLIMIT_MEMLOCK hint);
  // FAILED_PRECONDITION when `pin` is asked for in a build without CUDA.
  static absl::StatusOr<HostBuffer> Allocate(size_t bytes, bool pin);

  // Faults every page of the mapping in, on up to 32 threads, keeping its
  // contents (each page's first byte is read and written back). Untouched
  // anonymous pages otherwise cost their fault and zeroing at first use
  // (Note [Prefaulted moments] in store/host_store.cc). No-op when empty.
  // Not thread-safe against other writers of the buffer.
  void FaultIn();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void Release() noexcept;

  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_bytes_ = 0;  // bytes rounded up to the page size
  bool pinned_ = false;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_HOST_BUFFER_H_
