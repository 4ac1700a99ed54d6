// Training checkpoints: write, verify, restore, list, prune, export (see
// checkpoint.h and docs/checkpoint-format.md).
#include "engine/checkpoint/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "engine/fs/dir_fd.h"
#include "engine/fs/held_output_dir.h"
#include "engine/formats/hf_export.h"
#include "engine/formats/hf_model.h"
#include "engine/fs/mapped_file.h"
#include "engine/model/param_layout.h"
#include "engine/runtime/status_macros.h"
#include "engine/spec/checkpoint_retention.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian and written with memcpy");

using Json = nlohmann::json;

// Format constants; docs/checkpoint-format.md is the specification.
constexpr char kFormatName[] = "megatrain-checkpoint";
constexpr char kCheckpointsSubdir[] = "checkpoints";
constexpr char kStepPrefix[] = "step-";
constexpr char kTempPrefix[] = ".tmp-";
constexpr char kConfigFile[] = "config.json";
constexpr char kStateFile[] = "state.json";
constexpr char kManifestFile[] = "manifest.json";

// Tensor files: 64-byte header, block table, fp32 data.
constexpr char kTensorMagic[8] = {'M', 'T', 'C', 'K', 'P', 'T', 'B', 'K'};
constexpr size_t kTensorHeaderBytes = 64;
constexpr uint32_t kTensorDtypeF32 = 1;
constexpr size_t kOffsetVersion = 8;
constexpr size_t kOffsetKind = 12;
constexpr size_t kOffsetDtype = 16;
constexpr size_t kOffsetReserved = 20;
constexpr size_t kOffsetNumBlocks = 24;
constexpr size_t kOffsetTotalNumel = 32;
constexpr size_t kOffsetReservedTail = 40;  // 24 zero bytes up to 64

// XXH64 seed of every checksum (docs: "XXH64, seed 0").
constexpr XXH64_hash_t kXxhSeed = 0;

// Bytes copied (and hashed) per chunk when restoring: small enough to stay
// in L2/L3 between the hash and the copy, large enough that the loop is free.
constexpr size_t kRestoreChunkBytes = size_t{4} << 20;

// The three tensor files. `kind` is the header's kind field.
struct TensorFileKind {
  const char* file_name;
  uint32_t kind;
  float* (HostStore::*buffer)(int64_t) const;
};
constexpr TensorFileKind kMasterFile{"master.bin", 1, &HostStore::master};
constexpr TensorFileKind kExpAvgFile{"exp_avg.bin", 2, &HostStore::exp_avg};
constexpr TensorFileKind kExpAvgSqFile{"exp_avg_sq.bin", 3, &HostStore::exp_avg_sq};

struct ManifestEntry {
  uint64_t bytes = 0;  // file size
  uint64_t xxh64 = 0;  // XXH64 (seed 0) of the whole file
};

struct Manifest {
  std::string path;  // of manifest.json, for messages
  int64_t step = 0;
  std::map<std::string, ManifestEntry> files;  // file name -> entry
};

using Xxh64State = std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)>;

Xxh64State NewXxh64State() {
  Xxh64State state(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(state.get(), kXxhSeed);
  return state;
}

std::string HexDigest(uint64_t digest) { return absl::StrFormat("%016x", digest); }

absl::Status ErrnoError(int error_number, const std::string& path, const char* operation) {
  return absl::ErrnoToStatus(error_number, absl::StrFormat("%s: %s", path, operation));
}

// The step of a checkpoint directory name "step-<digits>", or -1.
int64_t StepFromDirName(absl::string_view name) {
  if (!absl::StartsWith(name, kStepPrefix)) return -1;
  const absl::string_view digits = name.substr(std::strlen(kStepPrefix));
  if (digits.empty() || digits.size() > 18) return -1;
  for (const char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return -1;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(digits, &step)) return -1;
  return step;
}

struct StepDir {
  int64_t step = 0;
  std::string name;
};

// The `step-*` directories of `root`, by step ascending.
absl::StatusOr<std::vector<StepDir>> ListStepDirs(const std::string& root) {
  std::vector<StepDir> dirs;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t step = StepFromDirName(name);
    std::error_code type_ec;
    if (step < 0 || !it->is_directory(type_ec)) continue;
    dirs.push_back({step, name});
  }
  if (ec) return ErrnoError(ec.value(), root, "list directory");
  std::sort(dirs.begin(), dirs.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return dirs;
}

// `status` with the descriptor path `io_path` (DirFd::IoPath) in its
// message replaced by the path it stands for.
absl::Status ShowPath(const absl::Status& status, const std::string& io_path,
                      const std::string& path) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrReplaceAll(status.message(), {{io_path, path}}));
}

// Note [Checkpoint ledger]
// Retention and the cleanup of crashed writes delete only entries that the
// writer itself recorded, never entries found by their names: a user's own
// `step-00000001` or `.tmp-step-...` in output_dir/checkpoints is left
// alone. `checkpoints/.ledger.json` lists the checkpoints the writer
// published ("checkpoints") and the temporaries it made and has not yet
// removed ("temporaries"); it is rewritten atomically (and fsync'd) before
// each temporary is made or a checkpoint is moved aside for deletion, and
// after each publication and removal. A temporary made by mkdtemp is
// recorded just after it exists: a crash in that instant leaves one empty
// directory behind. A missing or malformed ledger counts as empty (nothing
// is deleted); checkpoints written before the ledger existed are deleted
// by retention only once the daemon adopted them from its job store's
// records (AdoptRecordedCheckpoints, Note [Checkpoint adoption] in
// checkpoint_info.h). Entries are reached through the directory's
// descriptor without following links (dir_fd.h), so an edited ledger can
// make the writer delete nothing outside checkpoints/.
constexpr char kLedgerFile[] = ".ledger.json";
// A ledger lists a few names per retained checkpoint; 1 MiB is thousands.
constexpr int64_t kMaxLedgerBytes = int64_t{1} << 20;

struct Ledger {
  std::set<std::string> checkpoints;  // "step-N" names, published
  std::set<std::string> temporaries;  // ".tmp-*" names, made and not removed
};

