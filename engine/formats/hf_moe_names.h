// Parameter names and layouts of the MoE families, and their HF safetensors
// import and export.
//
// The engine keeps every MoE parameter under the name and layout that
// transformers 5 gives it in memory (the names of its gradients, e.g.
// `model.layers.0.mlp.experts.gate_up_proj` [E, 2*Fe, C]); see ExpertLayout
// in moe_config.h for the two fused expert layouts. On disk the families
// differ, and all of these are read:
//   mixtral    per-expert `block_sparse_moe.experts.{e}.w1|w3|w2.weight`
//              (w1 gate, w3 up, w2 down) and `block_sparse_moe.gate.weight`,
//              as released and as transformers 5 save_pretrained writes them;
//              or the fused in-memory names.
//   qwen2_moe, qwen3_moe
//              per-expert `mlp.experts.{e}.gate_proj|up_proj|down_proj.weight`
//              (released and save_pretrained form); or the fused names.
//   gpt_oss    fused `mlp.experts.gate_up_proj` [E, C, 2*Fe] (interleaved
//              columns) and `down_proj` [E, Fe, C] with `_bias` tensors, in
//              any float dtype, or as released in MXFP4: `<name>_blocks`
//              [E, R, G, 16] uint8 + `<name>_scales` [E, R, G] uint8 that
//              decode to [E, R, 32*G] and are transposed to [E, 32*G, R]
//              (transformers integrations/mxfp4.py), exactly, into fp32.
// Export writes the per-expert form for mixtral and qwen2/3_moe (what
// transformers 5 itself saves) or the fused names on request, and the fused
// bf16/fp32 form for gpt_oss, which transformers loads without a quantizer.
//
// Thread-safety: stateless functions; safe to call concurrently.
#ifndef MEGATRAIN_ENGINE_HF_MOE_NAMES_H_
#define MEGATRAIN_ENGINE_HF_MOE_NAMES_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/moe_config.h"
#include "engine/model/moe_layout.h"
#include "engine/model/param_layout.h"
#include "engine/formats/safetensors.h"

namespace megatrain::engine {

// Parameters by HF (transformers 5 in-memory) name: fp32, CPU, contiguous.
using MoeTensorMap = std::map<std::string, at::Tensor>;

// Reads every parameter of `config` from `model` into fp32 (any float
// dtype on disk, MXFP4 for gpt_oss experts), in three phases: every tensor
// on disk is claimed by some parameter, every parameter has one complete
// source with the right shapes, then the values are converted.
// Errors (each naming the tensor, and both shapes where they differ):
// INVALID_ARGUMENT for an unknown tensor, a wrong shape or dtype, or a
// parameter present in two forms; NOT_FOUND for a missing tensor (an
// expert's slice names the expert); DATA_LOSS for a corrupt MXFP4 scale.
absl::StatusOr<MoeTensorMap> LoadMoeHfParams(const MoeModelConfig& config,
                                             const SafetensorsModel& model);

// How experts are named on export.
enum class MoeExportFormat {
  kCheckpoint,  // per-expert keys for mixtral and qwen2/3_moe, fused for gpt_oss
  kFused,       // the in-memory names for every family
};

// The tensors to write for `params` (every parameter of MoeModelParams;
// shapes checked), by HF name in HF order; fp32 CPU contiguous.
// Errors: NOT_FOUND naming a missing parameter; INVALID_ARGUMENT naming a
// parameter of the wrong shape.
absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ExportMoeHfTensors(
    const MoeModelConfig& config, const MoeTensorMap& params, MoeExportFormat format);

// Writes ExportMoeHfTensors' tensors to the safetensors file `path` as
// `dtype` (kF32 or kBF16, rounded to nearest even), metadata format "pt".
// Errors: those of ExportMoeHfTensors and SafetensorsWriter.
absl::Status WriteMoeSafetensors(const std::string& path, const MoeModelConfig& config,
                                 const MoeTensorMap& params, MoeExportFormat format,
                                 SafetensorsDtype dtype);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_HF_MOE_NAMES_H_
