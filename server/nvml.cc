// See nvml.h. The few NVML declarations needed are repeated here (stable C
// ABI of nvml.h) so that no NVIDIA header is needed to build.
#include "server/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace megatrain::server {
namespace {

using NvmlReturn = int;  // nvmlReturn_t; 0 = NVML_SUCCESS
using NvmlDevice = void*;  // nvmlDevice_t
struct NvmlMemory {        // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr int kPcieTxBytes = 0;  // NVML_PCIE_UTIL_TX_BYTES
constexpr int kPcieRxBytes = 1;  // NVML_PCIE_UTIL_RX_BYTES

// Integer entries of CUDA_VISIBLE_DEVICES; nullopt when unset or when it
// holds UUIDs.
std::optional<std::vector<int>> VisibleDeviceIndices() {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr) return std::nullopt;
  std::vector<int> indices;
  for (absl::string_view item : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
    int index = 0;
    if (!absl::SimpleAtoi(item, &index)) return std::nullopt;
    if (index < 0) break;  // CUDA stops at the first invalid entry
    indices.push_back(index);
  }
  return indices;
}

}  // namespace

struct Nvml::Api {
  void* handle = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*device_count)(unsigned*) = nullptr;
  NvmlReturn (*handle_by_index)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*memory_info)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*pcie_throughput)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*name)(NvmlDevice, char*, unsigned) = nullptr;
};

std::unique_ptr<Nvml> Nvml::Load() {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return nullptr;
  auto api = std::make_unique<Api>();
  api->handle = handle;
  auto sym = [handle](const char* name) { return dlsym(handle, name); };
  api->init = reinterpret_cast<NvmlReturn (*)()>(sym("nvmlInit_v2"));
  api->shutdown = reinterpret_cast<NvmlReturn (*)()>(sym("nvmlShutdown"));
  api->device_count = reinterpret_cast<NvmlReturn (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
  api->handle_by_index = reinterpret_cast<NvmlReturn (*)(unsigned, NvmlDevice*)>(
      sym("nvmlDeviceGetHandleByIndex_v2"));
  api->memory_info =
      reinterpret_cast<NvmlReturn (*)(NvmlDevice, NvmlMemory*)>(sym("nvmlDeviceGetMemoryInfo"));
  api->pcie_throughput = reinterpret_cast<NvmlReturn (*)(NvmlDevice, int, unsigned*)>(
      sym("nvmlDeviceGetPcieThroughput"));
  api->name =
      reinterpret_cast<NvmlReturn (*)(NvmlDevice, char*, unsigned)>(sym("nvmlDeviceGetName"));
  if (api->init == nullptr || api->shutdown == nullptr || api->device_count == nullptr ||
      api->handle_by_index == nullptr || api->memory_info == nullptr ||
      api->pcie_throughput == nullptr || api->name == nullptr || api->init() != 0) {
    dlclose(handle);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(api_->handle);
}

int Nvml::DeviceCount() const {
  unsigned count = 0;
  if (api_->device_count(&count) != 0) return 0;
  return static_cast<int>(count);
}

int Nvml::CudaVisibleDeviceCount() const {
  const int count = DeviceCount();
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr) return count;
  const std::optional<std::vector<int>> indices = VisibleDeviceIndices();
  if (!indices.has_value()) {
    // UUIDs: count the entries.
    int entries = 0;
    for (absl::string_view item : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
      (void)item;
      ++entries;
    }
    return std::min(entries, count);
  }
  int visible = 0;
  for (int index : *indices) {
    if (index >= count) break;
    ++visible;
  }
  return visible;
}

std::optional<NvmlSample> Nvml::Sample(const std::string& device) const {
  if (!absl::StartsWith(device, "cuda:")) return std::nullopt;
  int cuda_index = 0;
  if (!absl::SimpleAtoi(absl::string_view(device).substr(5), &cuda_index)) return std::nullopt;
  int nvml_index = cuda_index;
  const std::optional<std::vector<int>> indices = VisibleDeviceIndices();
  if (indices.has_value()) {
    if (cuda_index >= static_cast<int>(indices->size())) return std::nullopt;
    nvml_index = (*indices)[cuda_index];
  }
  NvmlDevice handle = nullptr;
  if (api_->handle_by_index(static_cast<unsigned>(nvml_index), &handle) != 0) {
    return std::nullopt;
  }
  NvmlSample sample;
  char name[96] = {};
  if (api_->name(handle, name, sizeof(name)) == 0) sample.name = name;
  NvmlMemory memory{};
  if (api_->memory_info(handle, &memory) == 0) {
    sample.memory_used_bytes = static_cast<int64_t>(memory.used);
    sample.memory_total_bytes = static_cast<int64_t>(memory.total);
  }
  unsigned kilobytes_per_second = 0;  // NVML reports KB/s
  if (api_->pcie_throughput(handle, kPcieTxBytes, &kilobytes_per_second) == 0) {
    sample.pcie_tx_bytes_per_second = kilobytes_per_second * 1024.0;
  }
  if (api_->pcie_throughput(handle, kPcieRxBytes, &kilobytes_per_second) == 0) {
    sample.pcie_rx_bytes_per_second = kilobytes_per_second * 1024.0;
  }
  return sample;
}

}  // namespace megatrain::server
