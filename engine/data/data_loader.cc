// DataLoader: packing, shuffling, the eval split and the cursor (Note
// [Packing rule] in data_loader.h).
#include "engine/data/data_loader.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "engine/runtime/status_macros.h"
#include "engine/data/token_shard.h"
#include "engine/spec/job_spec.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {

namespace {

// SplitMix64's increment (the golden ratio, 2^64 / phi).
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;
// Salt of the eval split hash, so it is independent of the shuffle
// ("evalsplt" in ASCII).
constexpr uint64_t kEvalSalt = 0x6576616C73706C74ull;
// Tokens per chunk when scanning a shard's ids: 256 KiB of uint32.
constexpr size_t kScanChunkTokens = size_t{1} << 16;
// Largest micro-batch, in tokens: rows are indexed with int32 downstream.
constexpr int64_t kMaxBatchTokens = int64_t{1} << 31;

// A SplitMix64 generator (Steele et al. 2014), written out so that the
// stream is the same on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += kGoldenGamma;
    return Mix64(state_);
  }
  // Uniform in [0, bound), bound >= 1: rejects the 2^64 mod bound smallest
  // values so that every residue is equally likely.
  uint64_t Below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    while (true) {
      const uint64_t r = Next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

// The hash behind IsHeldOutDocument, as a fraction in [0, 1): its top 53
// bits, so the conversion to double is exact.
double HeldOutHash(uint64_t doc_idx, uint64_t seed) {
  const uint64_t h = Mix64(Mix64(doc_idx) ^ seed ^ kEvalSalt);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// One document of a Source: tokens [begin, begin + size) of shard shard_idx.
struct DocRef {
  uint64_t begin = 0;  // token index within the shard
  uint64_t size = 0;   // in tokens
  uint32_t shard_idx = 0;
};

// A set of shards read as one sequence of documents (global indices).
struct Source {
  std::string field;  // "data.tokens" or "data.eval_tokens", for messages
  std::vector<TokenShardReader> shards;
  std::vector<std::optional<TokenShardReader>> masks;  // per shard
  std::vector<DocRef> docs;                            // every document, by global index
  uint64_t num_tokens = 0;
};

// Where a stream stands: the next token is token `offset` of the document at
// `position` in epoch `epoch`'s order; offset == its size means its EOS.
struct StreamPos {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t offset = 0;
};

bool EndsWith(const std::string& s, absl::string_view suffix) {
  return s.size() >= suffix.size() &&
         absl::string_view(s).substr(s.size() - suffix.size()) == suffix;
}

// The shard files named by `path`: itself, or a directory's *.mtt files
// sorted by name.
absl::StatusOr<std::vector<std::string>> ListShards(const std::string& path,
                                                    absl::string_view field) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(field, ": ", path, ": no such file or directory"));
  }
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": ", ec.message()));
  }
  if (!fs::is_directory(status)) return std::vector<std::string>{path};
  std::vector<std::string> paths;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (EndsWith(name, kTokenShardSuffix) && it->is_regular_file(ec)) {
      paths.push_back(it->path().string());
    }
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, ": cannot list the directory: ", ec.message()));
  }
  if (paths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": directory holds no *",
                                                   kTokenShardSuffix,
                                                   " token shards (empty dataset)"));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// INVALID_ARGUMENT unless every id of `shard` is below `vocab_size`.
