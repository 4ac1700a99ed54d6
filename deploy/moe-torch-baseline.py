#!/usr/bin/env python3
"""transformers' own training throughput on the MoE benchmark shapes (issue 17).

The comparison point for `megatrain-bench --model qwen3-moe-7b|mixtral-7b`:
the same model (the engine presets' config.json fields, engine/model/
model_config.cc), trained resident in GPU memory by transformers with bf16
autocast over fp32 master weights, fused AdamW, activation checkpointing
(gradient_checkpointing_enable) and the router's load-balancing loss on
(output_router_logits, as the presets set it). Random init, synthetic token
ids. Prints one JSON line: tokens/s, model TFLOP/s on active parameters
(6 * N_active * tokens + attention, the engine's TrainFlopsPerToken), peak
GPU memory.

Memory: fp32 weights, gradients and two AdamW moments are 16 bytes per
parameter (7.4B -> ~118 GB), so this needs an H200 (139 GiB), not an H100.

--mode fsdp2-offload trains the same model the way a PyTorch user does when
it does not fit the GPU: FSDP2 fully_shard per decoder layer and at the root
with CPUOffloadPolicy (parameters, gradients and AdamW state in pinned host
memory, torch's AdamW on the CPU), bf16 parameters and fp32 gradient
reduction (MixedPrecisionPolicy), clipping at 1.0. --config DIR takes the
shape from an HF config.json (e.g. deploy/public-shapes.sh's
qwen3-30b-a3b-12l) instead of a preset.

Example (the issue's workload: micro-batch 8 x 2048, accumulation 4):
  python3 deploy/moe-torch-baseline.py --preset qwen3-moe-7b --micro_batch 8 --seq 2048 \
      --accum 4 --steps 6
  python3 deploy/moe-torch-baseline.py --config /tmp/shapes/qwen3-30b-a3b-12l \
      --mode fsdp2-offload --accum 4 --steps 2 --warmup 1
"""
import argparse, json, os, statistics, sys, time
import torch

PRESETS = {
    "qwen3-moe-7b": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=1024,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=64, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=0.001)),
    "mixtral-7b": ("MixtralConfig", "MixtralForCausalLM", dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
        num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
        tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=0.02)),
}


def active_params(model, cfg):
    """Parameters one token uses: every tensor, experts counted k of E."""
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    n = 0
    for name, p in model.named_parameters():
        n += p.numel() * cfg.num_experts_per_tok // experts if ".experts." in name else p.numel()
    return n


def build_model(args, dev):
    """The model of --preset or --config, its config, and how it is placed."""
    import transformers
    if args.config:
        cfg = transformers.AutoConfig.from_pretrained(args.config)
        model_name = cfg.architectures[0]
    else:
        cfg_name, model_name, fields = PRESETS[args.preset]
        cfg = getattr(transformers, cfg_name)(max_position_embeddings=max(args.seq, 8192), **fields)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(cfg)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    if args.mode == "resident":
        model.to(dev)
        return cfg, model, torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_baselines import fsdp2_cpu_offload
    return cfg, model, fsdp2_cpu_offload(model, port="29534")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--config", help="a directory with an HF config.json (instead of --preset)")
    ap.add_argument("--mode", choices=["resident", "fsdp2-offload"], default="resident")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--micro_batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6, help="timed steps after 2 warm-up steps")
    args = ap.parse_args()
    if (args.preset is None) == (args.config is None):
        ap.error("give exactly one of --preset and --config")

    import transformers
    started = time.perf_counter()
    dev = torch.device("cuda")
    cfg, model, opt = build_model(args, dev)
    n_active = active_params(model, cfg)
    n_total = sum(p.numel() for p in model.parameters())
    flops_per_token = (6 * (n_active - cfg.vocab_size * cfg.hidden_size)
                       + 12 * cfg.num_hidden_layers * cfg.hidden_size * args.seq)

    def step():
        for _ in range(args.accum):
            ids = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq), device=dev)
            if args.mode == "resident":
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = model(input_ids=ids, labels=ids)
            else:  # MixedPrecisionPolicy casts the parameters to bf16
                out = model(input_ids=ids, labels=ids)
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    # Progress on stderr as it goes, so that a run stopped by a time limit
    # still bounds the step time.
    print(f"model ready after {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    for i in range(args.warmup):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"warm-up step {i + 1}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        print(f"step {len(times)}: {times[-1]:.1f} s", file=sys.stderr, flush=True)
    step_s = statistics.median(times)
    tokens = args.accum * args.micro_batch * args.seq  # per step
    print(json.dumps({
        "preset": args.preset or args.config, "step_s_median": step_s,
        "mode": ("transformers-resident-ckpt-bf16-autocast" if args.mode == "resident"
                 else "transformers-fsdp2-cpu-offload-ckpt-bf16"),
        "params": n_total, "active_params": n_active,
        "micro_batch": args.micro_batch, "seq_len": args.seq, "accum": args.accum,
        "tokens_per_s": tokens / step_s,
        "model_tflops_per_s": tokens * flops_per_token / step_s / 1e12,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }))


if __name__ == "__main__":
    main()
