// Mixture-of-experts families: the MoE fields of HF `config.json`, parsed
// and validated, and which decoder layers are MoE.
//
// Supported `model_type`s (HF transformers 5 models/<family>/modular_*.py):
//   mixtral    Mistral attention; router Linear(C->E), softmax in fp32 over
//              all experts, top-k, renormalised; SwiGLU experts; optional
//              train-time `router_jitter_noise`.
//   qwen2_moe  Qwen2 attention (q/k/v bias); softmax then top-k,
//              renormalised only if `norm_topk_prob`; a shared SwiGLU expert
//              of `shared_expert_intermediate_size` scaled by
//              sigmoid(Linear(C->1)); layer i is MoE iff i is not in
//              `mlp_only_layers` and (i+1) % `decoder_sparse_step` == 0, else
//              a dense SwiGLU MLP of `intermediate_size`.
//   qwen3_moe  Qwen3 attention (per-head q/k RMSNorm) with qwen2_moe routing,
//              no shared expert.
//   gpt_oss    attention sinks, biased q/k/v/o, `layer_types` alternating
//              sliding-window and full attention, YaRN RoPE; router
//              Linear(C->E) with bias, top-k on the logits, softmax over the
//              k; experts with interleaved gate/up and biases, clamped
//              SwiGLU (`swiglu_limit`, alpha 1.702).
// Anything else is refused with UNIMPLEMENTED naming `model_type`.
//
// The attention, norm and embedding fields are parsed by ParseHfConfig
// (engine/model/model_config.h) on the dense family each MoE family builds on
// (mixtral -> mistral, qwen2_moe -> qwen2, qwen3_moe -> qwen3, gpt_oss ->
// llama with `attention_bias`), so one parser owns those fields.
//
// Thread-safety: plain value types; const methods are safe to call
// concurrently.
#ifndef MEGATRAIN_ENGINE_MOE_CONFIG_H_
#define MEGATRAIN_ENGINE_MOE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"

namespace megatrain::engine {

enum class MoeFamily { kMixtral, kQwen2Moe, kQwen3Moe, kGptOss };

// How router logits become the k routing weights of a token.
enum class RouterType {
  // softmax over all E experts in fp32, top-k of the probabilities, divided
  // by their sum when `norm_topk_prob` (mixtral always, qwen2/3_moe by flag).
  kSoftmaxTopK,
  // top-k of the raw logits, softmax over those k (gpt_oss).
  kTopKSoftmax,
};

// The expert MLP's activation.
enum class ExpertActivation {
  kSwiGlu,         // down(silu(gate) * up)
  kClampedSwiGlu,  // gpt_oss: gate <= limit, |up| <= limit,
                   // down((up + 1) * gate * sigmoid(alpha * gate)) (+ biases)
};

// Memory layout of the fused expert weights (transformers 5's in-memory
// parameters, which the engine keeps as its own; Fe moe intermediate size).
enum class ExpertLayout {
  // gate_up_proj [E, 2*Fe, C]: rows [0, Fe) gate, [Fe, 2*Fe) up (nn.Linear
  // [out, in] per expert); down_proj [E, C, Fe]. mixtral, qwen2/3_moe.
  kGateUpRows,
  // gate_up_proj [E, C, 2*Fe]: columns interleaved (even gate, odd up),
  // x @ W form; down_proj [E, Fe, C]; biases [E, 2*Fe] and [E, C]. gpt_oss.
  kInterleavedColumns,
};

// YaRN RoPE (`rope_parameters.rope_type` "yarn"; HF modeling_rope_utils.py
// _compute_yarn_parameters).
struct YarnRope {
  bool enabled = false;
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: max_position_embeddings
  bool truncate = true;
  double attention_factor = 0.0;  // 0: derived from factor (get_mscale)
  double mscale = 0.0;            // 0: unset
  double mscale_all_dim = 0.0;    // 0: unset
};

// MoE hyper-parameters with HF config.json names.
struct MoeConfig {
  std::string model_type;  // mixtral | qwen2_moe | qwen3_moe | gpt_oss
  MoeFamily family = MoeFamily::kMixtral;
  RouterType router_type = RouterType::kSoftmaxTopK;
  ExpertActivation activation = ExpertActivation::kSwiGlu;
  ExpertLayout expert_layout = ExpertLayout::kGateUpRows;
  int64_t num_experts = 0;                      // E: `num_local_experts` or `num_experts`
  int64_t num_experts_per_tok = 0;              // k, in [1, E]
  int64_t moe_intermediate_size = 0;            // Fe per expert (mixtral, gpt_oss:
                                                // `intermediate_size`)
  bool norm_topk_prob = true;                   // renormalise the k softmax weights
  bool router_bias = false;                     // gpt_oss router Linear has a bias
  int64_t shared_expert_intermediate_size = 0;  // Fs; 0 = no shared expert
  int64_t decoder_sparse_step = 1;              // qwen2/3_moe
  std::vector<int64_t> mlp_only_layers;         // qwen2/3_moe: dense layers
  bool output_router_logits = false;            // the family's config enables the aux loss
  double router_aux_loss_coef = 0.001;
  double router_jitter_noise = 0.0;  // mixtral, train time only
  double swiglu_limit = 7.0;         // gpt_oss
  double swiglu_alpha = 1.702;       // gpt_oss (hard-coded in HF GptOssExperts)
  bool attention_sinks = false;      // gpt_oss: a learnable logit per head
  // Per layer: 0 = full causal attention, else the sliding window (keys k
  // with 0 <= q - k < window). From `layer_types` when present, else every
  // layer takes the dense config's `sliding_window`.
  std::vector<int64_t> layer_sliding_window;
  YarnRope yarn;
  // The config.json object this was parsed from (ParseMoeHfConfig), written
  // back by MoeHfConfigJson so that an export or checkpoint keeps every
  // field transformers reads; empty for a config built in code.
  std::string hf_config_json;

