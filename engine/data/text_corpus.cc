// TokenizeToShards: text, JSONL and SFT JSONL to token shards (formats in
// text_corpus.h and docs/data-format.md).
#include "engine/data/text_corpus.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/data/data_loader.h"
#include "engine/fs/dir_fd.h"
#include "engine/fs/mapped_file.h"
#include "engine/runtime/status_macros.h"
#include "engine/data/token_shard.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/spec/job_spec.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine {

namespace {

namespace fs = std::filesystem;

// Suffix of a loss-mask file's name after its shard's: "x.mtt.mask".
constexpr char kMaskFileSuffix[] = ".mtt.mask";

absl::Status FileSystemError(const std::error_code& ec, absl::string_view context) {
  // std::filesystem reports errno values in the generic/system category.
  return absl::ErrnoToStatus(ec.value(), absl::StrCat(context, ": ", ec.message()));
}

// `status` with the descriptor path `io_path` ("/proc/self/fd/N") in its
// message replaced by `shown`, the directory's path as the caller named it.
absl::Status ShowPath(const absl::Status& status, const std::string& io_path,
                      const std::string& shown) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrReplaceAll(status.message(), {{io_path, shown}}));
}

// Whether `name` is a shard or mask of series `prefix`: "<prefix>-*.mtt" or
// "<prefix>-*.mtt.mask".
bool IsSeriesFile(absl::string_view name, absl::string_view prefix) {
  return absl::StartsWith(name, absl::StrCat(prefix, "-")) &&
         (absl::EndsWith(name, kTokenShardSuffix) || absl::EndsWith(name, kMaskFileSuffix));
}

// Opens output directory `dir` (Note [Directory descriptors] in dir_fd.h):
// with `root`, below it one component at a time, created as needed and
// never through a symbolic link; without, `dir` is created by path (the
// caller's own tool) and then opened, its last component not a link. Every
// shard is then written through the descriptor.
absl::StatusOr<DirFd> OpenOutputDir(const std::string& root, const std::string& dir,
                                    absl::string_view field) {
  if (root.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return FileSystemError(ec, absl::StrCat(field, ": ", dir));
    const std::string absolute = fs::absolute(dir, ec).lexically_normal().string();
    if (ec) return FileSystemError(ec, absl::StrCat(field, ": ", dir));
    absl::StatusOr<DirFd> opened = DirFd::Open(absolute);
    if (!opened.ok()) return Annotate(opened.status(), field);
    return opened;
  }
  const fs::path relative =
      fs::path(dir).lexically_normal().lexically_relative(fs::path(root).lexically_normal());
  if (relative.empty() || *relative.begin() == ".." || relative.is_absolute()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", dir, "' does not lie below '", root, "'"));
  }
  std::string components = relative.string();
  while (!components.empty() && components.back() == '/') components.pop_back();
  absl::StatusOr<DirFd> opened = components == "." || components.empty()
                                     ? DirFd::Open(root)
                                     : DirFd::OpenBeneath(root, components, DirFd::Create::kYes);
  if (!opened.ok()) return Annotate(opened.status(), field);
  return opened;
}

