// Cheap, bounded checks of a job's input files, for submission
// (server/core/submit_checks.h calls them through EngineBackend): the
// headers of token shards and safetensors files, never their bodies, so
// that a truncated or mistaken file is refused when the job is submitted
// instead of when it reaches the front of the queue. The full checks (every
// id, every tensor's name and shape) still run when the job starts.
//
// Pure C++ (no LibTorch). Thread-safety: free functions over the file
// system; safe to call concurrently.
#ifndef MEGATRAIN_ENGINE_DATA_INPUT_CHECKS_H_
#define MEGATRAIN_ENGINE_DATA_INPUT_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace megatrain::engine {

// Most shard files CheckTokenShardHeaders reads in one directory: each costs
// one open and a 64-byte read.
inline constexpr int kMaxCheckedShards = 4096;

// What a token shard's header (docs/data-format.md, "Layout, version 1") says.
struct TokenShardHeaderFacts {
  std::string path;
  uint64_t vocab_size = 0;  // 0 = unknown
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;
};

// Reads the 64-byte header of the shard `path` names (a file, or a
// directory's *.mtt files, not recursive, at most kMaxCheckedShards) and
// checks the magic, version, header XXH64, token dtype, reserved bits and
// that the file's size is exactly what the header's counts give (a
// truncated copy is caught here). Errors name `path`:
//   NOT_FOUND: no such file or directory;
//   INVALID_ARGUMENT: a directory with no *.mtt file or more than
//     kMaxCheckedShards, or something that is not a regular file;
//   DATA_LOSS: a header that does not parse or a size that does not match;
//   UNIMPLEMENTED: a version newer than this reader.
absl::StatusOr<std::vector<TokenShardHeaderFacts>> ReadTokenShardHeaders(const std::string& path);

// Refuses a *.safetensors or *.json entry of `hf_dir` that is not a regular
// file (INVALID_ARGUMENT; checked with stat(2), which never opens it), then
// opens the safetensors files of `hf_dir` (model.safetensors, or the index
// and its shards: SafetensorsModel::Open, which maps them, parses the
// headers and checks the offsets against the file sizes, reading no tensor
// data) and checks the embedding's shape against `config`
// ([vocab_size, hidden_size] for `model.embed_tokens.weight`, under a
// multimodal checkpoint's language-model prefix too). Errors: those of
// SafetensorsModel::Open (NOT_FOUND, DATA_LOSS naming the file);
// INVALID_ARGUMENT naming the tensor, its shape and config.json's.
absl::Status CheckHfWeightHeaders(const std::string& hf_dir, const ModelConfig& config);

// The data of a job, for CheckDataInputs (the daemon fills it from the spec:
// server/core/data_checks.h).
struct DataInputsToCheck {
  std::string text;              // data.text; empty: none
  std::string tokenizer;         // what data.text is tokenized with; empty: none
  std::string tokenizer_field;   // its YAML field: "data.tokenizer" or "model.hf_dir"
  std::string tokens;            // data.tokens; empty: none
  std::string eval_tokens;       // data.eval_tokens; empty: none
  int64_t model_vocab_size = 0;  // config.json vocab_size; 0: unknown
};

// Most loss-mask tokens CheckDataInputs scans per directory to find one
// trained token (where no tokenize.json counts them); past it the data is
// taken as trained (the job's start reads it all). 2^28 uint16 = 512 MiB of
// mapped reads at most, typically the first few bytes.
inline constexpr uint64_t kMaxScannedMaskTokens = uint64_t{1} << 28;

// Note [Data checks at submit]
// What can be known about a job's data before it runs, every problem at
// once (SpecErrors: messages joined by "; "), each naming its YAML field:
//   - data.text: CheckTextInputHead (not empty; JSONL that is text, not
//     chat or SFT data, with the command that reads the other formats);
//   - its tokenizer (data.tokenizer, a model directory with tokenizer.json
//     or the file, or model.hf_dir's): Tokenizer::Load succeeds, and its
//     vocab_size is at most the model's;
//   - data.tokens / data.eval_tokens with loss masks: at least one trained
//     token (tokenize.json's counts where the directory has one, else a
//     scan of the *.mtt.mask files up to kMaxScannedMaskTokens), since a
//     job on all-zero masks trains on nothing and reports loss 0.
// The shard headers (vocab_size against the model's) are
// ReadTokenShardHeaders's. Reads files (a tokenizer.json in full); call it
// outside locks. INVALID_ARGUMENT for every problem found (a missing file
// too: the field is wrong).
absl::Status CheckDataInputs(const DataInputsToCheck& inputs);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_DATA_INPUT_CHECKS_H_