absl::Status CheckIds(const TokenShardReader& shard, uint64_t vocab_size, absl::string_view field) {
  std::vector<uint32_t> chunk(kScanChunkTokens);
  for (uint64_t chunk_begin = 0; chunk_begin < shard.num_tokens(); chunk_begin += chunk.size()) {
    const size_t count =
        static_cast<size_t>(std::min<uint64_t>(chunk.size(), shard.num_tokens() - chunk_begin));
    MEGATRAIN_RETURN_IF_ERROR(shard.CopyTokens(chunk_begin, absl::MakeSpan(chunk.data(), count)));
    const auto bad = std::find_if(chunk.begin(), chunk.begin() + count,
                                  [vocab_size](uint32_t id) { return id >= vocab_size; });
    if (bad == chunk.begin() + count) continue;
    const uint64_t token_idx = chunk_begin + (bad - chunk.begin());
    // The document holding token_idx: the last one beginning at or before
    // it (empty documents begin where the next one does).
    uint64_t lo = 0;
    uint64_t hi = shard.num_documents();  // begin(hi) > token_idx
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (shard.document_begin(mid) <= token_idx) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s: document %u, position %u: token id %u is not below the "
        "model's vocab_size %u (data tokenized for another model?)",
        field, shard.path(), lo, token_idx - shard.document_begin(lo), *bad, vocab_size));
  }
  return absl::OkStatus();
}

// Opens `mask_path`, the loss mask of `shard`, and checks that it matches.
absl::StatusOr<TokenShardReader> OpenMask(const std::string& mask_path,
                                          const TokenShardReader& shard,
                                          TokenShardParseOptions parse_options,
                                          absl::string_view field) {
  absl::StatusOr<TokenShardReader> mask = TokenShardReader::Open(mask_path, parse_options);
  if (!mask.ok()) return Annotate(mask.status(), field);
  if (mask->vocab_size() != 2) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s: loss mask has vocab_size %u, must be 2 (ids 0 and 1)", field,
                        mask_path, mask->vocab_size()));
  }
  if (mask->num_documents() != shard.num_documents() || mask->num_tokens() != shard.num_tokens()) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s: loss mask has %u documents and %u tokens, its shard %s has "
                        "%u and %u",
                        field, mask_path, mask->num_documents(), mask->num_tokens(), shard.path(),
                        shard.num_documents(), shard.num_tokens()));
  }
  for (uint64_t doc_idx = 0; doc_idx < shard.num_documents(); ++doc_idx) {
    if (mask->document_size(doc_idx) != shard.document_size(doc_idx)) {
      return absl::DataLossError(absl::StrFormat(
          "%s: %s: loss mask document %u has %u tokens, the shard's has %u", field, mask_path,
          doc_idx, mask->document_size(doc_idx), shard.document_size(doc_idx)));
    }
  }
  return mask;
}

// Opens the shards of `path` (and their masks) and indexes the documents.
absl::StatusOr<Source> OpenSource(const std::string& path, absl::string_view field,
                                  const DataLoaderOptions& options) {
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<std::string> paths, ListShards(path, field));
  const TokenShardParseOptions parse_options{.verify_body = options.verify_shards};
  const uint64_t vocab_size = static_cast<uint64_t>(options.vocab_size);
  Source source;
  source.field = std::string(field);
  for (const std::string& shard_path : paths) {
    absl::StatusOr<TokenShardReader> shard = TokenShardReader::Open(shard_path, parse_options);
    if (!shard.ok()) return Annotate(shard.status(), field);
    // A verified shard's ids are below its own vocab_size: no scan needed
    // when that is within the model's.
    const bool ids_known_good =
        options.verify_shards && shard->vocab_size() != 0 && shard->vocab_size() <= vocab_size;
    if (!ids_known_good) {
      MEGATRAIN_RETURN_IF_ERROR(CheckIds(*shard, vocab_size, field));
    }
    std::optional<TokenShardReader> mask;
    const std::string mask_path = shard_path + kLossMaskSuffix;
    std::error_code ec;
    if (std::filesystem::exists(mask_path, ec)) {
      MEGATRAIN_ASSIGN_OR_RETURN(mask, OpenMask(mask_path, *shard, parse_options, field));
    }
    if (source.shards.size() >= std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": too many shards"));
    }
    const uint32_t shard_idx = static_cast<uint32_t>(source.shards.size());
    for (uint64_t doc_idx = 0; doc_idx < shard->num_documents(); ++doc_idx) {
      source.docs.push_back({.begin = shard->document_begin(doc_idx),
                             .size = shard->document_size(doc_idx),
                             .shard_idx = shard_idx});
    }
    source.num_tokens += shard->num_tokens();
    source.shards.push_back(*std::move(shard));
    source.masks.push_back(std::move(mask));
  }
  if (source.num_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s: %u shard(s) with %u documents hold no tokens (empty "
                        "dataset)",
                        field, path, source.shards.size(), source.docs.size()));
  }
  return source;
}

