// Tests of engine/formats/safetensors.h and engine/fs/mapped_file.h: writer -> reader
// round trips, dtype conversion, sharded checkpoints, and one test per kind
// of corrupt file (each asserting DATA_LOSS and the message naming the
// problem).
#include "engine/formats/safetensors.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/runtime/bf16.h"
#include "engine/fs/mapped_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace megatrain::engine {
namespace {

using ::megatrain::testing::IsOk;
using ::megatrain::testing::ListDir;
using ::megatrain::testing::StatusIs;
using ::megatrain::testing::WriteFileBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A safetensors file by hand: 8-byte length, `json`, then `data_bytes`.
std::string RawSafetensors(const std::string& json, const std::string& data_bytes) {
  const uint64_t n = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + json + data_bytes;
}

absl::StatusOr<SafetensorsHeader> ParseBytes(const std::string& file_bytes,
                                             std::string_view source = "model.safetensors") {
  return ParseSafetensorsHeader(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(file_bytes.data()),
                                file_bytes.size()),
      file_bytes.size(), source);
}

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

// ---------------------------------------------------------------------------
// MappedFile

TEST(MappedFileTest, OpenEmptyFileGivesEmptySpan) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/empty";
  WriteFileBytes(path, "");
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->size(), 0u);
  EXPECT_TRUE(file->bytes().empty());
  EXPECT_EQ(file->data(), nullptr);
}

TEST(MappedFileTest, OpenMissingFileIsNotFoundNamingPath) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/missing.bin";
  EXPECT_THAT(MappedFile::Open(path).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(MappedFileTest, OpenDirectoryIsInvalidArgument) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  EXPECT_THAT(MappedFile::Open(dir).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST(MappedFileTest, MoveKeepsTheMappedBytes) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/data";
  WriteFileBytes(path, "hello");
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_THAT(file, IsOk());
  const uint8_t* data = file->data();
  MappedFile moved = *std::move(file);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(moved.data()), moved.size()), "hello");
  EXPECT_EQ(moved.path(), path);
}

TEST(AtomicFileWriterTest, UncommittedWriterLeavesNoFile) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  {
    absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(dir + "/out.bin");
    ASSERT_THAT(writer, IsOk());
    const uint8_t bytes[3] = {1, 2, 3};
    ASSERT_THAT(writer->Append(bytes), IsOk());
  }
  EXPECT_THAT(ListDir(dir), ::testing::IsEmpty());
}

TEST(AtomicFileWriterTest, CreateInMissingDirectoryIsNotFound) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/no/such/dir/out.bin";
  EXPECT_THAT(AtomicFileWriter::Create(path).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

// ---------------------------------------------------------------------------
// Writer -> reader round trips

TEST(SafetensorsWriterTest, Float32RoundTripIsBitIdentical) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  std::vector<float> weight = RandomFloats(3 * 5, /*seed=*/1);
  // Values whose bits must survive untouched: signed zero, denormal, inf and
  // a NaN with a payload.
  weight[0] = -0.0f;
  weight[1] = std::numeric_limits<float>::denorm_min();
  weight[2] = std::numeric_limits<float>::infinity();
  const uint32_t nan_bits = 0x7fc01234u;
  std::memcpy(&weight[3], &nan_bits, sizeof(float));
  const float scalar = 42.5f;

  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddFloat32("layers.0.weight", SafetensorsDtype::kF32, {3, 5}, weight.data()),
              IsOk());
  ASSERT_THAT(writer->AddFloat32("scale", SafetensorsDtype::kF32, {}, &scalar), IsOk());
  ASSERT_THAT(writer->AddFloat32("empty", SafetensorsDtype::kF32, {0, 4}, nullptr), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->header().data_offset_bytes % 8, 0u);

  absl::StatusOr<const SafetensorsTensorInfo*> info = file->Find("layers.0.weight");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ((*info)->dtype, SafetensorsDtype::kF32);
  EXPECT_THAT((*info)->shape, ElementsAre(3, 5));
  absl::Span<const uint8_t> raw = file->Data(**info);
  ASSERT_EQ(raw.size(), weight.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(raw.data(), weight.data(), raw.size()), 0);

  std::vector<float> read(weight.size());
  ASSERT_THAT(
      file->ReadAsFloat32("layers.0.weight", read.data(), static_cast<int64_t>(read.size())),
      IsOk());
  for (size_t i = 0; i < weight.size(); ++i) {
    EXPECT_EQ(FloatBits(read[i]), FloatBits(weight[i])) << "element " << i;
  }
  float read_scalar = 0;
  ASSERT_THAT(file->ReadAsFloat32("scale", &read_scalar, 1), IsOk());
  EXPECT_EQ(read_scalar, scalar);
  absl::StatusOr<const SafetensorsTensorInfo*> empty = file->Find("empty");
  ASSERT_THAT(empty, IsOk());
  EXPECT_EQ((*empty)->num_elements, 0);
  EXPECT_EQ((*empty)->size_bytes(), 0u);
}