// Makes sure `dir` holds no shard of series `prefix`, deleting them (as
// entries of `dir`, links as links) when `overwrite`. `shown` names `dir`.
absl::Status PrepareOutputDir(const DirFd& dir, const std::string& shown, absl::string_view field,
                              absl::string_view prefix, bool overwrite) {
  std::error_code ec;
  std::vector<std::string> existing;
  for (fs::directory_iterator it(dir.IoPath(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (IsSeriesFile(name, prefix)) existing.push_back(name);
  }
  if (ec) return FileSystemError(ec, absl::StrCat(field, ": ", shown));
  if (existing.empty()) return absl::OkStatus();
  std::sort(existing.begin(), existing.end());
  if (!overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat(field, ": ", shown, " already holds shards of prefix '", prefix, "' (e.g. ",
                     existing.front(), "); remove them or set overwrite"));
  }
  for (const std::string& name : existing) {
    MEGATRAIN_RETURN_IF_ERROR(
        Annotate(ShowPath(dir.UnlinkAt(name, /*directory=*/false), dir.path(), shown), field));
  }
  return absl::OkStatus();
}

// Tokens a document trains on: those with mask 1, or all of them without a
// mask.
uint64_t TrainedTokens(absl::Span<const int32_t> tokens, absl::Span<const int32_t> mask) {
  if (mask.empty()) return tokens.size();
  return static_cast<uint64_t>(std::count(mask.begin(), mask.end(), 1));
}

// Writes one series of shards `<dir>/<prefix>-NNNNN.mtt` (and, with masks,
// `<shard>.mask`), starting a new shard when one reaches max_shard_tokens.
// Files are created through `dir`'s descriptor (AtomicFileWriter on
// DirFd::IoPath: O_EXCL temporaries renamed within the directory); `shown`
// is the directory's path for report paths and messages. `dir` must
// outlive the series.
class ShardSeries {
 public:
  ShardSeries(const DirFd* dir, std::string shown, std::string prefix, uint64_t vocab_size,
              bool with_mask, uint64_t max_shard_tokens)
      : dir_(dir),
        shown_(std::move(shown)),
        prefix_(std::move(prefix)),
        vocab_size_(vocab_size),
        with_mask_(with_mask),
        max_shard_tokens_(max_shard_tokens) {}

  // Appends one non-empty document; `mask` (0/1 per token) only with masks.
  absl::Status Append(absl::Span<const int32_t> tokens, absl::Span<const int32_t> mask) {
    if (!writer_.has_value()) MEGATRAIN_RETURN_IF_ERROR(OpenNext());
    MEGATRAIN_RETURN_IF_ERROR(Shown(writer_->AppendDocument(tokens)));
    if (with_mask_) MEGATRAIN_RETURN_IF_ERROR(Shown(mask_writer_->AppendDocument(mask)));
    ++documents_;
    tokens_ += tokens.size();
    trained_tokens_ += TrainedTokens(tokens, mask);
    if (writer_->num_tokens() >= max_shard_tokens_) return CloseCurrent();
    return absl::OkStatus();
  }

  // Finishes the open shard, if any.
  absl::Status Finish() { return writer_.has_value() ? CloseCurrent() : absl::OkStatus(); }

  const std::vector<std::string>& paths() const { return paths_; }
  uint64_t documents() const { return documents_; }
  uint64_t tokens() const { return tokens_; }
  uint64_t trained_tokens() const { return trained_tokens_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  absl::Status Shown(const absl::Status& status) const {
    return ShowPath(status, dir_->IoPath(), shown_);
  }

  uint64_t FileSize(const std::string& name) const {
    absl::StatusOr<struct stat> info = dir_->StatAt(name);
    return info.ok() ? static_cast<uint64_t>(info->st_size) : 0;
  }

  absl::Status OpenNext() {
    name_ = absl::StrFormat("%s-%05d%s", prefix_, paths_.size(), kTokenShardSuffix);
    absl::StatusOr<TokenShardWriter> writer =
        TokenShardWriter::Create(dir_->IoPath(name_), {.vocab_size = vocab_size_});
    if (!writer.ok()) return Shown(writer.status());
    writer_.emplace(*std::move(writer));
    if (with_mask_) {
      absl::StatusOr<TokenShardWriter> mask_writer =
          TokenShardWriter::Create(dir_->IoPath(name_ + kLossMaskSuffix), {.vocab_size = 2});
      if (!mask_writer.ok()) return Shown(mask_writer.status());
      mask_writer_.emplace(*std::move(mask_writer));
    }
    paths_.push_back(absl::StrFormat("%s/%s", shown_, name_));
    return absl::OkStatus();
  }

  absl::Status CloseCurrent() {
    // The mask first: a shard never exists without its mask.
    if (with_mask_) {
      MEGATRAIN_RETURN_IF_ERROR(Shown(mask_writer_->Finish()));
      bytes_written_ += FileSize(name_ + kLossMaskSuffix);
      mask_writer_.reset();
    }
    MEGATRAIN_RETURN_IF_ERROR(Shown(writer_->Finish()));
    bytes_written_ += FileSize(name_);
    writer_.reset();
    return absl::OkStatus();
  }

  const DirFd* dir_;
  std::string shown_;
  std::string prefix_;
  uint64_t vocab_size_;
  bool with_mask_;
  uint64_t max_shard_tokens_;
  std::string name_;                             // the open shard's file name
  std::optional<TokenShardWriter> writer_;       // the open shard
  std::optional<TokenShardWriter> mask_writer_;  // its mask
  std::vector<std::string> paths_;
  uint64_t documents_ = 0;
  uint64_t tokens_ = 0;
  uint64_t trained_tokens_ = 0;
  uint64_t bytes_written_ = 0;
};

// Routes documents to the training or the held-out series.
class DocumentSink {
 public:
  DocumentSink(const TokenizeOptions& options, ShardSeries* train, ShardSeries* eval)
      : options_(options), train_(train), eval_(eval) {}

  // Adds the next document. Empty ones are counted and left out, and so are
  // ones whose mask is all 0 (they would cost compute and train nothing).
  // `turns_dropped`: a chat conversation the caller already shortened to
  // max_document_tokens by dropping its oldest turns (counted as truncated).
  absl::Status Add(absl::Span<const int32_t> tokens, absl::Span<const int32_t> mask,
                   bool turns_dropped = false) {
    const uint64_t doc_idx = next_doc_idx_++;
    if (tokens.empty()) {
      ++skipped_;
      return absl::OkStatus();
    }
    truncated_long_ += turns_dropped;
    // Long documents (TokenizeOptions::max_document_tokens): keep the first
    // max tokens (and their mask) or drop the document; both counted.
    const uint64_t max_tokens = options_.max_document_tokens;
    if (max_tokens > 0 && tokens.size() > max_tokens) {
      if (options_.long_documents == LongDocumentRule::kDrop) {
        ++dropped_long_;
        return absl::OkStatus();
      }
      ++truncated_long_;
      tokens = tokens.subspan(0, max_tokens);
      if (!mask.empty()) mask = mask.subspan(0, max_tokens);
    }
    if (!mask.empty() && TrainedTokens(tokens, mask) == 0) {
      ++untrained_;
      return absl::OkStatus();
    }
    for (int32_t value : mask) masked_tokens_ += value == 0;
    const bool held_out =
        eval_ != nullptr && IsHeldOutDocument(doc_idx, options_.split_seed, options_.eval_fraction);
    return (held_out ? eval_ : train_)->Append(tokens, mask);
  }

  // Counts the next document as over max_document_tokens and left out (a
  // chat conversation that cannot be kept whole).
  void DropLong() {
    ++next_doc_idx_;
    ++dropped_long_;
  }

  uint64_t skipped() const { return skipped_; }
  uint64_t untrained() const { return untrained_; }
  uint64_t masked_tokens() const { return masked_tokens_; }
  uint64_t truncated_long() const { return truncated_long_; }
  uint64_t dropped_long() const { return dropped_long_; }

 private:
  const TokenizeOptions& options_;
  ShardSeries* train_;
  ShardSeries* eval_;  // nullptr: no split
  uint64_t next_doc_idx_ = 0;
  uint64_t skipped_ = 0;
  uint64_t untrained_ = 0;
  uint64_t masked_tokens_ = 0;
  uint64_t truncated_long_ = 0;
  uint64_t dropped_long_ = 0;
};

// Opens an input file for reading.
absl::StatusOr<std::ifstream> OpenInput(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat("input_paths: ", path, ": no such file"));
  }
  if (fs::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_paths: ", path, ": is a directory; name the files"));
  }
  // Note [Confined reads] in engine/fs/dir_fd.h: opened below the job's
  // roots (never a FIFO); the stream reopens that very file through
  // /proc/self/fd.
  absl::StatusOr<int> fd = OpenInputFile(path);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(), absl::StrCat("input_paths: ", fd.status().message()));
  }
  std::ifstream in(absl::StrCat("/proc/self/fd/", *fd), std::ios::binary);
  const int open_errno = errno;
  ::close(*fd);
  if (!in.is_open()) {
    return absl::ErrnoToStatus(open_errno, absl::StrCat("input_paths: ", path, ": cannot open"));
  }
  return in;
}

