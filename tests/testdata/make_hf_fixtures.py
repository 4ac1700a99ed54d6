#!/usr/bin/env python3
"""Writes the golden files the CPU tests compare against: tiny models of each
model family written by transformers' save_pretrained with their logits, loss
and every parameter gradient computed by transformers itself, and HF
`tokenizers` files with their encodings of real and hard text and chat
templates rendered by transformers' apply_chat_template.

Runs where transformers and tokenizers are installed (the GPU machines have
them; CI does not). The outputs are committed under tests/testdata/hf/ and
tests/testdata/tokenizers/; CI only reads them.

    python3 tests/testdata/make_hf_fixtures.py --out tests/testdata

Everything runs on the CPU in fp32 with fixed seeds and eager attention, so
the numbers are transformers' reference arithmetic, not a GPU kernel's.
"""
import argparse
import json
import os
import sys

import torch


def versions():
    import transformers
    import tokenizers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__}


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

# Dimensions kept tiny (files of a few hundred KB) but with every feature
# exercised: GQA (4 heads, 2 kv heads), sliding windows shorter than the
# sequence, several layers so that alternating layer types both appear.
COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-6)
MOE = dict(num_local_experts=4, num_experts_per_tok=2)
SEQ_LEN = 24
BATCH = 2


def family_specs():
    import transformers as tf
    s = {}
    s["llama"] = (tf.LlamaConfig, tf.LlamaForCausalLM, dict(head_dim=8, tie_word_embeddings=False))
    s["gemma2"] = (tf.Gemma2Config, tf.Gemma2ForCausalLM, dict(
        head_dim=16, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True))
    s["gemma3_text"] = (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, dict(
        head_dim=16, query_pre_attn_scalar=16, sliding_window=8, rope_local_base_freq=10000.0,
        rope_theta=1000000.0, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True))
    s["phi3"] = (tf.Phi3Config, tf.Phi3ForCausalLM, dict(
        partial_rotary_factor=0.5, head_dim=8, sliding_window=None, tie_word_embeddings=False,
        pad_token_id=0))
    s["phi3_longrope"] = (tf.Phi3Config, tf.Phi3ForCausalLM, dict(
        partial_rotary_factor=1.0, max_position_embeddings=64, original_max_position_embeddings=16,
        rope_scaling={"type": "longrope",
                      "short_factor": [1.0 + 0.1 * i for i in range(4)],
                      "long_factor": [1.5 + 0.5 * i for i in range(4)]},
        tie_word_embeddings=False, pad_token_id=0))
    s["mixtral"] = (tf.MixtralConfig, tf.MixtralForCausalLM, dict(
        **MOE, sliding_window=None, output_router_logits=True, router_aux_loss_coef=0.02,
        tie_word_embeddings=False))
    s["qwen2_moe"] = (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM, dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, decoder_sparse_step=1, mlp_only_layers=[1],
        norm_topk_prob=False, output_router_logits=True, router_aux_loss_coef=0.02,
        tie_word_embeddings=False))
    s["qwen3_moe"] = (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, dict(
        head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        output_router_logits=True, router_aux_loss_coef=0.02, tie_word_embeddings=False))
    s["gpt_oss"] = (tf.GptOssConfig, tf.GptOssForCausalLM, dict(
        head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        output_router_logits=True, router_aux_loss_coef=0.02, tie_word_embeddings=False))
    return s