// The ledger of `root`; empty when missing or malformed (Note [Checkpoint
// ledger]: nothing unrecorded is ever deleted).
Ledger ReadLedger(const DirFd& root) {
  Ledger ledger;
  absl::StatusOr<std::string> text = root.ReadFileAt(kLedgerFile, kMaxLedgerBytes);
  if (!text.ok()) return ledger;
  const Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return ledger;
  const auto names = [&j](const char* key, auto&& valid, std::set<std::string>& out) {
    if (!j.contains(key) || !j[key].is_array()) return;
    for (const Json& name : j[key]) {
      if (name.is_string() && valid(name.get<std::string>())) out.insert(name.get<std::string>());
    }
  };
  names(
      "checkpoints", [](const std::string& name) { return StepFromDirName(name) >= 0; },
      ledger.checkpoints);
  names(
      "temporaries",
      [](const std::string& name) {
        return absl::StartsWith(name, kTempPrefix) && name.find('/') == std::string::npos;
      },
      ledger.temporaries);
  return ledger;
}

// Replaces the ledger of `root` atomically and durably.
absl::Status WriteLedger(const DirFd& root, const Ledger& ledger) {
  const Json j = {{"format", "megatrain-checkpoint-ledger"},
                  {"version", 1},
                  {"checkpoints", ledger.checkpoints},
                  {"temporaries", ledger.temporaries}};
  const std::string text = j.dump(2);
  absl::StatusOr<AtomicFileWriter> out = AtomicFileWriter::Create(root.IoPath(kLedgerFile));
  if (!out.ok()) return ShowPath(out.status(), root.IoPath(), root.path());
  absl::Status written = out->Append(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  if (written.ok()) written = out->Commit();
  return ShowPath(written, root.IoPath(), root.path());
}

// Six random letters and digits, for a temporary's name (like mkdtemp's).
std::string RandomSuffix() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device device;
  std::string suffix(6, 'X');
  for (char& c : suffix) c = kAlphabet[device() % (sizeof(kAlphabet) - 1)];
  return suffix;
}

// Removes the recorded temporaries of `ledger` (crashed writes and
// deletions) and forgets those that are gone.
void RemoveRecordedTemporaries(const DirFd& root, Ledger& ledger) {
  for (auto it = ledger.temporaries.begin(); it != ledger.temporaries.end();) {
    if (root.RemoveTreeAt(*it).ok()) {
      it = ledger.temporaries.erase(it);
    } else {
      ++it;
    }
  }
}

// Sum of the sizes of the regular files directly in `dir`, in bytes.
int64_t DirectoryBytes(const std::string& dir) {
  int64_t bytes = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (!it->is_regular_file(size_ec)) continue;
    const uintmax_t size = it->file_size(size_ec);
    if (!size_ec) bytes += static_cast<int64_t>(size);
  }
  return bytes;
}

// Fails with INVALID_ARGUMENT when `text` is not valid UTF-8 (it could not
// be stored in a JSON string).
absl::Status CheckUtf8(absl::string_view field, const std::string& text) {
  try {
    (void)Json(text).dump();
  } catch (const Json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("state.", field, ": not valid UTF-8"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Writing

// Writes `text` as `dir`/`name` (fsync'd) and returns its manifest entry.
absl::StatusOr<ManifestEntry> WriteTextFile(const std::string& dir, const char* name,
                                            std::string_view text) {
  MEGATRAIN_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(JoinPath(dir, name)));
  const absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  MEGATRAIN_RETURN_IF_ERROR(out.Append(bytes));
  MEGATRAIN_RETURN_IF_ERROR(out.Commit());
  return ManifestEntry{text.size(), XXH64(text.data(), text.size(), kXxhSeed)};
}

// Header and block table of a tensor file for `store`.
std::vector<uint8_t> TensorFileHeader(const HostStore& store, uint32_t kind) {
  const uint64_t num_blocks = static_cast<uint64_t>(store.num_blocks());
  std::vector<uint8_t> header(kTensorHeaderBytes + 8 * num_blocks, 0);
  uint64_t total_numel = 0;
  for (int64_t block = 0; block < store.num_blocks(); ++block) {
    const uint64_t numel = static_cast<uint64_t>(store.block_numel(block));
    std::memcpy(header.data() + kTensorHeaderBytes + 8 * block, &numel, 8);
    total_numel += numel;
  }
  const uint32_t version = kCheckpointFormatVersion;
  std::memcpy(header.data(), kTensorMagic, sizeof(kTensorMagic));
  std::memcpy(header.data() + kOffsetVersion, &version, 4);
  std::memcpy(header.data() + kOffsetKind, &kind, 4);
  std::memcpy(header.data() + kOffsetDtype, &kTensorDtypeF32, 4);
  std::memcpy(header.data() + kOffsetNumBlocks, &num_blocks, 8);
  std::memcpy(header.data() + kOffsetTotalNumel, &total_numel, 8);
  return header;
}

// The NVMe tier's file of a moment kind (kExpAvgFile or kExpAvgSqFile).
MomentKind TierKind(const TensorFileKind& kind) {
  return kind.kind == kExpAvgFile.kind ? MomentKind::kExpAvg : MomentKind::kExpAvgSq;
}

// Appends `block`'s moment `kind` from the NVMe tier's files to `out`,
// hashing it: a bounded bounce buffer, the same bytes a store that keeps
// its moments appends (Note [Tiered trainer] in step/trainer.h), the
// block's shards in element order (Note [Tier shards] in
// store/nvme_tier.h).
absl::Status AppendTierBlock(const NvmeMomentTier& tier, const TensorFileKind& kind, int64_t block,
                             AtomicFileWriter& out, XXH64_state_t* hash) {
  constexpr int64_t kBounceElements = kRestoreChunkBytes / sizeof(float);
  std::vector<float> bounce(kBounceElements);
  for (const NvmeBlockPiece& piece : tier.Pieces(block)) {
    for (int64_t begin = 0; begin < piece.count; begin += kBounceElements) {
      const int64_t count = std::min(kBounceElements, piece.count - begin);
      MEGATRAIN_RETURN_IF_ERROR(
          piece.files->Read(TierKind(kind), piece.file_offset + begin, count, bounce.data()));
      const size_t bytes = static_cast<size_t>(count) * sizeof(float);
      XXH64_update(hash, bounce.data(), bytes);
      MEGATRAIN_RETURN_IF_ERROR(out.Append(
          absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bounce.data()), bytes)));
    }
  }
  return absl::OkStatus();
}