TEST(SafetensorsWriterTest, Bf16RoundingEqualsFloatToBf16) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  // More elements than one conversion chunk (2^17), so chunking is covered.
  std::vector<float> weight = RandomFloats(300'001, /*seed=*/2);
  weight[0] = 1.00390625f;  // halfway between two bf16 values: ties to even
  weight[1] = 1.01171875f;  // halfway, rounds up to even

  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddFloat32("w", SafetensorsDtype::kBF16,
                                 {static_cast<int64_t>(weight.size())}, weight.data()),
              IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  absl::StatusOr<absl::Span<const uint8_t>> raw = file->Data("w");
  ASSERT_THAT(raw, IsOk());
  ASSERT_EQ(raw->size(), weight.size() * 2);
  std::vector<float> read(weight.size());
  ASSERT_THAT(file->ReadAsFloat32("w", read.data(), static_cast<int64_t>(read.size())), IsOk());
  for (size_t i = 0; i < weight.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, raw->data() + 2 * i, 2);
    ASSERT_EQ(bits, FloatToBf16(weight[i])) << "element " << i;
    ASSERT_EQ(FloatBits(read[i]), FloatBits(Bf16ToFloat(bits))) << "element " << i;
  }
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(weight[0])), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(weight[1])), 1.015625f);
}

TEST(SafetensorsWriterTest, OrdersDataByElementSizeSoEveryTensorIsAligned) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  const std::vector<uint8_t> bytes3 = {1, 2, 3};
  const std::vector<float> f3 = {1, 2, 3};
  const std::vector<uint8_t> f64(8 * 2, 0);
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddBytes("a_u8", SafetensorsDtype::kU8, {3}, bytes3), IsOk());
  ASSERT_THAT(writer->AddFloat32("b_bf16", SafetensorsDtype::kBF16, {3}, f3.data()), IsOk());
  ASSERT_THAT(writer->AddFloat32("c_f32", SafetensorsDtype::kF32, {3}, f3.data()), IsOk());
  ASSERT_THAT(writer->AddBytes("d_f64", SafetensorsDtype::kF64, {2}, f64), IsOk());
  ASSERT_THAT(writer->SetMetadata("step", "100"), IsOk());
  EXPECT_EQ(writer->data_size_bytes(), 3u + 6u + 12u + 16u);
  ASSERT_THAT(writer->Finish(), IsOk());

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  std::vector<std::string> order;
  for (const SafetensorsTensorInfo& info : file->tensors()) {
    order.push_back(info.name);
    EXPECT_EQ((file->header().data_offset_bytes + info.data_begin) %
                  SafetensorsDtypeSizeBytes(info.dtype),
              0u)
        << info.name;
  }
  EXPECT_THAT(order, ElementsAre("d_f64", "c_f32", "b_bf16", "a_u8"));
  EXPECT_EQ(file->metadata().at("step"), "100");
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