// Reads `path` line by line; calls `on_line(line, line_number)` (from 1,
// without the line break or a trailing '\r').
template <typename OnLine>
absl::Status ForEachLine(const std::string& path, OnLine&& on_line) {
  MEGATRAIN_ASSIGN_OR_RETURN(std::ifstream in, OpenInput(path));
  std::string line;
  uint64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    MEGATRAIN_RETURN_IF_ERROR(on_line(absl::string_view(line), line_number));
  }
  if (in.bad()) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed after line ", line_number));
  }
  return absl::OkStatus();
}

bool IsBlank(absl::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == absl::string_view::npos;
}

// Tokenizes one document's text; prepends BOS when asked (not to an empty
// document, which stays empty and is skipped).
absl::StatusOr<std::vector<int32_t>> EncodeDocument(const Tokenizer& tokenizer,
                                                    absl::string_view text, bool add_bos) {
  MEGATRAIN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(text));
  if (add_bos && !ids.empty()) ids.insert(ids.begin(), tokenizer.bos_id());
  return ids;
}

absl::Status ReadPlainText(const std::string& path, const Tokenizer& tokenizer, bool add_bos,
                           DocumentSink& sink) {
  std::string text;  // the current document, lines joined with '\n'
  bool in_document = false;
  const auto flush = [&]() -> absl::Status {
    if (!in_document) return absl::OkStatus();
    MEGATRAIN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodeDocument(tokenizer, text, add_bos));
    text.clear();
    in_document = false;
    return sink.Add(ids, {});
  };
  MEGATRAIN_RETURN_IF_ERROR(
      ForEachLine(path, [&](absl::string_view line, uint64_t) -> absl::Status {
        if (IsBlank(line)) return flush();
        if (in_document) text.push_back('\n');
        text.append(line.data(), line.size());
        in_document = true;
        return absl::OkStatus();
      }));
  return flush();
}

// Parses one JSONL line into an object; the message says why not.
absl::StatusOr<nlohmann::json> ParseJsonObject(absl::string_view line) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a JSON object, got ", json.type_name()));
  }
  return json;
}

// Calls on_object(json, where) for every non-blank line of the JSONL file
// `path`, `where` being "path:line"; a line that is not a JSON object is an
// INVALID_ARGUMENT naming it.
template <typename OnObject>
absl::Status ForEachJsonObject(const std::string& path, OnObject&& on_object) {
  return ForEachLine(path, [&](absl::string_view line, uint64_t line_number) -> absl::Status {
    if (IsBlank(line)) return absl::OkStatus();
    const std::string where = absl::StrCat(path, ":", line_number);
    absl::StatusOr<nlohmann::json> json = ParseJsonObject(line);
    if (!json.ok()) return Annotate(json.status(), where);
    return on_object(*json, where);
  });
}

// ": <what it is and the fix>" when a text-JSONL object is another format's
// (chat or SFT data read as text would train on the wrong tokens, or fail
// on a missing "text"); empty otherwise.
std::string OtherFormatHint(const nlohmann::json& json) {
  if (json.contains("messages") || json.contains("conversations")) {
    return ": this is chat data ({\"messages\"} or {\"conversations\"}), not text: render it "
           "with `python3 -m megatrain_client.chat_template --model MODEL_DIR in.jsonl "
           "chat.jsonl`, then `megatrain tokenize --format chat` and train on data.tokens "
           "(docs/data-format.md, \"Chat-format SFT\")";
  }
  if (json.contains("assistant_spans")) {
    return ": this is rendered chat ({\"text\", \"assistant_spans\"}): tokenize it with "
           "`megatrain tokenize --format chat` so that only the answers are trained";
  }
  if (json.contains("input_ids")) {
    return ": this is pre-tokenized SFT data ({\"input_ids\"}): tokenize it with "
           "`megatrain tokenize --format sft`";
  }
  return "";
}

absl::Status ReadJsonl(const std::string& path, const Tokenizer& tokenizer,
                       const std::string& text_field, bool add_bos, DocumentSink& sink) {
  return ForEachJsonObject(
      path, [&](const nlohmann::json& json, const std::string& where) -> absl::Status {
        const std::string other_format = OtherFormatHint(json);
        if (!other_format.empty())
          return absl::InvalidArgumentError(absl::StrCat(where, other_format));
        const auto it = json.find(text_field);
        if (it == json.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": field \"", text_field, "\" is missing"));
        }
        if (!it->is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": field \"", text_field, "\" must be a string, got ", it->type_name()));
        }
        MEGATRAIN_ASSIGN_OR_RETURN(
            std::vector<int32_t> ids,
            EncodeDocument(tokenizer, it->get_ref<const std::string&>(), add_bos));
        return sink.Add(ids, {});
      });
}

