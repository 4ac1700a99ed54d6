// TensorBoard event files without TensorFlow: the few bytes a scalar
// summary takes, written by hand so that the daemon's core needs no
// TensorFlow protos (job_scalars.h writes them).
//
// Note [Event file format]
// An event file (`events.out.tfevents.<seconds>.<host>`, read by
// `tensorboard --logdir`) is a TFRecord file: records of
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) |
//   data[length] | uint32 masked_crc32c(data)
// where masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 and c is
// the CRC-32C (Castagnoli) of x (tensorflow/core/lib/hash/crc32c.h,
// tsl/lib/io/record_writer.cc). Each record's data is a serialised
// tensorflow.Event (tensorflow/core/util/event.proto): wall_time (field 1,
// double, seconds), step (2, int64), file_version (3, string: the first
// record of a file is "brain.Event:2"), summary (5, Summary). A Summary
// (tensorflow/core/framework/summary.proto) holds repeated Value (field 1)
// with tag (1, string) and simple_value (2, float).
//
// Thread-safety: pure functions.
#ifndef MEGATRAIN_SERVER_CORE_TFEVENTS_H_
#define MEGATRAIN_SERVER_CORE_TFEVENTS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace megatrain::server {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of `data`.
uint32_t Crc32c(absl::string_view data);

// The TFRecord mask of a CRC (Note [Event file format]).
uint32_t MaskedCrc32c(absl::string_view data);

// `data` framed as one TFRecord (Note [Event file format]).
std::string TfRecord(absl::string_view data);

// A serialised Event with file_version "brain.Event:2": the first record
// of every event file. `wall_time_seconds` since the Unix epoch.
std::string FileVersionEvent(double wall_time_seconds);

// A serialised Event at `step` whose summary holds one simple_value per
// (tag, value) of `scalars`, in order.
std::string ScalarsEvent(double wall_time_seconds, int64_t step,
                         const std::vector<std::pair<std::string, float>>& scalars);

}  // namespace megatrain::server

#endif  // MEGATRAIN_SERVER_CORE_TFEVENTS_H_