// A window being read: tokens, whether each may be a label (its mask), and
// whether each begins a document (Note [Packing rule]); T + 1 entries.
struct Window {
  explicit Window(size_t size) : tokens(size), trained(size), starts(size) {}
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;
  std::vector<uint8_t> starts;
};

// Reads up to `count` tokens of the packed stream of `source` from `pos`
// (advancing it) into window entries [at, at + n): tokens, trained (1: the
// token may be a label) and starts (1: a document's first token).
// `doc_at(epoch, position)` gives the global index of a document among
// `num_docs` per epoch. With `wrap`, epochs follow one another and n ==
// count; without, reading stops at the end of epoch 0. Returns n.
template <typename DocAt>
absl::StatusOr<size_t> ReadStream(const Source& source, DocAt&& doc_at, uint64_t num_docs,
                                  bool wrap, int32_t eos_id, StreamPos& pos, size_t count,
                                  Window& window, size_t at) {
  int32_t* tokens = window.tokens.data() + at;
  uint8_t* trained = window.trained.data() + at;
  uint8_t* starts = window.starts.data() + at;
  std::vector<int32_t> mask_chunk;
  size_t done = 0;
  while (done < count) {
    if (pos.position >= num_docs) break;  // only without wrap
    const DocRef& doc = source.docs[doc_at(pos.epoch, pos.position)];
    const TokenShardReader& shard = source.shards[doc.shard_idx];
    const std::optional<TokenShardReader>& mask = source.masks[doc.shard_idx];
    if (pos.offset < doc.size) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(count - done, doc.size - pos.offset));
      MEGATRAIN_RETURN_IF_ERROR(
          shard.CopyTokens(doc.begin + pos.offset, absl::MakeSpan(tokens + done, n)));
      std::fill(starts + done, starts + done + n, uint8_t{0});
      starts[done] = pos.offset == 0;
      if (mask.has_value()) {
        mask_chunk.resize(n);
        MEGATRAIN_RETURN_IF_ERROR(
            mask->CopyTokens(doc.begin + pos.offset, absl::MakeSpan(mask_chunk)));
        for (size_t i = 0; i < n; ++i) trained[done + i] = mask_chunk[i] != 0;
      } else {
        std::fill(trained + done, trained + done + n, uint8_t{1});
      }
      done += n;
      pos.offset += n;
      continue;
    }
    // The EOS after the document; it takes the mask of the last token
    // (documents in a stream are never empty).
    tokens[done] = eos_id;
    trained[done] = mask.has_value() ? mask->token(doc.begin + doc.size - 1) != 0 : 1;
    starts[done] = 0;
    ++done;
    ++pos.position;
    pos.offset = 0;
    // Keep positions normal (position < num_docs) while wrapping, so that a
    // cursor taken at an epoch's end names the next epoch.
    if (wrap && pos.position >= num_docs) {
      ++pos.epoch;
      pos.position = 0;
    }
  }
  return done;
}

// Writes row `row` of `batch` from a window of `count` tokens (count <=
// T + 1; missing positions stay padding). `isolated`: also the row's
// position ids, and no label across a document boundary (Note [Packing
// rule]); padding continues the last document's positions (nothing before
// it attends to it).
void FillRow(const Window& window, size_t count, size_t seq_len, bool isolated, size_t row,
             MicroBatch& batch) {
  const int32_t* tokens = window.tokens.data();
  int32_t* input_ids = batch.input_ids.data() + row * seq_len;
  int32_t* labels = batch.labels.data() + row * seq_len;
  for (size_t t = 0; t < seq_len && t < count; ++t) input_ids[t] = tokens[t];
  for (size_t t = 0; t + 1 < count; ++t) {
    const bool crosses = isolated && window.starts[t + 1];
    labels[t] = window.trained[t + 1] && !crosses ? tokens[t + 1] : kIgnoreLabel;
  }
  if (!isolated) return;
  int32_t* positions = batch.position_ids.data() + row * seq_len;
  for (size_t t = 0; t < seq_len; ++t) {
    positions[t] = t == 0 || (t < count && window.starts[t]) ? 0 : positions[t - 1] + 1;
  }
}