// One SFT example: ids and their loss mask (0/1).
absl::Status ParseSftExample(const nlohmann::json& json, uint64_t id_limit, bool vocab_known,
                             std::vector<int32_t>& ids, std::vector<int32_t>& mask) {
  const auto input_ids = json.find("input_ids");
  if (input_ids == json.end()) {
    return absl::InvalidArgumentError("field \"input_ids\" is missing");
  }
  if (!input_ids->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field \"input_ids\" must be an array of token ids, got ", input_ids->type_name()));
  }
  ids.clear();
  for (size_t pos = 0; pos < input_ids->size(); ++pos) {
    const nlohmann::json& value = (*input_ids)[pos];
    const bool in_range = value.is_number_integer() && value.get<int64_t>() >= 0 &&
                          static_cast<uint64_t>(value.get<int64_t>()) < id_limit;
    if (!in_range) {
      return absl::InvalidArgumentError(
          absl::StrCat("input_ids[", pos, "] = ", value.dump(), " is not an integer in [0, ",
                       id_limit, ")", vocab_known ? " (vocab_size)" : " (int32 range)"));
    }
    ids.push_back(static_cast<int32_t>(value.get<int64_t>()));
  }
  const auto labels = json.find("labels");
  const auto loss_mask = json.find("loss_mask");
  if (labels != json.end() && loss_mask != json.end()) {
    return absl::InvalidArgumentError("has both \"labels\" and \"loss_mask\"; give at most one");
  }
  mask.assign(ids.size(), 1);
  const auto check_length = [&](const nlohmann::json& array,
                                absl::string_view name) -> absl::Status {
    if (!array.is_array() || array.size() != ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("field \"", name, "\" must be an array of ",
                                                     ids.size(), " values (one per input id), got ",
                                                     array.is_array()
                                                         ? absl::StrCat(array.size(), " values")
                                                         : std::string(array.type_name())));
    }
    return absl::OkStatus();
  };
  if (labels != json.end()) {
    MEGATRAIN_RETURN_IF_ERROR(check_length(*labels, "labels"));
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      const nlohmann::json& value = (*labels)[pos];
      if (value.is_number_integer() && value.get<int64_t>() == kIgnoreLabel) {
        mask[pos] = 0;
      } else if (!value.is_number_integer() || value.get<int64_t>() != ids[pos]) {
        return absl::InvalidArgumentError(
            absl::StrCat("labels[", pos, "] = ", value.dump(), " must be -100 or input_ids[", pos,
                         "] = ", ids[pos], " (labels are not shifted; the loader shifts them)"));
      }
    }
  }
  if (loss_mask != json.end()) {
    MEGATRAIN_RETURN_IF_ERROR(check_length(*loss_mask, "loss_mask"));
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      const nlohmann::json& value = (*loss_mask)[pos];
      if (value.is_boolean()) {
        mask[pos] = value.get<bool>() ? 1 : 0;
      } else if (value.is_number_integer() &&
                 (value.get<int64_t>() == 0 || value.get<int64_t>() == 1)) {
        mask[pos] = static_cast<int32_t>(value.get<int64_t>());
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("loss_mask[", pos, "] = ", value.dump(), " must be 0, 1 or a bool"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReadSftJsonl(const std::string& path, uint64_t vocab_size, DocumentSink& sink) {
  const uint64_t id_limit = vocab_size != 0 ? vocab_size : kTokenShardMaxVocabSize;
  std::vector<int32_t> ids;
  std::vector<int32_t> mask;
  return ForEachJsonObject(
      path, [&](const nlohmann::json& json, const std::string& where) -> absl::Status {
        MEGATRAIN_RETURN_IF_ERROR(
            Annotate(ParseSftExample(json, id_limit, vocab_size != 0, ids, mask), where));
        return sink.Add(ids, mask);
      });
}

// transformers' char_to_token: the first token whose span holds `pos`.
std::optional<size_t> TokenAt(const std::vector<std::pair<size_t, size_t>>& spans, size_t pos) {
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].first <= pos && pos < spans[i].second) return i;
  }
  return std::nullopt;
}

// Note [Chat loss mask]
// transformers' apply_chat_template(return_assistant_tokens_mask=True)
// marks, for each {% generation %} span [start, end) of the rendered text,
// the tokens from char_to_token(start) through char_to_token(end - 1)
// (to the last token when that is None or 0), and stops at the first span
// whose start has no token. Positions are characters there and bytes here:
// `end - 1` becomes the first byte of the span's last character, so that a
// character split over several byte-level tokens resolves to the first of
// them, as char_to_token does.
std::vector<int32_t> ChatLossMask(absl::string_view text,
                                  const std::vector<std::pair<size_t, size_t>>& token_spans,
                                  const std::vector<std::pair<size_t, size_t>>& assistant_spans) {
  std::vector<int32_t> mask(token_spans.size(), 0);
  for (const auto& [start, end] : assistant_spans) {
    const std::optional<size_t> first = TokenAt(token_spans, start);
    if (!first.has_value()) break;
    size_t last_char = end > start ? end - 1 : start;
    while (last_char > start && (static_cast<unsigned char>(text[last_char]) & 0xC0) == 0x80) {
      --last_char;
    }
    const std::optional<size_t> last = TokenAt(token_spans, last_char);
    const size_t stop = last.has_value() && *last != 0 ? *last + 1 : mask.size();
    for (size_t t = *first; t < stop; ++t) mask[t] = 1;
  }
  return mask;
}

// One conversation of chat JSONL (megatrain_client.chat_template's output):
// {"text": rendered, "assistant_spans": [[start, end], ...], "turns":
// [{"role", "start", "end"}, ...] (optional)}, offsets in UTF-8 bytes.
struct ChatTurn {
  std::string role;
  size_t start = 0;
  size_t end = 0;
};
struct ChatConversation {
  std::string text;
  std::vector<std::pair<size_t, size_t>> assistant_spans;
  std::vector<ChatTurn> turns;  // in order, not overlapping; empty: not given
};