// Streams one kind of the store's buffers into `dir`/<file>, block by block
// straight from the store (no copy), hashing as it goes; moments the store
// does not keep come from `tier`.
absl::StatusOr<ManifestEntry> WriteTensorFile(const std::string& dir, const TensorFileKind& kind,
                                              const HostStore& store, const NvmeMomentTier* tier) {
  MEGATRAIN_ASSIGN_OR_RETURN(AtomicFileWriter out,
                             AtomicFileWriter::Create(JoinPath(dir, kind.file_name)));
  Xxh64State hash = NewXxh64State();
  const std::vector<uint8_t> header = TensorFileHeader(store, kind.kind);
  XXH64_update(hash.get(), header.data(), header.size());
  MEGATRAIN_RETURN_IF_ERROR(out.Append(header));
  for (int64_t block = 0; block < store.num_blocks(); ++block) {
    const float* data = (store.*kind.buffer)(block);
    if (data == nullptr && tier != nullptr) {
      MEGATRAIN_RETURN_IF_ERROR(AppendTierBlock(*tier, kind, block, out, hash.get()));
      continue;
    }
    const size_t bytes = static_cast<size_t>(store.block_numel(block)) * sizeof(float);
    XXH64_update(hash.get(), data, bytes);
    MEGATRAIN_RETURN_IF_ERROR(
        out.Append(absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(data), bytes)));
  }
  const uint64_t size = out.bytes_appended();
  MEGATRAIN_RETURN_IF_ERROR(out.Commit());
  return ManifestEntry{size, XXH64_digest(hash.get())};
}

std::string StateJson(const CheckpointState& state) {
  Json j;
  j["format"] = kFormatName;
  j["version"] = kCheckpointFormatVersion;
  j["step"] = state.step;
  // A decimal string: JSON readers that use doubles would round a uint64.
  j["rng_state"] = absl::StrCat(state.rng_state);
  j["schedule_json"] = state.schedule_json;
  j["data_cursor_json"] = state.data_cursor_json;
  j["job_spec_json"] = state.job_spec_json;
  if (!state.job_id.empty()) j["job_id"] = state.job_id;
  return j.dump(2);
}

std::string ManifestJson(int64_t step, const std::map<std::string, ManifestEntry>& files) {
  Json j;
  j["format"] = kFormatName;
  j["version"] = kCheckpointFormatVersion;
  j["step"] = step;
  Json entries = Json::object();
  for (const auto& [name, entry] : files) {
    entries[name] = {{"bytes", entry.bytes}, {"xxh64", HexDigest(entry.xxh64)}};
  }
  j["files"] = std::move(entries);
  return j.dump(2);
}

// Moves `final_dir` (an existing checkpoint) aside and `temp_dir` into its
// place. Prefers one atomic exchange; without renameat2 support, renames
// the old one away first (a crash in between loses only that step).
// On success the old checkpoint is at `temp_dir` or `aside_dir`.
// Entries are names in `root` (Note [Directory descriptors] in dir_fd.h).
absl::Status ReplaceDirectory(const DirFd& root, const std::string& temp_name,
                              const std::string& final_name, const std::string& aside_name) {
  const std::string final_dir = JoinPath(root.path(), final_name);
  if (::renameat2(root.fd(), temp_name.c_str(), root.fd(), final_name.c_str(), RENAME_EXCHANGE) ==
      0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return ErrnoError(errno, final_dir, "exchange with the new checkpoint");
  }
  if (::renameat(root.fd(), final_name.c_str(), root.fd(), aside_name.c_str()) != 0) {
    return ErrnoError(errno, final_dir, "move the old checkpoint aside");
  }
  if (::renameat(root.fd(), temp_name.c_str(), root.fd(), final_name.c_str()) != 0) {
    return ErrnoError(errno, final_dir, "rename the new checkpoint into place");
  }
  return absl::OkStatus();
}

// Deletes the recorded checkpoints (Note [Checkpoint ledger]) that
// `retention` does not keep; `written_step` is always kept. Updates and
// writes `ledger`.
absl::Status ApplyRetention(const DirFd& root_fd, int64_t written_step,
                            const CheckpointSpec& retention, Ledger& ledger) {
  const std::string& root = root_fd.path();
  std::vector<StepDir> dirs;
  for (const std::string& name : ledger.checkpoints) {
    // Only directories the writer made: a link put in their place is left
    // alone (and forgotten when gone).
    absl::StatusOr<struct stat> info = root_fd.StatAt(name);
    if (info.ok() && S_ISDIR(info->st_mode)) dirs.push_back({StepFromDirName(name), name});
  }
  std::sort(dirs.begin(), dirs.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  std::set<int64_t> keep = {written_step};
  const size_t keep_last = static_cast<size_t>(retention.keep_last);
  for (size_t idx = dirs.size() > keep_last ? dirs.size() - keep_last : 0; idx < dirs.size();
       ++idx) {
    keep.insert(dirs[idx].step);
  }
  std::vector<std::string> doomed;
  for (const StepDir& dir : dirs) {
    if (keep.contains(dir.step)) continue;
    if (retention.keep_every > 0 && dir.step > 0 && dir.step % retention.keep_every == 0) continue;
    doomed.push_back(dir.name);
  }
  if (doomed.empty()) return absl::OkStatus();
  // Recorded as temporaries before the renames: a crash mid-delete leaves
  // a recorded `.tmp-*` directory (removed by the next write), never a
  // half-deleted `step-*`.
  for (const std::string& name : doomed) {
    ledger.checkpoints.erase(name);
    ledger.temporaries.insert(absl::StrCat(kTempPrefix, "delete-", name));
  }
  MEGATRAIN_RETURN_IF_ERROR(WriteLedger(root_fd, ledger));
  for (const std::string& name : doomed) {
    const std::string doomed_name = absl::StrCat(kTempPrefix, "delete-", name);
    if (::renameat(root_fd.fd(), name.c_str(), root_fd.fd(), doomed_name.c_str()) != 0) {
      return ErrnoError(errno, JoinPath(root, name), "move aside for deletion");
    }
  }
  MEGATRAIN_RETURN_IF_ERROR(root_fd.Fsync());
  RemoveRecordedTemporaries(root_fd, ledger);  // a leftover is removed by the next write
  return WriteLedger(root_fd, ledger);
}

// ---------------------------------------------------------------------------
// Reading

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

bool ParseHexDigest(const std::string& text, uint64_t* digest) {
  if (text.size() != 16) return false;
  uint64_t value = 0;
  for (const char c : text) {
    int nibble;
    if (c >= '0' && c <= '9') {
      nibble = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      nibble = c - 'a' + 10;
    } else {
      return false;
    }
    value = (value << 4) | static_cast<uint64_t>(nibble);
  }
  *digest = value;
  return true;
}

// Opens `dir`/`name`; a missing file is DATA_LOSS (the checkpoint is
// incomplete), other errors keep their code.
absl::StatusOr<MappedFile> OpenCheckpointFile(const std::string& dir, const std::string& name) {
  const std::string path = JoinPath(dir, name);
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (absl::IsNotFound(file.status())) {
    return DataLoss(path, "missing (the checkpoint is incomplete)");
  }
  return file;
}

// Reads and validates manifest.json; checks that `dir` exists first.
absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such checkpoint directory"));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, OpenCheckpointFile(dir, kManifestFile));
  Manifest manifest;
  manifest.path = file.path();
  const absl::Span<const uint8_t> bytes = file.bytes();
  const Json j = Json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(manifest.path, "not a JSON object");
  if (!j.contains("format") || j["format"] != kFormatName) {
    return DataLoss(manifest.path, absl::StrCat("\"format\" is not \"", kFormatName, "\""));
  }
  if (!j.contains("version") || !j["version"].is_number_unsigned() || j["version"] == 0) {
    return DataLoss(manifest.path, "\"version\" is not a positive integer");
  }
  const uint64_t version = j["version"].get<uint64_t>();
  if (version > kCheckpointFormatVersion) {
    return absl::UnimplementedError(
        absl::StrFormat("%s: checkpoint format version %d is newer than this build reads (%d)",
                        manifest.path, version, kCheckpointFormatVersion));
  }
  if (!j.contains("step") || !j["step"].is_number_integer() || j["step"].get<int64_t>() < 0) {
    return DataLoss(manifest.path, "\"step\" is not a non-negative integer");
  }
  manifest.step = j["step"].get<int64_t>();
  if (!j.contains("files") || !j["files"].is_object()) {
    return DataLoss(manifest.path, "\"files\" is not an object");
  }
  for (const auto& [name, entry] : j["files"].items()) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name == kManifestFile) {
      return DataLoss(manifest.path, absl::StrCat("bad file name '", name, "'"));
    }
    ManifestEntry parsed;
    if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() ||
        !entry.contains("xxh64") || !entry["xxh64"].is_string() ||
        !ParseHexDigest(entry["xxh64"].get<std::string>(), &parsed.xxh64)) {
      return DataLoss(manifest.path,
                      absl::StrCat("entry '", name,
                                   "' needs \"bytes\" (integer) and \"xxh64\" (16 hex digits)"));
    }
    parsed.bytes = entry["bytes"].get<uint64_t>();
    manifest.files.emplace(name, parsed);
  }
  return manifest;
}

