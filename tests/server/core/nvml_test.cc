// Tests of server/core/nvml.h without a GPU: Nvml loads a fake libnvidia-ml
// (tests/server/fake_nvml.cc, paths from tests/CMakeLists.txt) whose PCIe
// byte counter fields are scripted read by read, and the test checks what
// NvmlSample reports: the values read as their valueType says, 32-bit wraps
// added into the totals, the poll thread catching wraps between samples,
// late reads, and the silent fallback where the counters are missing.
#include "server/core/nvml.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace megatrain::server {
namespace {

constexpr unsigned kTxField = 197;  // NVML_FI_DEV_PCIE_COUNT_TX_BYTES
constexpr unsigned kRxField = 198;  // NVML_FI_DEV_PCIE_COUNT_RX_BYTES
// nvmlValueType_t
constexpr int kDouble = 0;
constexpr int kUnsignedInt = 1;
constexpr int kUnsignedLong = 2;
constexpr int kUnsignedLongLong = 3;
constexpr int kSignedLongLong = 4;
constexpr int kSignedInt = 5;
constexpr int kUnsignedShort = 6;
// nvmlReturn_t
constexpr int kNotSupported = 3;
constexpr int kGpuIsLost = 15;
constexpr int kUnknownError = 999;
constexpr uint64_t kGiB = uint64_t{1} << 30;

class NvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The same file Nvml::Load() opens: one copy of the fake's state.
    fake_ = dlopen(MEGATRAIN_FAKE_NVML, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(fake_, nullptr) << dlerror();
    reset_ = reinterpret_cast<void (*)()>(dlsym(fake_, "FakeNvmlReset"));
    set_init_return_ = reinterpret_cast<void (*)(int)>(dlsym(fake_, "FakeNvmlSetInitReturn"));
    set_field_ = reinterpret_cast<void (*)(int, unsigned, int, const uint64_t*, const int*, int)>(
        dlsym(fake_, "FakeNvmlSetField"));
    set_call_returns_ =
        reinterpret_cast<void (*)(const int*, int)>(dlsym(fake_, "FakeNvmlSetCallReturns"));
    field_value_calls_ = reinterpret_cast<int (*)()>(dlsym(fake_, "FakeNvmlFieldValueCalls"));
    ASSERT_TRUE(reset_ && set_init_return_ && set_field_ && set_call_returns_ &&
                field_value_calls_);
    reset_();
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible != nullptr) saved_visible_devices_ = visible;
    unsetenv("CUDA_VISIBLE_DEVICES");
  }

  void TearDown() override {
    if (saved_visible_devices_.has_value()) {
      setenv("CUDA_VISIBLE_DEVICES", saved_visible_devices_->c_str(), 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
    if (fake_ != nullptr) dlclose(fake_);
  }

  // Without a poll thread: each Sample() is exactly one read of the fields.
  static std::unique_ptr<Nvml> Load(const char* library = MEGATRAIN_FAKE_NVML) {
    NvmlOptions options;
    options.library_path = library;
    options.pcie_counter_poll_ms = 0;
    return Nvml::Load(options);
  }

  void SetField(int device_index, unsigned field_id, int value_type,
                const std::vector<uint64_t>& values, const std::vector<int>& returns = {}) {
    ASSERT_TRUE(returns.empty() || returns.size() == values.size());
    set_field_(device_index, field_id, value_type, values.data(),
               returns.empty() ? nullptr : returns.data(), static_cast<int>(values.size()));
  }

  // Totals (tx, rx) of one Sample(); nullopt where the counters are absent.
  static std::optional<std::pair<uint64_t, uint64_t>> Totals(const Nvml& nvml,
                                                             const std::string& device) {
    std::optional<NvmlSample> sample = nvml.Sample(device);
    if (!sample.has_value() || !sample->pcie_byte_counters) return std::nullopt;
    return std::make_pair(sample->pcie_tx_bytes, sample->pcie_rx_bytes);
  }

  void* fake_ = nullptr;
  void (*reset_)() = nullptr;
  void (*set_init_return_)(int) = nullptr;
  void (*set_field_)(int, unsigned, int, const uint64_t*, const int*, int) = nullptr;
  void (*set_call_returns_)(const int*, int) = nullptr;
  int (*field_value_calls_)() = nullptr;
  std::optional<std::string> saved_visible_devices_;
};

using PcieTotals = std::optional<std::pair<uint64_t, uint64_t>>;

TEST_F(NvmlTest, LoadReturnsNullWhenTheLibraryIsMissing) {
  EXPECT_EQ(Load("/nonexistent/libnvidia-ml.so.1"), nullptr);
}

TEST_F(NvmlTest, LoadReturnsNullWhenInitFails) {
  set_init_return_(9);  // NVML_ERROR_DRIVER_NOT_LOADED
  EXPECT_EQ(Load(), nullptr);
}

TEST_F(NvmlTest, SampleReadsNameMemoryAndThroughput) {
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(nvml->DeviceCount(), 2);
  std::optional<NvmlSample> sample = nvml->Sample("cuda:1");
  ASSERT_TRUE(sample.has_value());
  EXPECT_EQ(sample->name, "Fake GPU 1");
  EXPECT_EQ(sample->memory_used_bytes, 2 * static_cast<int64_t>(kGiB));
  EXPECT_EQ(sample->memory_total_bytes, 80 * static_cast<int64_t>(kGiB));
  // The fake reports 1000 + index KB/s tx, 2000 + index rx; NVML's KB is 1024 B.
  EXPECT_EQ(sample->pcie_tx_bytes_per_second, 1001 * 1024.0);
  EXPECT_EQ(sample->pcie_rx_bytes_per_second, 2001 * 1024.0);
}

TEST_F(NvmlTest, SampleReturnsNulloptForCpuAndDevicesNvmlLacks) {
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_FALSE(nvml->Sample("cpu").has_value());
  EXPECT_FALSE(nvml->Sample("cuda:2").has_value());
  EXPECT_FALSE(nvml->Sample("cuda:x").has_value());
}

TEST_F(NvmlTest, ByteCountersStartAtZeroAndAddTheGrowth) {
  SetField(0, kTxField, kUnsignedLongLong, {1000, 1500, 4000});
  SetField(0, kRxField, kUnsignedLongLong, {7 * kGiB, 9 * kGiB, 9 * kGiB + 1});
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0, 0)));  // the baseline
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(500, 2 * kGiB)));
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(3000, 2 * kGiB + 1)));
  // The script's end repeats its last value: nothing more.
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(3000, 2 * kGiB + 1)));
  // Device 1 has no scripted fields: NOT_SUPPORTED, counters absent.
  std::optional<NvmlSample> other = nvml->Sample("cuda:1");
  ASSERT_TRUE(other.has_value());
  EXPECT_FALSE(other->pcie_byte_counters);
  EXPECT_EQ(other->pcie_tx_bytes, 0u);
}