// A byte offset of `value` in [min, max]; false otherwise.
bool ReadOffset(const nlohmann::json& value, size_t min, size_t max, size_t* out) {
  if (!value.is_number_unsigned()) return false;
  const uint64_t offset = value.get<uint64_t>();
  if (offset < min || offset > max) return false;
  *out = static_cast<size_t>(offset);
  return true;
}

absl::Status ParseChatTurns(const nlohmann::json& json, ChatConversation& chat) {
  const auto turns = json.find("turns");
  if (turns == json.end()) return absl::OkStatus();
  if (!turns->is_array()) return absl::InvalidArgumentError("field \"turns\" must be an array");
  size_t previous_end = 0;
  for (size_t k = 0; k < turns->size(); ++k) {
    const nlohmann::json& turn = (*turns)[k];
    ChatTurn parsed;
    const bool ok = turn.is_object() && turn.contains("role") && turn["role"].is_string() &&
                    turn.contains("start") && turn.contains("end") &&
                    ReadOffset(turn["start"], previous_end, chat.text.size(), &parsed.start) &&
                    ReadOffset(turn["end"], parsed.start, chat.text.size(), &parsed.end);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "turns[", k, "] = ", turn.dump(), " must be {\"role\": string, \"start\", \"end\"} with ",
          previous_end, " <= start <= end <= ", chat.text.size(), " (in order, not overlapping)"));
    }
    parsed.role = turn["role"].get<std::string>();
    previous_end = parsed.end;
    chat.turns.push_back(std::move(parsed));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChatConversation> ParseChatConversation(const nlohmann::json& json) {
  ChatConversation chat;
  const auto text = json.find("text");
  if (text == json.end() || !text->is_string()) {
    return absl::InvalidArgumentError(
        "field \"text\" must be a string (chat JSONL is the output of python3 -m "
        "megatrain_client.chat_template, not {\"messages\": ...}: run that first)");
  }
  chat.text = text->get<std::string>();
  const auto spans = json.find("assistant_spans");
  if (spans == json.end() || !spans->is_array()) {
    return absl::InvalidArgumentError("field \"assistant_spans\" must be an array");
  }
  for (size_t k = 0; k < spans->size(); ++k) {
    const nlohmann::json& span = (*spans)[k];
    size_t start = 0;
    size_t end = 0;
    if (!span.is_array() || span.size() != 2 || !ReadOffset(span[0], 0, chat.text.size(), &start) ||
        !ReadOffset(span[1], start, chat.text.size(), &end)) {
      return absl::InvalidArgumentError(absl::StrCat("assistant_spans[", k, "] = ", span.dump(),
                                                     " must be [start, end] with 0 <= start <= "
                                                     "end <= ",
                                                     chat.text.size()));
    }
    chat.assistant_spans.emplace_back(start, end);
  }
  MEGATRAIN_RETURN_IF_ERROR(ParseChatTurns(json, chat));
  return chat;
}

// A tokenized conversation: ids and loss mask.
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<int32_t> mask;
  std::vector<std::pair<size_t, size_t>> token_spans;  // bytes of each token
};

absl::StatusOr<ChatTokens> TokenizeChat(const Tokenizer& tokenizer, const ChatConversation& chat,
                                        bool train_on_all_turns) {
  ChatTokens out;
  MEGATRAIN_RETURN_IF_ERROR(tokenizer.EncodeWithSpans(chat.text, &out.ids, &out.token_spans));
  out.mask = train_on_all_turns ? std::vector<int32_t>(out.ids.size(), 1)
                                : ChatLossMask(chat.text, out.token_spans, chat.assistant_spans);
  return out;
}

// `chat` without the bytes [cut_start, cut_end) (whole turns), its spans
// moved to match; spans inside the cut go with it.
ChatConversation CutTurns(const ChatConversation& chat, size_t cut_start, size_t cut_end) {
  ChatConversation out;
  out.text = chat.text.substr(0, cut_start) + chat.text.substr(cut_end);
  const size_t removed = cut_end - cut_start;
  for (const auto& [start, end] : chat.assistant_spans) {
    if (end <= cut_start) out.assistant_spans.emplace_back(start, end);
    if (start >= cut_end) out.assistant_spans.emplace_back(start - removed, end - removed);
  }
  return out;
}

// Note [Chat truncation]
// A conversation over max_document_tokens keeps whole turns: its leading
// system turns (and whatever the template writes before the first turn)
// stay, and the oldest turns after them go, the fewest such that it fits
// and still starts with a user turn. The token count of each candidate is
// estimated from the whole conversation's tokens, then checked by
// tokenizing the shortened text (what the model will see). nullopt when no
// cut fits or none leaves an assistant answer (the caller drops the
// conversation and counts it).
absl::StatusOr<std::optional<ChatTokens>> DropOldestTurns(const Tokenizer& tokenizer,
                                                          const ChatConversation& chat,
                                                          const ChatTokens& whole,
                                                          uint64_t max_tokens,
                                                          bool train_on_all_turns) {
  size_t first = 0;  // the first turn that is not a system prompt
  while (first < chat.turns.size() &&
         (chat.turns[first].role == "system" || chat.turns[first].role == "developer")) {
    ++first;
  }
  for (size_t keep = first + 1; keep < chat.turns.size(); ++keep) {
    if (chat.turns[keep].role != "user") continue;
    const size_t cut_start = first < chat.turns.size() ? chat.turns[first].start : 0;
    const size_t cut_end = chat.turns[keep].start;
    uint64_t estimate = 0;
    for (const auto& [start, end] : whole.token_spans) {
      estimate += start < cut_start || start >= cut_end;
    }
    if (estimate > max_tokens) continue;
    const ChatConversation shorter = CutTurns(chat, cut_start, cut_end);
    if (shorter.assistant_spans.empty() && !train_on_all_turns) break;
    MEGATRAIN_ASSIGN_OR_RETURN(ChatTokens tokens,
                               TokenizeChat(tokenizer, shorter, train_on_all_turns));
    if (tokens.ids.size() <= max_tokens) return std::optional<ChatTokens>(std::move(tokens));
  }
  return std::optional<ChatTokens>();
}

