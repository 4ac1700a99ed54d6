// Tests of server/core/tfevents.h against Note [Event file format]: the
// CRC-32C test vectors of RFC 3720 (B.4), the TFRecord framing read back
// field by field, and the Event / Summary bytes decoded by protobuf's own
// parser (UnknownFieldSet: field numbers, wire types and values, with no
// TensorFlow protos), an independent reader of the wire format.
#include "server/core/tfevents.h"

#include <gmock/gmock.h>
#include <google/protobuf/unknown_field_set.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace megatrain::server {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

uint64_t ReadLittleEndian(const std::string& bytes, size_t offset, int size) {
  uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i) {
    value = value << 8 | static_cast<unsigned char>(bytes[offset + i]);
  }
  return value;
}

TEST(TfeventsTest, Crc32cMatchesTheRfc3720Vectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending), 0x46dd794eu);
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);  // the CRC catalogue's check value
}

TEST(TfeventsTest, MaskRotatesAndAddsTheConstant) {
  const uint32_t crc = Crc32c("abc");
  EXPECT_EQ(MaskedCrc32c("abc"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TfeventsTest, RecordFramesTheDataWithLengthAndMaskedCrcs) {
  const std::string data = "hello event";

  const std::string record = TfRecord(data);

  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(ReadLittleEndian(record, 0, 8), data.size());
  EXPECT_EQ(ReadLittleEndian(record, 8, 4), MaskedCrc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(ReadLittleEndian(record, 12 + data.size(), 4), MaskedCrc32c(data));
}

TEST(TfeventsTest, FileVersionEventDecodesAsEventFields) {
  UnknownFieldSet event;
  ASSERT_TRUE(event.ParseFromString(FileVersionEvent(1700000000.5)));

  ASSERT_EQ(event.field_count(), 2);
  EXPECT_EQ(event.field(0).number(), 1);  // wall_time, double
  ASSERT_EQ(event.field(0).type(), UnknownField::TYPE_FIXED64);
  double wall_time = 0;
  const uint64_t bits = event.field(0).fixed64();
  std::memcpy(&wall_time, &bits, sizeof(wall_time));
  EXPECT_EQ(wall_time, 1700000000.5);
  EXPECT_EQ(event.field(1).number(), 3);  // file_version
  EXPECT_EQ(event.field(1).length_delimited(), "brain.Event:2");
}

TEST(TfeventsTest, ScalarsEventDecodesAsStepAndSummaryValues) {
  UnknownFieldSet event;
  ASSERT_TRUE(
      event.ParseFromString(ScalarsEvent(12.0, 300, {{"train/loss", 2.5f}, {"eval/loss", 3.0f}})));

  ASSERT_EQ(event.field_count(), 3);
  EXPECT_EQ(event.field(1).number(), 2);  // step, varint
  ASSERT_EQ(event.field(1).type(), UnknownField::TYPE_VARINT);
  EXPECT_EQ(event.field(1).varint(), 300u);
  EXPECT_EQ(event.field(2).number(), 5);  // summary
  UnknownFieldSet summary;
  ASSERT_TRUE(summary.ParseFromString(event.field(2).length_delimited()));
  ASSERT_EQ(summary.field_count(), 2);
  const std::pair<const char*, float> expected[] = {{"train/loss", 2.5f}, {"eval/loss", 3.0f}};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(summary.field(i).number(), 1);  // Summary.value
    UnknownFieldSet value;
    ASSERT_TRUE(value.ParseFromString(summary.field(i).length_delimited()));
    ASSERT_EQ(value.field_count(), 2);
    EXPECT_EQ(value.field(0).number(), 1);  // tag
    EXPECT_EQ(value.field(0).length_delimited(), expected[i].first);
    EXPECT_EQ(value.field(1).number(), 2);  // simple_value, float
    ASSERT_EQ(value.field(1).type(), UnknownField::TYPE_FIXED32);
    float simple_value = 0;
    const uint32_t bits = value.field(1).fixed32();
    std::memcpy(&simple_value, &bits, sizeof(simple_value));
    EXPECT_EQ(simple_value, expected[i].second);
  }
}

}  // namespace
}  // namespace megatrain::server