absl::StatusOr<ManifestEntry> FindEntry(const Manifest& manifest, const std::string& dir,
                                        const std::string& name) {
  const auto it = manifest.files.find(name);
  if (it == manifest.files.end()) {
    return DataLoss(JoinPath(dir, name), "not listed in manifest.json");
  }
  return it->second;
}

absl::Status CheckSize(const MappedFile& file, const ManifestEntry& entry) {
  if (file.size() == entry.bytes) return absl::OkStatus();
  return DataLoss(
      file.path(),
      absl::StrFormat("%d bytes on disk, manifest.json says %d (%s)", file.size(), entry.bytes,
                      file.size() < entry.bytes ? "truncated" : "overwritten"));
}

absl::Status CheckDigest(const std::string& path, uint64_t digest, const ManifestEntry& entry) {
  if (digest == entry.xxh64) return absl::OkStatus();
  return DataLoss(path, absl::StrFormat("XXH64 %s does not match manifest.json's %s (corrupt)",
                                        HexDigest(digest), HexDigest(entry.xxh64)));
}

// Reads `dir`/`name`, verified against the manifest, as text.
absl::StatusOr<std::string> ReadVerifiedText(const std::string& dir, const Manifest& manifest,
                                             const std::string& name) {
  MEGATRAIN_ASSIGN_OR_RETURN(ManifestEntry entry, FindEntry(manifest, dir, name));
  MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, OpenCheckpointFile(dir, name));
  MEGATRAIN_RETURN_IF_ERROR(CheckSize(file, entry));
  MEGATRAIN_RETURN_IF_ERROR(
      CheckDigest(file.path(), XXH64(file.data(), file.size(), kXxhSeed), entry));
  return std::string(reinterpret_cast<const char*>(file.data()), file.size());
}

absl::StatusOr<CheckpointState> ParseState(const std::string& path, const std::string& text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(path, "not a JSON object");
  CheckpointState state;
  if (!j.contains("step") || !j["step"].is_number_integer() || j["step"].get<int64_t>() < 0) {
    return DataLoss(path, "\"step\" is not a non-negative integer");
  }
  state.step = j["step"].get<int64_t>();
  if (!j.contains("rng_state") || !j["rng_state"].is_string() ||
      !absl::SimpleAtoi(j["rng_state"].get<std::string>(), &state.rng_state)) {
    return DataLoss(path, "\"rng_state\" is not a decimal uint64 string");
  }
  const std::pair<const char*, std::string*> strings[] = {
      {"schedule_json", &state.schedule_json},
      {"data_cursor_json", &state.data_cursor_json},
      {"job_spec_json", &state.job_spec_json}};
  for (const auto& [field, out] : strings) {
    if (!j.contains(field) || !j[field].is_string()) {
      return DataLoss(path, absl::StrCat("\"", field, "\" is not a string"));
    }
    *out = j[field].get<std::string>();
  }
  // Optional: absent in checkpoints of standalone runs and from before ids.
  if (j.contains("job_id")) {
    if (!j["job_id"].is_string()) return DataLoss(path, "\"job_id\" is not a string");
    state.job_id = j["job_id"].get<std::string>();
  }
  return state;
}

// FAILED_PRECONDITION unless the checkpoint's layout equals the store's.
absl::Status CompareLayouts(const std::string& dir, const ModelLayout& checkpoint,
                            const ModelLayout& store) {
  if (checkpoint.blocks.size() != store.blocks.size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the checkpoint's model has %d blocks (%d decoder layers), the store's has %d "
        "(%d decoder layers)",
        dir, checkpoint.blocks.size(), checkpoint.num_layers(), store.blocks.size(),
        store.num_layers()));
  }
  for (size_t block = 0; block < store.blocks.size(); ++block) {
    const std::vector<ParamSpec>& ours = checkpoint.blocks[block].params;
    const std::vector<ParamSpec>& theirs = store.blocks[block].params;
    for (size_t idx = 0; idx < std::max(ours.size(), theirs.size()); ++idx) {
      if (idx >= ours.size() || idx >= theirs.size() || ours[idx].hf_name != theirs[idx].hf_name) {
        return absl::FailedPreconditionError(
            absl::StrFormat("%s: block %d: tensor %d is '%s' in the checkpoint, '%s' in the store",
                            dir, block, idx, idx < ours.size() ? ours[idx].hf_name : "(none)",
                            idx < theirs.size() ? theirs[idx].hf_name : "(none)"));
      }
      if (ours[idx].shape != theirs[idx].shape) {
        return absl::FailedPreconditionError(
            absl::StrFormat("%s: tensor '%s': shape [%s] in the checkpoint, [%s] in the store", dir,
                            ours[idx].hf_name, absl::StrJoin(ours[idx].shape, ", "),
                            absl::StrJoin(theirs[idx].shape, ", ")));
      }
    }
    if (checkpoint.blocks[block].numel != store.blocks[block].numel) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: block %d: %d elements in the checkpoint, %d in the store", dir,
                          block, checkpoint.blocks[block].numel, store.blocks[block].numel));
    }
  }
  return absl::OkStatus();
}

