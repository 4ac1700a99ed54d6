// The training data loader: turns the documents of token shards into
// MicroBatches of packed, shifted sequences, with a deterministic shuffle,
// epochs, a held-out eval split and a resumable cursor.
//
// Why it exists: the trainer wants [B, T] input_ids and labels; the data on
// disk is documents of token ids (engine/data/token_shard.h). Everything between
// the two, and everything that must be reproducible across a stop and a
// resume, lives here. Pure C++ (no LibTorch).
//
// Note [Packing rule] (also in docs/data-format.md, "Packing"):
//   * Documents: every document of every shard, numbered by a global
//     document index: shards in the order given (a directory is read as its
//     `*.mtt` files sorted by name), documents in file order. Empty documents
//     keep their index but are skipped.
//   * Split: each non-empty document is held out for eval or kept for
//     training by IsHeldOutDocument(doc_idx, shuffle_seed, eval_fraction)
//     (a hash, so a document's side never depends on the others).
//   * Stream: epoch e visits the training documents in the order
//     ShuffledOrder(num_train_documents, shuffle_seed, e); each document's
//     tokens are followed by one EOS token. Epochs follow one another with
//     no gap, so the stream is infinite.
//   * Windows: window k is stream tokens [k*T, k*T + T + 1), T = seq_len.
//     Consecutive windows share one token, so every stream token but the
//     very first is a label exactly once. input_ids = w[0, T), labels =
//     w[1, T + 1). A window may span documents and epochs.
//   * Masks (SFT): a shard `x.mtt` may carry a loss mask `x.mtt.mask` (see
//     docs/data-format.md). A label is kIgnoreLabel where the mask of the
//     token it names is 0; an EOS takes the mask of its document's last
//     token. Shards without a mask train on every token.
//   * Micro-batch: B consecutive windows, row b = window (first + b).
//   * Documents in a window (data.packing.document_attention, Note
//     [Document attention] in engine/model/layers.h): shared leaves
//     MicroBatch::position_ids empty (every row attends across the
//     documents it holds). Isolated fills them: 0 at the row's first
//     token and at each document's first token, else the previous plus
//     one (a document's EOS is its last token); and the label of a
//     position whose next token begins a document is kIgnoreLabel (it
//     would predict a document from another one). auto is isolated when
//     a training shard has a loss mask (SFT, chat), else shared.
//   * Eval: the held-out documents in index order, packed the same way but
//     once (no shuffle, no wrap); the last window and batch are padded with
//     EOS inputs and kIgnoreLabel labels.
#ifndef MEGATRAIN_ENGINE_DATA_LOADER_H_
#define MEGATRAIN_ENGINE_DATA_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/data/batch.h"
#include "engine/spec/document_attention.h"

namespace megatrain::engine {

// File name suffix of token shards that a directory is scanned for.
inline constexpr char kTokenShardSuffix[] = ".mtt";
// Suffix appended to a shard's path to name its loss mask (SFT).
inline constexpr char kLossMaskSuffix[] = ".mask";

// ---------------------------------------------------------------------------
// Deterministic randomness. Defined here, not with <random>: std::shuffle
// and the std distributions are implementation-defined, and a resumed job
// on another machine must see the same order. All functions are pure and
// thread-safe.

// SplitMix64 finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom
// number generators", OOPSLA 2014; constants of java.util.SplittableRandom):
// a bijective 64-bit mix.
uint64_t Mix64(uint64_t x);

// The order in which epoch `epoch` visits `count` items: a permutation of
// [0, count), by Fisher-Yates (Knuth vol. 2, 3.4.2, Algorithm P) driven by a
// SplitMix64 stream seeded with Mix64(seed ^ Mix64(epoch)); each draw in
// [0, n) rejects values below 2^64 mod n, so it is unbiased. The same
// arguments give the same order on every platform.
std::vector<uint64_t> ShuffledOrder(uint64_t count, uint64_t seed, uint64_t epoch);

// Whether document `doc_idx` belongs to the held-out (eval) split: the top
// 53 bits of Mix64(Mix64(doc_idx) ^ seed ^ kEvalSalt), read as a fraction in
// [0, 1), are below `eval_fraction`. About eval_fraction of all documents
// are held out; a document's side does not depend on the other documents.
// DataLoader adds a fallback for tiny datasets (see DataLoader::Create).
bool IsHeldOutDocument(uint64_t doc_idx, uint64_t seed, double eval_fraction);

// ---------------------------------------------------------------------------

// Where the loader is in the training stream, and what it was built from.
// Saving it after N batches and restoring it in a fresh loader built from the
// same data and options reproduces the following batches exactly.
struct DataCursor {
  // Format of ToJson(); FromJson() refuses others.
  static constexpr uint64_t kVersion = 1;

