// Device facts: the CPU has no link to measure; on a CUDA machine (label
// gpu) the pinned copy bandwidth is measured in both directions.
#include "engine/runtime/device_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(MeasureLinkBandwidthTest, CpuHasNoLink) {
  EXPECT_THAT(MeasureLinkBandwidth("cpu"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no host link")));
}

TEST(MeasureLinkBandwidthTest, RefusesTinyCopies) {
  EXPECT_THAT(MeasureLinkBandwidth("cuda", 16, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes_per_copy")));
}

TEST(MeasureLinkBandwidthTest, MeasuresBothDirectionsOnCuda) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  int hook_calls = 0;
  auto m = MeasureLinkBandwidth("cuda", 64 << 20, 4, [&] { ++hook_calls; });
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(hook_calls, 1);                                      // between the directions, once
  EXPECT_EQ(m->bytes_copied_each_way, int64_t{5} * (64 << 20));  // warm-up + 4
  // Any PCIe gen3 x16 link or better moves > 5 GB/s from pinned memory;
  // pageable memory would not (Note [Pinned host memory]).
  EXPECT_GT(m->h2d_bytes_per_second, 5e9);
  EXPECT_GT(m->d2h_bytes_per_second, 5e9);
  RecordProperty("h2d_gb_per_s", std::to_string(m->h2d_bytes_per_second / 1e9));
  RecordProperty("d2h_gb_per_s", std::to_string(m->d2h_bytes_per_second / 1e9));
}

}  // namespace
}  // namespace megatrain::engine