// Opens a tensor file and checks its size against the manifest and its
// header against `layout` (the checkpoint's own, already equal to the
// store's). Touches nothing.
absl::StatusOr<MappedFile> OpenTensorFile(const std::string& dir, const Manifest& manifest,
                                          const TensorFileKind& kind, const ModelLayout& layout) {
  MEGATRAIN_ASSIGN_OR_RETURN(ManifestEntry entry, FindEntry(manifest, dir, kind.file_name));
  MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, OpenCheckpointFile(dir, kind.file_name));
  MEGATRAIN_RETURN_IF_ERROR(CheckSize(file, entry));
  const uint8_t* data = file.data();
  if (file.size() < kTensorHeaderBytes || std::memcmp(data, kTensorMagic, 8) != 0) {
    return DataLoss(file.path(), "bad magic (expected \"MTCKPTBK\")");
  }
  uint32_t version, kind_field, dtype, reserved;
  uint64_t num_blocks, total_numel;
  std::memcpy(&version, data + kOffsetVersion, 4);
  std::memcpy(&kind_field, data + kOffsetKind, 4);
  std::memcpy(&dtype, data + kOffsetDtype, 4);
  std::memcpy(&reserved, data + kOffsetReserved, 4);
  std::memcpy(&num_blocks, data + kOffsetNumBlocks, 8);
  std::memcpy(&total_numel, data + kOffsetTotalNumel, 8);
  if (version == 0) return DataLoss(file.path(), "version 0");
  if (version > kCheckpointFormatVersion) {
    return absl::UnimplementedError(
        absl::StrFormat("%s: format version %d is newer than this build reads (%d)", file.path(),
                        version, kCheckpointFormatVersion));
  }
  if (kind_field != kind.kind || dtype != kTensorDtypeF32 || reserved != 0) {
    return DataLoss(file.path(),
                    absl::StrFormat("header: kind %d (expected %d), dtype %d (expected %d), "
                                    "reserved %d (expected 0)",
                                    kind_field, kind.kind, dtype, kTensorDtypeF32, reserved));
  }
  for (size_t offset = kOffsetReservedTail; offset < kTensorHeaderBytes; ++offset) {
    if (data[offset] != 0) {
      return DataLoss(file.path(), absl::StrFormat("header: reserved byte %d is not 0", offset));
    }
  }
  if (num_blocks != layout.blocks.size()) {
    return DataLoss(file.path(), absl::StrFormat("%d blocks, config.json implies %d", num_blocks,
                                                 layout.blocks.size()));
  }
  const uint64_t table_end = kTensorHeaderBytes + 8 * num_blocks;
  if (file.size() < table_end) return DataLoss(file.path(), "truncated block table");
  uint64_t expected_total = 0;
  for (size_t block = 0; block < num_blocks; ++block) {
    uint64_t numel;
    std::memcpy(&numel, data + kTensorHeaderBytes + 8 * block, 8);
    if (numel != static_cast<uint64_t>(layout.blocks[block].numel)) {
      return DataLoss(file.path(), absl::StrFormat("block %d: %d elements, config.json implies %d",
                                                   block, numel, layout.blocks[block].numel));
    }
    expected_total += numel;
  }
  if (total_numel != expected_total || file.size() != table_end + expected_total * sizeof(float)) {
    return DataLoss(file.path(),
                    absl::StrFormat("%d bytes, header implies %d (total_numel %d)", file.size(),
                                    table_end + expected_total * sizeof(float), total_numel));
  }
  file.AdviseSequential();
  return file;
}

// Writes `block`'s moment `kind` from `src` (the block's bytes in a
// tensor file, hashed on the way) to the NVMe tier's files: each shard's
// piece a chunk at a time, in element order (Note [Tier shards] in
// store/nvme_tier.h), so that every write starts 4 KiB-aligned in its file
// and pads only the piece's end.
absl::Status RestoreTierBlock(const NvmeMomentTier& tier, const TensorFileKind& kind, int64_t block,
                              const uint8_t* src, XXH64_state_t* hash) {
  constexpr int64_t kChunkElements = kRestoreChunkBytes / sizeof(float);
  for (const NvmeBlockPiece& piece : tier.Pieces(block)) {
    const uint8_t* piece_src = src + piece.begin * static_cast<int64_t>(sizeof(float));
    for (int64_t begin = 0; begin < piece.count; begin += kChunkElements) {
      const int64_t count = std::min(kChunkElements, piece.count - begin);
      const uint8_t* chunk = piece_src + begin * static_cast<int64_t>(sizeof(float));
      XXH64_update(hash, chunk, static_cast<size_t>(count) * sizeof(float));
      MEGATRAIN_RETURN_IF_ERROR(piece.files->Write(TierKind(kind), piece.file_offset + begin, count,
                                                   reinterpret_cast<const float*>(chunk)));
    }
  }
  return absl::OkStatus();
}

