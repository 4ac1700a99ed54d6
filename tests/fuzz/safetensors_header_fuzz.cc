// libFuzzer target for the safetensors parsers: ParseSafetensorsHeader on the
// input taken as a whole file, then (when it parses) every tensor's bytes are
// read and converted, so ASan checks that the validated offsets really lie
// inside the input; the same input is also fed to ParseSafetensorsIndex.
//
// Invariants checked (a violation traps, which libFuzzer reports as a crash):
//   - an accepted header's tensors tile [0, data_size_bytes) in order;
//   - each tensor's size_bytes == num_elements x element size;
//   - parsing never returns OK with a prefix shorter than the header.
//
// Run: deploy/run-fuzzers.sh, or by hand
//   build-fuzz/safetensors_header_fuzz tests/fuzz/corpus/safetensors_header_fuzz
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/formats/safetensors.h"

namespace {

using ::megatrain::engine::ConvertToFloat32;
using ::megatrain::engine::ParseSafetensorsHeader;
using ::megatrain::engine::ParseSafetensorsIndex;
using ::megatrain::engine::SafetensorsDtypeSizeBytes;
using ::megatrain::engine::SafetensorsHeader;
using ::megatrain::engine::SafetensorsTensorInfo;

// Keeps the conversion output alive so the compiler cannot drop the reads.
volatile float g_sink;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(bytes, size, "fuzz.safetensors");
  if (header.ok()) {
    Check(header->data_offset_bytes + header->data_size_bytes == size);
    uint64_t expected_begin = 0;
    std::vector<float> floats;
    for (const SafetensorsTensorInfo& info : header->tensors) {
      Check(info.data_begin == expected_begin);
      Check(info.data_end >= info.data_begin);
      Check(info.size_bytes() ==
            static_cast<uint64_t>(info.num_elements) * SafetensorsDtypeSizeBytes(info.dtype));
      expected_begin = info.data_end;
      const absl::Span<const uint8_t> tensor_bytes =
          bytes.subspan(header->data_offset_bytes + info.data_begin, info.size_bytes());
      Check(tensor_bytes.size() == info.size_bytes());
      // Bound the conversion buffer: huge empty-shape tricks cannot reach
      // here (bytes are real), but keep the fuzzer's memory small anyway.
      if (info.num_elements <= (1 << 20)) {
        floats.resize(static_cast<size_t>(info.num_elements));
        if (ConvertToFloat32(info.dtype, tensor_bytes, absl::MakeSpan(floats)).ok() &&
            !floats.empty()) {
          g_sink = floats.front() + floats.back();
        }
      }
    }
    Check(expected_begin == header->data_size_bytes);

    // A prefix that stops inside the header must never parse.
    if (header->data_offset_bytes > 0) {
      Check(!ParseSafetensorsHeader(bytes.first(static_cast<size_t>(header->data_offset_bytes) - 1),
                                    size, "fuzz.safetensors")
                 .ok());
    }
  }

  (void)ParseSafetensorsIndex(std::string_view(reinterpret_cast<const char*>(data), size),
                              "fuzz.index.json");
  return 0;
}