  // True when decoder layer `layer_idx` has a sparse MoE MLP (false: dense
  // SwiGLU of the model's `intermediate_size`). qwen2/3_moe rule
  // (Qwen2MoeDecoderLayer): not in mlp_only_layers and
  // (layer_idx + 1) % decoder_sparse_step == 0; other families: every layer.
  bool IsMoeLayer(int64_t layer_idx) const;

  // Checks every field against `num_hidden_layers`. INVALID_ARGUMENT naming
  // the field and value (e.g. "num_experts_per_tok: must be in [1, 4], got 5").
  absl::Status Validate(int64_t num_hidden_layers) const;
};

// A MoE model: the dense fields (attention, norms, embedding, RoPE other than
// YaRN) and the MoE ones.
struct MoeModelConfig {
  // Parsed as the dense family underneath (see the file comment):
  // base.model_type is "mistral", "qwen2", "qwen3" or "llama".
  ModelConfig base;
  MoeConfig moe;
};

// The config as HF `config.json` text that transformers' AutoConfig loads:
// the parsed config.json (moe.hf_config_json) with `dtype` (or
// `torch_dtype`, whichever it had) set to base.torch_dtype and
// output_router_logits / router_aux_loss_coef set from `moe` (a job option
// may change them); for a config built in code, base.ToHfConfigJson() with
// the family's model_type, architecture and MoE fields.
std::string MoeHfConfigJson(const MoeModelConfig& config);

// True for the model_types this file parses.
bool IsMoeModelType(absl::string_view model_type);

// Parses HF `config.json` text of a MoE family. `source` names the file in
// errors. Errors: INVALID_ARGUMENT for malformed JSON or a bad value (the
// message names the field); UNIMPLEMENTED naming `model_type` for any other
// family (deepseek_v3, phimoe, jamba, ...), or naming the field for an
// unsupported router or activation (`hidden_act`, `rope_parameters.rope_type`).
absl::StatusOr<MoeModelConfig> ParseMoeHfConfig(absl::string_view json_text,
                                                absl::string_view source = "config.json");

// Reads and parses `path`. NOT_FOUND if it is missing.
absl::StatusOr<MoeModelConfig> LoadMoeHfConfigFile(const std::string& path);

}  // namespace megatrain::engine

#endif  // MEGATRAIN_ENGINE_MOE_CONFIG_H_