// Copies the data of a validated tensor file into the store (moments the
// store does not keep into `tier`), hashing the whole file on the way, and
// checks the digest.
absl::Status RestoreTensorFile(const MappedFile& file, const Manifest& manifest,
                               const std::string& dir, const TensorFileKind& kind, HostStore* store,
                               const NvmeMomentTier* tier) {
  MEGATRAIN_ASSIGN_OR_RETURN(ManifestEntry entry, FindEntry(manifest, dir, kind.file_name));
  Xxh64State hash = NewXxh64State();
  const size_t table_end = kTensorHeaderBytes + 8 * static_cast<size_t>(store->num_blocks());
  XXH64_update(hash.get(), file.data(), table_end);
  const uint8_t* src = file.data() + table_end;
  for (int64_t block = 0; block < store->num_blocks(); ++block) {
    uint8_t* dst = reinterpret_cast<uint8_t*>((store->*kind.buffer)(block));
    const size_t bytes = static_cast<size_t>(store->block_numel(block)) * sizeof(float);
    if (dst == nullptr) {  // a moment on the NVMe tier
      MEGATRAIN_RETURN_IF_ERROR(RestoreTierBlock(*tier, kind, block, src, hash.get()));
      src += bytes;
      continue;
    }
    for (size_t begin = 0; begin < bytes; begin += kRestoreChunkBytes) {
      const size_t count = std::min(kRestoreChunkBytes, bytes - begin);
      XXH64_update(hash.get(), src + begin, count);
      std::memcpy(dst + begin, src + begin, count);
    }
    src += bytes;
  }
  return CheckDigest(file.path(), XXH64_digest(hash.get()), entry);
}

}  // namespace

std::string CheckpointDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

namespace {

// WriteCheckpoint's argument checks (its Errors, but the file system's).
absl::Status CheckWriteArguments(const HostStore& store, const CheckpointState& state,
                                 const CheckpointSpec& retention, const NvmeMomentTier* tier) {
  if (state.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("state.step: must be >= 0, got ", state.step));
  }
  // The bounds live in the spec library, once (kCheckpointKeepLastRange).
  MEGATRAIN_RETURN_IF_ERROR(CheckCheckpointRetention(retention));
  MEGATRAIN_RETURN_IF_ERROR(CheckUtf8("schedule_json", state.schedule_json));
  MEGATRAIN_RETURN_IF_ERROR(CheckUtf8("data_cursor_json", state.data_cursor_json));
  MEGATRAIN_RETURN_IF_ERROR(CheckUtf8("job_spec_json", state.job_spec_json));
  MEGATRAIN_RETURN_IF_ERROR(CheckUtf8("job_id", state.job_id));
  if (!store.options().optimizer_state || (!store.options().moments_in_host && tier == nullptr)) {
    return absl::FailedPreconditionError(
        "WriteCheckpoint: the store has no optimizer state (AdamW moments) to save");
  }
  if (tier != nullptr && tier->num_blocks() != store.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteCheckpoint: the NVMe tier has ",
                                                   tier->num_blocks(), " blocks, the store ",
                                                   store.num_blocks()));
  }
  return absl::OkStatus();
}

// Writes every file of a checkpoint into `temp_fd` (manifest.json last),
// then fsyncs it; `files` and `manifest_entry` receive their sizes and
// digests. Messages name the files through the descriptor's path.
absl::Status WriteCheckpointFiles(const HostStore& store, const CheckpointState& state,
                                  const NvmeMomentTier* tier, const DirFd& temp_fd,
                                  std::map<std::string, ManifestEntry>* files,
                                  ManifestEntry* manifest_entry) {
  const std::string temp_fd_io = temp_fd.IoPath();
  MEGATRAIN_ASSIGN_OR_RETURN((*files)[kConfigFile], WriteTextFile(temp_fd_io, kConfigFile,
                                                                  store.config().ToHfConfigJson()));
  MEGATRAIN_ASSIGN_OR_RETURN((*files)[kStateFile],
                             WriteTextFile(temp_fd_io, kStateFile, StateJson(state)));
  for (const TensorFileKind* kind : {&kMasterFile, &kExpAvgFile, &kExpAvgSqFile}) {
    MEGATRAIN_ASSIGN_OR_RETURN((*files)[kind->file_name],
                               WriteTensorFile(temp_fd_io, *kind, store, tier));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(
      *manifest_entry, WriteTextFile(temp_fd_io, kManifestFile, ManifestJson(state.step, *files)));
  return temp_fd.Fsync();
}

// After writing `temp_name` failed with `written`: removes it (freeing the
// space a full disk needs) and returns `written` with what is left said:
// whether the partial checkpoint is gone and the newest earlier one.
absl::Status ExplainFailedWrite(const DirFd& root_fd, const std::string& name,
                                const std::string& temp_name, const absl::Status& written) {
  const std::string& root = root_fd.path();
  const std::string temp_dir = JoinPath(root, temp_name);
  const absl::Status removed = root_fd.RemoveTreeAt(temp_name);
  absl::StatusOr<std::vector<StepDir>> earlier = ListStepDirs(root_fd.IoPath());
  std::string left;
  if (!earlier.ok() || earlier->empty()) {
    left = "no earlier checkpoint exists";
  } else {
    left = absl::StrCat(
        "earlier checkpoints are intact (newest: ", JoinPath(root, earlier->back().name), ")");
  }
  const std::string cleanup =
      removed.ok() ? absl::StrCat("the partial checkpoint ", temp_dir, " was removed")
                   : absl::StrCat("removing the partial checkpoint failed too (", removed.message(),
                                  "; the next write removes it)");
  return absl::Status(written.code(), absl::StrCat("writing checkpoint ", name, ": ",
                                                   written.message(), "; ", cleanup, "; ", left));
}

// Note [Checkpoint publication] step 3: renames the written `temp_name` to
// `name` (exchanging with an existing `name`) and fsyncs `checkpoints/`.
// Afterwards `temp_name` is gone or holds the replaced checkpoint; the
// caller removes it.
absl::Status PublishCheckpoint(const DirFd& root_fd, const std::string& temp_name,
                               const std::string& name, const std::string& aside_name) {
  if (root_fd.StatAt(name).ok()) {
    // The old checkpoint ends up at temp_name (exchange) or at the aside
    // name; both are recorded `.tmp-*` and removed by the caller or by the
    // next write.
    MEGATRAIN_RETURN_IF_ERROR(ReplaceDirectory(root_fd, temp_name, name, aside_name));
    MEGATRAIN_RETURN_IF_ERROR(root_fd.Fsync());
    (void)root_fd.RemoveTreeAt(aside_name);
    return absl::OkStatus();
  }
  if (::renameat(root_fd.fd(), temp_name.c_str(), root_fd.fd(), name.c_str()) != 0) {
    return ErrnoError(errno, JoinPath(root_fd.path(), name),
                      "rename the new checkpoint into place");
  }
  return root_fd.Fsync();
}

}  // namespace

