// PcieLinkModel: from the payload bytes the engine copies (H2D, D2H) to the
// bytes that cross the GPU's PCIe link, which is what NVML's byte counters
// count. Calibrated at daemon start from the pinned-copy bandwidth probe.
//
// Note [PCIe link model]
// PCIe carries data in transaction-layer packets (TLPs). A copy's payload
// travels in packets of at most the Max Payload Size (256 B on the H100 and
// H200 hosts measured), each with its header, sequence number, LCRC and
// framing on top (~20 B); and a host-to-device copy is pulled by the GPU's
// copy engine, which sends one read-request packet (~24 B) towards the host
// for every completion it asks for. So, with H and D the payload bytes of
// H2D and D2H copies, the link carries
//   rx (host -> device) = rx_per_h2d_byte * H + rx_per_d2h_byte * D
//   tx (device -> host) = tx_per_d2h_byte * D + tx_per_h2d_byte * H
// On an nvidia-h200 (PCIe 5 x16, driver 580) a pinned copy of N bytes added
// 1.078 N to RX and 0.094 N to TX (H2D) and 1.094 N to TX and ~0 to RX (D2H)
// (docs/performance.md): the defaults below. The daemon measures the four
// ratios again at start-up where NVML's byte counters exist
// (CalibratePcieLinkModel), by reading the counters around each direction
// of the link-bandwidth probe, and applies them to every step's payload
// bytes (megatrain_pcie_link_bytes_estimate_total). The estimate agreeing
// with NVML's counters during training is the check that the daemon's own
// byte counts are complete: a copy it does not count, or traffic from
// another process, shows as a gap. Source: PCI Express Base Specification
// 5.0, section 2 (TLP format, Max_Payload_Size, Max_Read_Request_Size).
#ifndef MEGATRAIN_SERVER_PCIE_LINK_MODEL_H_
#define MEGATRAIN_SERVER_PCIE_LINK_MODEL_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace megatrain::server {

// Link bytes per payload byte of each kind of copy (Note [PCIe link model]).
// A plain value; thread-compatible.
struct PcieLinkModel {
  double rx_per_h2d_byte = 1.078;  // data completions, headers included
  double tx_per_h2d_byte = 0.094;  // the copy engine's read requests
  double tx_per_d2h_byte = 1.094;  // posted writes, headers included
  double rx_per_d2h_byte = 0.0;    // flow control only (not seen in counters)
  // True when measured on this device at start-up; false: the defaults.
  bool calibrated = false;
};

// Bytes on the link, one direction each.
struct PcieLinkBytes {
  double tx_bytes = 0;  // device -> host
  double rx_bytes = 0;  // host -> device
};

// Cumulative NVML PCIe byte counters of one device at one moment
// (NvmlSample::pcie_tx_bytes / pcie_rx_bytes).
struct PcieCounterReading {
  uint64_t tx_bytes = 0;
  uint64_t rx_bytes = 0;
};

// The link bytes `model` predicts for `h2d_bytes` and `d2h_bytes` of payload
// (bytes, >= 0; negative counts as 0).
PcieLinkBytes EstimateLinkBytes(const PcieLinkModel& model, int64_t h2d_bytes, int64_t d2h_bytes);

// Measures the model from NVML's counters read `before` the H2D copies of
// the probe, `between` them and its D2H copies, and `after`, each direction
// having copied `bytes_each_way` bytes of payload. Errors:
// INVALID_ARGUMENT when bytes_each_way < 1 MiB (too few to measure);
// FAILED_PRECONDITION when a counter went backwards, or a data ratio
// (rx_per_h2d, tx_per_d2h) is outside [1, 1.5] or a cross ratio outside
// [0, 0.5]: counters that missed a wrap or saw other traffic; the message
// names the ratio and its value.
//
// Example:
//   // 1 GB each way: H2D added 1.078 GB to RX and 0.094 GB to TX, then
//   // D2H added 1.094 GB to TX.
//   absl::StatusOr<PcieLinkModel> model = CalibratePcieLinkModel(
//       1000000000, {0, 0}, {94000000, 1078000000}, {1188000000, 1078000000});
//   // model->rx_per_h2d_byte == 1.078, tx_per_h2d_byte == 0.094,
//   // tx_per_d2h_byte == 1.094, rx_per_d2h_byte == 0
absl::StatusOr<PcieLinkModel> CalibratePcieLinkModel(int64_t bytes_each_way,
                                                     const PcieCounterReading& before,
                                                     const PcieCounterReading& between,
                                                     const PcieCounterReading& after);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_PCIE_LINK_MODEL_H_