// An empty micro-batch of `rows` x `seq_len` padding: EOS inputs, no
// labels, and position ids when `isolated`.
MicroBatch PaddedBatch(size_t rows, size_t seq_len, int32_t eos_id, bool isolated) {
  MicroBatch batch;
  batch.input_ids.assign(rows * seq_len, eos_id);
  batch.labels.assign(rows * seq_len, kIgnoreLabel);
  if (isolated) batch.position_ids.assign(rows * seq_len, 0);
  return batch;
}

absl::Status CheckMicroBatch(int64_t micro_batch, int64_t seq_len) {
  if (micro_batch < 1 || micro_batch > kMaxBatchTokens / seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("train.micro_batch: must be in [1, %d] for seq_len %d (2^31 tokens "
                        "per micro-batch), got %d",
                        kMaxBatchTokens / seq_len, seq_len, micro_batch));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Randomness

uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<uint64_t> ShuffledOrder(uint64_t count, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> order(count);
  std::iota(order.begin(), order.end(), uint64_t{0});
  SplitMix64 rng(Mix64(seed ^ Mix64(epoch)));
  for (uint64_t i = count; i > 1; --i) {
    std::swap(order[i - 1], order[rng.Below(i)]);
  }
  return order;
}

bool IsHeldOutDocument(uint64_t doc_idx, uint64_t seed, double eval_fraction) {
  return HeldOutHash(doc_idx, seed) < eval_fraction;
}

// ---------------------------------------------------------------------------
// DataCursor

std::string DataCursor::ToJson() const {
  const nlohmann::json json = {
      {"version", kVersion},
      {"epoch", epoch},
      {"document_position", document_position},
      {"token_offset", token_offset},
      {"windows", windows},
      {"shuffle_seed", shuffle_seed},
      {"num_train_documents", num_train_documents},
      {"num_train_tokens", num_train_tokens},
  };
  return json.dump();
}

absl::StatusOr<DataCursor> DataCursor::FromJson(absl::string_view json_text) {
  const nlohmann::json json =
      nlohmann::json::parse(json_text.begin(), json_text.end(), /*cb=*/nullptr,
                            /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        "data cursor: not a JSON object (expected DataCursor::ToJson() "
        "output)");
  }
  DataCursor cursor;
  const std::pair<const char*, uint64_t*> fields[] = {
      {"epoch", &cursor.epoch},
      {"document_position", &cursor.document_position},
      {"token_offset", &cursor.token_offset},
      {"windows", &cursor.windows},
      {"shuffle_seed", &cursor.shuffle_seed},
      {"num_train_documents", &cursor.num_train_documents},
      {"num_train_tokens", &cursor.num_train_tokens},
  };
  uint64_t version = 0;
  const auto get = [&json](const char* name, uint64_t* value) -> absl::Status {
    const auto it = json.find(name);
    if (it == json.end()) {
      return absl::InvalidArgumentError(absl::StrCat("data cursor: field '", name, "' is missing"));
    }
    if (!it->is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data cursor: field '", name, "' must be a non-negative integer, got ", it->dump()));
    }
    *value = it->get<uint64_t>();
    return absl::OkStatus();
  };
  MEGATRAIN_RETURN_IF_ERROR(get("version", &version));
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor: field 'version' is ", version, ", this build reads ", kVersion));
  }
  for (const auto& [name, value] : fields) {
    MEGATRAIN_RETURN_IF_ERROR(get(name, value));
  }
  return cursor;
}

// ---------------------------------------------------------------------------
// DataLoader