  // Position of the next window's first token (Note [Packing rule]):
  uint64_t epoch = 0;              // epochs completed, from 0
  uint64_t document_position = 0;  // index into epoch's shuffled order
  uint64_t token_offset = 0;       // tokens of that document already
                                   // behind; == its size: the EOS is next
  // Windows (sequences) returned so far; informational.
  uint64_t windows = 0;

  // What the position refers to; RestoreCursor() checks they match.
  uint64_t shuffle_seed = 0;
  uint64_t num_train_documents = 0;  // non-empty training documents
  uint64_t num_train_tokens = 0;     // their tokens, EOS not counted

  // One JSON object, e.g.
  //   {"version":1,"epoch":0,"document_position":3,"token_offset":17,
  //    "windows":8,"shuffle_seed":1234,"num_train_documents":50,
  //    "num_train_tokens":12345}
  // Integers are written exactly (64-bit unsigned).
  std::string ToJson() const;

  // Parses ToJson()'s output. Errors: INVALID_ARGUMENT for invalid JSON, a
  // missing field, a field that is not an unsigned integer, or a version
  // other than kVersion (the message names the field).
  static absl::StatusOr<DataCursor> FromJson(absl::string_view json);

  friend bool operator==(const DataCursor&, const DataCursor&) = default;
};

// Options of DataLoader::Create. Field names follow the job spec's `data.*`
// and `train.*` fields; error messages name them that way.
struct DataLoaderOptions {
  // A token shard file, or a directory whose `*.mtt` files (not recursive)
  // are read in name order. Required.
  std::string tokens;
  // Optional separate held-out set (a shard file or directory, as `tokens`);
  // when set, eval_fraction must be 0 and every document of `tokens` trains.
  std::string eval_tokens;
  // T: tokens per sequence. Must be >= 1.
  int64_t seq_len = 0;
  // The model's vocabulary: every id must be below it. Must be >= 1.
  int64_t vocab_size = 0;
  // Token placed after every document; in [0, vocab_size).
  int64_t eos_id = -1;
  // Share of documents held out for eval; in [0, 0.5].
  double eval_fraction = 0.0;
  // Seeds the per-epoch shuffle and the eval split.
  uint64_t shuffle_seed = 1234;
  // false: every epoch visits the training documents in index order.
  bool shuffle = true;
  // Verify each shard's body checksum when opening it (one pass over the
  // data; TokenShardParseOptions::verify_body). Ids are checked against
  // vocab_size either way.
  bool verify_shards = true;
  // Whether packed documents attend to each other (Note [Packing rule]).
  // kShared here, so that a loader built without it packs as it always
  // did; the job spec's default is kAuto.
  DocumentAttention document_attention = DocumentAttention::kShared;
};

// Turns token shards into MicroBatches (Note [Packing rule] above).
//
// Ownership and lifetime: move-only; owns the memory mappings of its shards
// (TokenShardReader), so it uses little memory beyond the page cache: 24
// bytes per document for the index, plus one epoch's order (8 bytes per
// training document, at most two epochs cached).
//
// Thread-safety: NextTrainBatch() and RestoreCursor() mutate the loader and
// must not run concurrently with any other call; the const methods may run
// concurrently with one another.
//
// Example:
//   DataLoaderOptions options;
//   options.tokens = "data/";  // data/*.mtt
//   options.seq_len = 1024;
//   options.vocab_size = 32000;
//   options.eos_id = 2;
//   options.eval_fraction = 0.01;
//   MEGATRAIN_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::Create(options));
//   MEGATRAIN_ASSIGN_OR_RETURN(MicroBatch batch, loader.NextTrainBatch(8));
//   std::string saved = loader.cursor().ToJson();  // into the checkpoint
//   ...
//   MEGATRAIN_ASSIGN_OR_RETURN(DataCursor cursor, DataCursor::FromJson(saved));
//   MEGATRAIN_RETURN_IF_ERROR(resumed_loader.RestoreCursor(cursor));
class DataLoader {
 public:
  // Opens every shard (and its loss mask, if any), checks ids against
  // vocab_size, splits the documents and prepares epoch 0. Cost: one pass
  // over the shards when verify_shards is set or a shard's vocab_size is
  // unknown or above the model's; else a pass over the document offsets.
  //
  // When eval_fraction > 0, at least one document is held out and at least
  // one trains: if the hash picks none, the document with the smallest hash
  // is held out; if it picks all, the one with the largest hash trains.
  //
  // Errors:
  //   INVALID_ARGUMENT: a bad option (named: "train.seq_len", "data.eos_id",
  //     ...); a directory with no *.mtt file; an empty dataset (no tokens);
  //     training documents with fewer tokens (EOS included) than one window
  //     of seq_len + 1; eval_fraction > 0 with fewer than 2 non-empty
  //     documents; a token id >= vocab_size (names the file, document,
  //     position and id).
  //   NOT_FOUND: `tokens` (or eval_tokens) does not exist.
  //   DATA_LOSS / UNIMPLEMENTED: a corrupt shard or mask, or one that does
  //     not match its shard (from TokenShardReader: file and byte offset).
  static absl::StatusOr<DataLoader> Create(const DataLoaderOptions& options);

  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  ~DataLoader();