// Chat JSONL (ChatConversation): tokenized, masked (Note [Chat loss mask]),
// and, over max_document_tokens, shortened by whole turns (Note [Chat
// truncation]) or dropped.
absl::Status ReadChatJsonl(const std::string& path, const Tokenizer& tokenizer,
                           const TokenizeOptions& options, DocumentSink& sink) {
  return ForEachJsonObject(
      path, [&](const nlohmann::json& json, const std::string& where) -> absl::Status {
        absl::StatusOr<ChatConversation> chat = ParseChatConversation(json);
        if (!chat.ok()) return Annotate(chat.status(), where);
        absl::StatusOr<ChatTokens> tokens =
            TokenizeChat(tokenizer, *chat, options.train_on_all_turns);
        if (!tokens.ok()) return Annotate(tokens.status(), where);
        const uint64_t max_tokens = options.max_document_tokens;
        if (max_tokens == 0 || tokens->ids.size() <= max_tokens) {
          return sink.Add(tokens->ids, tokens->mask);
        }
        if (options.long_documents == LongDocumentRule::kDrop || chat->turns.empty()) {
          sink.DropLong();
          return absl::OkStatus();
        }
        absl::StatusOr<std::optional<ChatTokens>> shorter =
            DropOldestTurns(tokenizer, *chat, *tokens, max_tokens, options.train_on_all_turns);
        if (!shorter.ok()) return Annotate(shorter.status(), where);
        if (!shorter->has_value()) {
          sink.DropLong();
          return absl::OkStatus();
        }
        return sink.Add((*shorter)->ids, (*shorter)->mask, /*turns_dropped=*/true);
      });
}