TEST_F(NvmlTest, PcieBytesReadsTheCountersOnceAndReturnsTheTotals) {
  SetField(0, kTxField, kUnsignedLongLong, {1000, 1500, 4000});
  SetField(0, kRxField, kUnsignedLongLong, {10, 20, 40});
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  std::optional<PcieCounterReading> first = nvml->PcieBytes("cuda:0");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->tx_bytes, 0u);
  std::optional<PcieCounterReading> second = nvml->PcieBytes("cuda:0");
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->tx_bytes, 500u);
  EXPECT_EQ(second->rx_bytes, 10u);
  EXPECT_EQ(field_value_calls_(), 2);  // one read each
  // Sample() adds its own read to the same totals.
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(3000, 30)));
  // No counters (device 1 is unscripted: NOT_SUPPORTED), or no device.
  EXPECT_FALSE(nvml->PcieBytes("cuda:1").has_value());
  EXPECT_FALSE(nvml->PcieBytes("cpu").has_value());
}

TEST_F(NvmlTest, ThirtyTwoBitCounterWrapsIntoTheTotal) {
  // uiVal readings as driver 580 returns them; the fake fills the union's
  // other 4 bytes with 0xab, so reading it as 64 bits would give junk.
  SetField(0, kTxField, kUnsignedInt, {0xffffff00, 0x00000100, 0x80000000, 0xfffffff0, 0x10});
  SetField(0, kRxField, kUnsignedInt, {5, 5, 5, 4, 4});  // 4 after 5: a wrap, 2^32 - 1 bytes
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0, 0)));
  // tx counts from the baseline 0xffffff00.
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0x200, 0)));  // 0x100 + 0x100
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0x80000100, 0)));
  // No wrap of tx, but past 2^32 B in all; rx wrapped: 2^32 - 1 bytes.
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0x1000000f0, 0xffffffff)));
  // Its second wrap: 0x10 to it, 0x10 after it.
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0x100000110, 0xffffffff)));
}