TEST(SafetensorsWriterTest, UnfinishedWriterLeavesNoFile) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  const float value = 1.0f;
  {
    absl::StatusOr<SafetensorsWriter> writer =
        SafetensorsWriter::Create(dir + "/model.safetensors");
    ASSERT_THAT(writer, IsOk());
    ASSERT_THAT(writer->AddFloat32("x", SafetensorsDtype::kF32, {1}, &value), IsOk());
  }
  EXPECT_THAT(ListDir(dir), ::testing::IsEmpty());
}

TEST(SafetensorsWriterTest, RefusesBadTensors) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  const float values[4] = {1, 2, 3, 4};
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddFloat32("x", SafetensorsDtype::kF32, {4}, values), IsOk());
  EXPECT_THAT(writer->AddFloat32("x", SafetensorsDtype::kF32, {4}, values),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'x'")));
  EXPECT_THAT(writer->AddFloat32("y", SafetensorsDtype::kI32, {4}, values),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("I32")));
  EXPECT_THAT(writer->AddFloat32("z", SafetensorsDtype::kF32, {2, -2}, values),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape[1] = -2")));
  EXPECT_THAT(writer->AddFloat32("__metadata__", SafetensorsDtype::kF32, {4}, values),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
  EXPECT_THAT(writer->AddFloat32("bad\xff", SafetensorsDtype::kF32, {4}, values),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UTF-8")));
  const std::vector<uint8_t> five_bytes(5);
  EXPECT_THAT(writer->AddBytes("w", SafetensorsDtype::kF16, {2}, five_bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("5 bytes given, F16 x shape [2] needs 4")));
  ASSERT_THAT(writer->Finish(), IsOk());
  EXPECT_THAT(writer->Finish(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("twice")));
  EXPECT_THAT(writer->AddFloat32("late", SafetensorsDtype::kF32, {1}, values),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("after Finish")));
}

// ---------------------------------------------------------------------------
// Conversion

// Reference binary16 decoding straight from the IEEE-754 definition, to
// check Fp16BitsToFloat on all 65536 inputs.
float ReferenceFp16(uint16_t bits) {
  const int sign = (bits >> 15) ? -1 : 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity()
                         : std::numeric_limits<float>::quiet_NaN();
  }
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(Fp16BitsToFloatTest, MatchesIeeeDefinitionForAllInputs) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float expected = ReferenceFp16(static_cast<uint16_t>(bits));
    const float actual = Fp16BitsToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(actual)) << std::hex << bits;
    } else {
      // Exact: every binary16 value is representable in binary32.
      ASSERT_EQ(FloatBits(actual), FloatBits(expected)) << std::hex << bits;
    }
  }
}

TEST(SafetensorsFileTest, ReadAsFloat32ConvertsF16) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff, 0x0001,
                                        0x0400, 0x7c00, 0x8000, 0x3555};
  const std::vector<float> expected = {1.0f,
                                       -2.0f,
                                       65504.0f,
                                       std::ldexp(1.0f, -24),
                                       std::ldexp(1.0f, -14),
                                       std::numeric_limits<float>::infinity(),
                                       -0.0f,
                                       0.333251953125f};
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddBytes(
                  "h", SafetensorsDtype::kF16, {2, 4},
                  absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(halves.data()), 16)),
              IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  std::vector<float> read(8);
  ASSERT_THAT(file->ReadAsFloat32("h", read.data(), 8), IsOk());
  for (size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(FloatBits(read[i]), FloatBits(expected[i])) << "element " << i;
  }
}

TEST(SafetensorsFileTest, ReadAsFloat32ConvertsBf16) {
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc040, 0x7f80, 0x0001};
  const std::vector<float> expected = {1.0f, -3.0f, std::numeric_limits<float>::infinity(),
                                       std::ldexp(1.0f, -133)};
  std::vector<float> out(4);
  ASSERT_THAT(
      ConvertToFloat32(SafetensorsDtype::kBF16,
                       absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bf16.data()), 8),
                       absl::MakeSpan(out)),
      IsOk());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(FloatBits(out[i]), FloatBits(expected[i])) << "element " << i;
  }
}