// Note [Checkpoint publication]
// 1. Clean `.tmp-*` leftovers of crashed writes and deletions.
// 2. Write every file into `.tmp-step-N.XXXXXX/` (each fsync'd by
//    AtomicFileWriter), manifest.json last, then fsync that directory.
// 3. rename() it to `step-N` (or exchange with an existing `step-N`) and
//    fsync `checkpoints/`: before this fsync a crash shows the old state,
//    after it the new one; never a partial `step-N`.
// 4. Retention: rename doomed checkpoints to `.tmp-delete-*`, fsync,
//    delete.
//
// Every entry below `checkpoints/` is reached through its descriptor
// `root_fd`, never by following a symbolic link (Note [Directory
// descriptors] in dir_fd.h): a link swapped in fails the write and nothing
// outside is written or deleted. `root` and `temp_dir` name them in
// messages.
absl::StatusOr<CheckpointInfo> WriteCheckpoint(const HostStore& store, const CheckpointState& state,
                                               const std::string& output_dir,
                                               const CheckpointSpec& retention,
                                               const NvmeMomentTier* tier) {
  MEGATRAIN_RETURN_IF_ERROR(CheckWriteArguments(store, state, retention, tier));
  // Note [Checkpoint publication] above.
  // Note [Held output directory] (held_output_dir.h): on the daemon's job
  // thread output_dir is the held descriptor, verified to still be where
  // its path leads; nothing below is reached by its path.
  MEGATRAIN_ASSIGN_OR_RETURN(DirFd root_fd,
                             OpenOutputSubdir(output_dir, kCheckpointsSubdir, DirFd::Create::kYes));
  const std::string& root = root_fd.path();
  // Durable `checkpoints/` entry (an fsync writes nothing, wherever the
  // path leads now).
  MEGATRAIN_RETURN_IF_ERROR(FsyncDirectory(output_dir));
  // Note [Checkpoint ledger]: only what this writer recorded is deleted.
  Ledger ledger = ReadLedger(root_fd);
  RemoveRecordedTemporaries(root_fd, ledger);

  const std::string name = CheckpointDirName(state.step);
  // Named and recorded first, created after (Note [Checkpoint ledger]): no
  // instant in which the temporary exists unrecorded. The aside name is
  // recorded too: a replacement of step `name` may leave the old checkpoint
  // there.
  const std::string temp_name = absl::StrCat(kTempPrefix, name, ".", RandomSuffix());
  const std::string aside_name = absl::StrCat(kTempPrefix, "delete-", name);
  ledger.temporaries.insert(temp_name);
  ledger.temporaries.insert(aside_name);
  MEGATRAIN_RETURN_IF_ERROR(
      Annotate(WriteLedger(root_fd, ledger), absl::StrCat("writing checkpoint ", name)));
  const std::string temp_dir = JoinPath(root, temp_name);
  if (::mkdirat(root_fd.fd(), temp_name.c_str(), 0755) != 0) {
    return Annotate(ErrnoError(errno, temp_dir, "create temporary directory"),
                    absl::StrCat("writing checkpoint ", name));
  }
  RemoveTreeGuard temp_guard(root_fd.IoPath(temp_name));
  MEGATRAIN_ASSIGN_OR_RETURN(DirFd temp_fd, root_fd.OpenChild(temp_name, DirFd::Create::kNo));

  std::map<std::string, ManifestEntry> files;
  ManifestEntry manifest_entry;
  const absl::Status written =
      ShowPath(WriteCheckpointFiles(store, state, tier, temp_fd, &files, &manifest_entry),
               temp_fd.IoPath(), temp_dir);
  if (!written.ok()) {
    // The earlier checkpoints were not touched.
    temp_guard.Release();
    return ExplainFailedWrite(root_fd, name, temp_name, written);
  }
  MEGATRAIN_RETURN_IF_ERROR(PublishCheckpoint(root_fd, temp_name, name, aside_name));

  CheckpointInfo info;
  info.dir = JoinPath(root, name);
  info.step = state.step;
  info.bytes = static_cast<int64_t>(manifest_entry.bytes);
  for (const auto& [file_name, entry] : files) info.bytes += static_cast<int64_t>(entry.bytes);
  info.job_id = state.job_id;
  info.manifest_xxh64 = manifest_entry.xxh64;

  // The temporary is gone (renamed) or holds the replaced checkpoint.
  temp_guard.Release();
  (void)root_fd.RemoveTreeAt(temp_name);
  ledger.checkpoints.insert(name);
  RemoveRecordedTemporaries(root_fd, ledger);
  MEGATRAIN_RETURN_IF_ERROR(
      Annotate(ApplyRetention(root_fd, state.step, retention, ledger),
               absl::StrCat(info.dir, " was written, but deleting older checkpoints failed")));
  MEGATRAIN_RETURN_IF_ERROR(Annotate(
      WriteLedger(root_fd, ledger),
      absl::StrCat(info.dir, " was written, but recording it in ", kLedgerFile, " failed")));
  return info;
}

absl::StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& checkpoint_dir) {
  MEGATRAIN_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(checkpoint_dir));
  MEGATRAIN_ASSIGN_OR_RETURN(std::string text,
                             ReadVerifiedText(checkpoint_dir, manifest, kConfigFile));
  return ParseHfConfig(text, JoinPath(checkpoint_dir, kConfigFile));
}

absl::Status CheckCheckpointModel(const std::string& checkpoint_dir, const ModelConfig& config) {
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig stored, ReadCheckpointConfig(checkpoint_dir));
  return CompareLayouts(checkpoint_dir, ModelLayout::Create(stored), ModelLayout::Create(config));
}

