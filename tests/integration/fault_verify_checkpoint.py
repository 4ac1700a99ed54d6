#!/usr/bin/env python3
"""Verifies MegaTrain checkpoint directories against their manifest.json.

Used by the fault integration tests (tests/integration/fault_*.sh): for each
directory given, every file listed in manifest.json must exist with the
listed size and XXH64 (seed 0) digest, and state.json's step must equal the
manifest's (docs/checkpoint-format.md, "Reading rules" 1-2 and the digests
of 4-5). XXH64 is implemented here in pure Python (from the xxHash
specification, github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md), so
the check does not share code with the engine's libxxhash.

Usage: fault_verify_checkpoint.py DIR...   exit 0 if all verify, else 1.
"""
import json
import os
import struct
import sys

_MASK = (1 << 64) - 1
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc, lane):
    acc = (acc + lane * _P2) & _MASK
    return (_rotl(acc, 31) * _P1) & _MASK


def _merge(acc, v):
    acc ^= _round(0, v)
    return (acc * _P1 + _P4) & _MASK


def xxh64(data, seed=0):
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _MASK
        v2 = (seed + _P2) & _MASK
        v3 = seed
        v4 = (seed - _P1) & _MASK
        stripes = n // 32
        lanes = struct.unpack_from("<%dQ" % (stripes * 4), data, 0)
        for k in range(0, stripes * 4, 4):
            v1 = _round(v1, lanes[k])
            v2 = _round(v2, lanes[k + 1])
            v3 = _round(v3, lanes[k + 2])
            v4 = _round(v4, lanes[k + 3])
        i = stripes * 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while i + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, lane)
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK
        i += 8
    if i + 4 <= n:
        (word,) = struct.unpack_from("<I", data, i)
        h ^= (word * _P1) & _MASK
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _MASK
        h = (_rotl(h, 11) * _P1) & _MASK
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h


def verify(directory):
    """Returns a list of problems with the checkpoint in `directory`."""
    try:
        with open(os.path.join(directory, "manifest.json"), "rb") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        return ["manifest.json: %s" % e]
    problems = []
    if manifest.get("format") != "megatrain-checkpoint":
        problems.append("manifest.json: format %r" % manifest.get("format"))
    for name, entry in sorted(manifest.get("files", {}).items()):
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            problems.append("%s: %s" % (name, e))
            continue
        if len(data) != entry["bytes"]:
            problems.append("%s: %d bytes, manifest says %d" % (name, len(data), entry["bytes"]))
            continue
        digest = "%016x" % xxh64(data)
        if digest != entry["xxh64"]:
            problems.append("%s: XXH64 %s, manifest says %s" % (name, digest, entry["xxh64"]))
    for required in ("config.json", "state.json", "master.bin", "exp_avg.bin", "exp_avg_sq.bin"):
        if required not in manifest.get("files", {}):
            problems.append("%s: not in manifest.json" % required)
    try:
        with open(os.path.join(directory, "state.json"), "rb") as f:
            if json.load(f).get("step") != manifest.get("step"):
                problems.append("state.json: step differs from manifest.json's")
    except (OSError, ValueError) as e:
        problems.append("state.json: %s" % e)
    return problems


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    ok = True
    for directory in argv[1:]:
        problems = verify(directory)
        if problems:
            ok = False
            for problem in problems:
                print("%s: %s" % (directory, problem), file=sys.stderr)
        else:
            print("%s: verified" % directory)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