TEST(SafetensorsFileTest, ReadAsFloat32IsUnimplementedForIntegerDtypes) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  const std::vector<uint8_t> ints(4 * 3, 7);
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddBytes("ids", SafetensorsDtype::kI32, {3}, ints), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  std::vector<float> out(3);
  EXPECT_THAT(file->ReadAsFloat32("ids", out.data(), 3),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("dtype I32")));
}

TEST(SafetensorsFileTest, ReadAsFloat32RefusesWrongElementCount) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  const float values[6] = {};
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddFloat32("w", SafetensorsDtype::kF32, {2, 3}, values), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  std::vector<float> out(5);
  EXPECT_THAT(file->ReadAsFloat32("w", out.data(), 5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds 5 floats, tensor has 6 elements")));
}

TEST(SafetensorsFileTest, FindMissingTensorIsNotFound) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  const float value = 1.0f;
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddFloat32("x", SafetensorsDtype::kF32, {1}, &value), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  EXPECT_FALSE(file->Contains("lm_head.weight"));
  EXPECT_THAT(file->Find("lm_head.weight").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no tensor 'lm_head.weight'")));
  float out;
  EXPECT_THAT(file->ReadAsFloat32("lm_head.weight", &out, 1),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(SafetensorsFileTest, OpenMissingFileIsNotFound) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  EXPECT_THAT(SafetensorsFile::Open(path).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

// ---------------------------------------------------------------------------
// Corrupt files: each is DATA_LOSS naming the file and the problem.

TEST(ParseSafetensorsHeaderTest, AcceptsHandWrittenFile) {
  const std::string bytes =
      RawSafetensors(R"({"b":{"dtype":"F16","shape":[1],"data_offsets":[4,6]},)"
                     R"("a":{"dtype":"I32","shape":[],"data_offsets":[0,4]},)"
                     R"("__metadata__":{"k":"v"}}   )",
                     std::string(6, '\1'));
  absl::StatusOr<SafetensorsHeader> header = ParseBytes(bytes);
  ASSERT_THAT(header, IsOk());
  ASSERT_EQ(header->tensors.size(), 2u);
  EXPECT_EQ(header->tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(header->tensors[0].num_elements, 1);
  EXPECT_EQ(header->tensors[1].name, "b");
  EXPECT_EQ(header->metadata.at("k"), "v");
  EXPECT_EQ(header->data_size_bytes, 6u);
}

TEST(ParseSafetensorsHeaderTest, TruncatedFileIsDataLoss) {
  EXPECT_THAT(
      ParseBytes(std::string("\x05\x00\x00", 3)).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("model.safetensors: file is 3 bytes")));
  EXPECT_THAT(ParseBytes("").status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("0 bytes")));
}

TEST(ParseSafetensorsHeaderTest, HeaderLengthLargerThanFileIsDataLoss) {
  std::string bytes = RawSafetensors("{}", "");
  bytes[0] = 100;  // claims a 100-byte header in a 10-byte file
  EXPECT_THAT(
      ParseBytes(bytes).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("header length 100 bytes (at offset 0) runs "
                                                      "past the end of the 10-byte file")));
}

TEST(ParseSafetensorsHeaderTest, HeaderLengthAboveCapIsDataLoss) {
  std::string bytes = RawSafetensors("{}", "");
  const uint64_t huge = kSafetensorsMaxHeaderBytes + 1;
  std::memcpy(bytes.data(), &huge, 8);
  EXPECT_THAT(ParseBytes(bytes).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("limit")));
}

TEST(ParseSafetensorsHeaderTest, ShortPrefixIsOutOfRange) {
  const std::string bytes = RawSafetensors("{}      ", "");
  EXPECT_THAT(ParseSafetensorsHeader(
                  absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), 12),
                  bytes.size(), "model.safetensors")
                  .status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("need the first 16 bytes")));
}

