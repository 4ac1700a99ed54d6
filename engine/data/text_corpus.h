// Converts text corpora and SFT data into token shards (engine/data/token_shard.h)
// that DataLoader reads: the library behind `megatrain tokenize`.
//
// Input formats (docs/data-format.md, "Text corpora"):
//   * Plain text: documents are separated by one or more blank lines (lines
//     holding only spaces, tabs or '\r'); a file without blank lines is one
//     document. A document's text is its lines joined with '\n'.
//   * JSONL: one JSON object per line with a string field "text" (the name
//     is an option); blank lines are skipped. Each object is one document.
//   * SFT JSONL: one JSON object per line with "input_ids" (token ids) and
//     at most one of "labels" (same length; -100 = not trained, else equal
//     to the input id) and "loss_mask" (same length; 1 / true = trained,
//     0 / false = not). Neither: every token is trained. Written as a token
//     shard plus a loss-mask shard `<shard>.mask` (same format, ids 0/1).
//
// Text is tokenized with a Hugging Face tokenizer.json or a SentencePiece
// model (engine/tokenizer/tokenizer.h: a directory or *.json is the former); no BOS
// (unless asked) and no EOS is written: DataLoader puts an EOS after every
// document when it packs them.
#ifndef MEGATRAIN_ENGINE_TEXT_CORPUS_H_
#define MEGATRAIN_ENGINE_TEXT_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// How TokenizeToShards reads an input file.
enum class CorpusFormat {
  kAuto,       // per file: "*.jsonl" is kJsonl, anything else kPlainText
  kPlainText,  // documents separated by blank lines
  kJsonl,      // {"text": ...} per line
  kSftJsonl,   // {"input_ids": [...], "labels" | "loss_mask": [...]} per line
  kChatJsonl,  // {"text": rendered chat, "assistant_spans": [[start, end], ...],
               // "turns": [{"role", "start", "end"}, ...]} per line (UTF-8 byte
               // offsets; client/python/megatrain_client/chat_template.py;
               // "turns" optional); needs a HF tokenizer; written with a loss
               // mask that is 1 on the tokens of the spans (Note [Chat loss
               // mask] in the .cc)
};

// What TokenizeToShards does with a document over max_document_tokens.
enum class LongDocumentRule {
  kTruncate,  // keep its first max_document_tokens tokens (and mask); a chat
              // conversation keeps whole turns instead: its oldest turns after
              // the system prompt go (Note [Chat truncation] in the .cc), or,
              // when no cut fits, without "turns", or when no answer would
              // be left, it is left out (counted as dropped)
  kDrop,      // leave it out
};

// Options of TokenizeToShards. Field names are the CLI's flag names.
struct TokenizeOptions {
  // Input files, read in this order; documents are numbered across them
  // from 0 in reading order (the numbering the held-out split hashes).
  std::vector<std::string> input_paths;
  // How to read them (kAuto decides per file by its name).
  CorpusFormat format = CorpusFormat::kAuto;
  // HF tokenizer (model directory with tokenizer.json, or the file) or
  // SentencePiece .model. Required for text (kPlainText, kJsonl, kAuto); for
  // kSftJsonl optional, and then only gives vocab_size.
  std::string tokenizer_model;
  // JSONL: the field that holds a document's text.
  std::string text_field = "text";
  // Text formats: start every document with the model's BOS id.
  bool add_bos = false;
  // kChatJsonl: train on every token (mask all 1), not only assistant turns.
  bool train_on_all_turns = false;
  // Documents (all formats) longer than this many tokens are truncated or
  // dropped by `long_documents`, and counted in the report; 0 = no limit.
  // For SFT and chat data set it to the job's seq_len so that a
  // conversation is never split over two training windows.
  uint64_t max_document_tokens = 0;
  LongDocumentRule long_documents = LongDocumentRule::kTruncate;
  // The model's vocabulary (config.json vocab_size): ids must be below it,
  // and it is written into the shards' headers. 0 = the tokenizer's
  // vocab_size, or unknown (ids up to 2^31 - 1; uint32 shards) for SFT
  // without a tokenizer. A tokenizer that makes the ids (every format but
  // kSftJsonl) with more ids than this is refused (INVALID_ARGUMENT).
  int64_t vocab_size = 0;

