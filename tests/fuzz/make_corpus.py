#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets in tests/fuzz/corpus/.

    python3 tests/fuzz/make_corpus.py [out_dir]   # default: tests/fuzz/corpus

Files named valid_* must parse; invalid_* must be refused. The C++ tests
(tests/engine/formats/safetensors_test.cc, token_shard_test.cc) check exactly that,
so this script doubles as an independent implementation of both formats
(safetensors per the huggingface/safetensors README; token shards per
docs/data-format.md), with its own XXH64
(tests/testing/xxh64.py, pure Python).

The job spec seeds: job_yaml_fuzz gets the shipped examples/jobs/*.yaml
(example_*, valid) and variants; jobspec_proto_fuzz gets megatrain.v1.JobSpec
messages in protobuf wire format, written by the small encoder below from
proto/megatrain/v1/job.proto's field numbers. For those, valid_* means the
daemon's conversion accepts the spec (tests/client/job_file_test.cc and
spec_convert_test.cc check the names). Standard library only; deterministic
output (fixed contents, no randomness).
"""

import json
import os
import struct
import sys

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
from xxh64 import xxh64  # noqa: E402  (tests/testing/xxh64.py, from the spec)

# --- safetensors ------------------------------------------------------------

_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes) in data order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    data = b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return raw_safetensors(text, data)


def raw_safetensors(header_text, data):
    return struct.pack("<Q", len(header_text)) + header_text + data


def safetensors_corpus():
    f32 = struct.pack("<6f", 0.5, -1.0, 2.0, 3.25, -0.0, 1e-3)
    bf16 = struct.pack("<3H", 0x3F80, 0xC040, 0x7F80)
    f16 = struct.pack("<2H", 0x3C00, 0x7BFF)
    files = {}
    files["valid_empty.safetensors"] = safetensors([], {"format": "pt"})
    files["valid_mixed.safetensors"] = safetensors(
        [("model.embed_tokens.weight", "F32", [2, 3], f32),
         ("model.norm.weight", "BF16", [3], bf16),
         ("lm_head.weight", "F16", [2], f16),
         ("empty", "F32", [0, 5], b"")],
        {"format": "pt"})
    files["valid_all_dtypes.safetensors"] = safetensors(
        [("t_%s" % d.lower(), d, [2], bytes(2 * s))
         for d, s in sorted(_DTYPE_BYTES.items(), key=lambda kv: -kv[1])])
    # Scalar, no metadata, no padding, entries not in offset order.
    files["valid_unpadded.safetensors"] = raw_safetensors(
        b'{"b":{"dtype":"I32","shape":[],"data_offsets":[4,8]},'
        b'"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        bytes(range(8)))

    good = files["valid_mixed.safetensors"]
    files["invalid_truncated.safetensors"] = good[:-5]
    files["invalid_short.safetensors"] = b"\x10\x00\x00"
    files["invalid_header_past_eof.safetensors"] = struct.pack("<Q", 4096) + b"{}"
    files["invalid_bad_json.safetensors"] = raw_safetensors(
        b'{"w":{"dtype":"F32","shape":[1],', b"")
    files["invalid_unknown_dtype.safetensors"] = raw_safetensors(
        b'{"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}', bytes(4))
    files["invalid_overlap.safetensors"] = raw_safetensors(
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12))
    files["invalid_hole.safetensors"] = raw_safetensors(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', bytes(12))
    files["invalid_shape_mismatch.safetensors"] = raw_safetensors(
        b'{"lm_head.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}',
        bytes(8))
    files["invalid_offsets_out_of_range.safetensors"] = raw_safetensors(
        b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', bytes(8))
    files["invalid_duplicate_name.safetensors"] = raw_safetensors(
        b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2))
    files["invalid_shape_overflow.safetensors"] = raw_safetensors(
        b'{"w":{"dtype":"F64","shape":[4294967296,4294967296],'
        b'"data_offsets":[0,0]}}', b"")
    return files

# --- token shards (docs/data-format.md) -------------------------------------

MAGIC = b"MTTOKSH1"


def token_shard(docs, vocab_size, checksum=True, version=1, dtype=None):
    if dtype is None:
        dtype = 2 if 1 <= vocab_size <= 65536 else 4
    offsets = [0]
    for doc in docs:
        offsets.append(offsets[-1] + len(doc))
    body = struct.pack("<%dQ" % len(offsets), *offsets)
    tokens = [t for doc in docs for t in doc]
    body += struct.pack("<%d%s" % (len(tokens), "H" if dtype == 2 else "I"),
                        *tokens)
    body_xxh64 = xxh64(body) if checksum else 0
    header = MAGIC + struct.pack("<IIQQQQII", version, dtype, vocab_size,
                                 len(tokens), len(docs), body_xxh64,
                                 1 if checksum else 0, 0)
    return header + struct.pack("<Q", xxh64(header)) + body


def fix_checksums(b):
    """Recomputes both checksums of an edited shard."""
    b = bytearray(b)
    struct.pack_into("<Q", b, 40, xxh64(bytes(b[64:])))
    struct.pack_into("<Q", b, 56, xxh64(bytes(b[:56])))
    return bytes(b)


def token_shard_corpus():
    docs = [[1, 2, 3], [], [999, 0, 7, 42]]
    files = {}
    good = token_shard(docs, 1000)
    files["valid_uint16.tok"] = good
    files["valid_uint32_unknown_vocab.tok"] = token_shard(
        [[0, 2147483647], [5]], 0)
    files["valid_uint32_llama3.tok"] = token_shard(
        [[128000, 9906, 1917, 128001]], 128256)
    files["valid_no_checksum.tok"] = token_shard(docs, 1000, checksum=False)
    files["valid_empty.tok"] = token_shard([], 50257)

    files["invalid_magic.tok"] = b"XTTOKSH1" + good[8:]
    files["invalid_short.tok"] = good[:40]
    files["invalid_truncated_body.tok"] = good[:-2]
    files["invalid_trailing_bytes.tok"] = good + b"\0"
    bad_header = bytearray(good)
    struct.pack_into("<Q", bad_header, 24, 6)  # num_tokens, stale checksum
    files["invalid_header_checksum.tok"] = bytes(bad_header)
    not_monotone = bytearray(good)
    struct.pack_into("<Q", not_monotone, 80, 2)
    files["invalid_not_monotone.tok"] = fix_checksums(not_monotone)
    flipped = bytearray(good)
    flipped[96] ^= 1
    files["invalid_body_checksum.tok"] = bytes(flipped)
    files["invalid_token_above_vocab.tok"] = token_shard(
        [[1, 1000]], 1000)  # id 1000 with vocab_size 1000
    files["invalid_dtype.tok"] = token_shard(docs, 1000, dtype=3)
    files["invalid_version.tok"] = token_shard(docs, 1000, version=2)
    return files


# --- job files (client/job_file.cc, docs/job-spec.md) ------------------------

# Every key of a job file, with a value of the right type.
FULL_JOB = [
    ("name", "full"),
    ("model", [("preset", "tiny")]),
    ("data", [("tokens", "data/tiny"), ("eval_tokens", "data/tiny-eval"),
              ("eval_fraction", 0.0), ("shuffle_seed", 99)]),
    ("train", [("micro_batch", 4), ("seq_len", 64),
               ("gradient_accumulation_steps", 2), ("global_batch", 8),
               ("max_steps", 10), ("max_tokens", 0), ("compute_dtype", "bf16"),
               ("max_grad_norm", 0.5), ("seed", 7), ("offload_activations", True)]),
    ("optimizer", [("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8),
                   ("weight_decay", 0.1), ("warmup_steps", 2),
                   ("schedule", "linear"), ("min_lr_ratio", 0.1)]),
    ("eval", [("every_steps", 5), ("batches", 2)]),
    ("checkpoint", [("every_steps", 5), ("keep_last", 3), ("keep_every", 10)]),
    ("output_dir", "/srv/out/full"),
    ("priority", -5),
    ("labels", [("team", "nlp"), ("run/kind", "ablation-3")]),
]


def yaml_scalar(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def yaml_text(items, indent=0):
    """Block-style YAML of a list of (key, value); value a list nests."""
    lines = []
    for key, value in items:
        if isinstance(value, list):
            lines.append("%s%s:" % (" " * indent, key))
            lines.append(yaml_text(value, indent + 2).rstrip("\n"))
        else:
            lines.append("%s%s: %s" % (" " * indent, key, yaml_scalar(value)))
    return "\n".join(lines) + "\n"


def job_yaml_corpus(repo):
    files = {}
    examples = os.path.join(repo, "examples", "jobs")
    for name in sorted(os.listdir(examples)):
        if name.endswith(".yaml"):
            with open(os.path.join(examples, name), "rb") as f:
                files["valid_example_" + name] = f.read()
    files["valid_full.yaml"] = yaml_text(FULL_JOB)
    files["valid_hf_text.yaml"] = (
        "name: hf\nmodel: {hf_dir: ../models/llama}\n"
        "data: {text: /corpus/books.jsonl, tokenizer: spm.model, eval_fraction: 0.05}\n"
        "train: {micro_batch: 2, seq_len: 2048, global_batch: 64, max_tokens: 1000000,"
        " compute_dtype: tf32}\n")
    files["valid_flow_style.yaml"] = (
        "{name: flow, model: {preset: tiny}, data: {tokens: t}, "
        "train: {max_steps: 1}, labels: {a: b}}\n")
    files["valid_anchors.yaml"] = (
        "# comment\n---\nname: &n 'anchored'\nmodel:\n  preset: tiny\n"
        "data:\n  tokens: \"data/tiny\"\ntrain:\n  max_steps: &steps 20\n"
        "eval:\n  every_steps: *steps\ncheckpoint:\n  every_steps: *steps\n"
        "labels:\n  name: *n\n...\n")
    files["valid_numbers.yaml"] = (
        "model: {preset: tiny}\ndata: {tokens: /t}\n"
        "train: {max_steps: 0x10, seed: 18, max_grad_norm: .inf}\n"
        "optimizer: {lr: .nan, eps: 1e-300, weight_decay: -0.0}\n"
        "priority: -2147483648\n")
    files["valid_block_scalars.yaml"] = (
        "name: |\n  two\n  lines\nmodel:\n  preset: >-\n    tiny\n"
        "data:\n  tokens: /a/../b/./c\n")
    files["valid_empty_sections.yaml"] = "name: x\nlabels: {}\nmodel: {}\n"
    files["valid_unicode.yaml"] = (
        "name: \"caf\u00e9 \\u2713\"\nmodel: {preset: tiny}\n"
        "labels: {team: \"\U0001F600 \\U0010FFFF\"}\n")

    files["invalid_empty.yaml"] = ""
    files["invalid_top_level_list.yaml"] = "- name: x\n- model: y\n"
    files["invalid_bad_syntax.yaml"] = "name: [unclosed\nmodel: {preset: tiny\n"
    files["invalid_unknown_key.yaml"] = "name: x\nmodle: {preset: tiny}\n"
    files["invalid_unknown_nested_key.yaml"] = "train:\n  micro_btch: 8\n"
    files["invalid_not_an_integer.yaml"] = "train:\n  micro_batch: eight\n"
    files["invalid_integer_overflow.yaml"] = "train:\n  max_tokens: 99999999999999999999\n"
    files["invalid_not_a_number.yaml"] = "optimizer: {lr: fast}\n"
    files["invalid_not_a_bool.yaml"] = "train: {offload_activations: maybe}\n"
    files["invalid_compute_dtype.yaml"] = "train: {compute_dtype: fp16}\n"
    files["invalid_preset_and_hf_dir.yaml"] = "model: {preset: tiny, hf_dir: /m}\n"
    files["invalid_negative_seed.yaml"] = "train: {seed: -1}\ndata: {shuffle_seed: 3}\n"
    files["invalid_priority_range.yaml"] = "priority: 2147483648\n"
    files["invalid_missing_value.yaml"] = "optimizer:\n  lr:\n"
    files["invalid_section_is_scalar.yaml"] = "train: 8\n"
    files["invalid_value_is_list.yaml"] = "data:\n  tokens: [a, b]\n"
    files["invalid_labels_not_map.yaml"] = "labels: [a, b]\n"
    files["invalid_label_value_map.yaml"] = "labels: {a: {b: c}}\n"
    files["invalid_key_is_list.yaml"] = "[name]: x\n"
    files["invalid_unknown_alias.yaml"] = "name: *nowhere\n"
    files["invalid_tab_indent.yaml"] = "model:\n\tpreset: tiny\n"
    # Not UTF-8: proto3 strings must be (found by job_yaml_fuzz).
    files["invalid_not_utf8_name.yaml"] = b"name: caf\xe9\nmodel: {preset: tiny}\n"
    files["invalid_not_utf8_label_key.yaml"] = b"labels: {\xff: a}\n"
    files["invalid_surrogate_bytes.yaml"] = b'data: {tokens: "/t\xed\xa0\x80"}\n'
    return {name: (text.encode() if isinstance(text, str) else text)
            for name, text in files.items()}


# --- megatrain.v1.JobSpec in protobuf wire format -----------------------------

def _varint(n):
    n &= (1 << 64) - 1  # negative int64/int32: ten-byte two's complement
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _key(number, wire_type):
    return _varint(number << 3 | wire_type)


def _len_field(number, payload):
    return _key(number, 2) + _varint(len(payload)) + payload


# Field numbers and types of proto/megatrain/v1/job.proto.
_SCHEMA = {
    "JobSpec": {"name": (1, "string"), "model": (2, "ModelSource"),
                "data": (3, "DataSpec"), "train": (4, "TrainSpec"),
                "optimizer": (5, "OptimizerSpec"), "eval": (6, "EvalSpec"),
                "checkpoint": (7, "CheckpointSpec"), "output_dir": (8, "string"),
                "priority": (9, "varint"), "labels": (10, "map")},
    "ModelSource": {"preset": (1, "string"), "hf_dir": (2, "string")},
    "DataSpec": {"tokens": (1, "string"), "text": (2, "string"),
                 "tokenizer": (3, "string"), "eval_fraction": (4, "double"),
                 "shuffle_seed": (5, "varint"), "eval_tokens": (6, "string")},
    "TrainSpec": {"micro_batch": (1, "varint"), "seq_len": (2, "varint"),
                  "gradient_accumulation_steps": (3, "varint"),
                  "global_batch": (10, "varint"), "max_steps": (4, "varint"),
                  "max_tokens": (5, "varint"), "compute_dtype": (6, "varint"),
                  "max_grad_norm": (7, "double"), "seed": (8, "varint"),
                  "nan_policy": (11, "varint"), "offload_activations": (12, "varint")},
    "OptimizerSpec": {"lr": (1, "double"), "beta1": (2, "double"),
                      "beta2": (3, "double"), "eps": (4, "double"),
                      "weight_decay": (5, "double"), "warmup_steps": (6, "varint"),
                      "schedule": (7, "string"), "min_lr_ratio": (8, "double")},
    "EvalSpec": {"every_steps": (1, "varint"), "batches": (2, "varint")},
    "CheckpointSpec": {"every_steps": (1, "varint"), "keep_last": (2, "varint"),
                       "keep_every": (3, "varint")},
}
_COMPUTE_DTYPES = {"fp32": 1, "tf32": 2, "bf16": 3}


def proto_message(message, items):
    """Encodes a list of (field, value) of `message` (always written, like an
    explicitly set optional field)."""
    out = b""
    for field, value in items:
        number, kind = _SCHEMA[message][field]
        if kind == "string":
            out += _len_field(number, value if isinstance(value, bytes) else value.encode())
        elif kind == "double":
            out += _key(number, 1) + struct.pack("<d", value)
        elif kind == "varint":
            if field == "compute_dtype" and isinstance(value, str):
                value = _COMPUTE_DTYPES[value]
            out += _key(number, 0) + _varint(int(value))
        elif kind == "map":
            for k, v in value:
                out += _len_field(number, _len_field(1, k.encode()) + _len_field(2, v.encode()))
        else:
            out += _len_field(number, proto_message(kind, value))
    return out


def _replace(items, path, value):
    """A copy of `items` with the field at `path` ("train.global_batch")
    set to `value` (appended when absent)."""
    head, _, rest = path.partition(".")
    out, done = [], False
    for key, old in items:
        if key == head:
            out.append((key, _replace(old, rest, value) if rest else value))
            done = True
        else:
            out.append((key, old))
    if not done:
        out.append((head, _replace([], rest, value) if rest else value))
    return out


def jobspec_proto_corpus():
    # The tiny example as `megatrain submit` sends it: paths made absolute.
    tiny = [("name", "tiny"), ("model", [("preset", "tiny")]),
            ("data", [("tokens", "/jobs/examples/jobs/data/tiny"),
                      ("eval_tokens", "/jobs/examples/jobs/data/tiny-eval")]),
            ("train", [("micro_batch", 8), ("seq_len", 128),
                       ("gradient_accumulation_steps", 1), ("max_steps", 60),
                       ("compute_dtype", "fp32")]),
            ("optimizer", [("lr", 3e-3), ("weight_decay", 0.0), ("warmup_steps", 5),
                           ("schedule", "cosine")]),
            ("eval", [("every_steps", 20), ("batches", 4)]),
            ("checkpoint", [("every_steps", 20), ("keep_last", 2)]),
            ("priority", 0)]
    full = FULL_JOB
    full = _replace(full, "data.tokens", "/data/tiny")
    full = _replace(full, "data.eval_tokens", "/data/tiny-eval")
    full = _replace(full, "data.shuffle_seed", (1 << 64) - 1)
    full = _replace(full, "train.seed", (1 << 64) - 1)
    full = _replace(full, "train.nan_policy", 2)  # NAN_POLICY_FAIL
    hf_text = [("name", "hf"), ("model", [("hf_dir", "/models/llama")]),
               ("data", [("text", "/corpus/books.jsonl"), ("tokenizer", "/corpus/spm.model"),
                         ("eval_fraction", 0.05)]),
               ("train", [("micro_batch", 2), ("seq_len", 2048), ("global_batch", 64),
                          ("max_tokens", 1000000), ("compute_dtype", "tf32")]),
               ("output_dir", "/srv/out/hf")]
    specs = {
        "valid_empty.pb": [],
        "valid_tiny.pb": tiny,
        "valid_full.pb": full,
        "valid_hf_text_global_batch.pb": hf_text,
        "valid_non_finite.pb": _replace(_replace(tiny, "optimizer.lr", float("nan")),
                                        "train.max_grad_norm", float("inf")),
        "valid_extreme_ints.pb": _replace(_replace(_replace(tiny, "train.micro_batch", -(1 << 63)),
                                                   "train.max_tokens", (1 << 63) - 1),
                                          "priority", -1000),
        "invalid_relative_tokens.pb": _replace(tiny, "data.tokens", "data/tiny"),
        "invalid_relative_hf_dir.pb": _replace(hf_text, "model.hf_dir", "models/llama"),
        "invalid_relative_output_dir.pb": _replace(tiny, "output_dir", "out"),
        "invalid_compute_dtype.pb": _replace(tiny, "train.compute_dtype", 7),
        "invalid_global_batch_not_multiple.pb": _replace(tiny, "train.global_batch", 12),
        "invalid_global_batch_disagrees.pb": _replace(
            _replace(tiny, "train.global_batch", 16), "train.gradient_accumulation_steps", 4),
        "invalid_global_batch_negative_micro_batch.pb": _replace(
            _replace(hf_text, "train.micro_batch", -2), "train.global_batch", -64),
        "invalid_priority.pb": _replace(tiny, "priority", 5000),
        "invalid_label_key.pb": _replace(tiny, "labels", [("Team", "nlp")]),
        "invalid_label_value_long.pb": _replace(tiny, "labels", [("team", "x" * 257)]),
        "invalid_too_many_labels.pb": _replace(
            tiny, "labels", [("k%02d" % i, "v") for i in range(33)]),
    }
    files = {name: proto_message("JobSpec", items) for name, items in specs.items()}
    good = files["valid_tiny.pb"]
    files["invalid_truncated.pb"] = good[:-3]
    files["invalid_utf8_name.pb"] = _len_field(1, b"\xff\xfe") + good
    return files


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    for target, files in (("safetensors_header_fuzz", safetensors_corpus()),
                          ("token_shard_fuzz", token_shard_corpus()),
                          ("job_yaml_fuzz", job_yaml_corpus(repo)),
                          ("jobspec_proto_fuzz", jobspec_proto_corpus())):
        target_dir = os.path.join(out_dir, target)
        os.makedirs(target_dir, exist_ok=True)
        for name, content in sorted(files.items()):
            with open(os.path.join(target_dir, name), "wb") as f:
                f.write(content)
        print("%s: %d files in %s" % (target, len(files), target_dir))


if __name__ == "__main__":
    main()