TEST(ParseSafetensorsHeaderTest, BadJsonIsDataLoss) {
  EXPECT_THAT(
      ParseBytes(RawSafetensors(R"({"a": {"dtype": "F32",)", "")).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("model.safetensors: header (offset 8, 22 "
                                                      "bytes): invalid JSON")));
  EXPECT_THAT(ParseBytes(RawSafetensors(R"([1, 2])", "")).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not start with '{'")));
  EXPECT_THAT(ParseBytes(RawSafetensors("{\"\xff\": 1}", "")).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("invalid JSON")));
}

TEST(ParseSafetensorsHeaderTest, UnknownDtypeIsDataLoss) {
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})",
                                        std::string(4, '\0')))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tensor 'w': unknown dtype 'F33'")));
}

TEST(ParseSafetensorsHeaderTest, OffsetsOutOfRangeAreDataLoss) {
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                        std::string(4, '\0')))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("tensor 'w': data_offsets [0, 8] run past the data "
                                 "section of 4 bytes")));
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
                                        std::string(4, '\0')))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("end before they begin")));
  EXPECT_THAT(
      ParseBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-1,3]}})",
                                std::string(4, '\0')))
          .status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\"data_offsets\" is not [begin, end]")));
}

TEST(ParseSafetensorsHeaderTest, OverlappingTensorsAreDataLoss) {
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                        std::string(12, '\0')))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("tensor 'b': data_offsets [4, 12] overlap tensor "
                                 "'a' [0, 8]")));
}

TEST(ParseSafetensorsHeaderTest, HoleOrTrailingBytesAreDataLoss) {
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                        std::string(12, '\0')))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("tensor 'b': data_offsets [8, 12] leave a hole of 4 "
                                 "bytes after tensor 'a'")));
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                        std::string(6, '\0')))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("2 bytes after the last tensor")));
}

TEST(ParseSafetensorsHeaderTest, ShapeTimesDtypeMismatchIsDataLoss) {
  EXPECT_THAT(
      ParseBytes(
          RawSafetensors(R"({"lm_head.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                         std::string(8, '\0')))
          .status(),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("model.safetensors: tensor 'lm_head.weight': 8 bytes "
                         "on disk, dtype x shape needs 12")));
}

TEST(ParseSafetensorsHeaderTest, BadShapesAreDataLoss) {
  EXPECT_THAT(
      ParseBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", ""))
          .status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shape[0] = -1 is not a non-negative")));
  EXPECT_THAT(
      ParseBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})", ""))
          .status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shape[0] = 1.5")));
  // 2^32 x 2^32 elements overflows 64 bits.
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                                        R"("data_offsets":[0,0]}})",
                                        ""))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("overflows 64 bits")));
  // 2^62 elements fit, but x 4 bytes does not.
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"w":{"dtype":"F32","shape":[4611686018427387904],)"
                                        R"("data_offsets":[0,0]}})",
                                        ""))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("overflows 64 bits")));
}

TEST(ParseSafetensorsHeaderTest, DuplicateTensorNameIsDataLoss) {
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                        R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                        std::string(2, '\0')))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("duplicate JSON key 'a'")));
}

TEST(ParseSafetensorsHeaderTest, BadEntriesAreDataLoss) {
  EXPECT_THAT(
      ParseBytes(RawSafetensors(R"({"w": 3})", "")).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tensor 'w': entry is a JSON number")));
  EXPECT_THAT(ParseBytes(RawSafetensors(R"({"w": {"dtype": "F32", "shape": []}})", "")).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("needs \"dtype\"")));
  EXPECT_THAT(
      ParseBytes(RawSafetensors(R"({"__metadata__": {"format": 1}})", "")).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("value of 'format' is a JSON number")));
  // Deep nesting is refused before it costs much.
  EXPECT_THAT(ParseBytes(RawSafetensors(
                             "{\"w\":" + std::string(100, '[') + std::string(100, ']') + "}", ""))
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("nested deeper")));
}

