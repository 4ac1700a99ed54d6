#!/usr/bin/env bash
# Checks the engine against Hugging Face transformers on the GPU machine
# (where transformers is installed), both directions:
#   import: small random models of each supported architecture, written by
#           transformers' save_pretrained, scored by megatrain-logits and by
#           transformers on the same held-out tokens;
#   reload: each imported model exported again by the engine
#           (megatrain-logits --export, fp32), reloaded by transformers with
#           no missing or unexpected keys and compared likewise; its
#           config.json has every key of the source's, and its tokenizer
#           (copied from the source, with a chat template) loads with
#           AutoTokenizer and encodes and renders as the source's;
#   export: an HF directory written by `megatrain export` (EXPORT_DIR, e.g.
#           the demo's), loaded by AutoModelForCausalLM and compared likewise.
# Families: llama, mistral, qwen2, qwen3, gemma2 (soft-capping, sliding
# layers), gemma3_text (local/global RoPE), phi3 (fused tensors, partial
# rotary, LongRoPE past original_max_position_embeddings), and the
# mixtures of experts mixtral, qwen2_moe (shared expert, a dense layer),
# qwen3_moe and gpt_oss (sinks, sliding/full layers, clamped experts): their
# exports are reloaded with transformers' per-expert / fused names.
# Needs the build of deploy/gpu-check.sh (build-gpu/). Prints one JSON line
# per check; exits non-zero if any check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
WORK=${WORK:-$(mktemp -d /tmp/megatrain-hfcheck.XXXXXX)}
mkdir -p "$OUT" "$WORK"
export LD_LIBRARY_PATH=${MEGATRAIN_PREFIX:-/opt/megatrain-deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
logits=build-gpu/engine/megatrain-logits
tokens=examples/jobs/data/tiny-eval/train-00000.mtt
status=0

python3 - "$WORK" <<'PY'
import sys, torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Gemma2Config, Gemma2ForCausalLM, Gemma3TextConfig, Gemma3ForCausalLM,
                          Phi3Config, Phi3ForCausalLM, MixtralConfig, MixtralForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, GptOssConfig, GptOssForCausalLM)
out = sys.argv[1]
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {f"w{i}": i for i in range(509)} | {"<unk>": 509, "<s>": 510, "</s>": 511}
word_level = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
word_level.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>",
                                    bos_token="<s>", eos_token="</s>")
tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
                           "{{ eos_token }}{% endfor %}")
common = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
torch.manual_seed(0)
models = {
  "llama": (LlamaConfig, LlamaForCausalLM, dict(rope_theta=500000.0, tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
  "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=32, tie_word_embeddings=False)),
  "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False)),
  "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=48, tie_word_embeddings=True)),
  "gemma2": (Gemma2Config, Gemma2ForCausalLM, dict(head_dim=32, query_pre_attn_scalar=32,
             sliding_window=32, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
             hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=0)),
  "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM, dict(head_dim=32, query_pre_attn_scalar=32,
                  sliding_window=32, rope_local_base_freq=10000.0, rope_theta=1000000.0,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                  tie_word_embeddings=True, pad_token_id=0)),
  # seq_len 96 > original_max_position_embeddings 64: the long factors.
  "phi3": (Phi3Config, Phi3ForCausalLM, dict(partial_rotary_factor=0.75,
           original_max_position_embeddings=64, sliding_window=48, pad_token_id=0,
           rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(12)],
                         "long_factor": [1.5 + 0.25 * i for i in range(12)]},
           tie_word_embeddings=False)),
  # Mixtures of experts (issue 17): 4 experts, top-2. Mixtral's train-time
  # router_jitter_noise is on: logits are an evaluation on both sides
  # (transformers' model.eval(), the engine's Logits pass), so neither may
  # jitter; the export must carry the field through.
  "mixtral": (MixtralConfig, MixtralForCausalLM, dict(num_local_experts=4, num_experts_per_tok=2,
              sliding_window=None, tie_word_embeddings=False, router_jitter_noise=0.1)),
  "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, dict(num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=128, shared_expert_intermediate_size=256,
                decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=False,
                tie_word_embeddings=False)),
  "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(head_dim=32, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=128, norm_topk_prob=True,
                tie_word_embeddings=False)),
  "gpt_oss": (GptOssConfig, GptOssForCausalLM, dict(head_dim=32, num_local_experts=4,
              num_experts_per_tok=2, sliding_window=32,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              tie_word_embeddings=False)),
}
for name, (cfg_cls, model_cls, extra) in models.items():
    cfg = cfg_cls(**common, **extra)
    model = model_cls(cfg)
    with torch.no_grad():  # larger than default init, so layers matter
        for p in model.parameters():
            if p.dim() == 1 and p.numel() == cfg.hidden_size: p.add_(0.1 * torch.randn_like(p))
            elif p.dim() == 1: p.normal_(0, 0.1)
    model.save_pretrained(f"{out}/hf-{name}", safe_serialization=True)
    # A tokenizer with a chat template beside it, as a released model has:
    # the reload check wants it in the export (Note [Export copies]).
    tokenizer.save_pretrained(f"{out}/hf-{name}")
PY
for name in ${ARCHS:-llama mistral qwen2 qwen3 gemma2 gemma3_text phi3 mixtral qwen2_moe qwen3_moe gpt_oss}; do
  for dtype in fp32 bf16; do
    tol=1e-4; [ "$dtype" = bf16 ] && tol=2e-2
    export_args=(); [ "$dtype" = fp32 ] && export_args=(--export "$WORK/export-$name")
    "$logits" --model "$WORK/hf-$name" --tokens "$tokens" --seq_len 96 --device cuda \
      --compute_dtype "$dtype" --out "$WORK/engine-$name-$dtype" "${export_args[@]}" >/dev/null || status=1
    python3 deploy/check-hf-export.py --model "$WORK/hf-$name" --engine "$WORK/engine-$name-$dtype" \
      --dtype "$dtype" --tolerance "$tol" | sed "s/^/{\"check\": \"import-$name-$dtype\", \"r\": /; s/$/}/" || status=1
  done
  # The engine's fp32 export of the same model, reloaded by transformers,
  # with the source's config keys and tokenizer (model and tokenizer load).
  python3 deploy/check-hf-export.py --model "$WORK/export-$name" --engine "$WORK/engine-$name-fp32" \
    --source "$WORK/hf-$name" --dtype fp32 --tolerance 1e-4 | sed "s/^/{\"check\": \"reload-$name-fp32\", \"r\": /; s/$/}/" || status=1
done
if [ -n "${EXPORT_DIR:-}" ]; then
  "$logits" --model "$EXPORT_DIR" --tokens "$tokens" --seq_len 96 --device cuda --compute_dtype bf16 \
    --out "$WORK/engine-export" >/dev/null || status=1
  python3 deploy/check-hf-export.py --model "$EXPORT_DIR" --engine "$WORK/engine-export" --dtype bf16 \
    | sed 's/^/{"check": "export-bf16", "r": /; s/$/}/' || status=1
fi
exit $status