struct DataLoader::State {
  DataLoaderOptions options;
  Source train_source;
  std::optional<Source> eval_source;  // set with options.eval_tokens
  std::vector<uint64_t> train_docs;   // global indices into train_source
  std::vector<uint64_t> eval_docs;    // into eval_source or train_source
  uint64_t num_train_tokens = 0;
  uint64_t num_eval_tokens = 0;

  StreamPos pos;          // next window's first token
  uint64_t windows = 0;   // returned so far
  bool isolated = false;  // options.document_attention resolved

  // Shuffled orders of the last two epochs used (a window may span two).
  struct EpochOrder {
    uint64_t epoch = 0;
    std::vector<uint64_t> order;  // positions into train_docs
  };
  std::array<std::optional<EpochOrder>, 2> orders;
  size_t next_order_slot = 0;

  const Source& eval_from() const { return eval_source.has_value() ? *eval_source : train_source; }

  // Global document index at `position` of epoch `epoch`.
  uint64_t TrainDocAt(uint64_t epoch, uint64_t position) {
    if (!options.shuffle) return train_docs[position];
    for (const std::optional<EpochOrder>& cached : orders) {
      if (cached.has_value() && cached->epoch == epoch) {
        return train_docs[cached->order[position]];
      }
    }
    std::optional<EpochOrder>& slot = orders[next_order_slot];
    next_order_slot = (next_order_slot + 1) % orders.size();
    slot = EpochOrder{.epoch = epoch,
                      .order = ShuffledOrder(train_docs.size(), options.shuffle_seed, epoch)};
    return train_docs[slot->order[position]];
  }

  absl::StatusOr<size_t> ReadTrain(StreamPos& stream_pos, size_t count, Window& window, size_t at) {
    return ReadStream(
        train_source,
        [this](uint64_t epoch, uint64_t position) { return TrainDocAt(epoch, position); },
        train_docs.size(), /*wrap=*/true, static_cast<int32_t>(options.eos_id), stream_pos, count,
        window, at);
  }
};

DataLoader::DataLoader(std::unique_ptr<State> state) : state_(std::move(state)) {}
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;
DataLoader::~DataLoader() = default;

namespace {

// The options' own fields, before any file is opened.
absl::Status CheckLoaderOptions(const DataLoaderOptions& options) {
  if (options.tokens.empty()) {
    return absl::InvalidArgumentError(
        "data.tokens: is empty; name a token shard or a directory of *.mtt "
        "shards");
  }
  if (options.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.seq_len: must be at least 1, got ", options.seq_len));
  }
  if (options.vocab_size < 1 ||
      static_cast<uint64_t>(options.vocab_size) > kTokenShardMaxVocabSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("model vocab_size: must be in [1, 2^31], got ", options.vocab_size));
  }
  if (options.eos_id < 0 || options.eos_id >= options.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("data.eos_id: must be in [0, vocab_size ",
                                                   options.vocab_size, "), got ", options.eos_id));
  }
  MEGATRAIN_RETURN_IF_ERROR(
      CheckRealInRange("data.eval_fraction", options.eval_fraction, kEvalFractionRange));
  if (!options.eval_tokens.empty() && options.eval_fraction != 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.eval_fraction: must be 0 with data.eval_tokens (a separate "
                     "eval set), got ",
                     options.eval_fraction));
  }
  return absl::OkStatus();
}