TEST(SafetensorsFileTest, TruncatedFileOnDiskIsDataLossNamingIt) {
  const std::string path = testing::MakeTempDir("safetensors_test") + "/model.safetensors";
  const std::vector<float> values(16, 1.0f);
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->AddFloat32("w", SafetensorsDtype::kF32, {16}, values.data()), IsOk());
  ASSERT_THAT(writer->Finish(), IsOk());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  ASSERT_EQ(::truncate(path.c_str(), st.st_size - 4), 0);
  EXPECT_THAT(
      SafetensorsFile::Open(path).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path + ": tensor 'w': data_offsets [0, 64] "
                                                             "run past the data section of 60")));
}

// ---------------------------------------------------------------------------
// Sharded checkpoints

void WriteShard(const std::string& path,
                const std::vector<std::pair<std::string, std::vector<float>>>& tensors) {
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(path);
  ASSERT_THAT(writer, IsOk());
  for (const auto& [name, values] : tensors) {
    ASSERT_THAT(writer->AddFloat32(name, SafetensorsDtype::kF32,
                                   {static_cast<int64_t>(values.size())}, values.data()),
                IsOk());
  }
  ASSERT_THAT(writer->Finish(), IsOk());
}

constexpr char kIndexJson[] = R"({
  "metadata": {"total_size": 20},
  "weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors",
    "lm_head.weight": "model-00002-of-00002.safetensors"
  }
})";

TEST(ParseSafetensorsIndexTest, ParsesWeightMapAndTotalSize) {
  absl::StatusOr<SafetensorsIndex> index =
      ParseSafetensorsIndex(kIndexJson, "model.safetensors.index.json");
  ASSERT_THAT(index, IsOk());
  EXPECT_EQ(index->total_size_bytes, 20u);
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_THAT(index->ShardFiles(),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
}

TEST(ParseSafetensorsIndexTest, RefusesMalformedIndex) {
  EXPECT_THAT(
      ParseSafetensorsIndex(R"({"metadata": {}})", "idx.json").status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("idx.json: \"weight_map\" is missing")));
  EXPECT_THAT(
      ParseSafetensorsIndex(R"({"weight_map": {"w": "../../etc/passwd"}})", "idx.json").status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is not a file name next to the index")));
  EXPECT_THAT(ParseSafetensorsIndex(R"({"metadata": {"total_size": -1}, "weight_map": {"w": "a"}})",
                                    "idx.json")
                  .status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("total_size")));
  EXPECT_THAT(ParseSafetensorsIndex(R"({"weight_map": {"w": 5}})", "idx.json").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("weight_map['w'] is a JSON number")));
  EXPECT_THAT(ParseSafetensorsIndex("{", "idx.json").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("invalid JSON")));
}

TEST(SafetensorsModelTest, OpensShardedCheckpointThroughIndex) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  WriteShard(dir + "/model-00001-of-00002.safetensors", {{"model.embed_tokens.weight", {1, 2, 3}}});
  WriteShard(dir + "/model-00002-of-00002.safetensors",
             {{"model.norm.weight", {4}}, {"lm_head.weight", {5}}});
  WriteFileBytes(dir + "/model.safetensors.index.json", kIndexJson);

  absl::StatusOr<SafetensorsModel> model = SafetensorsModel::Open(dir);
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ(model->files().size(), 2u);
  EXPECT_EQ(model->num_tensors(), 3u);
  EXPECT_EQ(model->tensor_bytes(), 20u);
  ASSERT_TRUE(model->index().has_value());
  EXPECT_THAT(model->TensorNames(),
              ElementsAre("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"));
  absl::StatusOr<SafetensorsModel::TensorRef> ref = model->Find("lm_head.weight");
  ASSERT_THAT(ref, IsOk());
  EXPECT_THAT(ref->file->path(), HasSubstr("model-00002-of-00002"));
  std::vector<float> embed(3);
  ASSERT_THAT(model->ReadAsFloat32("model.embed_tokens.weight", embed.data(), 3), IsOk());
  EXPECT_THAT(embed, ElementsAre(1, 2, 3));
  EXPECT_THAT(
      model->Find("model.layers.0.mlp.up_proj.weight").status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no tensor 'model.layers.0.mlp.up_proj")));
}