TEST_F(NvmlTest, EveryValueTypeIsReadAsItsType) {
  struct Case {
    int value_type;
    uint64_t first, second;  // readings 1000 bytes apart, modulo the width
  };
  const Case cases[] = {
      {kDouble, 100, 1100},
      {kUnsignedInt, 0xfffffe00, 0x1e8},  // 0xfffffe00 + 1000 - 2^32
      {kUnsignedLong, 5 * kGiB, 5 * kGiB + 1000},
      {kUnsignedLongLong, 5 * kGiB, 5 * kGiB + 1000},
      {kSignedLongLong, 5 * kGiB, 5 * kGiB + 1000},
      {kSignedInt, 0x7ffffe00, 0x800001e8},  // past INT_MAX: negative, same bits
      {kUnsignedShort, 65000, (65000 + 1000) % 65536},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.value_type);
    reset_();
    SetField(0, kTxField, c.value_type, {c.first, c.second});
    SetField(0, kRxField, c.value_type, {c.first, c.first});
    std::unique_ptr<Nvml> nvml = Load();
    ASSERT_NE(nvml, nullptr);
    EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0, 0)));
    EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(1000, 0)));
  }
}

TEST_F(NvmlTest, UnknownValueTypeSkipsTheReading) {
  SetField(0, kTxField, 7, {100, 200});  // no such nvmlValueType_t
  SetField(0, kRxField, kUnsignedLongLong, {100, 200});
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), std::nullopt);
}

TEST_F(NvmlTest, NotSupportedFieldLeavesCountersAbsentAndStopsReading) {
  SetField(0, kTxField, kUnsignedLongLong, {100, 200, 300});
  SetField(0, kRxField, kUnsignedLongLong, {100, 200, 300}, {kNotSupported, 0, 0});
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  std::optional<NvmlSample> sample = nvml->Sample("cuda:0");
  ASSERT_TRUE(sample.has_value());
  EXPECT_FALSE(sample->pcie_byte_counters);
  EXPECT_EQ(sample->name, "Fake GPU 0");  // the rest of the sample is there
  EXPECT_GT(sample->pcie_rx_bytes_per_second, 0);
  EXPECT_EQ(field_value_calls_(), 1);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), std::nullopt);
  EXPECT_EQ(field_value_calls_(), 1);  // not asked again
}

TEST_F(NvmlTest, NotSupportedCallLeavesCountersAbsent) {
  SetField(0, kTxField, kUnsignedLongLong, {100, 200});
  SetField(0, kRxField, kUnsignedLongLong, {100, 200});
  const int returns[] = {kNotSupported, 0};
  set_call_returns_(returns, 2);
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), std::nullopt);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), std::nullopt);
  EXPECT_EQ(field_value_calls_(), 1);
}

TEST_F(NvmlTest, MissingFieldValuesSymbolLeavesCountersAbsent) {
  std::unique_ptr<Nvml> nvml = Load(MEGATRAIN_FAKE_NVML_NO_FIELD_VALUES);
  ASSERT_NE(nvml, nullptr);
  std::optional<NvmlSample> sample = nvml->Sample("cuda:0");
  ASSERT_TRUE(sample.has_value());
  EXPECT_EQ(sample->name, "Fake GPU 0");
  EXPECT_FALSE(sample->pcie_byte_counters);
}

TEST_F(NvmlTest, TransientErrorsSkipTheReadingAndKeepTheBaseline) {
  // Call 2: the tx field fails (GPU lost); call 3: the whole call fails
  // (and consumes no field reading); call 4 adds everything since call 1,
  // the tx wrap included.
  SetField(0, kTxField, kUnsignedInt, {0xfffff000, 0xfffff800, 0x1000}, {0, kGpuIsLost, 0});
  SetField(0, kRxField, kUnsignedInt, {10, 20, 40});
  const int returns[] = {0, 0, kUnknownError, 0};
  set_call_returns_(returns, 4);
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0, 0)));
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0, 0)));
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0, 0)));
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(0x2000, 30)));
  EXPECT_EQ(field_value_calls_(), 4);
}

