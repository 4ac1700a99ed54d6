// See nvml.h. The few NVML declarations needed are repeated here (stable C
// ABI of nvml.h) so that no NVIDIA header is needed to build.
#include "server/core/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace megatrain::server {
namespace {

using NvmlReturn = int;                                // nvmlReturn_t
constexpr NvmlReturn kNvmlSuccess = 0;                 // NVML_SUCCESS
constexpr NvmlReturn kNvmlErrorInvalidArgument = 2;    // NVML_ERROR_INVALID_ARGUMENT
constexpr NvmlReturn kNvmlErrorNotSupported = 3;       // NVML_ERROR_NOT_SUPPORTED
constexpr NvmlReturn kNvmlErrorFunctionNotFound = 13;  // NVML_ERROR_FUNCTION_NOT_FOUND
using NvmlDevice = void*;                              // nvmlDevice_t
struct NvmlMemory {                                    // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr int kPcieTxBytes = 0;  // NVML_PCIE_UTIL_TX_BYTES
constexpr int kPcieRxBytes = 1;  // NVML_PCIE_UTIL_RX_BYTES

// nvmlValue_t and nvmlFieldValue_t (nvml.h, R550+).
union NvmlValue {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  long long sllVal;
  int siVal;
  unsigned short usVal;
};
struct NvmlFieldValue {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;  // microseconds since 1970
  long long latencyUsec;
  int valueType;          // nvmlValueType_t
  NvmlReturn nvmlReturn;  // of this field
  NvmlValue value;
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t is 40 bytes");
static_assert(offsetof(NvmlFieldValue, valueType) == 24, "nvmlFieldValue_t.valueType");
static_assert(offsetof(NvmlFieldValue, nvmlReturn) == 28, "nvmlFieldValue_t.nvmlReturn");
static_assert(offsetof(NvmlFieldValue, value) == 32, "nvmlFieldValue_t.value");
constexpr unsigned kFieldPcieCountTxBytes = 197;  // NVML_FI_DEV_PCIE_COUNT_TX_BYTES
constexpr unsigned kFieldPcieCountRxBytes = 198;  // NVML_FI_DEV_PCIE_COUNT_RX_BYTES

// Answers meaning "this driver or device will never have it": stop asking.
// An older driver answers an unknown field id with INVALID_ARGUMENT.
bool IsUnsupported(NvmlReturn code) {
  return code == kNvmlErrorNotSupported || code == kNvmlErrorFunctionNotFound ||
         code == kNvmlErrorInvalidArgument;
}

struct CounterReading {
  uint64_t value = 0;
  int bits = 64;  // the counter wraps at 2^bits
};

// The value of a counter field, read as its valueType says; nullopt for a
// type no counter has or a value that cannot be a byte count.
std::optional<CounterReading> ReadCounter(const NvmlFieldValue& field) {
  switch (field.valueType) {
    case 0: {  // NVML_VALUE_TYPE_DOUBLE
      const double value = field.value.dVal;
      if (!std::isfinite(value) || value < 0 || value >= 18446744073709551616.0) {
        return std::nullopt;
      }
      return CounterReading{static_cast<uint64_t>(value), 64};
    }
    case 1:  // NVML_VALUE_TYPE_UNSIGNED_INT
      return CounterReading{field.value.uiVal, 32};
    case 2:  // NVML_VALUE_TYPE_UNSIGNED_LONG
      return CounterReading{field.value.ulVal, static_cast<int>(8 * sizeof(unsigned long))};
    case 3:  // NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
      return CounterReading{field.value.ullVal, 64};
    case 4:  // NVML_VALUE_TYPE_SIGNED_LONG_LONG: the bits, as a 64-bit counter
      return CounterReading{static_cast<uint64_t>(field.value.sllVal), 64};
    case 5:  // NVML_VALUE_TYPE_SIGNED_INT: the bits, as a 32-bit counter
      return CounterReading{static_cast<uint32_t>(field.value.siVal), 32};
    case 6:  // NVML_VALUE_TYPE_UNSIGNED_SHORT
      return CounterReading{field.value.usVal, 16};
    default:
      return std::nullopt;
  }
}

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

uint64_t WrappingByteCounter::Add(uint64_t reading, int bits) {
  if (bits <= 0 || bits > 64) bits = 64;
  const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  reading &= mask;
  const bool baseline = !has_previous_ || bits != bits_ || (bits == 64 && reading < previous_);
  const uint64_t delta = baseline ? 0 : (reading - previous_) & mask;
  has_previous_ = true;
  bits_ = bits;
  previous_ = reading;
  total_bytes_ += delta;
  return delta;
}

struct Nvml::Api {
  void* handle = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*device_count)(unsigned*) = nullptr;
  NvmlReturn (*handle_by_index)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*memory_info)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*pcie_throughput)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*name)(NvmlDevice, char*, unsigned) = nullptr;
  // Optional (R550+ for the PCIe byte fields); nullptr where missing.
  NvmlReturn (*field_values)(NvmlDevice, int, NvmlFieldValue*) = nullptr;
};

