// megatrain-tokenize: text, JSONL or SFT JSONL -> token shards (the
// documented format of docs/data-format.md), with a Hugging Face tokenizer
// (a model directory with tokenizer.json, or the file) or a SentencePiece
// model.
// Also reached as `megatrain tokenize ...` (the CLI runs this program).
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "engine/data/text_corpus.h"
#include "nlohmann/json.hpp"

namespace {

using megatrain::engine::TokenizeOptions;
using megatrain::engine::TokenizeReport;

void AddOptions(CLI::App* app, TokenizeOptions* o, std::string* format, std::string* long_documents,
                bool* json) {
  app->name("megatrain tokenize");
  app->add_option("inputs", o->input_paths,
                  "Text (.txt, documents separated by blank lines) "
                  "or JSONL ({\"text\": ...}) files")
      ->required();
  app->add_option("--tokenizer", o->tokenizer_model,
                  "HF model directory (its tokenizer.json and tokenizer_config.json), a "
                  "tokenizer.json file, or a SentencePiece .model file; every format but sft "
                  "needs one");
  app->add_option("--out", o->output_dir, "Output directory for the shards")->required();
  app->add_option("--format", *format,
                  "auto | text | jsonl | sft | chat (the output of python3 -m "
                  "megatrain_client.chat_template; needs a HF tokenizer)")
      ->capture_default_str();
  app->add_option("--max_document_tokens", o->max_document_tokens,
                  "Documents longer than this are truncated or dropped (--long_documents; "
                  "chat keeps whole turns: its oldest turns go); 0: no limit. For SFT/chat "
                  "use the job's seq_len");
  app->add_option("--long_documents", *long_documents, "truncate | drop")->capture_default_str();
  app->add_flag("--train_on_all_turns", o->train_on_all_turns,
                "chat: train on every token, not only the assistant turns");
  app->add_option("--text_field", o->text_field, "JSONL field holding the text")
      ->capture_default_str();
  app->add_option("--vocab_size", o->vocab_size,
                  "The model's vocab_size (config.json): written into the shards, ids must be "
                  "below it, and a tokenizer with more ids is refused; 0: the tokenizer's");
  app->add_option("--eval_fraction", o->eval_fraction, "Share of documents held out, [0, 0.5]");
  app->add_option("--eval_out", o->eval_output_dir, "Output directory of the held-out shards");
  app->add_option("--split_seed", o->split_seed, "Seed of the held-out split");
  app->add_option("--max_shard_tokens", o->max_shard_tokens, "Tokens per shard file");
  app->add_option("--prefix", o->shard_prefix, "Shard file name prefix")->capture_default_str();
  app->add_flag("--add_bos", o->add_bos, "Start every document with BOS");
  app->add_flag("--overwrite", o->overwrite, "Replace existing shards in --out");
  app->add_flag("--json", *json, "Print the report as JSON");
}

// --format and --long_documents into `o`; false (after a message) for an
// unknown value.
bool ParseChoices(const std::string& format, const std::string& long_documents,
                  TokenizeOptions& o) {
  using megatrain::engine::CorpusFormat;
  if (format == "auto") {
    o.format = CorpusFormat::kAuto;
  } else if (format == "text") {
    o.format = CorpusFormat::kPlainText;
  } else if (format == "jsonl") {
    o.format = CorpusFormat::kJsonl;
  } else if (format == "sft") {
    o.format = CorpusFormat::kSftJsonl;
  } else if (format == "chat") {
    o.format = CorpusFormat::kChatJsonl;
  } else {
    std::fprintf(stderr, "megatrain tokenize: --format: unknown '%s' (auto|text|jsonl|sft|chat)\n",
                 format.c_str());
    return false;
  }
  if (long_documents == "truncate") {
    o.long_documents = megatrain::engine::LongDocumentRule::kTruncate;
  } else if (long_documents == "drop") {
    o.long_documents = megatrain::engine::LongDocumentRule::kDrop;
  } else {
    std::fprintf(stderr, "megatrain tokenize: --long_documents: unknown '%s' (truncate|drop)\n",
                 long_documents.c_str());
    return false;
  }
  return true;
}

void PrintReport(const TokenizeReport& r, const TokenizeOptions& o, bool json) {
  const double mb_per_s = r.seconds > 0 ? static_cast<double>(r.input_bytes) / 1e6 / r.seconds : 0;
  if (json) {
    nlohmann::json j{{"documents", r.documents},
                     {"tokens", r.tokens},
                     {"trained_tokens", r.trained_tokens},
                     {"eval_documents", r.eval_documents},
                     {"eval_tokens", r.eval_tokens},
                     {"eval_trained_tokens", r.eval_trained_tokens},
                     {"skipped_documents", r.skipped_documents},
                     {"untrained_documents", r.untrained_documents},
                     {"masked_tokens", r.masked_tokens},
                     {"truncated_documents", r.truncated_documents},
                     {"dropped_documents", r.dropped_documents},
                     {"bytes_written", r.bytes_written},
                     {"shards", r.shards},
                     {"eval_shards", r.eval_shards},
                     {"vocab_size", r.vocab_size},
                     {"eos_id", r.eos_id},
                     {"input_bytes", r.input_bytes},
                     {"seconds", r.seconds},
                     {"mb_per_s", mb_per_s}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%llu documents, %llu tokens in %zu shard(s) under %s",
                static_cast<unsigned long long>(r.documents),
                static_cast<unsigned long long>(r.tokens), r.shards.size(), o.output_dir.c_str());
    if (r.masked) {
      std::printf(" (%llu trained)", static_cast<unsigned long long>(r.trained_tokens));
    }
    if (r.eval_documents > 0) {
      std::printf("; held out %llu documents, %llu tokens",
                  static_cast<unsigned long long>(r.eval_documents),
                  static_cast<unsigned long long>(r.eval_tokens));
      if (r.masked) {
        std::printf(" (%llu trained)", static_cast<unsigned long long>(r.eval_trained_tokens));
      }
    }
    if (r.truncated_documents + r.dropped_documents > 0) {
      std::printf("; over --max_document_tokens: %llu truncated%s, %llu dropped",
                  static_cast<unsigned long long>(r.truncated_documents),
                  o.format == megatrain::engine::CorpusFormat::kChatJsonl ? " (oldest turns)" : "",
                  static_cast<unsigned long long>(r.dropped_documents));
    }
    if (r.untrained_documents > 0) {
      std::printf("; %llu documents with no trained token (loss mask all 0) left out",
                  static_cast<unsigned long long>(r.untrained_documents));
    }
    std::printf("; %.2f MB in %.2f s (%.1f MB/s)\n", static_cast<double>(r.input_bytes) / 1e6,
                r.seconds, mb_per_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  TokenizeOptions o;
  std::string format = "auto";
  std::string long_documents = "truncate";
  bool json = false;
  CLI::App app{
      "megatrain tokenize: write token shards from text with a HF tokenizer.json "
      "or a SentencePiece model"};
  app.set_version_flag("--version", std::string("megatrain tokenize ") + MEGATRAIN_VERSION);
  AddOptions(&app, &o, &format, &long_documents, &json);
  CLI11_PARSE(app, argc, argv);
  if (!ParseChoices(format, long_documents, o)) return 2;
  auto report = megatrain::engine::TokenizeToShards(o);
  if (!report.ok()) {
    std::fprintf(stderr, "megatrain tokenize: %s\n", report.status().ToString().c_str());
    return 1;
  }
  PrintReport(*report, o, json);
  return 0;
}
