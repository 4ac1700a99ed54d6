#!/usr/bin/env bash
# Public model shapes past megatrain-bench's presets, as HF config.json
# files (random weights: `megatrain-bench --model=DIR`). Sourced by the GPU
# scripts; `public_shape_dir NAME` prints the directory of NAME's config
# (written under ${SHAPES_DIR:-/tmp/shapes}), or NAME itself when it is
# not one of these (a preset or a directory).
#   qwen2.5-14b        Qwen2.5-14B's widths as a Llama (14.77 B parameters,
#                      about 236 GB at 16 bytes/param: a 2-GPU host's size)
#   qwen3-32b-24l      Qwen3-32B's widths, 24 of its 64 layers: 13.26 B
#                      parameters, about 212 GB (the whole model, 32.76 B,
#                      needs a 4-GPU host's 503 GiB)
#   qwen3-32b-56l      the same widths, 56 of 64 layers: 28.9 B parameters,
#                      about 463 GB (a 4-GPU host's 503 GiB; the whole 64
#                      layers need 524 GB at 16 bytes/param)
#   mistral-small-24b  23.57 B parameters, about 380 GB: a 4-GPU host's size
#   qwen3-30b-a3b-6l   Qwen3-30B-A3B's widths, 6 of its 48 layers: 4.4 B
#                      parameters, about 70 GB (a one-GPU host's size)
#   qwen3-30b-a3b-12l  Qwen3-30B-A3B's widths (128 experts, top 8), 12 of its
#                      48 layers: 8.1 B parameters, about 130 GB
#   qwen3-30b-a3b-24l  the same, 24 of 48 layers: 15.3 B parameters, about
#                      245 GB
#   qwen3-30b-a3b      all 48 layers: 30.5 B parameters, about 489 GB
write_public_shapes() {
  local dir=${SHAPES_DIR:-/tmp/shapes}
  mkdir -p "$dir/qwen2.5-14b" "$dir/qwen3-32b-24l" "$dir/qwen3-32b-56l" "$dir/mistral-small-24b" "$dir/qwen3-30b-a3b-12l" \
    "$dir/qwen3-30b-a3b-24l"
  local layers
  for layers in 6 12 24 48; do
    local name=qwen3-30b-a3b-${layers}l
    [ "$layers" = 48 ] && name=qwen3-30b-a3b
    mkdir -p "$dir/$name"
    cat > "$dir/$name/config.json" <<JSON
{"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936,
 "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
 "num_hidden_layers": ${layers}, "num_attention_heads": 32, "num_key_value_heads": 4,
 "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
 "mlp_only_layers": [], "norm_topk_prob": true, "output_router_logits": true,
 "router_aux_loss_coef": 0.001, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
 "rope_theta": 1000000.0, "tie_word_embeddings": false, "hidden_act": "silu",
 "bos_token_id": 151643, "eos_token_id": 151645}
JSON
  done
  cat > "$dir/mistral-small-24b/config.json" <<'JSON'
{"model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 131072,
 "hidden_size": 5120, "intermediate_size": 32768, "num_hidden_layers": 40,
 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
 "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 100000000.0,
 "tie_word_embeddings": false, "hidden_act": "silu", "sliding_window": null,
 "bos_token_id": 1, "eos_token_id": 2}
JSON
  for layers in 24 56; do
    cat > "$dir/qwen3-32b-${layers}l/config.json" <<JSON
{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
 "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": ${layers},
 "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
 "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
 "bos_token_id": 151643, "eos_token_id": 151645}
JSON
  done
  cat > "$dir/qwen2.5-14b/config.json" <<'JSON'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 152064,
 "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
 "num_attention_heads": 40, "num_key_value_heads": 8, "max_position_embeddings": 32768,
 "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
 "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151643}
JSON
}

public_shape_dir() {
  local dir=${SHAPES_DIR:-/tmp/shapes}
  if [ -f "$dir/$1/config.json" ]; then echo "$dir/$1"; else echo "$1"; fi
}
