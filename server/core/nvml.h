// Optional NVML access for GPU metrics (device memory, PCIe traffic),
// loaded at run time with dlopen("libnvidia-ml.so.1") so that the daemon
// builds and runs without the NVIDIA driver. Where NVML is missing, Load()
// returns nullptr and the NVML metrics are simply absent.
//
// Device numbering: "cuda:N" is the N-th CUDA-visible device; when
// CUDA_VISIBLE_DEVICES lists integer indices, N maps to the N-th entry,
// otherwise to NVML index N (UUID lists are not mapped).
//
// Note [NVML PCIe counters]
// NVML reports PCIe traffic two ways, and only the second one can be
// compared with byte counts such as megatrain_pcie_bytes_total:
//  - nvmlDeviceGetPcieThroughput: KB/s over one 20 ms window, at the time of
//    the call. Sampled once per scrape, it shows whatever 20 ms the scrape
//    fell on: with bursty copies it was 3-6x off the daemon's byte rates on
//    an H100 (docs/performance.md). Kept as a gauge, for reference only.
//  - NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES (field values 197 and 198,
//    R550+ drivers), read with nvmlDeviceGetFieldValues: cumulative byte
//    counters. Driver 580 returns them as 32-bit values (valueType unsigned
//    int, seen on an H200), which wrap every 2^32 B = 4 GiB: every 78 ms at
//    the 55 GB/s of a PCIe 5 x16 link. A background thread therefore reads
//    them every NvmlOptions::pcie_counter_poll_ms (20 ms) and adds the
//    deltas, modulo the counter's width, to 64-bit totals that start at 0
//    when Load() returns. A read later than kPcieCounterMaxGapSeconds after
//    the previous one may have missed a whole wrap: it is counted in
//    NvmlSample::pcie_counter_late_reads (the totals are then short by a
//    multiple of 4 GiB).
//    The counters count link-level bytes, not payload: on an H200, a
//    pinned copy of N bytes host->device added 1.078 N to RX (completion
//    headers) and 0.094 N to TX (the read requests); device->host added
//    1.094 N to TX (write headers) and ~0 to RX.
//
// Thread-safety: every method may be called concurrently (NVML is
// thread-safe; the PCIe byte totals have their own mutex). Ownership: the
// library stays loaded, and the poll thread runs, until the object dies.
#ifndef MEGATRAIN_SERVER_NVML_H_
#define MEGATRAIN_SERVER_NVML_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/core/pcie_link_model.h"

