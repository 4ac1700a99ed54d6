// See pcie_link_model.h.
#include "server/core/pcie_link_model.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace megatrain::server {

PcieLinkBytes EstimateLinkBytes(const PcieLinkModel& model, int64_t h2d_bytes, int64_t d2h_bytes) {
  const double h2d = static_cast<double>(std::max<int64_t>(h2d_bytes, 0));
  const double d2h = static_cast<double>(std::max<int64_t>(d2h_bytes, 0));
  PcieLinkBytes link;
  link.rx_bytes = model.rx_per_h2d_byte * h2d + model.rx_per_d2h_byte * d2h;
  link.tx_bytes = model.tx_per_d2h_byte * d2h + model.tx_per_h2d_byte * h2d;
  return link;
}

absl::StatusOr<PcieLinkModel> CalibratePcieLinkModel(int64_t bytes_each_way,
                                                     const PcieCounterReading& before,
                                                     const PcieCounterReading& between,
                                                     const PcieCounterReading& after) {
  if (bytes_each_way < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PCIe link model: need at least 1 MiB copied each way, got %d bytes", bytes_each_way));
  }
  if (between.tx_bytes < before.tx_bytes || between.rx_bytes < before.rx_bytes ||
      after.tx_bytes < between.tx_bytes || after.rx_bytes < between.rx_bytes) {
    return absl::FailedPreconditionError("PCIe link model: an NVML byte counter went backwards");
  }
  const double payload = static_cast<double>(bytes_each_way);
  PcieLinkModel model;
  model.rx_per_h2d_byte = static_cast<double>(between.rx_bytes - before.rx_bytes) / payload;
  model.tx_per_h2d_byte = static_cast<double>(between.tx_bytes - before.tx_bytes) / payload;
  model.tx_per_d2h_byte = static_cast<double>(after.tx_bytes - between.tx_bytes) / payload;
  model.rx_per_d2h_byte = static_cast<double>(after.rx_bytes - between.rx_bytes) / payload;
  model.calibrated = true;
  struct Check {
    const char* name;
    double value;
    double low;
    double high;
  };
  // A data ratio below 1 means the counter missed bytes (a lost wrap); far
  // above, or a large cross ratio, means other traffic shared the link.
  for (const Check& check : {Check{"rx_per_h2d_byte", model.rx_per_h2d_byte, 1.0, 1.5},
                             Check{"tx_per_d2h_byte", model.tx_per_d2h_byte, 1.0, 1.5},
                             Check{"tx_per_h2d_byte", model.tx_per_h2d_byte, 0.0, 0.5},
                             Check{"rx_per_d2h_byte", model.rx_per_d2h_byte, 0.0, 0.5}}) {
    if (check.value < check.low || check.value > check.high) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "PCIe link model: %s measured %.3f, outside [%.1f, %.1f] (a missed counter wrap, or "
          "other traffic on the link during the probe)",
          check.name, check.value, check.low, check.high));
    }
  }
  return model;
}

}  // namespace megatrain::server