// Without data.eval_tokens: holds out the documents IsHeldOutDocument picks
// (by a hash of the document index and shuffle_seed), keeping at least one
// non-empty document on each side when eval_fraction > 0.
absl::Status SplitByHash(const Source& train, const DataLoaderOptions& options,
                         std::vector<uint64_t>* train_docs, std::vector<uint64_t>* eval_docs) {
  uint64_t lowest = 0;   // non-empty document with the smallest hash
  uint64_t highest = 0;  // and with the largest
  double lowest_hash = 2.0;
  double highest_hash = -1.0;
  uint64_t non_empty = 0;
  for (uint64_t doc_idx = 0; doc_idx < train.docs.size(); ++doc_idx) {
    if (train.docs[doc_idx].size == 0) continue;
    ++non_empty;
    const double hash = HeldOutHash(doc_idx, options.shuffle_seed);
    if (hash < lowest_hash) {
      lowest = doc_idx;
      lowest_hash = hash;
    }
    if (hash > highest_hash) {
      highest = doc_idx;
      highest_hash = hash;
    }
    if (IsHeldOutDocument(doc_idx, options.shuffle_seed, options.eval_fraction)) {
      eval_docs->push_back(doc_idx);
    } else {
      train_docs->push_back(doc_idx);
    }
  }
  if (options.eval_fraction > 0.0) {
    if (non_empty < 2) {
      return absl::InvalidArgumentError(
          absl::StrFormat("data.eval_fraction: %g needs at least 2 non-empty documents to "
                          "hold one out, %s has %u",
                          options.eval_fraction, options.tokens, non_empty));
    }
    if (eval_docs->empty()) {
      eval_docs->push_back(lowest);
      train_docs->erase(std::find(train_docs->begin(), train_docs->end(), lowest));
    } else if (train_docs->empty()) {
      train_docs->push_back(highest);
      eval_docs->erase(std::find(eval_docs->begin(), eval_docs->end(), highest));
    }
  }
  return absl::OkStatus();
}

// kAuto: isolated when a training shard has a loss mask (SFT or chat
// data, whose documents are independent examples), else shared.
DocumentAttention ResolveDocumentAttention(DocumentAttention requested, const Source& train) {
  if (requested != DocumentAttention::kAuto) return requested;
  const bool masked = std::any_of(train.masks.begin(), train.masks.end(),
                                  [](const auto& mask) { return mask.has_value(); });
  return masked ? DocumentAttention::kIsolated : DocumentAttention::kShared;
}

}  // namespace

absl::StatusOr<DataLoader> DataLoader::Create(const DataLoaderOptions& options) {
  MEGATRAIN_RETURN_IF_ERROR(CheckLoaderOptions(options));
  auto state = std::make_unique<State>();
  state->options = options;
  MEGATRAIN_ASSIGN_OR_RETURN(state->train_source,
                             OpenSource(options.tokens, "data.tokens", options));
  const Source& train = state->train_source;

  if (!options.eval_tokens.empty()) {
    MEGATRAIN_ASSIGN_OR_RETURN(state->eval_source,
                               OpenSource(options.eval_tokens, "data.eval_tokens", options));
    for (uint64_t doc_idx = 0; doc_idx < train.docs.size(); ++doc_idx) {
      if (train.docs[doc_idx].size > 0) state->train_docs.push_back(doc_idx);
    }
    for (uint64_t doc_idx = 0; doc_idx < state->eval_source->docs.size(); ++doc_idx) {
      if (state->eval_source->docs[doc_idx].size > 0) {
        state->eval_docs.push_back(doc_idx);
      }
    }
  } else {
    MEGATRAIN_RETURN_IF_ERROR(SplitByHash(train, options, &state->train_docs, &state->eval_docs));
  }
  for (uint64_t doc_idx : state->train_docs) {
    state->num_train_tokens += train.docs[doc_idx].size;
  }
  for (uint64_t doc_idx : state->eval_docs) {
    state->num_eval_tokens += state->eval_from().docs[doc_idx].size;
  }
  state->isolated =
      ResolveDocumentAttention(options.document_attention, train) == DocumentAttention::kIsolated;
  // One EOS per document.
  const uint64_t stream_tokens = state->num_train_tokens + state->train_docs.size();
  const uint64_t window_tokens = static_cast<uint64_t>(options.seq_len) + 1;
  if (stream_tokens < window_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data.tokens: %s: the training documents hold %u tokens (%u "
                        "documents, with one EOS each: %u), fewer than one window of "
                        "train.seq_len + 1 = %u tokens",
                        options.tokens, state->num_train_tokens, state->train_docs.size(),
                        stream_tokens, window_tokens));
  }
  return DataLoader(std::move(state));
}

