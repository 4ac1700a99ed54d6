// A fake libnvidia-ml for tests/server/core/nvml_test.cc: the NVML entry points
// server/core/nvml.cc calls, over two scripted devices, plus FakeNvml* functions
// that the test (dlopen()ing the same file) uses to script them. Built as a
// shared library; with FAKE_NVML_NO_FIELD_VALUES it lacks
// nvmlDeviceGetFieldValues, like a pre-R550 driver.
//
// Field values are written with the layout of nvml.h (R550+), declared here
// independently of server/core/nvml.cc: fieldId u32 @0, scopeId u32 @4,
// timestamp i64 @8, latencyUsec i64 @16, valueType i32 @24, nvmlReturn u32
// @28, value (8-byte union) @32; 40 bytes.
//
// Thread-safety: every function takes one mutex (the Nvml poll thread reads
// while the test scripts).
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace {

constexpr int kDevices = 2;
constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;

struct FieldValue {
  uint32_t field_id;
  uint32_t scope_id;
  int64_t timestamp_us;
  int64_t latency_us;
  int32_t value_type;
  uint32_t nvml_return;
  unsigned char value[8];
};
static_assert(sizeof(FieldValue) == 40, "nvmlFieldValue_t is 40 bytes");

struct Script {
  int value_type = 3;            // NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
  std::vector<uint64_t> values;  // one per read; the last one repeats
  std::vector<int> returns;      // per-field nvmlReturn per read; the last repeats
  size_t next = 0;
};

struct Device {
  int index = 0;
  std::map<uint32_t, Script> fields;  // by field id
};

std::mutex mu;
Device devices[kDevices] = {{0, {}}, {1, {}}};
int init_return = kSuccess;
std::vector<int> call_returns;  // nvmlDeviceGetFieldValues' return per call
size_t next_call = 0;
int field_value_calls = 0;

template <typename T>
T Nth(const std::vector<T>& items, size_t n, T fallback) {
  if (items.empty()) return fallback;
  return items[n < items.size() ? n : items.size() - 1];
}

#ifndef FAKE_NVML_NO_FIELD_VALUES
// Writes `raw` into the value union as `value_type` says, over bytes set to
// 0xab first: a reader that ignores valueType and reads 8 bytes gets junk.
void WriteValue(unsigned char* out, int value_type, uint64_t raw) {
  std::memset(out, 0xab, 8);
  switch (value_type) {
    case 0: {
      const double value = static_cast<double>(raw);
      std::memcpy(out, &value, 8);
      break;
    }
    case 1: {
      const uint32_t value = static_cast<uint32_t>(raw);
      std::memcpy(out, &value, 4);
      break;
    }
    case 5: {
      const int32_t value = static_cast<int32_t>(static_cast<uint32_t>(raw));
      std::memcpy(out, &value, 4);
      break;
    }
    case 6: {
      const uint16_t value = static_cast<uint16_t>(raw);
      std::memcpy(out, &value, 2);
      break;
    }
    default:  // 2, 3, 4: 64 bits
      std::memcpy(out, &raw, 8);
      break;
  }
}

#endif

Device* FromHandle(void* handle) {
  for (Device& device : devices) {
    if (handle == &device) return &device;
  }
  return nullptr;
}

}  // namespace

extern "C" {

// --- control, for the test ---

// Back to the initial state: two devices, no field scripts, every call OK.
void FakeNvmlReset() {
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < kDevices; ++i) {
    devices[i] = Device();
    devices[i].index = i;
  }
  init_return = kSuccess;
  call_returns.clear();
  next_call = 0;
  field_value_calls = 0;
}

void FakeNvmlSetInitReturn(int code) {
  std::lock_guard<std::mutex> lock(mu);
  init_return = code;
}

// Field `field_id` of device `index` returns `values[i]` as `value_type` at
// its i-th read, with per-field nvmlReturn `returns[i]` (nullptr: all OK);
// past the end, the last entry repeats.
void FakeNvmlSetField(int index, unsigned field_id, int value_type, const uint64_t* values,
                      const int* returns, int count) {
  std::lock_guard<std::mutex> lock(mu);
  Script& script = devices[index].fields[field_id];
  script = Script();
  script.value_type = value_type;
  script.values.assign(values, values + count);
  if (returns != nullptr) script.returns.assign(returns, returns + count);
}

// nvmlDeviceGetFieldValues itself returns `codes[i]` at its i-th call.
void FakeNvmlSetCallReturns(const int* codes, int count) {
  std::lock_guard<std::mutex> lock(mu);
  call_returns.assign(codes, codes + count);
  next_call = 0;
}

int FakeNvmlFieldValueCalls() {
  std::lock_guard<std::mutex> lock(mu);
  return field_value_calls;
}

// --- NVML ---

int nvmlInit_v2() {
  std::lock_guard<std::mutex> lock(mu);
  return init_return;
}

int nvmlShutdown() { return kSuccess; }

int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = kDevices;
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** handle) {
  if (index >= kDevices) return kInvalidArgument;
  *handle = &devices[index];
  return kSuccess;
}

int nvmlDeviceGetName(void* handle, char* name, unsigned length) {
  Device* device = FromHandle(handle);
  if (device == nullptr) return kInvalidArgument;
  const char* names[kDevices] = {"Fake GPU 0", "Fake GPU 1"};
  std::strncpy(name, names[device->index], length - 1);
  return kSuccess;
}

struct Memory {
  unsigned long long total, free, used;
};

int nvmlDeviceGetMemoryInfo(void* handle, Memory* memory) {
  Device* device = FromHandle(handle);
  if (device == nullptr) return kInvalidArgument;
  memory->total = 80ull << 30;
  memory->used = (1ull + device->index) << 30;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

// KB/s: tx 1000 (+ index), rx 2000 (+ index).
int nvmlDeviceGetPcieThroughput(void* handle, int counter, unsigned* value) {
  Device* device = FromHandle(handle);
  if (device == nullptr || counter < 0 || counter > 1) return kInvalidArgument;
  *value = (counter == 0 ? 1000 : 2000) + device->index;
  return kSuccess;
}

#ifndef FAKE_NVML_NO_FIELD_VALUES
int nvmlDeviceGetFieldValues(void* handle, int count, FieldValue* values) {
  std::lock_guard<std::mutex> lock(mu);
  Device* device = FromHandle(handle);
  if (device == nullptr || count < 0) return kInvalidArgument;
  ++field_value_calls;
  const int call_return = Nth(call_returns, next_call++, kSuccess);
  if (call_return != kSuccess) return call_return;
  for (int i = 0; i < count; ++i) {
    FieldValue& out = values[i];
    out.timestamp_us = 1700000000000000 + field_value_calls;
    out.latency_us = 300;
    auto it = device->fields.find(out.field_id);
    if (it == device->fields.end()) {
      out.nvml_return = 3;  // NVML_ERROR_NOT_SUPPORTED, as for an unknown field
      continue;
    }
    Script& script = it->second;
    const size_t read = script.next++;
    out.nvml_return = static_cast<uint32_t>(Nth(script.returns, read, kSuccess));
    out.value_type = script.value_type;
    WriteValue(out.value, script.value_type, Nth<uint64_t>(script.values, read, 0));
  }
  return kSuccess;
}
#endif

}  // extern "C"
