#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets in tests/fuzz/corpus/.

    python3 tests/fuzz/make_corpus.py [out_dir]   # default: tests/fuzz/corpus

Files named valid_* must parse; invalid_* must be refused. The C++ tests
(tests/engine/safetensors_test.cc, token_shard_test.cc) check exactly that,
so this script doubles as an independent implementation of both formats
(safetensors per the huggingface/safetensors README; token shards per
docs/data-format.md), with its own XXH64. Standard library only;
deterministic output (fixed contents, no randomness).
"""

import json
import os
import struct
import sys

# --- XXH64 (Yann Collet's xxHash specification, doc/xxhash_spec.md) --------

_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
_MASK = (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc, lane):
    acc = (acc + lane * _P2) & _MASK
    return (_rotl(acc, 31) * _P1) & _MASK


def _merge(acc, val):
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _MASK


def xxh64(data, seed=0):
    n = len(data)
    p = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _MASK
        v2 = (seed + _P2) & _MASK
        v3 = seed & _MASK
        v4 = (seed - _P1) & _MASK
        while p + 32 <= n:
            a, b, c, d = struct.unpack_from("<4Q", data, p)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            p += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while p + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, p)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK
        p += 8
    if p + 4 <= n:
        (k,) = struct.unpack_from("<I", data, p)
        h ^= (k * _P1) & _MASK
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK
        p += 4
    while p < n:
        h ^= (data[p] * _P5) & _MASK
        h = (_rotl(h, 11) * _P1) & _MASK
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h


assert xxh64(b"") == 0xEF46DB3751D8E999  # spec test vector

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


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    for target, files in (("safetensors_header_fuzz", safetensors_corpus()),
                          ("token_shard_fuzz", token_shard_corpus())):
        target_dir = os.path.join(out_dir, target)
        os.makedirs(target_dir, exist_ok=True)
        for name, content in sorted(files.items()):
            with open(os.path.join(target_dir, name), "wb") as f:
                f.write(content)
        print("%s: %d files in %s" % (target, len(files), target_dir))


if __name__ == "__main__":
    main()