TEST(SafetensorsModelTest, OpensSingleFileModel) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  WriteShard(dir + "/model.safetensors", {{"a", {1, 2}}, {"b", {3}}});
  absl::StatusOr<SafetensorsModel> model = SafetensorsModel::Open(dir);
  ASSERT_THAT(model, IsOk());
  EXPECT_FALSE(model->index().has_value());
  EXPECT_THAT(model->TensorNames(), ElementsAre("a", "b"));
  EXPECT_TRUE(model->Contains("b"));
}

TEST(SafetensorsModelTest, EmptyDirectoryIsNotFoundNamingBothFiles) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  EXPECT_THAT(
      SafetensorsModel::Open(dir).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("neither model.safetensors nor "
                                                      "model.safetensors.index.json exists")));
}

TEST(SafetensorsModelTest, MissingShardIsNotFound) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  WriteShard(dir + "/model-00001-of-00002.safetensors", {{"model.embed_tokens.weight", {1, 2, 3}}});
  WriteFileBytes(dir + "/model.safetensors.index.json", kIndexJson);
  EXPECT_THAT(SafetensorsModel::Open(dir).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model-00002-of-00002.safetensors")));
}

TEST(SafetensorsModelTest, IndexEntryMissingFromShardIsDataLoss) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  WriteShard(dir + "/model-00001-of-00002.safetensors", {{"model.embed_tokens.weight", {1, 2, 3}}});
  WriteShard(dir + "/model-00002-of-00002.safetensors", {{"model.norm.weight", {4}}});
  WriteFileBytes(dir + "/model.safetensors.index.json", kIndexJson);
  EXPECT_THAT(
      SafetensorsModel::Open(dir).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("index maps tensor 'lm_head.weight' to "
                                                      "model-00002-of-00002.safetensors, which has "
                                                      "no such tensor")));
}

TEST(SafetensorsModelTest, ShardTensorMappedElsewhereIsDataLoss) {
  const std::string dir = testing::MakeTempDir("safetensors_test");
  WriteShard(dir + "/model-00001-of-00002.safetensors",
             {{"model.embed_tokens.weight", {1, 2, 3}}, {"lm_head.weight", {5}}});
  WriteShard(dir + "/model-00002-of-00002.safetensors",
             {{"model.norm.weight", {4}}, {"lm_head.weight", {5}}});
  WriteFileBytes(dir + "/model.safetensors.index.json", kIndexJson);
  EXPECT_THAT(
      SafetensorsModel::Open(dir).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tensor 'lm_head.weight' is in shard "
                                                      "model-00001-of-00002.safetensors but the "
                                                      "index maps it to "
                                                      "model-00002-of-00002.safetensors")));
}

// ---------------------------------------------------------------------------
// Seed corpus written by tests/fuzz/make_corpus.py, an independent Python
// implementation of the format: valid_* files must parse, invalid_* must be
// refused as DATA_LOSS.

TEST(SafetensorsCorpusTest, PythonWrittenFilesParseAsExpected) {
  const std::string dir = std::string(MEGATRAIN_FUZZ_CORPUS_DIR) + "/safetensors_header_fuzz";
  const std::vector<std::string> names = ListDir(dir);
  ASSERT_FALSE(names.empty()) << dir;
  int valid = 0;
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_THAT(file, IsOk()) << name;
      ++valid;
    } else {
      EXPECT_THAT(file.status(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path))) << name;
    }
  }
  EXPECT_GT(valid, 0);
}

}  // namespace
}  // namespace megatrain::engine
