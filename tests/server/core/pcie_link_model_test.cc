// Tests of server/core/pcie_link_model.h: the link bytes predicted from payload
// bytes, and the calibration from NVML counter readings around the
// link-bandwidth probe (Note [PCIe link model]).
#include "server/core/pcie_link_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace megatrain::server {
namespace {

using ::megatrain::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

TEST(PcieLinkModelTest, EstimateAddsHeadersAndTheReadRequestsOfH2DCopies) {
  PcieLinkModel model;  // the nvidia-h200 defaults
  EXPECT_FALSE(model.calibrated);
  const PcieLinkBytes link = EstimateLinkBytes(model, 1000, 2000);
  // rx: 1.078 x 1000 of H2D; tx: 1.094 x 2000 of D2H + 0.094 x 1000 read requests.
  EXPECT_THAT(link.rx_bytes, DoubleNear(1078.0, 1e-9));
  EXPECT_THAT(link.tx_bytes, DoubleNear(2188.0 + 94.0, 1e-9));
  const PcieLinkBytes none = EstimateLinkBytes(model, -5, 0);
  EXPECT_EQ(none.rx_bytes, 0);
  EXPECT_EQ(none.tx_bytes, 0);
}

TEST(PcieLinkModelTest, CalibrationMeasuresTheFourRatios) {
  // The header's example: 1 GB each way.
  absl::StatusOr<PcieLinkModel> model = CalibratePcieLinkModel(
      1000000000, {5, 7}, {5 + 94000000, 7 + 1078000000}, {5 + 1188000000, 7 + 1078000000 + 2000});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->calibrated);
  EXPECT_THAT(model->rx_per_h2d_byte, DoubleNear(1.078, 1e-12));
  EXPECT_THAT(model->tx_per_h2d_byte, DoubleNear(0.094, 1e-12));
  EXPECT_THAT(model->tx_per_d2h_byte, DoubleNear(1.094, 1e-12));
  EXPECT_THAT(model->rx_per_d2h_byte, DoubleNear(2e-6, 1e-12));
  // Applied to the same copies, the model gives back the counters' growth.
  const PcieLinkBytes link = EstimateLinkBytes(*model, 1000000000, 1000000000);
  EXPECT_THAT(link.tx_bytes, DoubleNear(1188000000.0, 1e-3));
  EXPECT_THAT(link.rx_bytes, DoubleNear(1078002000.0, 1e-3));
}

TEST(PcieLinkModelTest, CalibrationRefusesImplausibleReadings) {
  EXPECT_THAT(CalibratePcieLinkModel(1000, {0, 0}, {0, 0}, {0, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1 MiB")));
  const int64_t gb = 1000000000;
  EXPECT_THAT(CalibratePcieLinkModel(gb, {10, 10}, {5, 10}, {5, 10}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("went backwards")));
  // RX short of the payload: the counter lost a wrap.
  EXPECT_THAT(
      CalibratePcieLinkModel(gb, {0, 0}, {94000000, 900000000}, {1188000000, 900000000}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rx_per_h2d_byte measured 0.900")));
  // Heavy TX during the H2D copies: another process used the link.
  EXPECT_THAT(
      CalibratePcieLinkModel(gb, {0, 0}, {800000000, 1078000000}, {1894000000, 1078000000}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("tx_per_h2d_byte measured 0.800")));
}

}  // namespace
}  // namespace megatrain::server