absl::Status ValidateOptions(const TokenizeOptions& options) {
  if (options.input_paths.empty()) {
    return absl::InvalidArgumentError("input_paths: is empty; name a file");
  }
  if (options.output_dir.empty()) {
    return absl::InvalidArgumentError("output_dir: is empty");
  }
  if (options.shard_prefix.empty() || options.shard_prefix.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_prefix: must be a non-empty file name prefix "
                     "without '/', got '",
                     options.shard_prefix, "'"));
  }
  if (options.max_shard_tokens < 1) {
    return absl::InvalidArgumentError("max_shard_tokens: must be at least 1");
  }
  MEGATRAIN_RETURN_IF_ERROR(
      CheckRealInRange("eval_fraction", options.eval_fraction, kEvalFractionRange));
  if (options.vocab_size < 0 ||
      static_cast<uint64_t>(options.vocab_size) > kTokenShardMaxVocabSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size: must be in [0, 2^31], got ", options.vocab_size));
  }
  const bool sft = options.format == CorpusFormat::kSftJsonl;
  if (options.train_on_all_turns && options.format != CorpusFormat::kChatJsonl) {
    return absl::InvalidArgumentError("train_on_all_turns: applies to the chat format only");
  }
  if (!sft && options.tokenizer_model.empty()) {
    return absl::InvalidArgumentError(
        "tokenizer_model: required to tokenize text (plain text or JSONL); "
        "only SFT JSONL (pre-tokenized) can do without");
  }
  if ((sft || options.format == CorpusFormat::kChatJsonl) && options.add_bos) {
    return absl::InvalidArgumentError(
        "add_bos: applies to text only; SFT input_ids are written as given");
  }
  if (options.text_field.empty()) {
    return absl::InvalidArgumentError("text_field: is empty");
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Reads one input file in its format (kAuto: by extension) into `sink`.
// `tokenizer` is empty only for kSftJsonl, whose ids are given.
absl::Status ReadInputFile(const std::string& path, const TokenizeOptions& options,
                           const std::optional<Tokenizer>& tokenizer, uint64_t vocab_size,
                           DocumentSink& sink) {
  CorpusFormat format = options.format;
  if (format == CorpusFormat::kAuto) {
    format = absl::EndsWith(path, ".jsonl") ? CorpusFormat::kJsonl : CorpusFormat::kPlainText;
  }
  switch (format) {
    case CorpusFormat::kPlainText:
      MEGATRAIN_RETURN_IF_ERROR(ReadPlainText(path, *tokenizer, options.add_bos, sink));
      break;
    case CorpusFormat::kJsonl:
      MEGATRAIN_RETURN_IF_ERROR(
          ReadJsonl(path, *tokenizer, options.text_field, options.add_bos, sink));
      break;
    case CorpusFormat::kSftJsonl:
      MEGATRAIN_RETURN_IF_ERROR(ReadSftJsonl(path, vocab_size, sink));
      break;
    case CorpusFormat::kChatJsonl:
      MEGATRAIN_RETURN_IF_ERROR(ReadChatJsonl(path, *tokenizer, options, sink));
      break;
    case CorpusFormat::kAuto:
      break;  // resolved above
  }
  return absl::OkStatus();
}

constexpr char kReportFormat[] = "megatrain-tokenize-report";
// A report is a dozen numbers; anything larger is not one.
constexpr int64_t kMaxReportBytes = int64_t{64} << 10;

const char* LongDocumentRuleName(LongDocumentRule rule) {
  return rule == LongDocumentRule::kDrop ? "drop" : "truncate";
}

// Writes Note [Tokenize report]'s file into `dir` (`shown` names it).
absl::Status WriteReportFile(const DirFd& dir, const std::string& shown,
                             const TokenizeReport& report) {
  const nlohmann::json j = {{"format", kReportFormat},
                            {"version", 2},
                            {"documents", report.documents},
                            {"tokens", report.tokens},
                            {"trained_tokens", report.trained_tokens},
                            {"eval_documents", report.eval_documents},
                            {"eval_tokens", report.eval_tokens},
                            {"eval_trained_tokens", report.eval_trained_tokens},
                            {"untrained_documents", report.untrained_documents},
                            {"eos_id", report.eos_id},
                            {"masked", report.masked},
                            {"max_document_tokens", report.max_document_tokens},
                            {"long_documents", LongDocumentRuleName(report.long_documents)},
                            {"truncated_documents", report.truncated_documents},
                            {"dropped_documents", report.dropped_documents}};
  const std::string text = j.dump(2);
  absl::StatusOr<AtomicFileWriter> out =
      AtomicFileWriter::Create(dir.IoPath(kTokenizeReportFileName));
  if (!out.ok()) return ShowPath(out.status(), dir.IoPath(), shown);
  absl::Status written = out->Append(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  if (written.ok()) written = out->Commit();
  return ShowPath(written, dir.IoPath(), shown);
}

// OpenOutputDir, then PrepareOutputDir, of `dir` (field `field`).
absl::StatusOr<DirFd> OpenPreparedOutputDir(const TokenizeOptions& options, const std::string& dir,
                                            absl::string_view field) {
  MEGATRAIN_ASSIGN_OR_RETURN(DirFd dir_fd, OpenOutputDir(options.root, dir, field));
  MEGATRAIN_RETURN_IF_ERROR(
      PrepareOutputDir(dir_fd, dir, field, options.shard_prefix, options.overwrite));
  return dir_fd;
}

// The counts and paths of a finished run into `report`.
void FillReport(const TokenizeOptions& options, const ShardSeries& train, const ShardSeries& eval,
                const DocumentSink& sink, TokenizeReport* report) {
  report->documents = train.documents();
  report->tokens = train.tokens();
  report->eval_documents = eval.documents();
  report->eval_tokens = eval.tokens();
  report->trained_tokens = train.trained_tokens();
  report->eval_trained_tokens = eval.trained_tokens();
  report->untrained_documents = sink.untrained();
  report->skipped_documents = sink.skipped();
  report->masked_tokens = sink.masked_tokens();
  report->truncated_documents = sink.truncated_long();
  report->dropped_documents = sink.dropped_long();
  report->bytes_written = train.bytes_written() + eval.bytes_written();
  report->shards = train.paths();
  report->eval_shards = eval.paths();
  report->max_document_tokens = options.max_document_tokens;
  report->long_documents = options.long_documents;
}

}  // namespace

namespace {

// Version 2's counts of trained tokens (Note [Tokenize report]); a version 1
// report leaves trained_counts_known false.
absl::Status ReadTrainedCounts(const nlohmann::json& j, const std::string& path,
                               TokenizeReport* report) {
  if (j.value("version", 1) < 2) return absl::OkStatus();
  for (auto [key, field] :
       {std::pair<const char*, uint64_t*>{"trained_tokens", &report->trained_tokens},
        {"eval_tokens", &report->eval_tokens},
        {"eval_trained_tokens", &report->eval_trained_tokens},
        {"untrained_documents", &report->untrained_documents}}) {
    if (!j.contains(key) || !j[key].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", key, "\": missing or not a count"));
    }
    *field = j[key].get<uint64_t>();
  }
  report->trained_counts_known = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizeReport> ReadTokenizeReport(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kTokenizeReportFileName);
  MEGATRAIN_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, kMaxReportBytes));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto invalid = [&path](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kReportFormat) {
    return invalid(absl::StrCat("not a ", kReportFormat, " (JSON object with \"format\")"));
  }
  TokenizeReport report;
  for (auto [key, field] : {std::pair<const char*, uint64_t*>{"documents", &report.documents},
                            {"tokens", &report.tokens},
                            {"eval_documents", &report.eval_documents},
                            {"max_document_tokens", &report.max_document_tokens},
                            {"truncated_documents", &report.truncated_documents},
                            {"dropped_documents", &report.dropped_documents}}) {
    if (!j.contains(key) || !j[key].is_number_unsigned()) {
      return invalid(absl::StrCat("\"", key, "\": missing or not a count"));
    }
    *field = j[key].get<uint64_t>();
  }
  if (!j.contains("eos_id") || !j["eos_id"].is_number_integer()) {
    return invalid("\"eos_id\": missing or not an integer");
  }
  report.eos_id = j["eos_id"].get<int64_t>();
  report.masked = j.value("masked", false);
  MEGATRAIN_RETURN_IF_ERROR(ReadTrainedCounts(j, path, &report));
  const std::string rule = j.value("long_documents", "");
  if (rule != "truncate" && rule != "drop") {
    return invalid(absl::StrCat("\"long_documents\": must be truncate or drop, got '", rule, "'"));
  }
  report.long_documents = rule == "drop" ? LongDocumentRule::kDrop : LongDocumentRule::kTruncate;
  return report;
}

namespace {

// The vocab_size written into the shards (TokenizeOptions::vocab_size):
// the option when set, else the tokenizer's, else 0 (unknown). A tokenizer
// that makes the ids (every format but SFT) must fit in the option: its
// ids at or above it would index past the model's embedding.
absl::StatusOr<int64_t> ShardVocabSize(const TokenizeOptions& options,
                                       const std::optional<Tokenizer>& tokenizer) {
  if (!tokenizer.has_value()) return options.vocab_size;
  if (options.vocab_size == 0) return tokenizer->vocab_size();
  if (options.format != CorpusFormat::kSftJsonl && tokenizer->vocab_size() > options.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size: ", options.vocab_size, " but the tokenizer ", options.tokenizer_model, " has ",
        tokenizer->vocab_size(), " ids: its ids from ", options.vocab_size,
        " up would not exist in the model (another model's tokenizer?); give the model's "
        "vocab_size (config.json), at least the tokenizer's, or 0 for the tokenizer's"));
  }
  return options.vocab_size;
}

}  // namespace

