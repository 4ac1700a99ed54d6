// See input_checks.h.
#include "engine/data/input_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/data/data_loader.h"
#include "engine/formats/safetensors.h"
#include "engine/data/text_corpus.h"
#include "engine/data/token_shard.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/spec/job_spec.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

// docs/data-format.md, "Layout, version 1".
constexpr size_t kHeaderBytes = 64;
constexpr char kMagic[] = "MTTOKSH1";

uint64_t Le64(const uint8_t* p) {
  uint64_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

uint32_t Le32(const uint8_t* p) {
  uint32_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

// One shard file's header; `size` is the file's size in bytes.
absl::StatusOr<TokenShardHeaderFacts> ParseHeader(const std::string& path, const uint8_t* h,
                                                  uint64_t size) {
  auto loss = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  if (std::memcmp(h, kMagic, 8) != 0) return loss("not a token shard (bad magic)");
  if (Le64(h + 56) != XXH64(h, 56, 0)) return loss("header checksum mismatch: corrupt header");
  const uint32_t version = Le32(h + 8);
  if (version == 0) return loss("version 0 is invalid");
  if (version > kTokenShardVersion) {
    return absl::UnimplementedError(absl::StrCat(path, ": shard version ", version,
                                                 " is newer than this reader (", kTokenShardVersion,
                                                 ")"));
  }
  const uint32_t dtype = Le32(h + 12);
  if (dtype != 2 && dtype != 4) return loss(absl::StrCat("token_dtype ", dtype, " (2 or 4)"));
  if ((Le32(h + 48) & ~1u) != 0 || Le32(h + 52) != 0) return loss("reserved bits set");
  TokenShardHeaderFacts facts;
  facts.path = path;
  facts.vocab_size = Le64(h + 16);
  facts.num_tokens = Le64(h + 24);
  facts.num_documents = Le64(h + 32);
  // 64 + 8 (docs + 1) + dtype x tokens, without overflow (counts are u64
  // from the file: compare by division).
  const uint64_t max_count = (UINT64_MAX - kHeaderBytes) / 16;
  if (facts.num_documents >= max_count || facts.num_tokens >= max_count) {
    return loss("counts overflow the file size");
  }
  const uint64_t expected = kHeaderBytes + 8 * (facts.num_documents + 1) + dtype * facts.num_tokens;
  if (expected != size) {
    return loss(
        absl::StrFormat("%u bytes on disk, the header's %u documents and %u tokens need %u (%s)",
                        size, facts.num_documents, facts.num_tokens, expected,
                        size < expected ? "truncated copy?" : "trailing bytes"));
  }
  return facts;
}

absl::StatusOr<TokenShardHeaderFacts> ReadOneHeader(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": does not exist"));
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(error)));
  }
  struct stat info {};
  uint8_t header[kHeaderBytes];
  absl::Status status;
  ssize_t got = 0;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  } else if (static_cast<uint64_t>(info.st_size) < kHeaderBytes) {
    status = absl::DataLossError(
        absl::StrCat(path, ": ", info.st_size, " bytes, shorter than the 64-byte header"));
  } else {
    do {
      got = ::pread(fd, header, kHeaderBytes, 0);
    } while (got < 0 && errno == EINTR);
    if (got != static_cast<ssize_t>(kHeaderBytes)) {
      status = absl::DataLossError(absl::StrCat(path, ": cannot read the header"));
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return ParseHeader(path, header, static_cast<uint64_t>(info.st_size));
}

}  // namespace

absl::StatusOr<std::vector<TokenShardHeaderFacts>> ReadTokenShardHeaders(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  std::vector<std::string> files;
  if (fs::is_directory(status)) {
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!absl::EndsWith(name, kTokenShardSuffix)) continue;
      if (files.size() >= static_cast<size_t>(kMaxCheckedShards)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": more than ", kMaxCheckedShards, " *", kTokenShardSuffix,
                         " shards; merge them (keep shards to about 1e8 tokens each)"));
      }
      files.push_back(it->path().string());
    }
    if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
    if (files.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": directory holds no *", kTokenShardSuffix, " token shards"));
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::vector<TokenShardHeaderFacts> out;
  out.reserve(files.size());
  for (const std::string& file : files) {
    absl::StatusOr<TokenShardHeaderFacts> facts = ReadOneHeader(file);
    if (!facts.ok()) return facts.status();
    out.push_back(*std::move(facts));
  }
  return out;
}