// The PCIe byte totals of each device and the thread that reads them.
struct Nvml::PcieCounters {
  enum class Support { kUnknown, kSupported, kUnsupported };
  struct Device {
    Support support = Support::kUnknown;
    WrappingByteCounter tx;  // NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    WrappingByteCounter rx;  // NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    std::chrono::steady_clock::time_point last_read;
    int64_t late_reads = 0;
  };
  // Held across the NVML read and the Add()s, so that concurrent reads
  // (poll thread, scrapes) are added in the order they were taken: two
  // readings applied out of order would look like a wrap.
  std::mutex mu;
  std::condition_variable stop_cv;
  bool stop = false;                        // guarded by mu
  std::map<std::string, Device> by_device;  // guarded by mu
  std::thread poll_thread;
};

std::unique_ptr<Nvml> Nvml::Load(const NvmlOptions& options) {
  void* handle = dlopen(options.library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return nullptr;
  auto api = std::make_unique<Api>();
  api->handle = handle;
  auto sym = [handle](const char* name) { return dlsym(handle, name); };
  api->init = reinterpret_cast<NvmlReturn (*)()>(sym("nvmlInit_v2"));
  api->shutdown = reinterpret_cast<NvmlReturn (*)()>(sym("nvmlShutdown"));
  api->device_count = reinterpret_cast<NvmlReturn (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
  api->handle_by_index =
      reinterpret_cast<NvmlReturn (*)(unsigned, NvmlDevice*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  api->memory_info =
      reinterpret_cast<NvmlReturn (*)(NvmlDevice, NvmlMemory*)>(sym("nvmlDeviceGetMemoryInfo"));
  api->pcie_throughput = reinterpret_cast<NvmlReturn (*)(NvmlDevice, int, unsigned*)>(
      sym("nvmlDeviceGetPcieThroughput"));
  api->name =
      reinterpret_cast<NvmlReturn (*)(NvmlDevice, char*, unsigned)>(sym("nvmlDeviceGetName"));
  api->field_values = reinterpret_cast<NvmlReturn (*)(NvmlDevice, int, NvmlFieldValue*)>(
      sym("nvmlDeviceGetFieldValues"));
  if (api->init == nullptr || api->shutdown == nullptr || api->device_count == nullptr ||
      api->handle_by_index == nullptr || api->memory_info == nullptr ||
      api->pcie_throughput == nullptr || api->name == nullptr || api->init() != kNvmlSuccess) {
    dlclose(handle);
    return nullptr;
  }
  const bool poll = api->field_values != nullptr && options.pcie_counter_poll_ms > 0 &&
                    !options.pcie_counter_devices.empty();
  std::unique_ptr<Nvml> nvml(new Nvml(std::move(api), std::make_unique<PcieCounters>()));
  if (poll) {
    nvml->counters_->poll_thread =
        std::thread(&Nvml::PollPcieCounters, nvml.get(), options.pcie_counter_poll_ms,
                    options.pcie_counter_devices);
  }
  return nvml;
}

Nvml::Nvml(std::unique_ptr<Api> api, std::unique_ptr<PcieCounters> counters)
    : api_(std::move(api)), counters_(std::move(counters)) {}

Nvml::~Nvml() {
  {
    std::lock_guard<std::mutex> lock(counters_->mu);
    counters_->stop = true;
  }
  counters_->stop_cv.notify_all();
  if (counters_->poll_thread.joinable()) counters_->poll_thread.join();
  api_->shutdown();
  dlclose(api_->handle);
}

int Nvml::DeviceCount() const {
  unsigned count = 0;
  if (api_->device_count(&count) != kNvmlSuccess) return 0;
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

std::optional<unsigned> Nvml::NvmlIndex(const std::string& device) {
  if (!absl::StartsWith(device, "cuda:")) return std::nullopt;
  int cuda_index = 0;
  if (!absl::SimpleAtoi(absl::string_view(device).substr(5), &cuda_index) || cuda_index < 0) {
    return std::nullopt;
  }
  int nvml_index = cuda_index;
  const std::optional<std::vector<int>> indices = VisibleDeviceIndices();
  if (indices.has_value()) {
    if (cuda_index >= static_cast<int>(indices->size())) return std::nullopt;
    nvml_index = (*indices)[cuda_index];
  }
  return static_cast<unsigned>(nvml_index);
}

void Nvml::ReadPcieCounters(const std::string& device) const {
  if (api_->field_values == nullptr) return;
  const std::optional<unsigned> index = NvmlIndex(device);
  if (!index.has_value()) return;
  std::lock_guard<std::mutex> lock(counters_->mu);
  PcieCounters::Device& counters = counters_->by_device[device];
  if (counters.support == PcieCounters::Support::kUnsupported) return;
  NvmlDevice handle = nullptr;
  if (api_->handle_by_index(*index, &handle) != kNvmlSuccess) return;
  NvmlFieldValue fields[2] = {};
  fields[0].fieldId = kFieldPcieCountTxBytes;
  fields[1].fieldId = kFieldPcieCountRxBytes;
  const NvmlReturn result = api_->field_values(handle, 2, fields);
  const auto now = std::chrono::steady_clock::now();
  if (IsUnsupported(result) || (result == kNvmlSuccess && (IsUnsupported(fields[0].nvmlReturn) ||
                                                           IsUnsupported(fields[1].nvmlReturn)))) {
    counters.support = PcieCounters::Support::kUnsupported;
    return;
  }
  // Anything else that failed (GPU lost, timeout, ...): skip this reading;
  // the next good one adds the bytes since the last good one.
  if (result != kNvmlSuccess || fields[0].nvmlReturn != kNvmlSuccess ||
      fields[1].nvmlReturn != kNvmlSuccess) {
    return;
  }
  const std::optional<CounterReading> tx = ReadCounter(fields[0]);
  const std::optional<CounterReading> rx = ReadCounter(fields[1]);
  if (!tx.has_value() || !rx.has_value()) return;
  if (counters.support == PcieCounters::Support::kSupported && std::min(tx->bits, rx->bits) < 64 &&
      std::chrono::duration<double>(now - counters.last_read).count() > kPcieCounterMaxGapSeconds) {
    ++counters.late_reads;
  }
  counters.tx.Add(tx->value, tx->bits);
  counters.rx.Add(rx->value, rx->bits);
  counters.last_read = now;
  counters.support = PcieCounters::Support::kSupported;
}

void Nvml::PollPcieCounters(int poll_ms, std::vector<std::string> devices) const {
  while (true) {
    for (const std::string& device : devices) ReadPcieCounters(device);
    std::unique_lock<std::mutex> lock(counters_->mu);
    if (counters_->stop_cv.wait_for(lock, std::chrono::milliseconds(poll_ms),
                                    [this] { return counters_->stop; })) {
      return;
    }
  }
}

std::optional<NvmlSample> Nvml::Sample(const std::string& device) const {
  const std::optional<unsigned> index = NvmlIndex(device);
  if (!index.has_value()) return std::nullopt;
  NvmlDevice handle = nullptr;
  if (api_->handle_by_index(*index, &handle) != kNvmlSuccess) return std::nullopt;
  NvmlSample sample;
  char name[96] = {};
  if (api_->name(handle, name, sizeof(name)) == kNvmlSuccess) sample.name = name;
  NvmlMemory memory{};
  if (api_->memory_info(handle, &memory) == kNvmlSuccess) {
    sample.memory_used_bytes = static_cast<int64_t>(memory.used);
    sample.memory_total_bytes = static_cast<int64_t>(memory.total);
  }
  unsigned kilobytes_per_second = 0;  // NVML reports KB/s
  if (api_->pcie_throughput(handle, kPcieTxBytes, &kilobytes_per_second) == kNvmlSuccess) {
    sample.pcie_tx_bytes_per_second = kilobytes_per_second * 1024.0;
  }
  if (api_->pcie_throughput(handle, kPcieRxBytes, &kilobytes_per_second) == kNvmlSuccess) {
    sample.pcie_rx_bytes_per_second = kilobytes_per_second * 1024.0;
  }
  ReadPcieCounters(device);
  std::lock_guard<std::mutex> lock(counters_->mu);
  auto it = counters_->by_device.find(device);
  if (it != counters_->by_device.end() && it->second.support == PcieCounters::Support::kSupported) {
    sample.pcie_byte_counters = true;
    sample.pcie_tx_bytes = it->second.tx.total_bytes();
    sample.pcie_rx_bytes = it->second.rx.total_bytes();
    sample.pcie_counter_late_reads = it->second.late_reads;
  }
  return sample;
}

std::optional<PcieCounterReading> Nvml::PcieBytes(const std::string& device) const {
  ReadPcieCounters(device);
  std::lock_guard<std::mutex> lock(counters_->mu);
  auto it = counters_->by_device.find(device);
  if (it == counters_->by_device.end() || it->second.support != PcieCounters::Support::kSupported) {
    return std::nullopt;
  }
  return PcieCounterReading{it->second.tx.total_bytes(), it->second.rx.total_bytes()};
}

}  // namespace megatrain::server