  // The next `micro_batch` windows of the training stream as one
  // MicroBatch (input_ids and labels [micro_batch * seq_len]); advances the
  // cursor. Never runs out: epochs wrap.
  // Errors: INVALID_ARGUMENT when micro_batch < 1 or micro_batch * seq_len
  // exceeds 2^31 tokens.
  absl::StatusOr<MicroBatch> NextTrainBatch(int64_t micro_batch);

  // The eval set as up to `max_batches` micro-batches: always the same list
  // for the same data and options (independent of the cursor). Padded
  // positions have input eos_id and label kIgnoreLabel.
  // Errors: INVALID_ARGUMENT when micro_batch < 1 or max_batches < 1, or
  // when no label of the batches is a target (every loss-mask value 0: the
  // eval loss would be undefined; names data.eval_tokens or
  // data.eval_fraction); FAILED_PRECONDITION when there is no eval set
  // (eval_fraction 0 and no eval_tokens).
  absl::StatusOr<std::vector<MicroBatch>> EvalBatches(int64_t micro_batch,
                                                      int64_t max_batches) const;

  // Where the training stream stands now (after the last NextTrainBatch).
  DataCursor cursor() const;

  // options.document_attention with kAuto resolved: kIsolated or kShared.
  DocumentAttention document_attention() const;

  // Moves the training stream to `cursor`, a value from cursor() of a loader
  // built from the same data and options.
  // Errors: INVALID_ARGUMENT when its shuffle_seed, num_train_documents or
  // num_train_tokens differ from this loader's (the data or seed changed),
  // or its position is outside the data; the loader is then unchanged.
  absl::Status RestoreCursor(const DataCursor& cursor);

  // Global indices (see Note [Packing rule]) of the non-empty training
  // documents, ascending.
  const std::vector<uint64_t>& train_documents() const;
  // Global indices of the held-out documents, ascending. With eval_tokens
  // they index eval_tokens' shards, not `tokens`'.
  const std::vector<uint64_t>& eval_documents() const;
  // Tokens of the training documents, EOS not counted.
  uint64_t num_train_tokens() const;
  // Tokens of the eval documents, EOS not counted.
  uint64_t num_eval_tokens() const;
  // Shard files read for training, in order.
  std::vector<std::string> shard_paths() const;
  // Training documents whose shard has a loss mask (SFT or chat data), and
  // how many of them hold more than `max_tokens` tokens (EOS not counted):
  // the packing rule trains those across two or more windows. One pass
  // over the document index; no token is read.
  struct MaskedDocumentCounts {
    uint64_t masked_documents = 0;
    uint64_t longer = 0;
  };
  MaskedDocumentCounts CountMaskedDocuments(uint64_t max_tokens) const;
  // Tokens of global document `doc_idx` of the training source (for tests
  // and tools). Errors: OUT_OF_RANGE for an index past the last document.
  absl::StatusOr<std::vector<int32_t>> Document(uint64_t doc_idx) const;

 private:
  struct State;
  explicit DataLoader(std::unique_ptr<State> state);

  std::unique_ptr<State> state_;
};

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DATA_LOADER_H_