namespace megatrain::server {

// One NVML reading of a device.
struct NvmlSample {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  // nvmlDeviceGetPcieThroughput x 1024: bytes per second in one 20 ms window
  // at the time of the call; 0 where NVML fails. A sample, not an average:
  // not comparable with byte counts (Note [NVML PCIe counters]).
  double pcie_tx_bytes_per_second = 0;  // device -> host
  double pcie_rx_bytes_per_second = 0;  // host -> device
  // True when NVML's PCIe byte counters are read for this device: the
  // driver has them and at least one read succeeded. Otherwise the three
  // fields below are 0 and mean nothing.
  bool pcie_byte_counters = false;
  // PCIe bytes (link level: payload and packet headers) since Load(), or
  // since the first successful read where that came later; never decrease.
  uint64_t pcie_tx_bytes = 0;  // device -> host
  uint64_t pcie_rx_bytes = 0;  // host -> device
  // Reads of a counter narrower than 64 bits that came more than
  // kPcieCounterMaxGapSeconds after the previous one: each may have missed
  // whole wraps, leaving the totals short by multiples of 2^32 B.
  int64_t pcie_counter_late_reads = 0;
};

// Longest interval between two reads of a 32-bit byte counter that cannot
// hide a whole wrap: 2^32 B at 64 GB/s, the most a PCIe 5 x16 link carries
// one way (32 GT/s x 16 lanes, 128b/130b encoding: 63 GB/s).
inline constexpr double kPcieCounterMaxGapSeconds = 4294967296.0 / 64e9;  // 67 ms

// Turns successive readings of a byte counter that wraps at 2^bits into a
// total that never decreases. Not thread-safe (Nvml guards its counters).
//
// Example:
//   WrappingByteCounter counter;
//   counter.Add(0xffffff00, 32);  // first reading: the baseline, total 0
//   counter.Add(0x00000100, 32);  // wrapped once: total 0x200
class WrappingByteCounter {
 public:
  // Adds the bytes counted since the previous reading. `bits` is the
  // counter's width (1..64); `reading` is taken modulo 2^bits. A reading
  // below the previous one has wrapped once, except for a 64-bit counter
  // (which cannot wrap in practice: it was reset, e.g. by a GPU reset) and
  // the first reading, or the first after a change of width: those only
  // set the baseline. Returns the bytes added.
  uint64_t Add(uint64_t reading, int bits);
  // Sum of every Add(): bytes since the first reading.
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  bool has_previous_ = false;
  int bits_ = 0;
  uint64_t previous_ = 0;
  uint64_t total_bytes_ = 0;
};

struct NvmlOptions {
  // dlopen() name or path of the NVML library; another path is for tests
  // (tests/server/fake_nvml.cc).
  std::string library_path = "libnvidia-ml.so.1";
  // Devices ("cuda:N") whose PCIe byte counters the background thread reads
  // from Load() on, every pcie_counter_poll_ms. 20 ms keeps a 32-bit
  // counter's reads well under kPcieCounterMaxGapSeconds (a read of both
  // fields costs ~0.3 ms of CPU, driver 580 on an H200: 1.6% of one core).
  // 0: no thread; only Sample() reads the counters, which
  // loses wraps between samples at high traffic (tests use it to script
  // each read).
  std::vector<std::string> pcie_counter_devices;
  int pcie_counter_poll_ms = 20;
};

class Nvml {
 public:
  // nullptr when the library cannot be loaded, lacks a required symbol, or
  // nvmlInit fails. nvmlDeviceGetFieldValues is optional: without it (or
  // where a device answers NOT_SUPPORTED) the PCIe byte counters are absent
  // (NvmlSample::pcie_byte_counters false), everything else works.
  static std::unique_ptr<Nvml> Load(const NvmlOptions& options = NvmlOptions());
  // Stops the poll thread, then nvmlShutdown and dlclose.
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Devices NVML sees (all of the machine's GPUs).
  int DeviceCount() const;
  // Devices CUDA will see: DeviceCount(), limited by CUDA_VISIBLE_DEVICES.
  int CudaVisibleDeviceCount() const;
  // Reads `device` ("cuda:N"), its PCIe byte counters included (one more
  // read, added to the totals); nullopt for "cpu", an unmapped index or a
  // device NVML has no handle for. Fields NVML fails to read stay 0.
  // Takes ~40 ms (two PCIe throughput windows).
  std::optional<NvmlSample> Sample(const std::string& device) const;
  // Reads `device`'s PCIe byte counters once (added to the totals) and
  // returns the totals (link-level bytes since Load()); nullopt where the
  // counters are absent (pre-R550 driver, NOT_SUPPORTED, "cpu", an unmapped
  // index, or no successful read yet). Takes ~0.3 ms.
  std::optional<PcieCounterReading> PcieBytes(const std::string& device) const;

 private:
  struct Api;
  struct PcieCounters;
  Nvml(std::unique_ptr<Api> api, std::unique_ptr<PcieCounters> counters);
  // NVML index of "cuda:N"; nullopt for anything else.
  static std::optional<unsigned> NvmlIndex(const std::string& device);
  // Reads the PCIe byte counters of `device` once and adds the deltas.
  void ReadPcieCounters(const std::string& device) const;
  void PollPcieCounters(int poll_ms, std::vector<std::string> devices) const;

  std::unique_ptr<Api> api_;
  std::unique_ptr<PcieCounters> counters_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_NVML_H_