  // Directory for the training shards `<shard_prefix>-NNNNN.mtt` (created,
  // with parents, if missing).
  std::string output_dir;
  // When set (absolute), output_dir and eval_output_dir must lie below it
  // and are opened from it one component at a time, created as needed,
  // never through a symbolic link (Note [Directory descriptors] in
  // dir_fd.h); a job passes its output_dir. Empty (a local tool): the
  // output directories are created by path. Either way every shard and
  // mask is then created, replaced and deleted through the directory's
  // descriptor, so a link swapped in later changes nothing.
  std::string root;
  // File name prefix of the shards (no '/'); the same in eval_output_dir.
  std::string shard_prefix = "train";
  // A shard is closed once it holds at least this many tokens; documents
  // are never split, so a shard may exceed it by one document. Shards are
  // built in memory (2 or 4 bytes per token, plus the same again for an SFT
  // mask), so this bounds memory use.
  uint64_t max_shard_tokens = 100'000'000;
  // Replace existing `<shard_prefix>-*.mtt` shards (and masks) in the output
  // directories. false: refuse to write over them.
  bool overwrite = false;

  // Held-out split: documents with IsHeldOutDocument(doc_idx, split_seed,
  // eval_fraction) (engine/data/data_loader.h) go to shards in eval_output_dir
  // instead, for DataLoaderOptions::eval_tokens. In [0, 0.5].
  double eval_fraction = 0.0;
  uint64_t split_seed = 1234;
  // Default: `<output_dir>/eval` (a subdirectory, so that a DataLoader given
  // output_dir does not read the held-out shards for training).
  std::string eval_output_dir;
};

// What TokenizeToShards wrote.
struct TokenizeReport {
  uint64_t documents = 0;                // training documents written
  uint64_t tokens = 0;                   // their tokens (BOS included, if added)
  uint64_t trained_tokens = 0;           // of those, with loss mask 1 (all without masks)
  uint64_t eval_documents = 0;           // held-out documents written
  uint64_t eval_tokens = 0;              // their tokens
  uint64_t eval_trained_tokens = 0;      // of those, with loss mask 1
  uint64_t skipped_documents = 0;        // documents with no tokens, not written
  uint64_t untrained_documents = 0;      // SFT, chat: documents whose loss mask is all 0
                                         // (after truncation), not written
  uint64_t masked_tokens = 0;            // SFT: tokens with loss mask 0 (both sets)
  uint64_t truncated_documents = 0;      // over max_document_tokens, truncated (chat:
                                         // oldest turns dropped)
  uint64_t dropped_documents = 0;        // over max_document_tokens, left out
  uint64_t bytes_written = 0;            // all shard and mask files, in bytes
  uint64_t input_bytes = 0;              // sizes of the input files, in bytes
  double seconds = 0;                    // reading, tokenizing and writing, wall
                                         // clock (input_bytes / seconds: throughput)
  std::vector<std::string> shards;       // training shard paths, in order
  std::vector<std::string> eval_shards;  // held-out shard paths
  int64_t vocab_size = 0;                // written into the shards; 0 = unknown
  int64_t eos_id = -1;                   // the tokenizer's EOS (for DataLoaderOptions);
                                         // -1 without a tokenizer or when it has none
  // The long-document rule applied (TokenizeOptions; 0 = no limit).
  uint64_t max_document_tokens = 0;
  LongDocumentRule long_documents = LongDocumentRule::kTruncate;
  bool masked = false;  // shards written with loss masks (SFT, chat)
  // ReadTokenizeReport of a version 1 report (written before the trained
  // counts existed): false, and trained_tokens, eval_tokens,
  // eval_trained_tokens and untrained_documents are unknown (0).
  bool trained_counts_known = true;
};

