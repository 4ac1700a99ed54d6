// See tfevents.h, Note [Event file format].
#include "server/core/tfevents.h"

#include <array>
#include <cstring>

namespace megatrain::server {
namespace {

// Byte-at-a-time table of the reflected CRC-32C polynomial.
std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    table[byte] = crc;
  }
  return table;
}

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// Protobuf wire format (protobuf.dev/programming-guides/encoding).
void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}
void AppendTag(int field, int wire_type, std::string* out) {
  AppendVarint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type), out);
}
void AppendBytesField(int field, absl::string_view bytes, std::string* out) {
  AppendTag(field, /*wire_type=*/2, out);
  AppendVarint(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
}

// Event fields 1 (wall_time, double) and 2 (step, int64).
std::string EventHeader(double wall_time_seconds, int64_t step) {
  std::string event;
  uint64_t bits = 0;
  std::memcpy(&bits, &wall_time_seconds, sizeof(bits));
  AppendTag(1, /*wire_type=*/1, &event);
  AppendLittleEndian(bits, 8, &event);
  if (step != 0) {
    AppendTag(2, /*wire_type=*/0, &event);
    AppendVarint(static_cast<uint64_t>(step), &event);
  }
  return event;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  static const std::array<uint32_t, 256> kTable = MakeCrc32cTable();
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) crc = kTable[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecord(absl::string_view data) {
  std::string length;
  AppendLittleEndian(data.size(), 8, &length);
  std::string record = length;
  AppendLittleEndian(MaskedCrc32c(length), 4, &record);
  record.append(data.data(), data.size());
  AppendLittleEndian(MaskedCrc32c(data), 4, &record);
  return record;
}

std::string FileVersionEvent(double wall_time_seconds) {
  std::string event = EventHeader(wall_time_seconds, 0);
  AppendBytesField(3, "brain.Event:2", &event);
  return event;
}

std::string ScalarsEvent(double wall_time_seconds, int64_t step,
                         const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string summary_value;
    AppendBytesField(1, tag, &summary_value);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    AppendTag(2, /*wire_type=*/5, &summary_value);
    AppendLittleEndian(bits, 4, &summary_value);
    AppendBytesField(1, summary_value, &summary);
  }
  std::string event = EventHeader(wall_time_seconds, step);
  AppendBytesField(5, summary, &event);
  return event;
}

}  // namespace megatrain::server