absl::StatusOr<MicroBatch> DataLoader::NextTrainBatch(int64_t micro_batch) {
  State& s = *state_;
  MEGATRAIN_RETURN_IF_ERROR(CheckMicroBatch(micro_batch, s.options.seq_len));
  const size_t seq_len = static_cast<size_t>(s.options.seq_len);
  const size_t rows = static_cast<size_t>(micro_batch);
  MicroBatch batch = PaddedBatch(rows, seq_len, static_cast<int32_t>(s.options.eos_id), s.isolated);
  Window window(seq_len + 1);
  StreamPos pos = s.pos;
  for (size_t row = 0; row < rows; ++row) {
    // T tokens give the next window's start; one more closes this window.
    MEGATRAIN_ASSIGN_OR_RETURN(size_t n, s.ReadTrain(pos, seq_len, window, 0));
    const StreamPos next_window = pos;
    MEGATRAIN_ASSIGN_OR_RETURN(size_t last, s.ReadTrain(pos, 1, window, seq_len));
    FillRow(window, n + last, seq_len, s.isolated, row, batch);
    pos = next_window;
  }
  // Commit only after the whole batch was read: an error leaves the cursor.
  s.pos = pos;
  s.windows += rows;
  return batch;
}

absl::StatusOr<std::vector<MicroBatch>> DataLoader::EvalBatches(int64_t micro_batch,
                                                                int64_t max_batches) const {
  const State& s = *state_;
  MEGATRAIN_RETURN_IF_ERROR(CheckMicroBatch(micro_batch, s.options.seq_len));
  if (max_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval.batches: must be at least 1, got ", max_batches));
  }
  if (s.eval_docs.empty()) {
    return absl::FailedPreconditionError(
        "no eval set: data.eval_fraction is 0 and data.eval_tokens is not "
        "set");
  }
  const size_t seq_len = static_cast<size_t>(s.options.seq_len);
  const size_t rows = static_cast<size_t>(micro_batch);
  const Source& source = s.eval_from();
  const auto doc_at = [&s](uint64_t /*epoch*/, uint64_t position) { return s.eval_docs[position]; };
  const auto read = [&](StreamPos& stream_pos, size_t count, Window& window, size_t at) {
    return ReadStream(source, doc_at, s.eval_docs.size(), /*wrap=*/false,
                      static_cast<int32_t>(s.options.eos_id), stream_pos, count, window, at);
  };
  Window window(seq_len + 1);
  std::vector<MicroBatch> batches;
  StreamPos pos;
  bool exhausted = false;
  while (!exhausted && batches.size() < static_cast<size_t>(max_batches)) {
    MicroBatch batch =
        PaddedBatch(rows, seq_len, static_cast<int32_t>(s.options.eos_id), s.isolated);
    size_t rows_filled = 0;
    for (size_t row = 0; row < rows && !exhausted; ++row) {
      MEGATRAIN_ASSIGN_OR_RETURN(size_t n, read(pos, seq_len, window, 0));
      const StreamPos next_window = pos;
      MEGATRAIN_ASSIGN_OR_RETURN(size_t last, read(pos, 1, window, seq_len));
      // A window needs two tokens to hold a label; after a short one the
      // stream is over.
      if (n + last < 2) break;
      FillRow(window, n + last, seq_len, s.isolated, row, batch);
      ++rows_filled;
      exhausted = last == 0;
      pos = next_window;
    }
    if (rows_filled == 0) break;
    batches.push_back(std::move(batch));
  }
  // An eval loss is a mean over targets: with none it would be 0/0, shown as
  // 0.0 (a perfect score) by a caller that does not check.
  const bool any_target = std::any_of(batches.begin(), batches.end(), [](const MicroBatch& batch) {
    return std::any_of(batch.labels.begin(), batch.labels.end(),
                       [](int32_t label) { return label != kIgnoreLabel; });
  });
  if (!any_target) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.options.eval_tokens.empty() ? "data.eval_fraction" : "data.eval_tokens",
        ": the eval set has no trained token in its ", batches.size(),
        " micro-batch(es) (every loss-mask value is 0): its loss would be undefined; give "
        "eval documents with answers (chat: assistant turns)"));
  }
  return batches;
}