absl::Status CheckHfWeightHeaders(const std::string& hf_dir, const ModelConfig& config) {
  // SafetensorsModel::Open opens files with a blocking open(2): refuse any
  // *.safetensors / *.json entry that is not a regular file first (stat(2)
  // never opens, so a FIFO cannot stall the caller).
  std::error_code ec;
  for (fs::directory_iterator it(hf_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::EndsWith(name, ".safetensors") && !absl::EndsWith(name, ".json")) continue;
    struct stat info {};
    if (::stat(it->path().c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(it->path().string(), ": not a regular file"));
    }
  }
  absl::StatusOr<SafetensorsModel> model = SafetensorsModel::Open(hf_dir);
  if (!model.ok()) return model.status();
  const std::vector<int64_t> expected = {config.vocab_size, config.hidden_size};
  for (const char* name : {"model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
                           "language_model.model.embed_tokens.weight"}) {
    absl::StatusOr<SafetensorsModel::TensorRef> ref = model->Find(name);
    if (!ref.ok()) continue;
    if (ref->info->shape != expected) {
      std::string shape;
      for (int64_t dim : ref->info->shape) absl::StrAppend(&shape, shape.empty() ? "" : ", ", dim);
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor '%s' has shape [%s]; config.json (vocab_size %d, hidden_size %d) expects "
          "[%d, %d]",
          ref->file->path(), name, shape, config.vocab_size, config.hidden_size, config.vocab_size,
          config.hidden_size));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();  // other names: the full check at the job's start
}

namespace {

// `field: message` as INVALID_ARGUMENT (the field is wrong, whatever the
// underlying code).
absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

void CheckTokenizer(const DataInputsToCheck& in, SpecErrors& errors) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(in.tokenizer);
  if (!tokenizer.ok()) {
    errors.Add(FieldError(
        in.tokenizer_field,
        absl::StrCat(tokenizer.status().message(),
                     in.tokenizer_field == "model.hf_dir"
                         ? " (data.text is tokenized with model.hf_dir's tokenizer.json; set "
                           "data.tokenizer to a model directory with one, or the file)"
                         : "")));
    return;
  }
  if (in.model_vocab_size > 0 && tokenizer->vocab_size() > in.model_vocab_size) {
    errors.Add(FieldError(in.tokenizer_field,
                          absl::StrCat(in.tokenizer, " has ", tokenizer->vocab_size(),
                                       " ids, more than the model's vocab_size ",
                                       in.model_vocab_size, ": its ids from ", in.model_vocab_size,
                                       " up have no embedding row (another model's tokenizer?)")));
  }
}

// The loss-mask files of `path` (a shard file's mask, or a directory's).
std::vector<std::string> MaskFiles(const std::string& path) {
  std::vector<std::string> masks;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::is_regular_file(path + kLossMaskSuffix, ec)) masks.push_back(path + kLossMaskSuffix);
    return masks;
  }
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (absl::EndsWith(name, absl::StrCat(kTokenShardSuffix, kLossMaskSuffix))) {
      masks.push_back(it->path().string());
    }
    if (masks.size() >= static_cast<size_t>(kMaxCheckedShards)) break;
  }
  std::sort(masks.begin(), masks.end());
  return masks;
}

// Whether the masks of `path` hold a 1 (scanning at most
// kMaxScannedMaskTokens); nullopt when there are none or it cannot tell.
std::optional<bool> MasksTrainSomething(const std::string& path) {
  const std::vector<std::string> masks = MaskFiles(path);
  if (masks.empty()) return std::nullopt;
  uint64_t scanned = 0;
  for (const std::string& mask_path : masks) {
    absl::StatusOr<TokenShardReader> mask = TokenShardReader::Open(mask_path);
    if (!mask.ok()) return std::nullopt;  // the job's start names it
    for (uint64_t t = 0; t < mask->num_tokens(); ++t, ++scanned) {
      if (scanned >= kMaxScannedMaskTokens) return std::nullopt;
      if (mask->token(t) != 0) return true;
    }
  }
  return false;
}

void CheckTrainedTokens(absl::string_view field, const std::string& path, SpecErrors& errors) {
  if (path.empty()) return;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    absl::StatusOr<TokenizeReport> report = ReadTokenizeReport(path);
    if (report.ok() && report->masked && report->trained_counts_known) {
      if (report->trained_tokens == 0) {
        errors.Add(FieldError(
            field, absl::StrCat(path, "/", kTokenizeReportFileName,
                                ": no trained token (every loss-mask value is 0): the job would "
                                "train on nothing; chat data needs assistant answers (see "
                                "docs/data-format.md, \"Chat-format SFT\")")));
      }
      return;
    }
  }
  if (MasksTrainSomething(path) == false) {
    errors.Add(FieldError(field, absl::StrCat(path,
                                              ": no trained token (every loss-mask value of its "
                                              "*.mtt.mask files is 0): the job would train on "
                                              "nothing")));
  }
}

}  // namespace

absl::Status CheckDataInputs(const DataInputsToCheck& inputs) {
  SpecErrors errors;
  if (!inputs.text.empty()) {
    const absl::Status text = CheckTextInputHead(inputs.text, "text");
    if (!text.ok()) errors.Add(FieldError("data.text", text.message()));
    if (!inputs.tokenizer.empty()) CheckTokenizer(inputs, errors);
  }
  CheckTrainedTokens("data.tokens", inputs.tokens, errors);
  CheckTrainedTokens("data.eval_tokens", inputs.eval_tokens, errors);
  return errors.ToStatus();
}

}  // namespace megatrain::engine
