#!/usr/bin/env python3
"""Verifies MegaTrain checkpoint directories against their manifest.json.

Used by the fault integration tests (tests/integration/fault_*.sh): for each
directory given, every file listed in manifest.json must exist with the
listed size and XXH64 (seed 0) digest, and state.json's step must equal the
manifest's (docs/checkpoint-format.md, "Reading rules" 1-2 and the digests
of 4-5). XXH64 is implemented in pure Python (from the xxHash
specification, github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md) in
tests/testing/xxh64.py, so the check does not share code with the engine's
libxxhash.

Usage: fault_verify_checkpoint.py DIR...   exit 0 if all verify, else 1.
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
from xxh64 import xxh64  # noqa: E402  (tests/testing/xxh64.py)


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