absl::Status CheckTextInputHead(const std::string& path, const std::string& text_field) {
  MEGATRAIN_ASSIGN_OR_RETURN(const int fd, OpenInputFile(path));
  std::string head(static_cast<size_t>(kTextInputHeadBytes), '\0');
  size_t done = 0;
  ssize_t got = 0;
  while (done < head.size() && (got = ::read(fd, head.data() + done, head.size() - done)) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error, absl::StrCat(path, ": read failed"));
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  head.resize(done);
  const bool whole = done < static_cast<size_t>(kTextInputHeadBytes);
  const size_t first = head.find_first_not_of(" \t\r\n\f\v");
  if (first == std::string::npos) {
    if (!whole) return absl::OkStatus();  // a blank first MiB: the tokenizer decides
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", done == 0 ? "is empty" : "holds only blank lines",
                     ": no document to train on"));
  }
  if (!absl::EndsWith(path, ".jsonl")) return absl::OkStatus();
  const size_t line_end = head.find('\n', first);
  if (line_end == std::string::npos && !whole) return absl::OkStatus();  // a longer first line
  const std::string where =
      absl::StrCat(path, ":", 1 + std::count(head.begin(), head.begin() + first, '\n'));
  absl::StatusOr<nlohmann::json> json = ParseJsonObject(absl::string_view(head).substr(
      first, line_end == std::string::npos ? std::string::npos : line_end - first));
  if (!json.ok()) return Annotate(json.status(), where);
  const std::string other_format = OtherFormatHint(*json);
  if (!other_format.empty()) return absl::InvalidArgumentError(absl::StrCat(where, other_format));
  const auto text = json->find(text_field);
  if (text == json->end() || !text->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field \"", text_field, "\" (the document's text) is ",
                     text == json->end() ? "missing" : "not a string"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenizeReport> TokenizeToShards(const TokenizeOptions& options) {
  MEGATRAIN_RETURN_IF_ERROR(ValidateOptions(options));
  const bool chat = options.format == CorpusFormat::kChatJsonl;
  // Both write a loss mask beside each shard.
  const bool sft = options.format == CorpusFormat::kSftJsonl || chat;

  std::optional<Tokenizer> tokenizer;
  if (!options.tokenizer_model.empty()) {
    absl::StatusOr<Tokenizer> loaded = Tokenizer::Load(options.tokenizer_model);
    if (!loaded.ok()) return Annotate(loaded.status(), "tokenizer_model");
    tokenizer = *std::move(loaded);
  }
  if (options.add_bos && tokenizer->bos_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("add_bos: the tokenizer ", options.tokenizer_model, " has no BOS piece"));
  }

  TokenizeReport report;
  MEGATRAIN_ASSIGN_OR_RETURN(report.vocab_size, ShardVocabSize(options, tokenizer));
  report.eos_id = tokenizer.has_value() ? tokenizer->eos_id() : -1;

  const std::string eval_dir =
      options.eval_output_dir.empty() ? options.output_dir + "/eval" : options.eval_output_dir;
  const bool split = options.eval_fraction > 0.0;
  if (split &&
      fs::path(eval_dir).lexically_normal() == fs::path(options.output_dir).lexically_normal()) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_output_dir: must differ from output_dir ", options.output_dir,
                     " (a loader reading output_dir would train on the held-out shards)"));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(DirFd train_fd,
                             OpenPreparedOutputDir(options, options.output_dir, "output_dir"));
  std::optional<DirFd> eval_fd;
  if (split) {
    MEGATRAIN_ASSIGN_OR_RETURN(eval_fd,
                               OpenPreparedOutputDir(options, eval_dir, "eval_output_dir"));
  }

  const uint64_t vocab_size = static_cast<uint64_t>(report.vocab_size);
  ShardSeries train(&train_fd, options.output_dir, options.shard_prefix, vocab_size, sft,
                    options.max_shard_tokens);
  ShardSeries eval(split ? &*eval_fd : &train_fd, eval_dir, options.shard_prefix, vocab_size, sft,
                   options.max_shard_tokens);
  DocumentSink sink(options, &train, split ? &eval : nullptr);

  const auto start = std::chrono::steady_clock::now();
  for (const std::string& path : options.input_paths) {
    std::error_code size_error;
    const uintmax_t input_bytes = fs::file_size(path, size_error);
    if (!size_error) report.input_bytes += input_bytes;
    MEGATRAIN_RETURN_IF_ERROR(ReadInputFile(path, options, tokenizer, vocab_size, sink));
  }
  MEGATRAIN_RETURN_IF_ERROR(train.Finish());
  MEGATRAIN_RETURN_IF_ERROR(eval.Finish());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  FillReport(options, train, eval, sink, &report);
  report.masked = sft;
  report.trained_counts_known = true;
  if (report.documents + report.eval_documents == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_paths: no document with ", sft ? "trained " : "", "tokens in ",
                     options.input_paths.size(), " file(s) (", report.skipped_documents, " empty, ",
                     report.untrained_documents, " with no trained token (loss mask all 0), ",
                     report.dropped_documents, " over max_document_tokens); nothing written"));
  }
  MEGATRAIN_RETURN_IF_ERROR(
      Annotate(WriteReportFile(train_fd, options.output_dir, report), "output_dir"));
  return report;
}

}  // namespace megatrain::engine