absl::StatusOr<CheckpointState> ReadCheckpoint(const std::string& checkpoint_dir, HostStore* store,
                                               const NvmeMomentTier* tier,
                                               CheckpointMoments moments) {
  if (store == nullptr) return absl::InvalidArgumentError("ReadCheckpoint: store is null");
  const bool read_moments = store->options().optimizer_state && moments == CheckpointMoments::kRead;
  if (read_moments && !store->options().moments_in_host && tier == nullptr) {
    return absl::FailedPreconditionError(
        "ReadCheckpoint: the store keeps its AdamW moments on the NVMe tier, and no tier was "
        "given");
  }
  if (read_moments && tier != nullptr && tier->num_blocks() != store->num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat("ReadCheckpoint: the NVMe tier has ",
                                                   tier->num_blocks(), " blocks, the store ",
                                                   store->num_blocks()));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(checkpoint_dir));

  // Small files first: the model and the state, both verified.
  MEGATRAIN_ASSIGN_OR_RETURN(std::string config_text,
                             ReadVerifiedText(checkpoint_dir, manifest, kConfigFile));
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig config,
                             ParseHfConfig(config_text, JoinPath(checkpoint_dir, kConfigFile)));
  const std::string state_path = JoinPath(checkpoint_dir, kStateFile);
  MEGATRAIN_ASSIGN_OR_RETURN(std::string state_text,
                             ReadVerifiedText(checkpoint_dir, manifest, kStateFile));
  MEGATRAIN_ASSIGN_OR_RETURN(CheckpointState state, ParseState(state_path, state_text));
  if (state.step != manifest.step) {
    return DataLoss(state_path,
                    absl::StrFormat("step %d, manifest.json says %d", state.step, manifest.step));
  }

  const ModelLayout layout = ModelLayout::Create(config);
  MEGATRAIN_RETURN_IF_ERROR(CompareLayouts(checkpoint_dir, layout, store->layout()));

  // Open and check every tensor file before writing the store.
  std::vector<const TensorFileKind*> kinds = {&kMasterFile};
  if (read_moments) {
    kinds.push_back(&kExpAvgFile);
    kinds.push_back(&kExpAvgSqFile);
  }
  std::vector<MappedFile> tensor_files;
  for (const TensorFileKind* kind : kinds) {
    MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file,
                               OpenTensorFile(checkpoint_dir, manifest, *kind, layout));
    tensor_files.push_back(std::move(file));
  }
  for (size_t idx = 0; idx < kinds.size(); ++idx) {
    MEGATRAIN_RETURN_IF_ERROR(
        RestoreTensorFile(tensor_files[idx], manifest, checkpoint_dir, *kinds[idx], store, tier));
  }
  store->RefreshAllStreamingCopies();
  return state;
}

absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& output_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(output_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(output_dir, ": no such output directory"));
  }
  const std::string root = JoinPath(output_dir, kCheckpointsSubdir);
  std::vector<CheckpointInfo> infos;
  if (!std::filesystem::is_directory(root, ec)) return infos;
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<StepDir> dirs, ListStepDirs(root));
  for (const StepDir& dir : dirs) {
    CheckpointInfo info;
    info.dir = JoinPath(root, dir.name);
    info.step = dir.step;
    info.bytes = DirectoryBytes(info.dir);
    infos.push_back(std::move(info));
  }
  return infos;
}

absl::StatusOr<CheckpointInfo> VerifyCheckpoint(const std::string& checkpoint_dir,
                                                bool check_data) {
  MEGATRAIN_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(checkpoint_dir));
  const std::string state_path = JoinPath(checkpoint_dir, kStateFile);
  MEGATRAIN_ASSIGN_OR_RETURN(std::string state_text,
                             ReadVerifiedText(checkpoint_dir, manifest, kStateFile));
  MEGATRAIN_ASSIGN_OR_RETURN(CheckpointState state, ParseState(state_path, state_text));
  if (state.step != manifest.step) {
    return DataLoss(state_path,
                    absl::StrFormat("step %d, manifest.json says %d", state.step, manifest.step));
  }
  CheckpointInfo info;
  info.dir = checkpoint_dir;
  info.step = state.step;
  info.job_id = state.job_id;
  {
    MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, OpenCheckpointFile(checkpoint_dir, kManifestFile));
    info.manifest_xxh64 = XXH64(file.data(), file.size(), kXxhSeed);
    info.bytes = static_cast<int64_t>(file.size());
  }
  for (const auto& [name, entry] : manifest.files) {
    info.bytes += static_cast<int64_t>(entry.bytes);
    if (!check_data || name == kStateFile) continue;
    MEGATRAIN_ASSIGN_OR_RETURN(MappedFile file, OpenCheckpointFile(checkpoint_dir, name));
    MEGATRAIN_RETURN_IF_ERROR(CheckSize(file, entry));
    MEGATRAIN_RETURN_IF_ERROR(
        CheckDigest(file.path(), XXH64(file.data(), file.size(), kXxhSeed), entry));
  }
  return info;
}

absl::StatusOr<int64_t> AdoptRecordedCheckpoints(const std::string& output_dir,
                                                 const std::vector<std::string>& checkpoint_dirs) {
  absl::StatusOr<DirFd> root_fd =
      OpenOutputSubdir(output_dir, kCheckpointsSubdir, DirFd::Create::kNo);
  if (absl::IsNotFound(root_fd.status())) return 0;
  if (!root_fd.ok()) return root_fd.status();
  const std::filesystem::path root =
      std::filesystem::path(JoinPath(output_dir, kCheckpointsSubdir)).lexically_normal();
  Ledger ledger = ReadLedger(*root_fd);
  int64_t adopted = 0;
  for (const std::string& dir : checkpoint_dirs) {
    std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
    if (!path.has_filename()) path = path.parent_path();  // a trailing '/
    const std::string name = path.filename().string();
    const int64_t step = StepFromDirName(name);
    if (path.parent_path() != root || step < 0 || name != CheckpointDirName(step)) continue;
    if (ledger.checkpoints.contains(name)) continue;
    absl::StatusOr<struct stat> info = root_fd->StatAt(name);
    if (!info.ok() || !S_ISDIR(info->st_mode)) continue;
    ledger.checkpoints.insert(name);
    ++adopted;
  }
  if (adopted == 0) return 0;
  MEGATRAIN_RETURN_IF_ERROR(
      Annotate(WriteLedger(*root_fd, ledger), "adopting recorded checkpoints"));
  return adopted;
}

absl::Status ExportHfModel(const std::string& checkpoint_dir, const std::string& out_dir,
                           const std::string& dtype) {
  return ExportHfModelFrom(checkpoint_dir, out_dir, dtype, "").status();
}

absl::StatusOr<HfExportReport> ExportHfModelFrom(const std::string& checkpoint_dir,
                                                 const std::string& out_dir,
                                                 const std::string& dtype,
                                                 const std::string& source_dir) {
  HfExportOptions export_options;
  MEGATRAIN_ASSIGN_OR_RETURN(export_options.dtype, ParseExportDtype(dtype));
  export_options.source_dir = source_dir;
  MEGATRAIN_ASSIGN_OR_RETURN(ModelConfig config, ReadCheckpointConfig(checkpoint_dir));
  HostStoreOptions options;
  options.streaming_bf16 = false;
  options.pin = false;
  options.optimizer_state = false;  // master only: no grads, no moments
  MEGATRAIN_ASSIGN_OR_RETURN(std::unique_ptr<HostStore> store, HostStore::Create(config, options));
  MEGATRAIN_RETURN_IF_ERROR(ReadCheckpoint(checkpoint_dir, store.get()).status());
  return ExportHfDirectory(*store, out_dir, export_options);
}

}  // namespace megatrain::engine