def perturb(model, cfg):
    """Moves parameters away from their init so that every term matters:
    norm weights off 1 (or off 0 for Gemma's zero-centred ones), biases and
    sinks non-zero."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1]) ** 0.5)


def make_model(name, cfg_cls, model_cls, extra, out_dir):
    params = dict(COMMON)
    params.update(extra)
    cfg = cfg_cls(**params)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_cls(cfg).float()
    perturb(model, cfg)
    model.train()  # dropout is 0 in every family's default config
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    g = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ_LEN), generator=g)
    labels = input_ids.clone()
    labels[0, :3] = -100  # ignored positions are part of the contract
    kwargs = {}
    if getattr(cfg, "output_router_logits", False):
        kwargs["output_router_logits"] = True
    out = model(input_ids=input_ids, labels=labels, **kwargs)
    out.loss.backward()
    ref = {"input_ids": input_ids, "labels": labels,
           "logits": out.logits.detach().float().contiguous(),
           "loss": out.loss.detach().reshape(1).float()}
    aux = getattr(out, "aux_loss", None)
    if aux is not None:
        ref["aux_loss"] = aux.detach().reshape(1).float()
    for pname, p in model.named_parameters():
        if p.grad is not None:
            ref["grad." + pname] = p.grad.detach().float().contiguous()
    from safetensors.torch import save_file
    save_file(ref, os.path.join(d, "reference.safetensors"))
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"family": name, "batch": BATCH, "seq_len": SEQ_LEN,
                   "loss": float(out.loss), "aux_loss": None if aux is None else float(aux),
                   "router_aux_loss_coef": getattr(cfg, "router_aux_loss_coef", None),
                   "note": "loss includes router_aux_loss_coef * aux_loss where aux_loss is present",
                   "versions": versions()}, f, indent=1)
    print(f"model {name}: loss {float(out.loss):.6f}", flush=True)


# ---------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------

# The pre-tokenizer regexes of the families (from their released tokenizer.json).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

HARD_CASES = [
    "", " ", "  ", "\n", "\n\n\n", "\t\tindented", "trailing spaces   ", "   leading",
    "Hello world", "Hello  world", "hello\nworld\r\nwindows", "don't I'll we've they're she'd IT'S",
    "1234567890 3.14159 1,000,000 0x1F", "café naïve résumé Ångström façade", "e\u0301 (decomposed)",
    "日本語のテキストです。中文文本。한국어", "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "tabs\tand\ttabs", "<|begin_of_text|>special inside<|eot_id|> text", "<s>[INST] hi [/INST]</s>",
    "mixed CASE CamelCaseWord snake_case_word kebab-case", "URL https://example.org/a?b=c&d=e#f",
    "code: def f(x):\n    return x ** 2  # square\n", "ÀÉÎÕÜ àéîõü ß ẞ", "Ελληνικά Русский עברית العربية",
    "a" * 300, "\u00a0non-breaking\u2009thin\u3000ideographic", "zero\u200bwidth",
    "\x00\x01 control \x7f", "  \n  \n", "!!!???...,,,;;;", "I'M SHOUTING DON'T",
]


def corpus_texts(repo):
    texts = []
    d = os.path.join(repo, "examples", "data", "corpus")
    for fn in sorted(os.listdir(d)):
        with open(os.path.join(d, fn), encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def train_bpe(texts, split_regex, normalizer_nfc, vocab_size, specials):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, normalizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=False))
    if normalizer_nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def train_spm_bpe(texts, vocab_size, metaspace):
    """A Llama-2 / Mistral-style SentencePiece BPE as transformers converts it:
    byte fallback with <0x00>..<0xFF> in the vocab after <unk>, <s>, </s>.
    metaspace=True: Metaspace pre-tokenizer (prepend_scheme "first"), the
    non-legacy conversion; False: the legacy normalizer (Prepend + Replace)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, normalizers, trainers, processors
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[], show_progress=False)
    base.train_from_iterator(texts, trainer=trainer)
    learned = json.loads(base.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = learned["merges"]
    model = models.BPE(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                            for m in merges],
                       unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(model)
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken("<unk>", special=True), AddedToken("<s>", special=True),
                            AddedToken("</s>", special=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}{{- bos_token + '[INST] ' + (system if loop.first else '') + message['content'] | trim + ' [/INST]' }}"
    "{%- else %}{% generation %}{{- ' ' + message['content'] | trim + ' ' + eos_token }}{% endgeneration %}{%- endif %}"
    "{%- endfor %}")