DataCursor DataLoader::cursor() const {
  const State& s = *state_;
  return DataCursor{.epoch = s.pos.epoch,
                    .document_position = s.pos.position,
                    .token_offset = s.pos.offset,
                    .windows = s.windows,
                    .shuffle_seed = s.options.shuffle_seed,
                    .num_train_documents = s.train_docs.size(),
                    .num_train_tokens = s.num_train_tokens};
}

absl::Status DataLoader::RestoreCursor(const DataCursor& cursor) {
  State& s = *state_;
  if (cursor.shuffle_seed != s.options.shuffle_seed) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor: shuffle_seed ", cursor.shuffle_seed,
                     " differs from data.shuffle_seed ", s.options.shuffle_seed));
  }
  if (cursor.num_train_documents != s.train_docs.size() ||
      cursor.num_train_tokens != s.num_train_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor: saved for ", cursor.num_train_documents,
                     " training documents of ", cursor.num_train_tokens, " tokens, but ",
                     s.options.tokens, " now gives ", s.train_docs.size(), " documents of ",
                     s.num_train_tokens, " tokens (data, eval_fraction or seed changed?)"));
  }
  if (cursor.document_position >= s.train_docs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("data cursor: document_position ",
                                                   cursor.document_position, " is not below the ",
                                                   s.train_docs.size(), " training documents"));
  }
  const uint64_t doc_idx = s.TrainDocAt(cursor.epoch, cursor.document_position);
  const uint64_t doc_size = s.train_source.docs[doc_idx].size;
  if (cursor.token_offset > doc_size) {
    return absl::InvalidArgumentError(absl::StrCat("data cursor: token_offset ",
                                                   cursor.token_offset, " is past document ",
                                                   doc_idx, "'s ", doc_size, " tokens"));
  }
  s.pos = StreamPos{
      .epoch = cursor.epoch, .position = cursor.document_position, .offset = cursor.token_offset};
  s.windows = cursor.windows;
  return absl::OkStatus();
}

DocumentAttention DataLoader::document_attention() const {
  return state_->isolated ? DocumentAttention::kIsolated : DocumentAttention::kShared;
}

const std::vector<uint64_t>& DataLoader::train_documents() const { return state_->train_docs; }

const std::vector<uint64_t>& DataLoader::eval_documents() const { return state_->eval_docs; }

uint64_t DataLoader::num_train_tokens() const { return state_->num_train_tokens; }

DataLoader::MaskedDocumentCounts DataLoader::CountMaskedDocuments(uint64_t max_tokens) const {
  MaskedDocumentCounts counts;
  const Source& source = state_->train_source;
  for (const uint64_t doc_idx : state_->train_docs) {
    const DocRef& doc = source.docs[doc_idx];
    if (!source.masks[doc.shard_idx].has_value()) continue;
    ++counts.masked_documents;
    counts.longer += doc.size > max_tokens;
  }
  return counts;
}

uint64_t DataLoader::num_eval_tokens() const { return state_->num_eval_tokens; }

std::vector<std::string> DataLoader::shard_paths() const {
  std::vector<std::string> paths;
  for (const TokenShardReader& shard : state_->train_source.shards) {
    paths.push_back(shard.path());
  }
  return paths;
}

absl::StatusOr<std::vector<int32_t>> DataLoader::Document(uint64_t doc_idx) const {
  const Source& source = state_->train_source;
  if (doc_idx >= source.docs.size()) {
    return absl::OutOfRangeError(absl::StrCat("document ", doc_idx, " is past the ",
                                              source.docs.size(), " documents of ",
                                              state_->options.tokens));
  }
  const DocRef& doc = source.docs[doc_idx];
  std::vector<int32_t> tokens(doc.size);
  MEGATRAIN_RETURN_IF_ERROR(
      source.shards[doc.shard_idx].CopyTokens(doc.begin, absl::MakeSpan(tokens)));
  return tokens;
}

}  // namespace megatrain::engine
