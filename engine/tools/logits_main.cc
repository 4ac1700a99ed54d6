// megatrain-logits: the engine's logits for one window of tokens, written
// as raw little-endian fp32 [T, V] with a JSON sidecar (the tokens, shape,
// loss), so that another implementation (transformers, in
// deploy/check-hf-export.py) can be compared with the engine on the same
// input. With --export DIR it also writes the loaded model back out as an
// fp32 HF directory (ExportHfDirectory, with the model directory's config
// keys and tokenizer files), for the reload check.
#include <cmath>
#include <cstdio>
#include <string>
#include <filesystem>
#include <fstream>

#include "CLI/CLI.hpp"
#include "engine/formats/hf_export.h"
#include "engine/formats/hf_model.h"
#include "engine/data/token_shard.h"
#include "engine/step/trainer.h"
#include "engine/runtime/torch_compat.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  megatrain::engine::compat::PreferExpandableSegments();  // Note [Expandable segments]
  namespace engine = megatrain::engine;
  std::string model, tokens_path, out, export_dir, device = "cpu", dtype = "fp32";
  int64_t seq_len = 128, offset = 0;
  CLI::App app{"megatrain-logits: engine logits of one token window"};
  app.set_version_flag("--version", std::string("megatrain-logits ") + MEGATRAIN_VERSION);
  app.add_option("--model", model, "HF model directory (config.json + safetensors) or preset")
      ->required();
  app.add_option("--tokens", tokens_path, "Token shard file (.mtt)")->required();
  app.add_option("--offset", offset, "First token of the window in the shard");
  app.add_option("--seq_len", seq_len, "Window length T");
  app.add_option("--device", device, "cpu | cuda | cuda:N");
  app.add_option("--compute_dtype", dtype, "fp32 | tf32 | bf16");
  app.add_option("--out", out, "Output prefix: OUT.logits.f32 and OUT.json")->required();
  app.add_option("--export", export_dir, "Also export the model as an fp32 HF directory here");
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "megatrain-logits: %s\n", s.ToString().c_str());
    return 1;
  };
  absl::StatusOr<engine::ModelConfig> config = std::filesystem::is_directory(model)
                                                   ? engine::LoadHfConfig(model)
                                                   : engine::PresetConfig(model);
  if (!config.ok()) return fail(config.status());
  auto reader = engine::TokenShardReader::Open(tokens_path);
  if (!reader.ok()) return fail(reader.status());
  engine::MicroBatch mb;
  mb.input_ids.resize(seq_len);
  if (auto s = reader->CopyTokens(offset, absl::MakeSpan(mb.input_ids)); !s.ok()) return fail(s);
  std::vector<int32_t> next(seq_len);
  if (auto s = reader->CopyTokens(offset + 1, absl::MakeSpan(next)); !s.ok()) return fail(s);
  mb.labels = next;

  engine::TrainerOptions o;
  o.device = device;
  auto compute = engine::ParseComputeDtype(dtype, "--compute_dtype");
  if (!compute.ok()) return fail(compute.status());
  o.compute_dtype = *compute;
  o.micro_batch = 1;
  o.seq_len = seq_len;
  auto trainer = engine::Trainer::Create(*config, o, 0);
  if (!trainer.ok()) return fail(trainer.status());
  if (std::filesystem::is_directory(model)) {
    if (auto s = engine::LoadHfWeights(model, &(*trainer)->store()); !s.ok()) return fail(s);
  }
  if (!export_dir.empty()) {
    // As `megatrain export` does: the model directory's config keys and
    // tokenizer files kept (Note [Export copies] in engine/formats/hf_export.h).
    engine::HfExportOptions export_options;
    export_options.dtype = engine::ExportDtype::kFp32;
    if (std::filesystem::is_directory(model)) {
      export_options.source_dir = std::filesystem::canonical(model).string();
    }
    auto report = engine::ExportHfDirectory((*trainer)->store(),
                                            std::filesystem::weakly_canonical(export_dir).string(),
                                            export_options);
    if (!report.ok()) return fail(report.status());
    for (const std::string& skipped : report->skipped_files) {
      std::fprintf(stderr, "megatrain-logits: export: not copied: %s\n", skipped.c_str());
    }
  }
  auto logits = (*trainer)->Logits(mb);
  if (!logits.ok()) return fail(logits.status());
  auto loss = (*trainer)->Evaluate(absl::MakeConstSpan(&mb, 1));
  if (!loss.ok()) return fail(loss.status());
  std::ofstream bin(out + ".logits.f32", std::ios::binary);
  bin.write(reinterpret_cast<const char*>(logits->data()),
            static_cast<std::streamsize>(logits->size() * sizeof(float)));
  nlohmann::json j{{"input_ids", mb.input_ids},
                   {"shape", {seq_len, config->vocab_size}},
                   {"loss", *loss},
                   {"device", (*trainer)->device_name()},
                   {"compute_dtype", dtype}};
  std::ofstream(out + ".json") << j.dump() << "\n";
  std::printf("{\"loss\": %.6f, \"logits\": \"%s.logits.f32\"}\n", *loss, out.c_str());
  return bin.good() ? 0 : 1;
}