CONVERSATIONS = [
    [{"role": "user", "content": "What is the GPL?"},
     {"role": "assistant", "content": "A copyleft free software licence."}],
    [{"role": "system", "content": "You answer in one sentence."},
     {"role": "user", "content": "Can I sell copies?"},
     {"role": "assistant", "content": "Yes, you may charge any price you wish."},
     {"role": "user", "content": "And the source?"},
     {"role": "assistant", "content": "  You must offer it too, under the same terms.  "}],
    [{"role": "user", "content": "Ünïcödé 😀 and\nnew lines"},
     {"role": "assistant", "content": "日本語で答えます。"}],
]


def write_tokenizer(tok, out_dir, name, config, texts):
    from transformers import PreTrainedTokenizerFast
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1, ensure_ascii=False)
    hf = PreTrainedTokenizerFast.from_pretrained(d)
    cases = []
    for t in HARD_CASES + [tx[:4000] for tx in texts[:2]] + [texts[2][5000:7000]]:
        enc = tok.encode(t, add_special_tokens=False)
        cases.append({"text": t, "ids": enc.ids,
                      "ids_with_special": tok.encode(t, add_special_tokens=True).ids,
                      "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    chats = []
    if config.get("chat_template"):
        for conv in CONVERSATIONS:
            try:
                rendered = hf.apply_chat_template(conv, tokenize=False)
                enc = hf.apply_chat_template(conv, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
                chats.append({"messages": conv, "rendered": rendered, "ids": list(enc["input_ids"]),
                              "assistant_masks": list(enc["assistant_masks"])})
            except Exception as e:  # recorded: the C++ side must refuse the same input
                chats.append({"messages": conv, "error": str(e)})
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"cases": cases, "chats": chats, "versions": versions()}, f, indent=1,
                  ensure_ascii=False)
    print(f"tokenizer {name}: vocab {tok.get_vocab_size()}, {len(cases)} cases, {len(chats)} chats",
          flush=True)


def make_tokenizers(repo, out_dir):
    texts = corpus_texts(repo)
    l3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
    tok = train_bpe(texts, LLAMA3_SPLIT, False, 2000, l3_specials)
    from tokenizers import processors
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    write_tokenizer(tok, out_dir, "llama3-bpe", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE,
        "model_max_length": 131072}, texts)
    q_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = train_bpe(texts, QWEN2_SPLIT, True, 2000, q_specials)
    write_tokenizer(tok, out_dir, "qwen2-bpe", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": CHATML_TEMPLATE,
        "model_max_length": 32768}, texts)
    o_specials = ["<|startoftext|>", "<|endoftext|>", "<|return|>"]
    tok = train_bpe(texts, O200K_SPLIT, False, 2000, o_specials)
    write_tokenizer(tok, out_dir, "o200k-bpe", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>", "model_max_length": 131072}, texts)
    for name, metaspace in (("llama2-spm-legacy", False), ("mistral-spm-metaspace", True)):
        tok = train_spm_bpe(texts, 1500, metaspace)
        write_tokenizer(tok, out_dir, name, {
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": True, "chat_template": LLAMA2_TEMPLATE,
            "model_max_length": 4096}, texts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=["models", "tokenizers"], default=None)
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    torch.use_deterministic_algorithms(True)
    print(json.dumps(versions()), flush=True)
    failed = []
    if args.only in (None, "models"):
        for name, (c, m, extra) in family_specs().items():
            try:
                make_model(name, c, m, extra, os.path.join(args.out, "hf"))
            except Exception as e:
                failed.append(name)
                print(f"model {name}: FAILED {type(e).__name__}: {e}", flush=True)
    if args.only in (None, "tokenizers"):
        try:
            make_tokenizers(repo, os.path.join(args.out, "tokenizers"))
        except Exception as e:
            failed.append("tokenizers")
            import traceback
            traceback.print_exc()
    if failed:
        print("FAILED:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
