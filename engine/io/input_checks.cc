// See input_checks.h.
#include "engine/io/input_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/io/data_loader.h"
#include "engine/io/safetensors.h"
#include "engine/io/token_shard.h"

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

}  // namespace megatrain::engine
