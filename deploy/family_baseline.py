#!/usr/bin/env python3
"""Resident PyTorch (transformers) training throughput for the engine's
non-Llama presets, measured the way shared/bench/torch_baselines.py measures
the Llama ones: the whole model and fused AdamW on the GPU, bf16 autocast
over fp32 master weights, activation checkpointing per layer (the engine
recomputes too), random token ids, the median step after warm-up. Prints one
JSON line with the keys deploy/bench-compare.py reads (mode "resident").

The configs are the engine's presets (engine/model/model_config.cc
kGemma2_2bConfig, kPhi3MiniConfig), so both sides train the same shapes.
Gemma 2 runs transformers' "eager" attention: it is the implementation that
applies attn_logit_softcapping (SDPA has no soft-capping), as transformers
recommends for training Gemma 2; the other families run "sdpa".

  python3 deploy/family_baseline.py --preset gemma2-2b --micro-batch 8 --seq 2048 --clip
"""
import argparse
import json
import time

import torch

PRESETS = {
    "gemma2-2b": dict(model_type="gemma2", vocab_size=256000, hidden_size=2304,
                      intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                      rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                      query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                      final_logit_softcapping=30.0, tie_word_embeddings=True),
    "phi3-mini": dict(model_type="phi3", vocab_size=32064, hidden_size=3072,
                      intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, max_position_embeddings=4096,
                      original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                      rope_theta=10000.0, rope_scaling=None, sliding_window=2047,
                      hidden_act="silu", tie_word_embeddings=False),
    # The MoE presets of engine/model/model_config.cc (kQwen3Moe4bConfig,
    # kMixtral4bConfig): 4.15B and 3.92B parameters, fp32 weights + grads +
    # AdamW moments 16 bytes/param (~66 GB / ~63 GB) fit an H100 80 GB
    # resident only with small activations: run them on an H200 when the
    # H100 runs out of memory. The load-balancing loss is on
    # (output_router_logits) as in the engine presets.
    "qwen3-moe-4b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048,
                         intermediate_size=6144, moe_intermediate_size=1024,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=4,
                         head_dim=128, num_experts=32, num_experts_per_tok=8,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, tie_word_embeddings=False,
                         output_router_logits=True, router_aux_loss_coef=0.001),
    "mixtral-4b": dict(model_type="mixtral", vocab_size=32000, hidden_size=2048,
                       intermediate_size=4608, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                       max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
                       sliding_window=None, tie_word_embeddings=False,
                       output_router_logits=True, router_aux_loss_coef=0.02),
    # The 7B MoE shapes (kQwen3Moe7bConfig, kMixtral7bConfig): 7.4B
    # (1.7B active) and 6.7B (1.9B active) parameters; resident, fp32 weights
    # + grads + AdamW moments are ~118 GB / ~107 GB: an H200 only (139 GiB),
    # and qwen3-moe-7b's [8 x 2048, 151936] logits may still not fit beside
    # them (the script then reports the out-of-memory error as its line).
    "mixtral-7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=2048,
                       intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                       max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
                       sliding_window=None, tie_word_embeddings=False,
                       output_router_logits=True, router_aux_loss_coef=0.02,
                       router_jitter_noise=0.0),
}
# qwen3-moe-7b: qwen3-moe-4b with twice the experts.
PRESETS["qwen3-moe-7b"] = dict(PRESETS["qwen3-moe-4b"], num_experts=64)


def active_params(model, cfg):
    """Parameters one token uses: expert tensors counted k of E (MoE), else all."""
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    n = 0
    for name, p in model.named_parameters():
        if experts and ".experts." in name:
            n += p.numel() * cfg.num_experts_per_tok // experts
        else:
            n += p.numel()
    return n


def build(preset, ckpt):
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = dict(PRESETS[preset])
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    impl = "eager" if cfg.model_type == "gemma2" else "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    if ckpt:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    return cfg, model, impl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=list(PRESETS), required=True)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches per optimizer step (gradient accumulation)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-ckpt", action="store_true", help="no activation checkpointing")
    ap.add_argument("--clip", action="store_true", help="clip_grad_norm_ at 1.0 before opt.step()")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    cfg, model, impl = build(args.preset, not args.no_ckpt)
    n_params = sum(p.numel() for p in model.parameters())
    n_active = active_params(model, cfg)
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, cfg.vocab_size,
                        (args.steps + args.warmup, args.accum, args.micro_batch, args.seq))
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.steps + args.warmup):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for m in range(args.accum):  # gradient accumulation: one optimizer step
            x = ids[i, m].to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            (loss / args.accum).backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t = sorted(times[args.warmup:])[len(times[args.warmup:]) // 2]
    tokens = args.micro_batch * args.seq * args.accum
    print(json.dumps(dict(mode="resident", preset=args.preset, attn_implementation=impl,
                          params_b=round(n_params / 1e9, 3),
                          active_params_b=round(n_active / 1e9, 3), seq=args.seq,
                          micro_batch=args.micro_batch, accum=args.accum,
                          ckpt=not args.no_ckpt, clip=args.clip,
                          step_s_median=round(t, 4), tokens_per_s=round(tokens / t, 1),
                          peak_gpu_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
                          loss=float(loss))), flush=True)


if __name__ == "__main__":
    main()