// Note [Tokenize report]
// TokenizeToShards leaves `tokenize.json` in output_dir beside the shards
// (written atomically through the directory's descriptor):
//   {"format": "megatrain-tokenize-report", "version": 2, "documents": N,
//    "tokens": N, "trained_tokens": N, "eval_documents": N,
//    "eval_tokens": N, "eval_trained_tokens": N, "untrained_documents": N,
//    "eos_id": N, "masked": bool, "max_document_tokens": N,
//    "long_documents": "truncate" | "drop", "truncated_documents": N,
//    "dropped_documents": N}
// so that a job trained on the shards (data.tokens) can say in its events
// what the long-document rule did to its data (TrainingJob, "data:" event)
// and submission can refuse shards with no trained token (data_checks.h).
// Since documents whose loss mask is all 0 are not written, "masked": true
// comes with trained_tokens > 0 unless documents is 0. Version 1 (no trained
// counts) is still read.
inline constexpr char kTokenizeReportFileName[] = "tokenize.json";

// Reads `<dir>/tokenize.json` (Note [Tokenize report]; through
// ReadInputFile, so confined reads apply) into the fields it holds.
// NOT_FOUND when missing; INVALID_ARGUMENT naming the file when it is
// larger than 64 KiB or does not parse as that format.
absl::StatusOr<TokenizeReport> ReadTokenizeReport(const std::string& dir);

// Reads every input, tokenizes it and writes token shards (atomically, one
// file at a time: a failure leaves the shards finished so far, never a
// partial file), then `tokenize.json` (Note [Tokenize report]).
//
// Thread-safety: reentrant; calls writing to different directories may run
// concurrently.
//
// Errors:
//   INVALID_ARGUMENT: a bad option (named: "input_paths", "output_dir",
//     "eval_fraction", ...); an input that is a directory; a bad JSONL line
//     ("<file>:<line>: ..." saying what is wrong: invalid JSON, not an
//     object, missing or non-string text field, bad input_ids / labels /
//     loss_mask, an id outside [0, vocab_size), bad assistant_spans or
//     turns); inputs with no (trained) tokens at all; a tokenizer with
//     more ids than vocab_size.
//   NOT_FOUND: an input file or the tokenizer model does not exist.
//   ALREADY_EXISTS: an output directory already holds shards with this
//     prefix and overwrite is false.
//   FAILED_PRECONDITION: with `root`, a symbolic link or non-directory on
//     the way from it to an output directory (naming the component);
//     INVALID_ARGUMENT when an output directory is not below `root`.
//   Others from the file system (RESOURCE_EXHAUSTED when the disk is full),
//     naming the path.
//
// Example:
//   TokenizeOptions options;
//   options.input_paths = {"corpus.jsonl"};
//   options.tokenizer_model = "spm.model";
//   options.output_dir = "data/tokens";
//   options.eval_fraction = 0.01;
//   MEGATRAIN_ASSIGN_OR_RETURN(TokenizeReport report,
//                              TokenizeToShards(options));
//   // Then DataLoaderOptions: tokens = "data/tokens", eval_tokens =
//   // "data/tokens/eval", eos_id = report.eos_id, vocab_size >=
//   // report.vocab_size.
absl::StatusOr<TokenizeReport> TokenizeToShards(const TokenizeOptions& options);

// Most bytes CheckTextInputHead reads.
inline constexpr int64_t kTextInputHeadBytes = int64_t{1} << 20;

// A cheap look at a text input before it is tokenized (submission of a
// data.text job): reads at most the first kTextInputHeadBytes of `path`
// (OpenInputFile: a regular file, never a FIFO) and refuses a file with no
// document (empty or blank, when it all fits in that head) and, for a
// "*.jsonl" file, a first line that is not a JSON object with a string
// `text_field`: chat data ({"messages"} or {"conversations"}), rendered
// chat ({"assistant_spans"}) and SFT data ({"input_ids"}) are named with the
// command that reads them. Messages start with `path` (the caller adds the
// field). Errors: NOT_FOUND, INVALID_ARGUMENT as said; others from
// read(2).
absl::Status CheckTextInputHead(const std::string& path, const std::string& text_field);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_TEXT_CORPUS_H_