TEST_F(NvmlTest, PollThreadCatchesEveryWrapBetweenSamples) {
  // 32-bit readings 3 GiB apart: between two samples the counter wraps
  // several times; only reads more often than once per wrap can add them.
  std::vector<uint64_t> tx, rx;
  for (uint64_t read = 0; read < 10; ++read) {
    tx.push_back((read * 3 * kGiB) % (uint64_t{1} << 32));
    rx.push_back((read * kGiB) % (uint64_t{1} << 32));
  }
  SetField(0, kTxField, kUnsignedInt, tx);
  SetField(0, kRxField, kUnsignedInt, rx);
  NvmlOptions options;
  options.library_path = MEGATRAIN_FAKE_NVML;
  options.pcie_counter_devices = {"cuda:0"};
  options.pcie_counter_poll_ms = 1;
  std::unique_ptr<Nvml> nvml = Nvml::Load(options);
  ASSERT_NE(nvml, nullptr);
  // No notification from the fake: poll, for at most 10 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (field_value_calls_() < 12 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(field_value_calls_(), 12);
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(27 * kGiB, 9 * kGiB)));
}

TEST_F(NvmlTest, LateReadOfAThirtyTwoBitCounterIsCounted) {
  SetField(0, kTxField, kUnsignedInt, {0, 100, 200});
  SetField(0, kRxField, kUnsignedInt, {0, 100, 200});
  SetField(1, kTxField, kUnsignedLongLong, {0, 100, 200});
  SetField(1, kRxField, kUnsignedLongLong, {0, 100, 200});
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  ASSERT_TRUE(nvml->Sample("cuda:0").has_value());
  ASSERT_TRUE(nvml->Sample("cuda:1").has_value());
  // Longer than kPcieCounterMaxGapSeconds (67 ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::optional<NvmlSample> narrow = nvml->Sample("cuda:0");
  std::optional<NvmlSample> wide = nvml->Sample("cuda:1");
  ASSERT_TRUE(narrow.has_value() && wide.has_value());
  EXPECT_EQ(narrow->pcie_tx_bytes, 100u);
  EXPECT_EQ(narrow->pcie_counter_late_reads, 1);
  EXPECT_EQ(wide->pcie_tx_bytes, 100u);
  EXPECT_EQ(wide->pcie_counter_late_reads, 0);  // a 64-bit counter cannot wrap
}

TEST_F(NvmlTest, CudaVisibleDevicesMapsCudaIndexToNvmlIndex) {
  SetField(1, kTxField, kUnsignedLongLong, {0, 42});
  SetField(1, kRxField, kUnsignedLongLong, {0, 43});
  setenv("CUDA_VISIBLE_DEVICES", "1", 1);
  std::unique_ptr<Nvml> nvml = Load();
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(nvml->CudaVisibleDeviceCount(), 1);
  EXPECT_EQ(nvml->Sample("cuda:0")->name, "Fake GPU 1");
  EXPECT_EQ(Totals(*nvml, "cuda:0"), PcieTotals(std::make_pair(42, 43)));
  EXPECT_FALSE(nvml->Sample("cuda:1").has_value());
}

TEST(WrappingByteCounterTest, FirstReadingIsTheBaseline) {
  WrappingByteCounter counter;
  EXPECT_EQ(counter.Add(123456, 64), 0u);
  EXPECT_EQ(counter.Add(123460, 64), 4u);
  EXPECT_EQ(counter.total_bytes(), 4u);
}

TEST(WrappingByteCounterTest, ThirtyTwoBitDecreaseIsOneWrap) {
  WrappingByteCounter counter;
  counter.Add(0xfffffffe, 32);
  EXPECT_EQ(counter.Add(1, 32), 3u);
  // Bits above the width are not part of the reading.
  EXPECT_EQ(counter.Add(0xabcd00000003, 32), 2u);
  EXPECT_EQ(counter.total_bytes(), 5u);
}

TEST(WrappingByteCounterTest, SixtyFourBitDecreaseIsAReset) {
  WrappingByteCounter counter;
  counter.Add(1000, 64);
  counter.Add(3000, 64);
  EXPECT_EQ(counter.Add(10, 64), 0u);  // e.g. a GPU reset: new baseline
  EXPECT_EQ(counter.Add(15, 64), 5u);
  EXPECT_EQ(counter.total_bytes(), 2005u);
}

TEST(WrappingByteCounterTest, WidthChangeSetsANewBaseline) {
  WrappingByteCounter counter;
  counter.Add(1000, 32);
  EXPECT_EQ(counter.Add(5000, 64), 0u);
  EXPECT_EQ(counter.Add(5100, 64), 100u);
  EXPECT_EQ(counter.total_bytes(), 100u);
}

}  // namespace
}  // namespace megatrain::server
