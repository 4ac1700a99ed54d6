// Optional NVML access for GPU metrics (device memory, PCIe throughput),
// loaded at run time with dlopen("libnvidia-ml.so.1") so that the daemon
// builds and runs without the NVIDIA driver. Where NVML is missing, Load()
// returns nullptr and the NVML metrics are simply absent.
//
// Device numbering: "cuda:N" is the N-th CUDA-visible device; when
// CUDA_VISIBLE_DEVICES lists integer indices, N maps to the N-th entry,
// otherwise to NVML index N (UUID lists are not mapped).
//
// Thread-safety: NVML is thread-safe; all methods may be called
// concurrently. Ownership: the library stays loaded until the object dies.
#ifndef MEGATRAIN_SERVER_NVML_H_
#define MEGATRAIN_SERVER_NVML_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace megatrain::server {

// One NVML reading of a device.
struct NvmlSample {
  std::string name;                  // "NVIDIA H100 80GB HBM3"
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  double pcie_tx_bytes_per_second = 0;  // device -> host, NVML 20 ms window
  double pcie_rx_bytes_per_second = 0;  // host -> device
};

class Nvml {
 public:
  // nullptr when libnvidia-ml cannot be loaded or initialised.
  static std::unique_ptr<Nvml> Load();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Devices NVML sees (all of the machine's GPUs).
  int DeviceCount() const;
  // Devices CUDA will see: DeviceCount(), limited by CUDA_VISIBLE_DEVICES.
  int CudaVisibleDeviceCount() const;
  // Reads `device` ("cuda:N"); nullopt for "cpu" or on an NVML error.
  // Takes ~40 ms (two PCIe throughput windows).
  std::optional<NvmlSample> Sample(const std::string& device) const;

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_NVML_H_
